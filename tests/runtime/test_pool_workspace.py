"""The fork-join pool runs in its donated workspace: every per-lane array of
its state (registers, lane table, queues, free list, stacks) is the previous
eager call's, not zero-filled. Nothing may leak from one call into the next."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import pcbatch


@pcbatch.autobatch(fork=True)
def tree_sum(n, x):
    """A binary recursion whose leaves read a register set only on their own path."""
    if n <= 0:
        return x
    return tree_sum(n - 1, x * 2.0) + tree_sum(n - 2, x + 1.0)


def test_calls_on_one_workspace_give_the_per_example_results():
    f = tree_sum.with_options(max_steps=100_000)
    batches = [(jnp.array([6, 1, 4, 0, 7]), jnp.array([0.5, -1.0, 2.0, 3.0, 0.25])),
               (jnp.array([0, 0, 0, 0, 0]), jnp.array([9.0, 8.0, 7.0, 6.0, 5.0])),
               (jnp.array([7, 6, 5, 3, 2]), jnp.array([1.0, 1.0, -2.0, 0.0, 4.0]))]
    for n, x in batches + batches[::-1]:
        np.testing.assert_allclose(f(n, x), tree_sum.reference(n, x), rtol=1e-6)
        exe, _ = f.executable(n, x)
        assert exe.workspace is not None   # kept, and donated to the next call


@pcbatch.autobatch(fork=True, max_stack_depth=6)
def depth_sum(n):
    if n <= 0:
        return 1.0
    return depth_sum(n - 1) + depth_sum(n - 3)


def test_an_example_that_overflows_reads_zero_not_an_earlier_calls_value():
    ok = jnp.array([3, 4, 2])
    f = depth_sum.with_options(max_lanes=3)   # no free lanes: calls run in their caller's lane, n frames deep
    np.testing.assert_allclose(f(ok), depth_sum.reference(ok))
    out, status = f.checked(jnp.array([3, 40, 2]))
    np.testing.assert_array_equal(np.asarray(status.overflow), [False, True, False])
    np.testing.assert_allclose(np.asarray(out)[[0, 2]], depth_sum.reference(jnp.array([3, 2])))
    assert float(out[1]) == 0.0


def test_a_calls_temporary_memory_does_not_grow_with_the_pool():
    # A fresh allocation per call that grows with the pool is mapped and zero-filled page by page on every call.
    n, x = jnp.arange(4), jnp.ones(4)
    temp = {}
    for lanes in (1024, 16384):
        f = tree_sum.with_options(max_lanes=lanes, max_stack_depth=8)
        f(n, x)
        exe, inputs = f.executable(n, x)
        temp[lanes] = exe.lean_runner.lower(inputs, exe.workspace).compile().memory_analysis().temp_size_in_bytes
    assert temp[16384] < temp[1024] + 64 * 1024, temp
