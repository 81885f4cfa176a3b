"""Gradients where things go wrong or could: junk in idle lanes and padding
rows, forward mode (also through jit, and over reverse mode), stack overflow / max_steps inside a differentiated call
(eager: the named error; inside jit: NaN gradients for the failed examples and
a checkify error), and the tape's capacity (grows outside jit; a fixed size
raises `TapeOverflowError`; inside jit: NaN and a checkify error naming the
size)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

import pcbatch
from grad_helpers import assert_close, check_vjp


@pcbatch.autobatch
def junk(x, n):
    """Examples with n <= 0 hold x == 0 while the first branch runs for the
    others: sqrt, 1/x and log of their zero would be inf/NaN under a masked
    (all-lanes) VJP."""
    if n > 0:
        return jnp.sqrt(x) + 1.0 / x + jnp.log(x)
    return 2.0 * x


@pcbatch.autobatch(lane_width=16)
def junk_fork(x, n):
    """Forked, with float arguments spawned into the children; each step runs
    a few lanes in a 16-row batch: padding rows."""
    if n <= 0:
        return jnp.sqrt(x) + 1.0 / x
    a = junk_fork(x * 2.0, n - 1)
    b = junk_fork(x + 1.0, n - 2)
    return a * jnp.log(b)


def test_junk_in_idle_lanes_gives_no_nan():
    # three examples, as the forward-mode tests below: their recorded forward compiles once
    x = jnp.asarray([0.0, 4.0, 2.0])
    n = jnp.asarray([0, 1, 3])
    g = check_vjp(junk, (x, n), positions=(0,))   # also asserts every cotangent is finite
    assert np.asarray(g[0])[0] != 0.0


def test_junk_in_padding_rows_gives_no_nan():
    check_vjp(junk_fork, (jnp.asarray([0.5, 2.0, 1.5]), jnp.asarray([3, 0, 2])), positions=(0,))


def reverse_mode_jacobian(f, x, n):
    """The machine's Jacobian by reverse mode, checked against the per-example Python's."""
    if f is junk:   # jax.jacrev: a vmap over the backward
        jac = jax.jacrev(lambda x: f(x, n))(x)
    else:           # the pool's reverse mode row by row: the backward check_vjp compiled for these shapes
        _, pull = jax.vjp(lambda x: f(x, n), x)
        jac = jnp.stack([pull(row)[0] for row in jnp.eye(len(x))])
    assert_close(jac, jax.jacrev(lambda x: f.reference(x, n))(x))
    return jac


@pytest.mark.parametrize("f", [junk, junk_fork], ids=["plain", "fork"])
def test_forward_mode_equals_reverse_mode(f):
    """jax.jvp differentiates the machine itself (JAX's forward mode of a while
    loop), eagerly (inside jit: test_forward_mode_through_jit)."""
    x, n = jnp.asarray([1.0, 4.0, 0.5]), jnp.asarray([1, 0, 2])
    jac = reverse_mode_jacobian(f, x, n)
    t = jnp.asarray([1.0, -2.0, 0.5])
    y, dy = jax.jvp(lambda x: f(x, n), (x,), (t,))
    assert_close(y, f.reference(x, n))
    assert_close(dy, jac @ t)
    if f is junk:  # the per-example derivative by hand
        expected = np.where(np.asarray(n) > 0, 0.5 / np.sqrt(x) - 1.0 / x ** 2 + 1.0 / x, 2.0)
        assert_close(jnp.diag(jac), expected)


# Each cell compiles the machine's forward mode under vmap: the pool's in make test-matrix.
@pytest.mark.parametrize("f", [junk, pytest.param(junk_fork, marks=pytest.mark.matrix)], ids=["plain", "fork"])
def test_jacfwd_equals_reverse_mode(f):
    """jax.jacfwd: JAX's forward mode of the machine, vmapped over the tangents."""
    x, n = jnp.asarray([1.0, 4.0, 0.5]), jnp.asarray([1, 0, 2])
    assert_close(jax.jacfwd(lambda x: f(x, n))(x), reverse_mode_jacobian(f, x, n))


@pytest.mark.parametrize("f", [junk, pytest.param(junk_fork, marks=pytest.mark.matrix)], ids=["plain", "fork"])
def test_forward_mode_through_jit(f):
    """jax.jvp, jax.linearize and jax.jacfwd of a jit-compiled function that
    calls an autobatched one (pcbatch cannot see the differentiation coming:
    the machine's custom_jvp evaluates its linear map forwards), and jax.jvp
    inside jit."""
    x, n = jnp.asarray([1.0, 4.0, 0.5]), jnp.asarray([1, 0, 2])
    t = jnp.asarray([1.0, -2.0, 0.5])
    g = jax.jit(lambda x: f(x, n))
    want_y, want_dy = jax.jvp(lambda x: f.reference(x, n), (x,), (t,))
    y, dy = jax.jvp(g, (x,), (t,))
    assert_close(y, want_y)
    assert_close(dy, want_dy)
    _, dy_inside = jax.jit(lambda x, t: jax.jvp(lambda x: f(x, n), (x,), (t,)))(x, t)
    assert_close(dy_inside, want_dy)
    if f is junk:  # the plain machine only: another compile of the pool's forward mode
        y, lin = jax.linearize(g, x)
        assert_close(lin(t), want_dy)
    assert_close(jax.jacfwd(g)(x), jax.jacfwd(lambda x: f.reference(x, n))(x))


# The pool's Hessian is one compile of ~12 CPU-s (its backward loop, differentiated forwards):
# make test-matrix runs it; make test the plain machine's (the pool's forward and reverse modes
# are in make test above).
@pytest.mark.parametrize("f", [junk, pytest.param(junk_fork, marks=pytest.mark.matrix)], ids=["plain", "fork"])
def test_forward_over_reverse(f):
    """jax.hessian (forward over reverse: JAX's jvp of the backward loop) under
    jit, against the per-example Python's Hessian."""
    x, n = jnp.asarray([1.0, 2.0, 0.7]), jnp.asarray([1, 0, 2])
    want = jax.hessian(lambda x: f.reference(x, n).sum())(x)
    assert_close(jax.jit(jax.hessian(lambda x: f(x, n).sum()))(x), want)


# Eager (jacfwd of grad is jax.hessian's own composition) and of a jit-compiled loss: each is
# another compile of the backward loop's forward mode; the jitted Hessian above is make test's.
@pytest.mark.matrix
def test_forward_over_reverse_eager_and_of_a_jitted_function():
    x, n = jnp.asarray([1.0, 2.0, 0.7]), jnp.asarray([1, 0, 2])
    want = jax.hessian(lambda x: junk.reference(x, n).sum())(x)
    loss = lambda x: junk(x, n).sum()  # noqa: E731
    for hessian in (jax.jacfwd(jax.grad(loss)), jax.hessian(jax.jit(loss))):
        assert_close(hessian(x), want)


@pcbatch.autobatch(in_axes=(None, 0, 0), max_stack_depth=4, max_steps=200)
def deep(w, x, n):
    if n <= 0:
        return x
    if n > 50:   # runs away
        while n > 0:
            x = x * w
        return x
    return w * deep(w, x, n - 1) + x


W = jnp.float32(0.5)
X = jnp.asarray([1.0, 2.0, 3.0])


def loss(w, x, n):
    return jnp.sum(deep(w, x, n) ** 2)


# One jitted function for both cells below: the same shapes, so it compiles once (a
# checkify(jax.jit(...)) made in each test compiled the same program twice).
checked_jit_grad = jax.jit(checkify.checkify(jax.grad(loss, argnums=(0, 1))))


@pytest.mark.parametrize("n, error", [([2, 10, 1], pcbatch.StackOverflowError),
                                      ([2, 60, 1], pcbatch.MaxStepsExceededError)])
def test_failures_inside_differentiated_calls(n, error):
    n = jnp.asarray(n)
    with pytest.raises(error):                             # eager: named errors, at the forward pass
        jax.grad(loss, argnums=(0, 1))(W, X, n)
    # jit: NaN, never garbage, and a checkify error (one compile: checkify only adds the error
    # output; the NaN comes from the same program either way)
    err, (gw, gx) = checked_jit_grad(W, X, n)
    assert np.isnan(gw)
    gx = np.asarray(gx)
    assert np.isnan(gx[1]) and np.all(np.isfinite(gx[[0, 2]]))
    want = jax.grad(lambda x: jnp.sum(deep.reference(W, x[jnp.asarray([0, 2])], n[jnp.asarray([0, 2])]) ** 2))(X)
    assert_close(gx[[0, 2]], np.asarray(want)[[0, 2]])
    with pytest.raises(Exception, match="pcbatch: (recursion deeper|max_steps)"):
        err.throw()


@pcbatch.autobatch
def long_loop(x, n):
    acc = 0.0
    for i in range(n):
        acc = acc * 0.5 + jnp.sin(x * i)
    return acc


def test_tape_grows_outside_jit_and_is_fixed_when_given():
    x, n = jnp.asarray([0.3, 0.7]), jnp.asarray([300, 5])   # the loop body runs 305 times: > 256 per example
    info = long_loop.tape_info(x, n)
    assert info.needed == 153 and max(info.rows.values()) == 305 and info.bytes_used < info.bytes_allocated
    f = long_loop.with_options(tape_size=100)
    with pytest.raises(pcbatch.TapeOverflowError, match="tape_size=153"):
        jax.grad(lambda x: jnp.sum(f(x, n)))(x)
    # inside jit: NaN and a checkify error (one compile, as in test_failures_inside_differentiated_calls)
    err, g = checkify.checkify(jax.jit(jax.grad(lambda x: jnp.sum(f(x, n)))))(x)
    assert np.all(np.isnan(np.asarray(g)))
    with pytest.raises(Exception, match="tape overflowed; pass tape_size=153"):
        err.throw()
    # the default size grows outside jit (and keeps the size for later calls, jit included): 600
    # iterations need more than its 256 rows per example (the 305 above fit; the same shapes, so the
    # forward at 256 is tape_info's). Gradients at the default size are every other check_vjp's.
    longer = jnp.asarray([600, 5])
    assert long_loop.tape_info(x, longer)[:2] == (256, 303)
    # Eager, then inside jit (which cannot grow the tape: at 256 rows it would give NaN), against
    # one run of the oracle.
    check_vjp(long_loop, (x, longer), positions=(0,), jit=(False, True))
    assert long_loop.tape_info(x, longer).tape_size == 512


def _model(w, x, n):
    if n <= 0:
        return x * w
    return x * w * w + 1.0


class _Scorer:
    """A plain object whose method reads a parameter from `self`."""

    def __init__(self, w):
        self.w = w

    @pcbatch.autobatch
    def score(self, x, n):
        if n <= 0:
            return x * self.w
        return x * self.w * self.w + 1.0


_X, _N = jnp.asarray([0.3, -1.2, 2.0, 0.9]), jnp.asarray([0, 3, 1, 5])


def _by_partial(w):
    import functools
    return pcbatch.autobatch(functools.partial(_model, w))(_X, _N).sum()


def _by_closure(w):
    @pcbatch.autobatch
    def g(x, n):
        if n <= 0:
            return x * w
        return x * w * w + 1.0
    return g(_X, _N).sum()


def _by_method(w):
    return _Scorer(w).score(_X, _N).sum()


def _reference(w):
    return sum(_model(w, x, n) for x, n in zip(_X, _N))


@pytest.mark.parametrize("loss", [_by_partial, _by_closure, _by_method], ids=["partial", "closure", "method"])
def test_reverse_mode_through_a_captured_value_is_a_named_error(loss):
    """A value the function captures (a partial's argument, a closure variable, `self.w`) is a
    constant of the program: jax.grad with respect to it raises ArgumentError naming it, eager
    and under jit (JAX's own errors were a ValueError about compiler options or while loops);
    jit, vmap and jvp over it give the per-example Python's values."""
    # jax.grad of the jitted loss too (JAX traces the jit's program again to differentiate it:
    # a raw "No constant handler" TypeError before).
    for grad in (jax.grad(loss), jax.jit(jax.grad(loss)), jax.grad(jax.jit(loss))):
        with pytest.raises(pcbatch.ArgumentError, match="captured by the function") as err:
            grad(2.0)
        assert "w" in str(err.value) or "self" in str(err.value)
    np.testing.assert_allclose(jax.jit(loss)(2.0), _reference(2.0), rtol=1e-6)
    np.testing.assert_allclose(jax.vmap(loss)(jnp.array([2.0, 0.5])), [_reference(2.0), _reference(0.5)], rtol=1e-6)
    primal, tangent = jax.jvp(loss, (2.0,), (1.0,))
    want_primal, want_tangent = jax.jvp(_reference, (2.0,), (1.0,))
    np.testing.assert_allclose([primal, tangent], [want_primal, want_tangent], rtol=1e-6)
    # jvp inside jit, with respect to the captured value only (the call's own arguments are not
    # differentiated): the tangent's tracer escaped through the gradient machine's custom_jvp.
    primal, tangent = jax.jit(lambda w: jax.jvp(loss, (w,), (1.0,)))(2.0)
    np.testing.assert_allclose([primal, tangent], [want_primal, want_tangent], rtol=1e-6)


def _captures_y(w, y):
    """`y` captured, `w` an argument (shared by the batch)."""
    def inner(w, x, n):
        acc = x * w
        for _ in range(n):
            acc = jnp.tanh(acc * w + y)
        return acc
    return pcbatch.autobatch(inner, in_axes=(None, 0, 0))(w, _X, _N).sum()


def _captures_y_reference(w, y):
    total = 0.0
    for x, n in zip(_X, _N):
        acc = x * w
        for _ in range(int(n)):
            acc = jnp.tanh(acc * w + y)
        total = total + acc
    return total


def test_a_captured_value_not_differentiated_under_jit_and_grad():
    """A captured value that is not differentiated: jax.grad inside jax.jit equals the
    per-example Python's; jax.grad of the jitted function traces the jit's program again,
    where the captured value cannot be read: a named error (a raw TypeError before)."""
    want = jax.grad(_captures_y_reference)(0.7, 0.2)
    np.testing.assert_allclose(jax.jit(jax.grad(_captures_y))(0.7, 0.2), want, rtol=1e-5)
    with pytest.raises(pcbatch.ArgumentError, match="`y` is captured by the function"):
        jax.grad(jax.jit(_captures_y))(0.7, 0.2)


def guarded_power(w, x, n):
    acc = x * w
    for i in range(n):
        assert acc < 4.0, "too big"
        acc = acc * acc * w + i
    return acc


guarded = pcbatch.autobatch(guarded_power, in_axes=(None, 0, 0))
# x and n are arguments, not constants of the program: one compile for the two tests below.
guarded_hessian = jax.jit(jax.hessian(lambda w, x, n: guarded(w, x, n).sum()))


def test_forward_mode_marks_failed_examples_nan():
    """A failed example's tangent is NaN, as its value and its reverse-mode gradient are:
    `jnp.where(failed, nan, x)` differentiated to 0 there (a clean-looking Hessian of 0.0)."""
    f = guarded
    w, x, n = jnp.float32(1.0), jnp.array([0.5, 1.5, 0.1]), jnp.array([2, 3, 1])  # example 1 fails
    assert np.isnan(float(guarded_hessian(w, x, n)))
    rows = np.asarray(jax.jit(jax.jacfwd(lambda w: f(w, x, n)))(w))
    assert np.isnan(rows[1]) and np.all(np.isfinite(rows[[0, 2]]))
    keep = jnp.array([0, 2])  # the others' entries are exact
    want = jax.jacfwd(lambda w: f.reference(w, x[keep], n[keep]))(w)
    np.testing.assert_allclose(rows[[0, 2]], want, rtol=1e-6)
    _, tangent = jax.jvp(lambda x: f(w, x, n), (x,), (jnp.ones(3),))
    assert np.isnan(np.asarray(tangent)[1]) and np.all(np.isfinite(np.asarray(tangent)[[0, 2]]))


def test_a_hessian_through_an_overflowed_tape_is_nan():
    w, x, n = jnp.float32(1.0), jnp.array([0.5, 0.9, 0.1]), jnp.array([2, 3, 4])  # none fails (acc < 4)
    overflowed = guarded.with_options(tape_size=2)   # 9 rows of the loop's block for 3 examples: 3 each
    assert np.isnan(float(jax.jit(jax.hessian(lambda w: overflowed(w, x, n).sum()))(w)))
    # with room (the default tape): the per-example Python's Hessian
    want = jax.hessian(lambda w: sum(guarded.reference(w, x[i:i + 1], n[i:i + 1]).sum() for i in range(3)))(w)
    np.testing.assert_allclose(guarded_hessian(w, x, n), want, rtol=1e-5)
