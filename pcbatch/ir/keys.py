"""Typed PRNG keys (`jax.random.key`): arrays of an extended dtype (`key<fry>`).

They support what the machine does to a value (zeros, `jnp.where`, scatter,
gather, `lax.while_loop` carries), so the machine stores them as they are. But
NumPy knows no key dtype (`np.dtype`, `np.zeros`, `np.result_type` raise) and
`jnp.result_type` promotes none: a key's type joins only with itself."""
from __future__ import annotations

from typing import Any

import jax

from pcbatch.errors import Loc, UnsupportedSyntaxError

KEY_JOIN_HINT = ("a typed PRNG key (jax.random.key) joins only with a key of the same implementation: "
                 "keep keys and other values in separate variables.")

# Implementations whose random bits under `jax.vmap` differ from one key at a time (JAX batches
# `rng_bit_generator` untruly, google/jax#20094): the machine batches every op, so its results
# could never equal the per-example Python.
_BATCH_VARIANT = ("rbg", "unsafe_rbg")


def is_key(dtype: Any) -> bool:
    """Whether `dtype` is a typed PRNG key's (`key<fry>`, `key<rbg>`)."""
    return jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def key_impl(dtype: Any) -> Any:
    """The PRNG implementation of a key dtype (`jax.random.wrap_key_data`'s `impl`)."""
    return dtype._impl  # JAX has no public accessor on the dtype, only on an array (`jax.random.key_impl`)


def check_batchable(var: str, t: Any, loc: Loc | None) -> None:
    """Raise where a leaf of `var`'s type `t` is a key whose implementation
    draws other numbers once batched (`_BATCH_VARIANT`)."""
    for s in jax.tree_util.tree_leaves(t):
        name = key_impl(s.dtype).name if is_key(s.dtype) else None
        if name in _BATCH_VARIANT:
            raise UnsupportedSyntaxError(
                f"`{var.rpartition('.')[2]}` is a PRNG key of the `{name}` implementation ({s.dtype}): JAX draws "
                f"other random numbers from {name} keys batched than one at a time (its rng_bit_generator has no "
                "true batching rule), so the batched results could not equal the function's, example by example",
                loc or Loc("<unknown>", 0), "use threefry2x32 keys (the default: jax.random.key(seed)).")
