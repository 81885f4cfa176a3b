"""Schedules change speed, never answers: every corpus program under every
scheduler (the baselines, `returns_last` and a policy learned on the batch)
equals the original Python run per example, and every example finishes.

One lane per example here (`fork=False`: a compile per schedule is cheap);
forked programs and the models run under every schedule in
tests/fsm/test_program_schedules.py.

Each schedule costs a compile per program, so `make test` runs each program
that makes calls (where the schedules differ most: which frames wait, which
return first) under one of the four, in turn: every schedule meets six or seven
of them. Every program, the loop-only ones included, runs under the default
schedule in test_corpus.py; `make test-matrix` runs the other cells."""
from __future__ import annotations

import pytest

import pcbatch
import pcbatch.fsm as fsm
from corpus import CASES  # tests/core is on sys.path (rootdir-less test dir)
from test_corpus import assert_same, divergent_reference

SCHEDULES = ("depth", "returns_last", "agenda", "policy")
BATCH = 7  # the divergent examples cycled: a policy is learned on them


def _makes_calls(case) -> bool:
    """Whether the program calls an autobatched function (itself or another)."""
    names = case.fn.fn.__code__.co_names
    return any(isinstance(case.fn.fn.__globals__.get(name), pcbatch.Autobatched) for name in names)


def _rows():
    calling = [case for case in CASES if _makes_calls(case)]
    for case in CASES:
        k = calling.index(case) if case in calling else None
        for j, schedule in enumerate(SCHEDULES):
            marks = () if k is not None and j == k % len(SCHEDULES) else (pytest.mark.matrix,)
            yield pytest.param(case, schedule, marks=marks, id=f"{case.name}-{schedule}")


@pytest.mark.parametrize("case, schedule", list(_rows()))
def test_every_schedule_gives_the_same_answers(case, schedule):
    f = case.fn.with_options(fork=False)
    args = case.args(case.batch(BATCH))
    want = divergent_reference(case, [i % len(case.divergent) for i in range(BATCH)])
    if schedule == "policy":
        schedule = fsm.learn(f, *args, trials=3, seed=0, progress=False)  # any policy will do: few trials
    got, status = f.with_schedule(schedule).checked(*args)
    assert not status.unfinished.any() and not status.overflow.any(), schedule
    assert_same(case, got, want)


class _Wayward:
    """A user's scheduler that answers wrong every third step (out of range, or a block no lane
    waits at): the answers in `bad` in turn."""

    def __init__(self, *bad):
        self.bad = bad

    def init(self, num_blocks, num_lanes):
        import jax.numpy as jnp
        return jnp.zeros((), jnp.int32)

    def choose(self, step, frontier):
        import jax.numpy as jnp
        block = fsm.Earliest().choose((), frontier)[0]
        turn = (step // 3) % len(self.bad)
        for k, bad in enumerate(self.bad):
            wrong = jnp.argmax(frontier.counts == 0) if bad == "idle" else bad
            block = jnp.where((step % 3 == 2) & (turn == k), wrong, block)
        return block.astype(jnp.int32), step + 1


# Each cell compiles a machine: `make test` runs each pool once, its scheduler answering two of
# the wrong blocks in turn (negative answers and idle blocks on the fork-join pool, where they
# broke it); `make test-matrix` runs each wrong answer alone on each pool.
_WAYWARD = [pytest.param(True, (-1, "idle"), id="-1+idle-True"), pytest.param(False, (-4, 999), id="-4+999-False")]
_WAYWARD += [pytest.param(fork, (bad,), id=f"{bad}-{fork}", marks=pytest.mark.matrix)
             for fork in (False, True) for bad in (-4, -1, 999, "idle")]


@pytest.mark.parametrize("fork, bad", _WAYWARD)
def test_a_user_scheduler_answering_a_wrong_block_cannot_change_results(fork, bad):
    """Found by trying users' schedulers: on the fork-join pool a negative answer read the
    queues from their end while the block switch clamped it (fib returned 17 for 2), and a
    block without lanes repeated forever. Wrong answers now run the earliest ready block."""
    import jax.numpy as jnp
    import numpy as np
    import pcbatch

    @pcbatch.autobatch(fork=fork)
    def fib(n):
        return n if n <= 1 else fib(n - 1) + fib(n - 2)

    n = jnp.array([3, 7, 4, 5, 9, 1, 0, 6])
    np.testing.assert_array_equal(fib.with_schedule(_Wayward(*bad))(n), fib.reference(n))


def test_a_user_scheduler_breaking_its_contract_is_a_named_error():
    import jax.numpy as jnp
    import pcbatch

    @pcbatch.autobatch(fork=False)
    def fib(n):
        return n if n <= 1 else fib(n - 1) + fib(n - 2)

    class Answer:
        follow = ()

        def __init__(self, how):
            self.how = how

        def init(self, num_blocks, num_lanes):
            return () if self.how != "carry dtype" else jnp.int32(0)

        def choose(self, carry, frontier):
            block = fsm.Earliest().choose((), frontier)[0]
            if self.how == "carry dtype":
                return block, carry + 0.5
            return {"float": (block.astype(jnp.float32), carry), "vector": (block[None], carry),
                    "none": None, "carry": (block, None), "huge": (2 ** 40, carry)}[self.how]

    n = jnp.array([3, 5])
    for how, says in [("float", "integer scalar"), ("vector", "integer scalar"), ("none", r"\(block, carry\)"),
                      ("carry", "its carry in the structure"), ("carry dtype", r"was int32\[\], choose returned float")]:
        with pytest.raises(pcbatch.OptionError, match=says):
            fib.with_schedule(Answer(how))(n)
    # A Python int past int32 is out of range like any other (it raised numpy's OverflowError).
    assert fib.with_schedule(Answer("huge"))(n).tolist() == [2, 5]
    far = Answer("float")
    far.follow = (99,)
    with pytest.raises(pcbatch.OptionError, match=r"follow names blocks \[99\]"):
        fib.with_schedule(far)(n)


# Both machines take the bound from one place (`compile.machine_config`): `make test` runs
# the default (one lane per example here), `make test-matrix` the fork-join pool too.
@pytest.mark.parametrize("fork", ["auto", pytest.param(True, marks=pytest.mark.matrix)])
def test_max_steps_past_the_step_counter_is_no_bound(fork):
    """`max_steps=2**31` overflowed the int32 step counter (JAX's OverflowError)."""
    import jax.numpy as jnp
    import numpy as np
    import pcbatch

    @pcbatch.autobatch(max_steps=2 ** 31, fork=fork)
    def fib(n):
        return n if n <= 1 else fib(n - 1) + fib(n - 2)

    n = jnp.array([3, 7])
    np.testing.assert_array_equal(fib(n), fib.reference(n))
