"""The machine's own integer type, derived from JAX's x64 setting.

Program values keep the types the program gives them (`StackProgram.var_types`).
The machine's bookkeeping — pcs, lane ids, stack pointers, counters, the pc
stack, the lane table, tape cursors — uses `index_dtype()`: JAX's default
integer, int32, or int64 under `jax_enable_x64`. It must be the type JAX's own
index arithmetic yields (`jnp.sum` of a mask, `jnp.arange`, integer literals),
or a loop carry would change type between iterations. Call it while building a
machine (never at import): the setting may change between calls, e.g. inside
`jax.enable_x64(True)`.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pcbatch.ir.keys import is_key

__all__ = ["index_dtype", "index_array", "index_zeros", "index_full", "nbytes"]


def index_dtype() -> np.dtype:
    """int32, or int64 when `jax_enable_x64` is on."""
    return np.dtype(jax.dtypes.canonicalize_dtype(np.int64))


def index_array(x: Any) -> jax.Array:
    return jnp.asarray(x, index_dtype())


def index_zeros(shape: tuple[int, ...] | int) -> jax.Array:
    return jnp.zeros(shape, index_dtype())


def index_full(shape: tuple[int, ...] | int, value: Any) -> jax.Array:
    return jnp.full(shape, value, index_dtype())


def nbytes(t: Any) -> int:
    """Bytes of a pytree of arrays or shape-dtype structs (a program type: one lane's value)."""
    # A typed PRNG key's dtype is no NumPy dtype, but has an itemsize (its key data's bytes).
    return sum(int(np.prod(x.shape)) * (x.dtype.itemsize if is_key(x.dtype) else np.dtype(x.dtype).itemsize)
               for x in jax.tree_util.tree_leaves(t))
