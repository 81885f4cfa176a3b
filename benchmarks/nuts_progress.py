"""What the progress bar of `pcbatch.mcmc.nuts.sample` costs (issue 20: at most 2% slower).

    python -m benchmarks.nuts_progress                    # about 2 minutes on 2 CPU cores
    python -m benchmarks.nuts_progress --chains 16 --transitions 2000 --every 10

The same `nuts.sample` call (window adaptation, the 100-d correlated Gaussian
of `pcbatch.mcmc.targets`, `--chains` chains started at exact draws,
`--transitions` transitions per chain, half of them warm-up) with
`progress_bar=False` and with `progress_bar=True` (a tqdm bar on stderr, fed by
a host callback every `--every` transitions of the last chain, the only one
that reports; default a tenth of them, as `sample` does). Compilation is excluded (one call each first); the
two are timed interleaved (`benchmarks.common.time_calls`: off, on, off, on,
...) and the medians of `--repeats` are printed with their ratio. Results do
not depend on the bar (checked: the same draws).
"""
from __future__ import annotations

import argparse
import contextlib
import io

import jax
import numpy as np

from benchmarks.common import block, time_calls
from pcbatch.mcmc import nuts, targets


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chains", type=int, default=64)
    ap.add_argument("--transitions", type=int, default=1000)
    ap.add_argument("--every", type=int, default=None, help="report every N transitions (default: a tenth)")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    t = targets.correlated_gaussian(100)
    x0 = t.draws(args.chains, seed=1)
    key = jax.random.PRNGKey(0)
    warmup = args.transitions // 2

    def run(progress):
        return nuts.sample(t.logdensity, x0, key, step_size=0.2, num_warmup=warmup,
                           num_samples=args.transitions - warmup, adaptation="window", max_tree_depth=8,
                           progress_bar=progress, progress_every=args.every)

    stderr = io.StringIO()   # the bar's output is produced (its cost counted) but not shown
    with contextlib.redirect_stderr(stderr):
        off, on = block(run(False)), block(run(True))
        np.testing.assert_allclose(np.asarray(off.position), np.asarray(on.position), rtol=1e-5, atol=1e-5)
        times = time_calls({"off": lambda: run(False), "on": lambda: run(True)}, args.repeats, warm=True)
    every = args.every or max(1, args.transitions // 10)
    print(f"NUTS, 100-d Gaussian, {args.chains} chains x {args.transitions} transitions "
          f"(window adaptation), progress reported every {every} transitions of one chain, "
          f"median of {args.repeats} interleaved repeats")
    print(f"progress_bar=False: {times['off']:.3f} s")
    print(f"progress_bar=True:  {times['on']:.3f} s")
    print(f"ratio on/off: {times['on'] / times['off']:.3f} ({100 * (times['on'] / times['off'] - 1):+.1f}%)")


if __name__ == "__main__":
    main()
