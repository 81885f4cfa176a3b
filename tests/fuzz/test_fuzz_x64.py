"""The random-program differential test under `jax_enable_x64` (issue 16,
item 2): autobatched result == per-example Python with int64 and float64
inputs.

The programs come from `generator.py` unchanged; its inputs (int32, float32)
are converted here to int64 / float64, and each program runs inside
`jax.enable_x64(True)`, so both the machine and the Python oracle
(`.reference`) compute in 64 bits. Besides the values (as `test_fuzz.py`
compares them), no result leaf may be narrower than the oracle's: a 32-bit
leaf would mean the machine narrowed a value (a wider one is the join of the
program's paths, as the README documents).

`test_fuzz_x64_programs` runs `PCBATCH_FUZZ_X64_EXAMPLES` programs (default 2)
in `make test`; `test_fuzz_x64_long` (marked slow) runs the same variable's
count (default 1,000) under `make fuzz`. Fork-join programs compile slowly,
hence the modest counts.
"""
from __future__ import annotations

import dataclasses
import os
import sys

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from .generator import LARGE, SMALL, FuzzCase, fuzz_cases
from .test_fuzz import _load, _mismatch, _unload, configured


def _x64_on():
    if hasattr(jax, "enable_x64") and callable(jax.enable_x64):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64  # pragma: no cover - older JAX

    return enable_x64()


def to_x64(case: FuzzCase) -> FuzzCase:
    """The same case with int64 / float64 inputs."""
    def widen(x):
        x = np.asarray(x)
        if np.issubdtype(x.dtype, np.integer):
            return x.astype(np.int64)
        if np.issubdtype(x.dtype, np.floating):
            return x.astype(np.float64)
        return x
    return dataclasses.replace(case, inputs=tuple(widen(x) for x in case.inputs))


def check_case_x64(case: FuzzCase) -> None:
    case = to_x64(case)
    # The module is imported with x64 on too, as an x64 program is: its constants
    # (`TABLE = jnp.array([...])`) int64. Made with x64 off they are int32, and a
    # Python int joined with them takes int32 (JAX's promotion; the case is
    # `test_x64.py::test_python_number_beside_a_narrower_value`).
    with _x64_on():
        module = _load(case.source)
    try:
        with _x64_on():
            fn = configured(getattr(module, case.entry), case)
            ref = fn.reference(*case.inputs)
            try:
                out = fn(*case.inputs)
            except Exception as e:
                raise AssertionError(f"pcbatch raised {type(e).__name__} under x64\n" + case.describe()) from e
        problem = _mismatch(out, ref)
        if problem is None:
            for k, (o, r) in enumerate(zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(ref))):
                # pcbatch types a value by the join of every path's type, Python by the path
                # taken: wider is documented, narrower would lose bits.
                od, rd = np.asarray(o).dtype, np.asarray(r).dtype
                if np.promote_types(od, rd) != od:
                    problem = f"leaf {k}: dtype {od} is narrower than the reference's {rd}"
                    break
        if problem:
            raise AssertionError(f"pcbatch disagrees with the reference under x64: {problem}\n" + case.describe())
    finally:
        _unload(module)


def _run(n: int, max_stmts: int) -> int:
    count = [0]
    options = dict(max_examples=n, database=None, report_multiple_bugs=False,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                          HealthCheck.large_base_example])

    def prop(case: FuzzCase) -> None:
        check_case_x64(case)
        count[0] += 1
        if count[0] % 200 == 0:
            jax.clear_caches()

    settings(**options)(given(fuzz_cases(max_stmts))(prop))()
    return count[0]


def _examples(default: int) -> int:
    return int(os.environ.get("PCBATCH_FUZZ_X64_EXAMPLES", default))


def test_to_x64_widens_inputs():
    case = FuzzCase("", "f0", ("d", "i", "f"), 1,
                    (np.zeros(2, np.int32), np.ones(2, np.int32), np.full(2, 0.25, np.float32)))
    assert [x.dtype for x in to_x64(case).inputs] == [np.int64, np.int64, np.float64]


def test_fuzz_x64_programs():
    n = _examples(2)   # as the other make-test fuzz tests; `make fuzz` and the long test run thousands
    ran = _run(n, SMALL)
    print(f"fuzz x64: {ran} programs", file=sys.stderr)
    assert ran >= n, f"only {ran} of {n} generated programs ran"


@pytest.mark.slow
def test_fuzz_x64_long():
    n = _examples(1_000)
    ran = _run(n, LARGE)
    print(f"fuzz x64: {ran} programs", file=sys.stderr)
    assert ran >= n, f"only {ran} of {n} generated programs ran"
