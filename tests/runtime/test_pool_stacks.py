"""Where the stack budget caps the lane pool, eager calls first run with
shallow per-lane stacks
(`Tuning.pool_first_stack_depth`: more lanes in the same memory) and again
with `max_stack_depth` only if a lane overflowed. Either way the result is the
per-example Python's."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pcbatch
from pcbatch import call
from pcbatch.compile import frame_bytes


@pcbatch.autobatch(fork=True)
def leaves(n):
    """2**n leaves, counted by a binary recursion n deep."""
    if n <= 0:
        return 1
    return leaves(n - 1) + leaves(n - 1)


def shallow(f):
    """The `pcbatch.call.Function` (`f` on shallow stacks) its eager calls ran, or None."""
    copies = f._cache.of_kind("shallow")
    assert len(copies) <= 1
    return copies[0] if copies else None


def capped(fn, lanes_per_example: int, first_depth: int):
    """`fn` whose default pool the stack budget caps at `lanes_per_example` lanes per example."""
    x = jnp.arange(4)
    prog = fn.lowered(x)
    budget = frame_bytes(prog) * fn.max_stack_depth * lanes_per_example * len(x)
    return fn.with_options(tuning=pcbatch.Tuning(pool_stack_bytes=budget, pool_first_stack_depth=first_depth))


def test_shallow_stacks_buy_lanes_where_the_budget_caps_the_pool():
    x = jnp.array([3, 5, 6, 4])
    f = capped(leaves, lanes_per_example=2, first_depth=16)   # 8 lanes at depth 64; 32 at depth 16
    for _ in range(2):   # the first call too
        out, status = f.checked(x)
        np.testing.assert_array_equal(out, 2 ** np.asarray(x))
        np.testing.assert_array_equal(out, leaves.reference(x))
        assert not np.any(np.asarray(status.overflow))
        assert int(np.max(np.asarray(status.peak_lanes))) > 8   # more than the full-depth pool holds
    np.testing.assert_array_equal(f(x), 2 ** np.asarray(x))
    assert shallow(f).options.max_stack_depth == 16 and f.executable(x)[0].shallow_misses == 0


def test_a_rare_overflow_does_not_stop_the_shallow_runs_but_frequent_ones_do():
    """One function (its shallow and full machines compile once): first a rare overflow,
    then enough that the shallow runs stop (more than one in eight overflowed)."""
    small, deep = jnp.array([1, 0, 2, 1]), jnp.array([10, 9, 2, 10])
    f = capped(leaves, lanes_per_example=2, first_depth=3)
    for _ in range(8):
        np.testing.assert_array_equal(f(small), 2 ** np.asarray(small))
    np.testing.assert_array_equal(f(deep), 2 ** np.asarray(deep))   # overflowed shallow, ran again on full stacks
    exe = f.executable(small)[0]
    assert (exe.shallow_tries, exe.shallow_misses) == (9, 1) and exe.shallow_depth == 3
    np.testing.assert_array_equal(f(small), 2 ** np.asarray(small))
    assert exe.shallow_tries == 10
    # A lane that overflows the shallow stacks reruns on full ones. The pool (2 lanes per
    # example at full depth) runs out at once: calls fall back to running in their caller's
    # lane, 10 frames deep: more than 3.
    out, status = f.checked(deep)
    assert not np.any(np.asarray(status.overflow))
    np.testing.assert_array_equal(out, leaves.reference(deep))
    assert shallow(f).options.max_stack_depth == 3
    on_shallow = call.checked(shallow(f), shallow(f).bind((deep,), {}))[1]
    assert np.all(np.asarray(on_shallow.overflow)[[0, 1, 3]])   # they did overflow
    assert (exe.shallow_tries, exe.shallow_misses) == (11, 2)
    assert exe.shallow_depth == 0   # 2 of 11 overflowed: shallow runs are not tried again
    for _ in range(2):
        np.testing.assert_array_equal(f(deep), 2 ** np.asarray(deep))
        np.testing.assert_array_equal(f(small), 2 ** np.asarray(small))
    assert exe.shallow_tries == 11


def test_a_pool_the_budget_does_not_cap_stays_as_it_is():
    x = jnp.array([1, 0, 1, 0])
    f = leaves.with_options(tuning=pcbatch.Tuning(lanes_per_example=4, pool_first_stack_depth=16))
    for _ in range(2):
        np.testing.assert_array_equal(f(x), 2 ** np.asarray(x))
    assert shallow(f) is None


def test_no_shallow_run_under_jit_or_with_max_lanes():
    """A traced call cannot run twice: it keeps `max_stack_depth` frames per lane (as does an explicit pool)."""
    x = jnp.array([10, 9, 2, 10])
    f = capped(leaves, lanes_per_example=2, first_depth=3)
    for _ in range(2):
        np.testing.assert_array_equal(jax.jit(f)(x), 2 ** np.asarray(x))
    assert shallow(f) is None
    g = f.with_options(max_lanes=8)
    for _ in range(2):
        np.testing.assert_array_equal(g(x), 2 ** np.asarray(x))
    assert shallow(g) is None


@pytest.mark.parametrize("name, first_depth", [
    # Two machines (shallow and full) per program: `make test` runs the program with two
    # functions' stacks (test_fork.py's test_program runs it only in `make test-matrix`); fib
    # (test_program runs it) and a third program are `matrix` rows, as shallow stacks that
    # mostly overflow and rerun (`leaves`: test_a_rare_overflow_does_not_stop_the_shallow_runs...).
    pytest.param("fib", 2, marks=pytest.mark.matrix), ("mutual_recursion", 6),
    pytest.param("fork_in_while_loop", 2, marks=pytest.mark.matrix),
    pytest.param("other_callees_and_tail_call", 2, marks=pytest.mark.slow),
    pytest.param("other_callees_and_tail_call", 6, marks=pytest.mark.slow)])
def test_fork_programs_on_shallow_stacks(name, first_depth):
    """test_fork.py's programs on a pool the budget caps at 2 lanes per example:
    the later calls take the shallow stacks (2 frames: most overflow and rerun;
    6: some do), and every call gives the per-example Python's results."""
    from tests.runtime.test_fork import PROGRAMS, assert_same

    fn, args, _ = PROGRAMS[name]
    budget = frame_bytes(fn.with_options(fork=True).lowered(*args)) * fn.max_stack_depth * 2 * len(args[0])
    f = fn.with_options(fork=True, tuning=pcbatch.Tuning(pool_stack_bytes=budget, pool_first_stack_depth=first_depth))
    want = fn.reference(*args)
    for _ in range(3):
        out, status = f.checked(*args)
        assert not np.any(np.asarray(status.overflow)) and not np.any(np.asarray(status.unfinished))
        assert_same(out, want, name)
    assert shallow(f).options.max_stack_depth == first_depth
