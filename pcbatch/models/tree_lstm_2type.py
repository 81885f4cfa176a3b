"""TreeLSTM-2Type: a binary Tree-LSTM whose internal nodes come in two types
with separate weights (the dynamic-batching benchmark of Cavs / ED-Batch),
written for ONE tree.

The weight set is chosen per node by `tree.node_type[node] % 2` with a real
`if`, so only the chosen cell runs (random trees from
`pcbatch.data.random_binary_trees(..., n_types=2)` have each type with
probability 1/2; on stdlib ASTs the parity of the AST class id decides).

    trees = pcbatch.data.batch(pcbatch.data.random_binary_trees(8, n_types=2))
    params = init_params(jax.random.PRNGKey(0), vocab=1000, hidden=64)
    h, c = tree_lstm_2type(params, trees, trees.root)
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

import pcbatch
from pcbatch.models._common import MAX_DEPTH, bias, dense, embedding, split

__all__ = ["init_params", "tree_lstm_2type"]


def init_params(key: jax.Array, vocab: int, hidden: int, embed: int | None = None) -> dict:
    """embed [vocab, D]; leaf: W [3H, D], b [3H] (rows i, o, u); type0 / type1:
    U [5H, 2H], b [5H] (rows i, f_L, f_R, o, u; forget biases 1)."""
    embed = hidden if embed is None else embed
    k = split(key, 4)

    def internal(key):
        return {"U": dense(key, 5 * hidden, 2 * hidden), "b": bias(5 * hidden).at[hidden:3 * hidden].set(1.0)}

    return {"embed": embedding(k[0], vocab, embed),
            "leaf": {"W": dense(k[1], 3 * hidden, embed), "b": bias(3 * hidden)},
            "type0": internal(k[2]), "type1": internal(k[3])}


def leaf_cell(p, x):
    """[i, o, u] = W x + b;  c = sigmoid(i) * tanh(u);  h = sigmoid(o) * tanh(c)."""
    i, o, u = jnp.split(p["W"] @ x + p["b"], 3)
    c = jax.nn.sigmoid(i) * jnp.tanh(u)
    return jax.nn.sigmoid(o) * jnp.tanh(c), c


def internal_cell(p, h_l, c_l, h_r, c_r):
    """[i, f_L, f_R, o, u] = U_t [h_L; h_R] + b_t;
    c = sigmoid(i) * tanh(u) + sigmoid(f_L) * c_L + sigmoid(f_R) * c_R;  h = sigmoid(o) * tanh(c)."""
    i, f_l, f_r, o, u = jnp.split(p["U"] @ jnp.concatenate([h_l, h_r]) + p["b"], 5)
    c = jax.nn.sigmoid(i) * jnp.tanh(u) + jax.nn.sigmoid(f_l) * c_l + jax.nn.sigmoid(f_r) * c_r
    return jax.nn.sigmoid(o) * jnp.tanh(c), c


@pcbatch.autobatch(in_axes=(None, 0, 0), max_stack_depth=MAX_DEPTH)
def tree_lstm_2type(params, tree, node):
    """(h, c) at `node`: `leaf_cell` on E[word] at a leaf; otherwise both
    children first, then `internal_cell` with the weights of type
    `node_type[node] % 2` (type0 or type1)."""
    left = tree.children[node, 0]
    if left < 0:
        return leaf_cell(params["leaf"], params["embed"][tree.word[node]])
    h_l, c_l = tree_lstm_2type(params, tree, left)
    h_r, c_r = tree_lstm_2type(params, tree, tree.children[node, 1])
    if tree.node_type[node] % 2 == 0:
        h, c = internal_cell(params["type0"], h_l, c_l, h_r, c_r)
    else:
        h, c = internal_cell(params["type1"], h_l, c_l, h_r, c_r)
    return h, c
