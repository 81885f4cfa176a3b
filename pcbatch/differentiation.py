"""How a call's inputs are being differentiated, from their tracers' types.

JAX wraps a differentiated value in a tracer per transformation: forward mode
(`jax.jvp`, `jax.jacfwd`) in a `JVPTracer`, reverse mode (`jax.grad`,
`jax.vjp`, `jax.linearize`) in a `LinearizeTracer` (or, on JAX's older
partial-evaluation path, a `JaxprTracer`). Forward mode alone needs no tape:
a call under it runs the plain machine (`mode(leaves)` says which it is under).

The tracer classes live in `jax._src`, JAX's private modules: they are looked
up once here, each guarded, so a JAX without one of them still imports pcbatch
(that kind of tracer is then simply never seen). Nothing here reads JAX's
error messages.
"""
from __future__ import annotations

import importlib
from typing import Any

import jax
import numpy as np


def _classes(module: str, *names: str) -> tuple[type, ...]:
    """The classes `names` of JAX's `module` that exist (none if it does not)."""
    try:
        found = importlib.import_module(module)
    except ImportError:
        return ()
    return tuple(c for c in (getattr(found, n, None) for n in names) if isinstance(c, type))


FORWARD: tuple[type, ...] = _classes("jax._src.interpreters.ad", "JVPTracer")
REVERSE: tuple[type, ...] = (_classes("jax._src.interpreters.ad", "LinearizeTracer")
                             + _classes("jax._src.interpreters.partial_eval", "JaxprTracer"))
STAGED: tuple[type, ...] = _classes("jax._src.interpreters.partial_eval", "DynamicJaxprTracer")  # jax.jit's


def is_tracer(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


def tracers(leaves: list[Any]) -> list[jax.core.Tracer]:
    """Every tracer among `leaves` and inside them (a tracer's `primal` or
    `val`: the value one transformation wraps in another)."""
    out: list[jax.core.Tracer] = []
    stack = [x for x in leaves if is_tracer(x)]
    while stack:
        x = stack.pop()
        out.append(x)
        for attr in ("primal", "val"):
            inner = getattr(x, attr, None)
            if is_tracer(inner):
                stack.append(inner)
    return out


def _current_trace() -> Any:
    """The trace JAX is tracing with now (private: guarded; None where unknown)."""
    try:
        from jax._src import core
        return core.trace_ctx.trace
    except (ImportError, AttributeError):
        return None


def stale(tracer: jax.core.Tracer) -> bool:
    """Whether `tracer` is a staged value (a `jax.jit`'s) of no trace running now: not the
    current one nor one it nests in, as when `jax.grad` of a jitted function traces the jit's
    jaxpr again. Conservative: False wherever JAX's trace chain cannot be followed."""
    if not isinstance(tracer, STAGED):
        return False
    mine, trace = getattr(tracer, "_trace", None), _current_trace()
    if mine is None or trace is None:
        return False
    while trace is not None:
        if trace is mine:
            return False
        if not hasattr(trace, "parent_trace"):
            return type(trace).__name__ == "EvalTrace"  # the root: `mine` is not in the chain
        trace = trace.parent_trace
    return True


def mode(leaves: list[Any]) -> str | None:
    """How the inputs are being differentiated: "forward" (only `jax.jvp` /
    `jax.jacfwd`), "mixed" (forward and reverse together, as `jax.hessian`)
    or None (reverse mode, or not at all)."""
    found = tracers(leaves)
    if not FORWARD or not any(isinstance(x, FORWARD) for x in found):
        return None
    return "mixed" if REVERSE and any(isinstance(x, REVERSE) for x in found) else "forward"


def _trace_state_clean() -> Any:
    """JAX's own test for "no transformation is tracing now" (private: looked up
    once, guarded; without it every call counts as traced)."""
    try:
        from jax._src import core
        return core.trace_state_clean
    except (ImportError, AttributeError):
        return lambda: False


outside_transformations = _trace_state_clean()


def staged() -> bool:
    """Whether a JAX operation called now on concrete values is staged into a
    caller's program (inside `jax.jit`, a `lax.cond` branch, a `lax.scan`
    body, `jax.eval_shape`, ...) rather than evaluated: a call on concrete
    arguments (closed over by the jitted function) is then traced into the
    caller's program, like one on traced arguments. Under `jax.vmap` or
    `jax.jvp` alone, an operation on values they do not carry is evaluated."""
    if outside_transformations():
        return False
    return is_tracer(jax.lax.add(np.int32(0), np.int32(0)))  # dead code where staged (dropped by jit)


def traced(leaves: list[Any]) -> bool:
    """Whether a machine called on `leaves` runs inside a caller's trace (its
    results are tracers), not eagerly."""
    return any(map(is_tracer, leaves)) or staged()


def captured(fn: Any, constants: tuple[tuple[str, Any], ...]) -> list[tuple[str, Any]]:
    """What a function captures besides its arguments, by name: its fixed
    `constants` (a functools.partial's arguments, a method's object) and its
    closure's variables; an object that is not a pytree also by its attributes
    (`self.w` of a plain class)."""
    out = list(constants)
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None) or ()
    for name, cell in zip(code.co_freevars if code is not None else (), cells):
        try:
            out.append((name, cell.cell_contents))
        except ValueError:  # a cell not yet assigned
            pass
    for name, value in list(out):
        leaves = jax.tree_util.tree_leaves(value)
        if len(leaves) == 1 and leaves[0] is value and not isinstance(value, jax.Array) and hasattr(value, "__dict__"):
            out.extend((f"{name}.{k}", v) for k, v in vars(value).items())
    return out

