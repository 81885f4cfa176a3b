"""The prelude (constants and invariants) under a per-example mask, for its VJP."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from pcbatch.ir.core import CONSTANT, INVARIANT, StackProgram
from pcbatch.runtime.block import run_prim

tree_util = jax.tree_util
tree_map = tree_util.tree_map


def masked_prelude(prog: StackProgram, inputs: dict[str, Any], used_inv: dict[str, jax.Array],
                   used_const: dict[str, jax.Array]) -> tuple[dict[str, Any], dict[str, Any]]:
    """`eval_prelude`, for its VJP: lowering hoists constants and invariants
    out of the blocks that use them, so the prelude computes them for every
    example, also where the example's path never reads them (`sqrt(x)` of an
    `if x > 0` branch, for x = 0). Where an op's results are not read (per
    example for invariants, from `used_*`, propagated through the prelude),
    its inputs enter as `where(used, x, stop_gradient(x))`: no cotangent
    reaches them, not even the NaN of 0 x inf."""
    cls, types = prog.var_class, prog.var_types
    need: dict[str, jax.Array] = {**used_inv, **used_const}
    op_need: dict[int, jax.Array] = {}
    for k in reversed(range(len(prog.prelude))):
        op = prog.prelude[k]
        outs = [need[o] for o in op.outs if o in need]
        if not outs:
            continue
        per_example = any(cls.get(o) == INVARIANT for o in op.outs)
        m = outs[0]
        for o in outs[1:]:
            m = m | o
        if not per_example:
            m = jnp.any(m)
        op_need[k] = m
        for i in op.ins:
            mi = m if cls.get(i) == INVARIANT else jnp.any(m)
            need[i] = need[i] | mi if i in need else mi
    consts = {v: x for v, x in inputs.items() if cls.get(v) == CONSTANT}
    inv = {v: x for v, x in inputs.items() if cls.get(v) == INVARIANT}
    for k, op in enumerate(prog.prelude):
        m = op_need.get(k, jnp.zeros((), bool))
        examples = next((inv[i] for i in op.ins if i in inv), None)

        def read(v: str, m=m, examples=examples) -> tuple[Any, bool]:
            x, batched = (inv[v], True) if v in inv else (consts[v], False)
            if m.ndim == 1 and not batched:  # a constant in a per-example op: masked per example too
                b = tree_util.tree_leaves(examples)[0].shape[0]
                x, batched = tree_map(lambda a: jnp.broadcast_to(a, (b,) + a.shape), x), True
            keep = lambda a: jnp.where(m.reshape(m.shape + (1,) * (a.ndim - m.ndim)), a,  # noqa: E731
                                       lax.stop_gradient(a))
            return tree_map(keep, x), batched

        for v, x in run_prim(op, read, types, None).items():
            (inv if cls.get(v) == INVARIANT else consts)[v] = x
    return consts, inv
