"""Differential tests: every corpus program, batched, equals the original Python
run one example at a time (`f.reference`).

Each distinct batch shape compiles a machine, so every batch of many examples
has one size (16: the divergent examples cycled, the random batches, and the
call under `jax.jit`), beside batches of 1, and hypothesis example counts are
low. The batch of one and the call under `jax.jit` each compile one more
machine per program: `make test` runs a quarter of the corpus in batches of
one and another quarter under `jax.jit`, with every program that has shared
(`in_axes=None`) arguments, which `jax.jit` traces too; every program runs its
batch of 16 eagerly in `make test`, and `make test-matrix` runs the other cells.

Floats: the batched machine is one XLA program, which may contract `a * b + c`
into a fused multiply-add while the per-example reference runs op by op, so
float leaves are compared with `rtol=1e-6` plus a small `atol` for values
near zero; integer and boolean leaves are compared bit-exactly.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from corpus import CASES, CASES_BY_NAME, Case  # tests/core is on sys.path (rootdir-less test dir)

BATCH = 16
# No shrinking: a failure is reported with the batch that failed; shrinking
# would re-run the machine thousands of times.
NO_SHRINK = (Phase.explicit, Phase.generate)
IDS = [c.name for c in CASES]


def quarter(which: int, shared: bool = False) -> list:
    """CASES with those marked `matrix` that are not the `which`-th in every four (or, with
    `shared`, have no shared argument)."""
    return [pytest.param(case, id=case.name,
                         marks=() if k % 4 == which or (shared and case.shared) else (pytest.mark.matrix,))
            for k, case in enumerate(CASES)]


def _exact(x) -> bool:
    return not jnp.issubdtype(np.asarray(x).dtype, jnp.inexact)


def assert_same(case: Case, out, ref) -> None:
    assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(ref), (out, ref)
    for o, r in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(ref)):
        o, r = np.asarray(o), np.asarray(r)
        assert o.shape == r.shape, (o.shape, r.shape)
        if not case.is_float:
            assert _exact(o), f"{case.name}: an int/bool program returned {o.dtype}"
        if _exact(o) and _exact(r):
            np.testing.assert_array_equal(o, r)
        else:
            np.testing.assert_allclose(o.astype(np.float64), r.astype(np.float64), rtol=1e-6, atol=1e-5)


def check(case: Case, examples: list[tuple]) -> None:
    args = case.args(examples)
    assert_same(case, case.fn(*args), case.fn.reference(*args))


_DIVERGENT_REFERENCE: dict[str, object] = {}


def divergent_reference(case: Case, picks: list[int]):
    """The reference for the examples `case.divergent[k]`, k in `picks`: each
    example runs once per file (the per-example Python costs more than the machine)."""
    if case.name not in _DIVERGENT_REFERENCE:
        _DIVERGENT_REFERENCE[case.name] = case.fn.reference(*case.args(list(case.divergent)))
    return jax.tree_util.tree_map(lambda x: np.asarray(x)[picks], _DIVERGENT_REFERENCE[case.name])


def cycled(case: Case) -> list[int]:
    """Which divergent example each of `case.batch(BATCH)`'s is."""
    return [i % len(case.divergent) for i in range(BATCH)]


def mixed(case: Case) -> st.SearchStrategy:
    """One example: random, or one of the hand-picked divergent ones."""
    return st.one_of(case.example, st.sampled_from(case.divergent))


def test_corpus_size():
    assert len(CASES) >= 30
    assert len({id(c.fn) for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_divergent_batch_and_cache(case):
    """Hand-picked examples with very different depths / trip counts / paths;
    calls with the same shapes reuse the machine."""
    args = case.args(case.batch(BATCH))
    out = case.fn(*args)
    assert_same(case, out, divergent_reference(case, cycled(case)))
    count = case.fn.trace_count
    assert count >= 1
    again = case.fn(*args)
    assert case.fn.trace_count == count, "a second call with the same shapes re-traced"
    jax.tree_util.tree_map(np.testing.assert_array_equal, again, out)
    # A new batch with the same shapes and dtypes hits the cache too.
    other = case.args(list(reversed(case.batch(BATCH))))
    assert_same(case, case.fn(*other), divergent_reference(case, cycled(case)[::-1]))
    assert case.fn.trace_count == count


@pytest.mark.parametrize("case", CASES, ids=IDS)
@settings(max_examples=3, phases=NO_SHRINK)  # 3 x 16 random examples (were 4 x 7 and 1 x 16: a shape each)
@given(data=st.data())
def test_random_batch(case, data):
    check(case, data.draw(st.lists(mixed(case), min_size=BATCH, max_size=BATCH), label="examples"))


@pytest.mark.parametrize("case", quarter(2))
def test_batch_of_one(case):
    for k, example in enumerate(case.divergent):
        assert_same(case, case.fn(*case.args([example])), divergent_reference(case, [k]))


@pytest.mark.parametrize("case", quarter(0, shared=True))
def test_under_jit(case):
    jitted = jax.jit(lambda *a: case.fn(*a))(*case.args(case.batch(BATCH)))
    assert_same(case, jitted, divergent_reference(case, cycled(case)))


# --- construct-specific checks that go beyond "equals the reference" -------

def on_batch(f, *columns):
    """`f` on these examples, run in a batch of BATCH (the last example repeated):
    the machine compiled above, not one more per batch size."""
    n = len(columns[0])
    padded = [np.concatenate([c, np.repeat(c[-1:], BATCH - n, axis=0)]) for c in map(np.asarray, columns)]
    return jax.tree_util.tree_map(lambda x: np.asarray(x)[:n], f(*padded))


def test_type_join_is_float32():
    """`acc = 0` then `acc = acc + 0.5 * i` joins int and float to float32, even
    for examples whose loop runs zero times (where Python returns the int 0)."""
    f = CASES_BY_NAME["half_sum"].fn
    out = on_batch(f, np.asarray([0, 0, 0], np.int32))
    assert out.dtype == jnp.float32
    np.testing.assert_array_equal(out, np.zeros(3, np.float32))
    # sum_{i<n} 0.5 i = n (n - 1) / 4
    n = np.arange(8, dtype=np.int32)
    np.testing.assert_array_equal(on_batch(f, n), (n * (n - 1) / 4).astype(np.float32))


def test_return_type_join_is_float32():
    f = CASES_BY_NAME["mixed_return"].fn
    out = on_batch(f, np.asarray([-1, 3, 4], np.int32))
    assert out.dtype == jnp.float32
    np.testing.assert_array_equal(out, np.asarray([0.0, 3.0, 1.0], np.float32))  # 0; 3; 4 * 0.25


def test_default_parameters_at_top_level():
    """has_factor(n) uses its default d=2: True exactly for composite n."""
    f = CASES_BY_NAME["has_factor"].fn
    n = np.arange(0, 32, dtype=np.int32).reshape(2, BATCH)
    composite = [k >= 4 and any(k % d == 0 for d in range(2, k)) for k in range(32)]
    np.testing.assert_array_equal(np.concatenate([f(n[0]), f(n[1])]), np.asarray(composite))


def test_known_values():
    """A few values computed by hand (independent of both pcbatch and the reference)."""
    def run(name, *columns):
        return on_batch(CASES_BY_NAME[name].fn, *columns)

    ints = lambda *xs: np.asarray(xs, np.int32)  # noqa: E731
    np.testing.assert_array_equal(run("fib", ints(0, 1, 7, 10)), [0, 1, 13, 55])
    np.testing.assert_array_equal(run("gcd", ints(12, 7), ints(18, 0)), [6, 7])
    # ack(2, n) = 2n + 3; ack(1, n) = n + 2
    np.testing.assert_array_equal(run("ack", ints(2, 1), ints(3, 4)), [9, 6])
    # collatz(6): 6 3 10 5 16 8 4 2 1 -> 8 steps
    np.testing.assert_array_equal(run("collatz", ints(1, 6)), [0, 8])
    # mc91(n) = 91 for n <= 100
    np.testing.assert_array_equal(run("mc91", ints(0, 100, 101)), [91, 91, 91])
    # power(x, n) = x ** n
    np.testing.assert_allclose(run("power", np.asarray([2.0, 3.0], np.float32), ints(10, 3)), [1024.0, 27.0])
    # two_calls(n, a) = t(n-1, a+1) + a + 10 t(n-1, a); t(0, .) = 0, t(1, a) = a,
    # t(2, 1) = t(1, 2) + 1 + 10 t(1, 1) = 2 + 1 + 10 = 13
    np.testing.assert_array_equal(run("two_calls", ints(1, 2), ints(1, 1)), [1, 13])
