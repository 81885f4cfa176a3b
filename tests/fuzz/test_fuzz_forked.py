"""The random-program differential test (`test_fuzz.py`) with `fork=True`:
independent calls in lanes of their own, on a pool compiled at 1 or 2 lane
widths. A file of its own so that xdist runs it beside `test_fuzz.py`."""
from __future__ import annotations

import sys

from .generator import SMALL
from .test_fuzz import _examples, _run


def test_fuzz_forked_programs():
    """`make test`: a fixed set of 100 random programs (or `PCBATCH_FUZZ_EXAMPLES`) with fork=True."""
    n = _examples(100)
    ran = _run(n, SMALL, forks=(True,))
    print(f"fuzz (fork=True): {ran} programs", file=sys.stderr)
    assert ran >= n, f"only {ran} of {n} generated programs ran"
