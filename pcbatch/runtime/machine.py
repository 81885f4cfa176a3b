"""The program-counter machine (Radul et al., Algorithm 2) as one `lax.while_loop`.

State: per lane, a program counter and a pc stack; per register, one slot per
lane; per (shared) stack of saved variables, a `[max_stack_depth, lanes, ...]`
array and a stack pointer per lane. Each step a scheduler picks ONE block (an
unbatched index); only that block runs, for all lanes, and the update is
masked to the lanes waiting at it. Blocks on small state share one
`lax.switch`; a block that touches a large register or stack frame runs in
place under a `lax.cond` of its own (a switch would copy every large register
every step), and `buf.at[i].set(v)` on a large register takes the mask into
the update (`inplace.py`) instead of selecting the whole buffer.

Here lane i runs example i. Programs with forks run on the lane pool of
`pool.py` instead, where extra lanes run calls on behalf of an example.
"""
from __future__ import annotations

from typing import Any

import functools

import jax
import jax.numpy as jnp
from jax import lax

from pcbatch.fsm.base import Frontier, bind
from pcbatch.runtime.block import Codes, Rows, execute, loop_safe_inputs
from pcbatch.runtime.dtypes import index_dtype, nbytes
from pcbatch.runtime.inplace import masked_update
from pcbatch.runtime.config import MachineConfig, Status
from pcbatch.runtime.loop import block_in, while_loop_recorded
from pcbatch.runtime.stacks import StackLayout
from pcbatch.runtime.state import MachineState
from pcbatch.ir.weak import as_typed, is_weak
from pcbatch.runtime.lanes import DROP, cast_to, first_true, select_where, take, where, zeros_of
from pcbatch.ir.core import (
    CONSTANT,
    INVARIANT,
    REGISTER,
    STACKED,
    Block,
    Peek,
    Pop,
    Prim,
    Push,
    PushJump,
    Return,
    StackProgram,
    Update,
    op_reads,
    term_reads,
)

tree_map = jax.tree_util.tree_map
PC = "<pc>"  # the program-counter stack, handled like a variable's stack


def _masked_plan(block: Block, types: Any, large: set[str]) -> tuple[dict[int, Any], set[str]]:
    """The ops of `block` that update a large register under the lane mask
    themselves (`inplace.py`), by index, and the registers whose value at the
    end of the block is then already right in the lanes that do not run it
    (no whole-buffer select needed). An op qualifies only while its register
    still holds the lane's old value (not yet overwritten unmasked)."""
    masked, clean, assigned = {}, set(), set()
    for k, op in enumerate(block.ops):
        fn = masked_update(op, types, large) if isinstance(op, Prim) and large.intersection(op.outs) else None
        if fn is not None and all(v not in assigned or v in clean for v in op.outs if v in op.ins):
            masked[k] = fn
            clean.update(v for v in op.outs if v in large and v in op.ins)
        elif isinstance(op, Prim):
            clean.difference_update(op.outs)
        elif isinstance(op, (Pop, Peek)):
            clean.discard(op.var)
        if isinstance(op, Prim):
            assigned.update(op.outs)
        elif isinstance(op, (Pop, Peek)):
            assigned.add(op.var)
    return masked, clean


def _masked_prim(fn: Any, active: jax.Array, types: Any, op: Prim, get: Any) -> dict[str, Any]:
    vals, batched = zip(*(get(v) for v in op.ins))
    vals = tuple(as_typed(x, types[v]) if is_weak(types[v]) else x for v, x in zip(op.ins, vals))
    vals = loop_safe_inputs(op, vals, batched, active)  # as `run_prim` does
    outs = jax.vmap(fn, in_axes=(0,) + tuple(0 if x else None for x in batched))(active, *vals)
    return {v: cast_to(x, types[v], None) for v, x in zip(op.outs, outs)}


class Machine:
    """Builds the loop for one `StackProgram` specialised to input types."""

    def __init__(self, prog: StackProgram, num_lanes: int, config: MachineConfig):
        self.prog = prog
        self.lanes = self.width = num_lanes  # a step runs every lane waiting at its block
        self.widths = config.tuning.widths(num_lanes)  # the gradient pass's row buckets
        self.depth = config.max_stack_depth
        self.max_steps = config.max_steps
        self.tuning = config.tuning
        self.scheduler = bind(config.scheduler, prog)
        self.halt = prog.num_blocks
        self.overflowed = prog.num_blocks + 1  # a halted lane whose recursion overflowed
        # A lane that fails at block b halts at `failed + b` (the status reads b from its pc).
        self.codes = Codes(self.halt, self.overflowed, prog.num_blocks + 2, prog.num_blocks + 3)
        self.lane_ids = jnp.arange(num_lanes, dtype=index_dtype())
        # A lane slot for every value that crosses a block boundary; a stacked
        # variable that is only ever restored and used within one block needs none. Sorted: the
        # classes' order follows set iteration, so the program (and the compilation cache's key)
        # would change with PYTHONHASHSEED, from process to process.
        self.stored = sorted(v for v, c in prog.var_class.items() if c in (REGISTER, STACKED) and v in prog.crossing)
        self.layout = StackLayout.of(prog)
        self.stack_of, self.stacks = self.layout.stack_of, self.layout.stacks
        self.stack_writers = {**self.layout.writers,
                              PC: [b for b, blk in enumerate(prog.blocks) if isinstance(blk.term, PushJump)]}
        # Blocks that touch a large register or stack frame run in place, each
        # under a lax.cond of its own; the rest share one lax.switch over the
        # small state (see `block_cond`).
        # (A register that large would be copied by the switch every step, twice;
        # with many small leaves, the switch's per-leaf copies cost more than a
        # lax.cond per block. Below both, e.g. fib and collatz, XLA runs the
        # switch loop natively, a few ns per step.)
        large_bytes = config.tuning.large_register_bytes
        self.large = large = {v for v in self.stored if nbytes(prog.var_types[v]) * num_lanes >= large_bytes}
        large_stacks = {st for st, t in self.stacks.items() if nbytes(t) * num_lanes >= large_bytes}
        self.small = [v for v in self.stored if v not in large]
        small_leaves = sum(len(jax.tree_util.tree_leaves(prog.var_types[v])) for v in self.small)
        self.carry_stacks = config.tuning.switch_carries_stacks(num_lanes)
        self.heavy = set()
        for b in range(prog.num_blocks):
            regs, _, popped, pushed = self._footprint(b)
            if (small_leaves > config.tuning.switch_max_leaves or large.intersection(regs)
                    or large_stacks.intersection(popped + pushed)):
                self.heavy.add(b)

    # --- state -----------------------------------------------------------

    def workspace_shapes(self) -> dict[str, Any]:
        return self.layout.workspace_shapes(self.depth, self.lanes)

    def init(self, batched_inputs: dict[str, Any], workspace: dict[str, Any],
             active: jax.Array | None = None) -> MachineState:
        L, types, idx = self.lanes, self.prog.var_types, index_dtype()
        regs = {v: zeros_of(types[v], (L,)) for v in self.stored}
        for v, x in batched_inputs.items():
            if v in regs:
                regs[v] = cast_to(x, types[v], L)
        pc = jnp.full((L,), self.prog.entry_block, idx)
        if active is not None:  # padding examples start halted: they never run a block
            pc = where(active, pc, self.halt)
        calls = self.prog.has_calls
        return MachineState(
            pc=pc,
            regs=regs,
            stacks=dict(workspace["stacks"]),
            sps={s: jnp.zeros((L,), idx) for s in self.layout.shared(self.stacks)},
            pc_stack=workspace["pc_stack"] if calls else None,
            # slot 0 belongs to the bottom frame and is never read
            pc_sp=jnp.ones((L,), idx) if calls else None,
            depth=jnp.zeros((L,), idx),
            steps=jnp.zeros((), idx),
            sched=self.scheduler.init(self.prog.num_blocks, L),
        )

    def lanes_at(self, state: MachineState, block: jax.Array) -> jax.Array:
        """The lanes a step at `block` runs (all waiting there, by lane), then `lanes`."""
        return first_true(state.pc == block, self.lanes)

    # --- one block -------------------------------------------------------
    #
    # `run` reads each stack's top per lane from `stacks` and returns one write
    # request per stack (row `D` = no write). Lowering guarantees a block reads
    # a stack (Pop/Peek) at most once and before it writes it (Push/Update) at
    # most once, so the top gathered before the block is the one it reads.
    # With more than one lane the stacks pass through the switch and each
    # branch gathers and scatters its own (`_carried_branch`); XLA:CPU's copy
    # insertion by region analysis then updates them in place, and a step that
    # touches no stack costs nothing for them. With one lane on the CPU (or
    # `Tuning(carry_stacks=False)`) the tops are gathered before the switch and
    # the writes scattered after it (`_switch_step`), which XLA runs faster there.

    def block_fn(self, b: int, consts: dict[str, Any], inv: dict[str, Any]):
        prog, block, types = self.prog, self.prog.blocks[b], self.prog.var_types
        L, D, idx = self.lanes, self.depth, index_dtype()
        masked_ops, clean = _masked_plan(block, types, self.large)

        def run(lane_state: dict[str, Any], stacks: dict[str, Any]):
            lane_state = dict(lane_state)
            regs = dict(lane_state["regs"])
            active = lane_state["pc"] == b

            def load(v: str) -> tuple[Any, bool]:
                if prog.var_class[v] == CONSTANT:
                    return consts[v], False
                if prog.var_class[v] == INVARIANT:
                    return inv[v], True  # lane i runs example i
                return regs[v], True

            # Ops that update a large register under the lane mask themselves.
            prims = {k: functools.partial(_masked_prim, fn, active, types) for k, fn in masked_ops.items()}
            # `stacks` holds each stack's top per lane (gathered before the switch), not the stack.
            rows = Rows(active, self.layout.pointers(lane_state["sps"]), lane_state.get("pc_sp"), stacks.get(PC), False)
            ran = execute(block, self.stack_of, self.stacks, types, load, stacks.__getitem__, None, rows,
                          self.codes, D, L, prims, index=b)
            writes = dict(ran.stack_writes)
            if prog.has_calls:
                writes[PC] = ran.pc_write or (jnp.full((L,), D, idx), jnp.zeros((L,), idx))
            for v, x in ran.env.items():
                if v in regs:
                    regs[v] = x if v in clean else select_where(active, x, regs[v])
            lane_state.update(pc=where(active, ran.pc, lane_state["pc"]), regs=regs, sps=self.layout.shared(ran.sps))
            if prog.has_calls:
                lane_state["pc_sp"] = ran.pc_sp
            return lane_state, writes

        return run

    # --- one block, in place ------------------------------------------------
    #
    # The alternative to the switch: one `lax.cond(block == b)` per block,
    # chained. Each takes and returns only what its block writes (and reads
    # what it needs), so XLA updates registers and stacks in place and a
    # register no block writes this step costs nothing. A switch must return
    # every register from every branch, and XLA copies each one a branch
    # passes through (twice: in the branch and in the loop body).

    def _footprint(self, b: int) -> tuple[list[str], list[str], list[str], list[str]]:
        """Block b's registers read, registers written, stacks popped/peeked
        and stacks pushed/updated (stored registers and stack names)."""
        block, stored = self.prog.blocks[b], set(self.stored)
        reads, writes, popped, pushed = set(), set(), set(), set()
        for op in block.ops:
            reads.update(v for v in op_reads(op) if v in stored)
            if isinstance(op, (Pop, Peek)):
                popped.add(self.stack_of[op.var])
            elif isinstance(op, (Push, Update)):
                pushed.add(self.stack_of[op.var])
            if isinstance(op, Prim):
                writes.update(v for v in op.outs if v in stored)
            elif isinstance(op, (Pop, Peek)) and op.var in stored:
                writes.add(op.var)
        reads.update(v for v in term_reads(block.term) if v in stored)
        return sorted(reads | writes), sorted(writes), sorted(popped), sorted(pushed)

    def _pc_use(self, b: int) -> tuple[bool, bool]:
        """Whether block b pops the pc stack (a Return, in a program with calls) and pushes it (a PushJump)."""
        term = self.prog.blocks[b].term
        return isinstance(term, Return) and self.prog.has_calls, isinstance(term, PushJump)

    def _tops(self, stacks: dict[str, Any], sps: dict[str, jax.Array], names) -> dict[str, Any]:
        """Each stack in `names`: its top frame per lane (row `sp - 1`; row 0 when empty)."""
        return {s: tree_map(lambda a: take(a, jnp.maximum(sps[s] - 1, 0), self.lane_ids),
                            stacks[s]) for s in names}

    def _write(self, stack: Any, row: jax.Array, value: Any) -> Any:
        """`stack` with each lane's `value` at its `row` (row `D`: no write)."""
        return tree_map(lambda a, y: a.at[row, self.lane_ids].set(y, **DROP), stack, value)

    def _switch_stacks(self, light: list[int]) -> tuple[dict[str, list[int]], list[str]]:
        """For the blocks in the switch (`light`): per stack, those that push
        it (none: no entry), and the stacks they pop (the pc stack for a Return)."""
        writers = {st: [b for b in ws if b in light] for st, ws in self.stack_writers.items()}
        popped = {st for b in light for st in self._footprint(b)[2]}
        if any(self._pc_use(b)[0] for b in light):
            popped.add(PC)
        return {st: ws for st, ws in writers.items() if ws}, sorted(popped)

    def block_cond(self, b: int, consts: dict[str, Any], inv: dict[str, Any], count: bool = False,
                   masked: bool = False):
        """`(run_it, state) -> state`: block b run in place, for the lanes
        waiting at it, where the scalar `run_it` is true (`masked`: every
        step, without a `lax.cond`; the lanes not at b keep their state). `count`: the lanes
        that run it count it in `depth` there (for a follow block: counted
        outside, the count would read the pc from before the conditional,
        and XLA would copy the pc in its untaken branch to keep it)."""
        run = self.block_fn(b, consts, inv)
        regs_in, regs_out, popped, pushed = self._footprint(b)
        stacks_in = sorted(set(popped) | set(pushed))
        pc_read, pc_write = self._pc_use(b)

        def true_fn(sub):
            stacks = dict(sub["stacks"])
            sps = {**self.layout.pointers(sub["sps"]), **({PC: sub["pc_sp"]} if pc_read else {})}
            if pc_read:
                stacks[PC] = sub["pc_stack"]
            tops = self._tops(stacks, sps, (*popped, *((PC,) if pc_read else ())))
            lane_state = {"pc": sub["pc"], "regs": sub["regs"], "sps": sub["sps"]}
            if "pc_sp" in sub:
                lane_state["pc_sp"] = sub["pc_sp"]
            lane_state, writes = run(lane_state, tops)
            out = {"pc": lane_state["pc"], "regs": {v: lane_state["regs"][v] for v in regs_out},
                   "sps": {s: lane_state["sps"][s] for s in sub["sps"]}, "stacks": {}}
            for s in pushed:
                out["stacks"][s] = self._write(sub["stacks"][s], *writes[s])
            if "pc_sp" in sub:
                out["pc_sp"] = lane_state["pc_sp"]
            if pc_write:
                out["pc_stack"] = self._write(sub["pc_stack"], *writes[PC])
            if count:
                out["depth"] = sub["depth"] + (sub["pc"] == b)
            return out

        def false_fn(sub):
            out = {"pc": sub["pc"], "regs": {v: sub["regs"][v] for v in regs_out}, "sps": sub["sps"],
                   "stacks": {s: sub["stacks"][s] for s in pushed}}
            for k in ("pc_sp", *(("pc_stack",) if pc_write else ()), "depth"):
                if k in sub:
                    out[k] = sub[k]
            return out

        def step(run_it: jax.Array, state: MachineState) -> MachineState:
            sub = {"pc": state.pc, "regs": {v: state.regs[v] for v in regs_in},
                   "sps": {p: state.sps[p] for p in sorted({self.layout.pointer_of[s] for s in stacks_in})},
                   "stacks": {s: state.stacks[s] for s in stacks_in}}
            if pc_read or pc_write:
                sub["pc_sp"] = state.pc_sp
                sub["pc_stack"] = state.pc_stack
            if count:
                sub["depth"] = state.depth
            out = true_fn(sub) if masked else lax.cond(run_it, true_fn, false_fn, sub)
            return state._replace(pc=out["pc"], regs={**state.regs, **out["regs"]}, sps={**state.sps, **out["sps"]},
                                  stacks={**state.stacks, **out["stacks"]},
                                  pc_sp=out.get("pc_sp", state.pc_sp), pc_stack=out.get("pc_stack", state.pc_stack),
                                  depth=out.get("depth", state.depth))

        return step

    # --- the loop --------------------------------------------------------

    def run(self, consts: dict[str, Any], inv: dict[str, Any], batched_inputs: dict[str, Any],
            workspace: dict[str, Any], active: jax.Array | None = None, recorder: Any = None) -> tuple[Any, ...]:
        """`(result, status, workspace)`, and the tape last when a `recorder`
        (gradients, `grad/recorder.py`) is given."""
        # Blocks run after the chosen one (`Scheduler.follow`); not while
        # recording, whose tape holds one block per step. A followed block is
        # compiled once, there: chosen, it runs in its place in the follow
        # order (its lanes wait for it; the blocks before it only add lanes),
        # so the chosen block's switch and conditionals leave it out (NUTS:
        # half the program, half the compile time).
        followed = tuple(getattr(self.scheduler, "follow", ())) if recorder is None else ()
        masked = self.tuning.follow_masked()
        follow = [(b, self.block_cond(b, consts, inv, count=True, masked=masked)) for b in followed]
        light = [b for b in range(self.prog.num_blocks) if b not in self.heavy and b not in followed]
        writers, popped = self._switch_stacks(light)
        carry = self.carry_stacks
        if carry:
            carried = sorted(set(writers) | set(popped))
            branches = [self._carried_branch(b, consts, inv) for b in light]
        else:
            branches = [self._light_branch(b, consts, inv, writers) for b in light]
        some_elsewhere = len(light) < self.prog.num_blocks
        if some_elsewhere:  # the switch's branch when another block was chosen: nothing
            branches.append((lambda ls, st: (ls, st)) if carry else self._noop_branch(writers))
            slot = jnp.asarray([light.index(b) if b in light else len(light)
                                for b in range(self.prog.num_blocks)] + [len(light)], index_dtype())
        in_place = [(b, self.block_cond(b, consts, inv)) for b in sorted(self.heavy) if b not in followed]
        halt, max_steps = self.halt, self.max_steps

        def cond(state: MachineState):
            running = jnp.any(state.pc < halt)
            return running if max_steps is None else running & (state.steps < max_steps)

        def step(state: MachineState, observe):
            before, depth = state.pc, state.depth  # the step changes state.pc; the block count reads this one
            pc = jnp.minimum(before, halt)  # every halted lane looks alike to schedulers
            counts = jnp.zeros((halt,), pc.dtype).at[before].add(1, **DROP)  # halted lanes dropped
            # Clamped after the reduction: no elementwise pass over the lanes first (a kernel per step).
            earliest = jnp.minimum(jnp.min(before), halt)
            block, sched = self.scheduler.choose(state.sched, Frontier(pc, counts, depth, earliest))
            block = block.astype(pc.dtype)  # schedulers may answer in int32
            # The lanes only a recorder reads (the step runs all of them, masked): XLA drops them otherwise.
            block = observe(state, block, self.lanes_at(state, block))
            if light and carry:
                state = self._carried_switch_step(slot[block] if some_elsewhere else block, branches, carried, state)
            elif light:
                state = self._switch_step(slot[block] if some_elsewhere else block, block, branches, writers,
                                          popped, state)
            for b, run_in_place in in_place:
                state = run_in_place(block == b, state)
            ran = before == block
            if followed:  # a followed block counts where it runs, below
                ran = ran & ~block_in(block, list(followed))
            state = state._replace(depth=depth + ran)
            for b, run_in_place in follow:
                state = run_in_place(jnp.any(state.pc == b), state)
            new = state._replace(sched=sched, steps=state.steps + 1)
            return new, {"block": block}

        final, tape = while_loop_recorded(cond, step, self.init(batched_inputs, workspace, active), recorder)
        result = final.regs[self.prog.result]
        pc = final.pc
        failed_at = self.codes.failed
        failed = where(pc >= failed_at, pc - failed_at + 1, 0).astype(index_dtype())
        status = Status(pc == self.overflowed, pc < self.halt, pc, final.steps, final.depth,
                        jnp.asarray(self.lanes, index_dtype()), failed)
        pc_stack = final.pc_stack if final.pc_stack is not None else workspace["pc_stack"]
        out = result, status, {"stacks": final.stacks, "pc_stack": pc_stack}
        return out if recorder is None else (*out, tape)

    def _carried_switch_step(self, index: jax.Array, branches: list, carried: list[str],
                             state: MachineState) -> MachineState:
        """The light blocks: one `lax.switch` whose operands include the stacks
        its blocks touch (`carried`, the pc stack as `PC`)."""
        stacks = {s: state.pc_stack if s == PC else state.stacks[s] for s in carried}
        return self._after_switch(state, *lax.switch(index, branches, self._lane_state(state), stacks))

    def _lane_state(self, state: MachineState) -> dict[str, Any]:
        """What the switch's branches read and return besides the stacks: pcs, small registers, pointers."""
        return {"pc": state.pc, "regs": {v: state.regs[v] for v in self.small},
                "sps": state.sps, **({"pc_sp": state.pc_sp} if state.pc_sp is not None else {})}

    def _after_switch(self, state: MachineState, lane_state: dict[str, Any], stacks: dict[str, Any]) -> MachineState:
        """`state` with the switch's `lane_state` and the `stacks` it updated (the pc stack as `PC`)."""
        stacks = dict(stacks)
        pc_stack = stacks.pop(PC, state.pc_stack)
        return state._replace(pc=lane_state["pc"], regs={**state.regs, **lane_state["regs"]}, sps=lane_state["sps"],
                              pc_sp=lane_state.get("pc_sp", state.pc_sp), pc_stack=pc_stack,
                              stacks={**state.stacks, **stacks})

    def _carried_branch(self, b: int, consts: dict[str, Any], inv: dict[str, Any]):
        """Block b as a branch of `_carried_switch_step`: it reads its tops and
        writes its pushes itself."""
        run = self.block_fn(b, consts, inv)
        _, _, popped, pushed = self._footprint(b)
        pc_read, pc_write = self._pc_use(b)

        def branch(lane_state, stacks):
            sps = {**self.layout.pointers(lane_state["sps"]), **({PC: lane_state["pc_sp"]} if pc_read else {})}
            lane_state, writes = run(lane_state, self._tops(stacks, sps, (*popped, *((PC,) if pc_read else ()))))
            stacks = dict(stacks)
            for s in (*pushed, *((PC,) if pc_write else ())):
                stacks[s] = self._write(stacks[s], *writes[s])
            return lane_state, stacks
        return branch

    def _switch_step(self, index: jax.Array, block: jax.Array, branches: list, writers: dict[str, list[int]],
                     popped: list[str], state: MachineState) -> MachineState:
        """The light blocks: one `lax.switch` (branch `index`) over the small state
        (`writers`, `popped`: `_switch_stacks` of its blocks)."""
        stacks = dict(state.stacks)
        if self.prog.has_calls:
            stacks[PC] = state.pc_stack
        lane_state = self._lane_state(state)
        # Only the tops go into the switch (with one lane XLA runs this form faster).
        sps = {**self.layout.pointers(lane_state["sps"]), **({PC: lane_state["pc_sp"]} if PC in stacks else {})}
        lane_state, writes = lax.switch(index, branches, lane_state, self._tops(stacks, sps, popped))
        for v, (row, value) in writes.items():
            # Under a cond on the blocks that push: XLA then updates in place
            # (unconditionally, it copies the stack every step).
            stacks[v] = lax.cond(block_in(block, writers[v]), self._write, lambda a, r, x: a, stacks[v], row, value)
        return self._after_switch(state, lane_state, stacks)

    def _light_branch(self, b: int, consts: dict[str, Any], inv: dict[str, Any], writers: dict[str, list[int]]):
        run = self.block_fn(b, consts, inv)

        def branch(lane_state, tops):
            lane_state, writes = run(lane_state, tops)
            return lane_state, {s: writes[s] for s in writers}
        return branch

    def _noop_branch(self, writers: dict[str, list[int]]):
        no_write = jnp.full((self.lanes,), self.depth, index_dtype())
        types = {**self.stacks, PC: jax.ShapeDtypeStruct((), index_dtype())}

        def branch(lane_state, tops):
            return lane_state, {s: (no_write, zeros_of(types[s], (self.lanes,))) for s in writers}
        return branch


