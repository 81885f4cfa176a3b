"""Fork formation: independent calls in one block become a `Fork`.

Autobatched functions are pure, so calls that do not read each other's
results may run in any order, or at once in lanes of their own (Cavs' vertex
parallelism, from single-example code). Within each block:

1. rename every value that is assigned more than once (block-local SSA), so
   only true data dependences constrain the order;
2. find the calls that depend on no other call of the block; if there are
   two or more, hoist the straight-line code they need above them and end
   the block with `Fork(calls, join, seq)`, where `join` is the rest of the
   block and `seq` is the same calls and rest run one after another (the
   machine's fallback when lanes run out);
3. repeat on the rest.

`h_l = enc(t, left[n]); h_r = enc(t, right[n])`, `f(n - 1) + f(n - 2)` and a
`for` over a constant number of children (unrolled by the converter) all
fork. A call inside an `if` is not hoisted out of it and does not fork here
(inside a loop it may: `loop_forks.py`).
"""
from __future__ import annotations

from dataclasses import replace

from pcbatch.ir.core import Block, Call, Fork, Function, Op, Prim, Terminator, op_reads, op_writes, retext


def _rename_op(op: Op, reads: dict[str, str], writes: dict[str, str]) -> Op:
    if isinstance(op, Prim):
        renamed = {v: reads[v] for v in op.ins if v in reads and reads[v] != v}
        return replace(op, ins=tuple(reads.get(v, v) for v in op.ins), outs=tuple(writes.get(v, v) for v in op.outs),
                       text=retext(op.text, renamed) if renamed and op.text else op.text)
    return replace(op, args=tuple(reads.get(v, v) for v in op.args), out=writes.get(op.out, op.out))


def local_ssa(ops: tuple[Op, ...]) -> list[Op]:
    """Give every assignment but a variable's last in the block a fresh name."""
    last = {}
    for k, op in enumerate(ops):
        for v in op_writes(op):
            last[v] = k
    current: dict[str, str] = {}
    out = []
    for k, op in enumerate(ops):
        writes = {}
        for v in op_writes(op):
            writes[v] = v if last[v] == k else f"{v}%{k}"
        out.append(_rename_op(op, dict(current), writes))
        current.update(writes)
    return out


def _ancestors(ops: list[Op]) -> list[set[int]]:
    """For each op, the earlier ops it depends on (transitively), in `local_ssa` form.
    A variable's last write keeps the name that reads of its value from before the
    block use, so it also depends on those reads (write after read): moved above one,
    it would change what that read sees."""
    producer: dict[str, int] = {}
    readers: dict[str, list[int]] = {}  # ops that read a name's value from before the block
    anc: list[set[int]] = []
    for k, op in enumerate(ops):
        a: set[int] = set()
        for v in op_reads(op):
            j = producer.get(v)
            if j is not None:
                a |= anc[j] | {j}
            else:
                readers.setdefault(v, []).append(k)
        for v in op_writes(op):
            for j in readers.get(v, ()):
                if j != k:
                    a |= anc[j] | {j}
        anc.append(a)
        for v in op_writes(op):
            producer[v] = k
    return anc


class _Builder:
    def __init__(self, fn: Function):
        self.blocks = list(fn.blocks)

    def add(self, label: str, ops: list[Op], term: Terminator, loc) -> int:
        self.blocks.append(Block(label, tuple(ops), term, loc))
        return len(self.blocks) - 1

    def split(self, label: str, ops: list[Op], term: Terminator, loc) -> tuple[list[Op], Terminator]:
        head: list[Op] = []
        while True:
            anc = _ancestors(ops)
            free = [k for k, op in enumerate(ops)
                    if isinstance(op, Call) and not any(isinstance(ops[j], Call) for j in anc[k])]
            if not free:
                return head + ops, term
            if len(free) == 1:  # a lone call: keep it (and what it needs) in front, look further
                keep = anc[free[0]] | {free[0]}
                head += [ops[k] for k in sorted(keep)]
                ops = [op for k, op in enumerate(ops) if k not in keep]
                continue
            need = set().union(*(anc[k] for k in free))
            pre = [ops[k] for k in sorted(need)]
            calls = [ops[k] for k in free]
            rest = [op for k, op in enumerate(ops) if k not in need and k not in free]
            rest_ops, rest_term = self.split(label, rest, term, loc)
            join = self.add(f"{label}.join", rest_ops, rest_term, loc)
            seq = self.add(f"{label}.seq", calls + rest_ops, rest_term, loc)
            return head + pre, Fork(tuple(calls), join, seq, calls[0].loc)


def form_forks(fn: Function) -> Function:
    """`fn` with every group of independent calls in a block turned into a Fork."""
    builder = _Builder(fn)
    for i, b in enumerate(fn.blocks):
        if sum(isinstance(op, Call) for op in b.ops) < 2:
            continue
        ops, term = builder.split(b.label, local_ssa(b.ops), b.term, b.loc)
        builder.blocks[i] = replace(b, ops=tuple(ops), term=term)
    return replace(fn, blocks=tuple(builder.blocks))
