"""Small array helpers over batches of lanes, shared by the machines and
the gradient pass (one place, so no machine imports another's internals)."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from pcbatch.runtime.dtypes import index_dtype

tree_map = jax.tree_util.tree_map


def zeros_of(t: Any, lead: tuple[int, ...]) -> Any:
    return tree_map(lambda s: jnp.zeros(lead + s.shape, s.dtype), t)


def cast_to(value: Any, t: Any, lanes: int | None) -> Any:
    """Cast to the variable's joined type (and broadcast unbatched values)."""
    def leaf(x, s):
        x = jnp.asarray(x, s.dtype)
        return x if lanes is None else jnp.broadcast_to(x, (lanes,) + s.shape)
    return tree_map(leaf, value, t)


def with_columns(table: jax.Array, values: dict[int, Any]) -> jax.Array:
    """`table` with the columns `values` names (last axis) replaced, broadcast over the rest:
    one fused loop, where a chain of `.at[..., c].set` is a scatter kernel each (a block's
    switch branch in the pool wrote its lane rows with 4-8 of them)."""
    lead = table.shape[:-1]
    return jnp.stack([jnp.broadcast_to(jnp.asarray(values[c], table.dtype), lead) if c in values else table[..., c]
                      for c in range(table.shape[-1])], axis=-1)


def select_where(mask: jax.Array, new: Any, old: Any) -> Any:
    def leaf(n, o):
        return jnp.where(mask.reshape(mask.shape + (1,) * (o.ndim - 1)), n, o)
    return tree_map(leaf, new, old)


def gather_rows(x: Any, ids: jax.Array) -> Any:
    return tree_map(lambda a: a.at[ids].get(mode="fill", fill_value=0), x)


def scatter_rows(x: Any, ids: jax.Array, values: Any) -> Any:
    return tree_map(lambda a, v: a.at[ids].set(v.astype(a.dtype), mode="drop"), x, values)


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
