"""What the block-layout pass did with one run, as a `BlockLayout` report.

`report_run` describes a run's plan: each group's members and operands by
value name, the source lines they come from, the order chosen, what became of
the group, and the constants packed before the loop.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

from pcbatch.ir.core import Block, Prim

from .graph import Atom, BlockGraph, Lit
from .groups import LITERAL, PACK, SHARED, SLICE, Group
from .report import BlockLayout, GroupReport, PackReport
from .run_plan import RunPlan

__all__ = ["report_run"]


def _describe(g: BlockGraph, grp: Group, label: dict[int, str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    def name(a: Atom) -> str:
        return g.name(a) if isinstance(a, Lit) else label.get(a, g.names[a])

    members = []
    for m in grp.members:
        node = g.nodes[m]
        expr = (f"{name(node.ins[0])} @ {name(node.ins[1])}" if grp.kind == "dot"
                else f"{node.primitive}({', '.join(name(a) for a in node.ins)})")
        members.append(f"{name(node.outs[0])} = {expr}")
    kinds = {SHARED: "shared", PACK: "constants packed before the loop", LITERAL: "literals, packed",
             SLICE: "slice of G{src}"}
    operands = tuple(f"{j}: " + kinds[op.kind].format(src=op.source) for j, op in enumerate(grp.operands))
    return tuple(members), operands


def _source_line(g: BlockGraph, node: Any) -> str:
    """Where the user wrote a node: the innermost frame outside JAX (a line in
    a helper such as a cell function), else the statement's line."""
    try:
        from jax._src import source_info_util

        frame = source_info_util.user_frame(node.eqn.source_info.traceback)
        if frame is not None:
            where = f"{os.path.basename(frame.file_name)}:{frame.start_line}"
            # A statement of the autobatched function runs as pcbatch's compiled op: no function name.
            return where if frame.function_name.endswith("_pcbatch_op") else f"{where} ({frame.function_name})"
    except Exception:  # pragma: no cover - private JAX API; the statement's line is the fallback
        pass
    op = g.ops[node.op]
    return str(op.loc) if op.loc else op.text


def report_run(b: int, block: Block, run: Sequence[Prim], plan: RunPlan, pack_vars: Sequence[str],
            plan_ms: float, total_ms: float) -> BlockLayout:
    g, label = plan.graph, plan.label
    groups = []
    for grp in plan.groups:
        members, operands = _describe(g, grp, label)
        order = plan.orders.get(grp.index, tuple(range(len(grp.members))))
        lines = tuple(dict.fromkeys(_source_line(g, g.nodes[m]) for m in grp.members))
        groups.append(GroupReport(grp.index, grp.kind, grp.primitive, members, tuple(label[v] for v in grp.outs(g)),
                                  operands, tuple(order), plan.status.get(grp.index, "kept"), lines))
    packs = []
    for var, pack in zip(pack_vars, plan.packs):
        shape = list(g.shape(pack.atoms[0]))
        shape[pack.axis] = sum(g.shape(a)[pack.axis] for a in pack.atoms)
        names = tuple(g.name(a) if isinstance(a, Lit) else label[a] for a in pack.atoms)
        packs.append(PackReport(var.rpartition(".")[2], names, pack.axis, tuple(shape)))
    return BlockLayout(b, block.label, tuple(op.text for op in run), plan.rewrite, plan.reason, tuple(groups),
                       plan.layout, tuple(packs), plan_ms, total_ms)
