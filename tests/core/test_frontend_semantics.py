"""Python semantics the frontend must keep (each compared with the original Python
run one example at a time, `f.reference`), under both machines."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pcbatch


def same(got, want):
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def check(fn, *args, fork):
    f = pcbatch.autobatch(fn, fork=fork)
    same(f(*args), f.reference(*args))


FORKS = pytest.mark.parametrize("fork", [False, True])


# --- keyword arguments are flattened like positional ones ---------------------

def add(a, b):
    return a + b


@pcbatch.autobatch
def kw_fib(n):
    if n < 2:
        return n
    return add(a=kw_fib(n - 1), b=kw_fib(n - 2))  # autobatched calls in a plain helper's keywords


def kw_boolops(x, y):
    d = dict(b=y or 7, c=x and y)
    return add(a=x, b=y or 7) + add(x, b=y if x > 1 else -y) + d["b"] + d["c"]


@FORKS
def test_keyword_arguments_are_flattened(fork):
    x, y = jnp.array([1, 2, 3, 0]), jnp.array([0, 5, 9, 4])
    check(kw_boolops, x, y, fork=fork)
    f = kw_fib.with_options(fork=fork)
    n = jnp.array([0, 1, 5, 7])
    same(f(n), kw_fib.reference(n))
