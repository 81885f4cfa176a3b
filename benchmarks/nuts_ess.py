"""Effective samples per second of a whole Bayesian run, pcbatch against BlackJAX (issue 20).

    pip install -e '.[bench]'                 # BlackJAX
    python -m benchmarks.nuts_ess             # 4 targets x 4 and 64 chains (about 5 minutes on 2 CPU cores)
    python -m benchmarks.nuts_ess --targets eight_schools --chains 4 --warmup 500 --samples 500

What a Bayesian user runs: window adaptation (Stan's schedule: step size and
a diagonal mass matrix) for `--warmup` transitions, then `--samples` draws,
every chain from the same start, `max_tree_depth` 10, target acceptance 0.8.

* **pcbatch**: `pcbatch.mcmc.nuts.sample(..., adaptation="window")`: one
  autobatched program for warm-up and sampling of all chains;
* **blackjax**: `blackjax.window_adaptation(blackjax.nuts, ...)` then
  `blackjax.nuts` in `lax.scan`, `jax.vmap` over chains, all in one `jax.jit`
  (the way BlackJAX's documentation runs several chains).

Both are timed whole (warm-up + sampling; compilation excluded: one call
first), interleaved, medians of `--repeats`. ESS is the same estimator for
both (`pcbatch.mcmc.diagnostics.ess`, rank-free Geyer, over all chains); the
row's figure is the smallest ESS over the coordinates, per second. Also
printed: gradient evaluations per draw, divergences, and each coordinate's
posterior mean in Monte-Carlo standard errors from the other sampler's
(|z| of a few is expected now and then; tens would be a bug).

Targets (`pcbatch.mcmc.targets`): eight schools (non-centered, 10-d), Neal's
funnel (10-d, scale 1.5), a 50-d Student-t (5 dof), a logistic regression on
scikit-learn's breast-cancer data (31 weights).
"""
from __future__ import annotations

import argparse
import datetime
import platform

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import block, print_table, time_calls
from pcbatch.mcmc import diagnostics, nuts, targets

TARGETS = {
    "eight_schools": lambda: targets.eight_schools(),
    "funnel": lambda: targets.funnel(10),
    "student_t": lambda: targets.student_t(50),
    "breast_cancer": lambda: targets.breast_cancer_logistic(),
}


def pcbatch_run(target, x0, key, warmup, samples):
    out = nuts.sample(target.logdensity, x0, key, num_warmup=warmup, num_samples=samples,
                      adaptation="window", step_size=1.0)
    return out.position, out.info.num_integration_steps, out.info.is_divergent


def blackjax_program(target, warmup, samples):
    import blackjax

    def one(key, x):
        k_warm, k_draws = jax.random.split(key)
        adapt = blackjax.window_adaptation(blackjax.nuts, target.logdensity, target_acceptance_rate=0.8)
        (state, params), _ = adapt.run(k_warm, x, num_steps=warmup)
        step = blackjax.nuts(target.logdensity, **params).step

        def draw(state, k):
            state, info = step(k, state)
            return state, (state.position, info.num_integration_steps, info.is_divergent)

        _, draws = jax.lax.scan(draw, state, jax.random.split(k_draws, samples))
        return draws

    return jax.jit(jax.vmap(one))


def row_stats(draws, seconds):
    pos, grads, div = (np.asarray(a) for a in draws)
    ess = diagnostics.ess(pos.astype(np.float64))
    return {"ess": float(np.nanmin(ess)), "seconds": seconds, "grads": float(grads.mean()),
            "div": int(div.sum()), "mean": pos.mean(axis=(0, 1)),
            "mcse": pos.std(axis=(0, 1), ddof=1) / np.sqrt(np.maximum(ess, 1.0))}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--chains", default="4,64")
    ap.add_argument("--warmup", type=int, default=1000)
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    try:
        import blackjax
    except ImportError:
        print("BlackJAX is not installed (pip install -e '.[bench]'): nothing to compare with")
        return
    print(f"# nuts_ess  {datetime.datetime.now():%Y-%m-%d %H:%M}  {platform.machine()}  jax {jax.__version__}  "
          f"blackjax {blackjax.__version__}  {a.warmup} warm-up + {a.samples} draws per chain")
    rows = []
    for name in a.targets.split(","):
        target = TARGETS[name]()
        for chains in (int(c) for c in a.chains.split(",")):
            key = jax.random.PRNGKey(0)
            x0 = jnp.zeros((chains, target.dim), jnp.float32)
            bj = blackjax_program(target, a.warmup, a.samples)
            keys = jax.random.split(key, chains)
            calls = {"pcbatch": lambda: pcbatch_run(target, x0, key, a.warmup, a.samples),
                     "blackjax": lambda: bj(keys, x0)}
            draws = {k: block(f()) for k, f in calls.items()}   # compiles
            t = time_calls(calls, a.repeats, min_time=0.0, warm=True)
            s = {k: row_stats(draws[k], t[k]) for k in calls}
            z = (s["pcbatch"]["mean"] - s["blackjax"]["mean"]) / np.sqrt(
                s["pcbatch"]["mcse"] ** 2 + s["blackjax"]["mcse"] ** 2)
            ratio = (s["pcbatch"]["ess"] / s["pcbatch"]["seconds"]) / (s["blackjax"]["ess"] / s["blackjax"]["seconds"])
            rows.append([name, str(chains)] + [
                f"{s[k]['ess'] / s[k]['seconds']:.0f} ({s[k]['ess']:.0f} in {s[k]['seconds']:.2f} s, "
                f"{s[k]['grads']:.1f} grad/draw, {s[k]['div']} div)" for k in calls] +
                [f"{ratio:.2f}x", f"{np.max(np.abs(z)):.1f}"])
            print("  ", " | ".join(rows[-1]), flush=True)
    print()
    print_table(["target", "chains", "pcbatch: min ESS/s", "blackjax: min ESS/s", "pcbatch : blackjax",
                 "max |z| of the means"], rows)


if __name__ == "__main__":
    main()
