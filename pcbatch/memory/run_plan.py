"""Planning one run's batched code (the block-layout pass, `static`).

`plan_run(g, mode, kinds)` finds the run's groups, lays out their values with
the PQ-tree planner (dropping the groups it cannot honour, and the groups that
read their results), and decides how each kept group reads each operand: a
packed constant, a view of an earlier group's result, a literal array, one
shared value, or (the gather baseline) a copy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .graph import Atom, BlockGraph
from .groups import LITERAL, PACK, SHARED, SLICE, Group, find_groups, member_size
from .layout import LayoutResult, plan_layout

__all__ = ["GroupCode", "Pack", "Read", "RunPlan", "plan_run"]


@dataclass(frozen=True)
class Pack:
    """A constant operand packed before the loop: `atoms` (op order) along `axis`."""

    atoms: tuple[Atom, ...]
    axis: int


@dataclass(frozen=True)
class Read:
    """How the batched code gets one operand of a group: `how` is "value"
    (atom), "pack" (index into the packed constants), "const" (an array),
    "view" (group `source`'s result, elements [start, stop) along `axis`) or
    "concat" (copy `atoms` together along `axis`: the gather baseline)."""

    how: str
    atom: Atom | None = None
    index: int | None = None
    array: Any = None
    source: int | None = None
    start: int = 0
    stop: int = 0
    axis: int = 0
    atoms: tuple[Atom, ...] = ()


@dataclass(frozen=True)
class GroupCode:
    group: Group
    order: tuple[int, ...]  # member positions, as laid out
    reads: tuple[Read, ...]
    offsets: tuple[tuple[int, int], ...]  # per laid-out member: [start, stop) along group.axis


@dataclass
class RunPlan:
    graph: BlockGraph
    groups: list[Group]
    kept: list[GroupCode]
    packs: list[Pack]
    layout: LayoutResult | None
    status: dict[int, str]
    orders: dict[int, tuple[int, ...]]
    rewrite: bool
    reason: str
    label: dict[int, str]  # every value's distinct printable name (PQ-tree leaves, report)


def _labels(g: BlockGraph, values: Sequence[int]) -> dict[int, str]:
    """Distinct printable names for PQ-tree leaves."""
    out: dict[int, str] = {}
    seen: dict[str, int] = {}
    for v in values:
        base = g.names[v]
        n = seen.get(base, 0)
        seen[base] = n + 1
        out[v] = base if n == 0 else f"{base}#{n + 1}"
    return out


def _batch(g: BlockGraph, grp: Group, label: dict[int, str]) -> list[tuple[str, ...]]:
    """The group as a plan_layout batch: its outputs, and each operand that
    must be a contiguous aligned run (slices of earlier results; constants,
    so that each constant has one place in the block's parameter order)."""
    cols = [tuple(label[v] for v in grp.outs(g))]
    for op in grp.operands:
        if op.kind == SLICE or (op.kind == PACK and all(isinstance(a, int) for a in op.atoms)
                                and len(set(op.atoms)) == len(op.atoms)):
            cols.append(tuple(label[a] for a in op.atoms))
    return cols


def _plan_layout(g: BlockGraph, groups: list[Group], label: dict[int, str]
                 ) -> tuple[list[Group], LayoutResult | None, dict[int, str], dict[int, tuple[int, ...]]]:
    """Lay out the groups' values; drop what the planner cannot honour, and
    (transitively) the groups that read a dropped group's result."""
    status: dict[int, str] = {}
    active = list(groups)
    res = None
    while active:
        values = sorted({a for grp in active for col in [grp.outs(g)] + [op.atoms for op in grp.operands
                         if op.kind in (SLICE, PACK)] for a in col if isinstance(a, int)})
        res = plan_layout([label[v] for v in values], [_batch(g, grp, label) for grp in active],
                          {label[v]: member_size(g, v) for v in values})
        for n in res.dropped:
            status[active[n].index] = "dropped: its operands cannot be contiguous and aligned with earlier groups'"
        kept = [grp for n, grp in enumerate(active) if n not in set(res.dropped)]
        changed = True
        while changed:
            ids = {grp.index for grp in kept}
            bad = [grp for grp in kept if any(op.kind == SLICE and op.source not in ids for op in grp.operands)]
            for grp in bad:
                src = next(op.source for op in grp.operands if op.kind == SLICE and op.source not in ids)
                status[grp.index] = f"dropped: reads G{src}, which was dropped"
            kept = [grp for grp in kept if grp not in bad]
            changed = bool(bad)
        if len(kept) == len(active):
            orders = {grp.index: res.placements[n].op_order for n, grp in enumerate(active)}
            return kept, res, status, orders
        active = kept
    return [], res, status, {}


def _codegen(g: BlockGraph, kept: list[Group], orders: dict[int, tuple[int, ...]], gather: bool
             ) -> tuple[list[GroupCode], list[Pack]]:
    """Offsets of every laid-out member, and how each operand is read."""
    packs: list[Pack] = []
    pack_index: dict[Pack, int] = {}
    where: dict[int, tuple[int, int]] = {}  # output value -> (group index, position in its laid-out order)
    offsets_of: dict[int, tuple[tuple[int, int], ...]] = {}
    codes = []
    for grp in kept:
        order = orders[grp.index]
        outs = grp.outs(g)
        offsets, start = [], 0
        for p, m in enumerate(order):
            size = g.shape(outs[m])[grp.axis]
            offsets.append((start, start + size))
            start += size
            where[outs[m]] = (grp.index, p)
        offsets_of[grp.index] = tuple(offsets)
        reads = []
        for op in grp.operands:
            atoms = tuple(op.atoms[m] for m in order)
            if op.kind == SHARED:
                reads.append(Read("value", atom=atoms[0]))
            elif op.kind == LITERAL:  # scalars broadcast to each member's shape, then concatenated
                parts = [np.broadcast_to(np.asarray(a.value), g.shape(outs[m])) for a, m in zip(atoms, order)]
                reads.append(Read("const", array=np.concatenate(parts, axis=op.axis)))
            elif op.kind == PACK and not gather:
                pk = Pack(atoms, op.axis)
                if pk not in pack_index:
                    pack_index[pk] = len(packs)
                    packs.append(pk)
                reads.append(Read("pack", index=pack_index[pk]))
            else:  # SLICE, or the gather baseline
                reads.append(_view(op, atoms, where, offsets_of) or Read("concat", atoms=atoms, axis=op.axis))
                if not gather and reads[-1].how != "view":
                    raise AssertionError(f"layout bug: G{grp.index} reads an unaligned slice")
        codes.append(GroupCode(grp, order, tuple(reads), tuple(offsets)))
    return codes, packs


def _view(op: Any, atoms: tuple[Atom, ...], where: dict[int, tuple[int, int]],
          offsets_of: dict[int, tuple[tuple[int, int], ...]]) -> Read | None:
    """A slice of one earlier result if `atoms` lie there contiguously, in order."""
    if op.kind != SLICE or not all(isinstance(a, int) and a in where for a in atoms):
        return None
    src = {where[a][0] for a in atoms}
    if len(src) != 1:
        return None
    pos = [where[a][1] for a in atoms]
    if pos != list(range(pos[0], pos[0] + len(pos))):
        return None
    (gid,) = src
    offs = offsets_of[gid]
    return Read("view", source=gid, start=offs[pos[0]][0], stop=offs[pos[-1]][1], axis=op.axis)


def plan_run(g: BlockGraph, mode: str, kinds: tuple[str, ...]) -> RunPlan:
    groups = find_groups(g, kinds)
    label = _labels(g, sorted(g.names))
    if not groups:
        return RunPlan(g, [], [], [], None, {}, {}, False, "no independent same-type ops", label)
    if mode == "gather":
        kept, layout, status = groups, None, {}
        orders = {grp.index: tuple(range(len(grp.members))) for grp in groups}
    else:
        kept, layout, status, orders = _plan_layout(g, groups, label)
    codes, packs = _codegen(g, kept, orders, gather=mode == "gather")
    dots = sum(grp.kind == "dot" for grp in kept)
    if not kept:
        rewrite, reason = False, "every group was dropped"
    elif mode == "auto" and not dots:
        rewrite, reason = False, "no matmul group (elementwise groups alone gain nothing: XLA fuses them)"
    else:
        rewrite = True
        reason = f"{len(kept)} groups ({dots} matmul) batched, {len(packs)} constants packed before the loop"
    for grp in groups:
        status.setdefault(grp.index, "kept" if rewrite else "found (block not rewritten)")
    return RunPlan(g, groups, codes if rewrite else [], packs if rewrite else [], layout, status, orders,
                    rewrite, reason, label)
