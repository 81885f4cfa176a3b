"""Shared helpers for the models: parameter initialisation and small cells.

The helpers that appear inside a model body are ordinary Python functions, so
pcbatch traces them inline as straight-line JAX code (no control flow in them).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

#: Default recursion limit of the tree models: enough for a left- or
#: right-branching chain of ~120 leaves. Stacks take `max_stack_depth x lanes`
#: slots per saved variable; to trade it off, rebuild a model with
#: `pcbatch.autobatch(model.fn, in_axes=model.in_axes, max_stack_depth=d)`.
MAX_DEPTH = 128


def dense(key: jax.Array, n_out: int, n_in: int, scale: float = 1.0) -> jax.Array:
    """A [n_out, n_in] float32 matrix, entries N(0, scale^2 / n_in)."""
    return scale * jax.random.normal(key, (n_out, n_in), jnp.float32) / jnp.sqrt(jnp.float32(n_in))


def embedding(key: jax.Array, vocab: int, dim: int) -> jax.Array:
    """A [vocab, dim] float32 table, entries N(0, 1 / dim)."""
    return jax.random.normal(key, (vocab, dim), jnp.float32) / jnp.sqrt(jnp.float32(dim))


def bias(n: int) -> jax.Array:
    return jnp.zeros((n,), jnp.float32)


def lstm_cell(p: dict, x: jax.Array, h: jax.Array, c: jax.Array) -> tuple[jax.Array, jax.Array]:
    """A standard LSTM step: [i, f, o, u] = W x + U h + b;
    c' = sig(f) * c + sig(i) * tanh(u); h' = sig(o) * tanh(c')."""
    i, f, o, u = jnp.split(p["W"] @ x + p["U"] @ h + p["b"], 4)
    c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(u)
    return jax.nn.sigmoid(o) * jnp.tanh(c), c


def lstm_params(key: jax.Array, n_in: int, hidden: int) -> dict:
    k1, k2 = jax.random.split(key)
    b = bias(4 * hidden).at[hidden:2 * hidden].set(1.0)   # forget-gate bias 1
    return {"W": dense(k1, 4 * hidden, n_in), "U": dense(k2, 4 * hidden, hidden), "b": b}


def node_input(params: dict, tree, node) -> jax.Array:
    """x_j of a tree node: params["embed"][word_j] at a leaf, zeros at an
    internal node (word = -1)."""
    word = tree.word[node]
    return jnp.where(word >= 0, params["embed"][jnp.maximum(word, 0)], 0.0)
