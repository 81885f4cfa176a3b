"""Masked in-place updates: `buf = buf.at[i].set(v)` on a large register
costs one row, not the whole buffer.

The machine masks every register write: lanes not waiting at the chosen
block keep their value, `where(active, new, old)` over the whole register.
For a per-example output buffer written one row per step (samples, states,
tagger outputs: `buf = buf.at[i].set(v)`) that select reads and writes all
of `buf` for every lane at every write, so a run costs O(steps x buffer).

When the op's own code ends in the update (`scatter` in FILL_OR_DROP mode,
which `.at[...].set/add/...` uses, or `dynamic_update_slice`) of the
register it reads, the mask can go into the update instead: inactive lanes
scatter to an out-of-bounds row (dropped) or write back the slice they
already hold. The result is then already right for every lane, so the
machine skips the select and XLA updates the buffer in place.

    >>> import jax, jax.numpy as jnp
    >>> from pcbatch.ir.core import Prim
    >>> op = Prim(("buf",), ("buf", "i", "v"), lambda b, i, v: (b.at[i].set(v),))
    >>> types = {"buf": jnp.zeros((4, 3)), "i": jnp.int32(0), "v": jnp.zeros(3)}
    >>> masked = jax.vmap(masked_update(op, types, {"buf"}))
    >>> out, = masked(jnp.array([True, False]), jnp.zeros((2, 4, 3)), jnp.array([1, 2]), jnp.ones((2, 3)))
    >>> out.sum(axis=(1, 2))
    Array([3., 0.], dtype=float32)
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend.core import DropVar, Literal

from pcbatch.ir.core import Prim

__all__ = ["masked_update"]

_SCATTERS = ("scatter", "scatter-add", "scatter_add", "scatter-mul", "scatter_mul", "scatter-min",
             "scatter_min", "scatter-max", "scatter_max")


def _drops_out_of_bounds(eqn: Any) -> bool:
    mode = eqn.params.get("mode")
    return mode is not None and "FILL_OR_DROP" in str(mode)


def masked_update(op: Prim, types: dict[str, Any], large: set[str]) -> Callable | None:
    """`fn(active, *ins)` for ONE example (vmap it over lanes) computing `op`
    with the mask folded into the final updates of the registers in `large`
    it rewrites, or None when some such output is not produced that way (then
    the machine selects as usual). Outputs are in `op.outs` order."""
    targets = [v for v in op.outs if v in large and v in op.ins]
    if not targets:
        return None
    try:
        closed = jax.make_jaxpr(op.fn)(*[types[v] for v in op.ins])
    except Exception:  # the machine's own tracing reports real errors
        return None
    jaxpr = closed.jaxpr

    def flat_positions(names: tuple[str, ...]) -> list[tuple[str, Any, range]]:
        """Each (pytree) variable's tree structure and positions among the flattened jaxpr vars."""
        out, at = [], 0
        for v in names:
            tree = jax.tree_util.tree_structure(types[v])
            out.append((v, tree, range(at, at + tree.num_leaves)))
            at += tree.num_leaves
        return out

    ins_at = {v: r for v, _, r in reversed(flat_positions(op.ins))}  # first occurrence
    out_trees = flat_positions(op.outs)
    outs_at = {v: r for v, _, r in out_trees}
    if sum(len(r) for _, _, r in out_trees) != len(jaxpr.outvars):
        return None
    producer = {id(o): e for e in jaxpr.eqns for o in e.outvars}
    masked_eqns: dict[int, str] = {}
    for v in targets:
        for i, k in zip(ins_at[v], outs_at[v]):
            eqn = producer.get(id(jaxpr.outvars[k]))
            if eqn is None or not eqn.invars or eqn.invars[0] is not jaxpr.invars[i]:
                return None
            name = eqn.primitive.name
            if name in _SCATTERS and _drops_out_of_bounds(eqn):
                masked_eqns[id(eqn)] = "scatter"
            elif name == "dynamic_update_slice":
                masked_eqns[id(eqn)] = "dus"
            else:
                return None

    def per_example(active, *args):
        env: dict[Any, Any] = {}

        def read(v):
            return v.val if isinstance(v, Literal) else env[v]

        env.update(zip(jaxpr.constvars, closed.consts))
        env.update(zip(jaxpr.invars, jax.tree_util.tree_leaves(args)))
        for eqn in jaxpr.eqns:
            ins = [read(v) for v in eqn.invars]
            kind = masked_eqns.get(id(eqn))
            if kind == "scatter":   # an index past every dimension: the update is dropped
                idx = ins[1]
                ins[1] = jnp.where(active, idx, jnp.asarray(max(ins[0].shape, default=0), idx.dtype))
            elif kind == "dus":     # write back what is there
                ins[1] = jnp.where(active, ins[1], lax.dynamic_slice(ins[0], ins[2:], ins[1].shape))
            bound = eqn.primitive.get_bind_params(eqn.params)  # (subfuns, params) before JAX 0.7
            subfuns, params = ((), bound) if isinstance(bound, dict) else bound
            outs = eqn.primitive.bind(*subfuns, *ins, **params)
            outs = outs if eqn.primitive.multiple_results else [outs]
            for v, x in zip(eqn.outvars, outs):
                if not isinstance(v, DropVar):
                    env[v] = x
        flat = [read(v) for v in jaxpr.outvars]
        return tuple(jax.tree_util.tree_unflatten(tree, flat[r.start:r.stop]) for _, tree, r in out_trees)

    return per_example
