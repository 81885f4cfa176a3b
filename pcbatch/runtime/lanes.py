"""Small array helpers over batches of lanes, shared by the machines and
the gradient pass (one place, so no machine imports another's internals)."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from pcbatch.runtime.dtypes import index_dtype

tree_map = jax.tree_util.tree_map

# `x.at[i].get(**FILL, fill_value=...)`, `x.at[i].set(y, **DROP)`: a lane or row index is
# never negative (one past the end names none), so no index is wrapped (three ops per
# index array fewer: a fork-join pool's program is ~10% smaller).
FILL = {"mode": "fill", "wrap_negative_indices": False}
DROP = {"mode": "drop", "wrap_negative_indices": False}


def zeros_of(t: Any, lead: tuple[int, ...]) -> Any:
    return tree_map(lambda s: jnp.zeros(lead + s.shape, s.dtype), t)


def cast_to(value: Any, t: Any, lanes: int | None) -> Any:
    """Cast to the variable's joined type (and broadcast unbatched values)."""
    def leaf(x, s):
        x = jnp.asarray(x, s.dtype)
        return x if lanes is None else jnp.broadcast_to(x, (lanes,) + s.shape)
    return tree_map(leaf, value, t)


@jax.custom_jvp
def nan_where(bad: jax.Array, x: jax.Array) -> jax.Array:
    """`x` with NaN where `bad` (broadcast against `x`), and so is its tangent:
    `jnp.where(bad, nan, x)` would differentiate to 0 there (a failed example's
    `jax.jvp`, a Hessian through a tape that overflowed), `x * nan` to NaN
    everywhere once transposed (0 * nan)."""
    return jnp.where(bad, jnp.asarray(jnp.nan, x.dtype), x)


@nan_where.defjvp
def _nan_where_jvp(primals: tuple, tangents: tuple) -> tuple:
    bad, x = primals
    _, dx = tangents
    return nan_where(bad, x), jnp.where(bad, jnp.asarray(jnp.nan, x.dtype), dx)


def with_columns(table: jax.Array, values: dict[int, Any]) -> jax.Array:
    """`table` with the columns `values` names (last axis) replaced, broadcast over the rest:
    one fused loop, where a chain of `.at[..., c].set` is a scatter kernel each (a block's
    switch branch in the pool wrote its lane rows with 4-8 of them). Untouched columns go
    over in runs (one slice each): fewer operations to trace, lower and compile."""
    lead, width, last = table.shape[:-1], table.shape[-1], table.ndim - 1
    parts, c = [], 0
    while c < width:
        if c in values:
            v = jnp.asarray(values[c], table.dtype)
            parts.append(lax.broadcast_in_dim(v, lead + (1,), tuple(range(last - v.ndim, last))))
            c += 1
        else:
            end = next((k for k in range(c, width) if k in values), width)
            parts.append(lax.slice_in_dim(table, c, end, axis=last))
            c = end
    return lax.concatenate(parts, last) if len(parts) > 1 else parts[0]


def where(cond: Any, x: Any, y: Any) -> jax.Array:
    """`jnp.where(cond, x, y)` as one `select`: `jnp.where` is a jitted function, a nested
    call in the jaxpr with several operations inside, and the machines make hundreds of
    them (each lowered and inlined again)."""
    dtype, weak = jax.dtypes.result_type(x, y, return_weak_type_flag=True)
    if weak:  # jnp.where's result keeps the weak type (a rare case here)
        return jnp.where(cond, x, y)
    cond = jnp.asarray(cond)
    if cond.dtype != jnp.bool_:
        cond = cond != 0
    shape = jnp.broadcast_shapes(cond.shape, np.shape(x), np.shape(y))
    return lax.select(_shaped(cond, shape), _shaped(_typed(x, dtype), shape), _shaped(_typed(y, dtype), shape))


def _typed(v: Any, dtype: Any) -> Any:
    if not isinstance(v, jax.core.Tracer):
        return np.asarray(v, dtype)  # a constant: converted now, not in the program
    return v if v.dtype == dtype and not v.weak_type else lax.convert_element_type(v, dtype)


def _shaped(v: Any, shape: tuple[int, ...]) -> Any:
    return v if np.shape(v) == shape else jnp.broadcast_to(v, shape)


def as_index(x: Any, lanes: int) -> jax.Array:
    """`x` as `lanes` lane-table integers (index dtype, not weakly typed): branches of one
    switch must return the same types."""
    return _shaped(_typed(x, index_dtype()), (lanes,))


def column(table: jax.Array, c: int) -> jax.Array:
    """Column `c` of `table` (last axis), without numpy-style indexing's tracing cost."""
    return lax.index_in_dim(table, c, axis=table.ndim - 1, keepdims=False)


def select_where(mask: jax.Array, new: Any, old: Any) -> Any:
    def leaf(n, o):
        return where(mask.reshape(mask.shape + (1,) * (o.ndim - 1)), n, o)
    return tree_map(leaf, new, old)


def take(a: jax.Array, *indices: Any, fill: Any = 0) -> jax.Array:
    """`a.at[i0, i1, ...].get(mode="fill", fill_value=fill, wrap_negative_indices=False)`:
    `fill` where any index is out of range (negative too), in fewer operations. JAX's fill
    mode checks each index against both bounds on its own, then reduces the checks with a
    reduction of its own (a computation in the HLO): ~16 operations per gather, and the
    fork-join machines make hundreds of gathers. Here: an unsigned compare per index, one
    gather (XLA clamps its start indices) and one select."""
    if jax.dtypes.issubdtype(a.dtype, jax.dtypes.extended) or not indices:  # typed PRNG keys
        return a.at[indices].get(**FILL, fill_value=fill)
    idx = [jnp.asarray(i) for i in indices]
    shape = jnp.broadcast_shapes(*(i.shape for i in idx))
    k = len(idx)
    inside = None
    for axis, i in enumerate(idx):
        unsigned = jnp.dtype(f"uint{i.dtype.itemsize * 8}")
        ok = lax.lt(lax.convert_element_type(i, unsigned), np.array(a.shape[axis], unsigned))
        inside = ok if inside is None else lax.bitwise_and(_shaped(inside, shape), _shaped(ok, shape))
    common = jnp.result_type(*(i.dtype for i in idx))
    starts = lax.concatenate([lax.broadcast_in_dim(lax.convert_element_type(i, common), shape + (1,),
                                                   tuple(range(len(shape) - i.ndim, len(shape))))
                              for i in idx], len(shape))
    dims = lax.GatherDimensionNumbers(offset_dims=tuple(range(len(shape), len(shape) + a.ndim - k)),
                                      collapsed_slice_dims=tuple(range(k)), start_index_map=tuple(range(k)))
    got = lax.gather(a, starts, dims, (1,) * k + a.shape[k:], mode=lax.GatherScatterMode.CLIP)
    mask = lax.broadcast_in_dim(_shaped(inside, shape), got.shape, tuple(range(len(shape))))
    return lax.select(mask, got, lax.full(got.shape, fill, got.dtype))


def gather_rows(x: Any, ids: jax.Array) -> Any:
    return tree_map(lambda a: take(a, ids), x)


def scatter_rows(x: Any, ids: jax.Array, values: Any) -> Any:
    return tree_map(lambda a, v: a.at[ids].set(v.astype(a.dtype), **DROP), x, values)


def first_true(mask: jax.Array, n: int) -> jax.Array:
    """Indices of the first `n` true entries of `mask`, then `len(mask)`: a
    prefix sum and a binary search per slot (a scatter over the whole mask
    costs far more on CPU)."""
    idx = index_dtype()
    return jnp.searchsorted(jnp.cumsum(mask, dtype=idx), jnp.arange(1, n + 1, dtype=idx), side="left").astype(idx)


def pad_rows(x: jax.Array, n: int, fill: Any = 0) -> jax.Array:
    """`x` with its leading axis padded to `n` rows of `fill`."""
    if x.shape[0] == n:
        return x
    return jnp.concatenate([x, jnp.full((n - x.shape[0],) + x.shape[1:], fill, x.dtype)])
