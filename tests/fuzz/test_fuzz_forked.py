"""The random-program differential test (`test_fuzz.py`) with `fork=True`:
independent calls in lanes of their own, on a pool compiled at 1 or 2 lane
widths. A file of its own so that xdist runs it beside `test_fuzz.py`."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

import pcbatch

from .generator import LARGE, SMALL
from .test_fuzz import CHUNKS, _examples, _run


@pytest.mark.parametrize("chunk", [c if c < 2 else pytest.param(c, marks=pytest.mark.matrix) for c in range(CHUNKS)])
def test_fuzz_forked_programs(chunk):
    """`make test`: 2 x 2 fixed random programs (`make test-matrix`: 2 more chunks; or
    `PCBATCH_FUZZ_EXAMPLES` in all) with fork=True:
    hypothesis' simplest (an empty batch), then one random program (2, not 25: a pool compiles in
    ~1.4 s cold, and `make test` must stay under 8 minutes on CI, where it took 458 s with 20, 471 s
    with 15, 436 s with 12, 485 s with 10 and 571 s with 7, with more tests each time; `make fuzz`
    runs thousands)."""
    n = -(-_examples(8) // CHUNKS)
    ran = _run(n, SMALL, forks=(True,), chunk=CHUNKS + chunk)
    print(f"fuzz (fork=True): {ran} programs", file=sys.stderr)
    assert ran >= n, f"only {ran} of {n} generated programs ran"


def masked_pool(fn):
    """`fn` with the pool's updates masked instead of under conditionals (`Tuning.masked_pool_updates`,
    the GPU's default)."""
    return fn.with_options(tuning=pcbatch.Tuning(masked_pool_updates=True))


def test_fuzz_forked_masked_pool_updates():
    """`make test`: 2 fixed random programs (the simplest, then one random) with fork=True and the
    pool's updates masked."""
    n = max(1, _examples(32) // 16)
    ran = _run(n, SMALL, forks=(True,), chunk=30, adapt=masked_pool)
    assert ran >= n, f"only {ran} of {n} generated programs ran"


@pytest.mark.slow
def test_fuzz_forked_masked_pool_updates_long():
    """`make fuzz`: PCBATCH_FUZZ_EXAMPLES / 10 large programs with fork=True and masked pool updates."""
    n = max(1, _examples(10_000) // 10)
    ran = _run(n, LARGE, forks=(True,), chunk=31, adapt=masked_pool)
    assert ran >= n, f"only {ran} of {n} generated programs ran"


def test_masked_pool_updates_leave_one_conditional_a_step():
    """With `masked_pool_updates=True` a pool step holds no conditional but its
    block switch (XLA:GPU syncs with the host on every one); the same results."""
    import jax
    import jax.numpy as jnp

    sys.path.insert(0, str(Path(__file__).parents[2]))
    from benchmarks.common import hlo_step_counts
    sys.path.insert(0, str(Path(__file__).parents[1] / "core"))
    from corpus import fib

    x = jnp.arange(9)
    conds = {}
    for masked in (False, True):
        f = fib.with_options(fork=True, tuning=pcbatch.Tuning(masked_pool_updates=masked))
        compiled = jax.jit(f).lower(x).compile()
        conds[masked] = hlo_step_counts(compiled.as_text())["every step"]["conditional"]
        # The results of the program counted (an eager call would compile it once more).
        assert [int(v) for v in compiled(x)] == [int(v) for v in fib.reference(x)]
    assert conds[True] == 1 < conds[False], conds
