"""Do learned schedules turn fewer steps into less time? (issue 19.5)

    python -m benchmarks.schedule_time                 # 64 stdlib ASTs of <= 64 nodes, H 64 (~2 min)
    python -m benchmarks.schedule_time --batch 128 --max-nodes 128 --repeats 21

The natural Child-Sum Tree-LSTM (`models.child_sum_loop`) on real trees, the
ASTs of Python standard-library functions, on both machines: the loop fork
(`fork=True`, what `fork="auto"` keeps here) and one lane per tree
(`fork=False`). Schedules, each checked against the default's result:

* **default**: `schedule="auto"` (returns last with forks, else earliest);
* **earliest**: the earliest block with a waiting lane;
* **fsm (steps)**: `f.learn_schedule(...)`, ED-Batch's objective (fewest steps);
* **fsm (time)**: `f.learn_schedule(..., costs="estimate")`: the fewest
  estimated seconds (`pcbatch.step_costs`: per block, a fixed part from a timed
  run plus XLA's flop count at the step's width over this CPU's flop rate).

Printed: steps, median wall time of interleaved calls (warm-up excluded), the
ratio to the default, the time `learn_schedule` took, and the cost model's
per-block estimate with its predicted total against the fallback's.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import time

import jax
import numpy as np

from benchmarks.common import fmt_time, print_table, time_calls
from pcbatch import data
from pcbatch.models import child_sum_loop


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--max-nodes", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=11)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    print(f"# benchmarks.schedule_time  {datetime.datetime.now():%Y-%m-%d %H:%M}  jax {jax.__version__} on "
          f"{jax.devices()[0].platform} ({platform.machine()}, {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.1f})")
    ds = data.load_ast_trees("all", max_nodes=a.max_nodes, max_children=16, min_nodes=2)
    order = np.random.default_rng(a.seed).permutation(len(ds.trees))[:a.batch]
    trees = jax.device_put(data.batch([ds.trees[i] for i in order]))
    params = child_sum_loop.init_params(jax.random.PRNGKey(a.hidden), len(data.AST_VOCAB), a.hidden)
    args = (params, trees, trees.root)
    base = child_sum_loop.child_sum_tree_lstm_loop.with_options(max_stack_depth=a.max_nodes)
    print(f"Child-Sum Tree-LSTM, H {a.hidden}, {a.batch} stdlib functions of <= {a.max_nodes} nodes\n")
    rows, models = [], {}
    for fork in (True, False):
        f = base.with_options(fork=fork)
        t0 = time.perf_counter()
        by_steps = f.learn_schedule(*args, progress=False)
        steps_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        by_time = f.learn_schedule(*args, progress=False, costs="estimate")
        time_s = time.perf_counter() - t0
        machine = "loop fork (fork=True)" if fork else "one lane per tree (fork=False)"
        print(f"{machine}: estimated µs per step, by block: "
              f"{', '.join(f'b{b} {c * 1e6:.1f}' for b, c in enumerate(by_time.info['costs']))}; predicted "
              f"{by_time.info['cost'] * 1e3:.2f} ms against the fallback's {by_time.info['fallback_cost'] * 1e3:.2f} ms"
              + (f"; measured {by_time.info['measured']['policy'] * 1e3:.2f} ms against the default's "
                 f"{by_time.info['measured']['default'] * 1e3:.2f} ms" if "measured" in by_time.info else "")
              + (f" ({by_time.info['dropped']}: table dropped)" if "dropped" in by_time.info else ""))
        variants = {"default": (f, None), "earliest": (f.with_schedule("earliest"), None),
                    "fsm (steps)": (f.with_schedule(by_steps), steps_s),
                    "fsm (time)": (f.with_schedule(by_time), time_s)}
        want = np.asarray(f(*args)[0])
        fns = {}
        for name, (g, _) in variants.items():
            out, status = g.checked(*args)
            np.testing.assert_allclose(np.asarray(out[0]), want, rtol=1e-5, atol=1e-6)
            models[machine, name] = int(np.asarray(status.steps))
            fns[name] = (lambda g: lambda: g(*args))(g)
        seconds = time_calls(fns, a.repeats)
        for name, (_, learn) in variants.items():
            rows.append([machine, name, str(models[machine, name]), fmt_time(seconds[name]),
                         f"{seconds['default'] / seconds[name]:.2f}x", "" if learn is None else f"{learn:.1f} s"])
    print()
    print_table(["machine", "schedule", "steps", "time", "speed vs default", "learn"], rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
