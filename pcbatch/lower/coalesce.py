"""Copy coalescing: `v = u` where u exists only to be copied into v (the
result of `x if c else y`, a call's return value) becomes one variable, so the
machine carries one lane slot instead of two and skips the copy."""
from __future__ import annotations

from dataclasses import replace

from pcbatch.errors import user_name
from pcbatch.ir.core import (Await, Block, Branch, Collect, Fork, Join, Launch, Prim, op_reads, op_writes, retext,
                             term_reads)


def is_copy(op) -> bool:
    return (isinstance(op, Prim) and len(op.ins) == 1 and len(op.outs) == 1
            and op.text in ("", user_name(op.ins[0]).rpartition(".")[2]))  # a web's text is the user's name


def _live_after_ops(block: Block, live_out: set[str]) -> list[set[str]]:
    """live[k] = variables live just after op k."""
    live = set(live_out) | set(term_reads(block.term))
    out = [set() for _ in block.ops]
    for k in reversed(range(len(block.ops))):
        out[k] = set(live)
        op = block.ops[k]
        live = (live - set(op_writes(op))) | set(op_reads(op))
    return out


def coalesce_copies(blocks: tuple[Block, ...], live_in: list[set[str]], live_out: list[set[str]], keep: set[str],
                    call_rets: dict[int, str], params: frozenset[str] = frozenset()
                    ) -> tuple[tuple[Block, ...], dict[str, str]]:
    """Rename u to v for each copy `v = u` where u and v never hold different
    values while both are live: no op writes one while the other is live
    after it (the copy itself aside). Variables in `keep` are never renamed
    away, nor are function parameters (`params`): their callers write them
    where no op here shows it, and the call sites' parameter copies are found
    by the parameters' names (`stacks.call_sites`; renaming one made the
    caller save its registers after that copy, not before).

    A call to g writes `g.<ret>` (`call_rets`) on the edge to its
    continuation, where no op shows it: the other of u, v live across that
    call is a clash too (`return r` with r kept across a self call would
    otherwise make r the return slot the callee overwrites). Returns the
    blocks and the renames (`u -> v`), which error messages read."""
    uses: dict[str, int] = {}
    for b in blocks:
        for op in b.ops:
            for v in op_reads(op):
                uses[v] = uses.get(v, 0) + 1
        for v in term_reads(b.term):
            uses[v] = uses.get(v, 0) + 1
    after = [_live_after_ops(b, live_out[i]) for i, b in enumerate(blocks)]
    renames: dict[str, str] = {}
    taken: set[str] = set()
    exclusive: set[str] = set()
    for i, b in enumerate(blocks):
        for k, op in enumerate(b.ops):
            if not is_copy(op):
                continue
            (u,), (v,) = op.ins, op.outs
            single = uses.get(u) == 1  # several such copies may merge into one v (`x if c else y`)
            if (u == v or u in params or (not single and v in taken) or v in exclusive or u in keep
                    or u in renames or u in taken or v in renames or u.rpartition(".")[0] != v.rpartition(".")[0]):
                continue
            if v in params and u in after[i][k]:
                # `c = n - 1; x = f(c); ... c ...`: merged into the parameter, c would be saved
                # across the call where the parameter copies were, before `n = n - 1` wrote it.
                continue
            clash = False
            for j, blk in enumerate(blocks):
                for m, other in enumerate(blk.ops):
                    if (u in op_writes(other) and v in after[j][m]) or (
                            v in op_writes(other) and (j, m) != (i, k) and u in after[j][m]):
                        clash = True
            for c, ret in call_rets.items():
                if ret in (u, v) and (v if ret == u else u) in live_in[blocks[c].term.ret]:
                    clash = True
            if not clash:
                renames[u] = v
                taken.add(v)
                if not single:  # its interference with other sources of v is not checked: v takes no more
                    exclusive.add(v)
    if not renames:
        return blocks, renames

    def name(x: str) -> str:
        return renames.get(x, x)

    out = []
    for b in blocks:
        ops = []
        for op in b.ops:
            if isinstance(op, Prim):
                copy = is_copy(op)  # before renaming: the text still names the source
                op = replace(op, ins=tuple(map(name, op.ins)), outs=tuple(map(name, op.outs)),
                             text=retext(op.text, {v: name(v) for v in op.ins}))  # the listing stays true
                if copy and op.ins == op.outs:
                    continue
            elif isinstance(op, Join):
                op = replace(op, outs=tuple(map(name, op.outs)))
            elif isinstance(op, Launch):
                op = Launch(replace(op.call, params=tuple(map(name, op.call.params)),
                                    args=tuple(map(name, op.call.args))))
            elif isinstance(op, Collect):
                op = replace(op, out=name(op.out), flag=name(op.flag),
                             when=None if op.when is None else name(op.when))
            ops.append(op)
        term = b.term
        if isinstance(term, Branch):
            term = replace(term, cond=name(term.cond))
        elif isinstance(term, Await) and term.cond is not None:
            term = replace(term, cond=name(term.cond))
        elif isinstance(term, Fork):
            term = replace(term, calls=tuple(replace(c, params=tuple(map(name, c.params)), args=tuple(map(name, c.args)))
                                             for c in term.calls))
        out.append(replace(b, ops=tuple(ops), term=term))
    return tuple(out), renames
