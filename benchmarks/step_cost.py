"""Per-step cost of the fork-join machine against the size of its lane pool.

    python -m benchmarks.step_cost            # pools of 1k, 16k and 128k lanes (~3 min)
    python -m benchmarks.step_cost --quick    # fewer repeats

A fork-join program (8 complete binary trees of depth 6 summed by recursion,
the walk repeated `reps` times by each example) runs at the same lane width
(256: at most 256 lanes per step) with pools of 1k, 16k and 128k lanes. The
step count does not depend on the pool; the time per step should not either
(issue 17: <= 1.3x growth from 1k to 128k). The marginal cost of a step is
taken between two workloads (`reps` 2 and 42) so that the per-call set-up
(filling the pool's pcs and free list, O(pool)) is not counted as step time;
it is printed separately. Calls are eager (the pool's state is the workspace
each call donates to the next). Systems are timed interleaved, medians.
"""
from __future__ import annotations

import argparse
import datetime
import platform

import jax
import jax.numpy as jnp
import numpy as np

import pcbatch
from benchmarks.common import fmt_time, print_table, time_calls

POOLS = (1024, 16384, 131072)
WIDTH = 256
TREES = 8
DEPTH = 6
REPS = (2, 42)
GROWTH_TARGET = 1.3


def tree_walk(pool: int):
    @pcbatch.autobatch(max_lanes=pool, lane_width=WIDTH)
    def tree(depth, leaf):
        if depth <= 0:
            return leaf
        return tree(depth - 1, leaf * 0.5) + tree(depth - 1, leaf + 1.0)

    @pcbatch.autobatch(max_lanes=pool, lane_width=WIDTH)
    def walk(depth, reps):
        total = 0.0
        r = 0
        while r < reps:
            # The call reads the running total, so the trips run one after another (no loop fork,
            # whose launches would depend on the pool): the same steps at every pool.
            total = total + tree(depth, 1.0 + 0.0 * total)
            r = r + 1
        return total

    return walk


def reference(depth: int, leaf: float) -> float:
    if depth <= 0:
        return leaf
    return reference(depth - 1, leaf * 0.5) + reference(depth - 1, leaf + 1.0)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    repeats = 3 if args.quick else 7
    depth = jnp.full((TREES,), DEPTH)
    fns, steps = {}, {}
    for pool in POOLS:
        walk = tree_walk(pool)
        for reps in REPS:
            r = jnp.full((TREES,), reps)
            # Eager calls, as a user makes them: the pool's state lives in the workspace each call
            # donates to the next. (Inside a caller's `jit` the state is a fresh allocation per call,
            # whose pages the steps touch for the first time: the queue rings advance through all
            # `M` slots, so the step seems to grow with the pool.)
            run = walk.checked
            result, status = run(depth, r)
            want = reps * reference(DEPTH, 1.0)
            np.testing.assert_allclose(np.asarray(result), want, rtol=1e-5)
            assert not bool(status.unfinished.any()) and not bool(status.overflow.any())
            steps[pool, reps] = int(status.steps)
            fns[pool, reps] = (lambda run=run, r=r: run(depth, r)[0])
    for reps in REPS:
        assert len({steps[p, reps] for p in POOLS}) == 1, "the step count must not depend on the pool"
    times = time_calls(fns, repeats, min_time=0.2)
    lo, hi = REPS
    dsteps = steps[POOLS[0], hi] - steps[POOLS[0], lo]
    per_step = {p: (times[p, hi] - times[p, lo]) / dsteps for p in POOLS}
    rows = []
    for p in POOLS:
        fixed = times[p, lo] - per_step[p] * steps[p, lo]
        rows.append([f"{p:,}", f"{steps[p, lo]} / {steps[p, hi]}", fmt_time(times[p, lo]), fmt_time(times[p, hi]),
                     fmt_time(per_step[p]), fmt_time(max(fixed, 0.0)), f"{per_step[p] / per_step[POOLS[0]]:.2f}x"])
    print(f"# step_cost {datetime.date.today()} {platform.machine()} {jax.devices()[0].platform}, "
          f"{TREES} trees of depth {DEPTH}, lane width {WIDTH}, medians of {repeats}")
    print_table(["pool", "steps", f"time reps={lo}", f"time reps={hi}", "per step", "set-up", "vs 1k"], rows)
    growth = per_step[POOLS[-1]] / per_step[POOLS[0]]
    verdict = "met" if growth <= GROWTH_TARGET else "NOT met"
    print(f"growth 1k -> {POOLS[-1] // 1024}k: {growth:.2f}x (target <= {GROWTH_TARGET}x: {verdict})")


if __name__ == "__main__":
    main()
