"""What the tape and the backward pass need to know about one machine and its blocks."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pcbatch.ir.core import CONSTANT, INVARIANT, Fork, Join, StackProgram, op_reads, op_writes
from pcbatch.runtime.dtypes import index_dtype
from pcbatch.runtime.state import Tape
from pcbatch.runtime.uninitialized import uninitialized
from pcbatch.runtime.block import stack_offsets
from pcbatch.runtime.machine import Machine
from pcbatch.runtime.pool import PoolMachine
from pcbatch.runtime.grad.floats import is_float

tree_util = jax.tree_util
tree_map = tree_util.tree_map


@dataclass(frozen=True)
class BlockGrad:
    """The dataflow of one block, as the tape and its VJP see it.

    `reg_in`: registers it reads before assigning them; `const_in` /
    `inv_in`: machine constants / per-example invariants it reads; `reads` /
    `writes`: stacks it pops or peeks / pushes or updates (with `offsets`
    from `machine.stack_offsets`); `reg_out`: float registers it assigns;
    `join`: its Join; `spawn`: `(child k, parameter, argument)` of a Fork's
    float parameters held in lane slots."""

    index: int
    reg_in: tuple[str, ...]
    const_in: tuple[str, ...]
    inv_in: tuple[str, ...]
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    offsets: dict
    reg_out: tuple[str, ...]
    join: Join | None
    spawn: tuple[tuple[int, str, str], ...]

    @staticmethod
    def of(prog: StackProgram, b: int, stored: set[str], stack_of: dict[str, str]) -> "BlockGrad":
        block, cls, types = prog.blocks[b], prog.var_class, prog.var_types
        reg_in: dict[str, None] = {}
        const_in: dict[str, None] = {}
        inv_in: dict[str, None] = {}
        defined: set[str] = set()
        for op in block.ops:
            for v in op_reads(op):
                if v in defined:
                    continue
                {CONSTANT: const_in, INVARIANT: inv_in}.get(cls.get(v), reg_in)[v] = None
            defined.update(op_writes(op))
        assert set(reg_in) <= stored, f"b{b} reads {set(reg_in) - stored} without a lane slot"
        offsets = stack_offsets(block, stack_of)
        written = {v for op in block.ops for v in op_writes(op)}
        join = block.ops[0] if block.ops and isinstance(block.ops[0], Join) else None
        spawn = ()
        if isinstance(block.term, Fork):
            spawn = tuple((k, p, a) for k, c in enumerate(block.term.calls) for p, a in zip(c.params, c.args)
                          if p in stored and is_float(types[p]) and is_float(types[a]))
            for _, _, a in spawn:  # the arguments' cotangents land in the parent's lane
                if cls.get(a) == CONSTANT:
                    const_in[a] = None
                elif cls.get(a) == INVARIANT:
                    inv_in[a] = None
        return BlockGrad(b, tuple(reg_in), tuple(const_in), tuple(inv_in),
                         tuple(s for s, (r, _, _) in offsets.items() if r is not None),
                         tuple(s for s, (_, w, _) in offsets.items() if w is not None), offsets,
                         tuple(sorted(v for v in written if v in stored and is_float(types[v]))), join, spawn)


class Plan:
    """What the tape and the backward pass need to know about one machine."""

    def __init__(self, prog: StackProgram, machine: Machine | PoolMachine, tape_size: int):
        self.prog = prog
        self.pool = isinstance(machine, PoolMachine)
        self.examples = machine.examples if self.pool else machine.lanes
        self.lanes = machine.lanes
        self.depth = machine.depth
        self.rec_width = machine.width if self.pool else machine.lanes  # rows one recorded step writes
        self.widths = list(machine.widths)  # row buckets: the pool's widths, or halving from all lanes
        self.switched = machine.tuning.grad_switched()  # one lax.switch a step, not a lax.cond per block
        if self.pool:
            self.fan, self.col = machine.fan, machine.col
        else:
            self.fan = 1
        types = prog.var_types
        stored = set(machine.stored)
        self.layout = machine.layout
        self.float_regs = sorted(v for v in stored if is_float(types[v]))
        self.float_stacks = sorted(s for s, t in self.layout.stacks.items() if is_float(t))
        grads = [BlockGrad.of(prog, b, stored, self.layout.stack_of) for b in range(prog.num_blocks)]
        fs = set(self.float_stacks)
        self.blocks = [g for g in grads if g.reg_out or g.spawn or set(g.writes) & fs]
        self.dense = np.full(prog.num_blocks, -1, np.int32)  # block -> its index among recorded ones
        for k, g in enumerate(self.blocks):
            self.dense[g.index] = k
        self.capacity = tape_size * self.examples  # rows per block
        rows = self.capacity + self.rec_width
        # Events of each float stack: its writers' tapes, one after the other.
        self.event_base: dict[tuple[str, int], int] = {}
        self.events: dict[str, int] = {}
        for s in self.float_stacks:
            n = 0
            for g in self.blocks:
                if s in g.writes:
                    self.event_base[s, g.index] = n
                    n += rows
            self.events[s] = n
        steps = max(1, len(self.blocks) * self.capacity)
        max_steps = machine.max_steps
        self.log_size = steps if max_steps is None else max(1, min(steps, max_steps))

    # --- the tape ------------------------------------------------------------

    def row_types(self, g: BlockGrad) -> dict[str, Any]:
        types, stacks = self.prog.var_types, self.layout.stacks
        idx = jax.ShapeDtypeStruct((), index_dtype())
        row: dict[str, Any] = {"lane": idx, "example": idx,
                               "reg": {v: types[v] for v in g.reg_in},
                               "top": {s: stacks[s] for s in g.reads},
                               "wid": {s: idx for s in g.reads if s in self.float_stacks}}
        if g.join is not None:  # the children it joins, and their return values
            row["kids"] = jax.ShapeDtypeStruct((self.fan,), idx.dtype)
            row["joined"] = tuple(types[r] for r in g.join.rets)
        if g.spawn:  # the children it spawned
            row["spawned"] = jax.ShapeDtypeStruct((self.fan,), idx.dtype)
        return row

    def empty_tape(self) -> Tape:
        rows, idx = self.capacity + self.rec_width, index_dtype()
        return Tape(
            t=jnp.zeros((), idx),
            # Never read before written (padding rows are replaced): uninitialized where the backend allows.
            log_block=uninitialized((self.log_size,), idx),
            log_count=uninitialized((self.log_size,), idx),
            cursor=jnp.zeros((self.prog.num_blocks,), idx),
            rows={g.index: tree_map(lambda s: uninitialized((rows,) + s.shape, s.dtype), self.row_types(g))
                     for g in self.blocks},
            # the event whose value each slot of each float stack holds (none: out of range)
            writer={s: jnp.full((self.depth, self.lanes), self.events[s], idx) for s in self.float_stacks},
        )

    @staticmethod
    def overflowed(tape: dict[str, Any], capacity: int, log_size: int) -> jax.Array:
        return (tape.t > log_size) | jnp.any(tape.cursor > capacity)

    def needed(self, tape: dict[str, Any]) -> int:
        """The smallest `tape_size` (rows per block per example) that holds this run."""
        rows = int(np.max(np.asarray(tape.cursor)[[g.index for g in self.blocks]], initial=0))
        steps = int(tape.t)
        per_block = max(rows, -(-steps // max(1, len(self.blocks))))
        return max(1, -(-per_block // self.examples))
