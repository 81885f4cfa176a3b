"""pcbatch.differentiation: the differentiation mode from the tracers' types."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from pcbatch import differentiation


def seen(transform, x=1.0):
    """The mode `differentiation.mode` sees for `x` under `transform`."""
    modes = []

    def f(x):
        modes.append(differentiation.mode([x]))
        return x * x

    transform(f)(jnp.float32(x))
    return modes[-1]


def test_the_tracer_classes_are_found():
    assert differentiation.FORWARD and differentiation.REVERSE
    assert all(issubclass(c, jax.core.Tracer) for c in differentiation.FORWARD + differentiation.REVERSE)


def test_modes():
    assert differentiation.mode([jnp.ones(3), 1.0]) is None
    assert seen(lambda f: f) is None
    assert seen(jax.jit) is None
    assert seen(jax.grad) is None
    assert seen(lambda f: jax.jit(jax.grad(f))) is None
    assert seen(lambda f: (lambda x: jax.jvp(f, (x,), (x,)))) == "forward"
    assert seen(jax.jacfwd) == "forward"
    assert seen(lambda f: jax.jit(jax.jacfwd(f))) == "forward"
    assert seen(lambda f: jax.vmap(jax.jacfwd(f)), x=jnp.ones(2)) == "forward"
    assert seen(jax.hessian) == "mixed"
    assert seen(lambda f: jax.jit(jax.hessian(f))) == "mixed"

