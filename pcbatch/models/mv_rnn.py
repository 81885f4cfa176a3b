"""Matrix-Vector RNN (Socher, Huval, Manning & Ng 2012), written for ONE tree.

Every node carries a vector a [H] and a matrix A [H, H]; each word has both
(`embed` [vocab, H] and `word_matrix` [vocab, H, H], initialised near the
identity, so memory grows as vocab * H^2).

    trees = pcbatch.data.batch(pcbatch.data.random_binary_trees(8))
    params = init_params(jax.random.PRNGKey(0), vocab=1000, hidden=16)
    p, P = mv_rnn(params, trees, trees.root)                 # [8, 16], [8, 16, 16]
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

import pcbatch
from pcbatch.models._common import MAX_DEPTH, bias, dense, embedding, normal, split

__all__ = ["compose", "init_params", "mv_rnn"]


def init_params(key: jax.Array, vocab: int, hidden: int) -> dict:
    """embed [vocab, H]; word_matrix [vocab, H, H] = I + N(0, 0.01^2);
    W [H, 2H], b [H]; W_M [H, 2H]."""
    k = split(key, 4)
    eye = jnp.eye(hidden, dtype=jnp.float32)
    return {"embed": embedding(k[0], vocab, hidden),
            "word_matrix": eye + normal(k[1], (vocab, hidden, hidden), 0.01),
            "W": dense(k[2], hidden, 2 * hidden), "b": bias(hidden),
            "W_M": dense(k[3], hidden, 2 * hidden)}


def compose(params, a, A, b, B):
    """The MV-RNN composition of a left child (a, A) and a right child (b, B):

        p = tanh(W [B a; A b] + bias)         P = W_M [A; B]
    """
    p = jnp.tanh(params["W"] @ jnp.concatenate([B @ a, A @ b]) + params["b"])
    P = params["W_M"] @ jnp.concatenate([A, B], axis=0)
    return p, P


@pcbatch.autobatch(in_axes=(None, 0, 0), max_stack_depth=MAX_DEPTH)
def mv_rnn(params, tree, node):
    """(vector [H], matrix [H, H]) at `node`: (E[w], M[w]) at a leaf,
    `compose` of the two children otherwise."""
    left = tree.children[node, 0]
    if left < 0:
        word = tree.word[node]
        return params["embed"][word], params["word_matrix"][word]
    a, A = mv_rnn(params, tree, left)
    b, B = mv_rnn(params, tree, tree.children[node, 1])
    return compose(params, a, A, b, B)
