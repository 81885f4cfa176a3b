"""Programs whose per-lane state is large arrays (loop-carried, multiply written, stacked)."""
import jax
import jax.numpy as jnp
import numpy as np

import pcbatch

DIM = 96


@pcbatch.autobatch
def walk(x, n):
    """A loop whose [DIM] state is written by several blocks."""
    trail = jnp.zeros((8, DIM))
    i = 0
    while i < n:
        if i % 3 == 0:
            x = jnp.roll(x, 1) * 0.5 + 1.0
        else:
            x = x - jnp.mean(x)
        trail = trail.at[i % 8].set(x)
        i += 1
    return x, trail


@pcbatch.autobatch
def tree_sum(x, depth):
    """Recursion that saves a large value across calls."""
    if depth <= 0:
        return x
    left = tree_sum(x * 0.5, depth - 1)
    right = tree_sum(x + 1.0, depth - 2)
    return left + right * 0.25


def test_loop_with_large_registers_matches_python():
    x = jax.random.normal(jax.random.PRNGKey(0), (5, DIM))
    n = jnp.array([0, 1, 4, 9, 2])
    out, ref = walk(x, n), walk.reference(x, n)
    for a, b in zip(out, ref):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_recursion_with_large_stacked_values_matches_python():
    x = jax.random.normal(jax.random.PRNGKey(1), (4, DIM))
    d = jnp.array([0, 1, 3, 5])
    np.testing.assert_allclose(tree_sum(x, d), tree_sum.reference(x, d), rtol=1e-5, atol=1e-5)


@pcbatch.autobatch
def weighted_walk(table, start, n):
    """A large per-example input that no block writes, read in a loop."""
    i, acc = start, 0.0
    while n > 0:
        acc = acc + table[i % DIM]
        i = i * 3 + 1
        n -= 1
    return acc


def test_large_input_that_is_only_read_matches_python():
    table = jax.random.normal(jax.random.PRNGKey(2), (4, DIM))
    start, n = jnp.array([0, 5, 7, 2]), jnp.array([0, 3, 9, 1])
    np.testing.assert_allclose(weighted_walk(table, start, n), weighted_walk.reference(table, start, n),
                               rtol=1e-5, atol=1e-5)
