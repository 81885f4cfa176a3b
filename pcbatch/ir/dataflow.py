"""Dataflow facts over blocks and ops, shared by the passes that need them."""
from __future__ import annotations

from typing import Iterable

from pcbatch.ir.core import Block, Op, Prim, op_reads, op_writes, term_reads


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
