"""Running a lowered program: the plain machine, or the fork-join pool when
the program forks; workspaces (the stacks) and step traces."""
from __future__ import annotations

import functools
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from pcbatch.errors import OptionError
from pcbatch.ir.core import CONSTANT, INVARIANT, StackProgram
from pcbatch.runtime.block import eval_prelude
from pcbatch.runtime.config import MachineConfig, Status
from pcbatch.runtime.dtypes import nbytes
from pcbatch.runtime.machine import Machine
from pcbatch.runtime.pool import PoolMachine
from pcbatch.runtime.steps import StepRecorder, StepTrace

tree_map = jax.tree_util.tree_map


def machine_for(prog: StackProgram, num_lanes: int, config: MachineConfig):
    if prog.has_forks:
        return PoolMachine(prog, num_lanes, config)
    return Machine(prog, num_lanes, config)


def workspace_shapes(prog: StackProgram, num_lanes: int, config: MachineConfig) -> dict[str, Any]:
    """Shapes of `run_machine`'s workspace (see `Machine.workspace_shapes`)."""
    return machine_for(prog, num_lanes, config).workspace_shapes()


# An eager call's workspace up to this size is filled on the host: no program to compile
# (the jitted fill of a fork-join pool's ~20-30 stacks compiles in 0.2-0.5 s).
HOST_FILL_BYTES = 16 * 2 ** 20


def new_workspace(prog: StackProgram, num_lanes: int, config: MachineConfig, eager: bool = False) -> dict[str, Any]:
    """Stacks for one run. Their contents are never read before written (a donated workspace
    holds the last call's), so each is filled with its own value: inside a caller's `jit`,
    equal fills would be one buffer that XLA copies into every stack (a Tree-LSTM's
    `[depth, lanes, H]` stacks: hundreds of MB per call). `eager`: built outside any trace."""
    leaves, treedef = jax.tree_util.tree_flatten(workspace_shapes(prog, num_lanes, config))
    check_fits(nbytes(leaves), num_lanes, config)
    if eager and _host_fillable(leaves):
        return treedef.unflatten([jax.device_put(np.full(s.shape, k, s.dtype)) for k, s in enumerate(leaves)])
    fill = _filler(tuple((s.shape, s.dtype) for s in leaves))
    return treedef.unflatten(fill(np.arange(len(leaves), dtype=np.int32)))


def device_memory_bytes(device: Any = None) -> int | None:
    """Memory of `device` (default: this process's first): an accelerator's allocator limit,
    else the host's physical memory (the CPU's arrays live there); None where neither is known.
    A process asks only its own devices (another process's cannot answer, under
    `jax.distributed`)."""
    device = device or jax.local_devices()[0]
    try:
        stats = device.memory_stats()
    except (AttributeError, NotImplementedError, RuntimeError):  # a backend without them: the host's
        stats = None
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"])
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def check_fits(workspace_bytes: int, num_lanes: int, config: MachineConfig, device: Any = None) -> None:
    """A named error where the stacks cannot fit on the device at all (an explicit huge
    `max_stack_depth` or `max_lanes`), before XLA's raw RESOURCE_EXHAUSTED."""
    memory = device_memory_bytes(device)
    if memory is None or workspace_bytes <= memory:
        return
    gib = lambda n: f"{n / 2 ** 30:.1f} GiB"  # noqa: E731
    lanes = config.max_lanes or num_lanes  # a fork-join pool's, else one lane per example
    option = "max_lanes" if config.max_lanes and config.max_lanes > num_lanes else "max_stack_depth"
    raise OptionError(option, f"the machine's stacks take {gib(workspace_bytes)} ({lanes} lanes x "
                      f"{config.max_stack_depth} frames), more than the {gib(memory)} of memory of "
                      f"{device or jax.local_devices()[0]}",
                      "lower max_stack_depth (the deepest recursion an example needs, plus one), or max_lanes "
                      "with fork=True (by default pcbatch sizes the lane pool to Tuning.pool_stack_bytes)")


def _host_fillable(leaves: list[Any]) -> bool:
    """Small, and of dtypes NumPy has (not JAX's extended ones: typed PRNG keys)."""
    return (not any(jax.dtypes.issubdtype(s.dtype, jax.dtypes.extended) for s in leaves)
            and nbytes(leaves) <= HOST_FILL_BYTES)


@functools.lru_cache(maxsize=256)
def _filler(shapes: tuple[tuple[tuple[int, ...], Any], ...]) -> Callable[[Any], list[jax.Array]]:
    """One jitted program that fills a workspace of these shapes, stack k with `fills[k]`:
    eagerly, a `jnp.full` per stack compiled a program of its own for each new shape (128 of
    a fork-join test file's 436 compiles)."""
    return jax.jit(lambda fills: [jnp.full(shape, fills[k], dtype) for k, (shape, dtype) in enumerate(shapes)])


def run_machine(prog: StackProgram, inputs: dict[str, Any], num_lanes: int, config: MachineConfig,
                workspace: dict[str, Any] | None = None, active: jax.Array | None = None,
                recorder: Any = None) -> tuple[Any, ...]:
    """Run `prog` on a batch. `inputs` maps each entry parameter to its value:
    with a leading lane axis for batched parameters, as-is for constants.
    `workspace` (see `new_workspace`; zeros if None) holds the stacks; the
    returned one can be passed (donated) to the next call of the same shape.
    `active` (`[batch]` bool, default all): examples that are False start
    halted and run no block (the padding of a sharded batch).
    A `recorder` (`grad/recorder.py`) makes it also return the gradient tape, last."""
    if workspace is None:
        workspace = new_workspace(prog, num_lanes, config)
    consts, inv = eval_prelude(prog, inputs)
    batched = {v: x for v, x in inputs.items() if prog.var_class.get(v) not in (CONSTANT, INVARIANT)}
    return machine_for(prog, num_lanes, config).run(consts, inv, batched, workspace, active, recorder)


def step_tracer(prog: StackProgram, num_lanes: int, config: MachineConfig, size: int,
                per_lane: bool = False) -> Callable[[dict[str, Any]], tuple[Any, Status, StepTrace]]:
    """`run_machine` that also records its first `size` steps (`StepTrace`), jitted:
    build it once per program and keep it (each new one compiles again)."""
    machine = machine_for(prog, num_lanes, config)

    @jax.jit
    def run(inputs):
        recorder = StepRecorder(prog.num_blocks, machine.width, size, per_lane)
        result, status, _, tape = run_machine(prog, inputs, num_lanes, config, recorder=recorder)
        return result, status, tape

    def traced(inputs: dict[str, Any]) -> tuple[Any, Status, StepTrace]:
        result, status, tape = run(inputs)
        return result, status, StepTrace.from_tape(tape, machine.lanes, machine.width)
    return traced
