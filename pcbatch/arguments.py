"""How a call's arguments reach the machine.

Python's own binding rules first (positional, keyword, defaults, keyword-only),
then `in_axes` per parameter, then each value as an array: what `jax.vmap`
does, with two conveniences it lacks: keyword arguments and defaults follow
`in_axes` like positional ones, and a Python number (or any rank-0 value)
under a scalar `in_axes` is shared by the whole batch rather than an error.
"""
from __future__ import annotations

import functools
import numbers
import types
from dataclasses import dataclass
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from pcbatch.errors import ArgumentError, Loc, OptionError, UnsupportedSyntaxError
from pcbatch.frontend import BoundFunction

tree_util = jax.tree_util


def target_of(obj: Any, name: str = "pcbatch.autobatch") -> BoundFunction:
    """The Python function to convert behind `obj`: a function, a
    `functools.partial`, a bound method or a callable object; an autobatched
    function's own target (anything with a `.target`)."""
    if isinstance(obj, BoundFunction):
        return obj
    target = getattr(obj, "target", None)
    if isinstance(target, BoundFunction):
        return target
    if isinstance(obj, functools.partial):
        inner = target_of(obj.func, name)
        params = list(inner.signature.parameters.values())
        positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(obj.args) > len(positional):
            raise OptionError(name, f"functools.partial gives {len(obj.args)} positional arguments but "
                                    f"`{inner.qualname}` takes {len(positional)}")
        fixed = dict(zip(positional, obj.args))
        for key, value in obj.keywords.items():
            if key not in inner.signature.parameters or key in fixed:
                raise OptionError(name, f"functools.partial fixes `{key}`, which `{inner.qualname}` "
                                        "does not take (or which is already fixed)")
            fixed[key] = value
        return BoundFunction(inner.fn, inner.constants + tuple(fixed.items()),
                             inner.keyword_fixed | frozenset(obj.keywords))
    if isinstance(obj, types.MethodType):
        inner = target_of(obj.__func__, name)
        first = next(iter(inner.signature.parameters), None)
        if first is None:
            raise OptionError(name, f"method `{inner.qualname}` takes no `self` parameter")
        return BoundFunction(inner.fn, inner.constants + ((first, obj.__self__),), inner.keyword_fixed)
    if isinstance(obj, types.FunctionType):
        return BoundFunction(obj)
    if callable(obj) and isinstance(getattr(type(obj), "__call__", None), types.FunctionType):
        return target_of(obj.__call__, name)
    raise OptionError(name, f"expects a Python function (a `def`, a functools.partial of one, or a bound "
                            f"method), got {obj!r}")


def check_signature(target: BoundFunction) -> None:
    """What pcbatch cannot honour is an error at decoration, never a silent default."""
    for p in target.signature.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            code = target.fn.__code__
            raise UnsupportedSyntaxError(
                f"`{target.qualname}` has a `{'*' if p.kind is p.VAR_POSITIONAL else '**'}{p.name}` parameter; "
                "pcbatch needs a fixed set of named parameters",
                Loc(code.co_filename, code.co_firstlineno, _line(code.co_filename, code.co_firstlineno)),
                "name each parameter (a tuple or dict parameter holds any number of arrays). "
                "See README.md, 'Supported Python'.")


def _line(filename: str, lineno: int) -> str:
    import linecache
    return linecache.getline(filename, lineno).rstrip("\n")


def _is_axis_leaf(a: Any) -> bool:
    return a is None or isinstance(a, int)


def check_in_axes(in_axes: Any, target: BoundFunction) -> None:
    """`in_axes`: an int or None for every argument, or one entry per
    parameter (a tuple/list in order, or a dict by name), each an int, None or
    a pytree of them matching that argument."""
    params = list(target.signature.parameters)
    if isinstance(in_axes, Mapping):
        unknown = sorted(set(in_axes) - set(params))
        if unknown:
            raise OptionError("in_axes", f"names no parameter of `{target.qualname}{target.signature}`: {unknown}")
        entries = list(in_axes.values())
    elif isinstance(in_axes, list) or (isinstance(in_axes, tuple) and not hasattr(in_axes, "_fields")):
        if len(in_axes) > len(params):
            raise OptionError("in_axes", f"has {len(in_axes)} entries but `{target.qualname}` takes "
                                         f"{len(params)} parameters {tuple(params)}")
        entries = list(in_axes)
    else:
        entries = [in_axes]
    for entry in entries:
        if isinstance(entry, bool) or not all(_is_axis_leaf(a) and not isinstance(a, bool) for a in
                                              tree_util.tree_leaves(entry, is_leaf=_is_axis_leaf)):
            raise OptionError("in_axes", f"entries must be an int, None or a pytree of them, got {entry!r}",
                              "as in jax.vmap: 0 maps an argument over its first axis, None shares it.")


@dataclass(frozen=True)
class Bound:
    """A call's arguments, every parameter's value with its batch axis moved
    to 0 (`batched`) or shared by every example."""

    values: dict[str, Any]
    batched: dict[str, bool]
    batch: int

    def example(self, i: int) -> dict[str, Any]:
        return {p: tree_util.tree_map(lambda a: a[i], x) if self.batched[p] else x for p, x in self.values.items()}

    def indexable(self) -> "Bound":
        """The same arguments, those sharded over a mesh's explicit axes gathered
        on one device: `example(i)` indexes them one example at a time (the
        reference, a failure's replay), which JAX refuses on such an array."""
        values = {p: tree_util.tree_map(_on_one_device, x) if self.batched[p] else x
                  for p, x in self.values.items()}
        return Bound(values, self.batched, self.batch)


def _on_one_device(x: Any) -> Any:
    if not isinstance(x, jax.Array) or isinstance(x, jax.core.Tracer) or not x.is_fully_addressable:
        return x
    spec = getattr(jax.typeof(x).sharding, "spec", ())
    # Through the host: `jax.device_put` to one device keeps the sharding in the array's type.
    return jnp.asarray(np.asarray(x), x.dtype) if any(p is not None for p in spec) else x


_NUMBER = (numbers.Number, np.generic, np.bool_)


_JAX_DTYPES: dict[np.dtype, bool] = {}


def _jax_takes(dtype: np.dtype) -> bool:
    """Whether JAX holds arrays of `dtype` (not strings, objects, float128)."""
    if dtype not in _JAX_DTYPES:
        try:
            # From NumPy, as the call converts it: int64 becomes int32 without x64 silently, where
            # `jnp.zeros(..., int64)` warns about a dtype the user never asked JAX for.
            jnp.asarray(np.zeros((0,), dtype))
            _JAX_DTYPES[dtype] = True
        except (TypeError, ValueError):
            _JAX_DTYPES[dtype] = False
    return _JAX_DTYPES[dtype]


def _as_array(fn_name: str, param: str, x: Any) -> Any:
    if isinstance(x, (jax.Array, jax.core.Tracer)):
        return x
    if isinstance(x, np.ndarray):
        if not _jax_takes(x.dtype):
            raise ArgumentError(fn_name, f"argument `{param}` is a NumPy array of dtype {x.dtype}, which JAX "
                                         "cannot hold",
                                "pass numbers: convert it with .astype (strings: encode them as integer ids).")
        return x
    if isinstance(x, _NUMBER) and not isinstance(x, (str, bytes)):
        return jnp.asarray(x)
    what = "a string" if isinstance(x, (str, bytes)) else f"a {type(x).__name__}"
    raise ArgumentError(fn_name, f"argument `{param}` holds {what} ({x!r:.60}); pcbatch arguments are arrays, "
                                 "numbers or pytrees of them",
                        "fix other values with functools.partial or a closure (they become constants of the "
                        "program), or register the class as a JAX pytree.")


def _numeric_list(x: Any) -> bool:
    return isinstance(x, list) and len(x) > 0 and all(
        isinstance(v, _NUMBER) or _numeric_list(v) for v in x)


def _arrays(fn_name: str, param: str, value: Any) -> Any:
    """Numbers and lists of numbers as arrays (like `jnp.asarray`); other
    pytrees keep their structure."""
    def as_array(x: Any) -> Any:
        try:
            return jnp.asarray(x)
        except (TypeError, ValueError) as e:
            raise ArgumentError(fn_name, f"argument `{param}` is a list JAX cannot make an array of ({e})",
                                "pass a rectangular list of numbers (pad ragged rows), or an array.") from None

    value = tree_util.tree_map(lambda x: as_array(x) if _numeric_list(x) else x, value, is_leaf=_numeric_list)
    return tree_util.tree_map(lambda x: _as_array(fn_name, param, x), value)


def _axes_per_parameter(in_axes: Any, params: list[str], passed: set[str]) -> tuple[dict[str, Any], bool]:
    """Each parameter's axes, and whether they came from one scalar for all."""
    if isinstance(in_axes, Mapping):
        return {p: in_axes.get(p, 0) if p in passed else None for p in params}, False
    if isinstance(in_axes, list) or (isinstance(in_axes, tuple) and not hasattr(in_axes, "_fields")):
        return {p: in_axes[k] if k < len(in_axes) and p in passed else None for k, p in enumerate(params)}, False
    return {p: in_axes if p in passed else None for p in params}, in_axes is None or isinstance(in_axes, int)


def bind(target: BoundFunction, in_axes: Any, args: tuple, kwargs: dict[str, Any]) -> Bound:
    """Python's binding, then `in_axes`: every parameter's value, batch axis first."""
    name, sig = target.qualname, target.signature
    fixed = {p for p, _ in target.constants}
    for key in kwargs:
        if key in fixed:
            raise ArgumentError(name, f"argument `{key}` is fixed by functools.partial (or is the bound `self`)",
                                "leave it out of the call, or build a new partial.")
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as e:
        raise ArgumentError(name, f"{e} (signature {sig})", "call it as you would call the Python function.") from None
    passed = set(bound.arguments)
    bound.apply_defaults()
    params = list(sig.parameters)
    if isinstance(in_axes, (list, tuple)) and not hasattr(in_axes, "_fields"):
        extra = [p for k, p in enumerate(params) if k >= len(in_axes) and p in passed]
        if extra:
            raise ArgumentError(name, f"in_axes has {len(in_axes)} entries but argument `{extra[0]}` "
                                      f"(parameter {params.index(extra[0]) + 1}) was given",
                                "give in_axes one entry per parameter, or a dict by parameter name.")
    axes, scalar_axes = _axes_per_parameter(in_axes, params, passed)
    sizes: dict[str, int] = {}
    values: dict[str, Any] = {}
    specs: dict[str, Any] = {}
    for p in params:
        value = bound.arguments[p]
        if isinstance(value, jax.Array) and (axes[p] is None or isinstance(axes[p], int)):
            pairs = [(axes[p], value)]  # one array: no pytree to walk (the common case, on every call)
        else:
            value = _arrays(name, p, value)
            try:
                full = tree_util.tree_map(lambda a, x: tree_util.tree_map(lambda _: a, x), axes[p], value,
                                          is_leaf=lambda a: a is None)
            except ValueError as e:
                raise ArgumentError(name, f"in_axes for `{p}` ({axes[p]!r}) does not match the argument's "
                                          f"structure: {e}") from None
            # Up to the value's structure: a None in the value is no leaf, a None in in_axes is.
            pairs = zip(tree_util.tree_structure(value).flatten_up_to(full), tree_util.tree_leaves(value))
        values[p] = value
        leaf_axes = []
        for a, x in pairs:
            ndim = np.ndim(x)
            if a is not None and ndim == 0 and scalar_axes:
                a = None  # a number next to batched arrays: shared
            if a is not None and not -ndim <= a < ndim:
                raise ArgumentError(name, f"in_axes maps argument `{p}` over axis {a}, but it has rank {ndim} "
                                          f"(shape {np.shape(x)})",
                                    "pass None in in_axes for arguments every example shares.")
            if a is not None:
                sizes.setdefault(p, np.shape(x)[a])
                if np.shape(x)[a] != sizes[p]:
                    raise ArgumentError(name, f"argument `{p}` has leaves with different batch sizes "
                                              f"{np.shape(x)[a]} and {sizes[p]}")
            leaf_axes.append(a)
        specs[p] = leaf_axes
    if not sizes:
        raise ArgumentError(name, "no argument is batched (all in_axes are None, or only numbers were passed)",
                            "give the batched arguments a leading batch axis, as for jax.vmap.")
    if len(set(sizes.values())) > 1:
        listed = ", ".join(f"`{p}` has {n}" for p, n in sizes.items())
        raise ArgumentError(name, f"batched arguments have different batch sizes: {listed}")
    batch = next(iter(sizes.values()))
    out: dict[str, Any] = {}
    for p in params:
        leaves, treedef = tree_util.tree_flatten(values[p])
        if p not in sizes:
            out[p] = values[p]
            continue
        # A JAX array already batched on axis 0 is passed as it is: `moveaxis` and `asarray` each
        # cost ~20 us a leaf on every call, a tenth of a small call's time.
        moved = [jnp.broadcast_to(x, (batch,) + np.shape(x)) if a is None
                 else x if a == 0 and isinstance(x, jax.Array) else jnp.moveaxis(x, a, 0)
                 for a, x in zip(specs[p], leaves)]
        out[p] = tree_util.tree_unflatten(treedef, moved)
    return Bound(out, {p: p in sizes for p in params}, batch)


def reference_call(target: BoundFunction, values: Mapping[str, Any]) -> Any:
    """Call the Python function with every parameter's value by name. NumPy
    arrays go in as JAX arrays: the machine's values are immutable, so an
    in-place `a += 1` on a NumPy argument must not change the caller's array
    (and with it the next example's, or the next call's, input)."""
    values = {p: tree_util.tree_map(lambda x: jnp.asarray(x) if isinstance(x, np.ndarray) else x, v)
              for p, v in values.items()}
    sig = target.signature
    positional = [values[p] for p, q in sig.parameters.items() if q.kind is q.POSITIONAL_ONLY]
    keywords = {p: values[p] for p, q in sig.parameters.items() if q.kind is not q.POSITIONAL_ONLY}
    return target(*positional, **keywords)

