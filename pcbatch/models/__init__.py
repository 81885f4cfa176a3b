"""TreeRNN model zoo, each written as plain single-example code and batched by
`@pcbatch.autobatch(in_axes=(None, 0, ...))` (parameters shared).

| module            | model (autobatched)                         | input              | returns          |
|-------------------|---------------------------------------------|--------------------|------------------|
| `child_sum`       | `child_sum_tree_lstm(params, tree, node)`   | `data.Tree`        | (h, c)           |
| `child_sum_loop`  | `child_sum_tree_lstm_loop(params, tree, node)` | `data.Tree`, any arity | (h, c) |
| `nary`            | `nary_tree_lstm(params, tree, node)`        | binary `data.Tree` | (h, c)           |
| `tree_gru`        | `tree_gru(params, tree, node)`              | binary `data.Tree` | h                |
| `mv_rnn`          | `mv_rnn(params, tree, node)`                | binary `data.Tree` | (p [H], P [H,H]) |
| `tree_lstm_2type` | `tree_lstm_2type(params, tree, node)`       | binary `data.Tree` | (h, c)           |
| `lattice_lstm`    | `lattice_lstm(params, lat)` (DAG loop),     | `data.Lattice`     | (h_n, c_n)       |
|                   | `lattice_lstm_at(params, lat, pos)` (recursive) |                    | (h_pos, c_pos)   |
| `bilstm_tagger`   | `bilstm_tagger(params, chain)` (two loops)  | `data.Chain`       | [max_len, tags]  |

Training (gradients through the batched recursion, optax): `tree_classifier`
(a `nary` Tree-LSTM classifier on labelled synthetic trees: `labelled_trees`,
`loss`, `make_step`, `train`; see `examples/train_treelstm.py`).

Each module has `init_params(key, vocab, hidden, ...)` (`lattice_lstm`:
`init_params(key, char_vocab, word_vocab, hidden)`). Tree models are called on
a batch with the roots: `h, c = nary_tree_lstm(params, trees, trees.root)`.
"""
from pcbatch.models import (
    bilstm_tagger,
    child_sum,
    child_sum_loop,
    lattice_lstm,
    mv_rnn,
    nary,
    tree_classifier,
    tree_gru,
    tree_lstm_2type,
)

__all__ = ["bilstm_tagger", "child_sum", "child_sum_loop", "lattice_lstm", "mv_rnn", "nary", "tree_classifier", "tree_gru",
           "tree_lstm_2type"]
