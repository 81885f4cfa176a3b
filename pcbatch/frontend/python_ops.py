"""Python's semantics where generated code needs them at run time: `and`/`or`/
`not` and chained comparisons inside a comprehension, the builtin `max`/`min`
on per-example scalars, and the type of a `range` loop's counter (`range_counter`).

A comprehension's operands are often plain Python values (`i` from `range(3)`),
where Python's own operators must run (`i and x` is `x` or `0`, not a bool);
on traced per-example booleans the logical ops give the same values. Any other
traced operand has no truth value a trace can branch on: a named error.
"""
from __future__ import annotations

import operator
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from pcbatch.errors import Loc, UnsupportedSyntaxError
from pcbatch.ir.weak import weakly_typed

_COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "Eq": operator.eq, "NotEq": operator.ne, "Lt": operator.lt, "LtE": operator.le, "Gt": operator.gt,
    "GtE": operator.ge, "Is": operator.is_, "IsNot": operator.is_not,
    "In": lambda a, b: a in b, "NotIn": lambda a, b: a not in b,
}


def _traced(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


def _is_bool(x: Any) -> bool:
    return isinstance(x, bool) or getattr(x, "dtype", None) == jnp.bool_


def bool_op(is_and: bool, where: tuple[str, int, str], first: Any, *rest: Callable[[], Any]) -> Any:
    """`first and rest[0]() and ...` (`or` where not `is_and`): each operand only
    where Python would evaluate it."""
    out = first
    for operand in rest:
        if not _traced(out):
            if bool(out) != is_and:  # `and` stops at a falsy value, `or` at a truthy one
                return out
            out = operand()
            continue
        value = operand()
        if not _is_bool(out) or not _is_bool(value):
            word = "and" if is_and else "or"
            pick = "jnp.where(a, b, a)" if is_and else "jnp.where(a, a, b)"
            raise UnsupportedSyntaxError(
                f"`{word}` on a per-example value that is not a boolean, inside a comprehension", Loc(*where),
                f"Python would branch on each example's value: write `a {word} b` as {pick}, or compare "
                f"first (`a != 0 {word} ...`), or write the loop as `for i in range(n):` in the function body. "
                f"See README.md, 'Supported Python'.")
        out = (jnp.logical_and if is_and else jnp.logical_or)(out, value)
    return out


def if_exp(where: tuple[str, int, str], test: Any, body: Callable[[], Any], orelse: Callable[[], Any]) -> Any:
    """`body() if test else orelse()`: Python's on a Python value; a per-example
    test inside a comprehension cannot branch (a named error, not JAX's)."""
    if not _traced(test):
        return body() if test else orelse()
    raise UnsupportedSyntaxError(
        "a conditional expression on a per-example value, inside a comprehension", Loc(*where),
        "Python would branch on each example's value: write `jnp.where(test, a, b)` (both sides are "
        "computed), or write the loop as `for i in range(n):` in the function body. See README.md, "
        "'Supported Python'.")


def min_max(where: tuple[str, int, str], fn: Callable, *args: Any) -> Any:
    """`fn(*args)` for the builtin `max`/`min` on per-example scalars: Python's
    fold, `m = x if x > m else m` (`<` for min), so ties and NaN pick what
    Python's picks; anything else is `fn` itself (another `max`, Python values)."""
    if fn is not max and fn is not min:
        return fn(*args)
    one = len(args) == 1
    if one and _traced(args[0]) and jnp.ndim(args[0]) == 0:
        return fn(*args)  # Python's TypeError: a scalar is not iterable
    items = list(args[0]) if one else list(args)  # an array's rows, as Python iterates it
    if not any(_traced(x) for x in items):
        return fn(*args)
    name = fn.__name__
    if not items or any(jnp.ndim(x) != 0 for x in items):
        raise UnsupportedSyntaxError(
            f"`{name}` of per-example values that are not scalars (or of an empty sequence): Python compares "
            f"whole values and would raise for every example", Loc(*where),
            f"write jnp.{'maximum' if name == 'max' else 'minimum'}(a, b) elementwise, or "
            f"jnp.{name}(x) to reduce an array.")
    better = jnp.greater if fn is max else jnp.less
    out = items[0]
    for x in items[1:]:
        out = jnp.where(better(x, out), x, out)
    return out


def _scalars(*xs: Any) -> bool:
    return all(jnp.ndim(x) == 0 for x in xs)


def contains(value: Any, container: Any) -> Any:
    """`value in container` over a tuple or list (a global's, a variable's) of
    per-example scalars: `value == e or ...`, as Python's `in` compares; anything
    else (Python values, a dict, an array) is Python's own `in`."""
    if (isinstance(container, (tuple, list)) and any(_traced(x) for x in (value, *container))
            and _scalars(value, *container)):
        out = False
        for e in container:
            out = jnp.logical_or(out, value == e)
        return out
    return value in container


def in_range(value: Any, fn: Callable, *args: Any) -> Any:
    """`value in fn(*args)` for the builtin `range` with a per-example value or
    bound: Python's arithmetic test (the bounds, then `value` congruent to the
    start modulo the step), which compares a float as Python does (`2.0 in
    range(3)`). Anything else, a per-example step included (Python raises for a
    step of 0), is `value in fn(*args)` itself."""
    start, stop, step = ([0, *args, 1] if len(args) == 1 else [*args, 1])[:3]
    bounds_int = all(isinstance(b, (bool, int)) or jnp.issubdtype(jnp.result_type(b), jnp.integer)
                     for b in (start, stop))
    if (fn is not range or not (_traced(value) or _traced(start) or _traced(stop)) or _traced(step)
            or not isinstance(step, int) or step == 0 or not bounds_int or not _scalars(value, start, stop)):
        return value in fn(*args)
    if jnp.result_type(value) == jnp.bool_:
        value = jnp.asarray(value, int)
    inside = (start <= value) & (value < stop) if step > 0 else (stop < value) & (value <= start)
    # Congruence without `value - start`, which could wrap.
    return inside & (jnp.remainder(value, abs(step)) == jnp.remainder(start, abs(step)))


def not_(value: Any) -> Any:
    return jnp.logical_not(value) if _traced(value) else not value


def compare(left: Any, ops: tuple[str, ...], *rights: Callable[[], Any]) -> Any:
    """`left op0 r0 op1 r1 ...`, each operand evaluated once, stopping at the first
    concrete False; traced comparisons (booleans) are joined with logical_and."""
    out = None
    for op, right in zip(ops, rights):
        value = right()
        step = _COMPARE[op](left, value)
        if out is None or not (_traced(out) or _traced(step)):
            out = step  # so far a concrete True, which passes on (jnp would trace Python values)
        else:
            out = jnp.logical_and(out, step)
        if not _traced(out) and not out:
            return out
        left = value
    return out


def range_counter(where: tuple[str, int, str], value: Any, *bounds: Any) -> Any:
    """`value`, one of `range(...)`'s bounds, in the type of the loop's counter.
    In Python the counter is an int: here JAX's default int, weakly typed (so
    `i * i` does not wrap where the bound is int8, and `h * 2 + i` with `h`
    int8 stays int8), unless a bound holds values the default int cannot (a
    uint32 bound without x64): then the bounds' joined dtype. `bounds` are those
    that set the type: not a literal such as the implicit start 0 and step 1,
    which fit any int type (a uint32 `range(a, b)` counts in uint32)."""
    for b in bounds:
        dtype = getattr(b, "dtype", None) if not isinstance(b, (bool, int)) else np.dtype(int)
        if dtype is None or jnp.shape(b) != () or not (jnp.issubdtype(dtype, jnp.integer) or dtype == jnp.bool_):
            what = type(b).__name__ if dtype is None else f"{dtype}{list(jnp.shape(b)) if jnp.shape(b) else ''}"
            raise UnsupportedSyntaxError(
                f"range() of a {what} value: Python's range() takes one int per bound (a TypeError for "
                f"every example)", Loc(*where),
                "make each bound an integer scalar: `n // 2` rather than `n / 2`, or convert it with "
                "`.astype(jnp.int32)`. See README.md, 'Supported Python'.")
    default = np.dtype(jax.dtypes.canonicalize_dtype(jnp.int_))  # int32, or int64 under x64
    dtypes = [jnp.result_type(b) for b in bounds]
    wide = [d for d in dtypes if d != jnp.bool_ and (np.iinfo(d).min < np.iinfo(default).min
                                                     or np.iinfo(d).max > np.iinfo(default).max)]
    if wide:
        return jnp.asarray(value, jnp.result_type(*dtypes))
    return weakly_typed(jnp.asarray(value, default))
