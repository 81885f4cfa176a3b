"""Sharding the batch over devices: throughput on 1, 2 and 4 devices, and the
cross-device collectives inside the machine's loop.

    python -m benchmarks.sharding            # about 6 minutes on a 2-core CPU, mostly compiling
    python -m benchmarks.sharding --quick    # smaller batches, fewer repeats (about 4 minutes)

Each device count runs in a subprocess of its own with
`XLA_FLAGS=--xla_force_host_platform_device_count=N` (JAX fixes the device
count when it starts), on a mesh over all N devices, for three workloads:

* **fib** (`fork=False`): one lane per example, the plain machine;
* **treelstm**: the N-ary Tree-LSTM (`pcbatch.models.nary`) on random binary
  trees, fork-join on per-device lane pools;
* **nuts**: `pcbatch.mcmc.nuts.sample` on a 10-d Gaussian.

The peer is the same call without a mesh (one device, `none`), timed in the
1-device process. Columns: `wall` (median call, compilation excluded),
`ex/s` (examples per second), `vs none` (throughput ratio to the unsharded
call), `steps` (loop iterations of the slowest device), and the collectives
(all-reduce, all-gather, collective-permute, all-to-all, reduce-scatter,
including their async `-start` forms) in the optimized HLO: `in loop` counts
those in any `while` body or condition and everything they call (target 0),
`outside` those before and after the loop (padding, gathering results,
reducing `status.steps`).

Forced host devices are threads sharing this machine's cores, so on a 2-core
CPU the figures show correctness and the collective count, not speed-up.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import fmt_rate, fmt_time, hlo_computations, print_table, time_calls

COLLECTIVES = ("all-reduce", "all-gather", "collective-permute", "all-to-all", "reduce-scatter")
_COLLECTIVE = re.compile(r"= \S+.*? (" + "|".join(COLLECTIVES) + r")(-start)?\(")
_CALLED = re.compile(r"%([\w.\-]+)")


def collectives(text: str) -> tuple[int, int]:
    """(inside, outside) the `while` loops: cross-device collectives in an
    optimized HLO module's text. Inside means in a loop's body or condition
    or any computation they call (fusions, switch branches, nested loops)."""
    comps = hlo_computations(text)
    roots = []
    for lines in comps.values():
        for ln in lines:
            m = re.search(r"\bwhile\(.*condition=%?([\w.\-]+), body=%?([\w.\-]+)", ln)
            if m:
                roots += [m.group(1), m.group(2)]
    inside: set[str] = set()
    todo = [r for r in roots if r in comps]
    while todo:
        name = todo.pop()
        if name in inside:
            continue
        inside.add(name)
        for ln in comps[name]:
            # Operands are instructions, never computations, so only callees match.
            todo += [c for c in _CALLED.findall(ln.split("=", 1)[-1]) if c in comps and c not in inside]
    count = {name: sum(1 for ln in lines if _COLLECTIVE.search(ln)) for name, lines in comps.items()}
    loop = sum(count[c] for c in inside)
    return loop, sum(count.values()) - loop


def compiled_text(f: Any, *args: Any) -> str:
    """The optimized HLO of `f(*args)` (already called once: the compiled
    program comes from JAX's cache)."""
    exe, inputs = f.executable(*args)
    return exe.runner.lower(inputs, exe.new_workspace()).compile().as_text()


# --- workloads (in the worker) -------------------------------------------------

def workloads(quick: bool) -> dict[str, tuple[Any, tuple, int]]:
    """name -> (autobatched function, arguments, batch)."""
    import pcbatch
    from pcbatch import data
    from pcbatch.mcmc import nuts
    from pcbatch.models import nary

    @pcbatch.autobatch(fork=False)
    def fib(n):
        if n <= 1:
            return n
        return fib(n - 1) + fib(n - 2)

    rng = np.random.default_rng(0)
    batch = 64 if quick else 256
    n = rng.integers(0, 15, batch).astype(np.int32)
    n[0] = 15  # every batch holds the worst case
    out = {"fib": (fib, (jnp.asarray(n),), batch)}

    trees_batch, hidden = (16, 16) if quick else (64, 32)
    params = nary.init_params(jax.random.PRNGKey(0), vocab=1000, hidden=hidden)
    trees = data.batch(data.random_binary_trees(trees_batch, seed=0, min_leaves=10, max_leaves=40, max_nodes=79))
    out["treelstm"] = (nary.nary_tree_lstm, (params, trees, trees.root), trees_batch)

    chains, dim = (16, 10) if quick else (64, 10)
    scales = jnp.linspace(0.5, 2.0, dim)
    logp = lambda x: -0.5 * jnp.sum((x / scales) ** 2)  # noqa: E731
    transitions = 5 if quick else 20
    prog = nuts.sampler(logp, num_samples=transitions, max_tree_depth=6)
    args, _, _ = nuts.prepare(jax.random.normal(jax.random.PRNGKey(1), (chains, dim)),
                              jax.random.split(jax.random.PRNGKey(2), chains), 0.3, None, transitions)
    out["nuts"] = (prog, args, chains)
    return out


def worker(devices: int, quick: bool) -> list[dict[str, Any]]:
    import pcbatch

    assert jax.device_count() == devices, (jax.device_count(), devices)
    mesh = jax.make_mesh((devices,), ("batch",))
    rows = []
    for name, (fn, args, batch) in workloads(quick).items():
        variants = {"none": fn} if devices == 1 else {}
        variants[f"{devices}"] = fn.with_options(mesh=mesh)
        want, measured = None, {}
        for label, f in variants.items():
            t0 = time.perf_counter()
            result, status = jax.block_until_ready(f.checked(*args))
            first = time.perf_counter() - t0
            assert not np.any(np.asarray(status.overflow | status.unfinished)), name
            if want is None:
                want = result
            else:  # the sharded result equals the unsharded one
                for a, b in zip(jax.tree_util.tree_leaves(result), jax.tree_util.tree_leaves(want)):
                    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
            loop, outside = collectives(compiled_text(f, *args)) if label != "none" else (None, None)
            measured[label] = dict(workload=name, devices=label, batch=batch, first=first, steps=int(status.steps),
                                   peak_lanes=int(status.peak_lanes), loop=loop, outside=outside)
        # Interleaved, so that a change in background load hits every variant alike.
        walls = time_calls({label: (lambda f=f: f(*args)) for label, f in variants.items()},
                           repeats=3 if quick else 5, min_time=0.2)
        rows += [{**measured[label], "wall": walls[label]} for label in variants]
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller batches, fewer repeats")
    ap.add_argument("--devices", default="1,2,4", help="comma-separated device counts (default 1,2,4)")
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    opts = ap.parse_args(argv)
    if opts.worker is not None:
        print(json.dumps(worker(opts.worker, opts.quick)))
        return 0

    rows = []
    for n in [int(d) for d in opts.devices.split(",")]:
        env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={n}", "JAX_PLATFORMS": "cpu"}
        cmd = [sys.executable, "-m", "benchmarks.sharding", "--worker", str(n)] + (["--quick"] if opts.quick else [])
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stdout, proc.stderr, file=sys.stderr)
            return proc.returncode
        rows += json.loads(proc.stdout.strip().splitlines()[-1])

    print(f"pcbatch sharding: jax {jax.__version__}, {platform.machine()} CPU, {os.cpu_count()} cores, "
          f"forced host devices (threads sharing the cores: not a speed-up measurement)")
    base = {r["workload"]: r for r in rows if r["devices"] == "none"}
    table = []
    for r in rows:
        rate = r["batch"] / r["wall"]
        ref = base.get(r["workload"])
        ratio = f"{rate / (ref['batch'] / ref['wall']):.2f}x" if ref else "-"
        table.append([r["workload"], r["devices"], str(r["batch"]), fmt_time(r["wall"]), fmt_rate(rate), ratio,
                      str(r["steps"]), str(r["peak_lanes"]), fmt_time(r["first"]),
                      "-" if r["loop"] is None else str(r["loop"]), "-" if r["outside"] is None else str(r["outside"])])
    print_table(["workload", "devices", "batch", "wall", "ex/s", "vs none", "steps", "peak lanes", "first call",
                 "in loop", "outside"], table)
    worst = max((r["loop"] for r in rows if r["loop"] is not None), default=0)
    print(f"\ncollectives inside the loop (target 0): {'PASS' if worst == 0 else 'FAIL'} (max {worst})")
    return 0 if worst == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
