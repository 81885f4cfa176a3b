"""Schedules change speed, never answers: every corpus program under every
scheduler (the baselines, `returns_last` and a policy learned on the batch)
equals the original Python run per example, and every example finishes.

One lane per example here (`fork=False`: a compile per schedule is cheap);
forked programs and the models run under every schedule in
tests/fsm/test_program_schedules.py."""
from __future__ import annotations

import pytest

import pcbatch.fsm as fsm
from corpus import CASES  # tests/core is on sys.path (rootdir-less test dir)
from test_corpus import BATCH, assert_same

IDS = [c.name for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_every_schedule_gives_the_same_answers(case):
    f = case.fn.with_options(fork=False)
    args = case.args(case.batch(BATCH))
    want = case.fn.reference(*args)
    policy = fsm.learn(f, *args, trials=3, seed=0, progress=False)  # any policy will do: few trials
    for schedule in ("depth", "agenda", "returns_last", policy):
        got, status = f.with_schedule(schedule).checked(*args)
        assert not status.unfinished.any() and not status.overflow.any(), schedule
        assert_same(case, got, want)
