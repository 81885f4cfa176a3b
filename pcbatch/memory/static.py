"""Static batching of basic blocks with a PQ-tree memory layout (ED-Batch §3).

`layout_program(prog)` is a pass `StackProgram -> StackProgram`, run after
type specialization.  For each run of consecutive `Prim` ops in a block it

1. traces the run to one graph of JAX primitives (`graph.trace_run`),
2. finds groups of independent same-type ops (`groups.find_groups`): the
   gate matmuls ``W_i @ x, W_f @ x, ...`` of an LSTM cell written with
   separate matrices, the elementwise ops applied to their results,
3. lays out the groups' values with the PQ-tree planner (`layout.plan_layout`,
   ED-Batch's Algorithm 2): every group's outputs and operands contiguous and
   in one member order, so a group reads its operands as slices of an earlier
   group's packed result; groups the planner cannot honour are dropped, and
   with them the groups that read their results,
4. replaces the run by one Prim computing each group with one primitive
   application on packed operands, and adds to the prelude one Prim per
   packed constant (the weights ``W_i, W_f, ...`` concatenated once, before
   the loop, in the planned member order).

Results: the same operations on the same values.  A packed `dot_general`
concatenates weights along an output (free) dimension, so each output element
is the same dot product over the same elements; an elementwise op computes
each element as before (bit for bit).  XLA chooses a matmul kernel by shape,
though, and the wider packed matrix may get one that sums in another order:
on XLA:CPU packed matmuls differ from separate ones by 1-2 ulp on some shapes
(measured: tests/memory/test_static.py, benchmarks/block_layout.py).

A run is rewritten when it keeps at least one `dot_general` group (mode
"auto"; measured in benchmarks/block_layout.py: batched matmuls save
kernels, while elementwise ops alone gain nothing, XLA fuses them already),
or at least one group of any kind (mode "all").  Mode "gather" is the
benchmark's baseline, DyNet's memory handling: the same groups, members in
program order, and every operand that is not already a contiguous, aligned
slice (weights included) concatenated inside the loop, every step.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from typing import Any, Sequence

import jax
import numpy as np
from jax import lax

from pcbatch.ir.core import CONSTANT, TEMPORARY, Block, Prim, StackProgram, op_reads, term_reads
from pcbatch.ir.verify import verify_stack_program

from .graph import Atom, BlockGraph, Lit, Unsupported, bind, read, trace_run
from .groups import LITERAL, PACK, SHARED, SLICE, Group, depths, find_groups, member_size
from .layout import LayoutResult, plan_layout
from .report import BlockLayout, GroupReport, LayoutReport, PackReport

__all__ = ["MODES", "layout_program"]

MODES = ("auto", "all", "gather")
tree_util = jax.tree_util


# ------------------------------------------------------------------ planning
@dataclass(frozen=True)
class _Pack:
    """A constant operand packed before the loop: `atoms` (op order) along `axis`."""

    atoms: tuple[Atom, ...]
    axis: int


@dataclass(frozen=True)
class _Read:
    """How the batched code gets one operand of a group: `how` is "value"
    (atom), "pack" (index into the packed constants), "const" (an array),
    "view" (group `source`'s result, elements [start, stop) along `axis`) or
    "concat" (copy `atoms` together along `axis`: the gather baseline)."""

    how: str
    atom: Atom | None = None
    index: int | None = None
    array: Any = None
    source: int | None = None
    start: int = 0
    stop: int = 0
    axis: int = 0
    atoms: tuple[Atom, ...] = ()


@dataclass(frozen=True)
class _GroupCode:
    group: Group
    order: tuple[int, ...]  # member positions, as laid out
    reads: tuple[_Read, ...]
    offsets: tuple[tuple[int, int], ...]  # per laid-out member: [start, stop) along group.axis


@dataclass
class _RunPlan:
    graph: BlockGraph
    groups: list[Group]
    kept: list[_GroupCode]
    packs: list[_Pack]
    layout: LayoutResult | None
    status: dict[int, str]
    orders: dict[int, tuple[int, ...]]
    rewrite: bool
    reason: str
    label: dict[int, str]  # every value's distinct printable name (PQ-tree leaves, report)


def _labels(g: BlockGraph, values: Sequence[int]) -> dict[int, str]:
    """Distinct printable names for PQ-tree leaves."""
    out: dict[int, str] = {}
    seen: dict[str, int] = {}
    for v in values:
        base = g.names[v]
        n = seen.get(base, 0)
        seen[base] = n + 1
        out[v] = base if n == 0 else f"{base}#{n + 1}"
    return out


def _batch(g: BlockGraph, grp: Group, label: dict[int, str]) -> list[tuple[str, ...]]:
    """The group as a plan_layout batch: its outputs, and each operand that
    must be a contiguous aligned run (slices of earlier results; constants,
    so that each constant has one place in the block's parameter order)."""
    cols = [tuple(label[v] for v in grp.outs(g))]
    for op in grp.operands:
        if op.kind == SLICE or (op.kind == PACK and all(isinstance(a, int) for a in op.atoms)
                                and len(set(op.atoms)) == len(op.atoms)):
            cols.append(tuple(label[a] for a in op.atoms))
    return cols


def _plan_layout(g: BlockGraph, groups: list[Group], label: dict[int, str]
                 ) -> tuple[list[Group], LayoutResult | None, dict[int, str], dict[int, tuple[int, ...]]]:
    """Lay out the groups' values; drop what the planner cannot honour, and
    (transitively) the groups that read a dropped group's result."""
    status: dict[int, str] = {}
    active = list(groups)
    res = None
    while active:
        values = sorted({a for grp in active for col in [grp.outs(g)] + [op.atoms for op in grp.operands
                         if op.kind in (SLICE, PACK)] for a in col if isinstance(a, int)})
        res = plan_layout([label[v] for v in values], [_batch(g, grp, label) for grp in active],
                          {label[v]: member_size(g, v) for v in values})
        for n in res.dropped:
            status[active[n].index] = "dropped: its operands cannot be contiguous and aligned with earlier groups'"
        kept = [grp for n, grp in enumerate(active) if n not in set(res.dropped)]
        changed = True
        while changed:
            ids = {grp.index for grp in kept}
            bad = [grp for grp in kept if any(op.kind == SLICE and op.source not in ids for op in grp.operands)]
            for grp in bad:
                src = next(op.source for op in grp.operands if op.kind == SLICE and op.source not in ids)
                status[grp.index] = f"dropped: reads G{src}, which was dropped"
            kept = [grp for grp in kept if grp not in bad]
            changed = bool(bad)
        if len(kept) == len(active):
            orders = {grp.index: res.placements[n].op_order for n, grp in enumerate(active)}
            return kept, res, status, orders
        active = kept
    return [], res, status, {}


def _codegen(g: BlockGraph, kept: list[Group], orders: dict[int, tuple[int, ...]], gather: bool
             ) -> tuple[list[_GroupCode], list[_Pack]]:
    """Offsets of every laid-out member, and how each operand is read."""
    packs: list[_Pack] = []
    pack_index: dict[_Pack, int] = {}
    where: dict[int, tuple[int, int]] = {}  # output value -> (group index, position in its laid-out order)
    offsets_of: dict[int, tuple[tuple[int, int], ...]] = {}
    codes = []
    for grp in kept:
        order = orders[grp.index]
        outs = grp.outs(g)
        offsets, start = [], 0
        for p, m in enumerate(order):
            size = g.shape(outs[m])[grp.axis]
            offsets.append((start, start + size))
            start += size
            where[outs[m]] = (grp.index, p)
        offsets_of[grp.index] = tuple(offsets)
        reads = []
        for op in grp.operands:
            atoms = tuple(op.atoms[m] for m in order)
            if op.kind == SHARED:
                reads.append(_Read("value", atom=atoms[0]))
            elif op.kind == LITERAL:  # scalars broadcast to each member's shape, then concatenated
                parts = [np.broadcast_to(np.asarray(a.value), g.shape(outs[m])) for a, m in zip(atoms, order)]
                reads.append(_Read("const", array=np.concatenate(parts, axis=op.axis)))
            elif op.kind == PACK and not gather:
                pk = _Pack(atoms, op.axis)
                if pk not in pack_index:
                    pack_index[pk] = len(packs)
                    packs.append(pk)
                reads.append(_Read("pack", index=pack_index[pk]))
            else:  # SLICE, or the gather baseline
                reads.append(_view(op, atoms, where, offsets_of) or _Read("concat", atoms=atoms, axis=op.axis))
                if not gather and reads[-1].how != "view":
                    raise AssertionError(f"layout bug: G{grp.index} reads an unaligned slice")
        codes.append(_GroupCode(grp, order, tuple(reads), tuple(offsets)))
    return codes, packs


def _view(op: Any, atoms: tuple[Atom, ...], where: dict[int, tuple[int, int]],
          offsets_of: dict[int, tuple[tuple[int, int], ...]]) -> _Read | None:
    """A slice of one earlier result if `atoms` lie there contiguously, in order."""
    if op.kind != SLICE or not all(isinstance(a, int) and a in where for a in atoms):
        return None
    src = {where[a][0] for a in atoms}
    if len(src) != 1:
        return None
    pos = [where[a][1] for a in atoms]
    if pos != list(range(pos[0], pos[0] + len(pos))):
        return None
    (gid,) = src
    offs = offsets_of[gid]
    return _Read("view", source=gid, start=offs[pos[0]][0], stop=offs[pos[-1]][1], axis=op.axis)


def _plan_run(g: BlockGraph, mode: str, kinds: tuple[str, ...]) -> _RunPlan:
    groups = find_groups(g, kinds)
    label = _labels(g, sorted(g.names))
    if not groups:
        return _RunPlan(g, [], [], [], None, {}, {}, False, "no independent same-type ops", label)
    if mode == "gather":
        kept, layout, status = groups, None, {}
        orders = {grp.index: tuple(range(len(grp.members))) for grp in groups}
    else:
        kept, layout, status, orders = _plan_layout(g, groups, label)
    codes, packs = _codegen(g, kept, orders, gather=mode == "gather")
    dots = sum(grp.kind == "dot" for grp in kept)
    if not kept:
        rewrite, reason = False, "every group was dropped"
    elif mode == "auto" and not dots:
        rewrite, reason = False, "no matmul group (elementwise groups alone gain nothing: XLA fuses them)"
    else:
        rewrite = True
        reason = f"{len(kept)} groups ({dots} matmul) batched, {len(packs)} constants packed before the loop"
    for grp in groups:
        status.setdefault(grp.index, "kept" if rewrite else "found (block not rewritten)")
    return _RunPlan(g, groups, codes if rewrite else [], packs if rewrite else [], layout, status, orders,
                    rewrite, reason, label)


# ------------------------------------------------------------------ code
class _BatchedRun:
    """The rewritten run, as a Prim's function (one example's values):
    the graph's nodes, each kept group as one primitive application on
    packed operands, the other nodes as they were."""

    def __init__(self, g: BlockGraph, codes: list[_GroupCode], outputs: tuple[str, ...]):
        self.g, self.outputs = g, outputs
        in_group = {m for c in codes for m in c.group.members}
        code_at = {c.group.members[0]: c for c in codes}  # members share a depth: emit at the first one
        d = depths(g)
        steps = []
        for node in g.nodes:
            if node.index in code_at:
                steps.append((d[node.index], node.index, code_at[node.index]))
            elif node.index not in in_group:
                steps.append((d[node.index], node.index, node))
        # By depth: every operand of a depth-d node or group is computed at a smaller depth.
        self.steps = [s for _, _, s in sorted(steps, key=lambda s: (s[0], s[1]))]

    def __call__(self, *args: Any) -> tuple:
        g = self.g
        n_in = len(g.inputs)
        env: dict[int, Any] = {}
        for var, x in zip(g.inputs, args[:n_in]):
            env.update(zip(g.input_leaves[var], tree_util.tree_leaves(x)))
        packs = args[n_in:]
        buffers: dict[int, Any] = {}
        views: dict[int, tuple[int, int, int, int]] = {}

        def get(a: Atom) -> Any:
            if isinstance(a, Lit):
                return a.value
            if a not in env:
                gid, start, stop, axis = views[a]
                env[a] = lax.slice_in_dim(buffers[gid], start, stop, axis=axis)
            return env[a]

        def operand(r: _Read) -> Any:
            if r.how == "value":
                return get(r.atom)
            if r.how == "pack":
                return packs[r.index]
            if r.how == "const":
                return r.array
            if r.how == "view":
                buf = buffers[r.source]
                whole = r.start == 0 and r.stop == buf.shape[r.axis]
                return buf if whole else lax.slice_in_dim(buf, r.start, r.stop, axis=r.axis)
            return lax.concatenate([get(a) for a in r.atoms], r.axis)

        for step in self.steps:
            if isinstance(step, _GroupCode):
                grp = step.group
                first = g.nodes[grp.members[0]]
                buf = bind(first, [operand(r) for r in step.reads])[0]
                buffers[grp.index] = buf
                outs = grp.outs(g)
                for m, (start, stop) in zip(step.order, step.offsets):
                    views[outs[m]] = (grp.index, start, stop, grp.axis)
            else:
                env.update(zip(step.outs, bind(step, [get(a) for a in step.ins])))
        return tuple(tree_util.tree_unflatten(g.output_trees[v], [get(a) for a in g.output_atoms[v]])
                     for v in self.outputs)


class _PackFn:
    """Prelude code of one packed constant: its members (computed from the
    machine constants they come from), concatenated in the planned order."""

    def __init__(self, g: BlockGraph, pack: _Pack, inputs: tuple[str, ...]):
        self.g, self.pack, self.inputs = g, pack, inputs
        need = _ancestors(g, pack)
        self.nodes = [n for n in g.nodes if any(v in need for v in n.outs)]

    def __call__(self, *args: Any) -> tuple:
        env: dict[int, Any] = {}
        for var, x in zip(self.inputs, args):
            env.update(zip(self.g.input_leaves[var], tree_util.tree_leaves(x)))
        self.g.evaluate(env, self.nodes)
        parts = [read(env, a) for a in self.pack.atoms]
        return (lax.concatenate([jax.numpy.asarray(p) for p in parts], self.pack.axis),)


def _ancestors(g: BlockGraph, pack: _Pack) -> set[int]:
    """The graph values a packed constant's members are computed from, themselves included."""
    seen: set[int] = set()
    todo = [a for a in pack.atoms if isinstance(a, int)]
    while todo:
        v = todo.pop()
        if v in seen:
            continue
        seen.add(v)
        if v in g.producer:
            todo.extend(a for a in g.nodes[g.producer[v]].ins if isinstance(a, int))
    return seen


def _pack_inputs(g: BlockGraph, pack: _Pack) -> tuple[str, ...]:
    """The constant variables a packed constant is computed from."""
    leaves = {v for v in _ancestors(g, pack) if v not in g.producer}
    return tuple(var for var in g.inputs if leaves & set(g.input_leaves[var]))


# ------------------------------------------------------------------ report
def _describe(g: BlockGraph, grp: Group, label: dict[int, str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    def name(a: Atom) -> str:
        return g.name(a) if isinstance(a, Lit) else label.get(a, g.names[a])

    members = []
    for m in grp.members:
        node = g.nodes[m]
        expr = (f"{name(node.ins[0])} @ {name(node.ins[1])}" if grp.kind == "dot"
                else f"{node.primitive}({', '.join(name(a) for a in node.ins)})")
        members.append(f"{name(node.outs[0])} = {expr}")
    kinds = {SHARED: "shared", PACK: "constants packed before the loop", LITERAL: "literals, packed",
             SLICE: "slice of G{src}"}
    operands = tuple(f"{j}: " + kinds[op.kind].format(src=op.source) for j, op in enumerate(grp.operands))
    return tuple(members), operands


def _source_line(g: BlockGraph, node: Any) -> str:
    """Where the user wrote a node: the innermost frame outside JAX (a line in
    a helper such as a cell function), else the statement's line."""
    try:
        from jax._src import source_info_util

        frame = source_info_util.user_frame(node.eqn.source_info.traceback)
        if frame is not None:
            where = f"{os.path.basename(frame.file_name)}:{frame.start_line}"
            # A statement of the autobatched function runs as pcbatch's compiled op: no function name.
            return where if frame.function_name.endswith("_pcbatch_op") else f"{where} ({frame.function_name})"
    except Exception:  # pragma: no cover - private JAX API; the statement's line is the fallback
        pass
    op = g.ops[node.op]
    return str(op.loc) if op.loc else op.text


def _report(b: int, block: Block, run: Sequence[Prim], plan: _RunPlan, pack_vars: Sequence[str],
            plan_ms: float, total_ms: float) -> BlockLayout:
    g, label = plan.graph, plan.label
    groups = []
    for grp in plan.groups:
        members, operands = _describe(g, grp, label)
        order = plan.orders.get(grp.index, tuple(range(len(grp.members))))
        lines = tuple(dict.fromkeys(_source_line(g, g.nodes[m]) for m in grp.members))
        groups.append(GroupReport(grp.index, grp.kind, grp.primitive, members, tuple(label[v] for v in grp.outs(g)),
                                  operands, tuple(order), plan.status.get(grp.index, "kept"), lines))
    packs = []
    for var, pack in zip(pack_vars, plan.packs):
        shape = list(g.shape(pack.atoms[0]))
        shape[pack.axis] = sum(g.shape(a)[pack.axis] for a in pack.atoms)
        names = tuple(g.name(a) if isinstance(a, Lit) else label[a] for a in pack.atoms)
        packs.append(PackReport(var.rpartition(".")[2], names, pack.axis, tuple(shape)))
    return BlockLayout(b, block.label, tuple(op.text for op in run), plan.rewrite, plan.reason, tuple(groups),
                       plan.layout, tuple(packs), plan_ms, total_ms)


# ------------------------------------------------------------------ the pass
def _runs(ops: Sequence[Any]) -> list[tuple[int, int]]:
    """[start, stop) of each maximal run of consecutive Prims."""
    out, start = [], None
    for i, op in enumerate(list(ops) + [None]):
        if isinstance(op, Prim):
            start = i if start is None else start
        elif start is not None:
            out.append((start, i))
            start = None
    return out


def layout_program(prog: StackProgram, mode: str = "auto", kinds: tuple[str, ...] = ("dot", "elementwise")
                   ) -> tuple[StackProgram, LayoutReport]:
    """Batch independent same-type ops inside each block, on a PQ-tree layout.

    Returns the rewritten program (the same object if nothing was rewritten)
    and a `LayoutReport`.  `prog` must be specialized (types inferred).
    `mode` is "auto", "all" or "gather" (module doc); `kinds` limits the
    groups to matmuls ("dot") or "elementwise" ops, for measurements.

    >>> import jax.numpy as jnp, pcbatch
    >>> from pcbatch import _context
    >>> @pcbatch.autobatch(in_axes=(None, 0, 0), layout=False)
    ... def two(p, x, n):
    ...     for _ in range(n):
    ...         x = jnp.tanh(p["A"] @ x) * jnp.tanh(p["B"] @ x)
    ...     return x
    >>> prog = two.lowered({"A": jnp.eye(2), "B": jnp.eye(2)}, jnp.ones((4, 2)), jnp.arange(4))
    >>> with _context.in_building():
    ...     new, report = layout_program(prog)
    >>> [op.text for op in new.prelude[len(prog.prelude):]]   # one packed weight [4, 2]
    ['pack p.A, p.B']
    """
    if mode not in MODES:
        raise ValueError(f"layout mode must be one of {MODES}, got {mode!r}")
    blocks = list(prog.blocks)
    prelude = list(prog.prelude)
    var_class = dict(prog.var_class)
    var_types = dict(prog.var_types)
    reports: list[BlockLayout] = []
    pack_names: dict[Any, str] = {}
    n_packs = sum("<pack" in v for v in var_class)
    changed = False
    for b, block in enumerate(prog.blocks):
        ops = list(block.ops)
        new_ops: list[Any] = []
        last = 0
        for start, stop in _runs(ops):
            new_ops += ops[last:start]
            last = stop
            run = ops[start:stop]
            if _scalar_only(run, var_types):
                new_ops += run  # nothing to pack along: not worth tracing
                continue
            t0 = time.perf_counter()
            try:
                g = trace_run(run, var_types, var_class)
            except Unsupported:
                new_ops += run
                continue
            t1 = time.perf_counter()
            plan = _plan_run(g, mode, tuple(kinds))
            t2 = time.perf_counter()
            if not plan.groups:
                new_ops += run
                continue
            pack_vars: list[str] = []
            if plan.rewrite:
                later = {v for op in ops[stop:] for v in op_reads(op)} | set(term_reads(block.term))
                outputs = tuple(v for v in g.outputs if var_class.get(v) != TEMPORARY or v in later)
                fn_name = (prog.block_function[b] if prog.block_function else "") or "block"
                for pack in plan.packs:
                    key = _pack_key(g, pack)
                    if key is not None and key in pack_names:
                        pack_vars.append(pack_names[key])
                        continue
                    var = f"{fn_name}.<pack{n_packs}>"
                    n_packs += 1
                    inputs = _pack_inputs(g, pack)
                    fn = _PackFn(g, pack, inputs)
                    prelude.append(Prim((var,), inputs, fn, f"pack {', '.join(g.name(a) for a in pack.atoms)}"))
                    var_class[var] = CONSTANT
                    var_types[var] = jax.eval_shape(fn, *(var_types[v] for v in inputs))[0]
                    pack_names[key if key is not None else object()] = var
                    pack_vars.append(var)
                text = f"batched({len(run)} statements, {len(plan.kept)} groups: see layout_report)"
                new_ops.append(Prim(outputs, g.inputs + tuple(pack_vars), _BatchedRun(g, plan.kept, outputs), text,
                                    run[0].loc))
                changed = True
            else:
                new_ops += run
            reports.append(_report(b, block, run, plan, pack_vars, (t2 - t1) * 1e3,
                                   (time.perf_counter() - t0) * 1e3))
        new_ops += ops[last:]
        blocks[b] = replace(block, ops=tuple(new_ops))
    report = LayoutReport(tuple(reports), mode)
    if not changed:
        return prog, report
    new = replace(prog, blocks=tuple(blocks), prelude=tuple(prelude), var_class=var_class, var_types=var_types)
    verify_stack_program(new)
    return new, report


def _scalar_only(run: Sequence[Prim], var_types: Any) -> bool:
    """Every variable the run reads or writes is made of scalars (typical
    control code): groups need arrays, so there is nothing to find."""
    vs = {v for op in run for v in op.ins + op.outs}
    return all(not leaf.shape for v in vs for leaf in tree_util.tree_leaves(var_types[v]))


def _pack_key(g: BlockGraph, pack: _Pack) -> tuple | None:
    """Program-wide identity of a pack made of input leaves (None otherwise)."""
    where = {v: (var, i) for var, ids in g.input_leaves.items() for i, v in enumerate(ids)}
    if not all(isinstance(a, int) and a in where for a in pack.atoms):
        return None
    return tuple(where[a] for a in pack.atoms), pack.axis
