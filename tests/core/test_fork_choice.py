"""`fork="auto"` (the default): it forks where forking pays, and whatever it
picks, results equal the per-example Python and both explicit choices."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pcbatch
from pcbatch.compile import frame_bytes
from pcbatch.errors import OptionError
from pcbatch import data
from pcbatch.fork_choice import choose_fork, walks_data
from benchmarks.fork_choice import chosen  # what the default chose, eagerly or traced

H = 64


@pcbatch.autobatch
def fib(n):
    if n <= 1:
        return n
    return fib(n - 1) + fib(n - 2)


@pcbatch.autobatch(in_axes=(None, 0))
def vec_tree(w, n):
    """A numeric recursion on H-vectors: the calls only count down."""
    if n <= 1:
        return jnp.tanh(w[0] * n)
    return jnp.tanh(w @ (vec_tree(w, n - 1) + vec_tree(w, n - 2)))


@pcbatch.autobatch(in_axes=(None, 0, 0))
def tree_rnn(w, tree, node):
    """A recursion over each example's own tree (a Tree-RNN's shape of work)."""
    left = tree.children[node, 0]
    if left < 0:
        return jnp.tanh(w[0] * (tree.word[node] % 7))
    return jnp.tanh(w @ (tree_rnn(w, tree, left) + tree_rnn(w, tree, tree.children[node, 1])))


@pcbatch.autobatch(in_axes=(0, 0))
def tree_size(tree, node):
    """The same walk with scalar work."""
    left = tree.children[node, 0]
    if left < 0:
        return 1
    child = tree.children[node, 1]  # through another value: still read from the tree
    return 1 + tree_size(tree, left) + tree_size(tree, child)


@pcbatch.autobatch(in_axes=(0, 0))
def any_arity_size(tree, node):
    """A loop over the node's children (a loop fork)."""
    total = 1
    for k in range(jnp.sum(tree.children[node] >= 0)):
        total = total + any_arity_size(tree, tree.children[node, k])
    return total


def weights():
    return jnp.asarray(np.random.default_rng(0).normal(size=(H, H)) / H, jnp.float32)


def trees(batch):
    t = data.batch(data.random_binary_trees(batch, seed=batch, min_leaves=2, max_leaves=12))
    return t, t.root


_SIZES: dict[int, np.ndarray] = {}


def tree_sizes(batch):
    """`tree_size.reference` on `trees(batch)` (the per-example Python), once per batch in this file."""
    if batch not in _SIZES:
        _SIZES[batch] = np.asarray(tree_size.reference(*trees(batch)))
    return _SIZES[batch]


def assert_agree(want, *calls):
    for call in calls:
        np.testing.assert_allclose(np.asarray(call()), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_counting_recursion_does_not_fork():
    n = jnp.arange(9)
    c = chosen(fib, (n,))
    assert c.fork is False and "read none of each example's data" in c.reason
    assert not fib.executable(n)[0].prog.has_forks
    assert fib.with_options(fork=True).executable(n)[0].prog.has_forks
    # The machine it picked runs right (each other machine is another compile: fork=True's
    # fib runs in tests/core/test_schedules.py and tests/fsm, a traced call's pick below).
    assert_agree(fib.reference(n), lambda: fib(n))
    # work per call does not change that: the examples still run in step
    n = jnp.array([3, 6, 1, 5, 4, 2, 6, 0])
    assert chosen(vec_tree, (weights(), n)).fork is False


def test_tree_walks_fork_eagerly_and_under_jit():
    tree, root = trees(8)
    for traced in (False, True):
        c = chosen(tree_size, (tree, root), traced=traced)
        assert c.fork is True, c.reason
    assert tree_size.executable(tree, root)[0].prog.has_forks
    # Against the Python (fork=False's machine, one more compile, runs in the measuring tests below).
    assert_agree(tree_sizes(8), lambda: tree_size(tree, root), lambda: jax.jit(tree_size)(tree, root))


def test_traced_call_with_a_large_pool_does_not_fork():
    tree, root = trees(8)
    assert chosen(tree_rnn, (weights(), tree, root)).fork is True
    c = chosen(tree_rnn, (weights(), tree, root), traced=True)
    assert c.fork is False and "afresh" in c.reason
    small = tree_rnn.with_options(tuning=pcbatch.Tuning(fork_max_traced_pool_bytes=1 << 40))
    assert chosen(small, (weights(), tree, root), traced=True).fork is True
    # Under jit without forks, it equals the Python. (The eager pick, a pool of H-vectors, would
    # compile for seconds: eager pools of tree walks run in test_tree_walks_fork_eagerly_and_under_jit.)
    assert_agree(tree_rnn.reference(weights(), tree, root), lambda: jax.jit(tree_rnn)(weights(), tree, root))


def test_small_batch_or_small_pool_does_not_fork():
    tree, root = trees(4)
    c = chosen(tree_size, (tree, root))
    assert c.fork is False and "batch is small" in c.reason
    np.testing.assert_array_equal(np.asarray(tree_size(tree, root)), np.asarray(tree_size.reference(tree, root)))
    tree, root = trees(8)
    crowded = tree_size.with_options(tuning=pcbatch.Tuning(max_pool_lanes=8 * 7))
    c = chosen(crowded, (tree, root))
    assert c.fork is False and "pool is small" in c.reason and not c.measure


@pytest.mark.parametrize("calls", ["eager", "jit"])
def test_where_the_rule_cannot_tell_the_first_eager_call_measures(calls):
    """8-63 pool lanes per example: the first eager call times both machines
    and keeps the faster for the signature; a traced call does not fork."""
    tree, root = trees(8)
    f = tree_size.with_options(tuning=pcbatch.Tuning(lanes_per_example=16))
    before = chosen(f, (tree, root), traced=calls == "jit")
    assert before.fork is False and before.measure is (calls == "eager")
    want = tree_sizes(8)
    run = f if calls == "eager" else jax.jit(f)
    np.testing.assert_array_equal(np.asarray(run(tree, root)), want)
    after = chosen(f, (tree, root), traced=calls == "jit")
    if calls == "eager":
        assert not after.measure and after.reason.startswith("measured on the first call (16 pool lanes")
        np.testing.assert_array_equal(np.asarray(f(tree, root)), want)   # the kept machine, no new measurement
        assert chosen(f, (tree, root)) is after
        forked = f.executable(tree, root)[0].prog.has_forks
        assert forked is after.fork
    else:
        assert after.fork is False and not after.measure


def test_eager_calls_count_the_lanes_their_shallow_stacks_buy():
    """Where the stack budget caps the pool, an eager call runs first on shallow
    stacks (`Tuning.pool_first_stack_depth`): the rule counts that pool's lanes."""
    tree, root = trees(8)
    prog = tree_size.with_options(fork=True).lowered(tree, root)
    budget = frame_bytes(prog) * tree_size.max_stack_depth * 4 * 8   # 4 lanes per example at full depth
    f = tree_size.with_options(tuning=pcbatch.Tuning(pool_stack_bytes=budget,
                                                     pool_first_stack_depth=tree_size.max_stack_depth // 8))
    traced = chosen(f, (tree, root), traced=True)
    assert traced.fork is False and "(4 lanes per example" in traced.reason
    eager = chosen(f, (tree, root))   # shares the traced call's machine, and still measures
    assert eager.measure and "holds 32 lanes per example" in eager.reason, eager.reason
    # The eager call's result (a traced call's machine, one lane per example, runs under jit in
    # test_where_the_rule_cannot_tell_the_first_eager_call_measures[jit]).
    np.testing.assert_array_equal(np.asarray(f(tree, root)), tree_sizes(8))


def test_program_without_forks():
    @pcbatch.autobatch
    def count(n):
        return 0 if n == 0 else 1 + count(n - 1)

    n = jnp.array([0, 3, 5])
    assert chosen(count, (n,)).fork is False
    np.testing.assert_array_equal(np.asarray(count(n)), [0, 3, 5])


def test_rule_thresholds():
    """Each condition decides on its own (numbers straight into the rule)."""
    prog = tree_size.with_options(fork=True).executable(*trees(8))[0].prog
    assert walks_data(prog)
    assert not walks_data(fib.with_options(fork=True).executable(jnp.arange(4))[0].prog)
    tuning = pcbatch.Tuning()
    args = dict(lanes=8 * 64, pool_bytes=1 << 20, traced=False, tuning=tuning)
    assert choose_fork(prog, 8, **args).fork
    assert not choose_fork(prog, 7, **{**args, "lanes": 7 * 64}).fork  # batch below fork_min_batch
    assert choose_fork(prog, 7, **{**args, "lanes": 7 * 64, "tuning": pcbatch.Tuning(fork_min_batch=7)}).fork
    assert not choose_fork(prog, 8, **{**args, "lanes": 8 * 64 - 1}).fork  # pool below 64 lanes per example
    assert choose_fork(prog, 8, **{**args, "lanes": 8 * 64 - 1}).measure       # 8-63: measured when eager
    assert choose_fork(prog, 8, **{**args, "lanes": 8 * 8}).measure
    assert not choose_fork(prog, 8, **{**args, "lanes": 8 * 8, "traced": True}).measure
    assert not choose_fork(prog, 8, **{**args, "lanes": 8 * 8}, measurable=False).measure  # sharded
    assert not choose_fork(prog, 8, **{**args, "lanes": 8 * 8 - 1}).measure   # below 8: too small to try
    # traced: the pool's size matters
    assert choose_fork(prog, 8, **{**args, "traced": True, "pool_bytes": tuning.fork_max_traced_pool_bytes}).fork
    assert not choose_fork(prog, 8, **{**args, "traced": True,
                                       "pool_bytes": tuning.fork_max_traced_pool_bytes + 1}).fork


def test_a_loop_fork_is_measured_eagerly_and_not_forked_traced():
    """Whether a loop fork pays depends on the data: the rule measures (eager) or keeps one lane (traced)."""
    t, roots = trees(16)
    prog = any_arity_size.with_options(fork=True).executable(t, roots)[0].prog
    assert prog.has_launches and walks_data(prog)
    args = dict(lanes=16 * 128, pool_bytes=1 << 20, tuning=pcbatch.Tuning())
    assert choose_fork(prog, 16, traced=False, **args).measure
    assert not choose_fork(prog, 16, traced=True, **args).fork
    want = any_arity_size.reference(t, roots)
    f = any_arity_size.with_options()
    np.testing.assert_array_equal(f(t, roots), want)
    choice = f.executable(t, roots)[0].fork_choice
    assert "measured on the first call" in choice.reason and "a loop fork" in choice.reason, choice
    np.testing.assert_array_equal(jax.jit(f)(t, roots), want)


@pytest.mark.parametrize("bad", ["yes", 1, None, "Auto"])
def test_fork_option_validated(bad):
    with pytest.raises(OptionError, match="fork"):
        pcbatch.autobatch(lambda n: n, fork=bad)


# Running each pool compiles a machine (seconds): `make test` checks what each option picks,
# `make test-matrix` runs both pools too (fib's pool with max_lanes=64 runs in
# tests/core/test_api.py::test_a_pool_compiled_for_checked_also_runs_plain_calls).
@pytest.mark.parametrize("options, run", [
    pytest.param(dict(max_lanes=64), False, id="max_lanes"),
    pytest.param(dict(lane_width=32), False, id="lane_width"),
    pytest.param(dict(max_lanes=64), True, id="max_lanes-run", marks=pytest.mark.matrix),
    pytest.param(dict(lane_width=32), True, id="lane_width-run", marks=pytest.mark.matrix)])
def test_pool_options_ask_for_the_pool(options, run):
    n = jnp.arange(6)
    f = fib.with_options(**options)
    assert chosen(f, (n,)).fork and chosen(f, (n,), traced=True).fork
    assert f.executable(n)[0].prog.has_forks
    if run:
        np.testing.assert_array_equal(np.asarray(f(n)), [0, 1, 1, 2, 3, 5])


def test_eager_and_traced_calls_share_a_machine_when_they_choose_alike():
    @pcbatch.autobatch
    def fib2(n):
        return n if n <= 1 else fib2(n - 1) + fib2(n - 2)

    n = jnp.arange(7)
    fib2(n)
    count = fib2.trace_count
    jax.jit(fib2)(n)
    assert fib2.trace_count == count  # the same machine (its traced form cached by jax.jit)
    assert chosen(fib2, (n,)).fork is False and chosen(fib2, (n,), traced=True).fork is False
