"""Fork-join lanes (`autobatch(..., fork=True)`): differential tests.

Every result is compared with `.reference` (the original Python, one example at
a time), and where a test is about it with the same function under `fork=False`
(one lane per example, calls one after another: another compiled machine);
ints exactly, floats to rtol 1e-5.

Covered:
  * the tree models (every recursive model of `pcbatch.models`: nary, tree_gru,
    mv_rnn, tree_lstm_2type fork their two child calls; child_sum loops over
    its children (a loop fork)) on random
    binary trees of every shape in `data.trees.SHAPES` and stdlib syntax trees,
    batch 7 with the default pool; nary also at batch 1 and 256 (64 under
    `make test-matrix`);
  * lane exhaustion: no free lanes (`max_lanes == batch`: all sequential), one
    or three free lanes, a small pool with `lane_width` 1..3 (those under
    `make test-matrix`), and a generous pool (more lanes in use than
    examples, fewer steps than `fork=False`);
  * programs: two- and three-way forks, argument code between the calls,
    dependent calls (no fork), mutual recursion, forks in a while loop, a callee
    other than the caller, pytree results, a shared (`in_axes=None`) argument,
    int and float results, a fork next to a self tail call; under a pool too
    small for all forks (forks and sequential fallback mix); some also inside
    `jax.jit` and against fork=False (all of them under `make test-matrix`);
  * stack overflow under forks: raised (never garbage) when lanes run out, and
    a correct result when the lanes make the recursion shallow;
  * `Status`: `blocks_run` against `trace`, `overflow`, `peak_lanes`;
  * hypothesis: random small trees under random pool sizes and lane widths.

Compile time dominates (every distinct function x option set x input shape
compiles one XLA program), so inputs share a few fixed shapes and every
reconfigured copy (`with_options`) is made once (`variant`); a check that needs
another machine (fork=False, jit, one more pool) runs in `make test` only where
it is the test's subject, and under `make test-matrix` otherwise.
"""
from __future__ import annotations

import re
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.experimental import checkify

import pcbatch
from pcbatch import data
from pcbatch.data.trees import SHAPES
from pcbatch.errors import StackOverflowError
from pcbatch.ir.interpret import run_stack_program
from pcbatch.models import child_sum, lattice_lstm, mv_rnn, nary, tree_gru, tree_lstm_2type
from weights import numpy_weights  # tests/ is on sys.path (its conftest)

VOCAB, HIDDEN, CHARS = 50, 4, 20
MAX_LEAVES = 12
MAX_NODES = 2 * MAX_LEAVES - 1       # one padded size for every model test (one compile per batch size)
RTOL, ATOL = 1e-5, 1e-6

tree_leaves = jax.tree_util.tree_leaves
tree_structure = jax.tree_util.tree_structure

_VARIANTS: dict = {}


def variant(fn: pcbatch.api.Autobatched, **options) -> pcbatch.api.Autobatched:
    """`fn.with_options(fork=True, **options)`, made once per module so that
    its compiled programs are cached across tests."""
    options = {"fork": True, **options}
    key = (id(fn), tuple(sorted(options.items())))
    if key not in _VARIANTS:
        _VARIANTS[key] = fn.with_options(**options)
    return _VARIANTS[key]


def plain(fn: pcbatch.api.Autobatched) -> pcbatch.api.Autobatched:
    """`fn` with one lane per example (`fork=False`; the pool options do not
    matter then, so every pool variant of one function shares it)."""
    key = (fn.fn, fn.max_stack_depth, "plain")
    if key not in _VARIANTS:
        _VARIANTS[key] = fn.with_options(fork=False, max_lanes=None, lane_width=None)
    return _VARIANTS[key]


def assert_same(got, want, what: str = "") -> None:
    """Same pytree structure and shapes; ints/bools exact, floats to RTOL."""
    assert tree_structure(got) == tree_structure(want), what
    for g, w in zip(tree_leaves(got), tree_leaves(want)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape, what
        if np.issubdtype(w.dtype, np.inexact):
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=what)
        else:
            np.testing.assert_array_equal(g, w, err_msg=what)


def assert_ok(status, batch: int) -> None:
    overflow, unfinished = np.asarray(status.overflow), np.asarray(status.unfinished)
    assert overflow.shape == (batch,) and not overflow.any(), f"overflow: {overflow}"
    assert not unfinished.any(), f"unfinished: {unfinished}"


def forked(fn: pcbatch.api.Autobatched) -> pcbatch.api.Autobatched:
    """`fn` with `fork=True` (the models keep the default, `fork="auto"`)."""
    return fn if fn.fork is True else variant(fn, fork=True)


def differential(fn, *args, ref=None, under_jit: bool = False, fork_false: bool = False):
    """`fn` (forks; with `under_jit`, `fn.checked` inside `jax.jit` instead of eagerly) ==
    `.reference` (with `fork_false`, also == `fork=False`). Each of jit and fork=False
    compiles another machine: only tests that assert on it (fewer steps than fork=False)
    or whose subject it is ask for it. Returns (result, status, status under fork=False or None)."""
    fn = forked(fn)
    out, status = jax.jit(fn.checked)(*args) if under_jit else fn.checked(*args)
    batch = np.shape(tree_leaves(out)[0])[0]
    assert_ok(status, batch)
    assert np.asarray(status.blocks_run).shape == (batch,)
    assert batch <= int(status.peak_lanes) <= fn.lowered(*args).lanes   # never more lanes than the pool
    assert_same(out, fn.reference(*args) if ref is None else ref, "fork vs reference")
    plain_status = None
    if fork_false:
        plain_out, plain_status = plain(fn).checked(*args)
        assert_ok(plain_status, batch)
        assert int(plain_status.peak_lanes) == batch       # one lane per example
        assert_same(out, plain_out, "fork vs fork=False")
    return out, status, plain_status


def assert_step_runs_at_most_lane_width_lanes(status, lane_width: int) -> None:
    assert int(status.steps) * lane_width >= int(np.sum(np.asarray(status.blocks_run)))


def fork_lines(fn) -> list[str]:
    """The forks of `fn`'s own body (not of the functions it calls): Forks and
    loop forks (one `await` each)."""
    text = "\n".join(line for line in str(fn.ir()).splitlines() if not line.startswith("# note:"))
    own = text.split("\n\ndef ")[0]
    assert own.startswith(f"def {fn.__name__}(")
    return [line for line in own.splitlines() if "fork [" in line or "await children" in line]


# --------------------------------------------------------------------------
# 1. tree models
# --------------------------------------------------------------------------

TREE_MODELS = {
    "nary": (nary, nary.nary_tree_lstm),
    "tree_gru": (tree_gru, tree_gru.tree_gru),
    "mv_rnn": (mv_rnn, mv_rnn.mv_rnn),
    "tree_lstm_2type": (tree_lstm_2type, tree_lstm_2type.tree_lstm_2type),
    "child_sum": (child_sum, child_sum.child_sum_tree_lstm),
}
FORKING_MODELS = ("nary", "tree_gru", "mv_rnn", "tree_lstm_2type")   # two independent child calls
LOOP_FORKING_MODELS = ("child_sum",)   # a loop over the children (a loop fork)

_PARAMS: dict = {}


def params_of(name: str):
    if name not in _PARAMS:
        module, _ = TREE_MODELS[name]
        _PARAMS[name] = numpy_weights(module.init_params, VOCAB, HIDDEN, seed=len(name))
    return _PARAMS[name]


def random_trees(count: int, seed: int, shape=SHAPES, min_leaves: int = 1, max_leaves: int = MAX_LEAVES,
                 max_nodes: int = MAX_NODES) -> data.Tree:
    """`count` trees, the shapes cycled (so every shape of SHAPES appears once count >= 5)."""
    return data.batch(data.random_binary_trees(count, seed=seed, min_leaves=min_leaves, max_leaves=max_leaves,
                                               max_nodes=max_nodes, shape=shape, vocab=VOCAB, n_types=2))


_AST: dict = {}


def test_binary_models_fork():
    for name in FORKING_MODELS:
        lines = fork_lines(TREE_MODELS[name][1])
        assert len(lines) == 1 and lines[0].count(f"{TREE_MODELS[name][1].__name__}(") == 2, (name, lines)


def mixed_batch7() -> data.Tree:
    """Five random trees (one of each shape in SHAPES, 1..12 leaves) and two stdlib
    syntax trees, padded alike."""
    if "mixed7" not in _AST:
        rand = data.random_binary_trees(5, seed=1, min_leaves=1, max_leaves=MAX_LEAVES, max_nodes=MAX_NODES,
                                        shape=SHAPES, vocab=VOCAB, n_types=2)
        asts = data.stdlib_ast_trees(2, min_leaves=4, max_leaves=MAX_LEAVES, vocab=VOCAB, seed=2)
        _AST["mixed7"] = data.batch(rand + asts)
    return _AST["mixed7"]


# Against fork=False (a second machine per model, and a second oracle beside `.reference`): nary
# (two child calls) and child_sum (a loop fork); the other models' plain machines run against
# `.reference` in tests/models/test_models.py (batches of 1 and 3: fork="auto" does not fork),
# and against their forks in `make test-matrix` (test_tree_model_batch7_against_fork_false).
AGAINST_FORK_FALSE_MODELS = ("nary", "child_sum")


@pytest.mark.parametrize("name", list(TREE_MODELS))
def test_tree_model_batch7_every_shape_and_stdlib_ast(name):
    _, fn = TREE_MODELS[name]
    trees = mixed_batch7()
    against_fork_false = name in AGAINST_FORK_FALSE_MODELS
    _, status, seq = differential(fn, params_of(name), trees, trees.root, fork_false=against_fork_false)
    if name in FORKING_MODELS + LOOP_FORKING_MODELS:
        assert int(status.peak_lanes) > 7
        if against_fork_false:
            assert int(status.steps) < int(seq.steps)


@pytest.mark.matrix
@pytest.mark.parametrize("name", [n for n in FORKING_MODELS if n not in AGAINST_FORK_FALSE_MODELS])
def test_tree_model_batch7_against_fork_false(name):
    """test_tree_model_batch7_every_shape_and_stdlib_ast's fork=False cells: fewer steps with forks."""
    _, fn = TREE_MODELS[name]
    trees = mixed_batch7()
    _, status, seq = differential(fn, params_of(name), trees, trees.root, fork_false=True)
    assert int(status.steps) < int(seq.steps)


def test_nary_batch1():
    fn = nary.nary_tree_lstm
    for seed, shape in enumerate(("balanced", "left")):
        trees = random_trees(1, seed=20 + seed, shape=shape, min_leaves=MAX_LEAVES)
        _, status, _ = differential(fn, params_of("nary"), trees, trees.root)
        assert int(status.peak_lanes) > 1
    single_leaf = random_trees(1, seed=3, min_leaves=1, max_leaves=1, max_nodes=MAX_NODES)
    _, status, _ = differential(fn, params_of("nary"), single_leaf, single_leaf.root)
    assert int(status.peak_lanes) == 1


@pytest.mark.matrix  # batch 7 (the tree models, lane exhaustion) and 256 run in make test
def test_nary_batch64():
    """The whole batch against fork=False, the (slow, per-example) reference on every
    8th example (every shape among them), as test_nary_batch256."""
    fn = forked(nary.nary_tree_lstm)
    params = params_of("nary")
    trees = random_trees(64, seed=5)
    out, status = fn.checked(params, trees, trees.root)
    assert_ok(status, 64)
    assert np.asarray(status.blocks_run).shape == (64,)
    assert 64 < int(status.peak_lanes) <= fn.lowered(params, trees, trees.root).lanes
    seq_out, seq_status = plain(fn).checked(params, trees, trees.root)
    assert_ok(seq_status, 64)
    assert int(seq_status.peak_lanes) == 64
    assert_same(out, seq_out, "fork vs fork=False")
    assert int(status.steps) < int(seq_status.steps)
    some = data.Tree(*(a[::8] for a in trees))
    assert_same(jax.tree_util.tree_map(lambda a: a[::8], out), fn.reference(params, some, some.root))


def test_nary_batch256():
    """Random trees of every shape and stdlib ASTs; the (slow, per-example)
    reference on every 32nd example (each of the 5 shapes, one twice, and 2 ASTs
    among them), the whole batch against fork=False."""
    fn = forked(nary.nary_tree_lstm)
    params = params_of("nary")
    rand = data.random_binary_trees(192, seed=6, min_leaves=1, max_leaves=MAX_LEAVES, max_nodes=MAX_NODES,
                                    shape=SHAPES, vocab=VOCAB, n_types=2)
    asts = data.stdlib_ast_trees(64, min_leaves=1, max_leaves=MAX_LEAVES, vocab=VOCAB, seed=11)
    trees = data.batch(rand + asts)
    out, status = fn.checked(params, trees, trees.root)
    assert_ok(status, 256)
    assert 256 < int(status.peak_lanes) <= fn.lowered(params, trees, trees.root).lanes
    seq_out, seq_status = plain(fn).checked(params, trees, trees.root)
    assert_same(out, seq_out)
    assert int(status.steps) < int(seq_status.steps)
    some = data.Tree(*(a[::32] for a in trees))
    assert_same(jax.tree_util.tree_map(lambda a: a[::32], out), fn.reference(params, some, some.root))


def lattice_case():
    lats = data.batch(data.random_lattices(7, seed=3, min_len=1, max_len=6, char_vocab=CHARS, word_vocab=VOCAB,
                                           n_segmentations=2))
    assert (lats.word_start >= 0).any()
    return numpy_weights(lattice_lstm.init_params, CHARS, VOCAB, HIDDEN, seed=3), lats, lats.length


def test_lattice_lstm_at_recursive():
    """The recursive lattice LSTM (its calls sit in an `if` in a loop: a loop fork)."""
    differential(lattice_lstm.lattice_lstm_at, *lattice_case())


@pytest.mark.matrix
def test_lattice_lstm_at_recursive_against_fork_false():
    """test_lattice_lstm_at_recursive's program against fork=False too (another compile)."""
    differential(lattice_lstm.lattice_lstm_at, *lattice_case(), fork_false=True)


# --------------------------------------------------------------------------
# 2. lane exhaustion
# --------------------------------------------------------------------------

_NARY_REF: dict = {}


def nary_fixture(shape):
    """A batch of 7 trees of 12 leaves and its reference result (computed once)."""
    key = shape if isinstance(shape, str) else "mixed"
    if key not in _NARY_REF:
        trees = random_trees(7, seed=9, shape=shape, min_leaves=MAX_LEAVES)
        _NARY_REF[key] = (trees, nary.nary_tree_lstm.reference(params_of("nary"), trees, trees.root))
    return _NARY_REF[key]


# No free lane (7); free lanes at the default width (8, 10: test_program's pool, the hypothesis
# pools) and steps narrower than the free lanes (12 lanes, widths 1..3: test_program's pool, 32
# of 96 lanes, asserts the step bound) run in `make test-matrix`.
@pytest.mark.parametrize("max_lanes, lane_width", [(7, None)] + [
    pytest.param(*p, marks=pytest.mark.matrix) for p in [(8, None), (10, None), (12, 1), (12, 2), (12, 3)]])
def test_lane_exhaustion_results_exact(max_lanes, lane_width):
    options = {"max_lanes": max_lanes} if lane_width is None else {"max_lanes": max_lanes, "lane_width": lane_width}
    fn = variant(nary.nary_tree_lstm, **options)
    params = params_of("nary")
    for shape in ("balanced", SHAPES):
        trees, ref = nary_fixture(shape)
        _, status, _ = differential(fn, params, trees, trees.root, ref=ref)
        assert 7 <= int(status.peak_lanes) <= max_lanes
        if max_lanes == 7 and not isinstance(shape, str):
            # no free lane: every fork runs sequentially, the blocks a lone lane runs (on the
            # mixed batch, balanced trees among its shapes: the interpreter runs op by op)
            assert int(status.peak_lanes) == 7
            prog = fn.lowered(params, trees, trees.root)
            alone = [run_stack_program(prog, dict(zip(prog.entry_params, (params, t, t.root))), forks=False)
                     for t in (data.Tree(*(a[k] for a in trees)) for k in range(7))]
            np.testing.assert_array_equal(np.asarray(status.blocks_run), [len(t.blocks) for t in alone])
        if lane_width is not None:
            assert_step_runs_at_most_lane_width_lanes(status, lane_width)


def test_generous_pool_forks_balanced_trees():
    """The default pool (128 lanes per example): more than the trees have nodes. Its machine and
    the fork=False one are test_tree_model_batch7_every_shape_and_stdlib_ast[nary]'s (batch 7);
    an explicit `max_lanes` pool: test_lane_exhaustion_results_exact."""
    fn = forked(nary.nary_tree_lstm)
    trees, ref = nary_fixture("balanced")
    _, status, seq = differential(fn, params_of("nary"), trees, trees.root, ref=ref, fork_false=True)
    assert 7 < int(status.peak_lanes) <= 7 * (2 * MAX_LEAVES - 1)    # at most a lane per node
    assert int(status.steps) < int(seq.steps)


# --------------------------------------------------------------------------
# 3. programs
# --------------------------------------------------------------------------

@pcbatch.autobatch(fork=True)
def fib(n):
    if n <= 1:
        return n
    return fib(n - 1) + fib(n - 2)


@pcbatch.autobatch(fork=True)
def trib(n):
    if n <= 2:
        return jnp.where(n == 2, 1, 0)
    return trib(n - 1) + trib(n - 2) + trib(n - 3)


@pcbatch.autobatch(fork=True)
def between(x):
    """Argument code between the calls (`y` for the second call is computed
    after the first call in the source)."""
    if x <= 1:
        return x * 1.0
    a = between(x - 1)
    y = x // 2
    b = between(y)
    return a * 0.5 + b + 1.0


@pcbatch.autobatch(fork=True)
def dependent(n):
    """`x`, `y` independent (one fork); `z` needs both results (no fork with them)."""
    if n <= 1:
        return n
    x = dependent(n - 1)
    y = dependent(n - 2)
    z = dependent((x + y) % 4)
    return x + 2 * y + 3 * z


@pcbatch.autobatch(fork=True)
def chained(n):
    """Only dependent calls: nothing forks."""
    if n <= 1:
        return n + 1
    a = chained(n - 1)
    b = chained(a % 2)
    return a + b


@pcbatch.autobatch(fork=True)
def even_odd(n):
    """Mutual recursion, each side forking two calls of the other."""
    if n <= 0:
        return 1
    return odd_even(n - 1) + odd_even(n // 2)


@pcbatch.autobatch(fork=True)
def odd_even(n):
    if n <= 0:
        return 0
    return even_odd(n - 1) * 2 - even_odd(n // 3)


@pcbatch.autobatch(fork=True)
def loop_forks(n):
    acc = 0
    i = 0
    while i < n:
        acc = acc + fib(i) * fib(i + 1)
        i += 1
    return acc


@pcbatch.autobatch(fork=True)
def entry_param_fork(n):
    """A fork of another function straight from the entry parameter (an
    invariant of the example, never written) and a value computed from it."""
    return fib(n) * 10 + fib(n + 1)


class Pair(NamedTuple):
    s: jax.Array
    v: jax.Array


@pcbatch.autobatch(fork=True)
def pytree_result(n, x):
    if n <= 0:
        return {"count": 1, "res": Pair(x, x * 2.0)}
    l = pytree_result(n - 1, x * 0.5)
    r = pytree_result(n - 2, x + 1.0)
    return {"count": l["count"] + r["count"], "res": Pair(l["res"].s + r["res"].s, jnp.maximum(l["res"].v, r["res"].v))}


@pcbatch.autobatch(in_axes=(None, 0), fork=True)
def shared_table(table, n):
    if n <= 0:
        return table[0]
    a = shared_table(table, n - 1)
    b = shared_table(table, n - 2)
    return a * table[1] + b * table[2] + table[n % table.shape[0]]


@pcbatch.autobatch(fork=True)
def tail_with_fork(n, acc):
    """A fork of three functions other than the caller (children starting at
    different entries, returning ints and a pytree), then a self tail call."""
    if n <= 0:
        return acc
    a = fib(n % 7)
    b = trib(n % 5)
    c = pytree_result(n % 4, acc)
    return tail_with_fork(n - 1, acc * 0.5 + a * b + c["res"].s - c["count"])


N7 = np.array([0, 1, 2, 5, 9, 3, 7], np.int32)
TABLE = np.array([1.0, 0.5, -0.25, 2.0], np.float32)

PROGRAMS = {   # name: (function, arguments, forks in the function's own body)
    "fib": (fib, (N7,), 1),
    "trib_three_way": (trib, (N7,), 1),
    "code_between_calls": (between, (N7,), 1),
    "dependent_call": (dependent, (N7,), 1),
    "mutual_recursion": (even_odd, (N7,), 1),
    "fork_in_while_loop": (loop_forks, (N7,), 1),
    # also pytree results (pytree_result forks, returning dicts of a NamedTuple and an int)
    "other_callees_and_tail_call": (tail_with_fork, (N7, np.linspace(0, 1, 7).astype(np.float32)), 1),
    "shared_arg": (shared_table, (TABLE, np.array([0, 1, 2, 5, 6, 3, 4], np.int32)), 1),
    "entry_param_args": (entry_param_fork, (N7,), 1),
}


# A pool too small for the largest examples (fib(9) alone has 109 calls), so
# forks and the sequential fallback mix; one width (the models run the defaults).
PROGRAM_POOL = dict(max_lanes=96, lane_width=32)


# Inside `jax.jit` instead of eagerly (each compiles a pool: about 2-5 s each on
# CI's two cores): the program whose entry parameters a trace changes and calls
# fork from (a shared, `in_axes=None`, argument under jit: test_loop_forks.py's
# sibling walk, a pool too). Against fork=False (another compile each, a second
# oracle beside `.reference`): the simplest fork (the tree models run against
# fork=False too). `make test-matrix` runs every program every way
# (test_program_every_cell).
UNDER_JIT = {"entry_param_args"}
AGAINST_FORK_FALSE = {"fib"}
# Runs on a fork-join pool in make test elsewhere: test_pool_stacks.py's
# test_fork_programs_on_shallow_stacks[mutual_recursion-6] (against `.reference`).
PROGRAMS_IN_THE_MATRIX = {"mutual_recursion"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.matrix) if n in PROGRAMS_IN_THE_MATRIX else n
                                  for n in PROGRAMS])
def test_program(name):
    fn, args, forks = PROGRAMS[name]
    assert len(fork_lines(fn)) == forks, str(fn.ir())
    _, status, _ = differential(variant(fn, **PROGRAM_POOL), *args, under_jit=name in UNDER_JIT,
                                fork_false=name in AGAINST_FORK_FALSE)
    assert int(status.peak_lanes) > 7
    assert_step_runs_at_most_lane_width_lanes(status, PROGRAM_POOL["lane_width"])


@pytest.mark.matrix
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_program_every_cell(name):
    """test_program's cells, each program eagerly, under jit and against fork=False."""
    fn, args, _ = PROGRAMS[name]
    differential(variant(fn, **PROGRAM_POOL), *args, fork_false=True)
    differential(variant(fn, **PROGRAM_POOL), *args, under_jit=True)


def test_fork_groups():
    assert [line.count("fib(") for line in fork_lines(fib)] == [2]
    assert [line.count("trib(") for line in fork_lines(trib)] == [3]
    assert [line.count("between(") for line in fork_lines(between)] == [2]
    assert [line.count("even_odd(") for line in fork_lines(odd_even)] == [2]
    assert [line.count("pytree_result(") for line in fork_lines(pytree_result)] == [2]
    assert [(line.count("fib("), line.count("trib("), line.count("pytree_result("))
            for line in fork_lines(tail_with_fork)] == [(1, 1, 1)]
    # the dependent call is not in the fork: an ordinary call after the join
    (line,) = fork_lines(dependent)
    assert line.count("dependent(") == 2
    join = int(re.search(r"join b(\d+)", line).group(1))
    own = str(dependent.ir()).split("\n\ndef ")[0]
    join_block = re.search(rf"^  b{join} \(.*?(?=^  b\d+ \(|\Z)", own, re.S | re.M).group(0)
    assert "= call dependent(" in join_block, join_block
    # only dependent calls: no fork at all ("fork [", as this file's name is in the IR's comments)
    assert "fork [" not in str(chained.ir())
    assert "fork [" in str(dependent.ir())
    # Nothing forks, so fork=True lowers to the plain machine (fork=False's: not compiled again).
    n = np.array([0, 1, 2, 5, 9, 3, 7], np.int32)
    assert not chained.lowered(n).has_forks
    out, status = chained.checked(n)
    assert_ok(status, 7)
    assert_same(out, chained.reference(n))
    assert int(status.peak_lanes) == 7


def test_fork_false_ir_has_no_fork():
    assert "fork [" not in str(plain(fib).ir())
    assert "fork [" not in str(plain(trib).ir())


# --------------------------------------------------------------------------
# 4. stack overflow under forks
# --------------------------------------------------------------------------

DEEP = np.array([9, 1, 8, 2, 9, 0, 7], np.int32)     # fib(9) recurses 9 deep one call after another


def test_overflow_without_fork_raises():
    fn = plain(variant(fib, max_stack_depth=4))
    with pytest.raises(StackOverflowError) as e:
        fn(DEEP)
    assert e.value.examples == [0, 2, 4, 6]
    assert "max_lanes" not in str(e.value)  # no pool to enlarge


# No free lanes: `between` (float results, for the NaNs under jit) on one pool for both tests.
NO_FREE_LANES = dict(max_lanes=7, max_stack_depth=3)


def test_overflow_without_free_lanes_raises():
    """Forks need lanes; with none free every call runs in the parent's lane,
    as deep as without forks: an error, not garbage."""
    fn = variant(between, **NO_FREE_LANES)
    with pytest.raises(StackOverflowError) as e:
        fn(DEEP)
    assert e.value.examples == [0, 2, 4, 6]          # between(9), (8), (9), (7): 7-9 calls deep
    assert "larger `max_lanes=` also helps" in str(e.value)
    out, status = fn.checked(DEEP)
    flags = np.asarray(status.overflow)
    np.testing.assert_array_equal(flags, [True, False, True, False, True, False, True])
    ok = ~flags
    np.testing.assert_allclose(np.asarray(out)[ok], np.asarray(between.reference(DEEP))[ok], rtol=RTOL)


def test_overflow_under_jit_poisons_float_results():
    """Inside jit: checkify reports the overflow, overflowed examples' floats are NaN (the
    examples test_overflow_without_free_lanes_raises flags on the same pool)."""
    fn = variant(between, **NO_FREE_LANES)
    flags = np.array([True, False, True, False, True, False, True])
    err, jout = checkify.checkify(jax.jit(lambda a: fn(a)))(DEEP)
    assert "max_stack_depth" in str(err.get())
    jout = np.asarray(jout)
    assert np.isnan(jout[flags]).all()
    np.testing.assert_allclose(jout[~flags], np.asarray(between.reference(DEEP))[~flags], rtol=RTOL)


def test_overflow_with_plenty_of_lanes_succeeds():
    """Each forked call starts a fresh stack in its own lane: fib recursion then
    needs only one frame per lane."""
    fn = variant(fib, max_lanes=1024, max_stack_depth=4)
    out, status = fn.checked(DEEP)
    assert_ok(status, 7)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(fib.reference(DEEP)))
    np.testing.assert_array_equal(np.asarray(fn(DEEP)), np.asarray(out))


def test_overflow_with_few_lanes_is_flagged_or_correct():
    """Between the two: every example is either flagged or exactly right."""
    max_lanes = 16
    fn = variant(fib, max_lanes=max_lanes, max_stack_depth=4)
    out, status = fn.checked(DEEP)
    assert not np.asarray(status.unfinished).any()
    ok = ~np.asarray(status.overflow)
    np.testing.assert_array_equal(np.asarray(out)[ok], np.asarray(fib.reference(DEEP))[ok])
    assert int(status.peak_lanes) <= max_lanes
    if ok.all():
        fn(DEEP)
    else:
        with pytest.raises(StackOverflowError):
            fn(DEEP)


def deep_chains() -> data.Tree:
    """A 16-leaf left and right chain (height 15, twice max_stack_depth=8 below).
    (16 leaves, not 30: the per-node reference is the slow part.)"""
    rng = np.random.default_rng(0)
    chains = [data.random_binary_tree(rng, 16, 31, shape=s, vocab=VOCAB) for s in ("left", "right")]
    assert [data.tree_height(t) for t in chains] == [15, 15]
    return data.batch(chains)


@pytest.mark.matrix  # each pool compiles: no free lanes raising for `between`: test_overflow_without_free_lanes_raises
def test_tree_overflow_without_free_lanes():
    """Chains deeper than max_stack_depth with no free lanes: they overflow sequentially."""
    chains = deep_chains()
    with pytest.raises(StackOverflowError):
        variant(nary.nary_tree_lstm, max_lanes=2, max_stack_depth=8)(params_of("nary"), chains, chains.root)


# Each pool compiles: forks that save the stack run in make test on fib
# (test_overflow_with_plenty_of_lanes_succeeds), nary on other pools.
@pytest.mark.matrix
def test_tree_overflow_under_forks():
    """Chains deeper than max_stack_depth=8: with lanes to spare each lane holds one frame
    (without, they overflow: test_tree_overflow_without_free_lanes, and `between`'s
    test_overflow_without_free_lanes_raises)."""
    chains = deep_chains()
    params = params_of("nary")
    fn = variant(nary.nary_tree_lstm, max_lanes=256, max_stack_depth=8)
    out, status = fn.checked(params, chains, chains.root)
    assert_ok(status, 2)
    assert_same(out, nary.nary_tree_lstm.reference(params, chains, chains.root))


# --------------------------------------------------------------------------
# 5. status
# --------------------------------------------------------------------------

def test_blocks_run_equals_trace_with_plenty_of_lanes():
    fn = variant(fib, max_lanes=1024, max_stack_depth=4)
    _, status = fn.checked(DEEP)
    assert_ok(status, 7)
    traces = fn.reference_trace(DEEP)
    assert all(t.finished for t in traces)
    np.testing.assert_array_equal(np.asarray(status.blocks_run), [len(t.blocks) for t in traces])
    np.testing.assert_array_equal([int(t.result) for t in traces], np.asarray(fib.reference(DEEP)))


# The same check on nary's trees: test_lane_exhaustion_results_exact[7-None] (another pool to compile here).
@pytest.mark.matrix
def test_blocks_run_without_free_lanes_equals_sequential_trace():
    fn = variant(fib, max_lanes=7)
    out, status = fn.checked(DEEP)
    assert_ok(status, 7)
    assert int(status.peak_lanes) == 7
    prog = fn.lowered(DEEP)
    (param,) = prog.entry_params
    seq = [run_stack_program(prog, {param: DEEP[k]}, forks=False) for k in range(7)]
    np.testing.assert_array_equal(np.asarray(status.blocks_run), [len(t.blocks) for t in seq])
    np.testing.assert_array_equal(np.asarray(out), [int(t.result) for t in seq])


# --------------------------------------------------------------------------
# 6. hypothesis: random trees, random pools
# --------------------------------------------------------------------------

HYP_NODES = 39          # trees of 1..39 nodes (1..20 leaves), one padded size


@st.composite
def pooled_trees(draw):
    batch = draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    trees = [data.random_binary_tree(rng, draw(st.integers(1, 20)), HYP_NODES, shape=draw(st.sampled_from(SHAPES)),
                                     vocab=VOCAB)
             for _ in range(batch)]
    max_lanes = draw(st.integers(batch, 8 * batch))
    lane_width = draw(st.integers(1, 64))
    return data.batch(trees), max_lanes, lane_width


@settings(max_examples=1)  # each example compiles a pool (~8 s of CPU; test_lane_exhaustion_results_exact: fixed small ones)
@given(pooled_trees())
def test_hypothesis_nary_random_pools(case):
    trees, max_lanes, lane_width = case
    fn = variant(nary.nary_tree_lstm, max_lanes=max_lanes, lane_width=lane_width)
    params = params_of("nary")
    out, status = fn.checked(params, trees, trees.root)
    batch = trees.root.shape[0]
    assert_ok(status, batch)
    assert batch <= int(status.peak_lanes) <= max_lanes
    assert_same(out, fn.reference(params, trees, trees.root))


@pcbatch.autobatch(max_steps=6, fork=True)
def fib_then_loop(n):
    if n <= 1:
        return n
    x = fib_then_loop(n - 1) + fib_then_loop(n - 2)
    while x > 100:
        x = x - 1
    return x


def test_max_steps_message_names_the_join_a_waiting_lane_continues_at():
    prog = fib_then_loop.lowered(np.array([5, 7], np.int32))
    join = next(i for i, b in enumerate(prog.blocks) if b.ops and type(b.ops[0]).__name__ == "Join")
    with pytest.raises(pcbatch.errors.MaxStepsExceededError) as e:
        fib_then_loop(np.array([5, 7], np.int32))
    assert f"waiting for its forked calls, then at b{join} ({prog.blocks[join].label}" in str(e.value)


ARITY = 3


@pcbatch.autobatch(fork=True)
def nary_sum(kids, node):
    if node < 0:
        return 0
    total = node
    for k in range(ARITY):  # a constant trip count: unrolled, so the three calls fork
        total = total + nary_sum(kids, kids[node, k])
    return total


@pcbatch.autobatch(fork=True)
def loop_without_calls(n):
    acc = 0
    for k in range(3):  # no autobatched call in the body: stays a loop
        acc = acc + k * n
    return acc


def constant_arity_forest():
    """Four trees of up to three children per node, and their roots."""
    kids = np.full((4, 13, 3), -1, np.int32)
    kids[:, 0] = [1, 2, 3]
    kids[:, 1] = [4, 5, 6]
    kids[1:, 2] = [7, 8, -1]
    kids[2:, 3] = [9, 10, 11]
    return kids, np.zeros(4, np.int32)


def test_for_over_a_constant_number_of_children_forks():
    kids, root = constant_arity_forest()
    ir = str(nary_sum.ir())
    assert ir.count("fork [") == 1 and ir.split("fork [")[1].split("]")[0].count("nary_sum(") == 3
    assert ir.count("call nary_sum(") == 3  # the sequential fallback
    expected = nary_sum.reference(kids, root)
    np.testing.assert_array_equal(nary_sum(kids, root), expected)
    assert "for.header" in str(loop_without_calls.ir())  # run: test_for_over_a_constant_..._without_forks


@pytest.mark.matrix
def test_for_over_a_constant_number_of_children_without_forks():
    """test_for_over_a_constant_number_of_children_forks's programs run where nothing forks:
    nary_sum under fork=False, loop_without_calls (another compile each; that test checks
    the forks against `.reference` and the loop in the IR)."""
    kids, root = constant_arity_forest()
    np.testing.assert_array_equal(nary_sum.with_options(fork=False)(kids, root), nary_sum.reference(kids, root))
    n = np.arange(4, dtype=np.int32)  # a loop with no call to fork: stays a loop, runs as one
    np.testing.assert_array_equal(loop_without_calls(n), loop_without_calls.reference(n))
