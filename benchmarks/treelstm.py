"""Binary Tree-LSTM inference throughput: pcbatch fork-join against plain-JAX peers.

    python -m benchmarks.treelstm            # batch 1..256 x hidden 64, 128, 256 (about 10 min on 2 CPU cores)
    python -m benchmarks.treelstm --quick    # batch 1, 8, 32 x hidden 64, 128 (under 2 minutes)
    python -m benchmarks.treelstm --batches 1,64 --hiddens 128 --repeats 5
    python -m benchmarks.treelstm --workload ast   # Child-Sum Tree-LSTM on stdlib ASTs vs DyNet (treelstm_ast.py)

(also run by `make bench`). Model: `pcbatch.models.nary.nary_tree_lstm`
(Tai et al.'s binary Tree-LSTM, written for ONE tree, autobatched) on
sentence-like random binary trees (`pcbatch.data.random_binary_trees`: 10-60
leaves, random bracketings, padded to 119 nodes, seeded; batch b = the first b
trees of one stream). Output per tree: the root's (h, c). For each hidden size
and batch it times, after a warm-up call (compilation excluded):

* **fork-join**: `nary_tree_lstm.with_options(fork=True).checked(params,
  trees, trees.root)` (the default, `fork="auto"`, forks only where
  `benchmarks/fork_choice.py` found it pays), or with the lane pool and step
  width set by `--lanes-per-example` / `--width-per-example`
  (`with_options(max_lanes=..., lane_width=...)`);
* **fork=False**: `nary_tree_lstm.with_options(fork=False)`: one lane per
  example, the children run one after the other;
* **per-example jit**: `treelstm_baselines.per_example_jit`: no batching, one
  jitted bottom-up loop over ONE tree's nodes, called once per tree;
* **depth-batched**: `treelstm_baselines.depth_batched` (TF Fold / DyNet
  style): one batched cell step per height level; timed on the device part
  only, with the host preprocessing (heights, per-level index arrays packed
  into one array, device_put) reported in its own column.

Every method is checked against `nary_tree_lstm.reference` (the original Python,
one tree at a time) on the first trees of each batch and against the
depth-batched result on the whole batch before it is timed: a baseline that
disagrees aborts the run; a pcbatch variant that raises or disagrees shows
`error`, is listed at the end, and the exit status is 1. Each time is the median
of `--repeats` (5; --quick 3; at most 3 for calls over 2 s) after the warm-up,
with `jax.block_until_ready`. See `benchmarks/treelstm_baselines.py` for the
baselines and their padding rule.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import numpy as np

from benchmarks import treelstm_baselines as tb
from benchmarks.common import block, fmt_rate, fmt_time, print_table
from pcbatch import data
from pcbatch.models import nary

STEPS_TARGET = 1.2      # fork-join: VM steps <= 1.2 x max height x blocks per node
VOCAB = 1000
RTOL, ATOL = 1e-5, 1e-5
NA = "n/a"


# --- pcbatch variants and what they report ---------------------------------

def fork_off(model) -> tuple[Any, bool]:
    """`model.with_options(fork=False)`, or the model itself (False) where that
    API does not exist yet."""
    with_options = getattr(model, "with_options", None)
    if with_options is None:
        return model, False
    try:
        return with_options(fork=False), True
    except TypeError:            # with_options without a `fork` option
        return model, False


def machine_lanes(model, prog, batch: int) -> int | None:
    """Lanes the machine's stacks have: `lowered().lanes` (the batch, or the
    lane pool of a program with forks)."""
    lanes = getattr(prog, "lanes", None)
    return None if lanes is None else int(lanes)


def stack_bytes(prog, lanes: int | None) -> int | None:
    """Bytes of the machine's value stacks: over distinct stacks (shared stacks
    counted once, by one representative variable), stack_depth x lanes x the
    per-example bytes of the stack's type. The pc stack (depth x lanes x 4 B)
    is not included."""
    try:
        depth = int(prog.stack_depth)
        reps: dict[str, str] = {}
        for v, cls in sorted(prog.var_class.items()):
            if cls == "stacked":
                reps.setdefault(prog.stack_of.get(v, v), v)
        per = {s: sum(int(np.prod(l.shape)) * np.dtype(l.dtype).itemsize
                      for l in jax.tree_util.tree_leaves(prog.var_types[v])) for s, v in reps.items()}
        return depth * int(lanes) * sum(per.values())
    except Exception:            # noqa: BLE001 - a StackProgram of another shape: report n/a
        return None


def blocks_per_node(model, params) -> tuple[int | None, int | None]:
    """(blocks a leaf runs, blocks an internal node runs itself, its children's
    excluded), from `model.trace` on a 1-leaf tree and on a 2-leaf tree. The
    second is the "blocks per node" of the steps target: along the critical
    path of a fork-join run every level of the tree adds an internal node's own
    blocks."""
    try:
        rng = np.random.default_rng(0)
        lens = []
        for leaves in (1, 2):
            t = data.batch([data.random_binary_tree(rng, leaves, 3, vocab=VOCAB)])
            (trace,) = model.reference_trace(params, t, t.root)
            lens.append(len(trace.blocks))
        return lens[0], lens[1] - 2 * lens[0]
    except Exception:            # noqa: BLE001
        return None, None


# --- one configuration -------------------------------------------------------

@dataclass
class Variant:
    """What one pcbatch variant did on one batch."""
    label: str
    seconds: float = float("nan")
    steps: int | None = None
    peak_lanes: int | None = None
    stack_bytes: int | None = None
    lanes: int | None = None            # lanes of the machine's stacks (the pool, for fork-join)
    blocks: int | None = None
    error: str | None = None


@dataclass
class Row:
    hidden: int
    batch: int
    max_height: int
    nodes: int
    pc: dict[str, Variant]
    per_example_s: float
    depth_s: float
    host_s: float
    level_widths: tuple[int, ...] = ()
    level_counts: tuple[int, ...] = ()
    notes: list[str] = field(default_factory=list)

    def rate(self, seconds: float) -> float:
        return self.batch / seconds if seconds == seconds and seconds > 0 else float("nan")


def cell_summary(row: Row) -> str:
    """One cell's trees/s in a line (the table comes only at the end)."""
    parts = [f"{v.label} {row.rate(v.seconds):,.0f}/s" + (f" ({v.steps} steps)" if v.steps else "")
             for v in row.pc.values()]
    parts += [f"depth device {row.rate(row.depth_s):,.0f}/s", f"depth+host {row.rate(row.depth_s + row.host_s):,.0f}/s"]
    return ", ".join(parts)


def close(got: Any, want: Any) -> bool:
    g, w = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    return len(g) == len(w) and all(np.shape(a) == np.shape(b) and
                                    np.allclose(np.asarray(a), np.asarray(b), rtol=RTOL, atol=ATOL)
                                    for a, b in zip(g, w))


def subset(trees: data.Tree, k: int) -> data.Tree:
    return data.Tree(*(np.asarray(a)[:k] for a in trees))


SLOW_CALL_S = 2.0        # a call slower than this gets at most SLOW_REPEATS timed repeats
SLOW_REPEATS = 3


def time_warm(fns: dict[str, Callable[[], Any]], repeats: int, min_time: float) -> dict[str, float]:
    """Median wall time (s) of each `fn()`, all already called once (warm-up:
    compilation and the correctness checks). Round-robin like
    `common.time_calls`; a repeat calls a function enough times to last
    `min_time` (judged on its first repeat) and records the mean. A function
    whose first repeat takes over SLOW_CALL_S gets at most SLOW_REPEATS."""
    inner = {k: 1 for k in fns}
    cap = {k: repeats for k in fns}
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for rep in range(repeats):
        for k, fn in fns.items():
            if rep >= cap[k]:
                continue
            t0 = time.perf_counter()
            for _ in range(inner[k]):
                block(fn())
            dt = (time.perf_counter() - t0) / inner[k]
            samples[k].append(dt)
            if rep == 0:
                if min_time > 0:
                    inner[k] = max(1, int(min_time / max(dt, 1e-9)))
                if dt > SLOW_CALL_S:
                    cap[k] = min(repeats, SLOW_REPEATS)
    return {k: statistics.median(v) for k, v in samples.items()}


def measure(hidden: int, batch: int, all_trees: list[data.Tree], variants: dict[str, Any],
            repeats: int, min_time: float, ref_k: int) -> Row:
    params = nary.init_params(jax.random.PRNGKey(hidden), VOCAB, hidden)
    host_trees = data.batch(all_trees[:batch])
    trees = jax.device_put(host_trees)
    n_rows = int(np.asarray(host_trees.word).size)

    # the baselines; the depth-batched result is the whole-batch yardstick
    levels = tb.depth_levels(host_trees)
    packed, roots = jax.device_put(tb.pack_levels(levels))
    depth_out = block(tb.depth_batched_device(params, packed, roots, levels.widths, n_rows))
    items = tb.split_trees(host_trees)
    per_out = block(tb.per_example_jit(params, items))
    k = min(ref_k, batch)
    small = subset(host_trees, k)
    ref = block(nary.nary_tree_lstm.reference(params, small, small.root))
    for name, out in (("depth-batched", depth_out), ("per-example jit", per_out)):
        if not close(jax.tree_util.tree_map(lambda x: x[:k], out), ref):
            raise AssertionError(f"{name} disagrees with nary_tree_lstm.reference (hidden {hidden}, batch {batch})")
    if not close(per_out, depth_out):
        raise AssertionError(f"per-example jit and depth-batched disagree (hidden {hidden}, batch {batch})")

    fns: dict[str, Callable[[], Any]] = {
        "per-example": lambda: tb.per_example_jit(params, items),
        "depth": lambda: tb.depth_batched_device(params, packed, roots, levels.widths, n_rows),
    }
    row = Row(hidden, batch, levels.max_height, int(np.sum(host_trees.num_nodes)), {}, float("nan"),
              float("nan"), float("nan"), levels.widths, levels.counts)

    for key, (label, model) in variants.items():
        v = Variant(label)
        row.pc[key] = v
        try:
            prog = model.lowered(params, trees, trees.root)
            v.blocks = len(prog.blocks)
            v.lanes = machine_lanes(model, prog, batch)
            v.stack_bytes = stack_bytes(prog, v.lanes)
            out, status = block(model.checked(params, trees, trees.root))
            bad = [n for n in ("overflow", "unfinished") if np.any(np.asarray(getattr(status, n, False)))]
            if bad:
                raise RuntimeError(f"status flags set: {bad}")
            v.steps = int(status.steps)
            if hasattr(status, "peak_lanes"):
                v.peak_lanes = int(np.max(np.asarray(status.peak_lanes)))
            if not close(jax.tree_util.tree_map(lambda x: x[:k], out), ref):
                raise AssertionError("disagrees with nary_tree_lstm.reference")
            if not close(out, depth_out):
                raise AssertionError("disagrees with depth-batched on the whole batch")
            fns[key] = (lambda m: (lambda: m.checked(params, trees, trees.root)))(model)
        except Exception as e:   # noqa: BLE001 - a broken pcbatch must not hide the baselines
            v.error = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            if os.environ.get("PCBATCH_BENCH_TRACEBACK"):
                traceback.print_exc()

    times = time_warm(fns, repeats, min_time)
    row.per_example_s, row.depth_s = times.pop("per-example"), times.pop("depth")
    for key, s in times.items():
        row.pc[key].seconds = s

    host = []
    for _ in range(max(3, repeats)):
        t0 = time.perf_counter()
        block(jax.device_put(tb.pack_levels(tb.depth_levels(host_trees))))
        host.append(time.perf_counter() - t0)
    row.host_s = statistics.median(host)
    return row


# --- printing ----------------------------------------------------------------

def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if a == a and b == b and b > 0 else NA


def opt(x: Any, fmt: Callable[[Any], str] = str) -> str:
    return NA if x is None else fmt(x)


def mib(n: int) -> str:
    return f"{n / 2**20:.1f}" if n >= 2**20 / 10 else f"{n / 2**20:.2f}"


def stack_cell(v: Variant) -> str:
    return opt(v.stack_bytes, lambda n: f"{mib(n)} ({opt(v.lanes)})")


def rate_cell(row: Row, v: Variant) -> str:
    return "error" if v.error else fmt_rate(row.rate(v.seconds))


def print_results(rows: list[Row], bpn: tuple[int | None, int | None], fork_notes: tuple[str, str]) -> int:
    leaf_blocks, node_blocks = bpn
    print("Throughput (trees/s; median wall of one call for the whole batch, warm-up excluded)")
    out = []
    for r in rows:
        fj, nf = r.pc["fork"], r.pc["nofork"]
        depth_rate = r.rate(r.depth_s)
        out.append([str(r.hidden), str(r.batch), str(r.max_height),
                    rate_cell(r, fj), "" if fj.error else fmt_time(fj.seconds),
                    rate_cell(r, nf),
                    fmt_rate(r.rate(r.per_example_s)),
                    fmt_rate(depth_rate), fmt_time(r.depth_s), fmt_time(r.host_s),
                    fmt_rate(r.batch / (r.depth_s + r.host_s)),
                    "" if fj.error else ratio(r.rate(fj.seconds), depth_rate),
                    "" if fj.error or nf.error else ratio(r.rate(fj.seconds), r.rate(nf.seconds))])
    print_table(["H", "batch", "max h", "fork-join", "(wall)", "fork=False", "per-ex jit", "depth dev",
                 "(wall)", "depth host", "depth+host", "fork/depth", "fork/nofork"], out)
    print(f"  fork-join = {fork_notes[0]}; fork=False = {fork_notes[1]};\n"
          "  per-ex jit = one jitted bottom-up loop per tree, called once per tree;\n"
          "  depth dev = depth-batched device time only (one batched cell step per height level); depth host = its\n"
          "  host preprocessing (heights, padded per-level index arrays, packed, device_put); depth+host = both;\n"
          "  fork/depth, fork/nofork = throughput ratios (> 1: fork-join faster); max h = tallest tree in the batch.")

    print("\nBest batch per hidden size (depth-batched device throughput peaks at batch*)")
    best = []
    for h in sorted({r.hidden for r in rows}):
        rs = [r for r in rows if r.hidden == h]
        d = max(rs, key=lambda r: r.rate(r.depth_s))
        fj_ok = [r for r in rs if not r.pc["fork"].error]
        f = max(fj_ok, key=lambda r: r.rate(r.pc["fork"].seconds)) if fj_ok else None
        at = d.pc["fork"]
        # Issue 18.3 counts the peer's host preprocessing (a user has to do it): its best batch with it.
        dh = max(rs, key=lambda r: r.rate(r.depth_s + r.host_s))
        best.append([str(h), str(d.batch), fmt_rate(d.rate(d.depth_s)),
                     "error" if at.error else fmt_rate(d.rate(at.seconds)),
                     "" if at.error else ratio(d.rate(at.seconds), d.rate(d.depth_s)),
                     NA if f is None else f"{fmt_rate(f.rate(f.pc['fork'].seconds))} @ {f.batch}",
                     NA if f is None else ratio(f.rate(f.pc["fork"].seconds), d.rate(d.depth_s)),
                     f"{fmt_rate(dh.rate(dh.depth_s + dh.host_s))} @ {dh.batch}",
                     NA if f is None else ratio(f.rate(f.pc["fork"].seconds), dh.rate(dh.depth_s + dh.host_s))])
    print_table(["H", "batch*", "depth dev", "fork-join @ batch*", "fork/depth @ batch*", "fork-join best",
                 "best/best", "depth+host best", "best/best (host counted)"], best)

    print(f"\nThe machines (steps target for fork-join: VM steps <= {STEPS_TARGET} x max height x blocks per node)")
    print(f"  blocks per node = blocks an internal node runs itself (children excluded) = {opt(node_blocks)} "
          f"(a leaf runs {opt(leaf_blocks)}); from model.trace on a 1-leaf and a 2-leaf tree")
    out = []
    for r in rows:
        fj, nf = r.pc["fork"], r.pc["nofork"]
        denom = r.max_height * node_blocks if node_blocks else None
        target = (fj.steps / denom) if fj.steps is not None and denom else None
        out.append([str(r.hidden), str(r.batch), str(r.max_height), str(r.nodes),
                    opt(fj.blocks), opt(fj.steps), opt(fj.steps, lambda s: f"{s / r.max_height:.1f}"),
                    opt(target, lambda t: f"{t:.2f}"),
                    NA if target is None else ("PASS" if target <= STEPS_TARGET else "MISS"),
                    opt(nf.steps), opt(fj.peak_lanes), opt(nf.peak_lanes),
                    stack_cell(fj), stack_cell(nf),
                    "" if fj.error or not fj.steps else fmt_time(fj.seconds / fj.steps),
                    "" if nf.error or not nf.steps else fmt_time(nf.seconds / nf.steps)])
    print_table(["H", "batch", "max h", "nodes", "blocks", "fork steps", "steps/h", "steps/(h*bpn)",
                 f"<= {STEPS_TARGET}", "nofork steps", "fork peak lanes", "nofork peak lanes",
                 "fork stack MiB (lanes)", "nofork stack MiB (lanes)", "fork /step", "nofork /step"], out)
    print("  blocks = len(model.lowered(...).blocks); steps = status.steps; steps/(h*bpn) = fork steps / (max h x\n"
          "  blocks per node); peak lanes = status.peak_lanes (most lanes in use at once; n/a where the Status has\n"
          "  none); stack MiB = sum over distinct value stacks of stack_depth x lanes x bytes per example (pc stack\n"
          "  excluded; lanes = the batch, or the lane pool of a program with forks); /step = wall / VM steps;\n"
          "  nodes = tree nodes in the batch.")

    errors: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        for v in r.pc.values():
            if v.error:
                errors.setdefault((v.label, v.error), []).append(f"H {r.hidden} batch {r.batch}")
    if errors:
        print("\npcbatch errors (PCBATCH_BENCH_TRACEBACK=1 prints the tracebacks):")
        for (label, err), where in errors.items():
            print(f"  {label} ({', '.join(where)}): {err}")
    return 1 if errors else 0


# --- main --------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--workload", choices=("random", "ast"), default="random")
    known, rest = pre.parse_known_args(argv)
    if known.workload == "ast":     # real variable-arity trees, DyNet as a peer: its own script
        from benchmarks import treelstm_ast
        return treelstm_ast.main(rest)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", choices=("random", "ast"), default="random",
                    help="random binary trees (this script), or stdlib ASTs vs DyNet (benchmarks/treelstm_ast.py)")
    ap.add_argument("--quick", action="store_true", help="batch 1, 8, 32 x hidden 64, 128, fewer repeats (< 2 min)")
    ap.add_argument("--batches", default=None, help="comma-separated batch sizes (default 1,8,32,64,128,256)")
    ap.add_argument("--hiddens", default=None, help="comma-separated hidden sizes (default 64,128,256)")
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats per measurement (median)")
    ap.add_argument("--min-time", type=float, default=None, help="seconds each timed repeat lasts at least")
    ap.add_argument("--seed", type=int, default=0, help="seed of the tree stream")
    ap.add_argument("--lanes-per-example", type=int, default=None,
                    help="fork-join lane pool: max_lanes = this x batch (default: pcbatch's default)")
    ap.add_argument("--width-per-example", type=int, default=None,
                    help="fork-join lane_width = max(64, this x batch) (default: pcbatch's default)")
    ap.add_argument("--shape", default="random", help="tree shape(s), comma-separated: random, frontier, "
                    "balanced, left, right (cycled)")
    a = ap.parse_args(argv)

    batches = [int(b) for b in (a.batches or ("1,8,32" if a.quick else "1,8,32,64,128,256")).split(",")]
    hiddens = [int(h) for h in (a.hiddens or ("64,128" if a.quick else "64,128,256")).split(",")]
    repeats = a.repeats or (3 if a.quick else 5)
    min_time = a.min_time if a.min_time is not None else (0.05 if a.quick else 0.2)
    ref_k = 2 if a.quick else 4
    shapes = a.shape.split(",")

    base = nary.nary_tree_lstm
    nofork, has_options = fork_off(base)
    fork_note = ("nary_tree_lstm.with_options(fork=False)" if has_options else
                 "the model itself (with_options(fork=...) is not available yet: same machine as fork-join)")
    lane_opts = lambda b: {k: v for k, v in (("max_lanes", a.lanes_per_example and a.lanes_per_example * b),
                                             ("lane_width", a.width_per_example and max(64, a.width_per_example * b)))
                           if v}
    if lane_opts(1) and not hasattr(base, "with_options"):
        print("--lanes-per-example / --width-per-example need with_options: ignored")
        lane_opts = lambda b: {}

    def variants(batch: int) -> dict[str, tuple[str, Any]]:
        opts = lane_opts(batch)
        return {"fork": ("fork-join", base.with_options(fork=True, **opts)), "nofork": ("fork=False", nofork)}

    print(f"pcbatch Tree-LSTM  {datetime.datetime.now():%Y-%m-%d %H:%M}  jax {jax.__version__}  "
          f"{jax.devices()[0].platform}  {platform.processor() or platform.machine()}  "
          f"{os.cpu_count()} cpus  load {os.getloadavg()[0]:.1f}{'  (--quick)' if a.quick else ''}")
    all_trees = data.random_binary_trees(max(batches), seed=a.seed, shape=shapes if len(shapes) > 1 else shapes[0],
                                         vocab=VOCAB)
    leaves = [data.tree_leaves(t) for t in all_trees]
    print(f"binary Tree-LSTM (pcbatch.models.nary), vocab {VOCAB}; random_binary_trees(seed={a.seed}, "
          f"shape={a.shape}): {min(leaves)}-{max(leaves)} leaves, padded to {all_trees[0].word.shape[0]} nodes; "
          f"batch b = the first b trees;\nmedian of {repeats} repeats ({SLOW_REPEATS} for calls over "
          f"{SLOW_CALL_S:g} s; each >= {min_time}s, methods timed round-robin), warm-up excluded; checked against nary_tree_lstm.reference on the first {ref_k} trees")
    opts = lane_opts(1)
    print("fork-join options: " + (", ".join(f"{k} = {a.lanes_per_example if k == 'max_lanes' else a.width_per_example}"
                                             f" x batch" + (" (>= 64)" if k == "lane_width" else "") for k in opts)
                                   if opts else "pcbatch's defaults") + "\n")

    start = time.perf_counter()
    params0 = nary.init_params(jax.random.PRNGKey(0), VOCAB, hiddens[0])
    bpn = blocks_per_node(base, params0)
    rows: list[Row] = []
    for h in hiddens:
        for b in batches:
            t0 = time.perf_counter()
            rows.append(measure(h, b, all_trees, variants(b), repeats, min_time, ref_k))
            print(f"  measured H {h} batch {b} ({time.perf_counter() - t0:.1f}s): {cell_summary(rows[-1])}",
                  file=sys.stderr, flush=True)  # a run cut off by a deadline (gpu.sh) keeps what it measured
    fj_note = "nary_tree_lstm.with_options(" + ", ".join(["fork=True"] + [f"{k}=..." for k in lane_opts(1)]) + ")"
    rc = print_results(rows, bpn, (fj_note, fork_note))
    widest = max(rows, key=lambda r: r.batch)
    print(f"\ndepth-batched levels at batch {widest.batch} (nodes -> padded width): "
          + ", ".join(f"{c}->{w}" for c, w in zip(widest.level_counts, widest.level_widths)))
    print(f"total time {time.perf_counter() - start:.0f} s;  load average at end: {' '.join(f'{v:.1f}' for v in os.getloadavg())} ({os.cpu_count()} cpus)")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
