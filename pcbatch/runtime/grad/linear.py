"""A linear map with its own transpose: how the machine's derivative reaches JAX.

The machine is a `lax.while_loop`: JAX differentiates it forwards but cannot
transpose it. `Differentiable` therefore gives the machine a `jax.custom_jvp`
whose tangent is one `linear_p` equation, linear in the input tangents, with

* `forward(*residuals, *tangents)`: the tangents out, by JAX's forward mode of
  the plain machine (`jax.jvp`, `jax.jacfwd`, `jax.linearize`; also under
  `jit`, where pcbatch cannot see that a call will be differentiated);
* `backward(*residuals, *cotangents)`: the cotangents in, by the recorded tape
  replayed backwards (reverse mode: the transpose rule).

So JAX's entry points compose: reverse mode transposes the equation,
forward mode evaluates it, forward over reverse (`jax.hessian`) differentiates
the backward loop forwards, and `vmap` batches both functions. Reverse over
reverse would transpose the backward loop, which JAX cannot. JAX's own
`custom_derivatives.linear_call` has the same shape but no batching rule
(`jax.jacfwd` vmaps the tangents), hence this primitive.
"""
from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

__all__ = ["Linear", "linear_call"]


class Linear:
    """One linear map: `forward`, its transpose `backward`, both taking the
    `num_residuals` residual arrays first; `out_avals` the tangents' types.
    Compared by identity (a primitive's parameter)."""

    def __init__(self, forward: Callable, backward: Callable, num_residuals: int,
                 out_avals: Sequence[jax.core.ShapedArray]):
        self.forward, self.backward = forward, backward
        self.num_residuals, self.out_avals = num_residuals, tuple(out_avals)

    def batched(self, size: int) -> "Linear":
        """The same map over a leading batch axis of every operand and output."""
        out = [jax.core.ShapedArray((size,) + a.shape, a.dtype) for a in self.out_avals]
        return Linear(jax.vmap(self.forward), jax.vmap(self.backward), self.num_residuals, out)


linear_p = Primitive("pcbatch_linear")
linear_p.multiple_results = True


def linear_call(rule: Linear, residuals: Sequence[jax.Array], tangents: Sequence[jax.Array]) -> list[jax.Array]:
    """`rule.forward(*residuals, *tangents)`, transposed by `rule.backward`."""
    return linear_p.bind(*residuals, *tangents, rule=rule)


def _impl(*args, rule: Linear):
    return list(rule.forward(*args))


def _abstract_eval(*args, rule: Linear):
    return list(rule.out_avals)


def _transpose(cts, *args, rule: Linear):
    residuals = args[:rule.num_residuals]
    cts = [jnp.zeros(a.shape, a.dtype) if type(ct) is ad.Zero else ct for ct, a in zip(cts, rule.out_avals)]
    return [None] * rule.num_residuals + list(rule.backward(*residuals, *cts))


def _jvp(primals, tangents, *, rule: Linear):
    """Forward over the forward map (e.g. `jax.jacfwd(jax.jacfwd(f))`): JAX's
    forward mode of `rule.forward` itself."""
    tangents = [ad.instantiate_zeros(t) for t in tangents]
    out, out_dot = jax.jvp(lambda *a: list(rule.forward(*a)), list(primals), tangents)
    return list(out), list(out_dot)


def _batch(args, dims, *, rule: Linear):
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    args = [jnp.broadcast_to(a, (size,) + a.shape) if d is None else jnp.moveaxis(a, d, 0)
            for a, d in zip(args, dims)]
    return linear_p.bind(*args, rule=rule.batched(size)), [0] * len(rule.out_avals)


linear_p.def_impl(_impl)
linear_p.def_abstract_eval(_abstract_eval)
mlir.register_lowering(linear_p, mlir.lower_fun(_impl, multiple_results=True))
ad.primitive_jvps[linear_p] = _jvp
ad.primitive_transposes[linear_p] = _transpose
batching.primitive_batchers[linear_p] = _batch
