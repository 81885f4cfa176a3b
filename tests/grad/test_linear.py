"""`runtime/grad/linear.py` on its own: a linear map given with its transpose
(here y = A(r) @ t, A depending on a residual r) composes with every JAX
transformation the machine's derivative needs; and `runtime/uninitialized.py`
is left alone by vmap."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from pcbatch.runtime.grad.linear import Linear, linear_call
from pcbatch.runtime.uninitialized import uninitialized


def matrix(r):
    return jnp.stack([jnp.sin(r) * jnp.arange(1.0, 4.0), jnp.cos(r) + jnp.arange(3.0)])  # [2, 3]


def rule(r):
    return Linear(lambda r, t: [matrix(r) @ t], lambda r, ct: [matrix(r).T @ ct], 1,
                  [jax.core.ShapedArray((2,), jnp.float32)])


def f(r, x):
    """A function whose derivative in x goes through the linear map."""
    @jax.custom_jvp
    def g(x):
        return jnp.tanh(matrix(r) @ x)

    @g.defjvp
    def g_jvp(primals, tangents):
        (x,), (dx,) = primals, tangents
        y = matrix(r) @ x
        (dy,) = linear_call(rule(r), [r], [dx])
        return jnp.tanh(y), (1 - jnp.tanh(y) ** 2) * dy

    return g(x)


def plain(r, x):
    return jnp.tanh(matrix(r) @ x)


R, X = jnp.float32(0.3), jnp.asarray([0.5, -1.0, 2.0])


def close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def oracle(expected):
    """`expected()`, plain JAX with no linear map, as one jit-compiled program: eagerly, each of
    its transformed ops compiled a program of its own (most of this file's ~200 compiles)."""
    return jax.jit(expected)()


def test_forward_reverse_and_batched():
    t = jnp.asarray([1.0, 0.5, -2.0])
    want_dy = oracle(lambda: jax.jvp(lambda x: plain(R, x), (X,), (t,))[1])
    close(jax.jvp(lambda x: f(R, x), (X,), (t,))[1], want_dy)
    close(jax.jit(lambda x, t: jax.jvp(lambda x: f(R, x), (x,), (t,)))(X, t)[1], want_dy)
    jacobian = oracle(lambda: jax.jacfwd(lambda x: plain(R, x))(X))
    close(jax.jacfwd(lambda x: f(R, x))(X), jacobian)   # vmap over the tangents
    close(jax.jacrev(lambda x: f(R, x))(X), jacobian)   # the transpose, vmapped
    close(jax.grad(lambda x: f(R, x).sum())(X), oracle(lambda: jax.grad(lambda x: plain(R, x).sum())(X)))
    xs = jnp.stack([X, 2 * X])
    want = oracle(lambda: jax.vmap(jax.grad(lambda x: plain(R, x).sum()))(xs))
    close(jax.vmap(jax.grad(lambda x: f(R, x).sum()))(xs), want)
    close(jax.grad(lambda xs: jax.vmap(lambda x: f(R, x))(xs).sum())(xs), want)   # the same numbers


def test_second_order():
    close(jax.hessian(lambda x: f(R, x).sum())(X), oracle(lambda: jax.hessian(lambda x: plain(R, x).sum())(X)))
    close(jax.jacfwd(jax.jacfwd(lambda x: f(R, x)))(X),
          oracle(lambda: jax.jacfwd(jax.jacfwd(lambda x: plain(R, x)))(X)))


def test_uninitialized_is_not_batched_by_vmap():
    out = jax.vmap(lambda x: (x + 1, uninitialized((4,), jnp.int32)), out_axes=(0, None))(jnp.arange(3))
    assert out[1].shape == (4,) and out[1].dtype == jnp.int32
    assert jax.jit(lambda: uninitialized((2, 3), jnp.float32))().shape == (2, 3)
