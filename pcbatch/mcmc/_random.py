"""`jax.random.split` / `uniform` / `normal` for raw threefry keys, bit for bit,
with the hash unrolled so that XLA fuses it into one kernel.

XLA's CPU lowering of threefry is a rolled loop (a `while` of 5 iterations):
inside the NUTS machine's loop each `jax.random.split` of 128 keys cost about
20 us, more than a 100-d gradient. Unrolled, the 20 rounds of add/rotate/xor
fuse into one loop and cost well under a microsecond. The results equal
`jax.random`'s (default `threefry2x32` keys, `jax_threefry_partitionable`,
the default since JAX 0.5): keys and uniforms on [0, 1) bit for bit, scaled
uniforms and normals to within one ulp (XLA may fuse the affine map into a
multiply-add on one side only); `tests/mcmc/test_random.py` checks it.

Threefry-2x32 with 20 rounds is from Salmon et al., "Parallel random numbers:
as easy as 1, 2, 3" (SC 2011): rotation constants and key schedule below.

    >>> import jax
    >>> from pcbatch.mcmc import _random
    >>> key = jax.random.key_data(jax.random.PRNGKey(0))
    >>> bool((_random.split(key, 3) == jax.random.split(jax.random.PRNGKey(0), 3)).all())
    True
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["threefry2x32", "split", "uniform", "normal"]

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)


def _rotl(x: jax.Array, r: int) -> jax.Array:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


@jax.jit  # one dispatch where eager code (the samplers' Python references) would run ~100 ops
def threefry2x32(k0: jax.Array, k1: jax.Array, x0: jax.Array, x1: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Threefry-2x32 (20 rounds) of the counter words `(x0, x1)` under key `(k0, k1)`."""
    ks = (k0, k1, k0 ^ k1 ^ _PARITY)
    x0, x1 = x0 + ks[0], x1 + ks[1]
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x0 = x0 + x1
            x1 = _rotl(x1, r) ^ x0
        x0 = x0 + ks[(i + 1) % 3]
        x1 = x1 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x0, x1


def _counter_hash(key: jax.Array, n: int) -> tuple[jax.Array, jax.Array]:
    """The hash of counters 0..n-1 (high word 0): `jax.random`'s iota_2x32."""
    return threefry2x32(key[0], key[1], jnp.zeros((n,), jnp.uint32), jnp.arange(n, dtype=jnp.uint32))


# Jitted (bit-exact integer and exponent-bit arithmetic: the same bits either way) so that an
# eager call, in the samplers' per-chain Python reference, is one dispatch, not ~10 eager ops
# and their gathers; traced inside a machine, XLA inlines them.
@functools.partial(jax.jit, static_argnums=1)
def split(key: jax.Array, num: int = 2) -> jax.Array:
    """`jax.random.split(key, num)` for a raw `uint32[2]` key."""
    b0, b1 = _counter_hash(key, num)
    return jnp.stack([b0, b1], axis=-1)


def _bits(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    b0, b1 = _counter_hash(key, int(np.prod(shape, dtype=np.int64)))
    return (b0 ^ b1).reshape(shape)


@functools.partial(jax.jit, static_argnames=("shape", "dtype", "minval", "maxval"))
def uniform(key: jax.Array, shape: tuple[int, ...] = (), dtype=jnp.float32, minval=0.0, maxval=1.0) -> jax.Array:
    """`jax.random.uniform(key, shape, dtype, minval, maxval)` (float32)."""
    if jnp.dtype(dtype) != jnp.float32:
        raise ValueError("pcbatch.mcmc._random.uniform supports float32 only")
    mantissa = (_bits(key, shape) >> np.uint32(32 - 23)) | np.uint32(0x3F800000)  # [1, 2)
    floats = lax.bitcast_convert_type(mantissa, jnp.float32) - np.float32(1.0)
    minval, maxval = np.float32(minval), np.float32(maxval)
    return lax.max(minval, floats * (maxval - minval) + minval)


def normal(key: jax.Array, shape: tuple[int, ...] = (), dtype=jnp.float32) -> jax.Array:
    """`jax.random.normal(key, shape, dtype)` (float32): sqrt(2) erfinv(u), u in (-1, 1)."""
    lo = np.nextafter(np.float32(-1.0), np.float32(1.0))
    return np.float32(np.sqrt(2.0)) * lax.erf_inv(uniform(key, shape, dtype, lo, 1.0))
