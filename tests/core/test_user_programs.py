"""Programs a new user wrote that pcbatch got wrong (found by trying ~150 of them, stop 37),
each compared with the original Python run one example at a time."""
import linecache
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pcbatch


def same(got, want):
    """Equal values and dtypes, leaf by leaf (the reference returns per-example Python results stacked)."""
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


# --- `range(...)` is evaluated once, and its counter never wraps --------------

def shrinking_stop(n):
    c = 0
    for i in range(n):
        n = n - 1  # Python's range already holds the old n
        c = c + 1
    return c, n


def growing_step(n, k):
    c = 0
    for i in range(0, n, k):
        k = k + 1
        c = c + i
    return c


@pytest.mark.parametrize("fork", [False, True])
def test_range_bounds_are_read_once(fork):
    n = jnp.array([4, 7, 0, 1])
    f = pcbatch.autobatch(shrinking_stop, fork=fork)
    same(f(n), f.reference(n))
    assert np.asarray(f(n)[0]).tolist() == [4, 7, 0, 1]
    g = pcbatch.autobatch(growing_step, fork=fork)
    k = jnp.array([1, 2, -1, 3])
    same(jax.jit(g)(jnp.array([10, 10, 3, 2]), k), g.reference(jnp.array([10, 10, 3, 2]), k))


def collatz_below(x, n):
    v = x * (n <= 0)  # 0 on the path that recurses: Collatz's loop never ends on 0
    if n <= 0:
        return jax.lax.while_loop(lambda c: c[0] != 1, lambda c: (jnp.where(c[0] % 2 == 0, c[0] // 2,
                                                                          3 * c[0] + 1), c[1] + 1), (v, 0))[1]
    return collatz_below(x, n - 1) + 1


@pytest.mark.parametrize("fork", [False, True])
def test_while_loop_runs_only_on_lanes_at_its_block(fork):
    """A lax.while_loop in a block ran on every lane, also those not at the
    block, on values Python never brings there (`v = 0`): it never ended."""
    xs, ns = jnp.array([3, 5, 7, 6]), jnp.array([0, 1, 2, 1])
    want = np.stack([np.asarray(collatz_below(x, n)) for x, n in zip(xs, ns)])
    same(pcbatch.autobatch(collatz_below, fork=fork)(xs, ns), want)


W1 = np.random.default_rng(0).normal(size=(4, 4)).astype(np.float32)
W2 = np.random.default_rng(1).normal(size=(4, 4)).astype(np.float32)


def collatz_after_matmuls(x, h, n):
    v = x * (n <= 0)  # 0 on the path that recurses, as in collatz_below
    if n <= 0:
        a = W1 @ h    # two matmuls of one shape: the memory layout batches the block's ops into one
        b = W2 @ h
        k = jax.lax.while_loop(lambda c: c[0] != 1, lambda c: (jnp.where(c[0] % 2 == 0, c[0] // 2,
                                                                         3 * c[0] + 1), c[1] + 1), (v, 0))[1]
        return jnp.tanh(a) + jnp.tanh(b) * k
    return collatz_after_matmuls(x, h * 0.5, n - 1) + 1.0


@pytest.mark.parametrize("fork", [False, pytest.param(True, marks=pytest.mark.matrix)])
def test_while_loop_in_a_batched_run_runs_only_on_lanes_at_its_block(fork):
    """As above, with the loop in a block whose ops the memory layout rewrites into one
    batched op: that op was not known to hold a loop, and the call never ended."""
    f = pcbatch.autobatch(collatz_after_matmuls, fork=fork)
    xs, ns, hs = jnp.array([3, 5, 7, 6]), jnp.array([0, 1, 2, 1]), jnp.ones((4, 4), jnp.float32)
    assert "batched(" in str(f.lowered(xs, hs, ns))
    want = np.stack([np.asarray(collatz_after_matmuls(x, h, n)) for x, h, n in zip(xs, hs, ns)])
    np.testing.assert_allclose(np.asarray(f(xs, hs, ns)), want, rtol=1e-5)


def collatz_into_buffer(buf, x, i, n):
    v = x * (n <= 0)
    if n <= 0:
        buf = buf.at[i].set(jax.lax.while_loop(  # the register itself rewritten: in place
            lambda c: c[0] != 1, lambda c: (jnp.where(c[0] % 2 == 0, c[0] // 2, 3 * c[0] + 1), c[1] + 1), (v, 0))[1])
        return buf
    return collatz_into_buffer(buf, x, i + 1, n - 1)


def test_while_loop_in_an_in_place_update_runs_only_on_lanes_at_its_block():
    """As above, in `buf.at[i].set(...)` on a register larger than `Tuning.large_register_bytes`,
    which the plain machine updates in place under the lane mask: that path ran the loop on
    every lane, and the call never ended."""
    f = pcbatch.autobatch(collatz_into_buffer, fork=False)
    bufs, xs, ns = jnp.zeros((4, 8192), jnp.int32), jnp.array([3, 5, 7, 6]), jnp.array([0, 1, 2, 1])
    i0 = jnp.zeros(4, jnp.int32)
    want = np.stack([np.asarray(collatz_into_buffer(b, x, i, n)) for b, x, i, n in zip(bufs, xs, i0, ns)])
    np.testing.assert_array_equal(np.asarray(f(bufs, xs, i0, ns)), want)


@pcbatch.autobatch(max_steps=2000)
def range_trips(start, stop, step):
    c = 0
    for i in range(start, stop, step):
        c = c + 1
    return c


@pcbatch.autobatch(max_steps=2000)
def range_trips_up(stop):
    c = 0
    for i in range(0, stop, 2**30):
        c = c + 1
    return c


def test_range_counter_near_the_int32_limits_does_not_wrap():
    top, bottom = 2**31 - 1, -2**31
    start = jnp.array([0, -5, 5, 0, top - 1, bottom + 1])
    stop = jnp.array([top, bottom, top, 10, top, bottom])
    step = jnp.array([2**30, -2**30, top, 3, 5, -7])
    want = [len(range(a, b, s)) for a, b, s in zip(start.tolist(), stop.tolist(), step.tolist())]
    assert np.asarray(range_trips(start, stop, step)).tolist() == want
    assert np.asarray(range_trips_up(jnp.array([top, 10, 2**30 + 1]))).tolist() == [2, 1, 2]


# --- Python numbers are weakly typed: `s = 0` joins an int8 `x` as int8 ---------

def accumulate(x, n):
    s = 0
    for i in range(n):
        s = s + x
    return s


def accumulate_float(x, n):
    s = 0.0
    for i in range(n):
        s = s + x
    return s


@pytest.mark.parametrize("fn, dtype", [(accumulate, jnp.int8), (accumulate, jnp.uint8), (accumulate, jnp.float16),
                                       (accumulate_float, jnp.float16), (accumulate_float, jnp.bfloat16),
                                       (accumulate_float, jnp.int8), (accumulate, jnp.int32)])
def test_python_numbers_join_as_weak_types(fn, dtype):
    f = pcbatch.autobatch(fn)
    x, n = jnp.array([100, 3, 7], dtype), jnp.array([3, 7, 0])
    got = f(x, n)
    same(got, f.reference(x, n))
    assert got.dtype == (jnp.float32 if (fn is accumulate_float and dtype == jnp.int8) else dtype)


# --- a batch of 0 with a shared argument before a batched one ----------------

@pcbatch.autobatch(in_axes=(None, 0))
def scale_unless_done(p, n):
    if n <= 0:
        return p["w"]
    return p["w"] * 2


def test_empty_batch_binds_parameters_in_order():
    empty = jnp.zeros((0,), jnp.int32)
    for call in (scale_unless_done, jax.jit(scale_unless_done)):
        out = call({"w": jnp.float32(0.7)}, empty)
        assert out.shape == (0,) and out.dtype == jnp.float32
    one = scale_unless_done({"w": jnp.float32(0.7)}, jnp.ones((1,), jnp.int32))
    assert one.dtype == jnp.float32


# --- a lambda assigned to a name ------------------------------------------------

@pcbatch.autobatch
def named_lambdas(x, n):
    a = 1
    add_a = lambda v: v + a  # noqa: E731 -- what the user wrote
    s = 0
    for i in range(n):
        a = a + 1  # the lambda reads `a` when called, as Python's does
        s = s + add_a(x)
    pair = jax.tree_util.tree_map(add_a, (x, 2 * x))
    return s, pair


def test_lambda_assigned_to_a_name_is_called_like_python():
    x, n = jnp.array([2, 3, -1]), jnp.array([3, 1, 0])
    same(named_lambdas(x, n), named_lambdas.reference(x, n))


def lambda_as_value(x):
    f = lambda v: v  # noqa: E731
    return f


def lambda_per_branch(x):
    if x > 0:
        f = lambda v: v  # noqa: E731
    else:
        f = lambda v: -v  # noqa: E731
    return f(x)


@pytest.mark.parametrize("fn, says", [(lambda_as_value, "holds a lambda"), (lambda_per_branch, "own body")])
def test_lambdas_pcbatch_cannot_honour_are_named_errors(fn, says):
    with pytest.raises(pcbatch.UnsupportedSyntaxError, match=says):
        pcbatch.autobatch(fn)(jnp.array([1, 2]))


# --- a read that some path reaches before any assignment ------------------------

def unbound_on_one_branch(x):
    if x > 0:
        y = x * 2
    return y


def unbound_after_zero_trips(n):
    for i in range(n):
        v = i * 10
    return v


def assigned_on_every_path(x, n):
    y = 0
    while n > 0:
        y = y + x
        n = n - 1
    t = x if n > 0 else -x
    both = (x > 0) and (n < 3)
    if x > 1:
        z = 1
    else:
        z = 2
    return y + t + both + z


@pytest.mark.parametrize("fn, var, line_text", [(unbound_on_one_branch, "y", "return y"),
                                                (unbound_after_zero_trips, "v", "return v")])
def test_read_before_any_assignment_warns_at_the_line(fn, var, line_text):
    """Python raises UnboundLocalError only where an example takes the path; pcbatch
    cannot, so it says so when it compiles the function (not silently)."""
    with pytest.warns(pcbatch.MaybeUnboundWarning, match=f"`{var}` may be read before it is assigned") as rec:
        pcbatch.autobatch(fn)(jnp.array([1, 2]))
    assert any(line_text in linecache.getline(w.filename, w.lineno) for w in rec)


def test_no_warning_where_every_path_assigns():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f = pcbatch.autobatch(assigned_on_every_path)
        x, n = jnp.array([1, 2, -1]), jnp.array([3, 0, 2])
        same(f(x, n), f.reference(x, n))


def assigned_unless_raised(x):
    if x < 0:
        raise ValueError("negative")
    else:
        y = x * 2
    assert x != 3, "three"
    return y


def test_no_warning_where_the_other_paths_raise():
    """A path through `raise` ends there: `y` is assigned on every path that reaches the return."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f = pcbatch.autobatch(assigned_unless_raised)
        x = jnp.array([1, 2, 5])
        same(f(x), f.reference(x))


def builtin_max(a, b):
    c = max(a, b)
    return c


def test_python_builtins_on_traced_values_say_what_to_write():
    """`max` of scalars is Python's (test_frontend_semantics); of per-example
    vectors Python raises for every example: a named error with the rewrite."""
    with pytest.raises(pcbatch.UnsupportedSyntaxError) as info:
        pcbatch.autobatch(builtin_max)(jnp.array([[1, 2], [3, 4]]), jnp.array([[3, 0], [1, 1]]))
    assert "c = max(a, b)" in str(info.value) and "jnp.maximum" in str(info.value)
