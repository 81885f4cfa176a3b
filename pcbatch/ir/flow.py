"""Where a lane can go next in a stack program, calls and returns included.

`ir.core.successors` stays inside one function (a call continues at its
return block); a lane instead enters the callee, and a `Return` sends it to
the return block of whichever call it came from. The machines use these edges
to queue lanes (`runtime/pool.py`) and to order the blocks a step chases
(`follow_order`).
"""
from __future__ import annotations

from typing import Any, Sequence

from pcbatch.ir.core import Await, Block, Branch, Fork, Jump, PushJump, Return


def return_targets(blocks: Sequence[Block]) -> list[int]:
    """Every block a `Return` can send a lane to (the calls' return blocks)."""
    return sorted({b.term.ret for b in blocks if isinstance(b.term, PushJump)})


def lane_successors(term: Any, returns: Sequence[int]) -> list[int]:
    """The blocks a lane can go to next from `term` and wait there (a Fork's
    children and a blocked parent are queued separately)."""
    if isinstance(term, Jump):
        return [term.target]
    if isinstance(term, Branch):
        return [term.true, term.false]
    if isinstance(term, PushJump):
        return [term.target]
    if isinstance(term, Return):
        return list(returns)
    if isinstance(term, Fork):
        return [term.seq]
    if isinstance(term, Await):
        return [term.target] if term.cond is None else [term.target, term.false]
    return []


def follow_order(blocks: Sequence[Block], start: int) -> tuple[int, ...]:
    """The blocks a lane can reach after leaving `start` (itself excluded), in
    reverse postorder of the lane graph from there: along any path that does
    not close a loop, each block comes after the ones before it. A step that
    runs them once each in this order moves a lane through as many of them
    as its path allows (`Scheduler.follow`)."""
    returns = return_targets(blocks)
    post: list[int] = []
    seen = {start}
    # iterative DFS: (block, its successors not yet visited)
    stack = [(start, iter(lane_successors(blocks[start].term, returns)))]
    while stack:
        node, it = stack[-1]
        nxt = next((s for s in it if s not in seen), None)
        if nxt is None:
            stack.pop()
            if node != start:
                post.append(node)
            continue
        seen.add(nxt)
        stack.append((nxt, iter(lane_successors(blocks[nxt].term, returns))))
    return tuple(reversed(post))
