"""Float leaves of pytrees: only they carry cotangents."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


tree_util = jax.tree_util
tree_map = tree_util.tree_map


def is_inexact(x: Any) -> bool:
    return jnp.issubdtype(x.dtype, jnp.inexact)


def is_float(t: Any) -> bool:
    """Whether a value (or type) has a float leaf: only those carry cotangents."""
    return any(is_inexact(x) for x in tree_util.tree_leaves(t))


def floats(x: Any) -> list:
    """The float leaves of a pytree, in `tree_leaves` order."""
    return [a for a in tree_util.tree_leaves(x) if is_inexact(a)]


def with_floats(x: Any, new: list) -> Any:
    """`x` with its float leaves replaced by `new` (the other leaves kept)."""
    leaves, treedef = tree_util.tree_flatten(x)
    it = iter(new)
    return treedef.unflatten([next(it) if is_inexact(a) else a for a in leaves])


def zeros_of(t: Any, lead: tuple[int, ...]) -> list:
    """Zero cotangents (float leaves only) of type `t`, with leading axes."""
    return [jnp.zeros(lead + s.shape, s.dtype) for s in floats(t)]


def convert_ct(ct: list, src: Any, dst: Any) -> list:
    """A cotangent of a value of type `src` as one of type `dst` (a cast of
    the same tree: float leaves change dtype, none flows to integer leaves)."""
    it = iter(ct)
    full = [next(it) if is_inexact(s) else None for s in tree_util.tree_leaves(src)]
    return [c.astype(d.dtype) if c is not None else None
            for c, d in zip(full, tree_util.tree_leaves(dst)) if is_inexact(d)]


def add_ct(a: list, b: list) -> list:
    return [x + y.astype(x.dtype) if y is not None else x for x, y in zip(a, b)]


def row_mask(mask: jax.Array, x: jax.Array) -> jax.Array:
    return mask.reshape(mask.shape + (1,) * (x.ndim - 1))
