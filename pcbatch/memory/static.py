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
   with them the groups that read their results (`run_plan.plan_run`),
4. replaces the run by one Prim computing each group with one primitive
   application on packed operands, and adds to the prelude one Prim per
   packed constant (the weights ``W_i, W_f, ...`` concatenated once, before
   the loop, in the planned member order: `run_code`),
5. reports what it did with the run (`run_report.report_run`).

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

import time
from dataclasses import replace
from typing import Any, Sequence

import jax

from pcbatch.ir.core import CONSTANT, TEMPORARY, Prim, StackProgram, op_reads, term_reads
from pcbatch.ir.verify import verify_stack_program

from .graph import BlockGraph, Unsupported, trace_run
from .report import BlockLayout, LayoutReport
from .run_code import BatchedRun, PackFn, pack_inputs
from .run_plan import Pack, plan_run
from .run_report import report_run

__all__ = ["MODES", "layout_program"]

MODES = ("auto", "all", "gather")
tree_util = jax.tree_util


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
            plan = plan_run(g, mode, tuple(kinds))
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
                    inputs = pack_inputs(g, pack)
                    fn = PackFn(g, pack, inputs)
                    prelude.append(Prim((var,), inputs, fn, f"pack {', '.join(g.name(a) for a in pack.atoms)}"))
                    var_class[var] = CONSTANT
                    var_types[var] = jax.eval_shape(fn, *(var_types[v] for v in inputs))[0]
                    pack_names[key if key is not None else object()] = var
                    pack_vars.append(var)
                text = f"batched({len(run)} statements, {len(plan.kept)} groups: see layout_report)"
                new_ops.append(Prim(outputs, g.inputs + tuple(pack_vars), BatchedRun(g, plan.kept, outputs), text,
                                    run[0].loc))
                changed = True
            else:
                new_ops += run
            reports.append(report_run(b, block, run, plan, pack_vars, (t2 - t1) * 1e3,
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


def _pack_key(g: BlockGraph, pack: Pack) -> tuple | None:
    """Program-wide identity of a pack made of input leaves (None otherwise)."""
    where = {v: (var, i) for var, ids in g.input_leaves.items() for i, v in enumerate(ids)}
    if not all(isinstance(a, int) and a in where for a in pack.atoms):
        return None
    return tuple(where[a] for a in pack.atoms), pack.axis
