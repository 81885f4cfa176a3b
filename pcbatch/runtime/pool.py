"""The fork-join machine: a pool of lanes, each step run on a compacted batch.

A program with `Fork`s runs here. Examples start in lanes `0..B-1`; the other
`max_lanes - B` lanes are free. Nothing in a step scans the pool: every step
costs what the lanes it runs need.

* Each block has a queue of the lanes waiting at it (`queue[block, M]`, a
  ring: `head`, `count`). The scheduler reads `count`; the step takes the
  first `lane_width` lanes off the chosen block's queue and pushes each onto
  the queue of its next pc. The branch names each row's queue by its place
  among the block's successors (which the terminator names statically); after
  the switch one prefix sum per place ranks the rows, once in the binary
  instead of once per block.
* Free lanes are a stack (`free_lanes`, `free_top`). At a Fork, every lane
  that can get one free lane per call (in queue order) pops them, starts its
  children on their functions' entries' queues and blocks (its pc is stored
  as `-1 - join`, on no queue) until its pending count drops to zero. A child
  whose bottom frame returns is DONE: it decrements its parent's count and
  keeps its return value until the parent's `Join` gathers it and pushes the
  lane back onto the free stack. A parent whose count reaches zero is pushed
  onto its join block's queue (each parent once: `claim` picks one of the
  siblings that finished in the same step). Lanes that cannot get enough
  free lanes take the Fork's sequential path in their own lane: slower,
  never wrong.

Each step `lax.switch` runs the chosen block on its lanes gathered into a
dense batch of the narrowest compiled width that holds them (one by default), and
returns only those rows' new values. They are scattered into the pool after
the switch (in place: XLA copies every full-size array a switch returns),
each register's under a `lax.cond` that skips blocks which do not write it,
or on accelerators every step with the rows of other blocks dropped
(`Tuning.masked_pool_updates`: XLA:GPU waits on the host for each `cond`).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from pcbatch.fsm.base import Frontier, bind
from pcbatch.ir.core import (
    CONSTANT,
    INVARIANT,
    REGISTER,
    STACKED,
    Await,
    Branch,
    Collect,
    Fail,
    Fork,
    Join,
    Jump,
    Launch,
    PushJump,
    Return,
    StackProgram,
    op_writes,
)
from pcbatch.ir.flow import lane_successors, return_targets
from pcbatch.ir.jaxtypes import type_key
from pcbatch.runtime.block import Codes, Rows, execute, no_writes
from pcbatch.runtime.dtypes import index_dtype
from pcbatch.runtime.state import FreeLanes, LaneColumns, PoolState, Queues
from pcbatch.runtime.lanes import (DROP, as_index, cast_to, column, gather_rows, pad_rows, scatter_rows, take,
                                   where, with_columns, zeros_of)
from pcbatch.runtime.config import MachineConfig, Status
from pcbatch.runtime.loop import block_in, while_loop_recorded
from pcbatch.runtime.stacks import StackLayout

tree_map = jax.tree_util.tree_map


def ranks_by(dest: jax.Array, targets: list[int], num_blocks: int) -> tuple[jax.Array, jax.Array]:
    """Per row, its rank among the rows going to the same block, and how many
    rows go to each block. `dest` holds a block of `targets` or anything else
    (no queue: those rows get no rank and are counted nowhere); the targets are
    few and known statically."""
    targets = sorted(set(targets))
    if not targets:
        return jnp.zeros(dest.shape, dest.dtype), jnp.zeros((num_blocks,), dest.dtype)
    _, rank, added = ranks_by_slot(slot_of(dest, targets), jnp.asarray(targets, dest.dtype), num_blocks)
    return rank, added


def slot_of(dest: jax.Array, targets: list[int], none: int | None = None) -> jax.Array:
    """Each row's place among `targets`; `none` (default `len(targets)`) where it names none of them."""
    none = len(targets) if none is None else none
    if len(targets) > 2:  # one gather from a table, not a compare and select per target
        table = np.full(max(targets) + 1, none, dest.dtype)
        table[targets] = np.arange(len(targets))
        return take(jnp.asarray(table), dest, fill=none)
    slot = jnp.full(dest.shape, none, dest.dtype)
    for k, t in enumerate(targets):
        slot = where(dest == t, k, slot)
    return slot


def ranks_by_slot(slot: jax.Array, successors: jax.Array, num_blocks: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`(dest, rank, added)` for rows that each name one of a block's `successors` by its
    position (`slot`; `len(successors)` or more: none). One prefix sum after the switch, where a
    prefix sum per successor in every block's branch compiled to several kernels each. The
    successors' counts share an int32 in bit fields wide enough for every row (a few
    successors, a few hundred rows: one field each), so the sum runs over one row of words."""
    idx = slot.dtype
    num, rows = successors.shape[0], slot.shape[0]
    bits = rows.bit_length()  # a field holds any count up to `rows`
    per_word = max(1, 31 // bits)
    words = -(-num // per_word)
    valid = slot < num
    place = jnp.minimum(slot, num - 1).astype(jnp.int32)
    # Non-negative operands: `lax.div`/`lax.rem` are one operation each (`//` and `%` follow
    # Python's signs, several each).
    word, shift = lax.div(place, np.int32(per_word)), lax.rem(place, np.int32(per_word)) * bits
    ones = where((jnp.arange(words, dtype=jnp.int32)[:, None] == word[None, :]) & valid[None, :],
                 jnp.left_shift(jnp.int32(1), shift)[None, :], 0)
    before = jnp.cumsum(ones, axis=1, dtype=jnp.int32)
    mine = jnp.take_along_axis(before, word[None, :], axis=0)[0] if words > 1 else before[0]
    mask = (1 << bits) - 1
    rank = where(valid, (jnp.right_shift(mine, shift) & mask) - 1, 0).astype(idx)
    dest = where(valid, successors[place], num_blocks).astype(idx)
    k = np.arange(num, dtype=np.int32)
    per_place = (jnp.right_shift(before[k // per_word, -1], (k % per_word) * bits) & mask).astype(idx)
    # Per block, the rows bound for it (no scatter: a few slots by a few blocks).
    added = jnp.sum(where(successors[:, None] == jnp.arange(num_blocks, dtype=idx)[None, :],
                          per_place[:, None], 0), axis=0, dtype=idx)
    return dest, rank, added


def _groups(writers: dict[str, list[int]]) -> list[tuple[list[int], list[str]]]:
    """Names grouped by the blocks that write them: `(blocks, names)`."""
    out: dict[tuple[int, ...], list[str]] = {}
    for name, blocks in writers.items():
        out.setdefault(tuple(sorted(blocks)), []).append(name)
    return [(list(blocks), names) for blocks, names in out.items()]


def _share_out_slots(writers: dict[str, list[int]], types: dict[str, Any]
                     ) -> tuple[dict[str, tuple[int, int]], list[tuple[Any, int]]]:
    """Output slots of the step's switch for the registers blocks write: registers of one
    type share a slot unless a block writes both (a greedy colouring). Every branch returns
    every slot, so one output per register would make the switch's outputs, and its
    compile time, grow with blocks x registers (quadratic in the number of functions).
    Returns `(slot of each register: (kind, k), [(type, slots of that type)])`."""
    kinds: dict[Any, int] = {}
    kind_types: list[Any] = []
    taken: list[list[set[int]]] = []  # per kind, per slot: the blocks writing it
    out: dict[str, tuple[int, int]] = {}
    for v in sorted((v for v in writers if writers[v]), key=lambda v: (min(writers[v]), v)):
        key = type_key(types[v])
        if key not in kinds:
            kinds[key] = len(kind_types)
            kind_types.append(types[v])
            taken.append([])
        kind, mine = kinds[key], set(writers[v])
        k = next((i for i, blocks in enumerate(taken[kind]) if not blocks & mine), len(taken[kind]))
        if k == len(taken[kind]):
            taken[kind].append(set())
        taken[kind][k] |= mine
        out[v] = (kind, k)
    return out, [(t, len(slots)) for t, slots in zip(kind_types, taken)]


class PoolMachine:
    """Builds the loop for one `StackProgram` with forks, specialised to input types."""

    def __init__(self, prog: StackProgram, num_examples: int, config: MachineConfig):
        self.prog = prog
        self.examples = num_examples
        self.lanes = max(config.max_lanes or num_examples, num_examples)
        self.width = min(config.lane_width or self.lanes, self.lanes)
        self.widths = config.tuning.widths(self.width)  # narrower copies of every block
        self.tuning = config.tuning
        self.masked = config.tuning.pool_updates_masked()
        self.depth = config.max_stack_depth
        self.max_steps = config.max_steps
        self.scheduler = bind(config.scheduler, prog)
        nb = prog.num_blocks
        self.halt, self.overflowed, self.done, self.free = nb, nb + 1, nb + 2, nb + 3
        # A root lane that fails halts at nb + 4 + its block; every failing lane (a child too, which
        # finishes) flags its example in `PoolState.failed`.
        self.codes = Codes(self.halt, self.overflowed, self.done, nb + 4)
        self.fail_blocks = list(prog.fail_blocks)
        blocks = prog.blocks
        self.stored = sorted(v for v, c in prog.var_class.items() if c in (REGISTER, STACKED) and v in prog.crossing)
        self.writers = {v: [b for b, blk in enumerate(blocks) if any(v in op_writes(op) for op in blk.ops)]
                        for v in self.stored}
        self.layout = StackLayout.of(prog)
        self.stack_of, self.stacks, self.stack_writers = self.layout.stack_of, self.layout.stacks, self.layout.writers
        self.pushjumps = [b for b, blk in enumerate(blocks) if isinstance(blk.term, PushJump)]
        self.forks = {b: blk.term for b, blk in enumerate(blocks) if isinstance(blk.term, Fork)}
        self.launches = {b: [op.call for op in blk.ops if isinstance(op, Launch)] for b, blk in enumerate(blocks)}
        self.launches = {b: calls for b, calls in self.launches.items() if calls}
        # Blocks that spawn children, that free children's lanes (Join, Collect), and that may end
        # a child's lane (a Return from its bottom frame, a call that overflows, a Fail).
        self.spawners = sorted(set(self.forks) | set(self.launches))
        self.releasers = [b for b, blk in enumerate(blocks) if any(isinstance(op, (Join, Collect)) for op in blk.ops)]
        self.finishers = [b for b, blk in enumerate(blocks) if isinstance(blk.term, (Return, PushJump, Fail))]
        # Where the lanes of an example that already failed stop (a child reached a Fail; its
        # parent goes on with a junk value, and a loop on it might never end): every branch or
        # jump that neither takes nor frees children. Only programs with a Fail pay for it.
        self.stoppers = [b for b, blk in enumerate(blocks) if self.fail_blocks and isinstance(blk.term, (Branch, Jump))
                         and not any(isinstance(op, (Launch, Collect, Join)) for op in blk.ops)]
        self.finishers = sorted(set(self.finishers) | set(self.stoppers))
        assert not set(self.launches) & set(self.forks), "a block both launches and forks"
        collects = [sum(isinstance(op, Collect) for op in blk.ops) for blk in blocks]
        self.fan = max([len(t.calls) for t in self.forks.values()] + [len(c) for c in self.launches.values()]
                       + collects + [1])
        # Per parameter a Launch assigns (in the child's lane): the blocks that launch with it.
        self.launch_params: dict[str, list[int]] = {}
        for b, calls in self.launches.items():
            for c in calls:
                for p in c.params:
                    if p in self.stored and b not in self.launch_params.setdefault(p, []):
                        self.launch_params[p].append(b)
        # Where a Return can go: any call's return address (the popped pc).
        self.return_targets = return_targets(blocks)
        self.reg_groups = _groups({v: self.writers[v] for v in self.stored if self.writers[v]})
        self.out_slots, self.slot_types = _share_out_slots(self.writers, prog.var_types)
        self.stack_groups = _groups({s: self.stack_writers[s] for s in self.stacks})
        self.joins = sorted({t.join for t in self.forks.values()}
                            | {t for blk in blocks if isinstance(blk.term, Await) for t in lane_successors(blk.term, [])})
        # Per block, the queues its step may append to: its successors, a Fork's or Launch's entries.
        self.successors = []
        for b, blk in enumerate(blocks):
            ts = lane_successors(blk.term, self.return_targets)
            if isinstance(blk.term, Fork):
                ts = ts + [c.target for c in blk.term.calls]
            ts = ts + [c.target for c in self.launches.get(b, [])]
            self.successors.append(sorted(set(ts)))
        self.num_slots = max(1, max(len(ts) for ts in self.successors))
        self.successor_table = jnp.asarray([ts + [nb] * (self.num_slots - len(ts)) for ts in self.successors],
                                           index_dtype())
        self.col = LaneColumns.of(self.stacks, self.fan)

    # --- state -----------------------------------------------------------
    #
    # Each lane's small integers live in one table, `lane[M, C]` (columns:
    # `LaneColumns`). The pc stays separate (the status, and the schedulers
    # that look at every lane, read it).

    def workspace_shapes(self) -> dict[str, Any]:
        """The stacks, and every other per-lane array of the state: donated from call to call, the
        loop runs in them. Fresh ones each call would come from one temporary allocation per call
        (55 MB for a Child-Sum Tree-LSTM on 32,768 lanes), which the C allocator maps and the
        kernel zero-fills page by page every call (~10 ms)."""
        M, idx = self.lanes, index_dtype()
        lanes = lambda t: tree_map(lambda x: jax.ShapeDtypeStruct((M,) + x.shape, x.dtype), t)
        return {**self.layout.workspace_shapes(self.depth, M),
                "regs": {v: lanes(self.prog.var_types[v]) for v in self.stored},
                "pc": jax.ShapeDtypeStruct((M,), idx),
                "lane": jax.ShapeDtypeStruct((M, self.col.count), idx),
                "queues": jax.ShapeDtypeStruct((self.prog.num_blocks, M), idx),
                "free": jax.ShapeDtypeStruct((M,), idx),
                "claim": jax.ShapeDtypeStruct((M,), idx)}

    def init(self, batched_inputs: dict[str, Any], workspace: dict[str, Any],
             active: jax.Array | None = None) -> PoolState:
        # Only what is read before it is written is set: the root lanes' rows and inputs, the entry
        # queue, the free list, every pc. A lane's registers and rows are written when it is spawned
        # (as when a lane is reused within a run), queue slots when a lane is queued.
        M, B, types, idx = self.lanes, self.examples, self.prog.var_types, index_dtype()
        regs = dict(workspace["regs"])
        for v, x in batched_inputs.items():
            if v in regs:
                regs[v] = tree_map(lambda r, y: r.at[:B].set(y), regs[v], cast_to(x, types[v], B))
        examples = jnp.arange(B, dtype=idx)
        roots = self.child_rows(jnp.full((B,), -1, idx), jnp.zeros((B,), idx), examples)
        lane = workspace["lane"].at[:B].set(roots)
        entry, nb = self.prog.entry_block, self.prog.num_blocks
        running = jnp.ones((B,), bool) if active is None else active  # padding examples start halted
        slot = where(running, jnp.cumsum(running, dtype=idx) - 1, M)
        # The free stack's top is its last slot: lane B is taken first.
        free_lanes = workspace["free"].at[:M - B].set(jnp.arange(M - 1, B - 1, -1, dtype=idx))
        queues = Queues(workspace["queues"].at[entry, slot].set(examples, **DROP), jnp.zeros((nb,), idx),
                        jnp.zeros((nb,), idx).at[entry].set(jnp.sum(running, dtype=idx)))
        pc = jnp.full((M,), self.free, idx).at[:B].set(where(running, entry, self.halt))
        return PoolState(
            # Every pc is set, but written into the workspace's buffer: a fresh array would be the
            # call's temporary memory (what test_pool_workspace.py measures), not the donated one.
            pc=workspace["pc"].at[:].set(pc),
            lane=lane,
            regs=regs,
            stacks=dict(workspace["stacks"]),
            pc_stack=workspace["pc_stack"],
            queues=queues,
            free=FreeLanes(free_lanes, jnp.asarray(M - B, idx)),
            claim=workspace["claim"],  # scratch: read only where written in the same step
            work=jnp.zeros((B,), idx),
            failed=jnp.zeros((B,), idx) if self.fail_blocks else None,  # no Fail: nothing to carry
            peak=jnp.asarray(B, idx),
            steps=jnp.zeros((), idx),
            sched=self.scheduler.init(nb, M),
        )

    def lanes_at(self, state: PoolState, block: jax.Array) -> jax.Array:
        """The lanes a step at `block` runs: the first `width` of its queue, in
        order, then `lanes` (none)."""
        M, W, q = self.lanes, self.width, state.queues
        k = jnp.arange(W, dtype=q.head.dtype)
        ids = q.lanes[block, lax.rem(q.head[block] + k, k.dtype.type(M))]
        return where(k < q.count[block], ids, M)

    def child_rows(self, parents: jax.Array, depth: jax.Array, example: jax.Array) -> jax.Array:
        """Lane-table rows of children started by `parents` (any shape): a
        fresh bottom frame, no children of their own."""
        M, col, idx = self.lanes, self.col, index_dtype()
        values = {col.pc_sp: 1, col.parent: parents, col.depth: depth, col.example: example,
                  **dict.fromkeys((col.kid_head, col.kid_tail, col.sibling, *col.kid_columns), M)}
        return with_columns(jnp.zeros(parents.shape + (col.count,), idx), values)

    # --- one block on a compacted batch -----------------------------------

    def block_fn(self, b: int, consts: dict[str, Any], inv: dict[str, Any], W: int):
        """Block `b` on (up to) `W` of its lanes; every output padded to `self.width` rows.
        `view`: the lanes to run (`ids`, `n` of them), the free lanes a Fork may
        take (`free`, `free_top`) and the pool's arrays it reads."""
        prog, block, types, col = self.prog, self.prog.blocks[b], self.prog.var_types, self.col
        M, D, K, N, nb = self.lanes, self.depth, self.fan, self.width, prog.num_blocks
        idx = index_dtype()

        def run(view: dict[str, Any]) -> dict[str, Any]:
            # The rows, their lane-table rows and columns, and the outputs of a block that
            # does not do a thing (spawn, free, push a pc...) come from the step, made once
            # for all blocks: each branch computes only what its block changes.
            picked, nothing = view["rows"], view["nothing"]
            if W < N:
                picked = tree_map(lambda x: x[:W], picked)
            ids, valid, own, cols = picked["ids"], picked["valid"], picked["own"], list(picked["cols"])
            get = lambda name: cols[getattr(col, name)]  # noqa: E731
            sps = {s: cols[col.sp[s]] for s in self.stacks}
            changes: dict[str, jax.Array] = {"depth": get("depth") + 1}
            pc_write = None
            freed = None
            spawned = None
            used = nothing["used"]  # free lanes taken

            loaded: dict[str, Any] = {}  # registers and invariants, gathered once

            def load(v: str) -> tuple[Any, bool]:
                if prog.var_class[v] == CONSTANT:
                    return consts[v], False
                if v not in loaded:
                    if prog.var_class[v] == INVARIANT:  # stored once per example
                        loaded[v] = gather_rows(inv[v], get("example"))
                    else:
                        loaded[v] = gather_rows(view["regs"][v], ids)
                return loaded[v], True

            def top(s: str) -> Any:
                return tree_map(lambda a: take(a, jnp.maximum(sps[s] - 1, 0), ids),
                                view["stacks"][s])

            taken: dict[str, Any] = {"head": None, "freed": [], "poison": jnp.zeros((W,), idx)}

            def join(op: Join | Collect, read: Any = None) -> dict[str, Any]:
                if isinstance(op, Collect):  # the oldest launched child still held (after this step's earlier ones)
                    head = get("kid_head") if taken["head"] is None else taken["head"]
                    when = valid if op.when is None else valid & jnp.broadcast_to(
                        jnp.asarray(read(op.when)[0]) != 0, (W,))
                    took = when & (head < M)
                    taken["head"] = where(took, take(view["lane"], head, col.sibling, fill=M), head)
                    taken["freed"].append(where(took, head, M))
                    taken["poison"] = taken["poison"] | where(took, take(view["lane"], head, col.poison), 0)
                    return {op.out: cast_to(gather_rows(view["regs"][op.ret], head), types[op.out], None),
                            op.flag: head < M}
                kids = own[:, col.kids]
                return {v: cast_to(gather_rows(view["regs"][r], kids[:, k]), types[v], None)
                        for k, (v, r) in enumerate(zip(op.outs, op.rets))}

            launched: list[tuple[int, dict[str, Any]]] = []  # per Launch: its entry, the child's parameters

            def launch(op: Launch, read) -> None:
                values = {}
                for p, a in zip(op.call.params, op.call.args):
                    if p in self.launch_params:
                        x, batched = read(a)
                        values[p] = cast_to(x, types[p], None if batched else W)
                launched.append((op.call.target, values))

            child = get("parent") >= 0
            pc_sp = get("pc_sp")
            pc_top = None
            if isinstance(block.term, Return):
                pc_top = take(view["pc_stack"], jnp.maximum(pc_sp - 1, 0), ids, fill=self.halt)
            ran = execute(block, self.stack_of, self.stacks, types, load, top, join,
                          Rows(valid, sps, pc_sp, pc_top, child), self.codes, D, W, launch=launch, index=b,
                          writes=nothing["stack_writes"] if W == N else None)
            stack_writes = ran.stack_writes
            pc_write = ran.pc_write
            changes["pc_sp"] = ran.pc_sp
            changes["poison"] = get("poison") | ran.overflow
            if block.ops and isinstance(block.ops[0], Join):
                kids = own[:, col.kids]
                for k in range(len(block.ops[0].rets)):
                    changes["poison"] = changes["poison"] | take(view["lane"], kids[:, k], col.poison)
                freed = where(valid[:, None], kids, M).reshape(-1)

            link = None  # (lane, its new next sibling)
            launch_params: dict[str, tuple[jax.Array, Any]] = {}
            if taken["head"] is not None:  # the block collected: the list's new head, the children freed
                changes["kid_head"] = taken["head"]
                changes["kid_tail"] = where(taken["head"] == M, M, get("kid_tail"))
                changes["poison"] = changes["poison"] | taken["poison"]
                freed = pad_rows(jnp.stack(taken["freed"], 1).reshape(-1), W * K, M)

            term, pc = block.term, ran.pc
            kid_dest = None
            if b in self.launches:
                # Each row takes one free lane per Launch, in (row, launch) order,
                # until none is left; a row that misses one stops launching
                # (its later calls must not overtake it) until its Await.
                calls = self.launches[b]
                L = len(calls)
                stalled = get("stalled") != 0
                want = jnp.broadcast_to((valid & ~stalled)[:, None], (W, L))
                rank = jnp.cumsum(want.reshape(-1), dtype=idx).reshape(W, L) - 1
                granted = want & (rank < view["free_top"])
                kids = where(granted, view["free"][jnp.clip(rank, 0, W * K - 1)], M)
                got = jnp.sum(granted, axis=1, dtype=idx)
                used = jnp.sum(got, dtype=idx)
                changes["stalled"] = (stalled | (valid & ~stalled & (got < L))).astype(idx)
                first, last = kids[:, 0], kids[jnp.arange(W), jnp.maximum(got - 1, 0)]
                old_head, old_tail = get("kid_head"), get("kid_tail")
                some = got > 0
                changes["kid_head"] = where(some & (old_head == M), first, old_head)
                changes["kid_tail"] = where(some, last, old_tail)
                changes["pending"] = get("pending") + got
                link = (where(some, old_tail, M), first)
                rows = self.child_rows(jnp.broadcast_to(ids[:, None], (W, L)),
                                       jnp.broadcast_to(changes["depth"][:, None], (W, L)),
                                       jnp.broadcast_to(get("example")[:, None], (W, L)))
                nexts = jnp.concatenate([kids[:, 1:], jnp.full((W, 1), M, idx)], axis=1)
                rows = with_columns(rows, {col.sibling: nexts})
                starts = jnp.broadcast_to(jnp.array([c.target for c in calls], idx), (W, L))
                pad = ((0, 0), (0, K - L))
                kids_k = jnp.pad(kids, pad, constant_values=M).reshape(-1)
                spawned = (kids_k, jnp.pad(rows, pad + ((0, 0),)).reshape(W * K, -1),
                           jnp.pad(starts, pad).reshape(-1))
                kid_dest = where(kids_k < M, spawned[2], nb)
                for p in self.launch_params:
                    if b not in self.launch_params[p]:
                        continue
                    lanes_p = jnp.stack([where(granted[:, j], kids[:, j], M) if p in vals
                                         else jnp.full((W,), M, idx) for j, (_, vals) in enumerate(launched)], 1)
                    vals_p = [vals.get(p, zeros_of(types[p], (W,))) for _, vals in launched]
                    values = tree_map(lambda *xs: jnp.stack(xs, 1), *vals_p)
                    launch_params[p] = (jnp.pad(lanes_p, pad, constant_values=M).reshape(-1),
                                        tree_map(lambda x: jnp.pad(x, pad + ((0, 0),) * (x.ndim - 2)).reshape(
                                            (W * K,) + x.shape[2:]), values))
            if isinstance(term, Await):
                waiting = get("pending") > 0
                pc = where(waiting, -1 - pc, pc).astype(idx)
                changes["stalled"] = jnp.zeros((W,), idx)
            if isinstance(term, Fork):
                k = len(term.calls)
                room = lax.div(view["free_top"], idx.type(k))
                can = valid & (jnp.arange(W, dtype=idx) < room)  # valid rows come first, in order
                used = jnp.sum(can, dtype=idx) * k
                kids = where(can[:, None], view["free"][:W * k].reshape(W, k), M)
                kids = jnp.pad(kids, ((0, 0), (0, K - k)), constant_values=M)
                for j, c in enumerate(col.kid_columns):
                    cols[c] = kids[:, j]
                changes["pending"] = where(can, k, get("pending"))
                # The children's rows: a fresh bottom frame, this lane as parent.
                rows = self.child_rows(jnp.broadcast_to(ids[:, None], (W, K)),  # the Fork's successors' depth
                                       jnp.broadcast_to(changes["depth"][:, None], (W, K)),
                                       jnp.broadcast_to(get("example")[:, None], (W, K)))
                starts = jnp.array([c.target for c in term.calls] + [0] * (K - k), idx)
                starts = jnp.broadcast_to(starts, (W, K))
                spawned = (kids.reshape(-1), rows.reshape(W * K, -1), starts.reshape(-1))
                kid_dest = where(kids < M, starts, nb).reshape(-1)
                pc = where(can, -1 - term.join, term.seq).astype(idx)
            finished = ran.finished
            if b in self.stoppers:  # once it holds no children, a lane of a failed example stops here
                stop = (valid & (take(view["failed"], get("example")) != 0)
                        & (get("pending") == 0) & (get("kid_head") == M))
                pc = where(stop, where(child, self.done, self.halt), pc).astype(idx)
                finished = finished | (stop & child)
            decrement = where(valid & finished, get("parent"), M)

            # Queue every lane that waits somewhere next: the rows at their
            # new pcs, then a Fork's children at their entries. Each row names its queue by
            # its place among the block's successors; the step ranks them after the switch.
            dest = where(valid & (pc >= 0), pc, nb)  # a blocked row (pc < 0) waits on no queue
            slot = slot_of(pad_rows(dest, N, nb), self.successors[b], self.num_slots)
            kid_slot = nothing["kid_slot"] if kid_dest is None else \
                slot_of(pad_rows(kid_dest, N * K, nb), self.successors[b], self.num_slots)

            for name, x in changes.items():
                cols[getattr(col, name)] = x
            for s in self.stacks:
                cols[col.sp[s]] = ran.sps[s]
            # Every branch returns the same structure: its registers' new values in their slots
            # (`_share_out_slots`), zeros in the slots it does not write.
            slots = [list(kind) for kind in nothing["slots"]]
            for v, (kind, k) in self.out_slots.items():
                if b in self.writers[v]:
                    slots[kind][k] = tree_map(lambda x: pad_rows(x, N), cast_to(ran.env[v], types[v], None))
            # Padding rows: no lane (M), no stack row (D); their values are dropped.
            out = {"pc": pad_rows(pc, N), "cols": tuple(pad_rows(as_index(x, W), N) for x in cols), "slots": slots,
                   "stack_values": {s: tree_map(lambda x: pad_rows(x, N), x) for s, (_, x) in stack_writes.items()},
                   "stack_rows": {s: pad_rows(row, N, D) for s, (row, _) in stack_writes.items()},
                   "decrement": pad_rows(decrement, N, M),
                   "slot": jnp.concatenate([slot, kid_slot]), "used": used}
            if pc_write is None:
                out["pc_row"], out["pc_value"] = nothing["pc_row"], nothing["pc_value"]
            else:
                out["pc_row"], out["pc_value"] = pad_rows(pc_write[0], N, D), pad_rows(pc_write[1], N)
            out["freed"] = nothing["freed"] if freed is None else pad_rows(freed, N * K, M)
            if spawned is None:
                out["spawn_lanes"], out["spawn_rows"], out["spawn_starts"] = nothing["spawned"]
            else:
                out["spawn_lanes"] = pad_rows(spawned[0], N * K, M)
                out["spawn_rows"], out["spawn_starts"] = pad_rows(spawned[1], N * K), pad_rows(spawned[2], N * K)
            out["link"] = nothing["link"] if link is None else tuple(pad_rows(x, N, M) for x in link)
            # Per parameter any Launch assigns: (child lanes, values); none where this block does not.
            out["launch_params"] = {
                p: (pad_rows(launch_params[p][0], N * K, M),
                    tree_map(lambda x: pad_rows(x, N * K), launch_params[p][1]))
                if p in launch_params else nothing["launch_params"][p]
                for p in self.launch_params}
            return out

        return run

    def nothing_outputs(self) -> dict[str, Any]:
        """A step's outputs where its block does not do that thing (push a pc, spawn, free,
        link, launch, write a slot or a stack), at the widest width: made once, outside
        the step's switch, so that no branch builds its own copies."""
        M, D, K, N, col, idx = self.lanes, self.depth, self.fan, self.width, self.col, index_dtype()
        no_kids = jnp.full((N * K,), M, idx)
        return {"pc_row": jnp.full((N,), D, idx), "pc_value": jnp.zeros((N,), idx), "freed": no_kids,
                "spawned": (no_kids, jnp.zeros((N * K, col.count), idx), jnp.zeros((N * K,), idx)),
                "link": (jnp.full((N,), M, idx),) * 2, "used": jnp.zeros((), idx),
                "kid_slot": jnp.full((N * K,), self.num_slots, idx),
                "stack_writes": no_writes(self.stacks, N, D),
                "slots": [[zeros_of(t, (N,))] * n for t, n in self.slot_types],
                "launch_params": {p: (no_kids, zeros_of(self.prog.var_types[p], (N * K,))) for p in self.launch_params}}

    # --- the loop --------------------------------------------------------

    def run(self, consts: dict[str, Any], inv: dict[str, Any], batched_inputs: dict[str, Any],
            workspace: dict[str, Any], active: jax.Array | None = None, recorder: Any = None) -> tuple[Any, ...]:
        """`(result, status, workspace)`, and the tape last when a `recorder`
        (gradients, `grad/recorder.py`) is given."""
        prog, B, col, M, N, K = self.prog, self.examples, self.col, self.lanes, self.width, self.fan
        nb = prog.num_blocks
        widths = self.widths

        def branch(b: int):
            runs = [self.block_fn(b, consts, inv, w) for w in widths]
            if len(runs) == 1:
                return runs[0]

            def go(state):
                # The narrowest width that takes every lane run here: a step
                # costs what its lanes need, not the widest batch.
                which = jnp.minimum(jnp.searchsorted(jnp.array(widths), state["n"]), len(widths) - 1)
                return lax.switch(which, runs, state)
            return go

        branches = [branch(b) for b in range(nb)]
        halt, max_steps = self.halt, self.max_steps

        def cond(state: PoolState):
            running = jnp.any(state.queues.count > 0)  # a blocked parent has a child on some queue
            return running if max_steps is None else running & (state.steps < max_steps)

        def enqueue(queues: Queues, lanes, dest, rank, added) -> Queues:
            """Append `lanes` to the queues `dest` (rows elsewhere are dropped)
            at their `rank`s; `added` counts them per block."""
            to = jnp.minimum(dest, nb - 1)
            pos = lax.rem(queues.head[to] + queues.count[to] + rank, rank.dtype.type(M))
            return queues._replace(lanes=queues.lanes.at[dest, pos].set(lanes, **DROP),
                                   count=queues.count + added)

        def finish(lane, claim, queues, pc, parent, depth):
            """Children that finished: their parents' pending counts drop, and
            a parent whose count reaches 0 waits at its join block."""
            lane = lane.at[parent, col.pending].add(-1, **DROP)
            # A Join comes after its children's last blocks: its depth (for
            # the depth/agenda schedulers) is the longest path through them.
            lane = lane.at[parent, col.depth].max(depth, **DROP)
            r = jnp.arange(N, dtype=pc.dtype)
            claim = claim.at[parent].set(r, **DROP)  # one of the siblings speaks for the parent
            woke = ((parent < M) & (take(claim, parent, fill=-1) == r)
                    & (take(lane, parent, col.pending, fill=1) == 0)
                    & (take(pc, parent) < 0))  # a launching parent may not wait yet
            join = -1 - take(pc, parent)
            dest = where(woke, join, nb)
            rank, added = ranks_by(dest, self.joins, nb)
            queues = enqueue(queues, parent, dest, rank, added)
            pc = pc.at[where(woke, parent, M)].set(join, **DROP)
            return lane, claim, queues, pc

        def spawn(pc, lane, kid, starts, rows, link):
            pc = pc.at[kid].set(starts, **DROP)
            lane = lane.at[kid].set(rows, **DROP)
            return pc, lane.at[link[0], col.sibling].set(link[1], **DROP)

        def release(free: FreeLanes, pc, freed):
            back = freed < M
            slot = where(back, free.top + jnp.cumsum(back, dtype=pc.dtype) - 1, M)
            free = FreeLanes(free.lanes.at[slot].set(freed, **DROP), free.top + jnp.sum(back, dtype=pc.dtype))
            return free, pc.at[freed].set(self.free, **DROP)

        masked = self.masked
        no_lane = jnp.asarray(M, index_dtype())
        nothing = self.nothing_outputs()

        def gate(on: jax.Array, run, skip, *operands):
            """`run(*operands)` where `on`, else `skip`: a `lax.cond`, or (masked) `run`
            itself, its operands' lane indices already pointed at no lane (`only`)
            where not `on`, so that its scatters drop every row."""
            return run(*operands) if masked else lax.cond(on, run, skip, *operands)

        def only(on: jax.Array, lanes: jax.Array, none: Any = no_lane) -> jax.Array:
            return where(on, lanes, none) if masked else lanes

        def step(state: PoolState, observe):
            pc, queues = state.pc, state.queues
            count = queues.count
            # Only the schedulers that look at every lane read these (XLA drops them otherwise).
            sched_pc = where((pc >= 0) & (pc < halt), pc, halt)
            depth = column(state.lane, col.depth)
            block, sched = self.scheduler.choose(state.sched, Frontier(sched_pc, count, depth, jnp.argmax(count > 0)))
            block = block.astype(pc.dtype)  # schedulers may answer in int32
            ids = self.lanes_at(state, block)
            block = observe(state, block, ids)
            n = jnp.minimum(count[block], N)
            queues = Queues(queues.lanes, queues.head.at[block].set(lax.rem(queues.head[block] + n, n.dtype.type(M))),
                            count.at[block].add(-n))
            free_top = state.free.top
            j = jnp.arange(N * K, dtype=pc.dtype)
            free = where(j < free_top, state.free.lanes[jnp.maximum(free_top - 1 - j, 0)], M)
            own = take(state.lane, ids)
            rows = {"ids": ids, "valid": ids < M, "own": own, "cols": tuple(column(own, c) for c in range(col.count))}
            view = {"lane": state.lane, "regs": state.regs, "stacks": state.stacks, "pc_stack": state.pc_stack,
                    "rows": rows, "nothing": nothing, "n": n, "free": free, "free_top": free_top,
                    "failed": state.failed}
            out = lax.switch(block, branches, view)
            new_own = jnp.stack(out["cols"], axis=1)
            lane = state.lane.at[ids].set(new_own, **DROP)
            examples = where(ids < M, out["cols"][col.example], B)
            work = state.work.at[examples].add(1, **DROP)
            failed = state.failed
            if self.fail_blocks:  # only steps at a Fail block pay for flagging its lanes' examples
                at_fail = block_in(block, self.fail_blocks)
                failed = gate(at_fail, self._flag_failed, lambda f, *_: f, failed, only(at_fail, examples, B), block)
            # One conditional per set of writing blocks (a step pays for each, taken or not), or masked.
            regs = dict(state.regs)
            for writers, names in self.reg_groups:
                on = block_in(block, writers)
                rows = only(on, ids)
                regs.update(gate(on,
                                 lambda r, x: {v: scatter_rows(r[v], rows, x[v]) for v in r},
                                 lambda r, x: r, {v: regs[v] for v in names},
                                 {v: out["slots"][self.out_slots[v][0]][self.out_slots[v][1]] for v in names}))
            stacks = dict(state.stacks)
            for writers, names in self.stack_groups:
                on = block_in(block, writers)
                rows = only(on, ids)
                stacks.update(gate(
                    on,
                    lambda a, r, x: {s: tree_map(lambda y, z: y.at[r[s], rows].set(z, **DROP), a[s], x[s])
                                     for s in a},
                    lambda a, r, x: a, {s: stacks[s] for s in names}, {s: out["stack_rows"][s] for s in names},
                    {s: out["stack_values"][s] for s in names}))
            row, value = out["pc_row"], out["pc_value"]
            on = block_in(block, self.pushjumps)
            pushing = only(on, ids)
            pc_stack = gate(on, lambda a: a.at[row, pushing].set(value, **DROP), lambda a: a, state.pc_stack)
            kid = out["spawn_lanes"]
            pc = pc.at[ids].set(out["pc"], **DROP)
            queues = enqueue(queues, jnp.concatenate([ids, kid]),
                             *ranks_by_slot(out["slot"], self.successor_table[block], nb))
            # Children spawned (Fork, Launch): their pcs and rows; a launch appends to its parent's
            # child list (the old last child points on). Only spawning blocks pay for it.
            spawning = block_in(block, self.spawners)
            link = tuple(only(spawning, x) for x in out["link"])
            pc, lane = gate(spawning, spawn, lambda pc, lane, *_: (pc, lane),
                            pc, lane, only(spawning, kid), out["spawn_starts"], out["spawn_rows"], link)
            # Free lanes: a Fork's children were popped off the top; a Join's (a Collect's) go back on.
            free_top = free_top - out["used"]
            releasing = block_in(block, self.releasers)
            free, pc = gate(releasing, release, lambda free, pc, *_: (free, pc),
                            FreeLanes(state.free.lanes, free_top), pc, only(releasing, out["freed"]))
            src, example = column(out["spawn_rows"], col.parent), column(out["spawn_rows"], col.example)
            for f, term in self.forks.items():
                # Only the registers this Fork reads or writes pass through its conditional: all of them
                # would copy every register into each Fork's branch (compile time quadratic in functions).
                names, spawn_params = self._spawn_params(term, consts, inv, regs, only(block == f, kid), src, example)
                regs.update(gate(block == f, spawn_params, lambda r: r, {v: regs[v] for v in names}))
            for p, (lanes_p, vals) in out["launch_params"].items():
                launching = block_in(block, self.launch_params[p])
                regs[p] = gate(launching, lambda r, l, x: scatter_rows(r, l, x),
                               lambda r, l, x: r, regs[p], only(launching, lanes_p), vals)
            # Only blocks that can end a child's lane wake parents: the rest skip this (several kernels).
            finishing = block_in(block, self.finishers)
            lane, claim, queues, pc = gate(finishing, finish, lambda *a: a[:4],
                                           lane, state.claim, queues, pc, only(finishing, out["decrement"]),
                                           out["cols"][col.depth])
            new = PoolState(pc=pc, lane=lane, regs=regs, stacks=stacks, pc_stack=pc_stack, queues=queues, free=free,
                            claim=claim, work=work, failed=failed, peak=jnp.maximum(state.peak, M - free.top),
                            steps=state.steps + 1, sched=sched)
            return new, {"block": block, "out": out}

        final, tape = while_loop_recorded(cond, step, self.init(batched_inputs, workspace, active), recorder)
        pc = final.pc[:B]
        overflow = (pc == self.overflowed) | (final.lane[:B, col.poison] != 0)
        failed_at = jnp.zeros((B,), pc.dtype) if final.failed is None else final.failed
        status = Status(overflow, (pc < halt) & ~overflow, pc, final.steps, final.work, final.peak, failed_at)
        # An example that did not finish may never have written its result: its slot holds an earlier
        # call's value (the registers are the donated workspace's), so it reads 0 instead.
        failed = status.flagged
        result = tree_map(lambda a: where(failed.reshape((B,) + (1,) * (a.ndim - 1)), jnp.zeros((), a.dtype),
                                          a[:B]), final.regs[prog.result])
        out = result, status, {"stacks": final.stacks, "pc_stack": final.pc_stack, "regs": final.regs, "pc": final.pc,
                               "lane": final.lane, "queues": final.queues.lanes, "free": final.free.lanes,
                               "claim": final.claim}
        return out if recorder is None else (*out, tape)

    @staticmethod
    def _flag_failed(failed: jax.Array, examples: jax.Array, block: jax.Array) -> jax.Array:
        """The examples of a step's lanes at a Fail block (`examples`: B where none) are
        failed there (1 + the block), unless an earlier Fail already flagged them."""
        before = take(failed, examples)
        return failed.at[examples].set(where(before == 0, block + 1, before).astype(failed.dtype), **DROP)

    def _spawn_params(self, term: Fork, consts: dict[str, Any], inv: dict[str, Any], stored: dict[str, Any],
                      kid: jax.Array, src: jax.Array, example: jax.Array):
        """Children's parameters from their parent's arguments (which lowering
        keeps in registers, or are constants or per-example invariants):
        `(names, go)`, `go` taking and returning the registers `names` (those
        of `stored` it reads or writes)."""
        W, K, types = self.width, self.fan, self.prog.var_types
        names = sorted({v for c in term.calls for p, a in zip(c.params, c.args) if p in stored
                        for v in (p, a) if v in stored})

        def go(regs):
            regs = dict(regs)
            kids, srcs, examples = kid.reshape(W, K), src.reshape(W, K), example.reshape(W, K)
            for j, c in enumerate(term.calls):
                for p, a in zip(c.params, c.args):
                    if p not in regs:
                        continue  # never read: no lane slot
                    if a in regs:
                        value = gather_rows(regs[a], srcs[:, j])
                    elif a in inv:
                        value = gather_rows(inv[a], examples[:, j])
                    else:
                        value = cast_to(consts[a], types[p], W)
                    regs[p] = scatter_rows(regs[p], kids[:, j], cast_to(value, types[p], None))
            return regs

        return names, go
