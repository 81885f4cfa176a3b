"""One call of an autobatched function, from its bound arguments to its result.

`Function` is what a call needs of the autobatched function: its code, how
the names it calls resolve, its options and its compile cache. `run` picks
how the compiled machine (`pcbatch.compile.executable`) runs:

* eagerly, on the signature's own stacks, donated from call to call, and
  first on shallow stacks where the stack budget caps the lane pool;
* inside a caller's trace (`jax.jit`, `jax.vmap`, forward mode);
* under reverse-mode differentiation: a recorded forward and a replayed
  backward (`pcbatch.runtime.grad.Differentiable`);
* on no examples: empty results of one example's shapes.

`call` and `checked` add what a user sees of failures (`pcbatch.failures`).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from pcbatch import differentiation, failures
from pcbatch import sharding as sharding_
from pcbatch.arguments import Bound, bind
from pcbatch.compile import Cache, Callee, Executable, Signature, executable, first_stack_depth, measure_fork
from pcbatch.errors import ArgumentError, OptionError
from pcbatch.frontend import BoundFunction
from pcbatch.ir.core import StackProgram
from pcbatch.options import Options
from pcbatch.runtime import Status
from pcbatch.runtime.grad import is_float

tree_util = jax.tree_util


@dataclass(frozen=True, eq=False)
class Function:
    """An autobatched function as its calls see it. `on_trace` is called each
    time one of its machines is traced."""

    target: BoundFunction
    callee: Callee
    options: Options
    cache: Cache
    sharding: Any  # `pcbatch.sharding.BatchSharding` of the `mesh` option, or None
    on_trace: Callable[[], None]

    @property
    def name(self) -> str:
        return self.target.fn.__name__

    def bind(self, args: Sequence[Any], kwargs: dict[str, Any]) -> Bound:
        """`arguments.bind`, remembered for positional JAX arrays that it
        passes through as they are: what it does depends only on their
        shapes (and the fixed `in_axes`), and it costs 20-40 us a call."""
        key = None
        if not kwargs and all(isinstance(a, jax.Array) for a in args):
            key = tuple(a.shape for a in args)
            hit = self.cache.find(("bind", key))
            if hit is not None:
                return Bound(dict(zip(hit[0], args)), hit[1], hit[2])
        bound = bind(self.target, self.options.in_axes, tuple(args), kwargs)
        if key is not None and len(bound.values) == len(args) and all(
                v is a for v, a in zip(bound.values.values(), args)):
            self.cache.put(("bind", key), (tuple(bound.values), bound.batched, bound.batch))
        return bound

    def executable(self, bound: Bound) -> tuple[Executable, dict[str, Any]]:
        """The compiled machine for this call's signature (compiled on the
        first call), and its inputs by entry parameter."""
        params = list(bound.values)
        values = [bound.values[p] for p in params]
        sharding = sharding_.current(self.sharding)
        sharding_.check_global_inputs(sharding, tree_util.tree_leaves(values))
        sig = Signature.of(tuple(not bound.batched[p] for p in params), bound.batch, sharding, values)
        traced = differentiation.traced(tree_util.tree_leaves(values))
        exe = executable(self.target, self.callee, sig, self.options, self.cache, traced, self.on_trace)
        return exe, inputs_of(exe, bound)

    def shallow(self, depth: int) -> "Function":
        """This function on pool stacks of `depth` frames (`first_stack_depth`),
        with a cache of its own that shares the option-free stages."""
        def build() -> Function:
            cache = Cache()
            cache.inherit(self.cache)
            options = self.options.replace(max_stack_depth=depth, fork=True)
            return Function(self.target, self.callee, options, cache, self.sharding, self.on_trace)
        return self.cache.get(("shallow", depth), build)


def inputs_of(exe: Executable, bound: Bound) -> dict[str, Any]:
    """The call's values by `exe`'s entry parameter (bound in parameter order)."""
    return dict(zip(exe.prog.entry_params, bound.values.values()))


def call(fn: Function, bound: Bound) -> Any:
    """The result, or the error Python would raise (inside a trace, a checkify error)."""
    result, status, prog, _ = run(fn, bound, raise_errors=True)
    if any(differentiation.is_tracer(x) for x in tree_util.tree_leaves((result, status))):
        return failures.check_in_trace(result, status, prog)
    failures.raise_for(status, prog, bound, fn.options)
    return result


def checked(fn: Function, bound: Bound) -> tuple[Any, Status]:
    result, status, _, _ = run(fn, bound)
    return result, status


def run(fn: Function, bound: Bound, raise_errors: bool = False) -> tuple[Any, Status, StackProgram | None, int]:
    """`(result, status, program, batch)`. `raise_errors`: a plain call (not
    `checked`): it raises where Python does, so its machine need not count
    blocks."""
    try:
        return _run(fn, bound, raise_errors)
    except Exception as e:  # JAX's error class is private; its name is what is stable
        if type(e).__name__ != "ShardingTypeError" or sharding_.current(fn.sharding) is not None:
            raise
        raise OptionError("mesh", "an argument is sharded over a mesh's explicit axes, but the call has no mesh: "
                                  "one machine cannot run on sharded values",
                          "pass the mesh: pcbatch.autobatch(..., mesh=mesh), f.with_options(mesh=mesh) or "
                          "`with pcbatch.sharded(mesh):` (one machine per device), or gather the argument first "
                          "(jnp.asarray(np.asarray(x))).") from e


def _run(fn: Function, bound: Bound, raise_errors: bool) -> tuple[Any, Status, StackProgram | None, int]:
    if bound.batch == 0:
        return (*run_empty(fn, bound), None, 0)
    captured = check_captured(fn)
    exe, inputs = fn.executable(bound)
    prog, batch = exe.prog, bound.batch
    leaves = tree_util.tree_leaves(inputs)
    if differentiation.traced(leaves):
        with warnings.catch_warnings():
            # Under an eager jax.vmap the runner's workspace cannot be donated: only a hint lost.
            warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
            # Forward mode alone differentiates the plain machine (JAX's jvp of a while loop: no
            # tape); anything else that may be differentiated goes through `grad.Differentiable`.
            # A captured value in forward mode (`jax.jvp` inside `jax.jit`, with respect to it
            # only) counts: the custom_jvp would close over its tracer, which then escapes.
            if differentiation.mode(leaves + captured) != "forward" and is_float(inputs):
                result, status = run_differentiable(fn, exe, inputs, bound, raise_errors)
            else:
                result, status, _ = runner(exe, raise_errors)(inputs, exe.new_workspace())
        return result, status, prog, batch
    if exe.fork_choice is not None and exe.fork_choice.measure:
        def run_once(e: Executable) -> None:  # the call's own runner: the winner is compiled once
            jax.block_until_ready(run_eagerly(fn, e, bound, raise_errors)[0])

        exe = measure_fork(fn.target, fn.callee, exe.signature, fn.options, fn.cache, run_once, fn.on_trace)
    result, status, prog = run_eagerly(fn, exe, bound, raise_errors)
    return result, status, prog, batch


def check_captured(fn: Function) -> list[Any]:
    """A value the program captures (a closure's variable, a functools.partial's
    or a method's `self`) is a constant of the program: one being
    reverse-differentiated (`jax.grad` of the caller with respect to it)
    has no argument for its cotangent to reach. A named error, not JAX's.
    Returns the captured values' tracers (none outside transformations: a NUTS
    call's closure takes ~40 us to walk)."""
    if differentiation.outside_transformations():
        return []
    out = []
    for name, value in differentiation.captured(fn.target.fn, fn.target.constants):
        found = differentiation.tracers(tree_util.tree_leaves(value))
        if differentiation.REVERSE and any(isinstance(x, differentiation.REVERSE) for x in found):
            raise ArgumentError(
                fn.name, f"`{name}` is captured by the function (a closure variable, a functools.partial "
                         "argument or a method's object) and differentiated in reverse mode: pcbatch "
                         "differentiates only the call's arguments",
                "pass the differentiated values as an argument with in_axes=None (shared by the batch): "
                "`autobatch(f, in_axes=(None, 0))(params, x)` with `def f(params, x)` (a method: a function "
                "taking the object's parameters as its first argument). jax.jit, jax.vmap and forward mode "
                "(jax.jvp) work with captured values too.")
        out += found
    return out


def check_captured_stale(fn: Function) -> None:
    """When the call is differentiated in a trace other than the one that traced it (`jax.grad`
    of a `jax.jit`ted caller traces the jit's program again): a captured value of the first
    trace cannot reach the recorded forward. A named error, not JAX's "No constant handler"."""
    for name, value in differentiation.captured(fn.target.fn, fn.target.constants):
        if any(map(differentiation.stale, differentiation.tracers(tree_util.tree_leaves(value)))):
            raise ArgumentError(
                fn.name, f"`{name}` is captured by the function (a closure variable, a functools.partial "
                         "argument or a method's object) and holds a value of a jax.jit whose program is "
                         "differentiated after it was traced (jax.grad of a jitted function): the gradient "
                         "pass is traced again there, where the first trace's values cannot be read",
                "pass it as an argument with in_axes=None (shared by the batch): `autobatch(f, in_axes=(None, "
                "0))(params, x)` with `def f(params, x)`.")


def run_eagerly(fn: Function, exe: Executable, bound: Bound, plain_call: bool) -> tuple[Any, Status, StackProgram]:
    """Run `exe` outside any trace. Where the stack budget caps its pool, first on shallow stacks
    (`first_stack_depth`: more lanes in the same memory), and again on full ones only if a lane
    overflowed; a signature whose shallow runs overflow more than one time in eight stops trying."""
    if exe.shallow_depth < 0:
        exe.shallow_depth = (first_stack_depth(exe.prog, exe.signature.local_batch, fn.options)
                             if exe.signature.sharding is None else 0)
    if exe.shallow_depth > 0:
        s_exe, s_inputs = fn.shallow(exe.shallow_depth).executable(bound)
        result, status = run_on_workspace(s_exe, s_inputs, plain_call)
        exe.shallow_tries += 1
        if not np.any(np.asarray(status.overflow)):
            return result, status, s_exe.prog
        exe.shallow_misses += 1
        if exe.shallow_misses * 8 > exe.shallow_tries:
            exe.shallow_depth, s_exe.workspace = 0, None  # its stacks are not kept
    result, status = run_on_workspace(exe, inputs_of(exe, bound), plain_call)
    return result, status, exe.prog


def run_on_workspace(exe: Executable, inputs: dict[str, Any], plain_call: bool) -> tuple[Any, Status]:
    """Run `exe` on its own stacks (one workspace per compiled signature,
    donated from call to call)."""
    workspace, exe.workspace = exe.workspace, None
    if workspace is None:
        workspace = exe.new_workspace(eager=True)
    result, status, exe.workspace = runner(exe, plain_call)(inputs, workspace)
    return result, status


def runner(exe: Executable, plain_call: bool) -> Callable:
    """A plain call (not `checked`) never shows `status.blocks_run`: its
    machine need not count blocks (`Executable.lean_runner`)."""
    return exe.lean_runner if plain_call else exe.runner


def run_empty(fn: Function, bound: Bound) -> tuple[Any, Status]:
    """0 examples: empty results of the shapes and dtypes one example gives (as `jax.vmap`)."""
    names = list(bound.values)

    def one(values: list[Any]) -> tuple[Any, Status]:
        # A list, not a dict: pytrees sort dict keys, and the parameters' order matters.
        result, status, _, _ = run(fn, Bound(dict(zip(names, values)), bound.batched, 1))
        return result, status

    ones = [tree_util.tree_map(lambda x: jax.ShapeDtypeStruct((1,) + np.shape(x)[1:], jnp.result_type(x)), v)
            if bound.batched[p] else v for p, v in bound.values.items()]
    result, status = jax.eval_shape(one, ones)
    result = tree_util.tree_map(_no_examples, result)
    # The status's per-example flags are empty; its scalars (`steps`, `peak_lanes`) stay scalars: 0.
    return result, Status(*(_no_examples(s) if s.ndim else jnp.zeros((), s.dtype) for s in status))


def _no_examples(s: jax.ShapeDtypeStruct) -> jax.Array:
    return jnp.zeros((0,) + s.shape[1:], s.dtype)


def run_differentiable(fn: Function, exe: Executable, inputs: dict[str, Any], bound: Bound,
                       raise_errors: bool) -> tuple[Any, Status]:
    """The machine under `grad.Differentiable`'s custom_jvp: the plain
    machine unless differentiated; then a recorded forward and a replayed
    backward. Errors of a concretely evaluated forward (eager `jax.grad`)
    are raised there."""
    prog, batch = exe.prog, exe.batch

    def primal(inputs: dict[str, Any]) -> tuple[Any, Status]:
        result, status, _ = runner(exe, raise_errors)(inputs, exe.new_workspace())
        return result, status

    sharding = exe.signature.sharding
    if sharding is not None and sharding.multi_process:  # no sharded gradient machine yet: a named error
        return sharding.undifferentiable(primal)(inputs)

    def check(status: Status, inputs: dict[str, Any]) -> None:
        if raise_errors:  # `bound` holds tracers here, `inputs` concrete values
            names = dict(zip(prog.entry_params, bound.values))  # jax sorts dict keys
            concrete = Bound({p: inputs[q] for q, p in names.items()}, bound.batched, batch)
            failures.raise_for(status, prog, concrete, fn.options)

    result, status, need = exe.gradient_machine()(inputs, primal, check, lambda: check_captured_stale(fn))
    # A tape that overflowed inside jit could not grow: its gradients are NaN.
    checkify.check(need == 0, "pcbatch: the gradient tape overflowed; pass tape_size={need} or more to "
                   "pcbatch.autobatch (rows per block per example; see f.tape_info)", need=need, debug=True)
    return result, status
