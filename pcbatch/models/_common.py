"""Shared helpers for the models: parameter initialisation and small cells.

The helpers that appear inside a model body are ordinary Python functions, so
pcbatch traces them inline as straight-line JAX code (no control flow in them).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pcbatch import threefry

#: Default recursion limit of the tree models: enough for a left- or
#: right-branching chain of ~120 leaves. Stacks take `max_stack_depth x lanes`
#: slots per saved variable; to trade it off, rebuild a model with
#: `pcbatch.autobatch(model.fn, in_axes=model.in_axes, max_stack_depth=d)`.
MAX_DEPTH = 128


def _threefry_data(key: jax.Array) -> jax.Array | None:
    """The raw `uint32[2]` of a threefry key (`jax.random.PRNGKey` or a typed
    `jax.random.key`), else None (another PRNG: `jax.random` draws)."""
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(key) if str(jax.random.key_impl(key)) == "threefry2x32" else None
    return key if key.shape == (2,) and key.dtype == jnp.uint32 else None


def split(key: jax.Array, num: int = 2) -> jax.Array:
    """`jax.random.split(key, num)`, the same keys; compiled as `pcbatch.threefry`'s
    unrolled hash (a model's first `init_params` compiled JAX's rolled one, ~0.3 s a shape)."""
    raw = _threefry_data(key)
    return jax.random.split(key, num) if raw is None else threefry.split(raw, num)


@functools.partial(jax.jit, static_argnames=("shape", "fan_in"))
def _scaled_normal(key: jax.Array, scale: jax.Array, shape: tuple[int, ...], fan_in: int) -> jax.Array:
    return scale * threefry.normal(key, shape, jnp.float32) / jnp.sqrt(jnp.float32(fan_in))


def normal(key: jax.Array, shape: tuple[int, ...], scale: float = 1.0, fan_in: int = 1) -> jax.Array:
    """N(0, scale^2 / fan_in) float32 entries, `jax.random.normal`'s draws."""
    raw = _threefry_data(key)
    if raw is None:
        return scale * jax.random.normal(key, shape, jnp.float32) / jnp.sqrt(jnp.float32(fan_in))
    return _scaled_normal(raw, jnp.float32(scale), shape=shape, fan_in=fan_in)


def dense(key: jax.Array, n_out: int, n_in: int, scale: float = 1.0) -> jax.Array:
    """A [n_out, n_in] float32 matrix, entries N(0, scale^2 / n_in)."""
    return normal(key, (n_out, n_in), scale, n_in)


def embedding(key: jax.Array, vocab: int, dim: int) -> jax.Array:
    """A [vocab, dim] float32 table, entries N(0, 1 / dim)."""
    return normal(key, (vocab, dim), 1.0, dim)


def bias(n: int) -> jax.Array:
    return jnp.zeros((n,), jnp.float32)


def lstm_cell(p: dict, x: jax.Array, h: jax.Array, c: jax.Array) -> tuple[jax.Array, jax.Array]:
    """A standard LSTM step: [i, f, o, u] = W x + U h + b;
    c' = sig(f) * c + sig(i) * tanh(u); h' = sig(o) * tanh(c')."""
    i, f, o, u = jnp.split(p["W"] @ x + p["U"] @ h + p["b"], 4)
    c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(u)
    return jax.nn.sigmoid(o) * jnp.tanh(c), c


def lstm_params(key: jax.Array, n_in: int, hidden: int) -> dict:
    k1, k2 = split(key)
    b = bias(4 * hidden).at[hidden:2 * hidden].set(1.0)   # forget-gate bias 1
    return {"W": dense(k1, 4 * hidden, n_in), "U": dense(k2, 4 * hidden, hidden), "b": b}


def node_input(params: dict, tree, node) -> jax.Array:
    """x_j of a tree node: params["embed"][word_j] at a leaf, zeros at an
    internal node (word = -1)."""
    word = tree.word[node]
    return jnp.where(word >= 0, params["embed"][jnp.maximum(word, 0)], 0.0)
