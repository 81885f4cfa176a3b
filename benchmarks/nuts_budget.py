"""What `nuts.sample(..., gradient_budget=G)` buys where chains stay slow (issue 18.2).

    python -m benchmarks.nuts_budget                       # centered funnel and Student-t, 128 chains
    python -m benchmarks.nuts_budget --targets funnel_centered --chains 16,128 --repeats 5

A call of N transitions per chain lasts as long as its slowest chain's N
trajectories. On the centered funnel (`benchmarks/nuts.py`'s settings: 10-d,
scale 3, step 0.1) a chain in the neck takes 1023 leaves a transition,
transition after transition, while the others take a few. With a gradient
budget every chain stops after the transition in which its gradient
evaluations reach G: the call lasts about G plus one trajectory, and fast
chains make more draws than slow ones (continued on the next call from
`out.last_position`).

For each target and number of chains, timed round-robin (medians of
`--repeats`, compilation excluded):

* **fixed**: `nuts.sampler` with N transitions per chain (the target's default
  N of `benchmarks/nuts.py`, NumPyro/BlackJAX U-turn criterion, identity mass);
* **budget**: the same sampler with room for 4N draws and a budget G equal to
  the fixed call's mean gradient evaluations per chain (the same work on
  average, spread evenly);
* **blackjax**: BlackJAX's NUTS, `vmap` over chains, `scan` over N transitions.

Printed: wall time per call, draws (transitions recorded, summed over chains),
draws/s, useful gradients/s, each sampler's draws/s against BlackJAX's, and
the spread of draws per chain under the budget.
"""
from __future__ import annotations

import argparse
import os
import platform

import jax
import numpy as np

from benchmarks.common import fmt_rate, print_table, time_calls
from benchmarks.nuts import blackjax_run, problem, start_positions
from pcbatch.mcmc import nuts


def measure(name: str, chains: int, depth: int, repeats: int) -> list[str]:
    p = problem(name)
    n = p.samples
    x0 = start_positions(p, chains)
    keys = jax.random.split(jax.random.PRNGKey(chains + 7), chains)
    common = dict(max_tree_depth=depth, uturn_criterion="numpyro")

    fixed = nuts.sampler(p.target.logdensity, num_samples=n, **common)
    fixed_args = nuts.prepare(x0, keys, p.step_size, None, n)[0]
    out = fixed(*fixed_args)
    fixed_steps = np.asarray(out.info.num_integration_steps)
    budget = max(1, int(round(fixed_steps.sum() / chains)))

    roomy = nuts.sampler(p.target.logdensity, num_samples=4 * n, **common)
    budget_args = nuts.prepare(x0, keys, p.step_size, None, 4 * n, gradient_budget=budget)[0]
    got = roomy(*budget_args)
    draws = np.asarray(got.num_draws)
    budget_steps = np.asarray(got.info.num_integration_steps).sum()   # rows past num_draws hold 0

    runs = {"fixed": lambda: fixed(*fixed_args), "budget": lambda: roomy(*budget_args)}
    bj = None
    try:
        bj = blackjax_run(p, x0, n, depth)
        runs["blackjax"] = bj.fn
    except ImportError:
        print("  (BlackJAX is not installed: pip install blackjax)")
    times = time_calls(runs, repeats, min_time=0.2)
    counts = {"fixed": (chains * n, int(fixed_steps.sum())), "budget": (int(draws.sum()), int(budget_steps))}
    if bj is not None:
        counts["blackjax"] = (chains * n, bj.useful)
    rows = []
    for k, t in times.items():
        d, useful = counts[k]
        ratio = "" if "blackjax" not in times else f"{d / t / (counts['blackjax'][0] / times['blackjax']):.2f}x"
        rows.append([k, f"{t * 1e3:.1f} ms", str(d), fmt_rate(d / t), fmt_rate(useful / t), ratio])
    print(f"{p.title}, {chains} chains: N = {n} transitions per chain (fixed, BlackJAX); "
          f"budget G = {budget} gradients per chain (the fixed call's mean), room for {4 * n} draws")
    print_table(["sampler", "per call", "draws", "draws/s", "useful gradients/s", "draws/s : BlackJAX"], rows)
    print(f"  draws per chain under the budget: min {draws.min()}, median {int(np.median(draws))}, "
          f"max {draws.max()}; fixed call's slowest chain: {fixed_steps.sum(axis=1).max()} gradients "
          f"(mean {fixed_steps.sum() / chains:.0f})")
    summary = [f"{name}, {chains} chains: budget {times['fixed'] / times['budget']:.2f}x faster per call than fixed"]
    if "blackjax" in times:
        summary.append(f"draws/s budget : BlackJAX = {counts['budget'][0] / times['budget'] / (chains * n / times['blackjax']):.2f}x, "
                       f"fixed : BlackJAX = {times['blackjax'] / times['fixed']:.2f}x")
    return [", ".join(summary)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--targets", default="funnel_centered,student_t")
    ap.add_argument("--chains", default="128")
    ap.add_argument("--depth", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print(f"# benchmarks.nuts_budget, jax {jax.__version__} on {jax.default_backend()} ({platform.machine()}, "
          f"{os.cpu_count()} cores), load average {os.getloadavg()[0]:.1f}")
    lines = []
    for name in args.targets.split(","):
        for chains in (int(c) for c in args.chains.split(",")):
            lines += measure(name, chains, args.depth, args.repeats)
            print()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
