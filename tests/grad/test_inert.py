"""Constants that carry no derivative (`runtime/grad/inert.py`): their values
depend on no float input, so the backward passes them to each block's VJP as
plain values. Which constants are inert, and gradients through programs that
have both kinds, against `jax.vjp` of the per-example Python."""
from __future__ import annotations

import jax
import jax.numpy as jnp

import pcbatch
from pcbatch.ir.core import CONSTANT
from pcbatch.runtime.grad.inert import inert_constants
from grad_helpers import check_vjp


@pcbatch.autobatch(in_axes=(None, None, 0))
def mixed(w, n, x):
    zero = jnp.zeros(w.shape)          # reads a shape only: inert
    scale = w * 2.0                    # a float input's value: carries a derivative
    count = jnp.float32(n) + 1.0       # an integer input's value: inert
    acc = zero
    k = 0
    while k < 3:
        acc = acc + scale * x + count
        k += 1
    return acc.sum()


def _args():
    return jnp.array([0.5, -1.5, 2.0]), jnp.int32(4), jnp.array([1.0, -2.0, 0.25, 3.0])


def test_which_constants_are_inert():
    w, n, x = _args()
    prog = mixed.lowered(w, n, x)
    consts = {v for v, c in prog.var_class.items() if c == CONSTANT}
    inputs = {f"mixed.{k}": a for k, a in zip("wnx", (w, n, x))}
    inert = inert_constants(prog, inputs)
    named = {v.split(".")[-1] for v in inert}
    assert {"zero", "count"} <= named and "scale" not in named, (sorted(consts), sorted(inert))
    assert not any(v.endswith(".w") for v in inert)  # the float input itself is reached


def test_gradients_with_inert_constants():
    check_vjp(mixed, _args(), positions=(0, 2))
