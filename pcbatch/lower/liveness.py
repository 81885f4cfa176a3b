"""Liveness over the merged program, and the variable classes it implies."""
from __future__ import annotations

from dataclasses import replace

from pcbatch.ir.core import (
    CONSTANT,
    REGISTER,
    STACK_OPS,
    STACKED,
    TEMPORARY,
    Block,
    Jump,
    PushJump,
    Return,
    op_reads,
    op_writes,
    successors,
    term_reads,
)
from pcbatch.ir.dataflow import use_def


def block_successors(blocks: tuple[Block, ...]) -> list[tuple[int, ...]]:
    """Successors for liveness. A `PushJump` flows into the callee and, for the
    caller's own variables, around the call to its continuation; a `Return`
    has none: only the return value outlives a frame (`exit_live`)."""
    return [successors(b.term) for b in blocks]


def exit_live(blocks: tuple[Block, ...], block_function: tuple[str, ...], ret_var) -> dict[int, set[str]]:
    """What is live after each `Return`: its function's return value."""
    return {i: {ret_var(block_function[i])} for i, b in enumerate(blocks) if isinstance(b.term, Return)}


def call_returns(blocks: tuple[Block, ...], block_function: tuple[str, ...], ret_var) -> dict[int, str]:
    """For each call block: its callee's return value. The callee writes it, so
    on the edge to the continuation it is defined, not carried: what the
    caller read of it before the call is dead across the call."""
    return {i: ret_var(block_function[b.term.target]) for i, b in enumerate(blocks) if isinstance(b.term, PushJump)}


def live_out(i: int, live_in: list[set[str]], succ: list[tuple[int, ...]], at_exit: dict[int, set[str]],
             blocks: tuple[Block, ...], call_rets: dict[int, str] | None = None) -> set[str]:
    """What is live after block i (the continuation's live set less the
    callee's return value, for a call)."""
    out = set(at_exit.get(i, ()))
    for s in succ[i]:
        if call_rets and i in call_rets and s == blocks[i].term.ret:
            out |= live_in[s] - {call_rets[i]}
        else:
            out |= live_in[s]
    return out


def liveness(blocks: tuple[Block, ...], succ: list[tuple[int, ...]],
             at_exit: dict[int, set[str]], saves: dict[int, tuple[set[str], int]] | None = None,
             call_rets: dict[int, str] | None = None) -> list[set[str]]:
    """live_in for every block. Caller-saves stacks make this per-frame view
    sound: whatever a caller needs after a call that the callee may
    overwrite, the caller pushes.

    `saves[i] = (clobbered, n)` for a call block i whose last `n` ops assign
    the callee's parameters: the variables live after the call that the
    callee may clobber are pushed (read) just before those ops, so that
    assignment does not end their life in the caller (recursion shares names).

    `call_rets` (`call_returns`): the callee's return value is not live
    across its call. (Without this, `g.<ret>` read after a call inside g
    looks live at g's entry, so across every call that reaches g, and is
    saved around calls from g's callers.)"""
    saves = saves or {}
    ud = [use_def(b) for b in blocks]
    head = {i: use_def(replace(blocks[i], ops=blocks[i].ops[:len(blocks[i].ops) - n], term=Jump(0)))
            for i, (_, n) in saves.items()}
    tail = {i: use_def(replace(blocks[i], ops=blocks[i].ops[len(blocks[i].ops) - n:]))
            for i, (_, n) in saves.items()}
    live_in: list[set[str]] = [set(u) for u, _ in ud]
    changed = True
    while changed:
        changed = False
        for i in reversed(range(len(blocks))):
            out = live_out(i, live_in, succ, at_exit, blocks, call_rets)
            if i in saves:
                pushed = live_in[blocks[i].term.ret] & saves[i][0]
                (u1, d1), (u2, d2) = head[i], tail[i]
                after_head = (out - d2) | u2 | pushed
                new = u1 | (after_head - d1)
            else:
                new = ud[i][0] | (out - ud[i][1])
            if new != live_in[i]:
                live_in[i] = new
                changed = True
    return live_in


def classify(blocks: tuple[Block, ...], live_in: list[set[str]], consts: set[str], keep: set[str]) -> dict[str, str]:
    """temporary: never crosses a block boundary (no storage); register: one
    slot per lane; stacked: saved across a call that may clobber it; constant:
    one value for the whole machine. `keep` are variables the machine reads or
    writes from outside (inputs, result)."""
    everything: set[str] = set(keep)
    stacked: set[str] = set()
    for b in blocks:
        for op in b.ops:
            everything.update(op_reads(op), op_writes(op))
            if isinstance(op, STACK_OPS):
                stacked.add(op.var)
        everything.update(term_reads(b.term))
    crossing = set().union(*live_in) if live_in else set()
    classes = {}
    for v in everything:
        if v in consts:
            classes[v] = CONSTANT
        elif v in stacked:
            classes[v] = STACKED
        elif v in crossing or v in keep:
            classes[v] = REGISTER
        else:
            classes[v] = TEMPORARY
    return classes
