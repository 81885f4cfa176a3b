"""`jax_enable_x64`: int64 and float64 programs give the per-example Python
results (issue 16, item 2), fork=True and fork=False, eager and under
`jax.jit`, gradients included; with x64 off the machine state stays 32-bit.

The machine's bookkeeping (pcs, stack pointers, the lane table, counters, the
gradient tape) uses `runtime.dtypes.index_dtype()`, JAX's default integer:
with x64 on, every loop carry must stay int64 or `lax.while_loop` rejects it
(the bug: `peak` int32 against int64 crashed every fork-join program).

Oracles are plain Python on Python ints and floats (exact, unbounded ints;
IEEE doubles), not the machine's own arithmetic: each program is chosen so
that an int32 or float32 computation would give a different answer, and the
test asserts that too, so it cannot pass by computing in 32 bits.

Every test runs inside `jax.enable_x64(True)` (an autouse fixture), so other
test modules see x64 off. Batches and lane pools are small: compiling
fork-join machines is slow; for the same reason `make test` runs each program
in one or two of the four (fork, jit) cells, every cell with some program, and
`make test-matrix` the rest (`cells`).
"""
from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pcbatch
from pcbatch.errors import StackOverflowError

POOL = dict(max_lanes=16, lane_width=16)  # fork-join: one compiled width, a small pool


def _x64_on():
    """`jax.enable_x64(True)` where JAX has it (>= 0.7), else the older
    `jax.experimental.enable_x64()`."""
    if hasattr(jax, "enable_x64") and callable(jax.enable_x64):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64  # pragma: no cover - older JAX

    return enable_x64()


@pytest.fixture
def x64():
    with _x64_on():
        yield


pytestmark = [
    pytest.mark.usefixtures("x64"),
    # An int64 value scattered into an int32 buffer: state built with the wrong index type.
    pytest.mark.filterwarnings("error:scatter inputs have incompatible types:FutureWarning"),
]

_VARIANTS: dict = {}


def variant(fn, **options):
    """`fn.with_options(**options)`, made once (its compiled programs are cached)."""
    key = (id(fn), tuple(sorted(options.items())))
    if key not in _VARIANTS:
        _VARIANTS[key] = fn.with_options(**options)
    return _VARIANTS[key]


CELLS = [(True, False), (True, True), (False, False), (False, True)]  # (fork, jit)


def cells(*kept):
    """Parameters `fork, jit`: the four cells (fork=True and fork=False, eager and
    under jax.jit), each compiling a machine of its own. Those not `kept` are `matrix`
    cells: every row (program) and column (cell) still runs in `make test`. A program
    that never forks lowers to the same plain machine under fork=True: its fork=True
    cells only compile that machine again."""
    return [pytest.param(fork, jit, id=f"fork={fork}-{'jit' if jit else 'eager'}",
                         marks=() if (fork, jit) in kept else pytest.mark.matrix)
            for fork, jit in CELLS]


def run_of(fn, fork, jit):
    """(label, callable): `fn` under `fork`, eagerly or under jax.jit."""
    f = variant(fn, fork=fork)
    return f"fork={fork} {'jit' if jit else 'eager'}", jax.jit(f) if jit else f


def assert_ints(got, want, what):
    got = np.asarray(got)
    assert got.dtype == np.int64, (what, got.dtype)
    assert got.tolist() == [int(w) for w in want], what


def assert_floats(got, want, what, rtol=1e-13):
    got = np.asarray(got)
    assert got.dtype == np.float64, (what, got.dtype)
    np.testing.assert_allclose(got, np.asarray(want, np.float64), rtol=rtol, atol=0, err_msg=what)


def beyond_int32(values) -> bool:
    return any(abs(int(v)) > np.iinfo(np.int32).max for v in values)


# --- programs -------------------------------------------------------------------


@pcbatch.autobatch(**POOL)
def tree(n, unit):
    """Fork-join tree recursion (the two calls fork): fib(n) * unit."""
    if n < 2:
        return n * unit
    return tree(n - 1, unit) + tree(n - 2, unit)


def tree_py(n: int, unit: int) -> int:
    return n * unit if n < 2 else tree_py(n - 1, unit) + tree_py(n - 2, unit)


@pcbatch.autobatch(max_stack_depth=100)
def tail_fib(n, a, b):
    """One call per level: fib(n + k) from (fib(k), fib(k + 1)); fib(90) ~ 2.9e18."""
    if n == 0:
        return a
    return tail_fib(n - 1, b, a + b)


def tail_fib_py(n: int, a: int, b: int) -> int:
    while n:
        n, a, b = n - 1, b, a + b
    return a


@pcbatch.autobatch
def collatz(n):
    """A while loop; starting values near 2**40 pass far beyond int32."""
    steps = 0
    top = n
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        top = jnp.maximum(top, n)
        steps += 1
    return steps * 1_000_000_000_000 + top % 1_000_000_007


def collatz_py(n: int) -> int:
    steps, top = 0, n
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        top = max(top, n)
        steps += 1
    return steps * 1_000_000_000_000 + top % 1_000_000_007


@pcbatch.autobatch(**POOL)
def ftree(x, n):
    """Fork-join float recursion adding steps of 1e-9 to values near 1:
    float32 (spacing 1.2e-7 at 1) loses every one of them."""
    if n < 2:
        return x
    return ftree(x + 1e-9, n - 1) + ftree(x * 0.5 + 1e-9, n - 2)


def ftree_py(x: float, n: int) -> float:
    return x if n < 2 else ftree_py(x + 1e-9, n - 1) + ftree_py(x * 0.5 + 1e-9, n - 2)


@pcbatch.autobatch(max_stack_depth=64)
def stacked(n, x, k):
    """Not a tail call: `x` and `k` live across the recursive call, so they
    are pushed on a stack (the test checks the lowering stacks them)."""
    if n <= 0:
        return x, k
    y, j = stacked(n - 1, x * 1.000000001 + 1e-10, k * 3 + 1)
    return y - x * 1e-9, j + k


def stacked_py(n: int, x: float, k: int) -> tuple[float, int]:
    if n <= 0:
        return x, k
    y, j = stacked_py(n - 1, x * 1.000000001 + 1e-10, k * 3 + 1)
    return y - x * 1e-9, j + k


def float32_of(fn, *args):
    """`fn` (a Python oracle) evaluated in float32 NumPy arithmetic: what a
    machine that silently dropped to 32 bits would give."""
    return fn(*(np.float32(a) if isinstance(a, float) else a for a in args))


# --- results --------------------------------------------------------------------


# fork=False under jit: test_while_loop_int64, test_stacked_values_float64_and_int64.
@pytest.mark.parametrize("fork, jit", cells((True, False)))
def test_fork_join_int64_beyond_int32(fork, jit):
    ns = [7, 10, 1, 0, 4]
    units = [2**33 + 1, 3, -(2**40), 5, 2**52]
    want = [tree_py(n, u) for n, u in zip(ns, units)]
    assert beyond_int32(want)
    args = (jnp.asarray(ns, jnp.int64), jnp.asarray(units, jnp.int64))
    assert tree.lowered(*args).has_forks
    assert_ints(tree.reference(*args), want, "reference")
    label, f = run_of(tree, fork, jit)
    assert_ints(f(*args), want, label)


@pytest.mark.parametrize("fork, jit", cells((False, False)))
def test_linear_recursion_int64_fib_90(fork, jit):
    ns = [90, 60, 0, 47, 1]
    args = (jnp.asarray(ns, jnp.int64), jnp.zeros(5, jnp.int64), jnp.ones(5, jnp.int64))
    want = [tail_fib_py(n, 0, 1) for n in ns]
    assert beyond_int32(want) and max(want) > 2**61
    label, f = run_of(tail_fib, fork, jit)
    assert_ints(f(*args), want, label)


@pytest.mark.parametrize("fork, jit", cells((False, True)))
def test_while_loop_int64(fork, jit):
    starts = [27, 2**40 + 1, 97, 1, 2**35 - 1]
    want = [collatz_py(n) for n in starts]
    assert beyond_int32(want)
    args = (jnp.asarray(starts, jnp.int64),)
    label, f = run_of(collatz, fork, jit)
    assert_ints(f(*args), want, label)


@pytest.mark.parametrize("fork, jit", cells((True, True), (False, False)))
def test_fork_join_float64(fork, jit):
    xs, ns = [1.0, 0.75, 3.0, 1.0], [6, 8, 1, 3]
    want = [ftree_py(x, n) for x, n in zip(xs, ns)]
    f32 = [float32_of(ftree_py, x, n) for x, n in zip(xs, ns)]
    # A float32 machine would be off far beyond the tolerance below.
    assert np.max(np.abs(np.subtract(f32, want)) / np.abs(want)) > 1e-10
    args = (jnp.asarray(xs, jnp.float64), jnp.asarray(ns, jnp.int64))
    assert ftree.lowered(*args).has_forks
    label, f = run_of(ftree, fork, jit)
    assert_floats(f(*args), want, label)


@pytest.mark.parametrize("fork, jit", cells((False, True)))
def test_stacked_values_float64_and_int64(fork, jit):
    ns, xs, ks = [30, 5, 0, 18], [1.0, 2.5, 0.5, 1.0], [1, 2**20, 7, 2**3]
    want = [stacked_py(n, x, k) for n, x, k in zip(ns, xs, ks)]
    want_x, want_k = [w[0] for w in want], [w[1] for w in want]
    assert beyond_int32(want_k)
    f32 = [float32_of(stacked_py, n, x, k)[0] for n, x, k in zip(ns, xs, ks)]
    assert np.max(np.abs(np.subtract(f32, want_x)) / np.abs(want_x)) > 1e-10
    args = (jnp.asarray(ns, jnp.int64), jnp.asarray(xs, jnp.float64), jnp.asarray(ks, jnp.int64))
    assert stacked.lowered(*args).vars_of_class("stacked"), "the test needs values on a stack"
    label, f = run_of(stacked, fork, jit)
    got_x, got_k = f(*args)
    assert_floats(got_x, want_x, label)
    assert_ints(got_k, want_k, label)


# Each compiles a pool: the small pool runs the depth scheduler; agenda (which reads the
# frontier alike) is a `matrix` cell.
@pytest.mark.parametrize("options", [dict(max_lanes=4, lane_width=2, schedule="depth"),
                                     pytest.param(dict(schedule="agenda"), marks=pytest.mark.matrix)],
                         ids=["small-pool-depth", "agenda"])
def test_small_pool_and_other_schedulers(options):
    """Forks that find no free lane take the sequential path; the depth and
    agenda schedulers read the (int64) frontier."""
    ns, units = [9, 6, 8], [2**35, -3, 2**33]
    want = [tree_py(n, u) for n, u in zip(ns, units)]
    args = (jnp.asarray(ns, jnp.int64), jnp.asarray(units, jnp.int64))
    assert_ints(variant(tree, **options)(*args), want, str(options))


def test_status_trace_and_checked_under_jit():
    ns, units = jnp.asarray([6, 3], jnp.int64), jnp.asarray([2**40, 1], jnp.int64)
    result, status = jax.jit(tree.checked)(ns, units)
    assert_ints(result, [tree_py(6, 2**40), tree_py(3, 1)], "checked")
    assert not np.any(status.overflow) and not np.any(status.unfinished)
    assert status.steps.dtype == np.int64 and status.peak_lanes.dtype == np.int64
    assert int(status.peak_lanes) > 2  # the forks ran in lanes of their own
    trace = tree.trace(ns, units, steps=512)
    assert not trace.truncated and trace.total == int(status.steps)


@pytest.mark.parametrize("fork", [True, False])
def test_stack_overflow_raised(fork):
    """An overflow is reported as such (not a dtype error) under x64."""
    f = variant(tree, fork=fork, max_stack_depth=3, max_lanes=3)
    with pytest.raises(StackOverflowError):
        f(jnp.asarray([2, 9, 1], jnp.int64), jnp.asarray([1, 2**40, 1], jnp.int64))


# --- gradients ------------------------------------------------------------------


def _grad_pairs(fn, args, i, kept):
    """d/d args[i] of sum(out**2): the autobatched one's (eagerly or under jit, for
    the `(fork, jit)` cells `kept`) and the reference's."""
    def loss(f):
        def go(x):
            a = list(args)
            a[i] = x
            out = f(*a)
            return sum(jnp.sum(o ** 2) for o in jax.tree_util.tree_leaves(out) if o.dtype == jnp.float64)
        return go

    want = jax.grad(loss(fn.reference))(args[i])
    for fork, jit in kept:
        f = variant(fn, fork=fork)
        if not jit:
            yield f"fork={fork} grad", jax.grad(loss(f))(args[i]), want
        else:
            yield f"fork={fork} jit(grad)", jax.jit(jax.grad(loss(f)))(args[i]), want


TABLE32 = jnp.asarray([3, -1, 4, 1], jnp.int32)  # a 32-bit constant, as code written for x64 off makes


@pcbatch.autobatch(fork=False)
def beside_int32(d):
    v = 7
    if d <= 0:
        return v
    v = TABLE32[d % 4]
    return v


@pcbatch.autobatch(fork=False)
def wide_beside_int32(d):
    v = 2 ** 40  # WIDE_PYTHON_INT
    if d <= 0:
        return v
    v = TABLE32[d % 4]
    return v


@pcbatch.autobatch(fork=False)
def wide_beside_float16(d):
    v = 1e5  # WIDE_PYTHON_FLOAT
    if d <= 0:
        return v
    v = jnp.float16(0.5) * d
    return v


def test_python_number_beside_a_narrower_value():
    """A Python number takes the type of the value on the other path (JAX's
    promotion, the join): where it fits, the machine's int32 result is the
    examples' values; where it does not (2**40 in int32, 1e5 in float16), a
    named error quotes its line, and the reference stacks the examples in a
    type that holds them (it wrapped 2**40 to 0 before)."""
    d = np.asarray([0, 3], np.int64)
    out, ref = beside_int32(d), beside_int32.reference(d)
    assert out.dtype == np.int32 and out.tolist() == ref.tolist() == [7, 1]
    with pytest.raises(pcbatch.DtypeOverflowError, match="does not fit i32") as e:
        wide_beside_int32(d)
    assert "v = 2 ** 40  # WIDE_PYTHON_INT" in str(e.value) and isinstance(e.value, OverflowError)
    ref = wide_beside_int32.reference(d)
    assert ref.dtype == np.int64 and ref.tolist() == [2 ** 40, 1]
    # A float: JAX would make 1e5 inf in float16.
    with pytest.raises(pcbatch.DtypeOverflowError, match="does not fit f16") as e:
        wide_beside_float16(d)
    assert "v = 1e5  # WIDE_PYTHON_FLOAT" in str(e.value)
    ref = wide_beside_float16.reference(d)
    assert ref.tolist() == [1e5, 1.5] and np.isfinite(ref).all()


# Per (grad_switch, fork, jit): the gradient machines `make test` compiles; the others are
# `matrix` cells. The cond eagerly with forks (the CPU's way); the switch (accelerators')
# under jit with forks is a matrix cell here, its float32 twin runs in make test
# (`tests/grad/test_grad_models.py`, with fork=False too); fork=False's float64
# gradient: test_gradients_stacked_float64[fork=False].
GRADIENT_CELLS = [
    pytest.param(False, [(True, False)], id="cond"),
    pytest.param(False, [(True, True), (False, False), (False, True)], id="cond-other-cells",
                 marks=pytest.mark.matrix),
    pytest.param(True, [(True, True)], id="switch", marks=pytest.mark.matrix),
    pytest.param(True, [(False, True)], id="switch-fork=False", marks=pytest.mark.matrix),
]


@pytest.mark.parametrize("grad_switch, kept", GRADIENT_CELLS)
def test_gradients_fork_join_float64(grad_switch, kept):
    """Under a cond per recorded block (the CPU's way) and one switch with masked
    tape writes (accelerators': `Tuning.grad_switch`; under jit only, as a training
    step compiles it: the eager call compiles the same recorder once more)."""
    f = ftree.with_options(tuning=pcbatch.Tuning(grad_switch=grad_switch))
    args = (jnp.asarray([1.0, 0.75, 2.0], jnp.float64), jnp.asarray([6, 4, 1], jnp.int64))
    for label, got, want in _grad_pairs(f, args, 0, kept):
        assert_floats(got, want, label, rtol=1e-12)


# `stacked` never forks: under fork=True it differentiates the same plain machine. Under
# jit, another compile (ftree's cells run under jit): `matrix` cells.
@pytest.mark.parametrize("kept", [pytest.param([(False, False)], id="fork=False"),
                                  pytest.param([(False, True), (True, False), (True, True)], id="other-cells",
                                               marks=pytest.mark.matrix)])
def test_gradients_stacked_float64(kept):
    args = (jnp.asarray([12, 3, 0], jnp.int64), jnp.asarray([1.0, 2.5, 0.5], jnp.float64),
            jnp.asarray([1, 5, 2], jnp.int64))
    for label, got, want in _grad_pairs(stacked, args, 1, kept):
        assert_floats(got, want, label, rtol=1e-12)


# --- x64 off: nothing changes ---------------------------------------------------


@pytest.fixture
def x64_off():
    # Undo the module's x64 fixture for this test only.
    with contextlib.ExitStack() as stack:
        if hasattr(jax, "enable_x64") and callable(jax.enable_x64):
            stack.enter_context(jax.enable_x64(False))
        else:  # pragma: no cover - older JAX
            from jax.experimental import disable_x64

            stack.enter_context(disable_x64())
        yield


def test_x64_off_keeps_32_bit_state(x64_off):
    """The same function, x64 off: int32 results and int32 machine state
    (its compiled program is not the x64 one: the cache key has the index type).
    The shapes of test_fork_join_int64_beyond_int32's: with x64 on, its machine."""
    f = variant(tree, fork=True)
    ns, units = np.asarray([7, 10, 1, 0, 4], np.int64), np.asarray([5, 1, 3, -2, 7], np.int64)
    result, status = f.checked(ns, units)
    assert result.dtype == np.int32 and result.tolist() == [tree_py(n, u) for n, u in zip(ns, units)]
    assert status.steps.dtype == np.int32 and status.peak_lanes.dtype == np.int32
    with _x64_on():
        result, status = f.checked(ns, units)
    assert result.dtype == np.int64 and status.steps.dtype == np.int64
    assert result.tolist() == [tree_py(n, u) for n, u in zip(ns, units)]
