"""The random-program differential test (`test_fuzz.py`) with `fork=True`:
independent calls in lanes of their own, on a pool compiled at 1 or 2 lane
widths. A file of its own so that xdist runs it beside `test_fuzz.py`."""
from __future__ import annotations

import sys

import pytest

from .generator import SMALL
from .test_fuzz import CHUNKS, _examples, _run


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_fuzz_forked_programs(chunk):
    """`make test`: 4 x 3 fixed random programs (or `PCBATCH_FUZZ_EXAMPLES` in all) with fork=True
    (3, not 25: a pool compiles in ~1.4 s cold, and `make test` must stay under 8 minutes on CI, where
    it took 458 s with 20, 471 s with 15, 436 s with 12, 485 s with 10 and 571 s with 7, with more
    tests each time; `make fuzz` runs thousands)."""
    n = -(-_examples(12) // CHUNKS)
    ran = _run(n, SMALL, forks=(True,), chunk=CHUNKS + chunk)
    print(f"fuzz (fork=True): {ran} programs", file=sys.stderr)
    assert ran >= n, f"only {ran} of {n} generated programs ran"
