"""The pipeline, in order: a function's block IR to a compiled machine.

    frontend (`Autobatched.ir`)  ->  lower  ->  specialize to the argument
    types  ->  memory layout (PQ-tree)  ->  runtime machine under `jax.jit`
    (or one per device, `pcbatch.sharding`)

`compile_program` runs the steps after the frontend for one call signature
(which parameters are shared, the batch, shapes and dtypes); `Cache` keeps
what each signature compiled to, so a second call of the same signature
traces nothing.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Hashable

import jax
import jax.numpy as jnp
import numpy as np

from pcbatch import _context
from pcbatch.fsm import Fair, get_scheduler
from pcbatch.ir.core import Program, StackProgram
from pcbatch.lower import lower, specialize
from pcbatch.memory import LayoutReport, layout_program
from pcbatch.options import Options
from pcbatch.runtime import MachineConfig, Status, run_machine
from pcbatch.runtime.dtypes import index_dtype
from pcbatch.runtime.grad import Differentiable
from pcbatch.runtime.stacks import StackLayout

tree_util = jax.tree_util


def machine_config(prog: StackProgram, batch: int, options: Options) -> tuple[int, MachineConfig]:
    """Machine lanes and settings for a batch (the lane pool only matters with forks)."""
    tuning = options.tuning
    if not prog.has_forks:
        lanes = batch
    elif options.max_lanes is not None:
        lanes = max(options.max_lanes, batch)
    else:
        # Lanes per example, capped so the stacks (every lane has
        # max_stack_depth frames) stay within a budget.
        frame = index_dtype().itemsize + sum(x.size * x.dtype.itemsize  # the pc, then each stack's slot
                                             for x in tree_util.tree_leaves(StackLayout.of(prog).stacks))
        affordable = tuning.pool_stack_bytes // (frame * options.max_stack_depth)
        lanes = max(batch, min(tuning.lanes_per_example * batch, affordable, tuning.max_pool_lanes))
    width = options.lane_width or max(tuning.min_lane_width, min(tuning.width_per_example * batch,
                                                                 tuning.max_lane_width))
    scheduler = get_scheduler(options.schedule)
    # With a step bound, no example may starve another (one runaway must not spoil the batch).
    if options.max_steps is not None:
        scheduler = Fair(scheduler)
    return lanes, MachineConfig(options.max_stack_depth, options.max_steps, scheduler, lanes, width, tuning)


@dataclass(eq=False)
class Executable:
    """What one call signature compiled to. `runner(inputs, workspace)` runs
    the machine (`(result, status, workspace)`); `lean_runner` is the same
    with `status.blocks_run` zeros (a plain call never shows it, and counting
    costs a copy and a kernel per step; compiled on first use); `shared` says which entry
    parameters are shared by the batch; `workspace` is the last call's stacks,
    donated to the next (never read before written: no zero fill);
    `differentiable` is built on the first differentiated call."""

    prog: StackProgram
    runner: Callable
    shared: tuple[bool, ...]
    batch: int
    layout_report: LayoutReport | None = None
    workspace: Any = None
    differentiable: Differentiable | None = None
    lean_runner: Callable | None = None


def signature(shared: tuple[bool, ...], batch: int, sharding: Any, values: list[Any]) -> Hashable:
    """The cache key of a call: everything the compiled machine depends on.
    (`index_dtype()`: a machine built under `jax_enable_x64` keeps int64 state.)"""
    return (shared, batch, sharding, index_dtype(), tuple(tree_util.tree_structure(v) for v in values),
            tuple((np.shape(x), jnp.result_type(x)) for x in tree_util.tree_leaves(values)))


def compile_program(lowered: StackProgram, shared: tuple[bool, ...], values: list[Any], batch: int,
                    options: Options, sharding: Any, on_trace: Callable[[], None] = lambda: None) -> Executable:
    """Specialize, lay out and compile `lowered` for one call signature.
    `on_trace` is called each time the machine is traced."""
    types = {p: tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(np.shape(x)[0 if s else 1:], jnp.result_type(x)), v)
             for p, v, s in zip(lowered.entry_params, values, shared)}
    report = None
    with _context.in_building():
        prog = specialize(lowered, types)
        if options.layout:
            prog, report = layout_program(prog, "all" if options.layout == "all" else "auto")

    def machine(prog: StackProgram, batch: int, inputs: dict[str, Any], workspace: Any,
                active: Any = None, lean: bool = False) -> tuple[Any, Status, Any]:
        on_trace()
        with _context.in_building():
            result, status, workspace = run_machine(prog, inputs, batch, machine_config(prog, batch, options)[1],
                                                    workspace, active)
        if lean:  # nobody reads the per-example block counts: XLA drops their updates from the loop
            status = status._replace(blocks_run=jnp.zeros_like(status.blocks_run))
        return result, status, workspace

    if sharding is None:
        runner = jax.jit(functools.partial(machine, prog, batch), donate_argnums=(1,))
        lean = jax.jit(functools.partial(machine, prog, batch, lean=True), donate_argnums=(1,))
    else:  # one machine per device (pcbatch/sharding.py)
        runner = lean = sharding.runner(functools.partial(machine, prog), batch,
                                        dict(zip(prog.entry_params, shared)))
    return Executable(prog, runner, shared, batch, report, lean_runner=lean)


class Cache:
    """A function's compiled programs: the lowered program per set of shared
    parameters, and the `Executable` per call signature."""

    def __init__(self) -> None:
        self._lowered: dict[tuple[bool, ...], StackProgram] = {}
        self._executables: dict[Hashable, Executable] = {}

    def lowered(self, program: Program, shared: tuple[bool, ...]) -> StackProgram:
        if shared not in self._lowered:
            self._lowered[shared] = lower(program, shared)
        return self._lowered[shared]

    def executable(self, key: Hashable, build: Callable[[], Executable]) -> Executable:
        if key not in self._executables:
            self._executables[key] = build()
        return self._executables[key]

    def find(self, prog: StackProgram) -> Executable | None:
        """The executable compiled to `prog`, if any."""
        return next((e for e in self._executables.values() if e.prog is prog), None)

    def share_lowered(self, other: "Cache") -> None:
        """Reuse `other`'s lowered programs (the same function and `fork`)."""
        self._lowered = other._lowered
