"""Reverse-mode gradients of an autobatched program: a recorded forward loop
and a backward loop that replays the recorded steps in reverse.

`lax.while_loop` has no reverse-mode rule, so `Autobatched` wraps the machine
in a `jax.custom_vjp` (`Differentiable`). Without differentiation the plain
machine runs (no tape, same cost as before). Differentiated, the forward rule
runs the same machine with a `Recorder` riding along its loop
(`machine.while_loop_recorded`) and the backward rule runs a second
`lax.while_loop` that walks the recorded steps from last to first.

The program's straight-line code is differentiated block by block: one block
on a batch of lanes is a pure function (`machine.block_dataflow`, which both
machines run) from what it reads -- registers not assigned earlier in the
block, the stack tops it pops or peeks, the children's return values a Join
gathers, per-example invariants, machine constants -- to what it writes --
float registers and the values it pushes. Control flow (branch conditions,
integers, program counters, stack pointers) gets no cotangent.

Forward (the tape; memory grows with the work executed)
-------------------------------------------------------
Only blocks that write a float value (a register, a push, a child's
parameter) are recorded; the rest cannot move a cotangent. Each recorded step
appends to two kinds of append-only arrays of static capacity:

* the step log: `(block, lanes it ran)`, one entry per step;
* the block's own tape: one row per lane the step ran (compacted: the lanes
  are gathered, nothing is stored for idle lanes), holding the lane, its
  example, the registers the block reads, the stack tops it pops or peeks,
  for a Join the children's lanes and return values, for a Fork the lanes it
  spawned. Stacks are overwritten later, so a popped value is taped at the
  step that reads it.

A pushed value's cotangent must reach the push from the pop that later reads
it. Instead of cotangent stacks mirroring the stacks (`max_stack_depth x
lanes` values each: a GiB for a Tree-LSTM lane pool) every push gets an event
id (its block's tape row) and the recorder keeps, per float stack, the id of
the event whose value each slot holds (`[depth, lanes]` integers); a pop tapes
that id. In the backward pass a pop adds its cotangent at the push's event
and the push reads it there: the stack cotangents are as large as the tape.

Backward (a second while loop, last step first)
-----------------------------------------------
State: a cotangent per float register and lane (`[lanes, ...]`), the event
accumulators of the float stacks, the sums for machine constants, and per
example for invariants. For step t, block b and its n taped rows:

1. Fork (the children were spawned after the block's code): a child's
   parameter cotangent adds into the parent's argument (register, invariant
   or constant); the child lane's cotangents are cleared (the lane held
   someone else's values before the spawn).
2. The cotangents of what b wrote: the registers it assigns (then cleared:
   the values they overwrote were not read afterwards) and its pushes' events.
3. `jax.vjp` of b's code on the n rows (re-run from the taped inputs: the
   block's internal values are not taped, so the tape holds inputs only),
   added into the registers and stack events it read, the children's return
   registers (Join), the invariants' example rows and the constants' sums.

Rows are processed in width buckets (like the lane pool's); padding rows copy
row 0's inputs and get zero cotangents, so junk data never reaches a VJP
(no NaN from `sqrt(0)` or `1/0` of an idle lane). Lowering hoists constants
and invariants out of their blocks into the prelude, which computes them for
every example; the prelude's VJP is masked per example by what the recorded
blocks read (`masked_prelude`), for the same reason.

Why the forward stays cheap: the recorder reads the pre-step state before
the step updates it in place (`while_loop_recorded` makes the step's block
index depend on what the recorder wrote; reading after would make XLA copy
the stacks and registers every step), and it writes only the step's width
bucket of rows.

The capacity (`tape_size` rows per block per example) is static. Each block
counts its rows even past the capacity, so an overflow is detected: outside
`jit` the forward is re-run once with a tape large enough (that size is kept
for the signature), or, when the user chose `tape_size`, it raises
`TapeOverflowError` naming the size needed; inside `jit` the gradients are NaN
and a checkify error names it. Examples that overflowed their stacks or ran
out of `max_steps` get NaN gradients (a shared parameter: if any did), never
garbage.

Only reverse mode goes through here: forward mode alone (`jax.jvp`,
`jax.jacfwd`) runs the plain machine, which JAX differentiates forwards like
any while loop; forward over reverse (`jax.hessian`) cannot differentiate this
custom_vjp and raises `pcbatch.ForwardModeError` (`pcbatch/api.py` decides).

>>> import jax, jax.numpy as jnp, pcbatch
>>> @pcbatch.autobatch
... def power(x, n):
...     if n == 0:
...         return 1.0
...     return x * power(x, n - 1)
>>> jax.grad(lambda x: power(x, jnp.array([3, 2])).sum())(jnp.array([2.0, 5.0]))
Array([12., 10.], dtype=float32)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from pcbatch.ir.core import CONSTANT, INVARIANT, Fork, Join, StackProgram, op_reads, op_writes
from pcbatch.runtime.dtypes import index_dtype
from pcbatch.runtime.block import block_dataflow, eval_prelude, run_prim, stack_offsets
from pcbatch.runtime.machine import Machine, MachineConfig
from pcbatch.runtime.lanes import cast_to, gather_rows
from pcbatch.runtime.pool import PoolMachine
from pcbatch.runtime.run import machine_for, run_machine

tree_util = jax.tree_util
tree_map = tree_util.tree_map

#: Default tape capacity: rows per block per example (see `autobatch(tape_size=)`).
DEFAULT_TAPE_SIZE = 256


# --- float leaves ------------------------------------------------------------


def _inexact(x: Any) -> bool:
    return jnp.issubdtype(x.dtype, jnp.inexact)


def is_float(t: Any) -> bool:
    """Whether a value (or type) has a float leaf: only those carry cotangents."""
    return any(_inexact(x) for x in tree_util.tree_leaves(t))


def floats(x: Any) -> list:
    """The float leaves of a pytree, in `tree_leaves` order."""
    return [a for a in tree_util.tree_leaves(x) if _inexact(a)]


def with_floats(x: Any, new: list) -> Any:
    """`x` with its float leaves replaced by `new` (the other leaves kept)."""
    leaves, treedef = tree_util.tree_flatten(x)
    it = iter(new)
    return treedef.unflatten([next(it) if _inexact(a) else a for a in leaves])


def zeros_of(t: Any, lead: tuple[int, ...]) -> list:
    """Zero cotangents (float leaves only) of type `t`, with leading axes."""
    return [jnp.zeros(lead + s.shape, s.dtype) for s in floats(t)]


def _convert(ct: list, src: Any, dst: Any) -> list:
    """A cotangent of a value of type `src` as one of type `dst` (a cast of
    the same tree: float leaves change dtype, none flows to integer leaves)."""
    it = iter(ct)
    full = [next(it) if _inexact(s) else None for s in tree_util.tree_leaves(src)]
    return [c.astype(d.dtype) if c is not None else None
            for c, d in zip(full, tree_util.tree_leaves(dst)) if _inexact(d)]


def _add(a: list, b: list) -> list:
    return [x + y.astype(x.dtype) if y is not None else x for x, y in zip(a, b)]


def _rows(mask: jax.Array, x: jax.Array) -> jax.Array:
    return mask.reshape(mask.shape + (1,) * (x.ndim - 1))


# --- what each block reads and writes -----------------------------------------


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
        self.lanes_at = machine.lanes_at
        if self.pool:
            self.widths = list(machine.widths)
            self.fan, self.col, self.kids = machine.fan, machine.col, machine.kids
        else:  # buckets halving from all lanes, as the lane pool's
            self.widths = [machine.lanes]
            while self.widths[0] // 2 >= 16 and len(self.widths) < 4:
                self.widths.insert(0, self.widths[0] // 2)
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

    def empty_tape(self) -> dict[str, Any]:
        rows, idx = self.capacity + self.rec_width, index_dtype()
        return {
            "t": jnp.zeros((), idx),
            # Never read before written (padding rows are replaced): uninitialized where the backend allows.
            "log_block": lax.empty((self.log_size,), idx),
            "log_count": lax.empty((self.log_size,), idx),
            "cursor": jnp.zeros((self.prog.num_blocks,), idx),
            "rows": {g.index: tree_map(lambda s: lax.empty((rows,) + s.shape, s.dtype), self.row_types(g))
                     for g in self.blocks},
            # the event whose value each slot of each float stack holds (none: out of range)
            "writer": {s: jnp.full((self.depth, self.lanes), self.events[s], idx) for s in self.float_stacks},
        }

    @staticmethod
    def overflowed(tape: dict[str, Any], capacity: int, log_size: int) -> jax.Array:
        return (tape["t"] > log_size) | jnp.any(tape["cursor"] > capacity)

    def needed(self, tape: dict[str, Any]) -> int:
        """The smallest `tape_size` (rows per block per example) that holds this run."""
        rows = int(np.max(np.asarray(tape["cursor"])[[g.index for g in self.blocks]], initial=0))
        steps = int(tape["t"])
        per_block = max(rows, -(-steps // max(1, len(self.blocks))))
        return max(1, -(-per_block // self.examples))


# --- the forward pass: recording ------------------------------------------------


class Recorder:
    """Appends each recorded step to the tape (`machine.while_loop_recorded`):
    `before` the step updates anything, what its block reads; `after`, the
    lanes a Fork spawned."""

    def __init__(self, plan: Plan):
        self.plan = plan

    def init(self, state: dict[str, Any]) -> dict[str, Any]:
        return self.plan.empty_tape()

    def before(self, tape: dict[str, Any], pre: dict[str, Any], block: jax.Array) -> tuple[dict, dict]:
        p = self.plan
        ids = p.lanes_at(pre, block)  # the lanes the step runs, as the machine picks them
        n = jnp.sum(ids < p.lanes, dtype=ids.dtype)
        recorded = (jnp.asarray(p.dense)[block] >= 0) & (n > 0)  # the backward pads with row 0: a real one
        tape = dict(tape)
        t = tape["t"]
        at = jnp.where(recorded, t, p.log_size)  # inert blocks, and past the log's end: dropped
        tape["log_block"] = tape["log_block"].at[at].set(block, mode="drop")
        tape["log_count"] = tape["log_count"].at[at].set(n, mode="drop")
        tape["t"] = t + recorded
        start = jnp.minimum(tape["cursor"][block], p.capacity)  # past capacity: overflowed, rows are junk
        tape["cursor"] = tape["cursor"].at[block].add(jnp.where(recorded, n, 0))
        if p.pool:
            own = pre["lane"].at[ids].get(mode="fill", fill_value=0)
            example = own[:, p.col["example"]]
            sp = {s: own[:, p.col[f"sp:{s}"]] for s in p.layout.stacks}
        else:
            own, example = None, ids
            sp = {s: pre["sps"][s].at[ids].get(mode="fill", fill_value=0) for s in p.layout.stacks}

        def write(g: BlockGrad, w: int):
            """Block g's rows for the first `w` lanes (a width bucket >= n)."""
            def go(rows, writer):
                lanes, ex = ids[:w], example[:w]
                row: dict[str, Any] = {"lane": lanes, "example": ex,
                                       "reg": {v: gather_rows(pre["regs"][v], lanes) for v in g.reg_in}}
                slot = {s: jnp.maximum(sp[s][:w] - 1, 0) for s in g.reads}
                row["top"] = {s: tree_map(lambda a: a.at[slot[s], lanes].get(mode="fill", fill_value=0),
                                          pre["stacks"][s]) for s in g.reads}
                row["wid"] = {s: writer[s].at[slot[s], lanes].get(mode="fill", fill_value=p.events[s])
                              for s in g.reads if s in p.float_stacks}
                if g.join is not None:
                    kids = own[:w, p.kids]
                    row["kids"] = kids
                    row["joined"] = tuple(gather_rows(pre["regs"][r], kids[:, k]) for k, r in enumerate(g.join.rets))
                rows = dict(rows)
                for k, x in row.items():
                    rows[k] = tree_map(lambda a, x: lax.dynamic_update_slice_in_dim(a, x.astype(a.dtype), start, 0),
                                       rows[k], x)
                writer = dict(writer)
                for s in g.writes:
                    if s in p.float_stacks:
                        event = p.event_base[s, g.index] + start + jnp.arange(w, dtype=ids.dtype)
                        writer[s] = writer[s].at[sp[s][:w] + g.offsets[s][1], lanes].set(event, mode="drop")
                return rows, writer
            return go

        widths = jnp.asarray(p.widths)
        which = jnp.minimum(jnp.searchsorted(widths, n), len(p.widths) - 1)

        def bucketed(g: BlockGrad):
            writes = [write(g, w) for w in p.widths]
            return lambda r, wr: lax.switch(which, writes, r, wr) if len(writes) > 1 else writes[0](r, wr)

        rows, writer = dict(tape["rows"]), tape["writer"]
        dep = jnp.zeros((), ids.dtype)  # depends on every read below (see `while_loop_recorded`)
        for g in p.blocks:
            rows[g.index], writer = lax.cond(block == g.index, bucketed(g), lambda r, w: (r, w), rows[g.index], writer)
            dep = dep | (rows[g.index]["lane"][0] & 0x40000000) | (ids[0] & 0x40000000)
        for w in writer.values():
            dep = dep | (w[0, 0] & 0x40000000)
        tape["rows"], tape["writer"] = rows, writer
        return tape, {"ids": ids, "start": start}, dep

    def after(self, tape: dict[str, Any], taken: dict[str, Any], new: dict[str, Any], info: dict[str, Any]):
        p, block = self.plan, info["block"]
        forks = [g for g in p.blocks if g.spawn]
        if not forks:
            return tape
        # A Fork's children: its rows of the lane table, after the step.
        spawned = new["lane"].at[taken["ids"]].get(mode="fill", fill_value=p.lanes)[:, p.kids]
        rows = dict(tape["rows"])
        for g in forks:
            rows[g.index] = lax.cond(
                block == g.index,
                lambda r: {**r, "spawned": lax.dynamic_update_slice_in_dim(r["spawned"], spawned, taken["start"], 0)},
                lambda r: r, rows[g.index])
        return {**tape, "rows": rows}


# --- the backward pass ----------------------------------------------------------


class Backward:
    """The reverse loop over a tape (see the module docstring)."""

    def __init__(self, plan: Plan):
        self.plan = plan

    def block_vjp(self, g: BlockGrad, consts: dict[str, Any], inv: dict[str, Any], w: int):
        """Block `g` on `w` taped rows: cotangents in, cotangents out (padded
        to the widest bucket; out-of-range ids mark padding)."""
        p, prog = self.plan, self.plan.prog
        types, block = prog.var_types, prog.blocks[g.index]
        M, B, N = p.lanes, p.examples, p.widths[-1]
        float_writes = [s for s in g.writes if s in p.float_stacks]

        def code(regs_in, tops, joined, inv_rows, cs):
            def load(v: str) -> tuple[Any, bool]:
                if v in cs:
                    return cs[v], False
                if v in inv_rows:
                    return inv_rows[v], True
                return regs_in[v], True

            def join(op: Join) -> dict[str, Any]:
                return {v: cast_to(joined[k], types[v], None) for k, v in enumerate(op.outs)}

            env, pushed = block_dataflow(block, p.layout.stack_of, load, tops.__getitem__, join, types, w)
            return [x for v in g.reg_out for x in floats(env[v])] + [x for s in float_writes for x in floats(pushed[s])]

        def pad(x: jax.Array, fill: Any = 0) -> jax.Array:
            n = N * x.shape[0] // w
            if x.shape[0] == n:
                return x
            return jnp.concatenate([x, jnp.full((n - x.shape[0],) + x.shape[1:], fill, x.dtype)])

        def run(rows_all: dict[str, Any], cot: dict[str, Any], acc: dict[str, Any], start: jax.Array, n: jax.Array):
            rows = tree_map(lambda a: lax.dynamic_slice_in_dim(a, start, w), rows_all)
            valid = jnp.arange(w) < n
            # Padding rows repeat row 0 (a real one): no junk reaches the VJP.
            rows = tree_map(lambda a: jnp.where(_rows(valid, a), a, a[:1]), rows)
            lane = jnp.where(valid, rows["lane"], M)
            example = rows["example"]
            cts = {v: [c.at[lane].get(mode="fill", fill_value=0) for c in cot[v]]
                   for v in set(g.reg_in) | set(g.reg_out) | {a for _, _, a in g.spawn} if v in cot}
            extra_inv: dict[str, list] = {}
            extra_const: dict[str, list] = {}
            kids = jnp.where(valid[:, None], rows["kids"], M) if "kids" in rows else None
            spawned = jnp.where(valid[:, None], rows["spawned"], M) if "spawned" in rows else None
            for k, prm, a in g.spawn:  # 1. children's parameters -> the parent's arguments
                c = _convert([x.at[spawned[:, k]].get(mode="fill", fill_value=0) for x in cot[prm]], types[prm], types[a])
                if a in cot:
                    cts[a] = _add(cts[a], c)
                elif prog.var_class[a] == INVARIANT:
                    extra_inv[a] = _add(extra_inv.get(a) or zeros_of(types[a], (w,)), c)
                else:
                    extra_const[a] = _add(extra_const.get(a) or zeros_of(types[a], ()),
                                          [None if x is None else jnp.sum(x, axis=0) for x in c])
            # 2. what the block wrote
            own = {s: jnp.where(valid, p.event_base[s, g.index] + start + jnp.arange(w, dtype=index_dtype()),
                                p.events[s]) for s in float_writes}
            ct_out = [x for v in g.reg_out for x in cts[v]] + [
                x.at[own[s]].get(mode="fill", fill_value=0) for s in float_writes for x in acc[s]]
            # 3. its VJP on the rows
            inv_rows = {v: gather_rows(inv[v], example) for v in g.inv_in}
            cs = {v: consts[v] for v in g.const_in}
            primal = {"reg": rows["reg"], "top": rows["top"], "joined": rows.get("joined", ()),
                      "inv": inv_rows, "const": cs}
            diff = {k: {v: floats(x) for v, x in d.items()} if isinstance(d, dict) else [floats(x) for x in d]
                    for k, d in primal.items()}

            def f(dd):
                full = {k: {v: with_floats(primal[k][v], dd[k][v]) for v in primal[k]}
                        if isinstance(primal[k], dict) else tuple(with_floats(x, y) for x, y in zip(primal[k], dd[k]))
                        for k in primal}
                return code(full["reg"], full["top"], full["joined"], full["inv"], full["const"])

            outs, pull = jax.vjp(f, diff)
            (ct_in,) = pull([c.astype(o.dtype) for c, o in zip(ct_out, outs)])
            out: dict[str, Any] = {"lane": pad(lane, M)}
            regs = {}
            for v, c in cts.items():
                # An assigned register's old value was not read afterwards: its cotangent restarts at 0.
                new = [jnp.zeros_like(x) for x in c] if v in g.reg_out else c
                if v in ct_in["reg"]:
                    new = _add(new, ct_in["reg"][v])
                regs[v] = [pad(x) for x in new]
            out["regs"] = regs
            out["acc"] = {s: (pad(jnp.where(valid, rows["wid"][s], p.events[s]), p.events[s]),
                              [pad(x) for x in ct_in["top"][s]]) for s in g.reads if s in p.float_stacks}
            if g.join is not None:
                out["join"] = [(pad(kids[:, k], M), [pad(x) for x in ct_in["joined"][k]])
                               for k in range(len(g.join.rets))]
            if g.spawn:
                out["spawned"] = pad(spawned.reshape(-1), M)
            ex = jnp.where(valid, example, B)
            out["ex"] = pad(ex, B)
            out["inv"] = {v: (pad(ex, B), [pad(x) for x in _add(ct_in["inv"].get(v) or zeros_of(types[v], (w,)),
                                                                  extra_inv.get(v) or [None] * len(floats(types[v])))])
                          for v in g.inv_in if is_float(types[v])}
            out["const"] = {v: _add(ct_in["const"].get(v) or zeros_of(types[v], ()),
                                    extra_const.get(v) or [None] * len(floats(types[v])))
                            for v in g.const_in if is_float(types[v])}
            return out

        return run

    def block_step(self, g: BlockGrad, consts: dict[str, Any], inv: dict[str, Any]):
        """Applies block `g`'s VJP on its rows to the cotangent state."""
        p = self.plan
        runs = [self.block_vjp(g, consts, inv, w) for w in p.widths]
        widths = jnp.asarray(p.widths)

        def go(state: dict[str, Any], rows_all: dict[str, Any], start: jax.Array, n: jax.Array) -> dict[str, Any]:
            which = jnp.minimum(jnp.searchsorted(widths, n), len(runs) - 1)
            out = lax.switch(which, runs, rows_all, state["cot"], state["acc"], start, n)
            cot, acc = dict(state["cot"]), dict(state["acc"])
            lane = out["lane"]
            for v, rows in out["regs"].items():
                cot[v] = [c.at[lane].set(r, mode="drop") for c, r in zip(cot[v], rows)]
            if "spawned" in out:  # the spawned lanes held someone else's values before
                cot = {v: [c.at[out["spawned"]].set(0, mode="drop") for c in cs] for v, cs in cot.items()}
            for (kid, vals), r in zip(out.get("join", []), g.join.rets if g.join is not None else ()):
                if r in cot:
                    cot[r] = [c.at[kid].add(x.astype(c.dtype), mode="drop") for c, x in zip(cot[r], vals)]
            for s, (ids, vals) in out["acc"].items():
                acc[s] = [a.at[ids].add(x.astype(a.dtype), mode="drop") for a, x in zip(acc[s], vals)]
            ct_inv, ct_const = dict(state["inv"]), dict(state["const"])
            for v, (ex, vals) in out["inv"].items():
                ct_inv[v] = [a.at[ex].add(x.astype(a.dtype), mode="drop") for a, x in zip(ct_inv[v], vals)]
            for v, vals in out["const"].items():
                ct_const[v] = [a + x.astype(a.dtype) for a, x in zip(ct_const[v], vals)]
            used_inv = {**state["used_inv"], **{v: state["used_inv"][v].at[out["ex"]].set(True, mode="drop")
                                                 for v in g.inv_in}}
            used_const = {**state["used_const"], **{v: jnp.ones((), bool) for v in g.const_in}}
            return {**state, "cot": cot, "acc": acc, "inv": ct_inv, "const": ct_const, "used_inv": used_inv,
                    "used_const": used_const}

        return go

    def run(self, consts: dict[str, Any], inv: dict[str, Any], tape: dict[str, Any], ct_result: list):
        """Cotangents `(constants, invariants [examples], entry registers
        [examples])` from the result's (float leaves, `[examples, ...]`), and
        which invariants per example / constants the recorded blocks read."""
        p, prog = self.plan, self.plan.prog
        types, M, B = prog.var_types, p.lanes, p.examples
        cot = {v: zeros_of(types[v], (M,)) for v in p.float_regs}
        cot[prog.result] = [c.at[:B].set(x.astype(c.dtype)) for c, x in zip(cot[prog.result], ct_result)]
        state = {
            "t": jnp.minimum(tape["t"], p.log_size),
            "cursor": tape["cursor"],
            "cot": cot,
            "acc": {s: zeros_of(p.layout.stacks[s], (p.events[s],)) for s in p.float_stacks},
            "inv": {v: zeros_of(types[v], (B,)) for v in inv if is_float(types[v])},
            "const": {v: zeros_of(types[v], ()) for v in consts if is_float(types[v])},
            # which examples' invariants (and which constants) a recorded block read: see `masked_prelude`
            "used_inv": {v: jnp.zeros((B,), bool) for v in inv},
            "used_const": {v: jnp.zeros((), bool) for v in consts},
        }
        steps = [self.block_step(g, consts, inv) for g in p.blocks]
        rows_all = tape["rows"]

        def body(state):
            t = state["t"] - 1
            block, n = tape["log_block"][t], tape["log_count"][t]
            start = state["cursor"][block] - n
            state = {**state, "t": t, "cursor": state["cursor"].at[block].set(start)}
            for g, go in zip(p.blocks, steps):
                state = lax.cond(block == g.index, lambda s, r, a, m, go=go: go(s, r, a, m),
                                 lambda s, r, a, m: s, state, rows_all[g.index], start, n)
            return state

        final = lax.while_loop(lambda s: s["t"] > 0, body, state)
        regs = {v: [c[:B] for c in final["cot"][v]] for v in final["cot"]}
        return final["const"], final["inv"], regs, (final["used_inv"], final["used_const"])


def masked_prelude(prog: StackProgram, inputs: dict[str, Any], used_inv: dict[str, jax.Array],
                   used_const: dict[str, jax.Array]) -> tuple[dict[str, Any], dict[str, Any]]:
    """`eval_prelude`, for its VJP: lowering hoists constants and invariants
    out of the blocks that use them, so the prelude computes them for every
    example, also where the example's path never reads them (`sqrt(x)` of an
    `if x > 0` branch, for x = 0). Where an op's results are not read (per
    example for invariants, from `used_*`, propagated through the prelude),
    its inputs enter as `where(used, x, stop_gradient(x))`: no cotangent
    reaches them, not even the NaN of 0 x inf."""
    cls, types = prog.var_class, prog.var_types
    need: dict[str, jax.Array] = {**used_inv, **used_const}
    op_need: dict[int, jax.Array] = {}
    for k in reversed(range(len(prog.prelude))):
        op = prog.prelude[k]
        outs = [need[o] for o in op.outs if o in need]
        if not outs:
            continue
        per_example = any(cls.get(o) == INVARIANT for o in op.outs)
        m = outs[0]
        for o in outs[1:]:
            m = m | o
        if not per_example:
            m = jnp.any(m)
        op_need[k] = m
        for i in op.ins:
            mi = m if cls.get(i) == INVARIANT else jnp.any(m)
            need[i] = need[i] | mi if i in need else mi
    consts = {v: x for v, x in inputs.items() if cls.get(v) == CONSTANT}
    inv = {v: x for v, x in inputs.items() if cls.get(v) == INVARIANT}
    for k, op in enumerate(prog.prelude):
        m = op_need.get(k, jnp.zeros((), bool))
        examples = next((inv[i] for i in op.ins if i in inv), None)

        def read(v: str, m=m, examples=examples) -> tuple[Any, bool]:
            x, batched = (inv[v], True) if v in inv else (consts[v], False)
            if m.ndim == 1 and not batched:  # a constant in a per-example op: masked per example too
                b = tree_util.tree_leaves(examples)[0].shape[0]
                x, batched = tree_map(lambda a: jnp.broadcast_to(a, (b,) + a.shape), x), True
            keep = lambda a: jnp.where(m.reshape(m.shape + (1,) * (a.ndim - m.ndim)), a,  # noqa: E731
                                       lax.stop_gradient(a))
            return tree_map(keep, x), batched

        for v, x in run_prim(op, read, types, None).items():
            (inv if cls.get(v) == INVARIANT else consts)[v] = x
    return consts, inv


# --- the custom_vjp -------------------------------------------------------------


class TapeInfo(NamedTuple):
    """What a differentiated call records (`Autobatched.tape_info`).

    `tape_size`: rows per block per example the tape holds; `needed`: the
    smallest `tape_size` that holds this call; `rows`: rows used per recorded
    block (one per lane a step ran there); `steps`: recorded steps (of
    `total_steps` machine steps); `bytes_used` / `bytes_allocated`: the
    tape (rows, step log and the stacks' event ids) in use / allocated."""

    tape_size: int
    needed: int
    rows: dict[int, int]
    steps: int
    total_steps: int
    bytes_used: int
    bytes_allocated: int


def _nbytes(t: Any) -> int:
    return sum(int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize for s in tree_util.tree_leaves(t))


class Differentiable:
    """A compiled program's differentiable call: `(result, status)` of the
    entry inputs, with a `jax.custom_vjp` that records a tape and replays it.

    `primal(inputs)` runs the plain machine (used when nothing is
    differentiated); `check(status, inputs)` runs on concrete forward results
    (eager differentiation) and may raise; `tape_size` is rows per block per example.
    """

    def __init__(self, prog: StackProgram, num_lanes: int, config: MachineConfig, batched: frozenset[str],
                 tape_size: int | None):
        self.prog, self.num_lanes, self.config, self.batched = prog, num_lanes, config, batched
        self.tape_size = tape_size or DEFAULT_TAPE_SIZE
        self.fixed = tape_size is not None  # a size the user chose does not grow
        self._compiled: dict[int, tuple[Plan, Callable, Callable]] = {}

    def compiled(self, tape_size: int) -> tuple[Plan, Callable, Callable]:
        if tape_size not in self._compiled:
            prog, lanes, config = self.prog, self.num_lanes, self.config
            plan = Plan(prog, machine_for(prog, lanes, config), tape_size)

            def forward(inputs):
                result, status, _, tape = run_machine(prog, inputs, lanes, config, recorder=Recorder(plan))
                del tape["writer"]  # only the forward needs it
                return result, status, tape

            self._compiled[tape_size] = (plan, jax.jit(forward), jax.jit(lambda i, t, c: self._backward(plan, i, t, c)))
        return self._compiled[tape_size]

    def info(self, inputs: dict[str, Any]) -> TapeInfo:
        plan, forward, _ = self.compiled(self.tape_size)
        _, status, tape = forward(inputs)
        cursor = np.asarray(tape["cursor"])
        rows = {g.index: int(cursor[g.index]) for g in plan.blocks}
        row_bytes = {g.index: _nbytes(plan.row_types(g)) for g in plan.blocks}
        word = index_dtype().itemsize
        fixed = plan.depth * plan.lanes * word * len(plan.float_stacks)  # the event ids of the stacks' slots
        steps = int(tape["t"])
        used = sum(rows[b] * row_bytes[b] for b in rows) + 2 * word * steps + fixed
        allocated = (sum((plan.capacity + plan.rec_width) * row_bytes[b] for b in rows) + 2 * word * plan.log_size
                     + fixed)
        return TapeInfo(self.tape_size, plan.needed(tape), rows, steps, int(status.steps), used, allocated)

    def _backward(self, plan: Plan, inputs: dict[str, Any], tape: dict[str, Any], ct_result: list) -> dict[str, Any]:
        prog = self.prog
        types, B = prog.var_types, plan.examples
        entry = [p for p in prog.entry_params if p in self.batched and p in plan.float_regs]
        consts, inv = eval_prelude(prog, inputs)
        ct_const, ct_inv, ct_regs, used = Backward(plan).run(consts, inv, tape, ct_result)

        def start(diff):
            full = {p: with_floats(inputs[p], diff[p]) for p in inputs}
            consts, inv = masked_prelude(prog, full, *used)
            regs = {p: floats(cast_to(full[p], types[p], B)) for p in entry}
            return ({v: floats(x) for v, x in consts.items() if is_float(types[v])},
                    {v: floats(x) for v, x in inv.items() if is_float(types[v])}, regs)

        _, pull = jax.vjp(start, {p: floats(x) for p, x in inputs.items()})
        (ct,) = pull((ct_const, ct_inv, {p: ct_regs[p] for p in entry}))
        return ct

    def __call__(self, inputs: dict[str, Any], primal: Callable, check: Callable) -> tuple[Any, Any, jax.Array]:
        """`(result, status, need)`: `need` is 0, or (differentiated, the tape
        overflowed inside jit) the `tape_size` this call needs; the caller
        reports it (checkify), the gradients are NaN."""
        prog, batched = self.prog, self.batched
        diff_keys = {p for p in prog.entry_params if is_float(inputs[p])}
        used: list[int] = []  # the tape size the forward rule chose, for the backward rule

        @jax.custom_vjp
        def call(inputs):
            return (*primal(inputs), jnp.zeros((), index_dtype()))  # like `need` below

        def fwd(inputs):
            plan, forward, _ = self.compiled(self.tape_size)
            result, status, tape = forward(inputs)
            # Eager differentiation sees concrete values (under vmap, e.g. jax.jacfwd, the outputs are traced).
            concrete = not any(isinstance(x, jax.core.Tracer) for x in tree_util.tree_leaves((inputs, status, tape)))
            if concrete and bool(Plan.overflowed(tape, plan.capacity, plan.log_size)):
                need = plan.needed(tape)
                if self.fixed:
                    from pcbatch.errors import TapeOverflowError

                    raise TapeOverflowError(self.tape_size, need)
                self.tape_size = max(need, 2 * self.tape_size)  # kept for later calls
                plan, forward, _ = self.compiled(self.tape_size)
                result, status, tape = forward(inputs)
            used.append(plan.capacity // plan.examples)
            if concrete:
                check(status, inputs)
            need = jnp.where(Plan.overflowed(tape, plan.capacity, plan.log_size), _needed_traced(plan, tape), 0)
            return (result, status, need), (inputs, tape, status)

        def bwd(res, cts):
            inputs, tape, status = res
            plan, _, backward = self.compiled(used[-1])
            ct = backward(inputs, tape, floats(cts[0]))
            failed = status.overflow | status.unfinished
            overflow = Plan.overflowed(tape, plan.capacity, plan.log_size)
            out = {}
            for p, x in inputs.items():
                if p not in diff_keys:
                    out[p] = None
                    continue
                vals = []
                for c in ct[p]:
                    # Failed examples, and a shared input if any failed or the tape overflowed: NaN, never garbage.
                    bad = (failed.reshape((-1,) + (1,) * (c.ndim - 1)) if p in batched else jnp.any(failed)) | overflow
                    vals.append(jnp.where(bad, jnp.nan, c))
                out[p] = _merge_ct(x, vals)
            return (out,)

        call.defvjp(fwd, bwd)
        return call(inputs)


def _needed_traced(plan: Plan, tape: dict[str, Any]) -> jax.Array:
    """`Plan.needed` on a traced tape."""
    rows = jnp.max(tape["cursor"][jnp.asarray([g.index for g in plan.blocks] or [0])])
    per_block = jnp.maximum(rows, -(-tape["t"] // max(1, len(plan.blocks))))
    return jnp.maximum(1, -(-per_block // plan.examples))


def _merge_ct(x: Any, vals: list) -> Any:
    """Cotangent tree for input `x`: its float leaves' values, None elsewhere."""
    leaves, treedef = tree_util.tree_flatten(x)
    it = iter(vals)
    return treedef.unflatten([next(it) if _inexact(a) else None for a in leaves])
