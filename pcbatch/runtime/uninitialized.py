"""An array whose contents are never read before they are written.

`lax.empty` allocates without filling on GPU and TPU, but JAX batches it
under `vmap` even when nothing it depends on is batched (it has no inputs):
a recorded forward called under `jax.jacfwd` would then batch the whole tape
and machine state, and return primal outputs that look batched. This
primitive lowers to `lax.empty`'s allocation and is left alone by `vmap`, as
any primitive without batched inputs is.
"""
from __future__ import annotations

import jax
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import mlir

from pcbatch.ir.keys import is_key, key_impl

__all__ = ["uninitialized"]

_uninitialized_p = Primitive("pcbatch_uninitialized")


def uninitialized(shape: tuple[int, ...], dtype) -> jax.Array:
    """An array of `shape` and `dtype` to be overwritten before it is read."""
    if is_key(dtype):  # a typed PRNG key (no NumPy dtype): uninitialized key data, wrapped
        impl = key_impl(dtype)
        return jax.random.wrap_key_data(uninitialized(tuple(shape) + impl.key_shape, np.uint32), impl=impl)
    return _uninitialized_p.bind(shape=tuple(int(d) for d in shape), dtype=np.dtype(dtype))


def _impl(*, shape, dtype):
    return lax.empty(shape, dtype)


_uninitialized_p.def_impl(_impl)
_uninitialized_p.def_abstract_eval(lambda *, shape, dtype: jax.core.ShapedArray(shape, dtype))
mlir.register_lowering(_uninitialized_p, mlir.lower_fun(_impl, multiple_results=False))
