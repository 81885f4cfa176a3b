"""A Python number keeps its weak type through the machine, as in the Python
run: `k = 100` then `x + k` with `x` int8 stays int8 (and wraps), and a
`range` loop's counter is a Python int, not the bound's dtype."""
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pcbatch


def same(got, want):
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def check(fn, *args, fork, jit):
    want = pcbatch.autobatch(fn).reference(*args)
    f = pcbatch.autobatch(fn, fork=fork, max_steps=10_000)  # a counter that wraps never ends
    same((jax.jit(f) if jit else f)(*args), want)
    return want


# Each machine (fork x eager/jit) compiles the program again: `make test` runs each program
# on one of the four, and each machine on at least one program (the forked one on the
# recursion that forks); `make test-matrix` runs the other cells.
MACHINES = [(False, False), (True, True), (True, False), (False, True)]  # (fork, jit)


def machines(kept: tuple[bool, bool]) -> list:
    """The four machines for a program: `kept` in `make test`, the others `matrix`."""
    return [pytest.param(fork, jit, id=f"fork={fork}-{'jit' if jit else 'eager'}",
                         marks=() if (fork, jit) == kept else (pytest.mark.matrix,)) for fork, jit in MACHINES]


def named_constant(x):
    k = 100
    if x + k > 0:  # int8: 100 + 100 wraps to -56
        return x + k
    return x - k


@pytest.mark.parametrize("fork, jit", machines((False, False)))
def test_a_named_python_number_stays_weakly_typed(fork, jit):
    got = check(named_constant, jnp.array([100, 1, -120, 27], jnp.int8), fork=fork, jit=jit)
    np.testing.assert_array_equal(got, [0, 101, 36, 127])  # 100+100 wraps to -56: 100-100; -120-100 wraps to 36


def recursive_sum(x, n):
    k = 100
    if n <= 0:
        return jnp.where(x + k > 0, 1, 0)  # int8: x + k wraps below 0 for x > 27
    return recursive_sum(x, n - 1) + recursive_sum(x + 1, n - 2)


@pytest.mark.parametrize("fork, jit", machines((True, False)))
def test_a_weak_constant_in_a_forked_recursion(fork, jit):
    got = check(recursive_sum, jnp.array([50, -7, 100, 20], jnp.int8), jnp.array([3, 1, 4, 0]), fork=fork, jit=jit)
    assert int(got[2]) == 0 and int(got[3]) == 1


def squares(n):
    acc = jnp.int32(0)
    for i in range(n):
        acc = acc + i * i  # i is a Python int: no int8 wrap
    return acc


def countdown(n):
    acc = 0
    for i in range(n, 0, -1):
        acc = acc + i  # int32, as the Python run's ints stack
    return acc


def doubling(h, n):
    for i in range(n):
        h = h * 2 + i  # h stays int8
    return h


def count_up(n):
    acc = 0
    for i in range(0, n, 100):  # uint8: 0, 100, 200, then 300 ends it (it wrapped to 44: forever)
        acc = acc + i
    return acc


RANGE_COUNTERS = [  # (fn, args, expected, the machine `make test` runs it on)
    (squares, (jnp.array([20, 5, 30], jnp.int8),), [2470, 30, 8555], (True, True)),
    (countdown, (jnp.array([0, 5, 255], jnp.uint8),), [0, 15, 32640], (False, True)),
    (doubling, (jnp.array([3, 100, 1], jnp.int8), jnp.array([2, 3, 4])), [13, 36, 27], (False, True)),
    (count_up, (jnp.array([0, 5, 255], jnp.uint8),), [0, 0, 300], (True, False)),
]


@pytest.mark.parametrize("fn, args, expected, fork, jit", [
    pytest.param(*case[:3], *m.values, id=f"{case[0].__name__}-{m.id}", marks=m.marks)
    for case in RANGE_COUNTERS for m in machines(case[3])])
def test_a_range_counter_is_a_python_int(fn, args, expected, fork, jit):
    got = check(fn, *args, fork=fork, jit=jit)
    np.testing.assert_array_equal(got, expected)


def returns_literal(x):
    if x > 0:
        return 300  # beside an int8 return: it would wrap to 44
    return x


def returns_small_literal(x):
    if x > 0:
        return 100
    return x


def returns_float_literal(x):
    if x > 0:
        return 1e5  # beside a float16 return: inf there
    return x


@pytest.mark.parametrize("fork", [False, True])
def test_a_returned_python_number_that_does_not_fit_is_a_named_error(fork):
    """As for `v = 300` (a Python number assigned beside a narrower type), checked
    when the program is built, on every path."""
    x = jnp.array([1, -1, 2], jnp.int8)
    small = pcbatch.autobatch(returns_small_literal, fork=fork)
    same(small(x), small.reference(x))
    for f, arg in [(pcbatch.autobatch(returns_literal, fork=fork), x),
                   (pcbatch.autobatch(returns_float_literal, fork=fork), x.astype(jnp.float16))]:
        for call in (f, jax.jit(f)):
            with pytest.raises(pcbatch.DtypeOverflowError, match=r"is (300|100000\.0) here"):
                call(arg)


def scale(x, k):
    y = x * k
    if y > 0:  # y crosses a block boundary in a register
        y = y * 3
    return y


@pytest.mark.parametrize("x, k", [(jnp.array([1, 2, -1], jnp.int8), 100),
                                  (jnp.array([300.0, 1.0], jnp.float16), 100.0)])
def test_a_python_number_argument_stays_weakly_typed(x, k):
    """As `jax.vmap` and the Python run type it: int8 * 100 is int8 (and wraps), float16 * 100.0 is float16."""
    f = pcbatch.autobatch(scale, in_axes=(0, None))
    got = f(x, k)
    same(got, f.reference(x, k))
    assert got.dtype == x.dtype
    same(jax.jit(f)(x, k), f.reference(x, k))


def int8_or_half(x, n):
    v = x
    if n > 5:
        v = 0.5
    return v * 100


def test_a_strongly_typed_value_widened_by_the_join_is_a_warning():
    """Found by a bug hunt: `v` int8 on one path and float32 on the other is
    stored as float32, so `v * 100` does not wrap as Python's int8 does. pcbatch
    cannot keep both types in one variable; it says so at compile time."""
    x, n = jnp.asarray([3, 3], jnp.int8), jnp.asarray([0, 9])
    python = [int8_or_half(x[i], n[i]) for i in range(2)]
    assert [float(p) for p in python] == [44.0, 50.0]          # int8 3 * 100 wraps
    f = pcbatch.autobatch(int8_or_half, fork=False)
    with pytest.warns(pcbatch.TypeJoinWarning, match=r"`v` is i8\[\] here but f32\[\]"):
        out = f(x, n)
    assert out.tolist() == [300.0, 50.0]                       # what the warning says
    with warnings.catch_warnings():                            # a Python number takes the join silently,
        warnings.simplefilter("error", pcbatch.TypeJoinWarning)  # as in JAX
        g = pcbatch.autobatch(lambda_free_acc, fork=False)
        assert g(jnp.asarray([1.5, 2.0]), jnp.asarray([2, 3])).tolist() == [3.0, 6.0]


def lambda_free_acc(x, n):
    acc = 0
    for _ in range(n):
        acc = acc + x
    return acc


def inverted(n):
    v = n > 2
    if n > 5:
        v = n
    return ~v


def added(n):
    v, w = n > 2, n > 1
    if n > 5:
        v, w = n, n
    return v + w


def positive_and_sum(n):
    return n > 0 and n + 1  # a bool on one path, an int on the other: the same 0/1 either way


def test_an_op_that_computes_otherwise_on_a_joined_bool_is_a_warning():
    """Found by a bug hunt: `v` a bool on one path and an int on another is
    stored as an int, where Python's `~` on the bool is logical."""
    n = jnp.asarray([1, 3, 6])
    python = [inverted(n[i]) for i in range(3)]
    assert [int(p) for p in python] == [1, 0, -7]              # ~False, ~True, ~6
    with pytest.warns(pcbatch.TypeJoinWarning, match=r"`~v` reads `v`, a bool on one path and i32\[\]"):
        out = pcbatch.autobatch(inverted, fork=False)(n)
    assert out.tolist() == [-1, -2, -7]                        # what the warning says
    assert [int(added(n[i])) for i in range(3)] == [0, 1, 12]  # JAX's True + True is True
    with pytest.warns(pcbatch.TypeJoinWarning, match=r"`v \+ w` reads `v`, `w`"):
        assert pcbatch.autobatch(added, fork=False)(n).tolist() == [0, 2, 12]
    with warnings.catch_warnings():                            # 0/1 in arithmetic is the same: no warning
        warnings.simplefilter("error", pcbatch.TypeJoinWarning)
        m = jnp.asarray([-2, 0, 4])
        got = pcbatch.autobatch(positive_and_sum, fork=False)(m)
        assert got.tolist() == [int(positive_and_sum(m[i])) for i in range(3)]
