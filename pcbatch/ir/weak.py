"""Weak types: a Python number's type, kept where the machine stores values.

JAX types a Python number weakly: `x + 100` with `x` int8 is int8, `h * 2.0`
with `h` float16 is float16. The type inference keeps that (`lower/types.py`),
but the machine's buffers hold only a dtype, so a variable typed as a Python
number (`k = 100`, a `range` loop counter) is marked weak again where the
user's code reads it (`as_typed`)."""
from __future__ import annotations

from typing import Any

import jax
import numpy as np

try:  # JAX has no public way to mark an array weakly typed; without it, values stay strongly typed
    from jax._src.lax.lax import _convert_element_type as _convert
except ImportError:  # pragma: no cover
    _convert = None


def is_weak(t: Any) -> bool:
    """Whether any leaf of the type `t` is weakly typed."""
    return any(getattr(s, "weak_type", False) for s in jax.tree_util.tree_leaves(t))


def weakly_typed(x: jax.Array) -> jax.Array:
    """`x`, weakly typed (as `jnp.asarray(1)` is)."""
    if _convert is None or getattr(x, "weak_type", False):
        return x
    return _convert(x, np.dtype(x.dtype), weak_type=True)


def as_typed(value: Any, t: Any) -> Any:
    """`value` with the weak types of the type `t`."""
    def leaf(x: Any, s: Any) -> Any:
        return weakly_typed(x) if getattr(s, "weak_type", False) and isinstance(x, jax.Array) else x
    return jax.tree_util.tree_map(leaf, value, t)
