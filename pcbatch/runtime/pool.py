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
`lane_width` lanes waiting there, gathered into a dense batch (so a step costs
what its lanes need, not the whole pool), and returns only those rows' new
values. They are scattered into the pool after the switch (in place: XLA copies
every full-size array a switch returns), each register's under a `lax.cond`
that skips blocks which do not write it. Lanes beyond `lane_width` wait for a
later step.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from pcbatch.fsm.base import Frontier
from pcbatch.ir.core import (
    CONSTANT,
    REGISTER,
    STACKED,
    Branch,
    Fork,
    Join,
    Jump,
    Peek,
    Pop,
    Prim,
    Push,
    PushJump,
    Return,
    StackProgram,
    Update,
    op_writes,
)
from pcbatch.runtime.machine import MachineConfig, Status, _cast, _zeros

tree_map = jax.tree_util.tree_map


def _gather(x: Any, ids: jax.Array) -> Any:
    return tree_map(lambda a: a.at[ids].get(mode="fill", fill_value=0), x)


def _scatter(x: Any, ids: jax.Array, values: Any) -> Any:
    return tree_map(lambda a, v: a.at[ids].set(v.astype(a.dtype), mode="drop"), x, values)


def _in(block: jax.Array, blocks: list[int]) -> jax.Array:
    return jnp.any(block == jnp.array(blocks, jnp.int32)) if blocks else jnp.zeros((), bool)


class PoolMachine:
    """Builds the loop for one `StackProgram` with forks, specialised to input types."""

    def __init__(self, prog: StackProgram, num_examples: int, config: MachineConfig):
        self.prog = prog
        self.examples = num_examples
        self.lanes = max(config.max_lanes or num_examples, num_examples)
        self.width = min(config.lane_width or self.lanes, self.lanes)
        self.depth = config.max_stack_depth
        self.max_steps = config.max_steps
        self.scheduler = config.scheduler
        nb = prog.num_blocks
        self.halt, self.overflowed, self.done, self.free = nb, nb + 1, nb + 2, nb + 3
        blocks = prog.blocks
        self.stored = sorted(v for v, c in prog.var_class.items() if c in (REGISTER, STACKED) and v in prog.crossing)
        self.writers = {v: [b for b, blk in enumerate(blocks) if any(v in op_writes(op) for op in blk.ops)]
                        for v in self.stored}
        self.stack_of = {v: prog.stack_of.get(v, v) for v, c in prog.var_class.items() if c == STACKED}
        self.stacks: dict[str, Any] = {}
        for v, s in sorted(self.stack_of.items()):
            self.stacks.setdefault(s, prog.var_types[v])
        self.stack_writers = {s: [b for b, blk in enumerate(blocks)
                                  if any(isinstance(op, (Push, Update)) and self.stack_of[op.var] == s for op in blk.ops)]
                              for s in self.stacks}
        self.pushjumps = [b for b, blk in enumerate(blocks) if isinstance(blk.term, PushJump)]
        self.forks = {b: blk.term for b, blk in enumerate(blocks) if isinstance(blk.term, Fork)}
        self.fan = max((len(t.calls) for t in self.forks.values()), default=1)

    # --- state -----------------------------------------------------------

    def init(self, batched_inputs: dict[str, Any]) -> dict[str, Any]:
        M, B, D, types = self.lanes, self.examples, self.depth, self.prog.var_types
        regs = {v: _zeros(types[v], (M,)) for v in self.stored}
        for v, x in batched_inputs.items():
            if v in regs:
                regs[v] = tree_map(lambda r, y: r.at[:B].set(y), regs[v], _cast(x, types[v], B))
        pc = jnp.full((M,), self.free, jnp.int32).at[:B].set(self.prog.entry_block)
        return {
            "pc": pc,
            "regs": regs,
            "stacks": {s: _zeros(t, (D, M)) for s, t in self.stacks.items()},
            "sps": {s: jnp.zeros((M,), jnp.int32) for s in self.stacks},
            "pc_stack": jnp.full((D, M), self.halt, jnp.int32),
            "pc_sp": jnp.ones((M,), jnp.int32),  # slot 0 is the bottom frame's (never read)
            "depth": jnp.zeros((M,), jnp.int32),
            "parent": jnp.full((M,), -1, jnp.int32),
            "example": jnp.arange(M, dtype=jnp.int32) % B,
            "work": jnp.zeros((B,), jnp.int32),  # blocks run by all of an example's lanes
            "pending": jnp.zeros((M,), jnp.int32),
            "kids": jnp.full((M, self.fan), M, jnp.int32),
            "poison": jnp.zeros((M,), bool),
            "peak": jnp.asarray(B, jnp.int32),
            "steps": jnp.zeros((), jnp.int32),
            "sched": self.scheduler.init(self.prog.num_blocks, M),
        }

    # --- one block on a compacted batch -----------------------------------

    def block_fn(self, b: int, consts: dict[str, Any]):
        prog, block, types = self.prog, self.prog.blocks[b], self.prog.var_types
        M, W, D, K = self.lanes, self.width, self.depth, self.fan

        def run(state: dict[str, Any]) -> dict[str, Any]:
            pc_all = state["pc"]
            here = pc_all == b
            rank = jnp.cumsum(here) - 1
            ids = jnp.full((W,), M, jnp.int32).at[jnp.where(here & (rank < W), rank, W)].set(
                jnp.arange(M, dtype=jnp.int32), mode="drop")
            valid = ids < M
            own = {k: _gather(state[k], ids) for k in ("pc", "pc_sp", "depth", "parent", "pending", "poison", "kids")}
            sps = {s: _gather(state["sps"][s], ids) for s in self.stacks}
            env: dict[str, Any] = {}
            no_row = jnp.full((W,), D, jnp.int32)
            stack_writes = {s: (no_row, _zeros(t, (W,))) for s, t in self.stacks.items()}
            pc_write = (no_row, jnp.zeros((W,), jnp.int32))
            decrement = jnp.full((W,), M, jnp.int32)  # parents whose child finished
            freed = jnp.full((W * K,), M, jnp.int32)
            spawned = (jnp.full((W * K,), M, jnp.int32), jnp.zeros((W * K,), jnp.int32), jnp.zeros((W * K,), jnp.int32))

            def read(v: str) -> tuple[Any, bool]:
                if v not in env:
                    if prog.var_class[v] == CONSTANT:
                        return consts[v], False
                    env[v] = _gather(state["regs"][v], ids)
                return env[v], True

            def top(stack: Any, sp: jax.Array) -> Any:
                return tree_map(lambda a: a.at[jnp.maximum(sp - 1, 0), ids].get(mode="fill", fill_value=0), stack)

            for op in block.ops:
                if isinstance(op, Prim):
                    vals, batched = zip(*(read(v) for v in op.ins)) if op.ins else ((), ())
                    if any(batched):
                        outs = jax.vmap(op.fn, in_axes=tuple(0 if x else None for x in batched))(*vals)
                    else:
                        outs = op.fn(*vals)
                    for v, x in zip(op.outs, outs):
                        env[v] = _cast(x, types[v], None if any(batched) else W)
                elif isinstance(op, (Push, Update)):
                    s = self.stack_of[op.var]
                    row = sps[s] if isinstance(op, Push) else sps[s] - 1
                    stack_writes[s] = (jnp.where(valid, row, D), read(op.var)[0])
                    if isinstance(op, Push):
                        sps[s] = sps[s] + 1
                elif isinstance(op, (Pop, Peek)):
                    s = self.stack_of[op.var]
                    env[op.var] = top(state["stacks"][s], sps[s])
                    if isinstance(op, Pop):
                        sps[s] = sps[s] - 1
                elif isinstance(op, Join):
                    kids = own["kids"]
                    for k, (v, r) in enumerate(zip(op.outs, op.rets)):
                        env[v] = _cast(_gather(state["regs"][r], kids[:, k]), types[v], None)
                        own["poison"] = own["poison"] | state["poison"].at[kids[:, k]].get(mode="fill", fill_value=False)
                    freed = jnp.where(valid[:, None], kids, M).reshape(-1)

            pc, term = own["pc"], block.term
            finished = jnp.zeros((W,), bool)  # a child lane whose bottom frame is done
            if isinstance(term, Jump):
                pc = jnp.full((W,), term.target, jnp.int32)
            elif isinstance(term, Branch):
                cond, _ = read(term.cond)
                cond = jnp.broadcast_to(jnp.asarray(cond) != 0, (W,))
                pc = jnp.where(cond, term.true, term.false).astype(jnp.int32)
            elif isinstance(term, PushJump):
                sp = own["pc_sp"]
                overflow = sp >= D
                pc_write = (jnp.where(valid & ~overflow, sp, D), jnp.full((W,), term.ret, jnp.int32))
                own["pc_sp"] = sp + ~overflow
                child = own["parent"] >= 0
                # An overflowing child finishes poisoned (its parent must not wait forever).
                finished = overflow & child
                own["poison"] = own["poison"] | overflow
                pc = jnp.where(overflow, jnp.where(child, self.done, self.overflowed), term.target)
            elif isinstance(term, Return):
                sp = own["pc_sp"]
                bottom = sp <= 1
                popped = state["pc_stack"].at[jnp.maximum(sp - 1, 0), ids].get(mode="fill", fill_value=self.halt)
                child = own["parent"] >= 0
                finished = bottom & child
                pc = jnp.where(bottom, jnp.where(child, self.done, self.halt), popped)
                own["pc_sp"] = jnp.maximum(sp - 1, 1)
            elif isinstance(term, Fork):
                k = len(term.calls)
                free = pc_all == self.free
                room = jnp.sum(free) // k
                can = valid & (jnp.arange(W) < room)  # valid rows come first, in order
                frank = jnp.cumsum(free) - 1
                first_free = jnp.full((W * k,), M, jnp.int32).at[jnp.where(free, frank, W * k)].set(
                    jnp.arange(M, dtype=jnp.int32), mode="drop")
                kids = jnp.where(can[:, None], first_free.reshape(W, k), M)
                targets = jnp.broadcast_to(jnp.array([c.target for c in term.calls], jnp.int32), (W, k))
                pad = ((0, 0), (0, K - k))
                own["kids"] = jnp.pad(kids, pad, constant_values=M)
                own["pending"] = jnp.where(can, k, own["pending"])
                spawned = (jnp.pad(kids, pad, constant_values=M).reshape(-1),
                           jnp.pad(jnp.broadcast_to(ids[:, None], (W, k)), pad).reshape(-1),
                           jnp.pad(targets, pad).reshape(-1))
                pc = jnp.where(can, -1 - term.join, term.seq).astype(jnp.int32)
            decrement = jnp.where(valid & finished, own["parent"], M)

            own["pc"] = pc
            regs = {v: env[v] if v in env else None for v in self.stored if b in self.writers[v]}
            return {"ids": ids, "own": own, "sps": sps, "regs": regs, "stack_writes": stack_writes,
                    "pc_write": pc_write, "decrement": decrement, "freed": freed, "spawned": spawned}

        return run

    # --- the loop --------------------------------------------------------

    def run(self, consts: dict[str, Any], batched_inputs: dict[str, Any]) -> tuple[Any, Status]:
        prog, M, W, B, types = self.prog, self.lanes, self.width, self.examples, self.prog.var_types
        runs = [self.block_fn(b, consts) for b in range(prog.num_blocks)]

        def branch(run):
            def go(state):
                out = run(state)
                # Every branch returns the same structure: zeros for registers it does not write.
                out["regs"] = {v: out["regs"].get(v) if out["regs"].get(v) is not None else _zeros(types[v], (W,))
                               for v in self.stored if self.writers[v]}
                return out
            return go

        branches = [branch(r) for r in runs]
        halt, max_steps = self.halt, self.max_steps

        def cond(state):
            running = jnp.any(state["pc"] < halt)  # blocked parents (pc < 0) count as running
            return running if max_steps is None else running & (state["steps"] < max_steps)

        def body(state):
            pc = state["pc"]
            ready = (pc >= 0) & (pc < halt)
            sched_pc = jnp.where(ready, pc, halt)
            counts = jnp.zeros((halt,), jnp.int32).at[sched_pc].add(1, mode="drop")
            block, sched = self.scheduler.choose(state["sched"], Frontier(sched_pc, counts, state["depth"]))
            view = {k: v for k, v in state.items() if k not in ("sched", "steps", "peak", "work", "example")}
            out = lax.switch(block, branches, view)
            ids, own = out["ids"], out["own"]
            new = dict(state)
            for k in ("pc_sp", "parent", "pending", "poison", "kids"):
                new[k] = _scatter(state[k], ids, own[k])
            new["depth"] = state["depth"].at[ids].add(1, mode="drop")
            new["work"] = state["work"].at[state["example"].at[ids].get(mode="fill", fill_value=B)].add(1, mode="drop")
            new["sps"] = {s: _scatter(state["sps"][s], ids, out["sps"][s]) for s in self.stacks}
            regs = dict(state["regs"])
            for v, vals in out["regs"].items():
                regs[v] = lax.cond(_in(block, self.writers[v]), lambda r, x: _scatter(r, ids, x),
                                   lambda r, x: r, regs[v], vals)
            stacks = dict(state["stacks"])
            for s, (row, value) in out["stack_writes"].items():
                stacks[s] = lax.cond(_in(block, self.stack_writers[s]),
                                     lambda a, r, x: tree_map(lambda y, z: y.at[r, ids].set(z, mode="drop"), a, x),
                                     lambda a, r, x: a, stacks[s], row, value)
            row, value = out["pc_write"]
            new["pc_stack"] = lax.cond(_in(block, self.pushjumps),
                                       lambda a: a.at[row, ids].set(value, mode="drop"), lambda a: a, state["pc_stack"])
            pc = pc.at[ids].set(own["pc"], mode="drop").at[out["freed"]].set(self.free, mode="drop")
            if self.forks:
                kid, src, start = out["spawned"]
                pc = pc.at[kid].set(start, mode="drop")
                new["pc_sp"] = new["pc_sp"].at[kid].set(1, mode="drop")
                new["sps"] = {s: x.at[kid].set(0, mode="drop") for s, x in new["sps"].items()}
                new["parent"] = new["parent"].at[kid].set(src, mode="drop")
                new["example"] = state["example"].at[kid].set(state["example"].at[src].get(mode="fill", fill_value=0),
                                                              mode="drop")
                new["pending"] = new["pending"].at[kid].set(0, mode="drop")
                new["poison"] = new["poison"].at[kid].set(False, mode="drop")
                new["depth"] = new["depth"].at[kid].set(new["depth"].at[src].get(mode="fill", fill_value=0), mode="drop")
                for f, term in self.forks.items():
                    regs = lax.cond(block == f, self._spawn_params(term, consts, kid, src), lambda r: r, regs)
                pending = new["pending"].at[out["decrement"]].add(-1, mode="drop")
                pc = jnp.where((pc < 0) & (pending == 0), -1 - pc, pc)
                new["pending"] = pending
            new.update(pc=pc, regs=regs, stacks=stacks, sched=sched, steps=state["steps"] + 1,
                       peak=jnp.maximum(state["peak"], jnp.sum(pc != self.free)))
            return new

        final = lax.while_loop(cond, body, self.init(batched_inputs))
        result = tree_map(lambda a: a[:B], final["regs"][prog.result])
        pc = final["pc"][:B]
        overflow = (pc == self.overflowed) | final["poison"][:B]
        status = Status(overflow, (pc < halt) & ~overflow, pc, final["steps"], final["work"], final["peak"])
        return result, status

    def _spawn_params(self, term: Fork, consts: dict[str, Any], kid: jax.Array, src: jax.Array):
        """Children's parameters from their parent's (stored) arguments."""
        W, K, types = self.width, self.fan, self.prog.var_types

        def go(regs):
            regs = dict(regs)
            kids, srcs = kid.reshape(W, K), src.reshape(W, K)
            for j, c in enumerate(term.calls):
                for p, a in zip(c.params, c.args):
                    if p not in regs:
                        continue  # never read: no lane slot
                    if a in regs:
                        value = _gather(regs[a], srcs[:, j])
                    else:
                        value = _cast(consts[a], types[p], W)
                    regs[p] = _scatter(regs[p], kids[:, j], _cast(value, types[p], None))
            return regs

        return go
