"""Type inference by abstract evaluation, to a fixpoint.

Every op is traced (`jax.make_jaxpr`) on the types of its inputs, and its
jaxpr checked for random numbers a batch cannot reproduce (`ir/keys.py`); a
variable's type is the join of everything assigned to it: tree structures and
shapes must agree, dtypes join under JAX promotion (`acc = 0` then
`acc = acc + 0.5` is float32). Recursive return types come out of the
fixpoint: `fib.ret` is first typed by the base case, then checked against the
recursive one.
"""
from __future__ import annotations

import warnings
from collections import Counter
from typing import Any, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from pcbatch.errors import (HELPER_CALL_HINT, Loc, PcbatchError, TypeJoinWarning, TypeMismatchError,
                             UnsupportedSyntaxError, user_name)
from pcbatch.ir.core import Branch, Collect, Fork, Join, Launch, Prim, StackProgram
from pcbatch.ir.jaxtypes import all_eqns, note_loops, type_key
from pcbatch.ir.keys import KEY_JOIN_HINT, check_batchable, check_batchable_ops, is_key
from pcbatch.ir.printer import format_type


# `def f(n, y=None)` then `f(n - 1, y=...)`: Python skips the `if y is None` path per call.
NONE_JOIN_HINT = ("a variable is None on one path and a value on another (a parameter left at its `None` default "
                  "at one call and passed a value at another, say): pcbatch keeps one type per variable. Pass a "
                  "value at every call (a default of the value's type, `y=0`), or use a second variable.")


def _mismatch(var: str, a: Any, a_loc: Loc | None, b: Any, b_loc: Loc | None,
              also: tuple[str, ...] = (), hint: str = "") -> TypeMismatchError:
    first, second = format_type(a), format_type(b)
    if first == second:  # e.g. two classes of one name: name them fully
        first, second = format_type(a, qualified=True), format_type(b, qualified=True)
    if first == second:
        second += " (a different tree structure that prints the same)"
    return TypeMismatchError(var, first, a_loc, second, b_loc, also, hint)


def _promotable(t: Any) -> Any:
    """What `jnp.result_type` promotes as `t` would be: a weakly typed value (a
    Python number: `acc = 0`) as its Python type, so that `acc = acc + x` with `x`
    int8 stays int8, as in Python (`result_type` reads no weak type off a
    ShapeDtypeStruct)."""
    if not getattr(t, "weak_type", False):
        return t.dtype
    kind = jnp.dtype(t.dtype).kind
    return {"i": int, "u": int, "f": float, "c": complex}.get(kind, t.dtype)


def join(var: str, a: Any, a_loc: Loc | None, b: Any, b_loc: Loc | None, also: tuple[str, ...] = ()) -> Any:
    """`also`: the variables merged into `var` (copy coalescing), which an error names."""
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    if ta != tb or any(x.shape != y.shape for x, y in zip(la, lb)):
        raise _mismatch(var, a, a_loc, b, b_loc, also, NONE_JOIN_HINT if None in (a, b) else "")
    out = []
    for x, y in zip(la, lb):
        if is_key(x.dtype) or is_key(y.dtype):  # a typed PRNG key: `jnp.result_type` promotes none
            if x.dtype != y.dtype:
                raise _mismatch(var, a, a_loc, b, b_loc, also, KEY_JOIN_HINT)
            out.append(jax.ShapeDtypeStruct(x.shape, x.dtype))
            continue
        try:
            dtype = jnp.result_type(_promotable(x), _promotable(y))
        except TypeError as e:
            raise _mismatch(var, a, a_loc, b, b_loc, also) from e
        weak = getattr(x, "weak_type", False) and getattr(y, "weak_type", False)
        out.append(jax.ShapeDtypeStruct(x.shape, dtype, weak_type=weak))
    return jax.tree_util.tree_unflatten(ta, out)


# Python that needs a concrete value of a per-example one: what each JAX error means there, and what to write.
_CONCRETE: tuple[tuple[type, str, str], ...] = (
    (jax.errors.TracerBoolConversionError, "takes the truth value of a per-example value (as `if`, `max`, `==` on tuples do)",
     "`max`/`min` of per-example values is jnp.maximum/jnp.minimum; compare per element and combine "
     "(`(a, b) == (1, 1)` is `(a == 1) & (b == 1)`, or jnp.all(...) over an array); a data-dependent "
     "`if`/`while` in a helper called here needs jnp.where/lax.cond, or @pcbatch.autobatch on the helper."),
    (jax.errors.TracerIntegerConversionError, "needs a per-example value as a Python int",
     "`int(x)` is x.astype(jnp.int32); index with the value itself (`xs[i]`), or jax.lax.dynamic_slice; "
     "a Python list or tuple indexed by a per-example value is an array (`jnp.asarray([10, 20, 30])[i]`)."),
    (jax.errors.TracerArrayConversionError, "needs a per-example value as a NumPy array",
     "use jnp in place of np on per-example values (`jnp.sin(x)`, not `np.sin(x)`)."),
    (jax.errors.NonConcreteBooleanIndexError, "indexes with a per-example boolean mask (a per-example shape)",
     "keep the shape: `jnp.where(mask, x, 0)`, or reduce, e.g. `jnp.sum(jnp.where(mask, x, 0))`."),
    (jax.errors.ConcretizationTypeError, "needs a concrete value (a Python number, a static shape) of a per-example value",
     "`int(x)`/`float(x)` is x.astype(...), `max`/`min` is jnp.maximum/jnp.minimum, a static size must "
     "not depend on a variable (write `jnp.zeros(x.shape[0])`); a data-dependent `if`/`while` in a "
     "helper called here needs jnp.where/lax.cond, or @pcbatch.autobatch on the helper."),
)


def _builtin_value(x: Any) -> bool:
    """A value of Python's or a library's own (a str, a dtype), not of a class of the user's."""
    return type(x).__module__ in ("builtins", "numpy") or type(x).__module__.startswith(("jax", "numpy."))


def _arrays_only(op: Prim):
    """`op.fn`, raising a named error where it makes a value that is no array
    (`h = jnp.abs`, `g = f`): JAX's would say an internal function returned it."""
    def fn(*xs: Any) -> tuple:
        outs = op.fn(*xs)
        for var, x in zip(op.outs, outs):
            bad = [v for v in jax.tree_util.tree_leaves(x)
                   if not isinstance(v, (jax.Array, np.ndarray, np.generic, bool, int, float, complex))]
            if bad:
                local = user_name(var).rpartition(".")[2]
                named = "" if local.startswith("_") or local == "<ret>" else f" (assigned to `{local}`)"
                raise UnsupportedSyntaxError(
                    f"`{op.text}`{named} is not an array but a `{type(bad[0]).__name__}`: every variable (and "
                    "every value returned) of an autobatched function holds arrays", op.loc or Loc("<unknown>", 0),
                    ("call a function where you use it (`jnp.abs(x)`, `f(n - 1)` by its own name), or assign a "
                     "lambda (`h = lambda v: jnp.abs(v)`)." if callable(bad[0]) else
                     "write the expression where it is used (`n.astype(xs.dtype)`), or make it a global of the "
                     "module." if _builtin_value(bad[0]) else
                     f"register `{type(bad[0]).__name__}` as a JAX pytree (jax.tree_util.register_dataclass), or "
                     "read it where it is used (a global, a closure's variable, `self.w`) instead of passing it "
                     "on.") + " See README.md, 'Supported Python'.")
        return outs
    return fn


def abstract_eval(op: Prim, in_types: list[Any]) -> tuple:
    try:
        closed, shapes = jax.make_jaxpr(_arrays_only(op), return_shape=True)(*in_types)
        check_batchable_ops(closed.jaxpr, op.text, op.loc)
        note_loops(op.fn, closed.jaxpr)
        return shapes
    except Exception as e:
        if isinstance(e, PcbatchError):  # raised by pcbatch's own code for the op: it quotes the line
            callee = getattr(e, "callee", None)
            if callee is not None and op.loc is not None:  # reached through a plain helper: quote the user's line
                raise UnsupportedSyntaxError(
                    f"`{op.text}` calls autobatched function `{callee}` through an ordinary Python function "
                    "(a helper, lambda or comprehension), which pcbatch traces as one example's JAX code",
                    op.loc, HELPER_CALL_HINT) from e
            raise
        if isinstance(e, TypeError) and op.loc is not None and any(t is None for t in in_types):
            names = ", ".join(f"`{user_name(v).rpartition('.')[2]}`" for v, t in zip(op.ins, in_types) if t is None)
            raise UnsupportedSyntaxError(
                f"{names} is None here, and `{op.text}` cannot use None ({e}). pcbatch compiles every path "
                "of the function, also one that Python skips for None (`if y is None: ...`)", op.loc,
                "pass a value for it, or call a function that does not take it (functools.partial, or a "
                "second function without that parameter).") from e
        if isinstance(e, OverflowError) and op.loc is not None:  # `v = 3_000_000_000`, x64 off
            raise UnsupportedSyntaxError(
                f"`{op.text}` makes a Python number JAX's default type cannot hold ({e}); every variable is "
                "an array", op.loc,
                "give it the dtype you mean (`jnp.uint32(3_000_000_000)`), or turn on jax_enable_x64.") from e
        for kind, what, hint in _CONCRETE:
            if isinstance(e, kind):
                # Every variable is a traced per-example value: Python that branches on one, or
                # makes a Python number of it, cannot run once for the whole batch.
                raise UnsupportedSyntaxError(
                    f"`{op.text}` {what}, but every variable of an autobatched function is a traced "
                    f"per-example value (JAX raised {type(e).__name__})", op.loc or Loc("<unknown>", 0),
                    f"{hint} See README.md, 'Supported Python'.") from e
        where = f" at {op.loc}" if op.loc else ""
        e.add_note(f"pcbatch: while tracing `{op.text}`{where} (per-example input types: "
                   f"{', '.join(format_type(t) for t in in_types) or 'none'}).")
        raise


def infer_types(prog: StackProgram, input_types: dict[str, Any]) -> dict[str, Any]:
    types: dict[str, Any] = dict(input_types)
    origin: dict[str, Loc | None] = {v: prog.param_locs.get(v) for v in input_types}  # an input: its parameter
    cache: dict[tuple, tuple] = {}
    ops: list[Prim] = list(prog.prelude) + [op for b in prog.blocks for op in b.ops if isinstance(op, Prim)]
    # A Fork's parameter assignments and a Join's results type like copies.
    for b in prog.blocks:
        if isinstance(b.term, Fork):
            ops += [Prim(c.params, c.args, lambda *xs: xs, "", b.term.loc) for c in b.term.calls if c.params]
        ops += [Prim(op.outs, op.rets, lambda *xs: xs, "", b.loc) for op in b.ops if isinstance(op, Join)]
        # A Launch's parameter assignments, a Collect's result and its flag (a bool).
        ops += [Prim(op.call.params, op.call.args, lambda *xs: xs, "", b.loc)
                for op in b.ops if isinstance(op, Launch) and op.call.params]
        ops += [Prim((op.out, op.flag), (op.ret,), lambda x: (x, jnp.bool_(True)), "", b.loc)
                for op in b.ops if isinstance(op, Collect)]

    for var, t in input_types.items():
        check_batchable(var, t, origin[var])

    def assign(var: str, t: Any, loc: Loc | None) -> bool:
        if var not in types:
            check_batchable(var, t, loc)
            types[var], origin[var] = t, loc
            return True
        joined = join(var, types[var], origin[var], t, loc, prog.merged.get(var, ()))
        if type_key(joined) != type_key(types[var]):
            types[var] = joined
            return True
        return False

    changed = True
    while changed:
        changed = False
        for op in ops:
            if not all(v in types for v in op.ins):
                continue
            in_types = [types[v] for v in op.ins]
            key = (id(op), tuple(type_key(t) for t in in_types))
            if key not in cache:
                try:
                    cache[key] = abstract_eval(op, in_types)
                except Exception as e:  # noqa: BLE001 -- kept, and raised if it still fails at the fixpoint
                    cache[key] = e
            if isinstance(cache[key], Exception):
                # An input's type may still widen (`c or 8`: bool until the join
                # with the int arm is seen): only the final types count.
                continue
            for var, t in zip(op.outs, cache[key]):
                changed |= assign(var, t, op.loc)

    assigned = [(v, t, prog.param_locs.get(v)) for v, t in input_types.items()]
    for op in ops:  # at the fixpoint, every op must trace with its inputs' final types
        if all(v in types for v in op.ins):
            results = cache[(id(op), tuple(type_key(types[v]) for v in op.ins))]
            if isinstance(results, Exception):
                raise results
            assigned += [(v, t, op.loc) for v, t in zip(op.outs, results)]
    _check_complete(prog, types, ops)
    _warn_widened(types, assigned, origin)
    _warn_bool_joins(types, assigned, ops, cache)
    return types


def _nots(jaxpr: Any, of_bool: bool) -> int:
    """How many `not`s `jaxpr` (any depth) applies to a bool (`of_bool`) or to a number."""
    return sum(eqn.primitive.name == "not"
               and any((getattr(v.aval, "dtype", None) == jnp.bool_) == of_bool for v in eqn.invars)
               for eqn in all_eqns(jaxpr))


def _computes_otherwise(as_bool: Any, as_number: Any) -> bool:
    """Whether an op traced with bool inputs (`as_bool`) and with them numbers
    (`as_number`) computes other values on 0 and 1: JAX's `~` of a bool is
    logical, of an int bitwise; its `a + b` of two bools is `or`. (Other
    differences keep the values: `a * b` of bools is `and`, `jnp.where(v, ...)`
    of a number tests `v != 0`.)"""
    b, n = (Counter(eqn.primitive.name for eqn in all_eqns(j)) for j in (as_bool, as_number))
    added_as_or = b["or"] > n["or"] and n["add"] > b["add"]
    return added_as_or or (_nots(as_bool, True) > 0 and _nots(as_number, False) > 0)


def _warn_bool_joins(types: dict[str, Any], assigned: list[tuple[str, Any, Loc | None]], ops: list[Prim],
                     cache: dict[tuple, Any]) -> None:
    """Warn at an op that reads a variable which is a bool on one path and a
    number on another, where the op computes something else on the bool: `~v`
    (logical, where the joined int's is bitwise), `v + w` of two bools (logical or).
    Found by tracing the op with those inputs as bools again."""
    was_bool = {var: t for var, t, _ in assigned
                if jax.tree_util.tree_structure(t) == jax.tree_util.tree_structure(types[var])
                and any(a.dtype == jnp.bool_ and b.dtype != jnp.bool_
                        for a, b in zip(jax.tree_util.tree_leaves(t), jax.tree_util.tree_leaves(types[var])))}
    warned = set()
    for op in ops:
        read = [v for v in op.ins if v in was_bool]
        if not read or op.loc is None or (op.loc, op.text) in warned or not all(v in types for v in op.ins):
            continue
        try:
            as_bool = jax.make_jaxpr(op.fn)(*[was_bool.get(v, types[v]) for v in op.ins]).jaxpr
            as_joined = jax.make_jaxpr(op.fn)(*[types[v] for v in op.ins]).jaxpr
        except Exception:  # noqa: BLE001 -- the op does not take the bool: nothing Python would compute
            continue
        if _computes_otherwise(as_bool, as_joined):
            warned.add((op.loc, op.text))
            names = ", ".join(f"`{user_name(v).rpartition('.')[2]}`" for v in read)
            warnings.warn_explicit(
                f"`{op.text}` reads {names}, a bool on one path and {format_type(types[read[0]])} on another: "
                f"pcbatch keeps one type per variable, so this computes on the number, where Python computes on "
                f"the bool (`~` is logical on a bool, bitwise on an int; bool + bool is `or`). Give every path "
                f"the same dtype (.astype) to compute as Python does.", TypeJoinWarning, op.loc.filename,
                op.loc.lineno)


def _widens(have: Any, final: Any) -> bool:
    if have == final or not all(isinstance(d, jnp.dtype) and d.kind in "iufc" for d in (have, final)):
        return False  # the same, or a bool, a key, ...
    return final.itemsize > have.itemsize or {have.kind, final.kind} == {"i", "u"}


def _warn_widened(types: dict[str, Any], assigned: list[tuple[str, Any, Loc | None]],
                  origin: dict[str, Loc | None]) -> None:
    """Warn where the join widens a strongly typed value: Python would go on
    computing in its own dtype (int8 wraps, float16 rounds). A Python number is
    weakly typed and takes the other's type in JAX too; a bool or an int32 made
    float32 keeps its values (up to 2**24), as stacking the examples' results would."""
    warned = set()
    for var, t, loc in assigned:
        for have, final in zip(jax.tree_util.tree_leaves(t), jax.tree_util.tree_leaves(types[var])):
            if var in warned or loc is None or getattr(have, "weak_type", False) or not _widens(have.dtype, final.dtype):
                continue
            warned.add(var)
            fn, _, local = user_name(var).rpartition(".")
            what = (f"the return value of `{fn}`" if local == "<ret>" else
                    f"a value of `{fn}`" if local.startswith("_") else f"`{local}`")
            other = f" (as at {origin[var]})" if origin.get(var) not in (None, loc) else ""
            warnings.warn_explicit(
                f"{what} is {format_type(have)} here but {format_type(final)} on another path{other}: pcbatch keeps "
                f"one type per variable, so here it is converted to {final.dtype} and computed on as such, where "
                f"Python keeps {have.dtype} (wrap-around, `~`, rounding may differ). Give every path the same "
                f"dtype (.astype) to compute as Python does.", TypeJoinWarning, loc.filename, loc.lineno)


def _check_complete(prog: StackProgram, types: dict[str, Any], ops: Iterable[Prim]) -> None:
    for op in ops:
        missing = [v for v in op.ins if v not in types]
        if missing:
            raise UnsupportedSyntaxError(
                f"cannot infer a type for `{user_name(missing[0])}`: no path assigns it before this use "
                "(a function that recurses, or raises, on every path never returns)", op.loc or Loc("<unknown>", 0),
                "make sure every variable is assigned, and every recursive function has a base case.")
    for b in prog.blocks:
        if isinstance(b.term, Branch):
            t = types.get(b.term.cond)
            leaves = jax.tree_util.tree_leaves(t)
            if b.term.cond in types and not isinstance(t, jax.ShapeDtypeStruct):  # None, a tuple, a dict
                raise UnsupportedSyntaxError(
                    f"a condition on {'None' if t is None else format_type(t)}, not on a per-example scalar: "
                    f"Python's truth value of None or a container is fixed for every example",
                    b.term.loc or Loc("<unknown>", 0),
                    "test what you mean on a scalar (`t[0] != 0`, `y is not None`), or drop the test.")
            if len(leaves) != 1 or leaves[0].shape != ():
                raise UnsupportedSyntaxError(
                    f"a condition must be one scalar per example, but `{b.term.cond}` is "
                    f"{format_type(t) if t is not None else 'untyped'}", b.term.loc or Loc("<unknown>", 0),
                    "reduce it with jnp.any(...) or jnp.all(...).")
    if prog.result not in types:
        raise UnsupportedSyntaxError(
            f"cannot infer the return type of `{prog.result.rpartition('.')[0]}`: no path returns",
            prog.blocks[prog.entry_block].loc or Loc("<unknown>", 0),
            "every recursive function needs a base case that returns without recursing, and a function "
            "must return on some path that does not `raise` (or fail an `assert`).")
