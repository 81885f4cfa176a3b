"""Tree-LSTM training throughput (forward + backward): pcbatch gradients against a
hand-written depth-batched JAX Tree-LSTM differentiated by `jax.grad`.

    python -m benchmarks.treelstm_train             # batch 32, 64, 128 x hidden 128 (about 10 min on 2 CPU cores)
    python -m benchmarks.treelstm_train --quick     # batch 32, fewer variants and repeats (about 3 min)
    python -m benchmarks.treelstm_train --batches 64 --hidden 256 --repeats 5

(also run by `make bench`). One training step = `jax.jit(jax.value_and_grad(loss))`
on a batch: the loss is `pcbatch.models.tree_classifier.loss` (softmax
cross-entropy of a linear layer on the root's h of the binary Tree-LSTM
`nary.nary_tree_lstm`), on sentence-like random binary trees
(`data.random_binary_trees`: 10-60 leaves, padded to 119 nodes, vocab 1000,
seeded) with `left_majority` labels. Compared, all on the same batch:

* **fork-join**: `tree_classifier.encoder`, the model with fork-join lanes
  and the sizes of a training setup: 8 stack frames (no lane recurses while
  the pool lasts) and a gradient tape of 64 rows per block per example;
* **defaults**: `nary.nary_tree_lstm` as it is (`fork="auto"`, which under
  `jax.jit` runs one lane per example unless the lane pool is small; 128
  stack frames, pcbatch's default tape of 256 rows per block per example):
  the cost of sizes chosen for any program, since a jitted step allocates
  and zero-fills its stacks and tape every call;
* **fork=False**: one lane per example (64 stack frames: a lane recurses as
  deep as its tree; tape 128: its join block runs once per node);
* **depth-batched**: `benchmarks.treelstm_baselines.depth_batched_device`
  (TensorFlow Fold / DyNet style: one batched cell step per height level,
  written by hand in JAX), the same loss, `jax.grad`; device time, with its
  host preprocessing (heights, per-level index arrays) in its own column.

Before timing, every variant's loss and gradients are checked against the
depth-batched ones (rtol 1e-4; float32 sums in different orders). Each time is
the median of `--repeats` round-robin repeats after a warm-up call.

Memory: **tape MiB** is pcbatch's gradient tape (rows, step log, the stacks'
event ids; `tape_info`): in use / allocated. **XLA temp MiB** is the compiled
training step's temporary memory (`memory_analysis().temp_size_in_bytes`):
for pcbatch the lane pool, its stacks, the tape and the cotangents; for the
baseline its residuals (every level's activations) and their gradients.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import os
import platform
import statistics
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks import treelstm_baselines as tb
from benchmarks.common import block, fmt_rate, fmt_time, print_table, time_calls
import pcbatch
from pcbatch import data
from pcbatch.models import nary
from pcbatch.models import tree_classifier as tc

VOCAB = 1000
RTOL, ATOL = 1e-4, 1e-5


def depth_loss(params: dict, packed: Any, root: Any, labels: Any, widths: tuple[int, ...], n_rows: int):
    """`tree_classifier.loss` with the depth-batched encoder."""
    h, _ = tb.depth_batched_device(params["tree"], packed, root, widths, n_rows)
    logits = h @ params["out"]["W"].T + params["out"]["b"]
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels))


def temp_mib(fn: Callable, *args) -> float:
    """The compiled function's temporary memory (MiB), or NaN if XLA does not say."""
    try:
        stats = fn.lower(*args).compile().memory_analysis()
        return stats.temp_size_in_bytes / 2**20
    except Exception:  # noqa: BLE001 - a backend without memory_analysis
        return float("nan")


def close(got: Any, want: Any) -> bool:
    g, w = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    return len(g) == len(w) and all(np.allclose(np.asarray(a), np.asarray(b), rtol=RTOL, atol=ATOL)
                                    for a, b in zip(g, w))


def measure(batch: int, hidden: int, trees: data.Tree, labels: np.ndarray, variants: list[str], repeats: int,
            min_time: float, breakdown: bool = False, xla: dict[str, Any] | None = None) -> dict[str, Any]:
    jit = functools.partial(jax.jit, compiler_options=xla or None)
    params = tc.init_params(jax.random.PRNGKey(hidden), VOCAB, hidden)
    dev_trees, dev_labels = jax.device_put((trees, labels))
    n_rows = int(np.asarray(trees.word).size)
    levels = tb.depth_levels(trees)
    packed, root = jax.device_put(tb.pack_levels(levels))
    depth_step = jit(jax.value_and_grad(depth_loss), static_argnums=(4, 5))
    want = block(depth_step(params, packed, root, dev_labels, levels.widths, n_rows))
    fns: dict[str, Callable[[], Any]] = {"depth": lambda: depth_step(params, packed, root, dev_labels,
                                                                      levels.widths, n_rows)}
    if breakdown:  # the loss alone (no gradient): the step's forward part
        depth_fwd = jit(depth_loss, static_argnums=(4, 5))
        fns["depth:fwd"] = lambda: depth_fwd(params, packed, root, dev_labels, levels.widths, n_rows)
    row: dict[str, Any] = {"batch": batch, "max_height": levels.max_height, "nodes": int(np.sum(trees.num_nodes)),
                           "temp": {"depth": temp_mib(depth_step, params, packed, root, dev_labels, levels.widths,
                                                       n_rows)}, "tape": {}, "errors": {}}
    models = {"fork": tc.encoder, "defaults": nary.nary_tree_lstm,
              "nofork": tc.encoder.with_options(fork=False, max_stack_depth=64, tape_size=128),
              "gradconds": tc.encoder.with_options(tuning=dataclasses.replace(tc.encoder.tuning, grad_switch=False)),
              "gradswitch": tc.encoder.with_options(tuning=dataclasses.replace(tc.encoder.tuning, grad_switch=True))}
    for key in variants:
        model = models[key]
        step = jit(jax.value_and_grad(tc.loss), static_argnums=(3,))
        try:
            info = model.tape_info(params["tree"], dev_trees, dev_trees.root)
            if info.needed > info.tape_size:
                raise RuntimeError(f"the tape is too small: this batch needs tape_size={info.needed}")
            got = block(step(params, dev_trees, dev_labels, model))
            if not close(got, want):
                raise AssertionError("loss or gradients differ from the depth-batched jax.grad")
            row["tape"][key] = (info.bytes_used / 2**20, info.bytes_allocated / 2**20, info.tape_size)
            row["temp"][key] = temp_mib(step, params, dev_trees, dev_labels, model)
            fns[key] = (lambda s, m: lambda: s(params, dev_trees, dev_labels, m))(step, model)
            if breakdown:
                fwd = jit(tc.loss, static_argnums=(3,))
                fns[f"{key}:fwd"] = (lambda s, m: lambda: s(params, dev_trees, dev_labels, m))(fwd, model)
        except Exception as e:  # noqa: BLE001 - report, keep the others
            row["errors"][key] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
    row["seconds"] = time_calls(fns, repeats, min_time)
    host = []
    for _ in range(max(3, repeats)):
        t0 = time.perf_counter()
        block(jax.device_put(tb.pack_levels(tb.depth_levels(trees))))
        host.append(time.perf_counter() - t0)
    row["host"] = statistics.median(host)
    return row


LABELS = {"fork": "fork-join", "defaults": "defaults (fork='auto')", "nofork": "fork=False",
          "gradconds": "fork-join, grad conds", "gradswitch": "fork-join, grad switch"}


def heap_temporaries() -> None:
    """glibc: allocations up to 1 GiB from the heap (not a fresh `mmap` each), never trimmed
    back to the OS (the same as MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=2147483647)."""
    import ctypes
    libc = ctypes.CDLL("libc.so.6")
    m_trim_threshold, m_mmap_threshold = -1, -3
    if not (libc.mallopt(m_mmap_threshold, 1 << 30) and libc.mallopt(m_trim_threshold, 2 ** 31 - 1)):
        raise SystemExit("mallopt refused the thresholds")
    print("# glibc: mmap threshold 1 GiB, no trimming (--heap-temporaries)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="batch 32, fork-join only, fewer repeats (~3 min)")
    ap.add_argument("--batches", default=None, help="comma-separated batch sizes (default 32,64,128)")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats (median; default 5, --quick 3)")
    ap.add_argument("--min-time", type=float, default=None, help="seconds a timed repeat lasts at least")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--xla-options", action="store_true",
                    help="compile every step, the peer's too, with pcbatch's own XLA options "
                         "(`pcbatch.Tuning().compiler_options()`: on the CPU, no tree-reduction rewrite)")
    ap.add_argument("--variants", default=None,
                    help="comma-separated, of " + ", ".join(LABELS) + " (default fork,defaults,nofork; --quick fork); "
                         "gradconds / gradswitch: fork-join with Tuning.grad_switch False / True")
    ap.add_argument("--breakdown", action="store_true",
                    help="also time each loss alone: where a step's time goes (forward, backward)")
    ap.add_argument("--heap-temporaries", action="store_true",
                    help="before anything else, keep large allocations in glibc's heap (mallopt: mmap "
                         "threshold 1 GiB, no trimming), for both systems: a jitted step's XLA temporaries "
                         "are then reused from call to call instead of page-faulted in fresh every call "
                         "(the README's tip for training on the CPU)")
    a = ap.parse_args(argv)
    if a.heap_temporaries:
        heap_temporaries()
    batches = [int(b) for b in (a.batches or ("32" if a.quick else "32,64,128")).split(",")]
    variants = a.variants.split(",") if a.variants else ["fork"] if a.quick else ["fork", "defaults", "nofork"]
    if set(variants) - set(LABELS):
        ap.error(f"unknown variants {sorted(set(variants) - set(LABELS))}; known: {', '.join(LABELS)}")
    repeats = a.repeats or (3 if a.quick else 5)
    min_time = a.min_time if a.min_time is not None else (0.5 if a.quick else 1.0)
    print(f"# benchmarks.treelstm_train  {datetime.datetime.now():%Y-%m-%d %H:%M}  {platform.node()}  "
          f"jax {jax.__version__} on {jax.devices()[0].platform}  ({os.cpu_count()} CPUs; "
          f"load {os.getloadavg()[0]:.1f})")
    print(f"# hidden {a.hidden}, vocab {VOCAB}, trees: 10-60 leaves (random bracketing), batches {batches}\n")
    stream = data.random_binary_trees(max(batches), seed=a.seed, vocab=VOCAB)
    labels_all = np.asarray([tc.left_majority(t, VOCAB) for t in stream], np.int32)
    rows = []
    for b in batches:
        t0 = time.perf_counter()
        rows.append(measure(b, a.hidden, data.batch(stream[:b]), labels_all[:b], variants, repeats, min_time,
                            a.breakdown, pcbatch.Tuning().compiler_options() if a.xla_options else None))
        print(f"  batch {b}: measured in {time.perf_counter() - t0:.0f} s", file=sys.stderr)

    print("Training throughput (trees/s, one jitted value_and_grad step; median, warm-up excluded)")
    out = []
    for r in rows:
        s, b = r["seconds"], r["batch"]
        depth_rate = b / s["depth"]
        cells = [str(b), str(r["max_height"])]
        for k in variants:
            cells += ["error" if k in r["errors"] else fmt_rate(b / s[k]),
                      "" if k in r["errors"] else f"{(b / s[k]) / depth_rate:.2f}x"]
        cells += [fmt_rate(depth_rate), fmt_time(s["depth"]), fmt_time(r["host"]),
                  fmt_rate(b / (s["depth"] + r["host"]))]
        out.append(cells)
    heads = ["batch", "max h"]
    for k in variants:
        heads += [LABELS[k], "/depth"]
    print_table(heads + ["depth-batched", "(wall)", "depth host", "depth+host"], out)
    print("  /depth = throughput relative to depth-batched (device time); depth host = its host preprocessing per\n"
          "  batch; depth+host = both. max h = tallest tree in the batch.")

    if a.breakdown:
        print("\nWhere a step's time goes: forward = the loss alone (jitted, no gradient), backward = the step "
              "minus it")
        out = []
        for r in rows:
            s = r["seconds"]
            for k in ["depth"] + [k for k in variants if k not in r["errors"]]:
                fwd, step = s[f"{k}:fwd"], s[k]
                out.append([str(r["batch"]), LABELS.get(k, "depth-batched"), fmt_time(fwd), fmt_time(step - fwd),
                            fmt_time(step), f"{fwd / s['depth:fwd']:.2f}x",
                            f"{(step - fwd) / (s['depth'] - s['depth:fwd']):.2f}x"])
        print_table(["batch", "system", "forward", "backward", "step", "forward / depth's", "backward / depth's"], out)

    print("\nMemory (MiB)")
    out = []
    for r in rows:
        cells = [str(r["batch"]), str(r["nodes"])]
        for k in variants:
            used, alloc, size = r["tape"].get(k, (float("nan"),) * 3)
            cells += [f"{used:.1f} / {alloc:.1f} ({size})", f"{r['temp'].get(k, float('nan')):.0f}"]
        cells.append(f"{r['temp']['depth']:.0f}")
        out.append(cells)
    heads = ["batch", "nodes"]
    for k in variants:
        heads += [f"{LABELS[k]} tape used / alloc (tape_size)", "XLA temp"]
    print_table(heads + ["depth-batched XLA temp"], out)

    print("\nTarget: pcbatch >= 1x the depth-batched jax.grad at its best batch")
    best_depth = max(rows, key=lambda r: r["batch"] / r["seconds"]["depth"])
    depth_rate = best_depth["batch"] / best_depth["seconds"]["depth"]
    for k in variants:
        ok = [r for r in rows if k not in r["errors"]]
        if not ok:
            print(f"  {LABELS[k]}: error")
            continue
        best = max(ok, key=lambda r: r["batch"] / r["seconds"][k])
        rate = best["batch"] / best["seconds"][k]
        print(f"  {LABELS[k]}: best {fmt_rate(rate)} trees/s @ batch {best['batch']} vs depth-batched best "
              f"{fmt_rate(depth_rate)} @ batch {best_depth['batch']}: {rate / depth_rate:.3f}x "
              f"({'met' if rate >= depth_rate else 'NOT met'})")
    errors = {(k, e) for r in rows for k, e in r["errors"].items()}
    for k, e in sorted(errors):
        print(f"error in {LABELS[k]}: {e}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
