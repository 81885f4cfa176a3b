"""`fork="auto"` (the default): it forks where forking pays, and whatever it
picks, results equal the per-example Python and both explicit choices."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pcbatch
from pcbatch.errors import OptionError
from pcbatch.fork_choice import choose_fork, lane_elements

H = 64


@pcbatch.autobatch
def fib(n):
    if n <= 1:
        return n
    return fib(n - 1) + fib(n - 2)


@pcbatch.autobatch(in_axes=(None, 0))
def vec_tree(w, n):
    """A recursion whose calls keep H-vectors (a Tree-RNN's shape of work)."""
    if n <= 1:
        return jnp.tanh(w[0] * n)
    return jnp.tanh(w @ (vec_tree(w, n - 1) + vec_tree(w, n - 2)))


def weights():
    return jnp.asarray(np.random.default_rng(0).normal(size=(H, H)) / H, jnp.float32)


def choice(f, *args, traced=False):
    if not traced:
        return f.executable(*args)[0].fork_choice
    box = []
    jax.eval_shape(lambda *a: box.append(f.executable(*a)[0].fork_choice), *args)
    return box[0]


def assert_agree(want, *calls):
    for call in calls:
        np.testing.assert_allclose(np.asarray(call()), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_scalar_recursion_does_not_fork():
    n = jnp.arange(9)
    c = choice(fib, n)
    assert c.fork is False and "little work" in c.reason
    assert not fib.executable(n)[0].prog.has_forks
    forked = fib.with_options(fork=True)
    assert forked.executable(n)[0].prog.has_forks
    assert_agree(fib.reference(n), lambda: fib(n), lambda: jax.jit(fib)(n), lambda: forked(n))


def test_vector_recursion_forks_at_small_batch_eagerly():
    n = jnp.array([3, 6, 1, 5, 4, 2, 6, 0])
    c = choice(vec_tree, weights(), n)
    assert c.fork is True, c.reason
    assert vec_tree.executable(weights(), n)[0].prog.has_forks
    # eagerly with forks; under jit without (next test): both equal the Python
    assert_agree(vec_tree.reference(weights(), n), lambda: vec_tree(weights(), n),
                 lambda: jax.jit(vec_tree)(weights(), n))


def test_traced_call_with_a_large_pool_does_not_fork():
    n = jnp.array([3, 6, 1, 5, 4, 2, 6, 0])
    c = choice(vec_tree, weights(), n, traced=True)
    assert c.fork is False and "afresh" in c.reason
    small = vec_tree.with_options(tuning=pcbatch.Tuning(fork_max_traced_pool_bytes=1 << 40))
    assert choice(small, weights(), n, traced=True).fork is True


def test_large_batch_does_not_fork():
    n = jnp.asarray(np.random.default_rng(1).integers(0, 6, 256))
    c = choice(vec_tree, weights(), n)
    assert c.fork is False and "too few lanes" in c.reason
    np.testing.assert_allclose(np.asarray(vec_tree(weights(), n)),
                               np.asarray(vec_tree.with_options(fork=True)(weights(), n)), rtol=1e-5, atol=1e-6)


def test_program_without_forks():
    @pcbatch.autobatch
    def count(n):
        return 0 if n == 0 else 1 + count(n - 1)

    n = jnp.array([0, 3, 5])
    assert choice(count, n).fork is False
    np.testing.assert_array_equal(np.asarray(count(n)), [0, 3, 5])


def test_rule_thresholds():
    """Each condition decides on its own (numbers straight into the rule)."""
    prog = vec_tree.with_options(fork=True).executable(weights(), jnp.arange(4))[0].prog
    assert lane_elements(prog) == H
    tuning = pcbatch.Tuning()
    args = dict(lanes=128 * 8, width=128, pool_bytes=1 << 20, traced=False, tuning=tuning)
    assert choose_fork(prog, 8, **args).fork
    # H elements x batch below the step threshold
    assert not choose_fork(prog, 8, **{**args, "tuning": pcbatch.Tuning(fork_min_step_elements=8 * H + 1)}).fork
    assert choose_fork(prog, 8, **{**args, "tuning": pcbatch.Tuning(fork_min_step_elements=8 * H)}).fork
    # too few lanes per example in a step, or in the pool
    assert not choose_fork(prog, 8, **{**args, "width": 8 * 16 - 1}).fork
    assert not choose_fork(prog, 8, **{**args, "lanes": 8 * 64 - 1}).fork
    # traced: the pool's size matters
    assert choose_fork(prog, 8, **{**args, "traced": True, "pool_bytes": tuning.fork_max_traced_pool_bytes}).fork
    assert not choose_fork(prog, 8, **{**args, "traced": True,
                                       "pool_bytes": tuning.fork_max_traced_pool_bytes + 1}).fork


@pytest.mark.parametrize("bad", ["yes", 1, None, "Auto"])
def test_fork_option_validated(bad):
    with pytest.raises(OptionError, match="fork"):
        pcbatch.autobatch(lambda n: n, fork=bad)


def test_pool_options_ask_for_the_pool():
    n = jnp.arange(6)
    for options in (dict(max_lanes=64), dict(lane_width=32)):
        f = fib.with_options(**options)
        assert choice(f, n).fork and choice(f, n, traced=True).fork
        assert f.executable(n)[0].prog.has_forks
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
    assert choice(fib2, n).fork is False and choice(fib2, n, traced=True).fork is False
