"""Per-variable caller-saves stacks and pop-push elimination (Radul et al. §3.2).

Around each call, the caller pushes exactly the variables that are live after
the call *and* may be written by the callee (transitively); it pops them in the
continuation. Everything else stays in a register. Then a `Pop v` whose value
is never read before the next `Push v` cancels with it (or, if `v` is
reassigned in between, the pair becomes one in-place `Update v`).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from pcbatch.ir.core import Block, Op, Pop, Prim, Push, PushJump, Update, op_reads, op_writes
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
    out = {}
    for fn in set(block_function):
        seen, stack = set(), [fn]
        while stack:
            g = stack.pop()
            if g not in seen:
                seen.add(g)
                stack.extend(calls[g])
        out[fn] = set().union(*(writes[g] for g in seen))
    return out


def insert_saves(blocks: tuple[Block, ...], block_function: tuple[str, ...], live_in: list[set[str]],
                 params_of: dict[str, tuple[str, ...]]) -> tuple[Block, ...]:
    clob = clobbers(blocks, block_function)
    saves: dict[int, list[str]] = {}
    for i, b in enumerate(blocks):
        if isinstance(b.term, PushJump):
            callee = block_function[b.term.target]
            saves[i] = sorted((live_in[b.term.ret] & clob[callee]) - {ret_var(callee)})
    out = list(blocks)
    for i, save in saves.items():
        if not save:
            continue
        b = out[i]
        callee = block_function[b.term.target]
        ops = list(b.ops)
        # Push before the parameter copy: the caller's value of a callee
        # parameter (recursion) is the one to keep.
        at = len(ops)
        if ops and isinstance(ops[-1], Prim) and set(ops[-1].outs) <= set(params_of[callee]):
            at -= 1
        ops[at:at] = [Push(v) for v in save]
        out[i] = replace(b, ops=tuple(ops))
        r = b.term.ret
        out[r] = replace(out[r], ops=tuple(Pop(v) for v in save) + out[r].ops)
    return tuple(out)


def _touches(op: Op, v: str) -> bool:
    return v in op_reads(op) or v in op_writes(op) or getattr(op, "var", None) == v


def eliminate_pop_push(block: Block) -> Block:
    ops = list(block.ops)
    i = 0
    while i < len(ops):
        op = ops[i]
        if isinstance(op, Pop):
            v = op.var
            later = [j for j in range(i + 1, len(ops)) if _touches(ops[j], v)]
            if later and isinstance(ops[later[0]], Push):
                # Pop ... Push with v untouched between: the stack keeps it.
                del ops[later[0]], ops[i]
                continue
            if later and v not in op_reads(ops[later[0]]) and v in op_writes(ops[later[0]]):
                # The popped value is overwritten unread: update the top in place.
                pushes = [j for j in later if isinstance(ops[j], (Push, Pop, Update))]
                if pushes and isinstance(ops[pushes[0]], Push):
                    ops[pushes[0]] = Update(v)
                    del ops[i]
                    continue
        i += 1
    return replace(block, ops=tuple(ops))
