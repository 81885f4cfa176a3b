"""Arguments bind the way Python binds them, and follow `in_axes` per parameter.

Every result is checked against the plain Python function run per example
(`jax.vmap` where it accepts the same call, or a loop)."""
from __future__ import annotations

import functools
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pcbatch

XS = jnp.arange(4.0)
NS = jnp.array([0, 1, 2, 3])


def loop(fn, *batched, **shared):
    """The per-example Python results, stacked."""
    return np.stack([np.asarray(fn(*(b[i] for b in batched), **shared)) for i in range(len(batched[0]))])


def affine_py(x, a=2.0, b=0.0):
    return a * x + b


affine = pcbatch.autobatch(affine_py, fork=False)


@pytest.mark.parametrize("call, expected", [
    (lambda f: f(XS), lambda: loop(affine_py, XS)),
    (lambda f: f(XS, b=10.0), lambda: loop(affine_py, XS, b=10.0)),          # the skipped default stays
    (lambda f: f(XS, 3.0), lambda: loop(affine_py, XS, a=3.0)),
    (lambda f: f(b=1.0, x=XS, a=-1.0), lambda: loop(affine_py, XS, a=-1.0, b=1.0)),
    (lambda f: f(XS, b=XS), lambda: loop(lambda x: affine_py(x, b=x), XS)),   # a batched keyword
])
def test_positional_keyword_and_defaults(call, expected):
    np.testing.assert_allclose(call(affine), expected())
    np.testing.assert_allclose(jax.jit(lambda: call(affine))(), expected())


def test_keyword_binding_under_jit_with_traced_keyword():
    out = jax.jit(lambda x, b: affine(x, b=b))(XS, jnp.float32(10.0))
    np.testing.assert_allclose(out, loop(affine_py, XS, b=10.0))


def kw_only_py(x, *, scale=1.0, shift=0.0):
    return x * scale + shift


def test_keyword_only_parameters():
    f = pcbatch.autobatch(kw_only_py, fork=False)
    np.testing.assert_allclose(f(XS, shift=2.0), loop(kw_only_py, XS, shift=2.0))
    np.testing.assert_allclose(f(XS, scale=XS), XS * XS)


def test_in_axes_per_parameter_follows_keywords():
    w = jnp.array([1.0, -1.0])
    xs = jnp.ones((3, 2))
    f = pcbatch.autobatch(lambda_free_dot, in_axes=(None, 0), fork=False)
    np.testing.assert_allclose(f(w=w, x=xs), xs @ w)          # both by keyword
    np.testing.assert_allclose(f(w, x=xs), xs @ w)
    g = pcbatch.autobatch(lambda_free_dot, in_axes={"w": None}, fork=False)
    np.testing.assert_allclose(g(w, xs), xs @ w)


def lambda_free_dot(w, x):
    return jnp.dot(w, x)


def test_in_axes_nonzero_axis():
    xs = jnp.arange(6.0).reshape(2, 3)  # batch along axis 1
    f = pcbatch.autobatch(affine_py, in_axes=1, fork=False)
    np.testing.assert_allclose(f(xs), jax.vmap(affine_py, in_axes=1)(xs))


def test_python_numbers_lists_and_numpy_scalars():
    np.testing.assert_allclose(affine([0.0, 1.0, 2.0]), loop(affine_py, jnp.asarray([0.0, 1.0, 2.0])))
    np.testing.assert_allclose(affine(XS, np.float32(3.0)), loop(affine_py, XS, a=3.0))
    np.testing.assert_allclose(affine(XS, [2.0, 2.0, 2.0, 2.0]), loop(affine_py, XS, XS * 0 + 2.0))


def test_numpy_float64_arguments_convert_silently_as_in_jax():
    """Without x64, JAX takes a float64 NumPy array as float32 without a word; pcbatch's check
    that JAX holds the dtype warned "Explicitly requested dtype float64", from pcbatch's code."""
    from pcbatch import arguments
    arguments._JAX_DTYPES.clear()  # the check runs once per dtype per process
    xs = np.arange(4.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(affine(xs), loop(affine_py, jnp.asarray(xs)))


def test_bad_arguments_are_named_errors():
    with pytest.raises(pcbatch.ArgumentError, match="argument `x` holds a string"):
        affine("abc")
    with pytest.raises(pcbatch.ArgumentError, match="argument `a` holds a object"):
        affine(XS, object())
    with pytest.raises(pcbatch.ArgumentError, match="unexpected keyword argument 'c'"):
        affine(XS, c=1.0)
    with pytest.raises(pcbatch.ArgumentError, match="different batch sizes"):
        affine(XS, jnp.ones(3))
    with pytest.raises(pcbatch.ArgumentError, match="no argument is batched"):
        affine(1.0)
    with pytest.raises(TypeError):  # also what jax.vmap users catch
        affine(XS, 1.0, 2.0, 3.0)
    with pytest.raises(pcbatch.OptionError, match="in_axes"):
        pcbatch.autobatch(affine_py, in_axes=(0, 0, 0, 0))
    with pytest.raises(pcbatch.OptionError, match="names no parameter"):
        pcbatch.autobatch(affine_py, in_axes={"y": 0})
    with pytest.raises(pcbatch.ArgumentError, match="rank 0"):
        pcbatch.autobatch(affine_py, in_axes=(0, 0))(XS, 2.0)
    with pytest.raises(pcbatch.OptionError, match="max_stack_depth"):
        pcbatch.autobatch(affine_py, max_stack_depth=0)
    with pytest.raises(pcbatch.OptionError, match="fork"):
        pcbatch.autobatch(affine_py, fork="yes")


def power_py(x, n):
    return 1.0 if n == 0 else x * power_py(x, n - 1)


@pytest.mark.parametrize("fork", [False, True])
def test_autobatch_called_not_decorated_is_recursion(fork):
    """`fast = pcbatch.autobatch(power_py)`: the recursive call reaches the
    undecorated global; it is still recursion."""
    fast = pcbatch.autobatch(power_py, fork=fork)
    np.testing.assert_allclose(fast(XS, NS), loop(power_py, XS, NS))


def scaled_power_py(w, x, n):
    return 1.0 if n == 0 else w * x * scaled_power_py(w, x, n - 1)


def test_functools_partial():
    w = jnp.float32(0.5)
    f = pcbatch.autobatch(functools.partial(scaled_power_py, w), fork=False)
    np.testing.assert_allclose(f(XS, NS), loop(functools.partial(scaled_power_py, w), XS, NS))
    g = pcbatch.autobatch(functools.partial(affine_py, b=5.0), fork=False)
    np.testing.assert_allclose(g(XS), loop(affine_py, XS, b=5.0))
    with pytest.raises(pcbatch.ArgumentError, match="fixed by functools.partial"):
        g(XS, b=1.0)
    # Fixed by keyword, the parameters after it take keywords only, as Python's partial binds them:
    # `partial(affine_py, a=3.0)(XS, 1.0)` is Python's TypeError, never `b=1.0`.
    h = pcbatch.autobatch(functools.partial(affine_py, a=3.0), fork=False)
    with pytest.raises(pcbatch.ArgumentError, match="positional"):
        h(XS, 1.0)
    np.testing.assert_allclose(h(XS, b=1.0), loop(affine_py, XS, a=3.0, b=1.0))


GLOBAL_W = jnp.float32(2.0)


def global_power_py(x, n):
    return GLOBAL_W if n == 0 else x * global_power_py(x, n - 1)


def test_globals_are_read_once_for_every_machine(monkeypatch):
    """A global rebound after the first call is not seen by any later call of
    the function (f.checked's machine, built later, included), as a closure's
    variable is not; a new autobatch(fn) reads it again."""
    f = pcbatch.autobatch(global_power_py, fork=False)
    old = loop(global_power_py, XS, NS)
    np.testing.assert_allclose(f(XS, NS), old)
    monkeypatch.setattr(sys.modules[__name__], "GLOBAL_W", jnp.float32(-3.0))
    np.testing.assert_allclose(f.checked(XS, NS)[0], old)
    np.testing.assert_allclose(pcbatch.autobatch(global_power_py, fork=False)(XS, NS), loop(global_power_py, XS, NS))


class Scaler:
    def __init__(self, w):
        self.w = w          # a plain object: not a pytree

    @pcbatch.autobatch(fork=False)
    def power(self, x, n):
        return 1.0 if n == 0 else self.w * x * self.power(x, n - 1)

    def plain_power(self, x, n):
        return 1.0 if n == 0 else self.w * x * self.plain_power(x, n - 1)


def test_methods_and_bound_methods():
    s, t = Scaler(jnp.float32(2.0)), Scaler(jnp.float32(-1.0))
    for obj in (s, t):
        expected = loop(lambda x, n: obj.plain_power(x, n), XS, NS)
        np.testing.assert_allclose(obj.power(XS, NS), expected)
        np.testing.assert_allclose(pcbatch.autobatch(obj.plain_power, fork=False)(XS, NS), expected)
    assert s.power is s.power  # compiled once per instance
    # A fixed object passed on to the recursive call is no array: the hint says how to pass it.
    passed_on = pcbatch.autobatch(functools.partial(lambda_free_passed_on, s), fork=False)
    with pytest.raises(pcbatch.UnsupportedSyntaxError, match="register `Scaler` as a JAX pytree"):
        passed_on(XS, NS)


def lambda_free_passed_on(obj, x, n):
    return 1.0 if n == 0 else obj.w * x * lambda_free_passed_on(obj, x, n - 1)


@pytest.mark.parametrize("fork", [False, True])
def test_empty_batch_like_vmap(fork):
    f = pcbatch.autobatch(power_py, fork=fork)
    out = f(jnp.zeros((0,), jnp.float32), jnp.zeros((0,), jnp.int32))
    want = jax.vmap(lambda x, n: x * n)(jnp.zeros((0,)), jnp.zeros((0,), jnp.int32))
    assert out.shape == (0,) and out.dtype == jnp.float32 == want.dtype
    out = jax.jit(f)(jnp.zeros((0,), jnp.float32), jnp.zeros((0,), jnp.int32))
    assert out.shape == (0,)
    # The status has a batch's shapes too: per-example flags empty, `steps` and `peak_lanes` scalars
    # (no step ran), as `f.checked` gives them for any other batch.
    _, status = f.checked(jnp.zeros((0,), jnp.float32), jnp.zeros((0,), jnp.int32))
    assert status.overflow.shape == status.failed.shape == (0,)
    assert status.steps.shape == status.peak_lanes.shape == () and int(status.steps) == 0
    tup = pcbatch.autobatch(lambda_free_pair, fork=False)(jnp.zeros((0, 3)))
    assert [t.shape for t in tup] == [(0, 3), (0,)]


def lambda_free_pair(x):
    return x * 2, jnp.sum(x).astype(jnp.int32)


def test_batch_of_one():
    np.testing.assert_allclose(pcbatch.autobatch(power_py)(XS[:1], NS[3:]), loop(power_py, XS[:1], NS[3:]))


@pcbatch.autobatch(in_axes=(0, None))
def bump(d, a):
    a += 1  # in place on a NumPy array, in plain Python
    return a + d


def test_reference_never_mutates_numpy_arguments():
    """Found by `make fuzz`: `a += 1` on a NumPy argument changed the caller's
    array in `f.reference`, so the next example and the next call saw a
    different input than the machine."""
    d, a = np.array([0, 10, 20], np.int32), np.array(5, np.int32)
    want = np.array([6, 16, 26], np.int32)
    for _ in range(2):
        np.testing.assert_array_equal(bump.reference(d, a), want)
        np.testing.assert_array_equal(bump(d, a), want)
    assert int(a) == 5 and d.tolist() == [0, 10, 20]


def test_repeated_positional_calls_bind_alike():
    """A call's binding is remembered by its arguments' shapes (`Autobatched._bind`):
    the next call with the same shapes, other values or another shared argument
    binds the same way, and other shapes or a default left out bind afresh."""
    f = pcbatch.autobatch(affine_py, in_axes=(0, None, 0), fork=False)
    a, b = jnp.float32(2.0), jnp.arange(4.0) * 10
    np.testing.assert_allclose(f(XS, a, b), loop(lambda x, y: affine_py(x, a, y), XS, b))
    np.testing.assert_allclose(f(XS + 1, jnp.float32(-3.0), b), loop(lambda x, y: affine_py(x, -3.0, y), XS + 1, b))
    ys = jnp.arange(6.0)
    np.testing.assert_allclose(f(ys, a, ys), loop(lambda x, y: affine_py(x, a, y), ys, ys))
    np.testing.assert_allclose(f(XS, a), loop(lambda x: affine_py(x, a), XS))   # b's default
    with pytest.raises(pcbatch.ArgumentError, match="batch sizes"):
        f(XS, a, ys)


def none_beside_py(s):
    return jnp.sum(s["b"]) * s["c"] + s["d"][1]


@pytest.mark.parametrize("in_axes", [0, {"s": {"a": None, "b": 0, "c": 0, "d": (None, 0)}}],
                         ids=["scalar", "tree"])
def test_none_inside_a_pytree_argument_takes_no_axis(in_axes):
    """Found by a bug hunt: a `None` leaf shifted the axes onto the leaves after
    it, so every example summed the whole batch of `b` (f.reference too)."""
    b, c, d = jnp.arange(6.0).reshape(3, 2), jnp.array([1.0, -1.0, 2.0]), jnp.array([3.0, 4.0, 5.0])
    s = {"a": None, "b": b, "c": c, "d": (None, d)}
    f = pcbatch.autobatch(none_beside_py, in_axes=in_axes, fork=False)
    want = [float(np.sum(b[i]) * c[i] + d[i]) for i in range(3)]
    np.testing.assert_allclose(f(s), want)
    np.testing.assert_allclose(f.reference(s), want)


def test_vmap_over_an_empty_outer_axis():
    """jax.vmap of a call over a size-0 axis: JAX's batching rule for checkify's
    check indexed the empty batch (a raw IndexError)."""
    f = pcbatch.autobatch(power_py, fork=False)
    out = jax.vmap(f)(jnp.zeros((0, 2)), jnp.zeros((0, 2), jnp.int32))
    assert out.shape == (0, 2)


@pytest.mark.parametrize("bad, says", [([[1.0, 2.0], [3.0]], "list JAX cannot make an array of"),
                                       (np.array(["a", "b"]), "dtype <U1"),
                                       (np.zeros(4, np.longdouble), "which JAX cannot hold")],
                         ids=["ragged", "strings", "longdouble"])
def test_arrays_jax_cannot_hold_are_argument_errors(bad, says):
    with pytest.raises(pcbatch.ArgumentError, match=says):
        affine(XS, bad)
