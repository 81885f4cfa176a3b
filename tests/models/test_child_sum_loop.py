"""`models.child_sum_loop` (= `models.child_sum`): the natural-loop Child-Sum Tree-LSTM on real variable-arity trees
(stdlib function ASTs), autobatched == the same Python run one tree at a time, and ==
an independent NumPy bottom-up Child-Sum Tree-LSTM."""
from __future__ import annotations

import numpy as np
import pytest

from pcbatch import data
from pcbatch.models import child_sum_loop
from weights import numpy_weights  # tests/ is on sys.path (its conftest)

HIDDEN, MAX_NODES, MAX_CHILDREN = 8, 40, 6
MODULES = ["bisect", "heapq", "textwrap", "json.decoder", "json.encoder", "colorsys", "fnmatch"]


@pytest.fixture(scope="module")
def setup():
    got = data.load_ast_trees("all", max_nodes=MAX_NODES, max_children=MAX_CHILDREN, modules=MODULES, min_nodes=2)
    # a spread of sizes and arities, including the widest node available
    order = np.argsort([int(t.num_nodes) for t in got.trees], kind="stable")
    pick = [int(order[i]) for i in np.linspace(0, len(order) - 1, 7).astype(int)]
    widest = int(np.argmax([int((t.children >= 0).sum(axis=1).max()) for t in got.trees]))
    trees = data.batch([got.trees[i] for i in pick + [widest]])
    return numpy_weights(child_sum_loop.init_params, len(data.AST_VOCAB), HIDDEN), trees


def _numpy_child_sum(params, tree):
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    sig = lambda x: 1 / (1 + np.exp(-x))
    n = int(tree.num_nodes)
    h, c = np.zeros((n, HIDDEN)), np.zeros((n, HIDDEN))
    for j in range(n):                     # post-order ids: children first
        x = p["embed"][tree.word[j]]
        kids = [int(k) for k in tree.children[j] if k >= 0]
        hs = h[kids].sum(axis=0) if kids else np.zeros(HIDDEN)
        i, o, u = np.split(p["W_iou"] @ x + p["U_iou"] @ hs + p["b_iou"], 3)
        fc = sum((sig(p["W_f"] @ x + p["b_f"] + p["U_f"] @ h[k]) * c[k] for k in kids), np.zeros(HIDDEN))
        c[j] = sig(i) * np.tanh(u) + fc
        h[j] = sig(o) * np.tanh(c[j])
    return h[int(tree.root)], c[int(tree.root)]


def test_trees_have_variable_arity(setup):
    _, trees = setup
    arity = (trees.children >= 0).sum(axis=-1)
    assert arity.max() > 2 and set(np.unique(arity)) >= {0, 1, 2, 3}


@pytest.fixture(scope="module")
def runs(setup):
    """Each fork mode's `checked` run, and the per-tree Python's result (the same for both),
    computed once: the tests below check different things about the same runs."""
    params, trees = setup
    fn = child_sum_loop.child_sum_tree_lstm_loop
    checked = {fork: fn.with_options(fork=fork).checked(params, trees, trees.root) for fork in (False, True)}
    return checked, fn.reference(params, trees, trees.root)


@pytest.mark.parametrize("fork", [False, True])
def test_autobatched_equals_per_tree_python(setup, runs, fork):
    params, trees = setup
    checked, (ref_h, ref_c) = runs
    (h, c), status = checked[fork]
    assert not np.asarray(status.overflow).any() and not np.asarray(status.unfinished).any()
    np.testing.assert_allclose(np.asarray(h), np.asarray(ref_h), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(c), np.asarray(ref_c), rtol=1e-5, atol=1e-6)
    for b in range(len(trees.root)):
        one = data.Tree(*(np.asarray(a)[b] for a in trees))
        want_h, want_c = _numpy_child_sum(params, one)
        np.testing.assert_allclose(np.asarray(h[b]), want_h, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(np.asarray(c[b]), want_c, rtol=1e-4, atol=1e-5)


def test_loop_forks(setup, runs):
    """The loop's calls run in lanes of their own: more lanes than trees, fewer steps than
    one lane per tree, and the IR says why."""
    _, trees = setup
    checked, _ = runs
    assert any("loop fork" in n for n in child_sum_loop.child_sum_tree_lstm_loop.with_options(fork=True).ir().notes)
    status, one_lane = checked[True][1], checked[False][1]
    assert int(status.peak_lanes) > len(trees.root)
    assert int(status.steps) < int(one_lane.steps)
