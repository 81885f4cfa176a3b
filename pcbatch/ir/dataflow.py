"""Dataflow facts over blocks and ops, shared by the passes that need them."""
from __future__ import annotations

from typing import Iterable

from pcbatch.errors import Loc
from pcbatch.ir.core import Block, Op, Prim, op_reads, op_writes, successors, term_reads


def use_def(block: Block) -> tuple[set[str], set[str]]:
    """What the block reads before writing it, and what it writes."""
    use: set[str] = set()
    defs: set[str] = set()
    for op in block.ops:
        use.update(v for v in op_reads(op) if v not in defs)
        defs.update(op_writes(op))
    use.update(v for v in term_reads(block.term) if v not in defs)
    return use, defs


def through_prims(ops: Iterable[Op], names: Iterable[str], forward: bool = True) -> set[str]:
    """`names` and every variable the `ops`' Prims connect to them, to a
    fixpoint: forward, what is computed from them (however indirectly);
    backward, what they are computed from."""
    reached = set(names)
    prims = [op for op in ops if isinstance(op, Prim)]
    grew = True
    while grew:
        grew = False
        for op in prims:
            src, dst = (op.ins, op.outs) if forward else (op.outs, op.ins)
            if reached.intersection(src) and not reached.issuperset(dst):
                reached.update(dst)
                grew = True
    return reached


def maybe_unbound(blocks: tuple[Block, ...], params: tuple[str, ...]) -> list[tuple[str, Loc]]:
    """Reads of a variable that some path from the entry reaches without assigning
    it (Python would raise UnboundLocalError there): `(variable, where)`, the first
    read of each. Definite assignment, forward over the blocks (entry: block 0)."""
    preds: dict[int, list[int]] = {i: [] for i in range(len(blocks))}
    for i, b in enumerate(blocks):
        for j in successors(b.term):
            preds[j].append(i)
    out_sets: dict[int, frozenset[str]] = {}

    def assigned_before(i: int) -> frozenset[str]:
        if i == 0:  # the entry (a loop back to it keeps the parameters assigned)
            return frozenset(params)
        ins = [out_sets[p] for p in preds[i] if p in out_sets]  # the others: not reached yet
        return frozenset.intersection(*ins) if ins else frozenset()

    work = [0]
    while work:  # sets only shrink as more paths are seen: a fixpoint is reached
        i = work.pop()
        have = assigned_before(i).union(*(op_writes(op) for op in blocks[i].ops))
        if out_sets.get(i) != have:
            out_sets[i] = have
            work.extend(successors(blocks[i].term))
    found: dict[str, Loc] = {}
    for i, b in enumerate(blocks):
        if i not in out_sets:
            continue  # unreachable
        have = set(assigned_before(i))
        for op in b.ops:
            for v in op_reads(op):
                if v not in have and v not in found:
                    found[v] = getattr(op, "loc", None) or b.loc
            have.update(op_writes(op))
        for v in term_reads(b.term):
            if v not in have and v not in found:
                found[v] = getattr(b.term, "loc", None) or b.loc
    return [(v, loc) for v, loc in found.items() if loc is not None]
