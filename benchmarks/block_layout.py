"""Block layout (ED-Batch Table 2): memory ops and latency of one cell's block,
with and without the PQ-tree layout, and end-to-end Tree-LSTM throughput.

    python -m benchmarks.block_layout            # hidden 64, batch 64 and 256 (a few minutes on 2 CPU cores)
    python -m benchmarks.block_layout --quick    # fewer repeats, smaller end-to-end batch
    python -m benchmarks.block_layout --hidden 128 --batches 64,256 --repeats 9

(also run by `make bench`). The cells (`benchmarks/layout_cells.py`) are
written with one weight matrix per gate, as a user writes them. Each is run as
a one-block autobatched function, `f(params, *inputs)` with the parameters
shared (`in_axes=None`); the benchmark takes that block from `f.lowered(...)`
and compiles it alone (jit of the block's Prims over a batch of lanes, as the
machine runs it, without the loop around it), in three versions:

* **per-op**: `layout=False`, the code as written (what pcbatch did before);
* **gather**: the same groups batched, but with DyNet's memory handling (the
  baseline of ED-Batch's Table 2): members in program order, and every operand
  that is not already a contiguous, aligned slice -- the weights included --
  concatenated inside the block, every step (`layout_program(prog, "gather")`);
* **PQ**: the default, `layout=True`: the PQ-tree layout; weights packed once
  before the loop (outside the timed block), every group reading slices.

Columns: memory ops = concatenate / slice / dynamic-slice / dynamic-update-slice
/ gather / scatter / copy / transpose instructions in the optimized HLO of the
block (outside fusions; a fusion whose root is one of these counts as one),
bytes = the bytes they write (a copy reads as many); kernels = all
instructions that launch work (fusions, dots, custom calls, memory ops);
latency = median time of one call at each batch. Ratios (gather/PQ,
per-op/PQ; > 1: PQ is faster) are medians of the per-repeat ratios: the
variants run round-robin, so a burst of load from other processes hits one
repeat's variants alike. Planning time is the PQ-tree planning (choosing and
laying out the groups) of the block.

The default rule is measured too: the Table 2 cells with matmul groups only
(`kinds=("dot",)`), and a block whose only groups are elementwise
(`layout_cells.scalar_gates`, `layout="all"`).

End to end: `layout_cells.tree_lstm` (binary Tree-LSTM with one matrix per gate
and child) on random binary trees, `f.checked(...)`, with `layout=True` and
`layout=False`: trees per second.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import statistics
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import _shape_bytes, block, fmt_rate, fmt_time, hlo_computations, print_table
from benchmarks.layout_cells import (CELLS, SCALAR_GATES, Cell, cell_block, cell_inputs, step_program, tree_lstm,
                                     tree_lstm_params)
from pcbatch import _context, data
from pcbatch.ir.core import CONSTANT, TEMPORARY, Prim, StackProgram
from pcbatch.memory import layout_program
from pcbatch.runtime.block import eval_prelude, run_prim

MEMORY_OPS = ("concatenate", "slice", "dynamic-slice", "dynamic-update-slice", "gather", "scatter", "copy",
              "transpose")
NOT_KERNELS = ("parameter", "tuple", "get-tuple-element", "constant", "bitcast", "broadcast", "reshape")
VOCAB = 1000
PLAN_TARGET_MS = 100.0


# ------------------------------------------------------------------ HLO
def _instructions(lines: list[str]) -> list[tuple[str, str, str]]:
    """(shape, opcode, line) of each instruction."""
    out = []
    for ln in lines:
        m = re.match(r"(?:ROOT )?%[\w.\-]+ = ((?:\([^=]*?\))|\S+) ([\w\-]+)\(", ln)
        if m:
            out.append((m.group(1), m.group(2), ln))
    return out


def memory_ops(hlo: str) -> tuple[int, int, int, list[str]]:
    """(memory ops, bytes they write, kernels, their opcodes) in the computations
    that are not fused (fused ones are inside a kernel)."""
    comps = hlo_computations(hlo)
    fused = set()
    for lines in comps.values():
        for ln in lines:
            m = re.search(r"\bfusion\(.*calls=%?([\w.\-]+)", ln)
            if m:
                fused.add(m.group(1))
    roots = {}
    for name, lines in comps.items():
        for shape, op, ln in _instructions(lines):
            if ln.startswith("ROOT"):
                roots[name] = op
    n = nbytes = kernels = 0
    kinds = []
    for name, lines in comps.items():
        if name in fused:
            continue
        for shape, op, ln in _instructions(lines):
            kind = op
            if op == "fusion":
                m = re.search(r"calls=%?([\w.\-]+)", ln)
                kind = roots.get(m.group(1), "fusion") if m else "fusion"
            if op not in NOT_KERNELS:
                kernels += 1
            if kind in MEMORY_OPS:
                n += 1
                nbytes += _shape_bytes(shape)
                kinds.append(kind)
    return n, nbytes, kernels, kinds


# ------------------------------------------------------------------ timing
def time_paired(fns: dict[str, Any], repeats: int, min_time: float) -> tuple[dict[str, float], dict[tuple, float]]:
    """Median time of each `fn()`, and the median over repeats of each pair's
    time ratio within a repeat. The functions run round-robin, their order
    rotating each repeat, so that a burst of load from other processes hits
    the variants of one repeat alike: on a shared machine the paired ratio is
    steadier than a ratio of medians."""
    names = list(fns)
    inner = {}
    for k, fn in fns.items():
        block(fn())  # warm-up: compilation excluded
        t0 = time.perf_counter()
        block(fn())
        inner[k] = max(1, int(min_time / max(time.perf_counter() - t0, 1e-9)))
    samples: dict[str, list[float]] = {k: [] for k in names}
    for r in range(repeats):
        for k in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            for _ in range(inner[k]):
                block(fns[k]())
            samples[k].append((time.perf_counter() - t0) / inner[k])
    med = {k: statistics.median(v) for k, v in samples.items()}
    ratios = {(a, b): statistics.median(x / y for x, y in zip(samples[a], samples[b])) for a in names for b in names}
    return med, ratios


# ------------------------------------------------------------------ one block
def block_function(prog: StackProgram, b: int, lanes: int):
    """The block's Prims over `lanes` lanes, as `fn(consts, lane_values) -> outputs`
    (the machine's `run_prim` on each op; no loop, no masking)."""
    ops = [op for op in prog.blocks[b].ops if isinstance(op, Prim)]
    # What the block leaves in the lanes' registers (temporaries die inside it).
    written = {v for op in ops for v in op.outs if prog.var_class.get(v) != TEMPORARY}

    def fn(consts: dict, lane_values: dict) -> dict:
        env: dict[str, Any] = {}

        def read(v: str):
            if v in env:
                return env[v], True
            if prog.var_class.get(v) == CONSTANT:
                return consts[v], False
            return lane_values[v], True

        for op in ops:
            env.update(run_prim(op, read, prog.var_types, lanes))
        return {v: env[v] for v in written if v in env}

    return fn


def block_inputs(prog: StackProgram, b: int, values: dict[str, Any], lanes: int) -> tuple[dict, dict]:
    """The constants the block reads, and its per-lane inputs: the machine's
    inputs where it reads them, zeros for its other registers."""
    consts, inv = eval_prelude(prog, values)
    reads = {v for op in prog.blocks[b].ops if isinstance(op, Prim) for v in op.ins}
    lane = {}
    for v in reads:
        if prog.var_class.get(v) == CONSTANT:
            continue
        known = {**values, **inv}
        lane[v] = known[v] if v in known else jax.tree_util.tree_map(
            lambda t: jnp.zeros((lanes,) + t.shape, t.dtype), prog.var_types[v])
    return {v: consts[v] for v in reads if prog.var_class.get(v) == CONSTANT}, lane


#: Variants: name -> (mode, kinds) of `layout_program`, None for the program as written.
TABLE2 = {"per-op": None, "gather": ("gather", ("dot", "elementwise")), "PQ": ("auto", ("dot", "elementwise")),
          "dots": ("auto", ("dot",))}
ELEMENTWISE = {"per-op": None, "PQ": ("all", ("dot", "elementwise"))}


def programs(cell: Cell, params: dict, xs: list[jax.Array], variants: dict) -> dict[str, tuple[StackProgram, Any]]:
    plain = step_program(cell, layout=False).lowered(params, *xs)
    out = {}
    for name, how in variants.items():
        if how is None:
            out[name] = (plain, None)
        else:
            with _context.in_building():
                out[name] = layout_program(plain, how[0], how[1])
    return out


def measure_cell(cell: Cell, hidden: int, batches: list[int], repeats: int, min_time: float,
                 variants: dict = TABLE2) -> dict[str, Any]:
    params = cell.init(jax.random.PRNGKey(0), hidden)
    row: dict[str, Any] = {"cell": cell.name}
    for batch in batches:
        xs = cell_inputs(cell, jax.random.PRNGKey(batch), batch, hidden) + [jnp.ones((batch,), jnp.int32)]
        progs = programs(cell, params, xs, variants)
        report = progs["PQ"][1]
        row["plan_ms"] = max([r.plan_ms for r in report], default=0.0)
        row["groups"] = sum(len(r.kept) for r in report if r.rewritten)
        calls, outs = {}, {}
        for name, (prog, _) in progs.items():
            values = dict(zip(prog.entry_params, [params, *xs]))
            b = cell_block(prog)
            consts, lane = block_inputs(prog, b, values, batch)
            fn = jax.jit(block_function(prog, b, batch))
            hlo = fn.lower(consts, lane).compile().as_text()
            row[(name, "mem")], row[(name, "bytes")], row[(name, "kernels")], row[(name, "kinds")] = memory_ops(hlo)
            outs[name] = fn(consts, lane)
            calls[name] = (lambda fn=fn, consts=consts, lane=lane: fn(consts, lane))
        common = sorted(set.intersection(*(set(o) for o in outs.values())))
        leaves = {k: jax.tree_util.tree_leaves([o[v] for v in common]) for k, o in outs.items()}
        for name in progs:
            for got, want in zip(leaves[name], leaves["per-op"]):
                np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
        row[("bitwise", batch)] = all(np.array_equal(a, b) for a, b in zip(leaves["PQ"], leaves["per-op"]))
        row[("maxdiff", batch)] = max((float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                                       for a, b in zip(leaves["PQ"], leaves["per-op"])), default=0.0)
        times, ratios = time_paired(calls, repeats, min_time)
        for name, t in times.items():
            row[(name, batch)] = t
        for pair, x in ratios.items():
            row[("ratio",) + pair + (batch,)] = x
    return row


# ------------------------------------------------------------------ end to end
def measure_tree_lstm(hidden: int, batch: int, repeats: int) -> dict[str, Any]:
    params = tree_lstm_params(jax.random.PRNGKey(0), VOCAB, hidden)
    trees = data.batch(data.random_binary_trees(batch, seed=3, min_leaves=10, max_leaves=60, max_nodes=119,
                                                vocab=VOCAB))
    fns = {"PQ": tree_lstm, "per-op": tree_lstm.with_options(layout=False)}
    outs = {k: f.checked(params, trees, trees.root) for k, f in fns.items()}
    for k, (out, status) in outs.items():
        assert not np.asarray(status.overflow).any() and not np.asarray(status.unfinished).any(), k
    ref = tree_lstm.reference(params, subset(trees, 2), subset(trees, 2).root)
    for k, (out, _) in outs.items():
        for got, want in zip(out, ref):
            np.testing.assert_allclose(np.asarray(got)[:2], np.asarray(want), rtol=1e-4, atol=1e-5)
    same = all(np.array_equal(a, b) for a, b in zip(outs["PQ"][0], outs["per-op"][0]))
    diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(outs["PQ"][0], outs["per-op"][0]))
    times, ratios = time_paired({k: (lambda f=f: f.checked(params, trees, trees.root)) for k, f in fns.items()},
                                repeats, 0.0)
    report = tree_lstm.layout_report(params, trees, trees.root)
    return {"times": times, "ratio": ratios[("per-op", "PQ")], "bitwise": same, "maxdiff": diff, "batch": batch,
            "plan_ms": {f"b{r.block} {r.label}": r.plan_ms for r in report}}


def subset(trees: data.Tree, k: int) -> data.Tree:
    return jax.tree_util.tree_map(lambda a: a[:k], trees)


# ------------------------------------------------------------------ output
def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else ("inf" if a else "1.00x")


def pratio(r: dict, a: str, b: str, batch: int) -> str:
    """The median paired time ratio a/b (> 1: b is faster)."""
    return f"{r[('ratio', a, b, batch)]:.2f}x"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--batches", default="64,256")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--tree-batch", type=int, default=None)
    ap.add_argument("--cells", default=None, help="comma-separated cell names (default: all)")
    args = ap.parse_args(argv)
    repeats = args.repeats or (5 if args.quick else 11)
    min_time = 0.05 if args.quick else 0.2
    batches = [int(b) for b in args.batches.split(",")]
    tree_batch = args.tree_batch or (16 if args.quick else 64)
    print(f"# block_layout  {datetime.date.today()}  {platform.node()}  jax {jax.__version__} "
          f"{jax.devices()[0].platform}  cpus={os.cpu_count()}  load={os.getloadavg()[0]:.1f}")
    print(f"# hidden {args.hidden}; latency = median of {repeats} repeats; per-op = layout=False, "
          "gather = DyNet-style copies, PQ = layout=True")
    cells = [c for c in CELLS if args.cells is None or c.name in args.cells.split(",")]
    rows = [measure_cell(c, args.hidden, batches, repeats, min_time) for c in cells]

    print("\nmemory ops in the compiled block (count / KiB written), kernels:")
    headers = ["cell", "groups", "per-op", "gather", "PQ", "gather/PQ", "kernels per-op/gather/PQ", "plan"]
    table = []
    for r in rows:
        cnt = {k: f"{r[(k, 'mem')]} / {r[(k, 'bytes')] / 1024:.1f}" for k in ("per-op", "gather", "PQ")}
        table.append([r["cell"], str(r["groups"]), cnt["per-op"], cnt["gather"], cnt["PQ"],
                      ratio(r[("gather", "mem")], r[("PQ", "mem")]),
                      f"{r[('per-op', 'kernels')]}/{r[('gather', 'kernels')]}/{r[('PQ', 'kernels')]}",
                      f"{r['plan_ms']:.1f} ms"])
    print_table(headers, table)

    print("\nblock latency:")
    headers = ["cell", "batch", "per-op", "gather", "PQ", "gather/PQ", "per-op/PQ", "bitwise"]
    table = []
    for r in rows:
        for b in batches:
            table.append([r["cell"], str(b), fmt_time(r[("per-op", b)]), fmt_time(r[("gather", b)]),
                          fmt_time(r[("PQ", b)]), pratio(r, "gather", "PQ", b), pratio(r, "per-op", "PQ", b),
                          "yes" if r[("bitwise", b)] else f"no ({r[('maxdiff', b)]:.1g})"])
    print_table(headers, table)

    print("\nthe default rule (a block is rewritten when it has a matmul group): latency")
    eltw = measure_cell(SCALAR_GATES, args.hidden, batches, repeats, min_time, ELEMENTWISE)
    headers = ["cell", "batch", "per-op", "matmul groups only", "all groups (PQ)", "per-op/matmul-only",
               "per-op/all"]
    table = []
    for r in rows:
        if not r["groups"]:
            continue
        for b in batches:
            table.append([r["cell"], str(b), fmt_time(r[("per-op", b)]), fmt_time(r[("dots", b)]),
                          fmt_time(r[("PQ", b)]), pratio(r, "per-op", "dots", b), pratio(r, "per-op", "PQ", b)])
    for b in batches:
        table.append([f"{eltw['cell']} (elementwise only)", str(b), fmt_time(eltw[("per-op", b)]), "-",
                      fmt_time(eltw[("PQ", b)]), "-", pratio(eltw, "per-op", "PQ", b)])
    print_table(headers, table)

    e2e = measure_tree_lstm(args.hidden, tree_batch, 3 if args.quick else 5)
    t = e2e["times"]
    print(f"\nend to end: binary Tree-LSTM (one matrix per gate), {tree_batch} trees of 10-60 leaves, hidden {args.hidden}")
    print_table(["layout", "wall", "trees/s"],
                [[k, fmt_time(v), fmt_rate(tree_batch / v)] for k, v in t.items()])
    print(f"PQ / per-op throughput: {e2e['ratio']:.2f}x (median paired ratio); results bitwise equal: "
          f"{'yes' if e2e['bitwise'] else 'no (max |diff| %.2g)' % e2e['maxdiff']}")
    print("planning time per block: " + ", ".join(f"{k}: {v:.1f} ms" for k, v in e2e["plan_ms"].items()))

    plan_max = max([r["plan_ms"] for r in rows] + list(e2e["plan_ms"].values()))
    print("\ntargets:")
    lstm_gru = [r for r in rows if r["cell"] in ("LSTMCell", "GRUCell")]
    mem_ok = all(r[("gather", "mem")] >= 2 * r[("PQ", "mem")] for r in lstm_gru)
    lstm = [r for r in rows if r["cell"].startswith("LSTM")]
    lat_ok = all(r[("ratio", "gather", "PQ", b)] >= 1.2 for r in lstm for b in batches)
    lat_ok2 = all(r[("ratio", "per-op", "PQ", b)] >= 1.2 for r in lstm for b in batches)
    print(f"  >= 2x fewer memory ops than gather on LSTM/GRU cells: {'met' if mem_ok else 'NOT met'}")
    print(f"  >= 1.2x lower latency than gather on LSTMCell: {'met' if lat_ok else 'NOT met'}; "
          f"than per-op: {'met' if lat_ok2 else 'NOT met'}")
    print(f"  planning < {PLAN_TARGET_MS:.0f} ms per block: {'met' if plan_max < PLAN_TARGET_MS else 'NOT met'} "
          f"(max {plan_max:.1f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
