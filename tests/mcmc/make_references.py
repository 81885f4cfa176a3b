"""Reference posterior moments for tests/mcmc/test_posteriors.py, from long BlackJAX runs
(independent of pcbatch's sampler: only the log densities in `pcbatch.mcmc.targets` are shared).

    python tests/mcmc/make_references.py            # writes tests/mcmc/references.json

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
    path.write_text(json.dumps(refs, indent=1) + "\n")


if __name__ == "__main__":
    main(pathlib.Path(__file__).with_name("references.json"))
