"""Differential tests of the TreeRNN model zoo (autobatched vs `.reference`,
i.e. the original Python run one example at a time), plus independent
cross-checks of the models, and validity tests of the data generators.

Sizes are small (hidden 8, batches <= 7, trees <= 20 leaves except one deep
chain) so the whole file runs in well under two minutes on two slow cores.
Tree batches share one padded size (`MAX_NODES`) so that a model compiles once
for random and stdlib-AST trees alike. Batches stay under `Tuning.fork_min_batch`
(8), so `fork="auto"` runs one lane per example here (a machine compiles in ~1 s,
its lane pool in 4-9 s): the models' forked machines are checked against this
same Python in tests/runtime/test_fork.py (every model on random trees of every
shape and stdlib ASTs, the recursive lattice LSTM) and tests/models/test_child_sum_loop.py.
"""
from __future__ import annotations

import ast

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pcbatch
from pcbatch import data
from pcbatch.models import bilstm_tagger, child_sum, lattice_lstm, mv_rnn, nary, tree_gru, tree_lstm_2type
from weights import numpy_weights  # tests/ is on sys.path (its conftest)

VOCAB, HIDDEN, N_TAGS, CHARS = 50, 8, 5, 20
MAX_LEAVES = 20
MAX_NODES = 2 * MAX_LEAVES - 1
SHAPES = ["random", "left", "right", "balanced", "frontier"]
RTOL, ATOL = 1e-5, 1e-6

TREE_MODELS = {
    "child_sum": (child_sum, child_sum.child_sum_tree_lstm),
    "nary": (nary, nary.nary_tree_lstm),
    "tree_gru": (tree_gru, tree_gru.tree_gru),
    "mv_rnn": (mv_rnn, mv_rnn.mv_rnn),
    "tree_lstm_2type": (tree_lstm_2type, tree_lstm_2type.tree_lstm_2type),
}


def _params(name: str, seed: int = 0):
    module, _ = TREE_MODELS[name]
    return numpy_weights(module.init_params, VOCAB, HIDDEN, seed=seed)


def assert_matches_reference(fn, *args):
    """Autobatched == per-example Python, every example finished, no overflow. A plain call
    raises for an overflowed, unfinished or failed example; it is also the cross-checks'
    call, whose machine (`checked` compiles another, which counts blocks) it shares."""
    out = fn(*args)
    ref = fn.reference(*args)
    assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(ref)
    for got, want in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(ref)):
        assert got.shape == want.shape
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=RTOL, atol=ATOL)
    return out


def random_tree_batch(count: int, seed: int, min_leaves: int = 1, max_leaves: int = MAX_LEAVES, max_nodes=MAX_NODES):
    return data.batch(data.random_binary_trees(count, seed=seed, min_leaves=min_leaves, max_leaves=max_leaves,
                                               max_nodes=max_nodes, shape=SHAPES, vocab=VOCAB, n_types=2))


# The batch of the differential tests, one below fork_min_batch (see the docstring); the
# cross-checks below use it too, so that each model's machine compiles once for all of them.
BATCH = 7


@pytest.fixture(scope="module")
def ast_batch():
    return data.batch(data.stdlib_ast_trees(BATCH, min_leaves=3, max_leaves=MAX_LEAVES, vocab=VOCAB, seed=7))


# --------------------------------------------------------------------------
# tree models: differential
# --------------------------------------------------------------------------

# Every model on random trees of every shape also runs in tests/runtime/test_fork.py
# (mixed batch of 7, against fork=False too): here child_sum and nary, the rest in make test-matrix.
@pytest.mark.parametrize("name", [n if n in ("child_sum", "nary") else pytest.param(n, marks=pytest.mark.matrix)
                                  for n in TREE_MODELS])
def test_tree_model_random_trees(name):
    """Seven random trees of all shapes (1..20 leaves: a single leaf up to chains), plus the same
    batch started at a non-root node."""
    _, fn = TREE_MODELS[name]
    params = _params(name)
    trees = random_tree_batch(BATCH, seed=1)
    assert_matches_reference(fn, params, trees, trees.root)
    # start inside the tree: the root's left child (or the root itself when it is a leaf)
    rows = np.arange(BATCH)
    start = np.where(trees.children[rows, trees.root, 0] >= 0,
                     trees.children[rows, trees.root, 0], trees.root).astype(np.int32)
    assert_matches_reference(fn, params, trees, start)


# child_sum and nary run on random trees above (their machines are these); their stdlib-AST
# cells (the per-example Python's cost only) in make test-matrix.
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.matrix) if n in ("child_sum", "nary") else n
                                  for n in TREE_MODELS])
def test_tree_model_stdlib_ast_trees(name, ast_batch):
    _, fn = TREE_MODELS[name]
    assert_matches_reference(fn, _params(name), ast_batch, ast_batch.root)


# Each (model, size) cell compiles the model for its batch size: make test runs each size once
# (a batch of one on the type-dispatching model, of three on the matrix-valued one), make
# test-matrix the other cells; every model runs in make test at BATCH above (stdlib ASTs).
SMALL_BATCH_CELLS = {("tree_lstm_2type", 1), ("mv_rnn", 3)}


@pytest.mark.parametrize("name, size", [
    (name, size) if (name, size) in SMALL_BATCH_CELLS else pytest.param(name, size, marks=pytest.mark.matrix)
    for name in TREE_MODELS for size in (1, 3)])
def test_tree_model_small_batches(name, size):
    _, fn = TREE_MODELS[name]
    trees = random_tree_batch(size, seed=10 + size, min_leaves=1, max_leaves=12, max_nodes=23)
    assert_matches_reference(fn, _params(name, seed=size), trees, trees.root)


def test_deep_chains_within_default_stack_depth():
    """Left- and right-branching chains of 60 leaves (height 59) run under the
    models' default max_stack_depth."""
    rng = np.random.default_rng(0)
    trees = [data.random_binary_tree(rng, 60, 119, shape=s, vocab=VOCAB) for s in ("left", "right")]
    assert [data.tree_height(t) for t in trees] == [59, 59]
    b = data.batch(trees)
    assert_matches_reference(tree_gru.tree_gru, _params("tree_gru"), b, b.root)


def test_outputs_independent_of_batch_company():
    """An example's result does not depend on the other trees in its batch."""
    params = _params("tree_gru")
    trees = data.random_binary_trees(BATCH, seed=4, min_leaves=1, max_leaves=MAX_LEAVES, max_nodes=MAX_NODES,
                                     shape=SHAPES, vocab=VOCAB)
    b = data.batch(trees)
    together = np.asarray(tree_gru.tree_gru(params, b, b.root))
    rev = data.batch(trees[::-1])
    np.testing.assert_allclose(np.asarray(tree_gru.tree_gru(params, rev, rev.root))[::-1], together,
                               rtol=RTOL, atol=ATOL)


# The minimal form of what broke `nary_tree_lstm` (a parameter read only after both self-calls
# must be saved across the first): tests/lower/test_regressions.py, against the Python too.


# --------------------------------------------------------------------------
# tree models: independent cross-checks (the models compute what they claim)
# --------------------------------------------------------------------------

def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _nary_bottom_up(params, tree):
    """Tai et al.'s binary Tree-LSTM in NumPy, nodes in id order (children first)."""
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    n = int(tree.num_nodes)
    h = np.zeros((n, HIDDEN))
    c = np.zeros((n, HIDDEN))
    for j in range(n):
        l, r = tree.children[j]
        if l < 0:
            x, hl, cl, hr, cr = p["embed"][tree.word[j]], *([np.zeros(HIDDEN)] * 4)
        else:
            x, hl, cl, hr, cr = np.zeros(HIDDEN), h[l], c[l], h[r], c[r]
        z = p["W"] @ x + p["U"] @ np.concatenate([hl, hr]) + p["b"]
        i, fl, fr, o, u = np.split(z, 5)
        c[j] = _sigmoid(i) * np.tanh(u) + _sigmoid(fl) * cl + _sigmoid(fr) * cr
        h[j] = _sigmoid(o) * np.tanh(c[j])
    return h[int(tree.root)], c[int(tree.root)]


def test_nary_tree_lstm_equals_bottom_up_numpy():
    params = _params("nary")
    trees = data.random_binary_trees(BATCH, seed=5, min_leaves=1, max_leaves=MAX_LEAVES, max_nodes=MAX_NODES,
                                     shape=SHAPES, vocab=VOCAB)
    b = data.batch(trees)
    h, c = nary.nary_tree_lstm(params, b, b.root)
    for k, t in enumerate(trees):
        want_h, want_c = _nary_bottom_up(params, t)
        np.testing.assert_allclose(np.asarray(h[k]), want_h, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(np.asarray(c[k]), want_c, rtol=1e-4, atol=1e-5)


def test_child_sum_is_symmetric_in_children():
    """Child-sum is order-invariant in the children: swapping left/right leaves it unchanged."""
    params = _params("child_sum")
    b = random_tree_batch(BATCH, seed=6)
    swapped = b._replace(children=b.children[:, :, ::-1].copy())
    h1, _ = child_sum.child_sum_tree_lstm(params, b, b.root)
    h2, _ = child_sum.child_sum_tree_lstm(params, swapped, swapped.root)
    np.testing.assert_allclose(np.asarray(h1), np.asarray(h2), rtol=1e-5, atol=1e-6)


def _random_nary_tree(rng, n_nodes, width, max_nodes):
    """A random tree with up to `width` children per node, children placed in
    random columns (gaps of -1 between them), root = node 0."""
    children = -np.ones((max_nodes, width), np.int32)
    word = -np.ones(max_nodes, np.int32)
    for j in range(1, n_nodes):
        parent = int(rng.integers(j))
        free = np.nonzero(children[parent] < 0)[0]
        while free.size == 0:
            parent = int(rng.integers(j))
            free = np.nonzero(children[parent] < 0)[0]
        children[parent, rng.choice(free)] = j
    leaves = np.all(children[:n_nodes] < 0, axis=1)
    word[:n_nodes][leaves] = rng.integers(VOCAB, size=int(leaves.sum()))
    types = np.where(np.arange(max_nodes) < n_nodes, 0, -1).astype(np.int32)
    return data.Tree(children, word, types, np.int32(0), np.int32(n_nodes))


def test_child_sum_on_nary_trees():
    """Child-sum handles any arity: 4 child columns with gaps."""
    rng = np.random.default_rng(8)
    b = data.batch([_random_nary_tree(rng, int(n), 4, 24) for n in (1, 5, 24, 13)])
    params = _params("child_sum")
    assert_matches_reference(child_sum.child_sum_tree_lstm, params, b, b.root)


def test_tree_lstm_2type_dispatches_on_node_type():
    params = _params("tree_lstm_2type")
    b = random_tree_batch(BATCH, seed=9, min_leaves=4)
    flipped = b._replace(node_type=np.where(b.node_type >= 0, 1 - b.node_type, -1).astype(np.int32))
    h1, _ = tree_lstm_2type.tree_lstm_2type(params, b, b.root)
    h2, _ = tree_lstm_2type.tree_lstm_2type(params, flipped, flipped.root)
    assert not np.allclose(np.asarray(h1), np.asarray(h2))
    same = dict(params, type1=params["type0"])
    h3, _ = tree_lstm_2type.tree_lstm_2type(same, b, b.root)
    h4, _ = tree_lstm_2type.tree_lstm_2type(same, flipped, flipped.root)
    np.testing.assert_allclose(np.asarray(h3), np.asarray(h4), rtol=1e-6, atol=1e-7)


def test_mv_rnn_leaf_returns_word_vector_and_matrix():
    params = _params("mv_rnn")
    b = random_tree_batch(BATCH, seed=2)
    leaf = np.zeros(BATCH, np.int32)            # node 0 is always the first leaf
    p, P = mv_rnn.mv_rnn(params, b, leaf)
    words = b.word[:, 0]
    np.testing.assert_allclose(np.asarray(p), np.asarray(params["embed"])[words])
    np.testing.assert_allclose(np.asarray(P), np.asarray(params["word_matrix"])[words])


# --------------------------------------------------------------------------
# lattice LSTM and BiLSTM tagger
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def lattice_setup():
    # lattice_lstm_at recomputes shared states (calls grow exponentially with the length, and its
    # reference runs them one JAX op at a time): lengths 1..6 (24 words), not up to 9. Seven lattices:
    # fork="auto" runs lattice_lstm_at one lane per example (its loop-forked machine took 9 s of
    # CPU to compile for eight; test_fork.py's test_lattice_lstm_at_recursive checks it)
    lats = data.batch(data.random_lattices(BATCH, seed=3, min_len=1, max_len=7, char_vocab=CHARS, word_vocab=VOCAB,
                                           n_segmentations=3))
    params = numpy_weights(lattice_lstm.init_params, CHARS, VOCAB, HIDDEN, seed=3)
    return params, lats


def test_lattice_lstm_loop_matches_reference(lattice_setup):
    params, lats = lattice_setup
    assert (lats.word_start >= 0).any()
    assert_matches_reference(lattice_lstm.lattice_lstm, params, lats)


def test_lattice_lstm_recursive_matches_reference_and_loop(lattice_setup):
    params, lats = lattice_setup
    rec = assert_matches_reference(lattice_lstm.lattice_lstm_at, params, lats, lats.length)
    loop = lattice_lstm.lattice_lstm(params, lats)
    for a, b in zip(rec, loop):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=RTOL, atol=ATOL)


def test_lattice_without_words_is_a_plain_lstm(lattice_setup):
    params, lats = lattice_setup
    plain = lats._replace(word_start=-np.ones_like(lats.word_start), word_id=-np.ones_like(lats.word_id))
    h, c = lattice_lstm.lattice_lstm(params, plain)
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    for k in range(BATCH):
        hh, cc = np.zeros(HIDDEN), np.zeros(HIDDEN)
        for t in range(int(plain.length[k])):
            x = p["char_embed"][plain.chars[k, t]]
            i, f, o, u = np.split(p["W_c"] @ x + p["U_c"] @ hh + p["b_c"], 4)
            cc = _sigmoid(f) * cc + _sigmoid(i) * np.tanh(u)
            hh = _sigmoid(o) * np.tanh(cc)
        np.testing.assert_allclose(np.asarray(h[k]), hh, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(np.asarray(c[k]), cc, rtol=1e-4, atol=1e-5)


@jax.jit
def _lstm_outputs(p, xs):
    """A plain `lax.scan` LSTM's outputs over `xs` [T, H]. Causal: its first n rows
    are those of `xs[:n]` alone, so every sequence padded to one length compiles once."""
    def step(carry, x):
        h, c = bilstm_tagger.lstm_cell(p, x, *carry)
        return (h, c), h
    return jax.lax.scan(step, (jnp.zeros(HIDDEN), jnp.zeros(HIDDEN)), xs)[1]


def test_bilstm_tagger_matches_reference_and_scan():
    chains = data.batch(data.random_chains(8, seed=5, min_len=1, max_len=12, vocab=VOCAB, n_tags=N_TAGS))
    params = numpy_weights(bilstm_tagger.init_params, VOCAB, HIDDEN, n_tags=N_TAGS, seed=5)
    scores = assert_matches_reference(bilstm_tagger.bilstm_tagger, params, chains)
    assert scores.shape == (8, 12, N_TAGS)
    scores, embed = np.asarray(scores), np.asarray(params["embed"])
    for k in range(8):
        n = int(chains.length[k])
        assert np.all(scores[k, n:] == 0)
        x = embed[np.asarray(chains.words[k, :n])]
        pad = np.zeros((12 - n, x.shape[1]), x.dtype)
        hf = np.asarray(_lstm_outputs(params["fwd"], np.concatenate([x, pad])))[:n]
        hb = np.asarray(_lstm_outputs(params["bwd"], np.concatenate([x[::-1], pad])))[:n][::-1]
        want = np.concatenate([hf, hb], 1) @ np.asarray(params["W_tag"]).T + np.asarray(params["b_tag"])
        np.testing.assert_allclose(scores[k, :n], want, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------
# data generators
# --------------------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES)
def test_random_trees_valid(shape):
    trees = data.random_binary_trees(40, seed=11, shape=shape, n_types=2)   # defaults: 10..60 leaves
    sizes = []
    for t in trees:
        data.check_tree(t, min_leaves=10, max_leaves=60)
        assert t.children.shape == (119, 2)
        assert int(t.root) == int(t.num_nodes) - 1
        n = int(t.num_nodes)
        internal = t.children[:n, 0] >= 0
        assert np.all(t.children[:n][internal] < np.arange(n)[internal, None])   # post-order ids
        assert np.all((t.word[:n][~internal] >= 0) & (t.word[:n][~internal] < 1000))
        assert np.all((t.node_type[:n] >= 0) & (t.node_type[:n] < 2))
        sizes.append(data.tree_leaves(t))
        if shape in ("left", "right"):
            assert data.tree_height(t) == sizes[-1] - 1
        if shape == "balanced":
            assert data.tree_height(t) == int(np.ceil(np.log2(sizes[-1])))
    assert min(sizes) < 25 and max(sizes) > 45                           # sizes spread over the range


def test_random_trees_seeded_and_node_types_balanced():
    a = data.random_binary_trees(30, seed=3)
    b = data.random_binary_trees(30, seed=3)
    c = data.random_binary_trees(30, seed=4)
    assert all(all(np.array_equal(x, y) for x, y in zip(s, t)) for s, t in zip(a, b))
    assert not all(np.array_equal(s.children, t.children) for s, t in zip(a, c))
    types = np.concatenate([t.node_type[data.tree_leaves(t):int(t.num_nodes)] for t in a])
    assert 0.4 < types.mean() < 0.6


def test_stdlib_ast_trees_valid_and_deterministic():
    trees = data.stdlib_ast_trees(30, min_leaves=10, max_leaves=60, vocab=500)
    again = data.stdlib_ast_trees(30, min_leaves=10, max_leaves=60, vocab=500)
    keys = set()
    for t, u in zip(trees, again):
        data.check_tree(t, min_leaves=10, max_leaves=60)
        assert all(np.array_equal(x, y) for x, y in zip(t, u))
        n = int(t.num_nodes)
        assert np.all((t.node_type[:n] >= 0) & (t.node_type[:n] < len(data.AST_TYPES)))
        assert np.all(t.word[:n][t.word[:n] >= 0] < 500)
        keys.add(t.children.tobytes() + t.word.tobytes())
    assert len(keys) == 30                                                # no duplicates


def test_stdlib_ast_binarization_of_known_statement(tmp_path):
    """`x = f(a, b)`: Assign(Name x, Call(Name f, Name a, Name b)) binarizes left-leaning to
    Assign(x, Call(Call(f, a), b)): 4 leaves, 7 nodes, height 3."""
    from pcbatch.data import trees as mod
    nested, leaves = mod._binarize(ast.parse("x = f(a, b)").body[0], 1000, 60)
    t = mod._encode(nested, 7)
    data.check_tree(t, min_leaves=4, max_leaves=4)
    assert leaves == 4 and data.tree_height(t) == 3
    assert list(t.word[:4]) == [data.token_id(s, 1000) for s in "xfab"]
    names = [data.AST_TYPES[k] for k in t.node_type[4:7]]
    assert names == ["Call", "Call", "Assign"]


def test_stdlib_ast_trees_height_filter():
    for t in data.stdlib_ast_trees(10, min_leaves=5, max_leaves=30, max_height=6):
        data.check_tree(t, min_leaves=5, max_leaves=30)
        assert data.tree_height(t) <= 6


def test_check_tree_rejects_broken_trees():
    t = data.random_binary_trees(1, seed=0, min_leaves=5, max_leaves=5)[0]
    data.check_tree(t)
    root = int(t.root)
    l, r = t.children[root]
    broken = [
        t._replace(children=t.children.copy()),                      # shared subtree (below)
        t._replace(word=np.where(np.arange(9) == root, 3, t.word).astype(np.int32)),  # internal node with a word
        t._replace(word=np.where(np.arange(9) == 0, -1, t.word).astype(np.int32)),    # leaf without word
        t._replace(root=np.int32(l)),                                # nodes unreachable
        t._replace(num_nodes=np.int32(8)),                           # padding not blank / out of range
    ]
    broken[0].children[root, 1] = l
    one_child = t.children.copy()
    one_child[root, 1] = -1
    broken.append(t._replace(children=one_child))
    for b in broken:
        with pytest.raises(ValueError):
            data.check_tree(b)
    with pytest.raises(ValueError):
        data.check_tree(t, max_leaves=4)


def test_lattices_and_chains_valid():
    lats = data.random_lattices(50, seed=1, min_len=5, max_len=20, max_word_len=4, n_segmentations=2)
    words = 0
    for lat in lats:
        data.check_lattice(lat, max_word_len=4)
        assert 5 <= int(lat.length) <= 20
        words += int((lat.word_start >= 0).sum())
    assert words > 50
    bad = lats[0]._replace(word_start=lats[0].word_start.copy())
    bad.word_start[1, 0] = 0                                           # a one-character "word"
    bad.word_id[1, 0] = 1
    with pytest.raises(ValueError):
        data.check_lattice(bad)
    for ch in data.random_chains(30, seed=2, min_len=5, max_len=30):
        data.check_chain(ch)
        assert 5 <= int(ch.length) <= 30


def test_batch_stacks_and_rejects_mixed_sizes():
    trees = data.random_binary_trees(3, seed=0, max_leaves=20, max_nodes=39)
    b = data.batch(trees)
    assert b.children.shape == (3, 39, 2) and b.root.shape == (3,)
    other = data.random_binary_trees(1, seed=0, max_leaves=20, max_nodes=41)
    with pytest.raises(ValueError):
        data.batch(trees + other)
    # One tree, None, numbers: named TypeErrors, not `list(None)`'s or a missing `_fields`.
    for bad, says in ((trees[0], "pass a list"), (None, "got NoneType"), ([1, 2], "got int")):
        with pytest.raises(TypeError, match=says):
            data.batch(bad)
