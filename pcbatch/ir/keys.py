"""Typed PRNG keys (`jax.random.key`): arrays of an extended dtype (`key<fry>`).

They support what the machine does to a value (zeros, `jnp.where`, scatter,
gather, `lax.while_loop` carries), so the machine stores them as they are. But
NumPy knows no key dtype (`np.dtype`, `np.zeros`, `np.result_type` raise) and
`jnp.result_type` promotes none: a key's type joins only with itself."""
from __future__ import annotations

from typing import Any

import jax


def is_key(dtype: Any) -> bool:
    """Whether `dtype` is a typed PRNG key's (`key<fry>`, `key<rbg>`)."""
    return jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)
