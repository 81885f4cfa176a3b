"""One block on a dense batch of lanes: the executor every machine shares.

`execute` runs a block's ops (`block_dataflow`), turns its Push/Update/Pop
ops into stack-pointer moves and `(row, value)` stack writes, and its
terminator into each lane's next pc, pc-stack write and pc-stack pointer. It
never sees how the lanes were chosen or where their state lives: the caller
hands it a `Rows` (the lanes' pointers, gathered or whole) and reads, and
scatters what comes back. The plain machine (`machine.py`) runs it on all
lanes with `valid` the lanes at the block; the fork-join pool (`pool.py`) on
the lanes it took off the block's queue; the gradient pass (`grad/`)
differentiates `block_dataflow` on taped rows.
"""
from __future__ import annotations

import contextlib

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pcbatch.errors import DtypeOverflowError, PcbatchError, UnsupportedSyntaxError
from pcbatch.ir.core import (
    CONSTANT,
    INVARIANT,
    Await,
    Block,
    Branch,
    Collect,
    Fail,
    Fork,
    Join,
    Jump,
    Launch,
    Peek,
    Pop,
    Prim,
    Push,
    PushJump,
    Return,
    StackProgram,
    Update,
    op_reads,
    op_writes,
)
from pcbatch.ir.jaxtypes import has_loop
from pcbatch.ir.printer import format_type
from pcbatch.runtime.dtypes import index_dtype
from pcbatch.ir.weak import as_typed, is_weak
from pcbatch.runtime.lanes import cast_to, where, zeros_of
from pcbatch.runtime.stacks import StackLayout

tree_map = jax.tree_util.tree_map


class Codes(NamedTuple):
    """The pcs a lane can hold besides blocks: halted (its example's result
    is ready), overflowed (halted: recursion deeper than the stacks), done
    (a fork-join child whose bottom frame returned) and failed (halted where
    Python raises: `failed + b` after the `Fail` ending block b)."""

    halt: int
    overflowed: int
    done: int
    failed: int


class Rows(NamedTuple):
    """The lanes a block runs on, as `W` rows. `valid`: the rows that run it
    (the others compute junk that the caller drops); `sps`: each stack's
    pointer; `pc_sp`: the pc stack's pointer (None without calls); `pc_top`:
    the pc stack's top (read by a Return); `child`: rows that are fork-join
    children (their bottom frame's Return or overflow makes them done)."""

    valid: jax.Array
    sps: dict[str, jax.Array]
    pc_sp: jax.Array | None
    pc_top: jax.Array | None
    child: jax.Array | bool


class Ran(NamedTuple):
    """What a block did to its rows. `env`: every variable it assigned;
    `pc`: next pc per row (None for a Fork: the pool decides); `sps`,
    `pc_sp`: the pointers after it; `stack_writes[s] = (row, value)` (row
    `depth`: no write); `pc_write`: the same for the pc stack (None when the
    block does not call); `overflow`: rows whose call overflowed the pc
    stack; `finished`: child rows that are done."""

    env: dict[str, Any]
    pc: jax.Array | None
    sps: dict[str, jax.Array]
    pc_sp: jax.Array | None
    stack_writes: dict[str, tuple[jax.Array, Any]]
    pc_write: tuple[jax.Array, jax.Array] | None
    overflow: jax.Array
    finished: jax.Array


def loop_safe_inputs(op: Prim, vals: tuple, batched: tuple, valid: jax.Array | None) -> tuple:
    """`op`'s inputs; where its JAX code holds a `while` loop, the batched ones with every
    row that does not run the block (`valid` False) replaced by one that does: the loop runs
    until every row's ends, and a row not at the block holds values its example never brings
    there (`v = 0` on the path that skips the loop): a loop that Python never runs might not end."""
    if not any(batched) or valid is None or not has_loop(op.fn):
        return vals
    first = jnp.argmax(valid)
    keep = lambda a: jnp.where(valid.reshape(valid.shape + (1,) * (a.ndim - 1)), a, a[first])  # noqa: E731
    return tuple(jax.tree_util.tree_map(keep, x) if b else x for x, b in zip(vals, batched))


def run_prim(op: Prim, read, types: Any, lanes: int | None, valid: jax.Array | None = None) -> dict[str, Any]:
    """`op` on a batch: vmapped over the lanes if any input is batched
    (`read(v)` gives `(value, batched)`), each output cast to its type.
    `valid`: the rows that run the block (the others' results are dropped)."""
    vals, batched = zip(*(read(v) for v in op.ins)) if op.ins else ((), ())
    vals = tuple(as_typed(x, types[v]) if is_weak(types[v]) else x for v, x in zip(op.ins, vals))
    # A value with no leaves (None: what a function that returns nothing returns) has no
    # batch axis to map over: jax.vmap refuses it as the only batched input.
    batched = tuple(b and bool(jax.tree_util.tree_leaves(x)) for x, b in zip(vals, batched))
    vals = loop_safe_inputs(op, vals, batched, valid)
    if any(batched):
        try:
            outs = jax.vmap(op.fn, in_axes=tuple(0 if x else None for x in batched))(*vals)
        except (ValueError, NotImplementedError) as e:
            if op.loc is None or isinstance(e, PcbatchError):
                raise
            # It traced one example at a time (type inference): only batching fails, e.g.
            # an ordered io_callback or a primitive with no batching rule.
            raise UnsupportedSyntaxError(
                f"`{op.text}` cannot be batched: jax.vmap of it fails ({type(e).__name__}: {e})", op.loc,
                "pcbatch runs each line for a batch of examples, as jax.vmap does: write it with "
                "operations JAX can batch (an unordered callback, jax.pure_callback with vmap_method).") from e
    else:
        outs = op.fn(*vals)
    cast = {}
    for v, x in zip(op.outs, outs):
        try:  # a Python int beyond the joined dtype: JAX refuses it; a Python float: JAX makes it inf
            if _overflows(x, types[v]):
                raise OverflowError(f"{x!r} does not fit {format_type(types[v])}")
            cast[v] = cast_to(x, types[v], None if any(batched) else lanes)
        except OverflowError as e:
            shown = x.item() if isinstance(x, jax.Array) and x.size == 1 else x  # a literal, as written
            raise DtypeOverflowError(v, f"{shown!r}", format_type(types[v]), op.loc) from e
    return cast


def _overflows(value: Any, t: Any) -> bool:
    """Whether a Python number in `value` does not fit its leaf's dtype: a
    finite float that becomes inf there, or (known when the program is
    traced) a weakly typed constant an assignment narrows, such as the `300`
    of `return 300` beside an int8 return, which would wrap."""
    def leaf(x: Any, s: Any) -> bool:
        if isinstance(x, float):
            return np.isfinite(x) and not np.all(np.isfinite(np.asarray(x, s.dtype)))
        if not (getattr(x, "weak_type", False) and isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)
                and x.dtype != s.dtype):
            return False
        got = np.asarray(x)
        if np.issubdtype(s.dtype, np.integer) and np.issubdtype(got.dtype, np.integer):
            info = np.iinfo(s.dtype)
            return bool(np.any((got < info.min) | (got > info.max)))
        if np.issubdtype(s.dtype, np.floating):
            return bool(np.any(np.isfinite(got) & ~np.isfinite(got.astype(s.dtype))))
        return False
    with np.errstate(over="ignore"):
        return any(leaf(x, s) for x, s in zip(jax.tree_util.tree_leaves(value), jax.tree_util.tree_leaves(t)))


def block_dataflow(block: Block, stack_of: dict[str, str], read, top, join, types: Any,
                   lanes: int | None, prims: dict[int, Any] | None = None,
                   launch: Callable | None = None,
                   valid: jax.Array | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The values a block's ops compute, on a batch of lanes: `env` (every
    variable an op assigns) and, per stack, the value its Push/Update writes.
    `read(v)` gives `(value, batched)` of a variable not assigned earlier in
    the block, `top(s)` the top of stack `s` (a block reads a stack at most
    once, before it writes it), `join(op)` a Join's (or a Collect's) values
    by out; `launch(op, get)` sees each Launch with the values at that point.
    `prims[k](op, get)`, where given, computes the k-th op instead of
    `run_prim` (the same values in the lanes that run the block). Both
    machines run blocks with it, and gradients (`grad/backward.py`) differentiate it.
    `valid`: the rows that run the block, where the others hold junk (see `run_prim`)."""
    env: dict[str, Any] = {}
    pushed: dict[str, Any] = {}

    def get(v: str) -> tuple[Any, bool]:
        return (env[v], True) if v in env else read(v)

    prims = prims or {}
    for k, op in enumerate(block.ops):
        if k in prims:
            env.update(prims[k](op, get))
        elif isinstance(op, Prim):
            env.update(run_prim(op, get, types, lanes, valid))
        elif isinstance(op, (Push, Update)):
            pushed[stack_of[op.var]] = get(op.var)[0]
        elif isinstance(op, (Pop, Peek)):
            env[op.var] = top(stack_of[op.var])
        elif isinstance(op, Join):
            env.update(join(op))
        elif isinstance(op, Collect):
            env.update(join(op, get))
        elif isinstance(op, Launch):
            launch(op, get)
    return env, pushed


def stack_offsets(block: Block, stack_of: dict[str, str]) -> dict[str, tuple[int | None, int | None, int]]:
    """Per stack a block touches, relative to the lane's stack pointer before
    the block: the row it reads (Pop/Peek), the row it writes (Push/Update),
    None for neither, and the pointer's net change."""
    out: dict[str, tuple[int | None, int | None, int]] = {}
    for op in block.ops:
        if isinstance(op, (Push, Pop, Peek, Update)):
            s = stack_of[op.var]
            r, w, d = out.get(s, (None, None, 0))
            if isinstance(op, (Pop, Peek)):
                r = d - 1
            else:
                w = d if isinstance(op, Push) else d - 1
            d += 1 if isinstance(op, Push) else -1 if isinstance(op, Pop) else 0
            out[s] = (r, w, d)
    return out


def no_writes(stacks: dict[str, Any], lanes: int, depth: int) -> dict[str, tuple[jax.Array, Any]]:
    """A write request per stack that writes nothing (row `depth`)."""
    row = jnp.full((lanes,), depth, index_dtype())
    return {s: (row, zeros_of(t, (lanes,))) for s, t in stacks.items()}


def execute(block: Block, stack_of: dict[str, str], stacks: dict[str, Any], types: Any,
            read: Callable, top: Callable, join: Callable | None, rows: Rows, codes: Codes,
            depth: int, lanes: int, prims: dict[int, Any] | None = None, launch: Callable | None = None,
            index: int | None = None, writes: dict[str, tuple[jax.Array, Any]] | None = None) -> Ran:
    """Run `block` (block `index` of its program: a `Fail` halts lanes at
    `codes.failed + index`) on `lanes` rows (see `Rows`, `Ran`). `read(v)`
    gives a variable's `(value, batched)` before the block, `top(s)` stack
    `s`'s top, `join(op)` a Join's children's return values; `depth` is the
    stacks' depth (a pointer reaching it overflows). `writes`: the write requests
    of stacks the block does not push (default `no_writes`; a caller running every
    block on the same rows makes them once)."""
    idx = index_dtype()
    valid = rows.valid
    env, pushed = block_dataflow(block, stack_of, read, top, join, types, lanes, prims, launch, valid)
    writes = dict(no_writes(stacks, lanes, depth) if writes is None else writes)
    sps = dict(rows.sps)
    for s, (_, w, d) in stack_offsets(block, stack_of).items():
        if w is not None:
            writes[s] = (where(valid, sps[s] + w, depth), pushed[s])
        sps[s] = where(valid, sps[s] + d, sps[s])

    term = block.term
    no = jnp.zeros((lanes,), bool)
    pc, pc_sp, pc_write, overflow, finished = None, rows.pc_sp, None, no, no
    # An Await's lanes with children out: the pool blocks them (their pc says where they go next).
    if isinstance(term, Jump) or (isinstance(term, Await) and term.cond is None):
        pc = jnp.full((lanes,), term.target, idx)
    elif isinstance(term, (Branch, Await)):
        cond = env[term.cond] if term.cond in env else read(term.cond)[0]
        cond = jnp.broadcast_to(jnp.asarray(cond) != 0, (lanes,))
        true, false = (term.true, term.false) if isinstance(term, Branch) else (term.target, term.false)
        pc = where(cond, true, false).astype(idx)
    elif isinstance(term, PushJump):
        overflow = valid & (pc_sp >= depth)
        ok = valid & ~overflow
        pc_write = (where(ok, pc_sp, depth), jnp.full((lanes,), term.ret, idx))
        pc_sp = pc_sp + ok
        # An overflowing child finishes (poisoned): its parent must not wait forever.
        finished = overflow & rows.child
        pc = where(overflow, where(rows.child, codes.done, codes.overflowed), term.target).astype(idx)
    elif isinstance(term, Return):
        if pc_sp is None:  # no calls: every Return ends the example
            bottom = jnp.ones((lanes,), bool)
            pc = jnp.full((lanes,), codes.halt, idx)
        else:
            bottom = pc_sp <= 1  # slot 0 belongs to the bottom frame and is never read
            pc = where(bottom, codes.halt, rows.pc_top).astype(idx)
            pc_sp = where(valid & ~bottom, pc_sp - 1, pc_sp)
        finished = valid & bottom & rows.child
        pc = where(finished, codes.done, pc).astype(idx)
    elif isinstance(term, Fail):
        if index is None:
            raise ValueError("a block ending in Fail runs only with its index")
        # A child finishes (its example is flagged by the pool); any other lane halts, failed.
        finished = valid & rows.child
        pc = jnp.broadcast_to(where(rows.child, codes.done, codes.failed + index), (lanes,)).astype(idx)
    elif not isinstance(term, Fork):
        raise TypeError(f"unknown terminator {term!r}")
    return Ran(env, pc, sps, pc_sp, writes, pc_write, overflow, finished)


def eval_prelude(prog: StackProgram, inputs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Machine constants, computed once and unbatched, and per-example
    invariants, computed once per example (leading example axis)."""
    consts = {v: x for v, x in inputs.items() if prog.var_class.get(v) == CONSTANT}
    inv = {v: x for v, x in inputs.items() if prog.var_class.get(v) == INVARIANT}

    def read(v: str) -> tuple[Any, bool]:
        return (inv[v], True) if v in inv else (consts[v], False)

    for op in prog.prelude:
        # A Python number (`return 300` goes through a constant `_t = 300`) stays a concrete
        # value, so that an assignment that narrows it is checked (`_overflows`) as Python's would be.
        literal = not op.ins and all(is_weak(prog.var_types[v]) for v in op.outs)
        with jax.ensure_compile_time_eval() if literal else contextlib.nullcontext():
            values = run_prim(op, read, prog.var_types, None)
            if literal:
                values = {v: as_typed(x, prog.var_types[v]) for v, x in values.items()}
        for v, x in values.items():
            (inv if prog.var_class.get(v) == INVARIANT else consts)[v] = x
    return consts, inv


def block_function(prog: StackProgram, b: int, width: int) -> tuple[Callable, dict[str, Any]] | None:
    """Block b's ops on `width` rows as a function of what they read (the
    variables its ops read before assigning them, the stack tops it pops or
    peeks, the children's return values it joins) and those inputs' shapes;
    None for a block without arithmetic. Terminators and stack moves are left
    out. For cost models (`pcbatch.step_costs`)."""
    block, types, cls = prog.blocks[b], prog.var_types, prog.var_class
    if not any(isinstance(op, Prim) for op in block.ops):
        return None
    layout = StackLayout.of(prog)
    stack_of = layout.stack_of

    def run(inputs: dict[str, Any]) -> Any:
        def read(v: str) -> tuple[Any, bool]:
            return inputs["var"][v], cls.get(v) != CONSTANT

        def join(op: Any, get: Any = None) -> dict[str, Any]:
            if isinstance(op, Collect):
                return {op.out: inputs["var"][op.ret], op.flag: jnp.zeros((width,), bool)}
            return {v: inputs["var"][r] for v, r in zip(op.outs, op.rets)}

        return block_dataflow(block, stack_of, read, inputs["top"].__getitem__, join, types, width,
                              launch=lambda op, get: None)

    names: dict[str, None] = {}
    tops: dict[str, None] = {}
    assigned: set[str] = set()
    for op in block.ops:
        names.update((v, None) for v in op_reads(op) if v not in assigned)
        if isinstance(op, Join):  # the children's return values
            names.update((r, None) for r in op.rets)
        elif isinstance(op, Collect):
            names[op.ret] = None
        elif isinstance(op, (Pop, Peek)):
            tops[stack_of[op.var]] = None
        assigned.update(op_writes(op))
    spec = lambda t, lead: tree_map(lambda s: jax.ShapeDtypeStruct(lead + s.shape, s.dtype), t)  # noqa: E731
    specs = {"var": {v: spec(types[v], () if cls.get(v) == CONSTANT else (width,)) for v in names if v in types},
             "top": {s: spec(layout.stacks[s], (width,)) for s in tops}}
    return run, specs

