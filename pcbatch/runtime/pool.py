"""The fork-join machine: a pool of lanes, each step run on a compacted batch.

A program with `Fork`s runs here. Examples start in lanes `0..B-1`; the other
`max_lanes - B` lanes are free. At a Fork, every waiting lane that can get one
free lane per call (a prefix sum over the free mask, on device) starts its
children at their functions' entries and blocks (its pc is stored as
`-1 - join`, off the frontier) until its pending count drops to zero; a child
whose bottom frame returns is DONE: it decrements its parent's count and keeps
its return value until the parent's `Join` gathers it and frees the lane.
Lanes that cannot get enough free lanes take the Fork's sequential path in
their own lane: slower, never wrong.

Each step the scheduler picks one block; `lax.switch` runs it on the first
`lane_width` lanes waiting there, gathered into a dense batch of the narrowest
of up to 4 compiled widths that holds them (so a step costs what its lanes
need, not the whole pool), and returns only those rows' new values. They are scattered into the pool after the switch (in place: XLA copies
every full-size array a switch returns), each register's under a `lax.cond`
that skips blocks which do not write it. Lanes beyond `lane_width` wait for a
later step.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from pcbatch.fsm.base import Frontier, bind
from pcbatch.ir.core import (
    CONSTANT,
    INVARIANT,
    REGISTER,
    STACKED,
    Branch,
    Fork,
    Join,
    Jump,
    PushJump,
    Return,
    StackProgram,
    op_writes,
)
from pcbatch.runtime.dtypes import index_dtype
from pcbatch.runtime.lanes import cast_to, first_true, gather_rows, pad_rows, scatter_rows, zeros_of
from pcbatch.runtime.machine import (
    MachineConfig,
    StackLayout,
    Status,
    block_dataflow,
    block_in,
    stack_offsets,
    while_loop_recorded,
)

tree_map = jax.tree_util.tree_map


class PoolMachine:
    """Builds the loop for one `StackProgram` with forks, specialised to input types."""

    def __init__(self, prog: StackProgram, num_examples: int, config: MachineConfig):
        self.prog = prog
        self.examples = num_examples
        self.lanes = max(config.max_lanes or num_examples, num_examples)
        self.width = min(config.lane_width or self.lanes, self.lanes)
        # Narrower copies of every block, halving down to 16 lanes, at most 4
        # widths (each is another compiled copy of every block): a step pads
        # at most 2x, where the widest steps do their heavy work. (Factor 4
        # with the same count: 40% less Tree-LSTM throughput at H 64, batch 64.)
        self.widths = [self.width]
        while self.widths[0] // 2 >= 16 and len(self.widths) < 4:
            self.widths.insert(0, self.widths[0] // 2)
        self.depth = config.max_stack_depth
        self.max_steps = config.max_steps
        self.scheduler = bind(config.scheduler, prog)
        nb = prog.num_blocks
        self.halt, self.overflowed, self.done, self.free = nb, nb + 1, nb + 2, nb + 3
        blocks = prog.blocks
        self.stored = sorted(v for v, c in prog.var_class.items() if c in (REGISTER, STACKED) and v in prog.crossing)
        self.writers = {v: [b for b, blk in enumerate(blocks) if any(v in op_writes(op) for op in blk.ops)]
                        for v in self.stored}
        self.layout = StackLayout.of(prog)
        self.stack_of, self.stacks, self.stack_writers = self.layout
        self.pushjumps = [b for b, blk in enumerate(blocks) if isinstance(blk.term, PushJump)]
        self.forks = {b: blk.term for b, blk in enumerate(blocks) if isinstance(blk.term, Fork)}
        self.fan = max((len(t.calls) for t in self.forks.values()), default=1)
        self._columns()

    # --- state -----------------------------------------------------------
    #
    # Each lane's small integers live in one table, `lane[M, C]`, so a step
    # gathers and scatters them as one row: pc stack pointer, blocks run,
    # parent lane (-1: an example's root lane), pending children, poisoned
    # (a descendant overflowed), example, one stack pointer per stack, and
    # the lanes of its outstanding children. The pc stays separate: every
    # step compares all of it.

    def _columns(self) -> None:
        names = ["pc_sp", "depth", "parent", "pending", "poison", "example"] + [f"sp:{s}" for s in self.stacks]
        self.col = {n: k for k, n in enumerate(names)}
        self.kids = slice(len(names), len(names) + self.fan)
        self.num_cols = len(names) + self.fan

    def workspace_shapes(self) -> dict[str, Any]:
        return self.layout.workspace_shapes(self.depth, self.lanes)

    def init(self, batched_inputs: dict[str, Any], workspace: dict[str, Any],
             active: jax.Array | None = None) -> dict[str, Any]:
        M, B, types, col, idx = self.lanes, self.examples, self.prog.var_types, self.col, index_dtype()
        regs = {v: zeros_of(types[v], (M,)) for v in self.stored}
        for v, x in batched_inputs.items():
            if v in regs:
                regs[v] = tree_map(lambda r, y: r.at[:B].set(y), regs[v], cast_to(x, types[v], B))
        lane = jnp.zeros((M, self.num_cols), idx)
        lane = lane.at[:, col["pc_sp"]].set(1)  # slot 0 belongs to the bottom frame and is never read
        lane = lane.at[:, col["parent"]].set(-1).at[:, col["example"]].set(jnp.arange(M, dtype=idx) % B)
        lane = lane.at[:, self.kids].set(M)
        entry = jnp.full((B,), self.prog.entry_block, idx)
        if active is not None:  # padding examples start halted: they never run a block
            entry = jnp.where(active, entry, self.halt)
        return {
            "pc": jnp.full((M,), self.free, idx).at[:B].set(entry),
            "lane": lane,
            "regs": regs,
            "stacks": dict(workspace["stacks"]),  # never read before written: no zero fill
            "pc_stack": workspace["pc_stack"],
            "work": jnp.zeros((B,), idx),  # blocks run by all of an example's lanes
            "peak": jnp.asarray(B, idx),
            "steps": jnp.zeros((), idx),
            "sched": self.scheduler.init(self.prog.num_blocks, M),
        }

    # --- one block on a compacted batch -----------------------------------

    def block_fn(self, b: int, consts: dict[str, Any], inv: dict[str, Any], W: int):
        """Block `b` on (up to) `W` of its lanes; every output padded to `self.width` rows."""
        prog, block, types, col = self.prog, self.prog.blocks[b], self.prog.var_types, self.col
        M, D, K, N = self.lanes, self.depth, self.fan, self.width
        idx = index_dtype()

        def run(state: dict[str, Any]) -> dict[str, Any]:
            pc_all = state["pc"]
            ids = first_true(pc_all == b, W)
            valid = ids < M
            own = state["lane"].at[ids].get(mode="fill", fill_value=0)
            get = lambda name: own[:, col[name]]  # noqa: E731
            sps = {s: get(f"sp:{s}") for s in self.stacks}
            changes: dict[str, jax.Array] = {"depth": get("depth") + 1}
            no_row = jnp.full((W,), D, idx)
            stack_writes = {s: (no_row, zeros_of(t, (W,))) for s, t in self.stacks.items()}
            pc_write = (no_row, jnp.zeros((W,), idx))
            freed = jnp.full((W * K,), M, idx)
            spawned = (jnp.full((W * K,), M, idx), jnp.zeros((W * K, self.num_cols), idx), jnp.zeros((W * K,), idx))

            loaded: dict[str, Any] = {}  # registers and invariants, gathered once

            def load(v: str) -> tuple[Any, bool]:
                if prog.var_class[v] == CONSTANT:
                    return consts[v], False
                if v not in loaded:
                    if prog.var_class[v] == INVARIANT:  # stored once per example
                        loaded[v] = gather_rows(inv[v], get("example"))
                    else:
                        loaded[v] = gather_rows(state["regs"][v], ids)
                return loaded[v], True

            def top(s: str) -> Any:
                return tree_map(lambda a: a.at[jnp.maximum(sps[s] - 1, 0), ids].get(mode="fill", fill_value=0),
                                state["stacks"][s])

            def join(op: Join) -> dict[str, Any]:
                kids = own[:, self.kids]
                return {v: cast_to(gather_rows(state["regs"][r], kids[:, k]), types[v], None)
                        for k, (v, r) in enumerate(zip(op.outs, op.rets))}

            env, pushed = block_dataflow(block, self.stack_of, load, top, join, types, W)

            def read(v: str) -> tuple[Any, bool]:
                return (env[v], True) if v in env else load(v)

            for s, (_, w, d) in stack_offsets(block, self.stack_of).items():
                if w is not None:
                    stack_writes[s] = (jnp.where(valid, sps[s] + w, D), pushed[s])
                sps[s] = sps[s] + d
            if block.ops and isinstance(block.ops[0], Join):
                kids = own[:, self.kids]
                poison = get("poison")
                for k in range(len(block.ops[0].rets)):
                    poison = poison | state["lane"].at[kids[:, k], col["poison"]].get(mode="fill", fill_value=0)
                changes["poison"] = poison
                freed = jnp.where(valid[:, None], kids, M).reshape(-1)

            term = block.term
            finished = jnp.zeros((W,), bool)  # a child lane whose bottom frame is done
            child = get("parent") >= 0
            if isinstance(term, Jump):
                pc = jnp.full((W,), term.target, idx)
            elif isinstance(term, Branch):
                cond, _ = read(term.cond)
                cond = jnp.broadcast_to(jnp.asarray(cond) != 0, (W,))
                pc = jnp.where(cond, term.true, term.false).astype(idx)
            elif isinstance(term, PushJump):
                sp = get("pc_sp")
                overflow = sp >= D
                pc_write = (jnp.where(valid & ~overflow, sp, D), jnp.full((W,), term.ret, idx))
                changes["pc_sp"] = sp + ~overflow
                # An overflowing child finishes poisoned (its parent must not wait forever).
                finished = overflow & child
                changes["poison"] = get("poison") | overflow
                pc = jnp.where(overflow, jnp.where(child, self.done, self.overflowed), term.target).astype(idx)
            elif isinstance(term, Return):
                sp = get("pc_sp")
                bottom = sp <= 1
                popped = state["pc_stack"].at[jnp.maximum(sp - 1, 0), ids].get(mode="fill", fill_value=self.halt)
                finished = bottom & child
                pc = jnp.where(bottom, jnp.where(child, self.done, self.halt), popped).astype(idx)
                changes["pc_sp"] = jnp.maximum(sp - 1, 1)
            elif isinstance(term, Fork):
                k = len(term.calls)
                free = pc_all == self.free
                room = jnp.sum(free, dtype=idx) // k
                can = valid & (jnp.arange(W, dtype=idx) < room)  # valid rows come first, in order
                kids = jnp.where(can[:, None], first_true(free, W * k).reshape(W, k), M)
                kids = jnp.pad(kids, ((0, 0), (0, K - k)), constant_values=M)
                own = own.at[:, self.kids].set(kids)
                changes["pending"] = jnp.where(can, k, get("pending"))
                # The children's rows: a fresh bottom frame, this lane as parent.
                rows = jnp.zeros((W, K, self.num_cols), idx)
                rows = rows.at[:, :, col["pc_sp"]].set(1).at[:, :, self.kids].set(M)
                rows = rows.at[:, :, col["parent"]].set(ids[:, None])
                rows = rows.at[:, :, col["depth"]].set(changes["depth"][:, None])  # the Fork's successors
                rows = rows.at[:, :, col["example"]].set(get("example")[:, None])
                starts = jnp.array([c.target for c in term.calls] + [0] * (K - k), idx)
                spawned = (kids.reshape(-1), rows.reshape(W * K, -1), jnp.broadcast_to(starts, (W, K)).reshape(-1))
                pc = jnp.where(can, -1 - term.join, term.seq).astype(idx)
            decrement = jnp.where(valid & finished, get("parent"), M)

            for s in self.stacks:
                changes[f"sp:{s}"] = sps[s]
            for name, x in changes.items():
                own = own.at[:, col[name]].set(x.astype(idx))
            # Every branch returns the same structure: zeros for registers it does not write.
            regs = {v: env[v] if b in self.writers[v] else zeros_of(types[v], (W,))
                    for v in self.stored if self.writers[v]}
            out = {"pc": pc, "lane": own, "regs": regs, "stack_values": {s: x for s, (_, x) in stack_writes.items()},
                   "pc_value": pc_write[1]}
            out = tree_map(lambda x: pad_rows(x, N), out)
            # Padding rows: no lane (M), no stack row (D); their values are dropped.
            out["spawn_rows"] = pad_rows(spawned[1], N * K)
            out["spawn_starts"] = pad_rows(spawned[2], N * K)
            out["ids"] = pad_rows(ids, N, M)
            out["decrement"] = pad_rows(decrement, N, M)
            out["stack_rows"] = {s: pad_rows(row, N, D) for s, (row, _) in stack_writes.items()}
            out["pc_row"] = pad_rows(pc_write[0], N, D)
            out["freed"] = pad_rows(freed, N * K, M)
            out["spawn_lanes"] = pad_rows(spawned[0], N * K, M)
            return out

        return run

    # --- the loop --------------------------------------------------------

    def run(self, consts: dict[str, Any], inv: dict[str, Any], batched_inputs: dict[str, Any],
            workspace: dict[str, Any], active: jax.Array | None = None, recorder: Any = None) -> tuple[Any, ...]:
        """`(result, status, workspace)`, and the tape last when a `recorder`
        (gradients, `grad.py`) is given."""
        prog, B, col = self.prog, self.examples, self.col
        widths = self.widths

        def branch(b: int):
            runs = [self.block_fn(b, consts, inv, w) for w in widths]
            if len(runs) == 1:
                return runs[0]

            def go(state):
                # The narrowest width that takes every lane waiting here: a step
                # costs what its lanes need, not the widest batch.
                which = jnp.minimum(jnp.searchsorted(jnp.array(widths), state["count"]), len(widths) - 1)
                return lax.switch(which, runs, state)
            return go

        branches = [branch(b) for b in range(prog.num_blocks)]
        halt, max_steps = self.halt, self.max_steps

        def cond(state):
            running = jnp.any(state["pc"] < halt)  # blocked parents (pc < 0) count as running
            return running if max_steps is None else running & (state["steps"] < max_steps)

        def step(state, observe):
            pc = state["pc"]
            ready = (pc >= 0) & (pc < halt)
            sched_pc = jnp.where(ready, pc, halt)
            counts = jnp.sum(sched_pc[None, :] == jnp.arange(halt, dtype=pc.dtype)[:, None], axis=1, dtype=pc.dtype)
            depth = state["lane"][:, col["depth"]]
            block, sched = self.scheduler.choose(state["sched"], Frontier(sched_pc, counts, depth))
            block = observe(state, block.astype(pc.dtype))  # schedulers may answer in int32
            view = {k: state[k] for k in ("pc", "lane", "regs", "stacks", "pc_stack")}
            view["count"] = counts[block]  # lanes waiting at the chosen block
            out = lax.switch(block, branches, view)
            ids = out["ids"]
            new = dict(state)
            lane = state["lane"].at[ids].set(out["lane"], mode="drop")
            new["work"] = state["work"].at[jnp.where(ids < self.lanes, out["lane"][:, col["example"]], B)].add(
                1, mode="drop")
            regs = dict(state["regs"])
            for v, vals in out["regs"].items():
                regs[v] = lax.cond(block_in(block, self.writers[v]), lambda r, x: scatter_rows(r, ids, x),
                                   lambda r, x: r, regs[v], vals)
            stacks = dict(state["stacks"])
            for s, value in out["stack_values"].items():
                stacks[s] = lax.cond(block_in(block, self.stack_writers[s]),
                                     lambda a, r, x: tree_map(lambda y, z: y.at[r, ids].set(z, mode="drop"), a, x),
                                     lambda a, r, x: a, stacks[s], out["stack_rows"][s], value)
            row, value = out["pc_row"], out["pc_value"]
            new["pc_stack"] = lax.cond(block_in(block, self.pushjumps),
                                       lambda a: a.at[row, ids].set(value, mode="drop"), lambda a: a, state["pc_stack"])
            pc = pc.at[ids].set(out["pc"], mode="drop").at[out["freed"]].set(self.free, mode="drop")
            if self.forks:
                kid = out["spawn_lanes"]
                pc = pc.at[kid].set(out["spawn_starts"], mode="drop")
                lane = lane.at[kid].set(out["spawn_rows"], mode="drop")
                src, example = out["spawn_rows"][:, col["parent"]], out["spawn_rows"][:, col["example"]]
                for f, term in self.forks.items():
                    regs = lax.cond(block == f, self._spawn_params(term, consts, inv, kid, src, example),
                                    lambda r: r, regs)
                lane = lane.at[out["decrement"], col["pending"]].add(-1, mode="drop")
                # A Join comes after its children's last blocks: its depth (for
                # the depth/agenda schedulers) is the longest path through them.
                lane = lane.at[out["decrement"], col["depth"]].max(out["lane"][:, col["depth"]], mode="drop")
                pc = jnp.where((pc < 0) & (lane[:, col["pending"]] == 0), -1 - pc, pc)
            new.update(pc=pc, lane=lane, regs=regs, stacks=stacks, sched=sched, steps=state["steps"] + 1,
                       peak=jnp.maximum(state["peak"], jnp.sum(pc != self.free, dtype=pc.dtype)))
            return new, {"block": block, "out": out}

        final, tape = while_loop_recorded(cond, step, self.init(batched_inputs, workspace, active), recorder)
        result = tree_map(lambda a: a[:B], final["regs"][prog.result])
        pc = final["pc"][:B]
        overflow = (pc == self.overflowed) | (final["lane"][:B, col["poison"]] != 0)
        status = Status(overflow, (pc < halt) & ~overflow, pc, final["steps"], final["work"], final["peak"])
        out = result, status, {"stacks": final["stacks"], "pc_stack": final["pc_stack"]}
        return out if recorder is None else (*out, tape)

    def _spawn_params(self, term: Fork, consts: dict[str, Any], inv: dict[str, Any], kid: jax.Array,
                      src: jax.Array, example: jax.Array):
        """Children's parameters from their parent's arguments (which lowering
        keeps in registers, or are constants or per-example invariants)."""
        W, K, types = self.width, self.fan, self.prog.var_types

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

        return go
