"""Child-sum Tree-LSTM (Tai, Socher & Manning 2015) as one would write it for ONE tree of
any arity: a loop over the node's children that recurses into each.

Same cell and same parameters as `child_sum` (`init_params` is `child_sum.init_params`),
but where `child_sum` unrolls a loop over every column of `tree.children` (one call site
per column, so a tree of up to 16 children per node compiles 16 calls), this model loops
only over the children the node has (a data-dependent trip count) around one call site::

    trees = pcbatch.data.batch(pcbatch.data.load_ast_trees("train", max_nodes=64).trees[:32])
    params = init_params(jax.random.PRNGKey(0), vocab=len(pcbatch.data.AST_VOCAB), hidden=32)
    h, c = child_sum_tree_lstm_loop(params, trees, trees.root)     # h: [32, 32]

Children are the left-packed columns of `tree.children` (-1 after the last), the format
of `pcbatch.data.load_ast_trees` and of binary `data.Tree`s alike. The input x_j is the
embedding of `word[j]` where it is >= 0 (every node of an AST tree), else 0.

Fork-join: pcbatch does not yet fork calls made inside a loop with a data-dependent trip
count, so the children run one after another in their parent's lane whatever `fork` says;
the model is built with `fork=False` (one lane per example, no lane pool to allocate).
Its stack depth is the tree's height (`MAX_DEPTH` = 128 by default).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

import pcbatch
from pcbatch.models._common import MAX_DEPTH, node_input
from pcbatch.models.child_sum import init_params

__all__ = ["child_sum_tree_lstm_loop", "init_params"]


@pcbatch.autobatch(in_axes=(None, 0, 0), max_stack_depth=MAX_DEPTH, fork=False)
def child_sum_tree_lstm_loop(params, tree, node):
    """Child-sum Tree-LSTM cell at `node` (equations in `child_sum.child_sum_tree_lstm`),
    summing over the node's children one loop trip each. Returns (h_j, c_j), each [H]."""
    x = node_input(params, tree, node)
    wf_x = params["W_f"] @ x + params["b_f"]
    h_sum = jnp.zeros(params["U_f"].shape[0])
    fc_sum = jnp.zeros(params["U_f"].shape[0])
    for k in range(jnp.sum(tree.children[node] >= 0)):
        h_k, c_k = child_sum_tree_lstm_loop(params, tree, tree.children[node, k])
        h_sum = h_sum + h_k
        fc_sum = fc_sum + jax.nn.sigmoid(wf_x + params["U_f"] @ h_k) * c_k
    i, o, u = jnp.split(params["W_iou"] @ x + params["U_iou"] @ h_sum + params["b_iou"], 3)
    c = jax.nn.sigmoid(i) * jnp.tanh(u) + fc_sum
    h = jax.nn.sigmoid(o) * jnp.tanh(c)
    return h, c
