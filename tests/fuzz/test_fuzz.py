"""Random-program differential test: autobatched result == per-example Python.

`test_fuzz_programs` runs `PCBATCH_FUZZ_EXAMPLES` programs (default 8, in 4
tests of 2, under the default `fork="auto"`) in `make test`, `test_fuzz_forked.py` 8 with
`fork=True`; `test_fuzz_long` (marked slow, both fork settings) runs `PCBATCH_FUZZ_EXAMPLES`
(default 10,000) under `make fuzz`.  `PCBATCH_FUZZ_SEED=<int>` replaces the
derandomized default sequence of programs with another one.

Some programs hold guard clauses (`raise`, `assert`) that fail some examples: pcbatch must flag
exactly those (`status.failed`, `ExampleError`) and give the others' results exactly.
A failure prints the generated program and its inputs.
"""
from __future__ import annotations

import importlib.util
import atexit
import dataclasses
import hashlib
import linecache
import os
import shutil
import sys
import tempfile
import traceback

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings

import pcbatch

from .generator import GUARD, LARGE, SMALL, FuzzCase, fuzz_cases

_DIR = tempfile.mkdtemp(prefix="pcbatch_fuzz_")
atexit.register(shutil.rmtree, _DIR, True)


def _load(source: str):
    """Import `source` from a real file (pcbatch reads function source via inspect).
    The module is not put in sys.modules, so it is freed after the check.  The
    file name depends only on the source, so that a replayed failure has the
    same origin (file, line) for hypothesis."""
    name = "pcbatch_fuzz_" + hashlib.sha1(source.encode()).hexdigest()[:16]
    path = os.path.join(_DIR, name + ".py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _unload(module) -> None:
    os.remove(module.__file__)
    linecache.checkcache(module.__file__)


def _mismatch(out, ref) -> str | None:
    """None if `out` equals `ref` (ints exactly, floats allclose), else what differs."""
    out_leaves, out_tree = jax.tree_util.tree_flatten(out)
    ref_leaves, ref_tree = jax.tree_util.tree_flatten(ref)
    if out_tree != ref_tree:
        return f"result structure {out_tree} != reference structure {ref_tree}"
    for k, (o, r) in enumerate(zip(out_leaves, ref_leaves)):
        o, r = np.asarray(o), np.asarray(r)
        if o.shape != r.shape:
            return f"leaf {k}: shape {o.shape} != reference shape {r.shape}"
        if np.issubdtype(o.dtype, np.floating) or np.issubdtype(r.dtype, np.floating):
            same = np.isclose(o.astype(np.float64), r.astype(np.float64), rtol=1e-6, atol=1e-6, equal_nan=True)
        else:
            same = o.astype(np.int64) == r.astype(np.int64)
        bad = np.nonzero(~same.reshape(o.shape[0], -1).all(axis=1))[0].tolist() if o.size else []
        if bad:
            return (f"leaf {k}: pcbatch {o.tolist()} ({o.dtype}) != reference {r.tolist()} ({r.dtype}); "
                    f"examples {bad} differ")
    return None


def check_case(case: FuzzCase, adapt=None) -> None:
    """Autobatched result == `.reference(...)` (ints exactly, floats allclose);
    `adapt` may change the autobatched function first (e.g. its schedule)."""
    module = _load(case.source)
    try:
        fn = getattr(module, case.entry)
        _check(adapt(fn) if adapt else fn, case)
    finally:
        _unload(module)


def configured(fn, case: FuzzCase):
    """`fn` with the case's `fork` option (and, with fork=True, its compiled widths and pool)."""
    if case.fork == fn.fork and not case.max_widths and case.spare_lanes is None:
        return fn
    tuning = pcbatch.Tuning(max_widths=case.max_widths) if case.max_widths else fn.tuning
    pool = {}
    if case.spare_lanes is not None:
        axes = case.in_axes or (0,) * len(case.inputs)
        batch = next(len(x) for x, ax in zip(case.inputs, axes) if ax is not None)
        pool = {"max_lanes": batch + case.spare_lanes}
    return fn.with_options(fork=case.fork, tuning=tuning, **pool)


def _check(fn, case: FuzzCase) -> None:
    args, kwargs = case.call_args()
    fn = configured(fn, case)
    if len(case.inputs) and not any(np.ndim(x) and np.shape(x)[0] for x in case.inputs if np.ndim(x)):
        return _check_empty(fn, case, args, kwargs)
    try:
        ref = fn.reference(*args, **kwargs)
    except Exception as e:
        if GUARD not in str(e):  # a generator bug: the program itself is broken Python
            raise AssertionError("the generated program fails in plain Python (generator bug)\n"
                                 + case.describe() + traceback.format_exc()) from None
        return _check_raising(fn, case)
    try:
        if case.limits:
            out, status = fn.with_options(**case.limits).checked(*args, **kwargs)
            flagged = np.asarray(status.unfinished) | np.asarray(status.overflow)
            if np.asarray(status.failed).any():
                raise AssertionError(f"pcbatch flags examples {np.nonzero(np.asarray(status.failed))[0].tolist()} "
                                     "as failed where Python raises nothing\n" + case.describe())
        else:
            out, flagged = fn(*args, **kwargs), None
    except Exception as e:
        raise AssertionError(f"pcbatch raised {type(e).__name__}\n" + case.describe()
                             + traceback.format_exc()) from e
    if flagged is not None:  # only the examples the machine did not flag must be exact
        keep = np.nonzero(~flagged)[0]
        out, ref = (jax.tree_util.tree_map(lambda x: np.asarray(x)[keep], t) for t in (out, ref))
    problem = _mismatch(out, ref)
    if problem:
        raise AssertionError(f"pcbatch disagrees with the reference: {problem}\n" + case.describe())


RAISING = [0]  # programs checked so far where Python raises for some example (printed by the tests)


def _one_example(case: FuzzCase, i: int) -> FuzzCase:
    axes = case.in_axes or (0,) * len(case.inputs)
    return dataclasses.replace(case, inputs=tuple(x if ax is None else np.asarray(x)[i:i + 1]
                                                  for x, ax in zip(case.inputs, axes)))


def _check_raising(fn, case: FuzzCase) -> None:
    """Python raises (a generated guard) for some examples: pcbatch flags exactly those
    (`status.failed`; or, under tight limits, stops them earlier), the plain call raises
    `ExampleError` naming them, and every other example's result is exact."""
    RAISING[0] += 1
    axes = case.in_axes or (0,) * len(case.inputs)
    batch = next(len(x) for x, ax in zip(case.inputs, axes) if ax is not None)
    refs, raises = {}, []
    for i in range(batch):
        one_args, one_kwargs = _one_example(case, i).call_args()
        try:
            refs[i] = fn.reference(*one_args, **one_kwargs)
        except Exception as e:
            if GUARD not in str(e):
                raise AssertionError("the generated program fails in plain Python (generator bug)\n"
                                     + case.describe() + traceback.format_exc()) from None
            raises.append(i)
    args, kwargs = case.call_args()
    try:
        out, status = (fn.with_options(**case.limits) if case.limits else fn).checked(*args, **kwargs)
    except Exception as e:
        raise AssertionError(f"pcbatch raised {type(e).__name__}\n" + case.describe()
                             + traceback.format_exc()) from e
    failed = np.asarray(status.failed) != 0
    stopped = np.asarray(status.unfinished) | np.asarray(status.overflow)
    wrong = [i for i in range(batch) if failed[i] != (i in raises) and not (case.limits and stopped[i])]
    if wrong:
        raise AssertionError(f"Python raises for examples {raises}, pcbatch flags "
                             f"{np.nonzero(failed)[0].tolist()} as failed\n" + case.describe())
    if not case.limits:
        try:
            fn(*args, **kwargs)
            raise AssertionError(f"no ExampleError though Python raises for examples {raises}\n" + case.describe())
        except pcbatch.ExampleError as e:
            if e.examples != raises:
                raise AssertionError(f"ExampleError names {e.examples}, Python raises for {raises}\n"
                                     + case.describe()) from None
    keep = [i for i in range(batch) if i not in raises and not stopped[i]]
    if keep:
        got = jax.tree_util.tree_map(lambda x: np.asarray(x)[keep], out)
        want = jax.tree_util.tree_map(lambda *xs: np.concatenate([np.asarray(x) for x in xs]),
                                      *[refs[i] for i in keep])
        problem = _mismatch(got, want)
        if problem:
            raise AssertionError(f"pcbatch disagrees with the reference (examples {keep}, the ones Python "
                                 f"does not raise for): {problem}\n" + case.describe())


def _check_empty(fn, case: FuzzCase, args, kwargs) -> None:
    """0 examples: an empty result shaped like a one-example call's (as jax.vmap gives): the
    structure and shapes of the Python result, the dtypes pcbatch gives (the join of every
    path's type, at least as wide as the Python path's)."""
    one = lambda x: np.zeros((1,) + np.shape(x)[1:], np.asarray(x).dtype) if np.ndim(x) else x
    try:
        ref = fn.reference(*map(one, args), **{k: one(v) for k, v in kwargs.items()})
    except Exception as e:
        if GUARD not in str(e):
            raise
        return  # the zero example raises (a generated guard): no one-example result to compare dtypes with
    single = fn(*map(one, args), **{k: one(v) for k, v in kwargs.items()})
    wide = lambda s, r: jax.numpy.promote_types(s.dtype, r.dtype) == s.dtype  # JAX's lattice: float32 + int32
    ref = jax.tree_util.tree_map(lambda r, s: np.zeros(np.shape(r), np.asarray(s).dtype)
                                 if wide(np.asarray(s), np.asarray(r)) else r, ref, single)
    try:
        out = fn(*args, **kwargs)
    except Exception as e:
        raise AssertionError(f"pcbatch raised {type(e).__name__} on an empty batch\n" + case.describe()
                             + traceback.format_exc()) from e
    got = jax.tree_util.tree_map(lambda x: (np.shape(x), np.asarray(x).dtype), out)
    want = jax.tree_util.tree_map(lambda x: ((0,) + np.shape(x)[1:], np.asarray(x).dtype), ref)
    if got != want:
        raise AssertionError(f"empty batch: got {got}, expected {want}\n" + case.describe())


def _run(n: int, max_stmts: int, forks: tuple[bool | str, ...] = (True, "auto"), chunk: int | None = None,
         adapt=None) -> int:
    """Check `n` random programs, each run with one of `forks`; returns how
    many ran. `chunk` k draws the k-th fixed sequence of programs (the default
    sequence is derandomized; `PCBATCH_FUZZ_SEED` replaces either)."""
    count = [0]
    options = dict(max_examples=n, database=None, report_multiple_bugs=False,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                          HealthCheck.large_base_example])
    user_seed = os.environ.get("PCBATCH_FUZZ_SEED")
    fixed = int(user_seed) * 1000 + (chunk or 0) if user_seed else chunk
    if fixed is not None:
        options["derandomize"] = False

    def prop(case: FuzzCase) -> None:
        check_case(case, adapt)
        count[0] += 1
        if count[0] % 500 == 0:
            jax.clear_caches()
            print(f"fuzz: {count[0]} programs passed", file=sys.stderr, flush=True)  # `make fuzz` runs for hours

    test = settings(**options)(given(fuzz_cases(max_stmts, forks=forks, guards=True))(prop))
    if fixed is not None:
        test = seed(fixed)(test)
    test()
    return count[0]


def _examples(default: int) -> int:
    return int(os.environ.get("PCBATCH_FUZZ_EXAMPLES", default))


CHUNKS = 4  # make test's programs in 4 tests of a fixed sequence each (each well under 30 s)


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_fuzz_programs(chunk):
    """`make test`: 4 x 2 fixed random programs (or `PCBATCH_FUZZ_EXAMPLES` in
    all) under the default `fork="auto"`; `test_fuzz_forked.py` runs 8
    with `fork=True` (two files: xdist runs them side by side; `make test` must
    stay under CI's 8 minutes, 4 x 4 took a minute of CPU; `make fuzz` runs thousands).
    Each sequence starts with hypothesis' simplest program (an empty batch), then one
    random program."""
    n = -(-_examples(8) // CHUNKS)
    ran = _run(n, SMALL, forks=("auto",), chunk=chunk)
    print(f"fuzz: {ran} programs ({RAISING[0]} so far where Python raises for some example)", file=sys.stderr)
    assert ran >= n, f"only {ran} of {n} generated programs ran"


@pytest.mark.slow
def test_fuzz_long():
    """`make fuzz`: PCBATCH_FUZZ_EXAMPLES (default 10,000) programs."""
    n = _examples(10_000)
    ran = _run(n, LARGE)
    print(f"fuzz: {ran} programs ({RAISING[0]} where Python raises for some example)", file=sys.stderr)
    assert ran >= n, f"only {ran} of {n} generated programs ran"
