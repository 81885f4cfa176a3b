"""`jax.random.split` / `uniform` / `normal` for raw threefry keys, bit for bit,
with the hash unrolled so that XLA fuses it into one kernel.

XLA's CPU lowering of threefry is a rolled loop (a `while` of 5 iterations):
inside the NUTS machine's loop each `jax.random.split` of 128 keys cost about
20 us, more than a 100-d gradient. Unrolled, the 20 rounds of add/rotate/xor
fuse into one loop and cost well under a microsecond. The results equal
`jax.random`'s (default `threefry2x32` keys, `jax_threefry_partitionable`,
the default since JAX 0.5): keys and uniforms on [0, 1) bit for bit, scaled
uniforms and normals to within one ulp (XLA may fuse the affine map into a
multiply-add on one side only), in any float dtype; `tests/test_threefry.py`
checks it. The samplers (`pcbatch.mcmc`) and the model zoo's parameter draws
(`pcbatch.models`) use it. Outside the loop too: the samplers' momentum noise (`inputs.split_keys`,
128 chains x 1000 transitions x 100-d) compiles in ~0.5 s where `jax.random`'s
took 2.3 s of XLA:CPU's time, and runs in 0.14 s against 0.69 s; a Child-Sum
Tree-LSTM's `init_params`, eager, compiled `jax.random`'s rolled loop once per
weight shape.

Threefry-2x32 with 20 rounds is from Salmon et al., "Parallel random numbers:
as easy as 1, 2, 3" (SC 2011): rotation constants and key schedule below.

    >>> import jax
    >>> from pcbatch import threefry
    >>> key = jax.random.key_data(jax.random.PRNGKey(0))
    >>> bool((threefry.split(key, 3) == jax.random.split(jax.random.PRNGKey(0), 3)).all())
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


_UINT = {8: jnp.uint8, 16: jnp.uint16, 32: jnp.uint32, 64: jnp.uint64}


def _bits(key: jax.Array, shape: tuple[int, ...], width: int = 32) -> jax.Array:
    """`jax.random.bits(key, shape, uint{width})`: the hash's two words xored,
    or side by side for 64 bits (JAX's partitionable threefry)."""
    b0, b1 = _counter_hash(key, int(np.prod(shape, dtype=np.int64)))
    if width == 64:
        bits = (b0.astype(jnp.uint64) << np.uint64(32)) | b1.astype(jnp.uint64)
    else:
        bits = (b0 ^ b1).astype(_UINT[width])
    return bits.reshape(shape)


@functools.partial(jax.jit, static_argnames=("shape", "dtype", "minval", "maxval"))
def uniform(key: jax.Array, shape: tuple[int, ...] = (), dtype=jnp.float32, minval=0.0, maxval=1.0) -> jax.Array:
    """`jax.random.uniform(key, shape, dtype, minval, maxval)`: random mantissa
    bits under the exponent of 1.0, in [1, 2), shifted and scaled."""
    dtype = jax.dtypes.canonicalize_dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"pcbatch.threefry.uniform draws floats, not {dtype}")
    nbits, nmant = jnp.finfo(dtype).bits, jnp.finfo(dtype).nmant
    width = 8 if nmant < 8 else nbits  # as JAX: a byte of bits where the mantissa is shorter
    uint = _UINT[nbits]
    bits = _bits(key, shape, width).astype(uint)
    one = np.array(1.0, dtype)
    floats = lax.bitcast_convert_type((bits >> uint(width - nmant)) | one.view(uint), dtype) - one
    minval, maxval = np.array(minval, dtype), np.array(maxval, dtype)
    return lax.max(minval, floats * (maxval - minval) + minval)


def normal(key: jax.Array, shape: tuple[int, ...] = (), dtype=jnp.float32) -> jax.Array:
    """`jax.random.normal(key, shape, dtype)`: sqrt(2) erfinv(u), u in (-1, 1)."""
    dtype = jax.dtypes.canonicalize_dtype(dtype)
    lo = np.nextafter(np.array(-1.0, dtype), np.array(0.0, dtype), dtype=dtype)
    return np.array(np.sqrt(2.0), dtype) * lax.erf_inv(uniform(key, shape, dtype, float(lo), 1.0))
