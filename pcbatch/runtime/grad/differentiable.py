"""The custom_vjp around the machine: a recorded forward and the backward loop."""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pcbatch.ir.core import StackProgram
from pcbatch.runtime.dtypes import index_dtype
from pcbatch.runtime.block import eval_prelude
from pcbatch.runtime.config import MachineConfig
from pcbatch.runtime.lanes import cast_to
from pcbatch.runtime.run import machine_for, run_machine
from pcbatch.runtime.grad.floats import floats, is_float, is_inexact, with_floats
from pcbatch.runtime.grad.plan import Plan
from pcbatch.runtime.grad.recorder import Recorder
from pcbatch.runtime.grad.backward import Backward
from pcbatch.runtime.grad.prelude import masked_prelude

tree_util = jax.tree_util
tree_map = tree_util.tree_map

#: Default tape capacity: rows per block per example (see `autobatch(tape_size=)`).
DEFAULT_TAPE_SIZE = 256


class TapeInfo(NamedTuple):
    """What a differentiated call records (`Autobatched.tape_info`).

    `tape_size`: rows per block per example the tape holds; `needed`: the
    smallest `tape_size` that holds this call; `rows`: rows used per recorded
    block (one per lane a step ran there); `steps`: recorded steps (of
    `total_steps` machine steps); `bytes_used` / `bytes_allocated`: the
    tape (rows, step log and the stacks' event ids) in use / allocated."""

    tape_size: int
    needed: int
    rows: dict[int, int]
    steps: int
    total_steps: int
    bytes_used: int
    bytes_allocated: int


def _nbytes(t: Any) -> int:
    return sum(int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize for s in tree_util.tree_leaves(t))


class Differentiable:
    """A compiled program's differentiable call: `(result, status)` of the
    entry inputs, with a `jax.custom_vjp` that records a tape and replays it.

    `primal(inputs)` runs the plain machine (used when nothing is
    differentiated); `check(status, inputs)` runs on concrete forward results
    (eager differentiation) and may raise; `tape_size` is rows per block per example.
    """

    def __init__(self, prog: StackProgram, num_lanes: int, config: MachineConfig, batched: frozenset[str],
                 tape_size: int | None):
        self.prog, self.num_lanes, self.config, self.batched = prog, num_lanes, config, batched
        self.tape_size = tape_size or DEFAULT_TAPE_SIZE
        self.fixed = tape_size is not None  # a size the user chose does not grow
        self._compiled: dict[int, tuple[Plan, Callable, Callable]] = {}

    def compiled(self, tape_size: int) -> tuple[Plan, Callable, Callable]:
        if tape_size not in self._compiled:
            prog, lanes, config = self.prog, self.num_lanes, self.config
            plan = Plan(prog, machine_for(prog, lanes, config), tape_size)

            def forward(inputs):
                result, status, _, tape = run_machine(prog, inputs, lanes, config, recorder=Recorder(plan))
                tape = tape._replace(writer=None)  # only the forward needs it
                return result, status, tape

            self._compiled[tape_size] = (plan, jax.jit(forward), jax.jit(lambda i, t, c: self._backward(plan, i, t, c)))
        return self._compiled[tape_size]

    def info(self, inputs: dict[str, Any]) -> TapeInfo:
        plan, forward, _ = self.compiled(self.tape_size)
        _, status, tape = forward(inputs)
        cursor = np.asarray(tape.cursor)
        rows = {g.index: int(cursor[g.index]) for g in plan.blocks}
        row_bytes = {g.index: _nbytes(plan.row_types(g)) for g in plan.blocks}
        word = index_dtype().itemsize
        fixed = plan.depth * plan.lanes * word * len(plan.float_stacks)  # the event ids of the stacks' slots
        steps = int(tape.t)
        used = sum(rows[b] * row_bytes[b] for b in rows) + 2 * word * steps + fixed
        allocated = (sum((plan.capacity + plan.rec_width) * row_bytes[b] for b in rows) + 2 * word * plan.log_size
                     + fixed)
        return TapeInfo(self.tape_size, plan.needed(tape), rows, steps, int(status.steps), used, allocated)

    def _backward(self, plan: Plan, inputs: dict[str, Any], tape: dict[str, Any], ct_result: list) -> dict[str, Any]:
        prog = self.prog
        types, B = prog.var_types, plan.examples
        entry = [p for p in prog.entry_params if p in self.batched and p in plan.float_regs]
        consts, inv = eval_prelude(prog, inputs)
        ct_const, ct_inv, ct_regs, used = Backward(plan).run(consts, inv, tape, ct_result)

        def start(diff):
            full = {p: with_floats(inputs[p], diff[p]) for p in inputs}
            consts, inv = masked_prelude(prog, full, *used)
            regs = {p: floats(cast_to(full[p], types[p], B)) for p in entry}
            return ({v: floats(x) for v, x in consts.items() if is_float(types[v])},
                    {v: floats(x) for v, x in inv.items() if is_float(types[v])}, regs)

        _, pull = jax.vjp(start, {p: floats(x) for p, x in inputs.items()})
        (ct,) = pull((ct_const, ct_inv, {p: ct_regs[p] for p in entry}))
        return ct

    def __call__(self, inputs: dict[str, Any], primal: Callable, check: Callable) -> tuple[Any, Any, jax.Array]:
        """`(result, status, need)`: `need` is 0, or (differentiated, the tape
        overflowed inside jit) the `tape_size` this call needs; the caller
        reports it (checkify), the gradients are NaN."""
        prog, batched = self.prog, self.batched
        diff_keys = {p for p in prog.entry_params if is_float(inputs[p])}
        used: list[int] = []  # the tape size the forward rule chose, for the backward rule

        @jax.custom_vjp
        def call(inputs):
            return (*primal(inputs), jnp.zeros((), index_dtype()))  # like `need` below

        def fwd(inputs):
            plan, forward, _ = self.compiled(self.tape_size)
            result, status, tape = forward(inputs)
            # Eager differentiation sees concrete values (under vmap, e.g. jax.jacfwd, the outputs are traced).
            concrete = not any(isinstance(x, jax.core.Tracer) for x in tree_util.tree_leaves((inputs, status, tape)))
            if concrete and bool(Plan.overflowed(tape, plan.capacity, plan.log_size)):
                need = plan.needed(tape)
                if self.fixed:
                    from pcbatch.errors import TapeOverflowError

                    raise TapeOverflowError(self.tape_size, need)
                self.tape_size = max(need, 2 * self.tape_size)  # kept for later calls
                plan, forward, _ = self.compiled(self.tape_size)
                result, status, tape = forward(inputs)
            used.append(plan.capacity // plan.examples)
            if concrete:
                check(status, inputs)
            need = jnp.where(Plan.overflowed(tape, plan.capacity, plan.log_size), _needed_traced(plan, tape), 0)
            return (result, status, need), (inputs, tape, status)

        def bwd(res, cts):
            inputs, tape, status = res
            plan, _, backward = self.compiled(used[-1])
            ct = backward(inputs, tape, floats(cts[0]))
            failed = status.overflow | status.unfinished
            overflow = Plan.overflowed(tape, plan.capacity, plan.log_size)
            out = {}
            for p, x in inputs.items():
                if p not in diff_keys:
                    out[p] = None
                    continue
                vals = []
                for c in ct[p]:
                    # Failed examples, and a shared input if any failed or the tape overflowed: NaN, never garbage.
                    bad = (failed.reshape((-1,) + (1,) * (c.ndim - 1)) if p in batched else jnp.any(failed)) | overflow
                    vals.append(jnp.where(bad, jnp.nan, c))
                out[p] = _merge_ct(x, vals)
            return (out,)

        call.defvjp(fwd, bwd)
        return call(inputs)


def _needed_traced(plan: Plan, tape: dict[str, Any]) -> jax.Array:
    """`Plan.needed` on a traced tape."""
    rows = jnp.max(tape.cursor[jnp.asarray([g.index for g in plan.blocks] or [0])])
    per_block = jnp.maximum(rows, -(-tape.t // max(1, len(plan.blocks))))
    return jnp.maximum(1, -(-per_block // plan.examples))


def _merge_ct(x: Any, vals: list) -> Any:
    """Cotangent tree for input `x`: its float leaves' values, None elsewhere."""
    leaves, treedef = tree_util.tree_flatten(x)
    it = iter(vals)
    return treedef.unflatten([next(it) if is_inexact(a) else None for a in leaves])
