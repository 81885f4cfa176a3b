"""Eight schools (non-centered) with pcbatch's NUTS: window adaptation, 4 chains in one call.

    python examples/eight_schools.py          # well under a minute on 2 CPU cores (mostly compiling)

Prints R-hat and the effective sample size of every parameter (ArviZ's
`az.summary` when ArviZ is installed, `pip install 'pcbatch[mcmc]'`; else
pcbatch's own split-R-hat and ESS), the divergences per chain, the adapted
step sizes, and how far the posterior means are from a long BlackJAX run
(tests/mcmc/references.json) in Monte-Carlo standard errors.
"""
import json
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np

from pcbatch.mcmc import diagnostics, nuts, targets

CHAINS, WARMUP, SAMPLES = 4, 1000, 1000


def main():
    t = targets.eight_schools()       # position: [mu, log tau, theta_tilde[0..7]]
    start = time.perf_counter()
    out = nuts.sample(t.logdensity, jnp.zeros(t.dim), jax.random.PRNGKey(0), num_chains=CHAINS,
                      num_warmup=WARMUP, num_samples=SAMPLES, adaptation="window")
    jax.block_until_ready(out.position)
    print(f"{CHAINS} chains x ({WARMUP} warm-up + {SAMPLES}) transitions in {time.perf_counter() - start:.1f} s "
          f"(compilation included)")
    print("divergences per chain:", out.divergences.tolist())
    print("adapted step sizes:", [round(float(s), 3) for s in np.asarray(out.step_size)])
    named = {k: np.asarray(v, np.float64).reshape(CHAINS, SAMPLES, -1)
             for k, v in jax.vmap(jax.vmap(targets.eight_schools_unravel))(out.position).items()}
    try:
        import arviz as az
    except ImportError:
        az = None
    if az is not None:
        idata = out.to_arviz(targets.eight_schools_unravel, dims={"theta": ["school"], "theta_tilde": ["school"]})
        print(az.summary(idata, var_names=["mu", "tau", "theta"]).to_string())
    else:
        print("(pip install arviz for az.summary; pcbatch's own diagnostics:)")
        for name in ("mu", "tau", "theta"):
            s = diagnostics.summary(named[name])
            for k in range(named[name].shape[-1]):
                label = name if named[name].shape[-1] == 1 else f"{name}[{k}]"
                print(f"{label:9s} mean {s['mean'][k]:7.3f} sd {s['sd'][k]:6.3f} "
                      f"r_hat {s['rhat'][k]:.3f} ess {s['ess'][k]:7.1f}")
    ref = json.loads((pathlib.Path(__file__).parents[1] / "tests" / "mcmc" / "references.json").read_text())
    print("posterior means vs BlackJAX's long run (z = difference / combined standard error):")
    for name in ("mu", "tau"):
        x, r = named[name], ref["eight_schools"][name]
        se = np.sqrt(x.var(ddof=1) / diagnostics.ess(x)[0] + r["mcse"][0] ** 2)
        print(f"  {name:4s} pcbatch {x.mean():6.3f}  BlackJAX {r['mean'][0]:6.3f}  z {(x.mean() - r['mean'][0]) / se:+.2f}")


if __name__ == "__main__":
    main()
