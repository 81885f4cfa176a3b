"""Child-Sum Tree-LSTM inference on real trees (stdlib function ASTs): pcbatch against a
depth-batched JAX peer and DyNet.

    python -m benchmarks.treelstm --workload ast                  # batch 64, 256 x hidden 64, 128
    python -m benchmarks.treelstm --workload ast --batches 64 --hiddens 64 --repeats 3

Trees: `pcbatch.data.load_ast_trees("all", max_nodes=..., max_children=16)` (every stdlib
function of up to `--max-nodes` AST nodes, any arity up to 16), shuffled with `--seed`;
batch b = the first b trees. Output per tree: the root's (h, c). After a warm-up call
(compilation, graph caches) each method is timed on the whole batch, median of
`--repeats`:

* **pcbatch**: `models.child_sum.child_sum_tree_lstm` (written for ONE tree: a loop over a
  node's children that recurses into each), one compiled call, under the default options
  (`fork="auto"`: the loop's calls fork, a loop fork, where the batch and pool pay) and
  with `fork=False` (one lane per tree); steps and peak lanes printed;
* **depth-batched JAX** (`benchmarks/childsum_depth.py`): levels by height on the host
  (NumPy), one batched cell step per level on the device (one jit per level profile);
  timed with its host levelization (what a user runs per batch) and without (device
  only; the levels already on the device);
* **DyNet** (`pip install dynet38`, or the `bench-dynet` extra; skipped with a message if
  it does not import): the same cell and the SAME weights, one computation graph per batch
  (renew_cg, one expression per node of every tree, bottom-up), run with DyNet's
  autobatching (`autobatch=1`: its agenda-based heuristic); graph construction is part of
  its time, as in DyNet's, Cavs's and ED-Batch's own throughput figures.

Both are checked against each other (and pcbatch against its `.reference` on the first
trees) before timing. For context (not measured here), the published speedups over DyNet
on a Tree-LSTM are quoted: ED-Batch (Chen et al. 2023, Table 6: batch 256, hidden 512,
CPU, 1163 vs 671 inputs/s = 1.73x; GPU 6736 vs 2723 = 2.47x) and Cavs (Xu et al. 2018,
§5.1 / Fig. 8(d)(h): "consistently outperforms DyNet" on Tree-LSTM, no figure in the text;
near 10x on training overall; in ED-Batch's Table 6 the open-source Cavs runs 480 inputs/s
on CPU = 0.72x DyNet).
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time

import jax
import numpy as np

from benchmarks import childsum_depth
from benchmarks.common import block, fmt_rate, fmt_time, print_table
from pcbatch import data
from pcbatch.models import child_sum_loop

PUBLISHED = ("published, Tree-LSTM vs DyNet: ED-Batch 1.73x CPU / 2.47x GPU (its Table 6: batch 256, hidden 512); "
             "Cavs: 'consistently outperforms DyNet' (its Fig. 8(d)(h), no number in the text); open-source "
             "Cavs 0.72x DyNet on CPU (ED-Batch Table 6)")


def load_dynet():
    """dynet with autobatching, or None (with the reason printed)."""
    try:
        import dynet_config
        dynet_config.set(autobatch=1, random_seed=1, mem=1024)
        import dynet as dy
        return dy
    except Exception as e:   # noqa: BLE001 - not installed / no wheel for this platform
        print(f"DyNet skipped: {type(e).__name__}: {e} (pip install dynet38, or pip install -e '.[bench-dynet]')")
        return None


class DynetChildSum:
    """The Child-Sum Tree-LSTM of `models.child_sum` in DyNet, with pcbatch's weights."""

    def __init__(self, dy, params: dict):
        self.dy = dy
        p = {k: np.asarray(v, np.float32) for k, v in params.items()}
        self.hidden = p["U_f"].shape[0]
        m = self.model = dy.ParameterCollection()
        init = lambda a: dy.NumpyInitializer(a)
        self.E = m.add_lookup_parameters(p["embed"].shape, init=p["embed"])
        self.W_iou, self.U_iou = (m.add_parameters(p[k].shape, init=init(p[k])) for k in ("W_iou", "U_iou"))
        self.W_f, self.U_f = (m.add_parameters(p[k].shape, init=init(p[k])) for k in ("W_f", "U_f"))
        self.b_iou, self.b_f = (m.add_parameters(p[k].shape, init=init(p[k])) for k in ("b_iou", "b_f"))

    def tree(self, children: np.ndarray, word: np.ndarray, n: int):
        dy, H = self.dy, self.hidden
        h, c = [None] * n, [None] * n
        for j in range(n):                       # post-order ids: children first
            x = dy.lookup(self.E, int(word[j]))
            kids = [int(k) for k in children[j] if k >= 0]
            iou = self.W_iou * x + self.b_iou
            if kids:
                iou = iou + self.U_iou * dy.esum([h[k] for k in kids])
                wf_x = self.W_f * x + self.b_f
                fc = dy.esum([dy.cmult(dy.logistic(wf_x + self.U_f * h[k]), c[k]) for k in kids])
            i, o, u = (dy.pick_range(iou, a * H, (a + 1) * H) for a in range(3))
            c[j] = dy.cmult(dy.logistic(i), dy.tanh(u)) + (fc if kids else 0)
            h[j] = dy.cmult(dy.logistic(o), dy.tanh(c[j]))
        return h[n - 1], c[n - 1]

    def __call__(self, trees: data.Tree) -> tuple[np.ndarray, np.ndarray]:
        self.dy.renew_cg()
        roots = [self.tree(trees.children[b], trees.word[b], int(trees.num_nodes[b])) for b in range(len(trees.root))]
        out = self.dy.concatenate_cols([self.dy.concatenate([h, c]) for h, c in roots]).npvalue()
        out = out.reshape(2 * self.hidden, -1).T
        return out[:, :self.hidden], out[:, self.hidden:]


def interleaved(fns: dict, repeats: int) -> dict[str, float]:
    """Median seconds per call of each function, the functions timed in turn (a noisy machine
    slows them alike); one warm-up call each first."""
    for fn in fns.values():
        block(fn())
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            block(fn())
            samples[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in samples.items()}


def median_time(fn, repeats: int) -> float:
    block(fn())                               # warm-up: excluded
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        block(fn())
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="64,256")
    ap.add_argument("--hiddens", default="64,128")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-nodes", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    batches = [int(b) for b in a.batches.split(",")]
    hiddens = [int(h) for h in a.hiddens.split(",")]

    dy = load_dynet()
    print(f"pcbatch Child-Sum Tree-LSTM on stdlib ASTs  {datetime.datetime.now():%Y-%m-%d %H:%M}  jax {jax.__version__}  "
          f"{jax.devices()[0].platform}  {platform.processor() or platform.machine()}  {os.cpu_count()} cpus  "
          f"load {os.getloadavg()[0]:.1f}")
    t0 = time.perf_counter()
    ds = data.load_ast_trees("all", max_nodes=a.max_nodes, max_children=16, min_nodes=2)
    order = np.random.default_rng(a.seed).permutation(len(ds.trees))[:max(batches)]
    trees_all = [ds.trees[i] for i in order]
    sizes = np.array([int(t.num_nodes) for t in trees_all])
    arity = max(int((t.children >= 0).sum(1).max()) for t in trees_all)
    print(f"{len(ds.trees)} stdlib functions of <= {a.max_nodes} nodes ({time.perf_counter() - t0:.0f} s to parse); "
          f"benchmark trees: {sizes.min()}-{sizes.max()} nodes (median {int(np.median(sizes))}), max arity {arity}; "
          f"median of {a.repeats}, warm-up excluded\n")
    model = child_sum_loop.child_sum_tree_lstm_loop.with_options(max_stack_depth=a.max_nodes)
    one_lane = model.with_options(fork=False)
    rows, failed = [], False
    for hidden in hiddens:
        params = child_sum_loop.init_params(jax.random.PRNGKey(hidden), len(data.AST_VOCAB), hidden)
        peer = DynetChildSum(dy, params) if dy is not None else None
        for b in batches:
            host = data.batch(trees_all[:b])
            trees = jax.device_put(host)
            t0 = time.perf_counter()
            (h, c), status = block(model.checked(params, trees, trees.root))
            first_s = time.perf_counter() - t0
            assert not np.asarray(status.overflow).any() and not np.asarray(status.unfinished).any()
            k = min(4, b)
            small = data.Tree(*(np.asarray(x)[:k] for x in host))
            ref_h, _ = model.reference(params, small, small.root)
            np.testing.assert_allclose(np.asarray(h[:k]), np.asarray(ref_h), rtol=1e-4, atol=1e-5)
            t0 = time.perf_counter()
            _, one_status = block(one_lane.checked(params, trees, trees.root))
            one_compile = time.perf_counter() - t0
            lv = jax.device_put(childsum_depth.levels(host))
            n_rows = b * host.word.shape[1]
            dh, dc = block(childsum_depth.depth_batched(params, host))
            ok = np.allclose(dh, np.asarray(h), rtol=1e-4, atol=1e-5) and np.allclose(dc, np.asarray(c), rtol=1e-4,
                                                                                      atol=1e-5)
            failed |= not ok
            times = interleaved({"pcbatch": lambda: model(params, trees, trees.root),
                                 "fork=False": lambda: one_lane(params, trees, trees.root),
                                 "depth": lambda: childsum_depth.depth_batched(params, host),
                                 "depth device": lambda: childsum_depth.run(params, lv, n_rows)}, a.repeats)
            pc_s = times["pcbatch"]
            dy_s, agree = float("nan"), "yes" if ok else "NO (depth-batched peer)"
            if peer is not None:
                yh, yc = peer(host)
                ok = np.allclose(yh, np.asarray(h), rtol=1e-3, atol=1e-4) and np.allclose(yc, np.asarray(c), rtol=1e-3,
                                                                                          atol=1e-4)
                agree += "" if ok else f"; NO vs DyNet (max |dh| {np.abs(yh - np.asarray(h)).max():.2e})"
                failed |= not ok
                dy_s = median_time(lambda: peer(host), a.repeats)
            rows.append([str(hidden), str(b), f"{int(np.asarray(status.steps))} / {int(np.asarray(one_status.steps))}",
                         str(int(np.asarray(status.peak_lanes))), f"{first_s:.1f} / {one_compile:.1f}",
                         fmt_time(pc_s), fmt_time(times["fork=False"]), fmt_time(times["depth"]),
                         fmt_time(times["depth device"]), f"{times['depth'] / pc_s:.2f}x",
                         f"{times['depth device'] / pc_s:.2f}x",
                         f"{dy_s / pc_s:.2f}x" if dy_s == dy_s else "skipped", agree])
            print(f"  measured H {hidden} batch {b}", file=sys.stderr)
    print("Wall time per batch (one call for the whole batch; median, interleaved)")
    print_table(["H", "batch", "steps (auto / one lane)", "peak lanes", "first call s (auto / one lane)", "pcbatch",
                 "fork=False", "depth+host", "depth device", "vs depth+host", "vs depth device", "vs DyNet",
                 "same h, c"], rows)
    print(f"  pcbatch = models.child_sum (a loop over the children), default options (fork='auto'); fork=False: one\n"
          f"  lane per tree; depth = benchmarks/childsum_depth.py with its host levelization (depth+host) or the\n"
          f"  levels already on the device; 'vs X' = X's time / pcbatch's (> 1: pcbatch faster); DyNet = renew_cg +\n"
          f"  graph construction + forward with autobatch=1, same weights. {PUBLISHED}")
    print(f"load average at end: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
