"""Per-variable caller-saves stacks and pop-push elimination (Radul et al. §3.2).

Around each call, the caller pushes exactly the variables that are live after
the call *and* may be written by the callee (transitively); it pops them in the
continuation. Everything else stays in a register. Then pop-push elimination
keeps values that are saved again before the next call on their stacks.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from pcbatch.ir.core import Block, Peek, Pop, Prim, Push, PushJump, Update, op_reads, op_writes, successors
from pcbatch.ir.cfg import closure
from pcbatch.lower.calls import ret_var


def clobbers(blocks: tuple[Block, ...], block_function: tuple[str, ...]) -> dict[str, set[str]]:
    """Variables each function may write, itself or through the functions it calls."""
    writes: dict[str, set[str]] = defaultdict(set)
    calls: dict[str, set[str]] = defaultdict(set)
    for i, b in enumerate(blocks):
        fn = block_function[i]
        for op in b.ops:
            writes[fn].update(op_writes(op))
        if isinstance(b.term, PushJump):
            calls[fn].add(block_function[b.term.target])
    return {fn: set().union(*(writes[g] for g in closure([fn], calls.__getitem__)))
            for fn in set(block_function)}


def call_sites(blocks: tuple[Block, ...], block_function: tuple[str, ...],
               params_of: dict[str, tuple[str, ...]]) -> dict[int, tuple[set[str], int]]:
    """For each call block: what the callee may clobber (its return value
    aside), and how many trailing ops assign the callee's parameters."""
    clob = clobbers(blocks, block_function)
    out = {}
    for i, b in enumerate(blocks):
        if isinstance(b.term, PushJump):
            callee = block_function[b.term.target]
            ops = b.ops
            copy = bool(ops) and isinstance(ops[-1], Prim) and set(ops[-1].outs) <= set(params_of[callee])
            out[i] = (clob[callee] - {ret_var(callee)}, int(copy))
    return out


def insert_saves(blocks: tuple[Block, ...], block_function: tuple[str, ...], live_in: list[set[str]],
                 params_of: dict[str, tuple[str, ...]]) -> tuple[Block, ...]:
    out = list(blocks)
    for i, (clobbered, copies) in call_sites(blocks, block_function, params_of).items():
        save = sorted(live_in[blocks[i].term.ret] & clobbered)
        if not save:
            continue
        # Push before the parameter copy: the caller's value of a callee
        # parameter (recursion) is the one to keep.
        ops = list(out[i].ops)
        at = len(ops) - copies
        ops[at:at] = [Push(v) for v in save]
        out[i] = replace(out[i], ops=tuple(ops))
        r = blocks[i].term.ret
        out[r] = replace(out[r], ops=tuple(Pop(v) for v in save) + out[r].ops)
    return tuple(out)


def eliminate_pop_push(block: Block) -> Block:
    """After a call, a restored variable that is saved again before the next
    call need not leave its stack: `Pop v ... Push v` becomes nothing (v
    untouched between), `Peek v` (v only read), or `Peek v ... Update v` (v
    reassigned)."""
    ops = list(block.ops)
    for i in range(len(ops)):
        if not isinstance(ops[i], Pop):
            continue
        v = ops[i].var
        nxt = next((j for j in range(i + 1, len(ops)) if isinstance(ops[j], (Push, Pop, Peek, Update))
                    and ops[j].var == v), None)
        if nxt is None or not isinstance(ops[nxt], Push):
            continue
        written = any(v in op_writes(op) for op in ops[i + 1:nxt])
        # Without the Pop, v's current value is the callee's until v is next
        # written: any read before that (even after the Push) needs a Peek.
        rest = [op for j, op in enumerate(ops[i + 1:], i + 1) if j != nxt]
        first = next((op for op in rest if v in op_reads(op) or v in op_writes(op)), None)
        read_first = first is not None and v in op_reads(first)
        ops[nxt] = Update(v) if written else None
        ops[i] = Peek(v) if read_first else None
    return replace(block, ops=tuple(op for op in ops if op is not None))


def stack_conflicts(blocks: tuple[Block, ...]) -> frozenset[frozenset[str]]:
    """Pairs of variables that are on their stacks at the same time in one frame.

    A frame's pushes are balanced before it returns, and a callee only touches
    its own frames, so the analysis follows a call to its continuation (not
    into the callee). Variables of different functions never conflict."""
    preds_out: dict[int, set[str]] = {}
    on_entry: list[set[str]] = [set() for _ in blocks]
    conflicts: set[frozenset[str]] = set()
    changed = True
    while changed:
        changed = False
        for i, b in enumerate(blocks):
            live = set(on_entry[i])
            for op in b.ops:
                if isinstance(op, Push):
                    live.add(op.var)
                elif isinstance(op, Pop):
                    live.discard(op.var)
                conflicts.update(frozenset((u, v)) for u in live for v in live if u < v)
            preds_out[i] = live
            succ = (b.term.ret,) if isinstance(b.term, PushJump) else successors(b.term)
            for s in succ:
                if not live <= on_entry[s]:
                    on_entry[s] |= live
                    changed = True
    return frozenset(conflicts)


def share_stacks(stacked: list[str], conflicts: frozenset[frozenset[str]], kind: dict[str, object]) -> dict[str, str]:
    """Greedy colouring: each variable joins the first stack of its kind (same
    type) holding no variable it conflicts with."""
    stacks: list[tuple[object, list[str]]] = []
    out = {}
    for v in sorted(stacked):
        for k, (stack_kind, members) in enumerate(stacks):
            if stack_kind == kind[v] and not any(frozenset((u, v)) in conflicts for u in members):
                members.append(v)
                out[v] = f"s{k}"
                break
        else:
            stacks.append((kind[v], [v]))
            out[v] = f"s{len(stacks) - 1}"
    return out
