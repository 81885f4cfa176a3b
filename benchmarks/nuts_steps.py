"""Where NUTS's VM steps go, block by block (issue 18: <= 1.5 steps per gradient step).

    python -m benchmarks.nuts_steps                 # 128 chains, 10 transitions, the 100-d Gaussian (~20 s)
    python -m benchmarks.nuts_steps --chains 16 --schedule gradient_quorum

Runs `benchmarks.vm_overhead`'s NUTS case (`max_tree_depth` 10, the
NumPyro/BlackJAX U-turn criterion, fixed step size) under `f.trace` and
prints, per block of the lowered program, the steps that ran it, the mean
lanes per such step, its ops and terminator, and its first source line; then
steps per leaf step (the leaf block evaluates the gradients), of the machine
as it runs (`status.steps`: `GradientLast` also runs the other blocks after
the leaf, each step, as follow blocks) and as traced (one block per step).
"""
from __future__ import annotations

import argparse
import collections

import jax
import numpy as np

from benchmarks.common import print_table
from pcbatch.mcmc import nuts, targets


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chains", type=int, default=128)
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--schedule", default="gradient_last")
    a = ap.parse_args(argv)
    target = targets.correlated_gaussian(100)
    f = nuts.sampler(target.logdensity, num_samples=a.samples, max_tree_depth=10, uturn_criterion="numpyro",
                     schedule=a.schedule)
    keys = jax.random.split(jax.random.PRNGKey(0), a.chains)
    args = nuts.prepare(target.draws(a.chains, seed=0), keys, 0.15, None, a.samples)[0]
    prog = f.lowered(*args)
    leaf = nuts.leaf_block(prog)
    trace = f.trace(*args, steps=1 << 16)
    if trace.truncated:
        raise SystemExit(f"more than {trace.steps} steps: use fewer --samples")
    blocks, lanes = np.asarray(trace.blocks)[:trace.steps], np.asarray(trace.lanes)[:trace.steps]
    rows = []
    for b, n in collections.Counter(blocks.tolist()).most_common():
        blk = prog.blocks[b]
        ops = [op for op in blk.ops]
        loc = next((op.loc for op in ops if getattr(op, "loc", None) is not None), None)
        rows.append([f"b{b}" + (" (leaf)" if b == leaf else ""), str(n), f"{lanes[blocks == b].mean():.1f}",
                     str(len(ops)), type(blk.term).__name__, f"line {loc.lineno}" if loc else ""])
    print(f"NUTS, 100-d Gaussian, {a.chains} chains x {a.samples} transitions, schedule {a.schedule}: "
          f"{trace.steps} steps, {int((blocks == leaf).sum())} leaf steps")
    print_table(["block", "steps", "mean lanes", "ops", "terminator", "source (pcbatch/mcmc/nuts.py)"], rows)
    leaf_steps = max(1, int((blocks == leaf).sum()))   # the same with and without follow blocks
    steps = int(f.checked(*args)[1].steps)
    print(f"\nVM steps per gradient (leaf) step: {steps / leaf_steps:.2f} ({steps} steps; issue 18's target: <= 1.5); "
          f"{trace.steps / leaf_steps:.2f} with one block per step")


if __name__ == "__main__":
    main()
