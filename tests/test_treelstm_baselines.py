"""Differential tests of the plain-JAX Tree-LSTM baselines of
`benchmarks/treelstm.py` (`benchmarks/treelstm_baselines.py`) against
`nary_tree_lstm.reference` (the original Python run one tree at a time).

Small sizes (hidden 8/16, trees of <= 16 leaves, one padded size per test) keep
the file at a few seconds on two cores.
"""
from __future__ import annotations

import os
import sys

import jax
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root: `benchmarks`

from benchmarks import treelstm_baselines as tb  # noqa: E402
from pcbatch import data  # noqa: E402
from pcbatch.models import nary  # noqa: E402

VOCAB = 40
MAX_LEAVES = 16
MAX_NODES = 2 * MAX_LEAVES - 1
RTOL, ATOL = 1e-5, 1e-6


def _trees(count: int, seed: int, shape) -> data.Tree:
    return data.batch(data.random_binary_trees(count, seed=seed, min_leaves=1, max_leaves=MAX_LEAVES,
                                               max_nodes=MAX_NODES, shape=shape, vocab=VOCAB))


def _assert_close(got, want):
    assert len(got) == len(want) == 2
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=RTOL, atol=ATOL)


# Each cell compiles a depth-batched program and runs the reference on its trees: make test
# runs one tree, and 17 of every shape at hidden 16 (hidden 8: the lone tree and the chains below);
# the matrix adds 5 trees.
@pytest.mark.parametrize("batch, hidden, shape", [
    (1, 8, "random"),
    pytest.param(5, 16, ["left", "right", "balanced", "frontier", "random"], marks=pytest.mark.matrix),
    (17, 16, ["random", "frontier", "balanced", "left", "right"]),
])
def test_baselines_match_reference(batch, hidden, shape):
    params = nary.init_params(jax.random.PRNGKey(batch), VOCAB, hidden)
    trees = _trees(batch, seed=batch, shape=shape)
    ref = nary.nary_tree_lstm.reference(params, trees, trees.root)
    _assert_close(tb.per_example_jit(params, trees), ref)
    _assert_close(tb.depth_batched(params, trees), ref)


def test_single_leaf_and_chains():
    """A lone leaf (height 0) next to 16-leaf chains (height 15): levels with one node."""
    rng = np.random.default_rng(3)
    trees = data.batch([data.random_binary_tree(rng, 1, MAX_NODES, vocab=VOCAB),
                        data.random_binary_tree(rng, MAX_LEAVES, MAX_NODES, shape="left", vocab=VOCAB),
                        data.random_binary_tree(rng, MAX_LEAVES, MAX_NODES, shape="right", vocab=VOCAB)])
    params = nary.init_params(jax.random.PRNGKey(0), VOCAB, 8)
    levels = tb.depth_levels(trees)
    assert levels.max_height == MAX_LEAVES - 1
    assert levels.counts[0] == 1 + 2 * MAX_LEAVES and sum(levels.counts) == 1 + 2 * MAX_NODES
    ref = nary.nary_tree_lstm.reference(params, trees, trees.root)
    _assert_close(tb.per_example_jit(params, trees), ref)
    _assert_close(tb.depth_batched(params, trees), ref)


def test_depth_levels_schedule():
    """Heights agree with `data.tree_height`; every used node appears exactly once,
    after both its children; padding writes are out of bounds."""
    items = data.random_binary_trees(6, seed=9, min_leaves=1, max_leaves=MAX_LEAVES, max_nodes=MAX_NODES,
                                     shape=["random", "left", "balanced"], vocab=VOCAB)
    trees = data.batch(items)
    heights = tb.node_heights(trees)
    assert [int(heights[i, t.root]) for i, t in enumerate(items)] == [data.tree_height(t) for t in items]
    levels = tb.depth_levels(trees)
    n_rows = 6 * MAX_NODES
    done = np.zeros(n_rows + 1, bool)
    done[n_rows] = True                                  # the zero row
    for node, left, right, n, w in zip(levels.node, levels.left, levels.right, levels.counts, levels.widths):
        assert w == tb.level_width(n) >= n
        assert done[left[:n]].all() and done[right[:n]].all()
        assert not done[node[:n]].any()
        done[node[:n]] = True
        assert (node[n:] == n_rows + 1).all() and (left[n:] == n_rows).all()
    used = np.arange(MAX_NODES)[None, :] < trees.num_nodes[:, None]
    np.testing.assert_array_equal(done[:n_rows], used.ravel())


def test_level_width():
    for n in range(1, 5000):
        w = tb.level_width(n)
        assert w >= max(n, 8) and (n < 8 or w < 1.25 * n)
