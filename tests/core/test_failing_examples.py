"""One failing example among good ones: only it is flagged, the others stay
exact (under every scheduler, eager and under jit), and the error comes fast."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pcbatch

SCHEDULES = ["auto", "earliest", "returns_last", "depth", "agenda"]


def runaway_py(x, n):
    """Sums x over a recursion of depth n; n < 0 loops forever."""
    while n < 0:
        x = x + 1.0
    if n == 0:
        return x
    return x + runaway_py(x * 0.5, n - 1)


X = jnp.asarray([1.0, 2.0, 3.0, 4.0])
N = jnp.asarray([3, -1, 0, 5])   # example 1 never finishes
GOOD = np.asarray([True, False, True, True])


def expected():
    return np.asarray([runaway_py(float(x), int(n)) if ok else np.nan for x, n, ok in zip(X, N, GOOD)])


# Each cell compiles two machines (jit of checked, jit), and the default schedule's a third, the
# eager call that raises (the error is read from the run's status, whichever schedule ran it):
# `make test` runs the default schedule on both pools and every other schedule on one
# (alternating), and `make test-matrix` the other cells.
_RUNAWAY_CELLS = {("auto", False), ("auto", True), ("earliest", True), ("returns_last", False), ("depth", True),
                  ("agenda", False)}


@pytest.mark.parametrize("schedule, fork", [
    pytest.param(schedule, fork, id=f"{'fork' if fork else 'plain'}-{schedule}",
                 marks=() if (schedule, fork) in _RUNAWAY_CELLS else (pytest.mark.matrix,))
    for fork in (False, True) for schedule in SCHEDULES])
def test_one_runaway_example_is_the_only_one_flagged(schedule, fork):
    f = pcbatch.autobatch(runaway_py, max_steps=400, schedule=schedule, fork=fork, max_lanes=64)
    out, status = jax.jit(f.checked)(X, N)
    np.testing.assert_array_equal(np.asarray(status.unfinished), ~GOOD)
    np.testing.assert_allclose(np.asarray(out)[GOOD], expected()[GOOD])
    poisoned = jax.jit(f)(X, N)  # inside jit: NaN for the flagged example only
    np.testing.assert_allclose(np.asarray(poisoned), expected())
    if schedule == "auto":
        with pytest.raises(pcbatch.MaxStepsExceededError) as info:
            f(X, N)
        assert info.value.examples == [1]


def deep_py(n):
    return 0 if n <= 0 else 1 + deep_py(n - 1)


@pytest.mark.parametrize("fork", [False, True], ids=["plain", "fork"])
def test_stack_overflow_is_flagged_alone_and_raised_fast(fork):
    f = pcbatch.autobatch(deep_py, max_stack_depth=8, fork=fork, max_lanes=16)
    n = jnp.asarray([3, 50, 5, 100_000, 2])
    out, status = f.checked(n)
    np.testing.assert_array_equal(np.asarray(status.overflow), [False, True, False, True, False])
    np.testing.assert_array_equal(np.asarray(out)[[0, 2, 4]], [3, 5, 2])
    with pytest.raises(pcbatch.StackOverflowError) as info:
        f(n)
    assert info.value.examples == [1, 3]
    assert info.value.needed[1] == "max_stack_depth=51"
    # The replay that explains the error is bounded (it used to run for a minute).
    assert info.value.needed[3] == "more than 1024 (runaway recursion?)"
    # A small max_stack_depth still finds what a deeper example needs (101 frames against 4).
    with pytest.raises(pcbatch.StackOverflowError) as info:
        f.with_options(max_stack_depth=4)(jnp.asarray([1, 100]))
    assert info.value.needed[1] == "max_stack_depth=101"


def checked_depth_py(n):
    assert n >= 0
    return 0 if n == 0 else 1 + checked_depth_py(n - 1)


def test_an_example_error_names_the_examples_that_overflowed_too():
    """ExampleError is raised first; its hint said every other example's result was computed,
    also for examples that overflowed max_stack_depth (garbage, not computed)."""
    f = pcbatch.autobatch(checked_depth_py, max_stack_depth=3, fork=False)
    n = [2, 9, -1, 1]
    with pytest.raises(pcbatch.ExampleError, match=r"except example 1, which overflowed max_stack_depth=3") as info:
        f(jnp.asarray(n))
    assert info.value.examples == [2]


def runaway_after_calls(n):
    """(98 + n - 1, n > 5); n == 7 loops forever after its calls returned (their value is
    in the return slot when the machine stops)."""
    if n <= 1:
        return 98, False
    x, _ = runaway_after_calls(n - 1)
    x = x + 1
    while n == 7:
        x = x + 1
    return x, n > 5


@pytest.mark.parametrize("fork", [False, True], ids=["plain", "fork"])
def test_int_and_bool_results_of_a_failed_example_are_zero_under_jit(fork):
    f = pcbatch.autobatch(runaway_after_calls, max_steps=80, fork=fork)
    count, big = jax.jit(f)(jnp.asarray([3, 7, 6]))
    np.testing.assert_array_equal(np.asarray(count), [100, 0, 103])
    np.testing.assert_array_equal(np.asarray(big), [False, False, True])
