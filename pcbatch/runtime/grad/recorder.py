"""The forward pass: appending each recorded step to the tape."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from pcbatch.runtime.lanes import gather_rows, take
from pcbatch.runtime.state import Tape
from pcbatch.runtime.grad.plan import BlockGrad, Plan

tree_util = jax.tree_util
tree_map = tree_util.tree_map


class Recorder:
    """Appends each recorded step to the tape (`loop.while_loop_recorded`):
    `before` the step updates anything, what its block reads; `after`, the
    lanes a Fork spawned."""

    def __init__(self, plan: Plan):
        self.plan = plan

    def init(self, state: Any) -> Tape:
        return self.plan.empty_tape()

    def before(self, tape: Tape, pre: Any, block: jax.Array, ids: jax.Array) -> tuple[Tape, dict, jax.Array]:
        """`ids`: the lanes the step runs, as the machine picked them (dense, then `lanes`)."""
        p = self.plan
        n = jnp.sum(ids < p.lanes, dtype=ids.dtype)
        recorded = (jnp.asarray(p.dense)[block] >= 0) & (n > 0)  # the backward pads with row 0: a real one
        t = tape.t
        at = jnp.where(recorded, t, p.log_size)  # inert blocks, and past the log's end: dropped
        start = jnp.minimum(tape.cursor[block], p.capacity)  # past capacity: overflowed, rows are junk
        tape = tape._replace(log_block=tape.log_block.at[at].set(block, mode="drop"),
                             log_count=tape.log_count.at[at].set(n, mode="drop"), t=t + recorded,
                             cursor=tape.cursor.at[block].add(jnp.where(recorded, n, 0)))
        if p.pool:
            own = take(pre.lane, ids)
            example = own[:, p.col.example]
            sp = {s: own[:, p.col.sp[s]] for s in p.layout.stacks}
        else:
            own, example = None, ids
            sp = {s: take(x, ids) for s, x in p.layout.pointers(pre.sps).items()}

        def write(g: BlockGrad, w: int, on: jax.Array | None = None):
            """Block g's rows for the first `w` lanes (a width bucket >= n). With
            `on` (masked: every block every step), where it is False the rows go
            to the tape's overflow rows, never read, and the writer's are dropped."""
            def go(rows, writer):
                lanes, ex = ids[:w], example[:w]
                at = start if on is None else jnp.where(on, start, p.capacity)
                row: dict[str, Any] = {"lane": lanes, "example": ex,
                                       "reg": {v: gather_rows(pre.regs[v], lanes) for v in g.reg_in}}
                slot = {s: jnp.maximum(sp[s][:w] - 1, 0) for s in g.reads}
                row["top"] = {s: tree_map(lambda a: take(a, slot[s], lanes),
                                          pre.stacks[s]) for s in g.reads}
                row["wid"] = {s: take(writer[s], slot[s], lanes, fill=p.events[s])
                              for s in g.reads if s in p.float_stacks}
                if g.join is not None:
                    kids = own[:w, p.col.kids]
                    row["kids"] = kids
                    row["joined"] = tuple(gather_rows(pre.regs[r], kids[:, k]) for k, r in enumerate(g.join.rets))
                rows = dict(rows)
                for k, x in row.items():
                    rows[k] = tree_map(lambda a, x: lax.dynamic_update_slice_in_dim(a, x.astype(a.dtype), at, 0),
                                       rows[k], x)
                writer = dict(writer)
                for s in g.writes:
                    if s in p.float_stacks:
                        event = p.event_base[s, g.index] + start + jnp.arange(w, dtype=ids.dtype)
                        to = lanes if on is None else jnp.where(on, lanes, p.lanes)
                        writer[s] = writer[s].at[sp[s][:w] + g.offsets[s][1], to].set(event, mode="drop")
                return rows, writer
            return go

        widths = jnp.asarray(p.widths)
        which = jnp.minimum(jnp.searchsorted(widths, n), len(p.widths) - 1)

        def bucketed(g: BlockGrad, on: jax.Array | None = None):
            writes = [write(g, w, on) for w in p.widths]
            return lambda r, wr: lax.switch(which, writes, r, wr) if len(writes) > 1 else writes[0](r, wr)

        rows, writer = dict(tape.rows), tape.writer
        dep = jnp.zeros((), ids.dtype)  # depends on every read below (see `while_loop_recorded`)
        for g in p.blocks:
            if p.switched:  # masked, no conditional (see `Tuning.grad_switch`)
                rows[g.index], writer = bucketed(g, block == g.index)(rows[g.index], writer)
                for x in tree_util.tree_leaves(rows[g.index]):  # every read, not only the lanes' (a cond ties them)
                    dep = dep | (x.reshape(-1)[0] != 0).astype(dep.dtype)
            else:
                rows[g.index], writer = lax.cond(block == g.index, bucketed(g), lambda r, w: (r, w),
                                                 rows[g.index], writer)
            dep = dep | (rows[g.index]["lane"][0] & 0x40000000) | (ids[0] & 0x40000000)
        for w in writer.values():
            dep = dep | (w[0, 0] & 0x40000000)
        tape = tape._replace(rows=rows, writer=writer)
        return tape, {"ids": ids, "start": start}, dep

    def after(self, tape: Tape, taken: dict[str, Any], new: Any, info: dict[str, Any]) -> Tape:
        p, block = self.plan, info["block"]
        forks = [g for g in p.blocks if g.spawn]
        if not forks:
            return tape
        # A Fork's children: its rows of the lane table, after the step.
        spawned = take(new.lane, taken["ids"], fill=p.lanes)[:, p.col.kids]
        rows = dict(tape.rows)
        for g in forks:
            rows[g.index] = lax.cond(
                block == g.index,
                lambda r: {**r, "spawned": lax.dynamic_update_slice_in_dim(r["spawned"], spawned, taken["start"], 0)},
                lambda r: r, rows[g.index])
        return tape._replace(rows=rows)
