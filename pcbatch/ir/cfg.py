"""Control-flow-graph clean-up on one function's blocks.

Every block costs the machine one step, so empty jump blocks are threaded
through and straight-line chains are merged before anything else sees them.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Iterable, TypeVar

from pcbatch.ir.core import (Await, Block, Branch, Call, Fork, Jump, Launch, PushJump, Return, Spawn, launch_targets,
                             spawn_targets, successors)

T = TypeVar("T")


def _retarget(block: Block, mapping: dict[int, int]) -> Block:
    t = block.term
    if isinstance(t, Jump):
        t = Jump(mapping[t.target])
    elif isinstance(t, Branch):
        t = replace(t, true=mapping[t.true], false=mapping[t.false])
    elif isinstance(t, PushJump):
        t = PushJump(mapping[t.target], mapping[t.ret])
    elif isinstance(t, Fork):
        calls = tuple(replace(c, target=mapping[c.target]) if isinstance(c, Spawn) else c for c in t.calls)
        t = replace(t, calls=calls, join=mapping[t.join], seq=mapping[t.seq])
    elif isinstance(t, Await):
        t = replace(t, target=mapping[t.target], false=None if t.false is None else mapping[t.false])
    ops = tuple(replace(op, call=replace(op.call, target=mapping[op.call.target]))
                if isinstance(op, Launch) and isinstance(op.call, Spawn) else op for op in block.ops)
    return replace(block, ops=ops, term=t)


def closure(start: Iterable[T], step: Callable[[T], Iterable[T]]) -> set[T]:
    """Everything reachable from `start` by repeatedly taking `step`."""
    seen: set[T] = set()
    stack = list(start)
    while stack:
        x = stack.pop()
        if x not in seen:
            seen.add(x)
            stack.extend(step(x))
    return seen


def reachable(blocks: tuple[Block, ...], start: int = 0) -> list[int]:
    """Indices reachable from `start`, in increasing order."""
    return sorted(closure([start], lambda i: successors(blocks[i].term) + spawn_targets(blocks[i].term)
                          + launch_targets(blocks[i])))


def renumber(blocks: tuple[Block, ...], keep: list[int]) -> tuple[Block, ...]:
    """Keep only the blocks `keep` (which must be closed under successors), renumbered."""
    mapping = {old: new for new, old in enumerate(keep)}
    return tuple(_retarget(blocks[i], mapping) for i in keep)


def simplify(blocks: tuple[Block, ...]) -> tuple[Block, ...]:
    """Drop unreachable blocks, thread jumps to empty blocks, merge chains."""
    blocks = renumber(blocks, reachable(blocks))
    changed = True
    while changed:
        changed = False
        # Thread: a jump to an empty block that only jumps on goes straight there.
        forward = {i: b.term.target for i, b in enumerate(blocks)
                   if i != 0 and not b.ops and isinstance(b.term, Jump) and b.term.target != i}

        def final(i: int) -> int:
            seen = set()
            while i in forward and i not in seen:
                seen.add(i)
                i = forward[i]
            return i

        mapping = {i: final(i) for i in range(len(blocks))}
        if any(mapping[i] != i for i in mapping):
            blocks = tuple(_retarget(b, mapping) for b in blocks)
            blocks = renumber(blocks, reachable(blocks))
            changed = True
        # Merge: a block whose only predecessor jumps to it joins that predecessor.
        preds: dict[int, list[int]] = {i: [] for i in range(len(blocks))}
        for i, b in enumerate(blocks):
            for s in successors(b.term):
                preds[s].append(i)
        for i, b in enumerate(blocks):
            if isinstance(b.term, Jump):
                j = b.term.target
                if j != 0 and j != i and preds[j] == [i]:
                    merged = replace(b, ops=b.ops + blocks[j].ops, term=blocks[j].term)
                    blocks = tuple(merged if k == i else blk for k, blk in enumerate(blocks))
                    blocks = renumber(blocks, reachable(blocks))
                    changed = True
                    break
    return blocks


def duplicate_return_tails(blocks: tuple[Block, ...]) -> tuple[Block, ...]:
    """A jump to a block that returns (and calls nothing) takes a copy of that
    block instead: one machine step fewer on the path (e.g. a tree node's cell
    after either the leaf case or the join of its children), at the price of
    the two copies no longer sharing a step."""
    out = list(blocks)
    for i, b in enumerate(out):
        seen = {i}
        while isinstance(b.term, Jump) and b.term.target not in seen:
            t = out[b.term.target]
            if not isinstance(t.term, Return) or any(isinstance(op, Call) for op in t.ops):
                break
            seen.add(b.term.target)
            b = replace(b, ops=b.ops + t.ops, term=t.term)
        out[i] = b
    return renumber(tuple(out), reachable(tuple(out)))
