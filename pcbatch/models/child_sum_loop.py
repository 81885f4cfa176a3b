"""The Child-Sum Tree-LSTM as one would write it for ONE tree of any arity: a loop over
the node's children that recurses into each. That is now `models.child_sum` itself (the
loop's calls fork, a loop fork); this module keeps the name it had while `child_sum`
unrolled its loop::

    trees = pcbatch.data.batch(pcbatch.data.load_ast_trees("train", max_nodes=64).trees[:32])
    params = init_params(jax.random.PRNGKey(0), vocab=len(pcbatch.data.AST_VOCAB), hidden=32)
    h, c = child_sum_tree_lstm_loop(params, trees, trees.root)     # h: [32, 32]
"""
from __future__ import annotations

from pcbatch.models.child_sum import child_sum_tree_lstm, init_params

__all__ = ["child_sum_tree_lstm_loop", "init_params"]

child_sum_tree_lstm_loop = child_sum_tree_lstm
