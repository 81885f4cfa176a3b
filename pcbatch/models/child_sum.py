"""Child-sum Tree-LSTM (Tai, Socher & Manning 2015), written for ONE tree.

Trees are `pcbatch.data.Tree` arrays (`children[node, k]` = k-th child, -1 =
none; `word[node]` at leaves); any number of children per node (the columns of
`children`). The model is a recursive function of `(params, tree, node)` that
returns the node's `(h, c)`; call it on a batch with the roots::

    trees = pcbatch.data.batch(pcbatch.data.random_binary_trees(8))
    params = init_params(jax.random.PRNGKey(0), vocab=1000, hidden=64)
    h, c = child_sum_tree_lstm(params, trees, trees.root)     # h: [8, 64]

The input x_j is the word embedding E[word_j] at a leaf and 0 at an internal
node (the constituency-tree setting of Tai et al.).

The code loops over the node's children and recurses into each, as one would
write it for one tree: the loop's calls do not depend on each other, so with
fork-join pcbatch launches them at once, each child in a lane of its own (a
loop fork; `child_sum_tree_lstm.ir()` notes it), whatever the arity.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

import pcbatch
from pcbatch.models._common import MAX_DEPTH, bias, dense, embedding, node_input, split

__all__ = ["child_sum_tree_lstm", "init_params"]


def init_params(key: jax.Array, vocab: int, hidden: int, embed: int | None = None) -> dict:
    """Parameters of `child_sum_tree_lstm`: embed [vocab, D]; W_iou [3H, D],
    U_iou [3H, H], b_iou [3H]; W_f [H, D], U_f [H, H], b_f [H] (forget bias 1)."""
    embed = hidden if embed is None else embed
    k = split(key, 5)
    return {"embed": embedding(k[0], vocab, embed),
            "W_iou": dense(k[1], 3 * hidden, embed), "U_iou": dense(k[2], 3 * hidden, hidden),
            "b_iou": bias(3 * hidden),
            "W_f": dense(k[3], hidden, embed), "U_f": dense(k[4], hidden, hidden),
            "b_f": bias(hidden) + 1.0}


@pcbatch.autobatch(in_axes=(None, 0, 0), max_stack_depth=MAX_DEPTH)
def child_sum_tree_lstm(params, tree, node):
    """Child-sum Tree-LSTM cell at `node`, over any number of children
    (the columns of `tree.children`; -1 = no child). With C(j) the children of j:

        h~_j  = sum_{k in C(j)} h_k
        i_j   = sigmoid(W_i x_j + U_i h~_j + b_i)
        f_jk  = sigmoid(W_f x_j + U_f h_k + b_f)          (one forget gate per child)
        o_j   = sigmoid(W_o x_j + U_o h~_j + b_o)
        u_j   = tanh(W_u x_j + U_u h~_j + b_u)
        c_j   = i_j * u_j + sum_{k in C(j)} f_jk * c_k
        h_j   = o_j * tanh(c_j)

    Returns (h_j, c_j), each [H].
    """
    x = node_input(params, tree, node)
    wf_x = params["W_f"] @ x + params["b_f"]
    h_sum = jnp.zeros(params["U_f"].shape[0])
    fc_sum = jnp.zeros(params["U_f"].shape[0])
    for k in range(jnp.sum(tree.children[node] >= 0)):   # the children are packed left
        h_k, c_k = child_sum_tree_lstm(params, tree, tree.children[node, k])
        h_sum = h_sum + h_k
        fc_sum = fc_sum + jax.nn.sigmoid(wf_x + params["U_f"] @ h_k) * c_k
    i, o, u = jnp.split(params["W_iou"] @ x + params["U_iou"] @ h_sum + params["b_iou"], 3)
    c = jax.nn.sigmoid(i) * jnp.tanh(u) + fc_sum
    h = jax.nn.sigmoid(o) * jnp.tanh(c)
    return h, c
