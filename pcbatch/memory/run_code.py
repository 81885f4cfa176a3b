"""The code of a rewritten run (the block-layout pass, `static`).

`BatchedRun` is the Prim function that replaces a run: each kept group as one
primitive application on packed operands.  `PackFn` is the prelude function
that packs one constant before the loop; `pack_inputs` names its inputs.
"""
from __future__ import annotations

from typing import Any

import jax
from jax import lax

from pcbatch.ir.jaxtypes import has_loop, mark_looping

from .graph import Atom, BlockGraph, Lit, bind, read
from .groups import depths
from .run_plan import GroupCode, Pack, Read

__all__ = ["BatchedRun", "PackFn", "pack_inputs"]

tree_util = jax.tree_util


class BatchedRun:
    """The rewritten run, as a Prim's function (one example's values):
    the graph's nodes, each kept group as one primitive application on
    packed operands, the other nodes as they were."""

    def __init__(self, g: BlockGraph, codes: list[GroupCode], outputs: tuple[str, ...]):
        self.g, self.outputs = g, outputs
        if any(has_loop(op.fn) for op in g.ops):  # the machine runs it on running lanes' rows only
            mark_looping(self)
        in_group = {m for c in codes for m in c.group.members}
        code_at = {c.group.members[0]: c for c in codes}  # members share a depth: emit at the first one
        d = depths(g)
        steps = []
        for node in g.nodes:
            if node.index in code_at:
                steps.append((d[node.index], node.index, code_at[node.index]))
            elif node.index not in in_group:
                steps.append((d[node.index], node.index, node))
        # By depth: every operand of a depth-d node or group is computed at a smaller depth.
        self.steps = [s for _, _, s in sorted(steps, key=lambda s: (s[0], s[1]))]

    def __call__(self, *args: Any) -> tuple:
        g = self.g
        n_in = len(g.inputs)
        env: dict[int, Any] = {}
        for var, x in zip(g.inputs, args[:n_in]):
            env.update(zip(g.input_leaves[var], tree_util.tree_leaves(x)))
        packs = args[n_in:]
        buffers: dict[int, Any] = {}
        views: dict[int, tuple[int, int, int, int]] = {}

        def get(a: Atom) -> Any:
            if isinstance(a, Lit):
                return a.value
            if a not in env:
                gid, start, stop, axis = views[a]
                env[a] = lax.slice_in_dim(buffers[gid], start, stop, axis=axis)
            return env[a]

        def operand(r: Read) -> Any:
            if r.how == "value":
                return get(r.atom)
            if r.how == "pack":
                return packs[r.index]
            if r.how == "const":
                return r.array
            if r.how == "view":
                buf = buffers[r.source]
                whole = r.start == 0 and r.stop == buf.shape[r.axis]
                return buf if whole else lax.slice_in_dim(buf, r.start, r.stop, axis=r.axis)
            return lax.concatenate([get(a) for a in r.atoms], r.axis)

        for step in self.steps:
            if isinstance(step, GroupCode):
                grp = step.group
                first = g.nodes[grp.members[0]]
                buf = bind(first, [operand(r) for r in step.reads])[0]
                buffers[grp.index] = buf
                outs = grp.outs(g)
                for m, (start, stop) in zip(step.order, step.offsets):
                    views[outs[m]] = (grp.index, start, stop, grp.axis)
            else:
                env.update(zip(step.outs, bind(step, [get(a) for a in step.ins])))
        return tuple(tree_util.tree_unflatten(g.output_trees[v], [get(a) for a in g.output_atoms[v]])
                     for v in self.outputs)


class PackFn:
    """Prelude code of one packed constant: its members (computed from the
    machine constants they come from), concatenated in the planned order."""

    def __init__(self, g: BlockGraph, pack: Pack, inputs: tuple[str, ...]):
        self.g, self.pack, self.inputs = g, pack, inputs
        need = _ancestors(g, pack)
        self.nodes = [n for n in g.nodes if any(v in need for v in n.outs)]

    def __call__(self, *args: Any) -> tuple:
        env: dict[int, Any] = {}
        for var, x in zip(self.inputs, args):
            env.update(zip(self.g.input_leaves[var], tree_util.tree_leaves(x)))
        self.g.evaluate(env, self.nodes)
        parts = [read(env, a) for a in self.pack.atoms]
        return (lax.concatenate([jax.numpy.asarray(p) for p in parts], self.pack.axis),)


def _ancestors(g: BlockGraph, pack: Pack) -> set[int]:
    """The graph values a packed constant's members are computed from, themselves included."""
    seen: set[int] = set()
    todo = [a for a in pack.atoms if isinstance(a, int)]
    while todo:
        v = todo.pop()
        if v in seen:
            continue
        seen.add(v)
        if v in g.producer:
            todo.extend(a for a in g.nodes[g.producer[v]].ins if isinstance(a, int))
    return seen


def pack_inputs(g: BlockGraph, pack: Pack) -> tuple[str, ...]:
    """The constant variables a packed constant is computed from."""
    leaves = {v for v in _ancestors(g, pack) if v not in g.producer}
    return tuple(var for var in g.inputs if leaves & set(g.input_leaves[var]))
