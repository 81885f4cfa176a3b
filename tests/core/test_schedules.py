"""Schedules change speed, never answers: every corpus program under every
scheduler (the baselines, `returns_last` and a policy learned on the batch)
equals the original Python run per example, and every example finishes.

One lane per example here (`fork=False`: a compile per schedule is cheap);
forked programs and the models run under every schedule in
tests/fsm/test_program_schedules.py.

Each schedule costs a compile per program, so `make test` runs each program
under two of the four (alternating: every schedule still meets half the
corpus); `make test-matrix` runs the other two."""
from __future__ import annotations

import pytest

import pcbatch.fsm as fsm
from corpus import CASES  # tests/core is on sys.path (rootdir-less test dir)
from test_corpus import BATCH, assert_same

PAIRS = (("depth", "returns_last"), ("agenda", "policy"))


def _rows():
    for k, case in enumerate(CASES):
        for j, pair in enumerate(PAIRS):
            marks = () if j == k % 2 else (pytest.mark.matrix,)
            yield pytest.param(case, pair, marks=marks, id=f"{case.name}-{'+'.join(pair)}")


@pytest.mark.parametrize("case, schedules", list(_rows()))
def test_every_schedule_gives_the_same_answers(case, schedules):
    f = case.fn.with_options(fork=False)
    args = case.args(case.batch(BATCH))
    want = case.fn.reference(*args)
    for schedule in schedules:
        if schedule == "policy":
            schedule = fsm.learn(f, *args, trials=3, seed=0, progress=False)  # any policy will do: few trials
        got, status = f.with_schedule(schedule).checked(*args)
        assert not status.unfinished.any() and not status.overflow.any(), schedule
        assert_same(case, got, want)
