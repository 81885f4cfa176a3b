"""Model weights for tests: the pytree of shapes and dtypes a model's `init_params` makes,
drawn by NumPy. A model's own init draws with `jax.random`, which compiles a threefry program
per weight shape (~0.3-1 s of CPU each); a differential check needs weights of the right
shapes, not those values."""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np


def numpy_weights(init: Callable, *args: Any, seed: int = 0, zero_biases: bool = False, **kwargs: Any) -> Any:
    """`init(key, *args, **kwargs)`'s structure, each leaf N(0, 1/fan_in) (fan_in: its last
    axis); with `zero_biases`, the 1-d leaves 0."""
    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(lambda key: init(key, *args, **kwargs), jax.ShapeDtypeStruct((2,), jnp.uint32))

    def draw(s: jax.ShapeDtypeStruct) -> jax.Array:
        if zero_biases and len(s.shape) == 1:
            return jnp.zeros(s.shape, s.dtype)
        return jnp.asarray(rng.standard_normal(s.shape) / np.sqrt(s.shape[-1]), s.dtype)

    return jax.tree_util.tree_map(draw, shapes)
