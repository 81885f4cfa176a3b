"""The machines' loop state: typed pytrees with named fields.

Integer fields hold `dtypes.index_dtype()` (int32, or int64 under
`jax_enable_x64`); registers and stacks hold the program's own types
(`StackProgram.var_types`). Every field is fixed in shape for the whole loop.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping, NamedTuple, Sequence

import jax


class MachineState(NamedTuple):
    """The plain machine (`machine.py`): lane i runs example i.

    pc:       [L] block each lane waits at; `halt`/`overflowed` when done,
              `Codes.failed + b` after failing at block b's `Fail`.
    regs:     {var: [L, ...]} registers (values crossing a block boundary).
    stacks:   {stack: [D, L, ...]} saved variables; `sps` their pointers, one per group
              of stacks that every block moves alike (`StackLayout.pointer_of`).
    pc_stack: [D, L] return addresses and `pc_sp` its pointer (None without calls).
    depth:    [L] blocks each lane has run (the depth schedulers' key).
    steps:    steps taken; `sched` the scheduler's own carry.
    """

    pc: jax.Array
    regs: dict[str, Any]
    stacks: dict[str, Any]
    sps: dict[str, jax.Array]
    pc_stack: jax.Array | None
    pc_sp: jax.Array | None
    depth: jax.Array
    steps: jax.Array
    sched: Any


class Queues(NamedTuple):
    """Per block, a ring of the lanes waiting there: `lanes[block, M]` from
    `head[block]`, `count[block]` of them."""

    lanes: jax.Array
    head: jax.Array
    count: jax.Array


class FreeLanes(NamedTuple):
    """The free lanes, a stack: `lanes[:top]`, the last one taken first."""

    lanes: jax.Array
    top: jax.Array


class Tape(NamedTuple):
    """The gradient tape (`grad/`): recorded steps `log_block[t]`,
    `log_count[t]` (`t` of them), per recorded block its rows (`rows[block]`,
    `cursor[block]` of them) and, forward only, the event id each float
    stack slot holds (`writer`; None once the forward is done)."""

    t: jax.Array
    log_block: jax.Array
    log_count: jax.Array
    cursor: jax.Array
    rows: dict[int, Any]
    writer: dict[str, jax.Array] | None


@dataclass(frozen=True)
class LaneColumns:
    """Where each of a pool lane's small integers sits in its row of the lane
    table (`PoolState.lane[M, C]`). One table, not a field per integer, so a
    step gathers and scatters a lane's integers as one row.

    pc_sp:    its pc stack's pointer.        depth:   blocks it has run.
    parent:   its parent lane (-1: an example's root lane).
    pending:  its Fork's children not yet finished.
    poison:   a descendant overflowed.       example: the example it works for.
    kid_head, kid_tail, sibling: its launched children (a loop fork's), a list
              linked through `sibling`; `M` ends it.
    stalled:  it stopped launching for want of lanes.
    sp:       {stack: column of that stack's pointer}.
    kids:     the columns of its Fork's outstanding children (`fan` of them).
    """

    pc_sp: int
    depth: int
    parent: int
    pending: int
    poison: int
    example: int
    kid_head: int
    kid_tail: int
    sibling: int
    stalled: int
    sp: Mapping[str, int]
    kids: slice

    @classmethod
    def of(cls, stacks: Sequence[str], fan: int) -> "LaneColumns":
        fixed = [f.name for f in fields(cls) if f.name not in ("sp", "kids")]
        sp = {s: len(fixed) + k for k, s in enumerate(stacks)}
        first_kid = len(fixed) + len(sp)
        return cls(*range(len(fixed)), sp=sp, kids=slice(first_kid, first_kid + fan))

    @property
    def count(self) -> int:
        return self.kids.stop

    @property
    def kid_columns(self) -> range:
        return range(self.kids.start, self.kids.stop)


class PoolState(NamedTuple):
    """The fork-join machine (`pool.py`) on a pool of `M` lanes.

    pc:       [M] block each lane waits at, `-1 - join` while it waits for
              its children, or halt/overflowed/done/free (or a root lane's
              `Codes.failed + b` after failing at block b's `Fail`).
    lane:     [M, C] each lane's small integers (`LaneColumns`).
    regs, stacks, pc_stack: as `MachineState`, one slot per lane.
    queues:   the lanes waiting at each block (`Queues`).
    free:     the free lanes (`FreeLanes`).
    claim:    [M] scratch: which of a step's rows speaks for a parent.
    work:     [B] blocks run by all of an example's lanes.
    failed:   [B] 1 + the Fail block where one of an example's lanes failed,
              0 for none (`Status.failed`); None in a program without Fail.
    peak:     the most lanes in use at once; `steps`, `sched` as `MachineState`.
    """

    pc: jax.Array
    lane: jax.Array
    regs: dict[str, Any]
    stacks: dict[str, Any]
    pc_stack: jax.Array
    queues: Queues
    free: FreeLanes
    claim: jax.Array
    work: jax.Array
    failed: jax.Array | None
    peak: jax.Array
    steps: jax.Array
    sched: Any
