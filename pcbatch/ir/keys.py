"""Typed PRNG keys (`jax.random.key`): arrays of an extended dtype (`key<fry>`).

They support what the machine does to a value (zeros, `jnp.where`, scatter,
gather, `lax.while_loop` carries), so the machine stores them as they are. But
NumPy knows no key dtype (`np.dtype`, `np.zeros`, `np.result_type` raise) and
`jnp.result_type` promotes none: a key's type joins only with itself."""
from __future__ import annotations

from typing import Any

import jax

from pcbatch.errors import Loc, UnsupportedSyntaxError
from pcbatch.ir.jaxtypes import all_eqns

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


def check_batchable_ops(jaxpr: Any, text: str, loc: Loc | None) -> None:
    """Raise where `text`'s jaxpr (any depth) makes or uses a key of a `_BATCH_VARIANT`
    implementation, or calls `lax.rng_bit_generator`: a key made and used within one
    line (`jax.random.key(n, impl="rbg")`, or `jax.random.PRNGKey(n)` under
    `jax_default_prng_impl="rbg"`) has no variable for `check_batchable` to see."""
    for eqn in all_eqns(jaxpr):
        if eqn.primitive.name == "rng_bit_generator":
            name = "rng_bit_generator"
        else:
            names = [key_impl(v.aval.dtype).name for v in (*eqn.invars, *eqn.outvars)
                     if hasattr(v.aval, "dtype") and is_key(v.aval.dtype)]
            name = next((n for n in names if n in _BATCH_VARIANT), None)
        if name is not None:
            raise UnsupportedSyntaxError(
                f"`{text}` draws random numbers with {_what(name)}: {_WHY}", loc or Loc("<unknown>", 0), _HINT)


def _what(name: str) -> str:
    return "lax.rng_bit_generator" if name == "rng_bit_generator" else f"a PRNG key of the `{name}` implementation"


_WHY = ("JAX draws other random numbers from it batched than one example at a time (its rng_bit_generator has "
        "no true batching rule, google/jax#20094), so the batched results could not equal the function's, "
        "example by example")
_HINT = ("use threefry2x32 keys (the default: jax.random.key(seed); with jax_default_prng_impl='rbg' set, "
         "jax.random.key(seed, impl='threefry2x32')).")


def check_batchable(var: str, t: Any, loc: Loc | None) -> None:
    """Raise where a leaf of `var`'s type `t` is a key whose implementation
    draws other numbers once batched (`_BATCH_VARIANT`)."""
    for s in jax.tree_util.tree_leaves(t):
        name = key_impl(s.dtype).name if is_key(s.dtype) else None
        if name in _BATCH_VARIANT:
            raise UnsupportedSyntaxError(f"`{var.rpartition('.')[2]}` is {_what(name)} ({s.dtype}): {_WHY}",
                                         loc or Loc("<unknown>", 0), _HINT)
