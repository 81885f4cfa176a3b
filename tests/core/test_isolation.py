"""Lane isolation: a NaN, an inf or an integer overflow in one example leaves
every other example's result bit-identical to running the batch without it."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

import pcbatch

SETTINGS = settings(max_examples=5, phases=(Phase.explicit, Phase.generate))


@pcbatch.autobatch
def float_chain(x, n):
    """NaN / inf reach comparisons that steer control flow, and a loop count."""
    acc = 0.0
    for i in range(n):
        if acc > 10.0 * i:
            acc = acc - x
        else:
            acc = acc + x * i
    k = 0
    while k < n and not (acc < -1e6):
        k += 1
    return acc, jnp.sqrt(jnp.abs(acc)), k


@pcbatch.autobatch
def float_rec(x, n):
    """NaN / inf flowing through recursion (stacked values)."""
    if n <= 0:
        return x
    y = float_rec(x * 0.5, n - 1)
    return y + x if x > 0 else y - 1.0


@pcbatch.autobatch
def factorial(n):
    """int32 overflow for n >= 13."""
    if n <= 1:
        return 1
    return n * factorial(n - 1)


@pcbatch.autobatch
def hash_loop(n, seed):
    """int32 wrap-around inside a loop; the wrapped value steers a branch."""
    h = seed
    for i in range(n):
        h = h * 100003 + i
        if h < 0:
            h = h + 7
    return h


def bits(x):
    x = np.asarray(x)
    return x.view(np.uint32) if x.dtype == np.float32 else x


def assert_isolated(f, args_with, bad_index):
    """Results of all examples but `bad_index` equal (bit for bit) those of the
    batch without it; the bad example's own result equals the reference."""
    full = f(*args_with)
    without = tuple(np.delete(a, bad_index, axis=0) for a in args_with)
    alone = f(*without)
    for leaf_full, leaf_alone in zip(jax.tree_util.tree_leaves(full), jax.tree_util.tree_leaves(alone)):
        np.testing.assert_array_equal(bits(np.delete(np.asarray(leaf_full), bad_index, axis=0)), bits(leaf_alone))
    ref = f.reference(*args_with)
    for leaf_full, leaf_ref in zip(jax.tree_util.tree_leaves(full), jax.tree_util.tree_leaves(ref)):
        np.testing.assert_allclose(np.asarray(leaf_full)[bad_index], np.asarray(leaf_ref)[bad_index], rtol=1e-6)
    return full


BAD_FLOATS = [np.nan, np.inf, -np.inf]


@pytest.mark.parametrize("bad", BAD_FLOATS, ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("f", [float_chain, float_rec], ids=["loop", "recursion"])
@SETTINGS
@given(xs=st.lists(st.floats(-5, 5, width=32), min_size=5, max_size=5),
       ns=st.lists(st.integers(0, 12), min_size=6, max_size=6),
       where=st.integers(0, 5))
def test_nonfinite_float_is_isolated(f, bad, xs, ns, where):
    xs = list(xs)
    xs.insert(where, bad)
    full = assert_isolated(f, (np.asarray(xs, np.float32), np.asarray(ns, np.int32)), where)
    if f is float_chain and ns[where] > 0 and np.isnan(bad):
        assert np.isnan(np.asarray(full[0])[where])  # the bad value really went through


@SETTINGS
@given(ns=st.lists(st.integers(0, 12), min_size=5, max_size=5), big=st.integers(13, 40), where=st.integers(0, 5))
def test_integer_overflow_in_recursion_is_isolated(ns, big, where):
    ns = list(ns)
    ns.insert(where, big)
    full = assert_isolated(factorial, (np.asarray(ns, np.int32),), where)
    # 13! = 6227020800 does not fit in int32: the value wrapped (and equals the
    # reference's int32 arithmetic, checked above), so it is not 13!.
    if big == 13:
        assert int(np.asarray(full)[where]) == np.int64(6227020800).astype(np.int32)


@SETTINGS
@given(ns=st.lists(st.integers(0, 3), min_size=4, max_size=4), seeds=st.lists(st.integers(-9, 9), min_size=4, max_size=4),
       big=st.integers(5, 30), where=st.integers(0, 4))
def test_integer_overflow_in_loop_is_isolated(ns, seeds, big, where):
    ns, seeds = list(ns), list(seeds)
    ns.insert(where, big)
    seeds.insert(where, 123456)
    assert_isolated(hash_loop, (np.asarray(ns, np.int32), np.asarray(seeds, np.int32)), where)


def test_all_bad_kinds_together():
    """NaN, inf and overflow examples in one batch, interleaved with good ones."""
    xs = np.asarray([1.0, np.nan, 2.0, np.inf, -1.5, -np.inf, 0.25], np.float32)
    ns = np.asarray([3, 5, 0, 7, 12, 2, 9], np.int32)
    good = [0, 2, 4, 6]
    full = float_chain(xs, ns)
    alone = float_chain(xs[good], ns[good])
    for a, b in zip(full, alone):
        np.testing.assert_array_equal(bits(np.asarray(a)[good]), bits(b))
    facts = factorial(np.asarray([5, 30, 3, 20, 0, 13, 10], np.int32))
    # 5! = 120, 3! = 6, 0! = 1, 10! = 3628800
    np.testing.assert_array_equal(np.asarray(facts)[[0, 2, 4, 6]], [120, 6, 1, 3628800])
