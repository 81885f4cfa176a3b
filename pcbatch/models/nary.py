"""N-ary Tree-LSTM with N = 2 (Tai, Socher & Manning 2015), written for ONE tree.

Trees are binary `pcbatch.data.Tree` arrays (`children[node] = (left,
right)`, -1 = none; `word[node]` at leaves). The model is a recursive function
of `(params, tree, node)` returning the node's `(h, c)`::

    trees = pcbatch.data.batch(pcbatch.data.random_binary_trees(8))
    params = init_params(jax.random.PRNGKey(0), vocab=1000, hidden=64)
    h, c = nary_tree_lstm(params, trees, trees.root)          # h: [8, 64]

The input x_j is E[word_j] at a leaf and 0 at an internal node.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

import pcbatch
from pcbatch.models._common import MAX_DEPTH, bias, dense, embedding, node_input, split

__all__ = ["binary_lstm_cell", "init_params", "nary_tree_lstm"]


def init_params(key: jax.Array, vocab: int, hidden: int, embed: int | None = None) -> dict:
    """Parameters of `nary_tree_lstm` (N = 2): embed [vocab, D]; W [5H, D],
    U [5H, 2H] (rows: i, f_L, f_R, o, u; columns: left, right child), b [5H]
    (forget biases 1)."""
    embed = hidden if embed is None else embed
    k = split(key, 3)
    b = bias(5 * hidden).at[hidden:3 * hidden].set(1.0)
    return {"embed": embedding(k[0], vocab, embed), "W": dense(k[1], 5 * hidden, embed),
            "U": dense(k[2], 5 * hidden, 2 * hidden), "b": b}


def binary_lstm_cell(W, U, b, x, h_l, c_l, h_r, c_r):
    """The N-ary (N = 2) Tree-LSTM cell. With h = [h_L; h_R]:

        i   = sigmoid(W_i x + U_i h + b_i)
        f_L = sigmoid(W_fL x + U_fL h + b_fL)      f_R = sigmoid(W_fR x + U_fR h + b_fR)
        o   = sigmoid(W_o x + U_o h + b_o)         u   = tanh(W_u x + U_u h + b_u)
        c   = i * u + f_L * c_L + f_R * c_R        h'  = o * tanh(c)
    """
    z = W @ x + U @ jnp.concatenate([h_l, h_r]) + b
    i, f_l, f_r, o, u = jnp.split(z, 5)
    c = (jax.nn.sigmoid(i) * jnp.tanh(u) + jax.nn.sigmoid(f_l) * c_l + jax.nn.sigmoid(f_r) * c_r)
    return jax.nn.sigmoid(o) * jnp.tanh(c), c


@pcbatch.autobatch(in_axes=(None, 0, 0), max_stack_depth=MAX_DEPTH)
def nary_tree_lstm(params, tree, node):
    """Binary (N-ary, N = 2) Tree-LSTM at `node` (see `binary_lstm_cell`):
    separate U weights for the left and the right child, and a forget gate per
    child that sees both. A leaf has h_L = h_R = c_L = c_R = 0 and x = E[word].

    Returns (h, c), each [H].
    """
    left = tree.children[node, 0]
    right = tree.children[node, 1]
    if left < 0:
        zero = jnp.zeros(params["U"].shape[1] // 2)
        h_l, c_l, h_r, c_r = zero, zero, zero, zero
    else:
        h_l, c_l = nary_tree_lstm(params, tree, left)
        h_r, c_r = nary_tree_lstm(params, tree, right)
    x = node_input(params, tree, node)      # after the calls: not saved across them
    return binary_lstm_cell(params["W"], params["U"], params["b"], x, h_l, c_l, h_r, c_r)
