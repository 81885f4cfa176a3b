"""Reference posterior moments for tests/mcmc/test_posteriors.py, from long BlackJAX runs
(independent of pcbatch's sampler: only the log densities in `pcbatch.mcmc.targets` are shared).

    python tests/mcmc/make_references.py            # writes tests/mcmc/references.json
    python tests/mcmc/make_references.py gaussian   # only the 100-d Gaussian's trajectory lengths

Per target: BlackJAX's Stan-style `window_adaptation` (1000 warm-up steps) then
`blackjax.nuts`, CHAINS chains of DRAWS draws each; stored: the mean, standard
deviation and Monte-Carlo standard error of the mean (sd / sqrt(ESS), ESS from
`pcbatch.mcmc.diagnostics`) of each reported quantity.
"""
from __future__ import annotations

import json
import pathlib
import sys
import time

import blackjax
import jax
import jax.numpy as jnp
import numpy as np

from pcbatch.mcmc import diagnostics, targets

CHAINS, WARMUP, DRAWS = 4, 1000, 25_000


def run(logdensity, dim, seed):
    def one_chain(key):
        k_warm, k_run = jax.random.split(key)
        warmup = blackjax.window_adaptation(blackjax.nuts, logdensity, target_acceptance_rate=0.8)
        (state, params), _ = warmup.run(k_warm, 0.1 * jax.random.normal(k_warm, (dim,)), num_steps=WARMUP)
        kernel = blackjax.nuts(logdensity, **params)

        def step(state, k):
            state, info = kernel.step(k, state)
            return state, (state.position, info.is_divergent)
        return jax.lax.scan(step, state, jax.random.split(k_run, DRAWS))[1]

    xs, div = jax.jit(jax.vmap(one_chain))(jax.random.split(jax.random.PRNGKey(seed), CHAINS))
    return np.asarray(xs, np.float64), int(np.asarray(div).sum())


def gaussian_100d_trajectories(step_size=0.25, chains=32, samples=150, max_doublings=8) -> dict:
    """BlackJAX's NUTS on the 100-d correlated Gaussian (NumPyro's U-turn criterion, identity mass,
    chains started at exact draws): how many transitions took each number of gradients and each
    tree depth, for test_nuts.py's two-sample tests against pcbatch's at the same settings."""
    gauss = targets.correlated_gaussian(100)
    kernel = blackjax.nuts(gauss.logdensity, step_size=step_size, inverse_mass_matrix=jnp.ones(gauss.dim),
                           max_num_doublings=max_doublings)

    @jax.jit
    def run(x0, key):
        def one(state, k):
            state, info = jax.vmap(kernel.step)(jax.random.split(k, chains), state)
            return state, (info.num_integration_steps, info.num_trajectory_expansions)
        return jax.lax.scan(one, jax.vmap(kernel.init)(x0), jax.random.split(key, samples))[1]

    steps, depths = (np.asarray(a) for a in run(gauss.draws(chains, seed=11), jax.random.PRNGKey(13)))

    def counts(a):
        values, n = np.unique(a, return_counts=True)
        return {"values": values.tolist(), "counts": n.tolist()}
    return {"step_size": step_size, "chains": chains, "samples": samples, "max_doublings": max_doublings,
            "num_integration_steps": counts(steps), "num_trajectory_expansions": counts(depths)}


def moments(named: dict[str, np.ndarray]) -> dict:
    out = {}
    for name, x in named.items():          # x: [chains, draws, k]
        ess = diagnostics.ess(x)
        sd = x.std(axis=(0, 1), ddof=1)
        out[name] = {"mean": x.mean(axis=(0, 1)).tolist(), "sd": sd.tolist(), "mcse": (sd / np.sqrt(ess)).tolist(),
                     "rhat": diagnostics.rhat(x).tolist()}
    return out


def main(path: pathlib.Path) -> None:
    refs = {"_produced_by": "python tests/mcmc/make_references.py (BlackJAX %s, window_adaptation + nuts, "
                            "%d chains x %d draws after %d warm-up)" % (blackjax.__version__, CHAINS, DRAWS, WARMUP)}
    t = targets.eight_schools()
    start = time.time()
    xs, div = run(t.logdensity, t.dim, 0)
    named = {k: np.asarray(v).reshape(CHAINS, DRAWS, -1)
             for k, v in jax.vmap(jax.vmap(targets.eight_schools_unravel))(jnp.asarray(xs)).items()}
    named["log_tau"] = xs[:, :, 1:2]
    refs["eight_schools"] = {"divergences": div, **moments(named)}
    print("eight schools", time.time() - start, "s", div, "divergences", file=sys.stderr)
    t = targets.breast_cancer_logistic()
    start = time.time()
    xs, div = run(t.logdensity, t.dim, 1)
    refs["breast_cancer_logistic"] = {"divergences": div, **moments({"w": xs})}
    print("breast cancer", time.time() - start, "s", div, "divergences", file=sys.stderr)
    refs["gaussian_100d_trajectories"] = gaussian_100d_trajectories()
    path.write_text(json.dumps(refs, indent=1) + "\n")


if __name__ == "__main__":
    out = pathlib.Path(__file__).with_name("references.json")
    if sys.argv[1:] == ["gaussian"]:  # a minute, not the hours of the long runs
        refs = json.loads(out.read_text())
        refs["gaussian_100d_trajectories"] = gaussian_100d_trajectories()
        out.write_text(json.dumps(refs, indent=1) + "\n")
    else:
        main(out)
