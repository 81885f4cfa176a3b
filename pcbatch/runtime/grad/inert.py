"""Which machine constants carry no derivative: their values depend on no
float input (`jnp.zeros(params["U"].shape[1] // 2)` reads a shape, not a
value). The backward passes them to each block's VJP as plain values, so it
computes no cotangent for them (for a Tree-LSTM leaf's zero children, one
matmul of the cell's VJP)."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.extend.core import Var

from pcbatch.ir.core import CONSTANT, StackProgram
from pcbatch.runtime.block import eval_prelude


def inert_constants(prog: StackProgram, inputs: dict[str, Any]) -> frozenset[str]:
    """The constants that no float leaf of `inputs` reaches through the
    prelude's jaxpr (an equation with a reached input reaches all its
    outputs: sub-jaxprs count as a whole)."""
    names = sorted(inputs)
    consts = sorted(v for v, c in prog.var_class.items() if c == CONSTANT)

    def prelude(*values):
        got, _ = eval_prelude(prog, dict(zip(names, values)))
        return [got[v] for v in consts]

    try:
        closed, shapes = jax.make_jaxpr(prelude, return_shape=True)(*(inputs[v] for v in names))
    except Exception:  # noqa: BLE001 - an optimization only: every constant then gets its cotangent
        return frozenset()
    jaxpr = closed.jaxpr
    reached = {v for v in jaxpr.invars if jnp.issubdtype(v.aval.dtype, jnp.inexact)}
    for eqn in jaxpr.eqns:
        if any(isinstance(v, Var) and v in reached for v in eqn.invars):
            reached.update(eqn.outvars)
    outs = iter(jaxpr.outvars)
    inert = set()
    for v, shape in zip(consts, shapes):
        leaves = [next(outs) for _ in jax.tree_util.tree_leaves(shape)]
        if not any(isinstance(x, Var) and x in reached for x in leaves):
            inert.add(v)
    return frozenset(inert)
