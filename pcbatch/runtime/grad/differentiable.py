"""The machine's derivative: a `custom_jvp` whose tangent is a `linear_call`
(forward mode of the plain machine; transposed by the recorded tape replayed
backwards)."""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pcbatch.ir.core import StackProgram
from pcbatch.runtime.dtypes import index_dtype, nbytes
from pcbatch.runtime.block import eval_prelude
from pcbatch.runtime.config import MachineConfig
from pcbatch.runtime.lanes import cast_to, nan_where
from pcbatch.runtime.run import machine_for, run_machine
from pcbatch.runtime.grad.floats import floats, is_float, is_inexact, row_mask, with_floats
from pcbatch.runtime.grad.linear import Linear, linear_call
from pcbatch.runtime.grad.plan import Plan
from pcbatch.runtime.grad.recorder import Recorder
from pcbatch.runtime.grad.backward import Backward
from pcbatch.runtime.grad.inert import inert_constants
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


class Differentiable:
    """A compiled program's differentiable call: `(result, status)` of the
    entry inputs, differentiable by every JAX transformation: a `custom_jvp`
    whose tangent is a `linear_call` (forward: JAX's jvp of the plain machine;
    transposed: a recorded tape replayed backwards).

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
        row_bytes = {g.index: nbytes(plan.row_types(g)) for g in plan.blocks}
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
        # Every entry parameter held in a register starts there, a shared one too (broadcast to each
        # example: a recursive call that passes it changed makes it a register, not a constant).
        entry = [p for p in prog.entry_params if p in plan.float_regs]
        consts, inv = eval_prelude(prog, inputs)
        ct_const, ct_inv, ct_regs, used = Backward(plan, inert_constants(prog, inputs)).run(consts, inv, tape,
                                                                                               ct_result)

        def start(diff):
            full = {p: with_floats(inputs[p], diff[p]) for p in inputs}
            consts, inv = masked_prelude(prog, full, *used)
            regs = {p: floats(cast_to(full[p], types[p], B)) for p in entry}
            return ({v: floats(x) for v, x in consts.items() if is_float(types[v])},
                    {v: floats(x) for v, x in inv.items() if is_float(types[v])}, regs)

        _, pull = jax.vjp(start, {p: floats(x) for p, x in inputs.items()})
        (ct,) = pull((ct_const, ct_inv, {p: ct_regs[p] for p in entry}))
        return ct

    def __call__(self, inputs: dict[str, Any], primal: Callable, check: Callable,
                 on_jvp: Callable[[], None] = lambda: None) -> tuple[Any, Any, jax.Array]:
        """`(result, status, need)`: `need` is 0, or (differentiated, the tape
        overflowed inside jit) the `tape_size` this call needs; the caller
        reports it (checkify), the gradients are NaN. `on_jvp()` runs first when the
        call is differentiated (the caller's checks; it may raise)."""

        @jax.custom_jvp
        def call(inputs):
            return (*primal(inputs), jnp.zeros((), index_dtype()))  # like `need` below

        @call.defjvp
        def jvp(primals, tangents):
            (inputs,), (dinputs,) = primals, tangents
            on_jvp()
            (result, status, need), tape, tape_size = self._record(inputs, check)
            residuals, tree = tree_util.tree_flatten((inputs, status, tape))
            rule = Linear(functools.partial(self._tangents, tree, primal),
                          functools.partial(self._cotangents, tree, tape_size), len(residuals),
                          [jax.core.ShapedArray(np.shape(x), jnp.result_type(x)) for x in floats(result)])
            dresult = linear_call(rule, residuals, floats(dinputs))
            dout = tree_map(_zero_tangent, (result, status, need))
            return (result, status, need), (with_floats(dout[0], dresult), *dout[1:])

        return call(inputs)

    def _record(self, inputs: dict[str, Any], check: Callable) -> tuple[tuple[Any, Any, jax.Array], Any, int]:
        """The recorded forward: `(result, status, need)`, the tape, and the tape size it used."""
        plan, forward, _ = self.compiled(self.tape_size)
        result, status, tape = forward(inputs)
        # Eager differentiation sees concrete values (under vmap, e.g. jax.jacrev, the outputs are traced).
        concrete = not any(isinstance(x, jax.core.Tracer) for x in tree_util.tree_leaves((inputs, status, tape)))
        if concrete and bool(Plan.overflowed(tape, plan.capacity, plan.log_size)):
            need = plan.needed(tape)
            if self.fixed:
                from pcbatch.errors import TapeOverflowError

                raise TapeOverflowError(self.tape_size, need)
            self.tape_size = max(need, 2 * self.tape_size)  # kept for later calls
            plan, forward, _ = self.compiled(self.tape_size)
            result, status, tape = forward(inputs)
        if concrete:
            check(status, inputs)
        need = jnp.where(Plan.overflowed(tape, plan.capacity, plan.log_size), _needed_traced(plan, tape), 0)
        return (result, status, need.astype(index_dtype())), tape, plan.capacity // plan.examples

    @staticmethod
    def _tangents(tree: Any, primal: Callable, *args: Any) -> list:
        """Forward mode (the linear map): the result's float tangents, by JAX's jvp of the plain machine."""
        inputs, _, _ = tree_util.tree_unflatten(tree, args[:tree.num_leaves])
        dinputs = list(args[tree.num_leaves:])
        _, (dresult, _) = jax.jvp(primal, (inputs,), (with_floats(tree_map(_zero_tangent, inputs), dinputs),))
        return floats(dresult)

    def _cotangents(self, tree: Any, tape_size: int, *args: Any) -> list:
        """Reverse mode (its transpose): the recorded tape replayed backwards, cotangents of
        the input floats; failed examples (and a shared input if any example failed or the
        tape overflowed) get NaN, never garbage."""
        inputs, status, tape = tree_util.tree_unflatten(tree, args[:tree.num_leaves])
        plan, _, backward = self.compiled(tape_size)
        ct = backward(inputs, tape, list(args[tree.num_leaves:]))
        failed = status.flagged
        overflow = Plan.overflowed(tape, plan.capacity, plan.log_size)

        def masked(p: str, c: jax.Array) -> jax.Array:
            bad = (row_mask(failed, c) if p in self.batched else jnp.any(failed)) | overflow
            return nan_where(bad, c)  # its tangent NaN too (jax.hessian)

        # In the inputs' own leaf order (the order of the tangents `linear_call` transposes).
        return floats({p: with_floats(x, [masked(p, c) for c in ct[p]]) if is_float(x) else x
                       for p, x in inputs.items()})


def _needed_traced(plan: Plan, tape: dict[str, Any]) -> jax.Array:
    """`Plan.needed` on a traced tape."""
    rows = jnp.max(tape.cursor[jnp.asarray([g.index for g in plan.blocks] or [0])])
    per_block = jnp.maximum(rows, -(-tape.t // max(1, len(plan.blocks))))
    return jnp.maximum(1, -(-per_block // plan.examples))


def _zero_tangent(x: Any) -> Any:
    """A zero tangent of `x` (JAX's float0 for an integer or bool leaf)."""
    if is_inexact(x):
        return jnp.zeros(np.shape(x), jnp.result_type(x))
    return np.zeros(np.shape(x), jax.dtypes.float0)
