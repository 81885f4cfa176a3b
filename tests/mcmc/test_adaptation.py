"""Window adaptation (`pcbatch.mcmc.adaptation`) and the Bayesian user's API of `nuts.sample`.

* The schedule equals BlackJAX's `build_schedule` (Stan's windows) for short
  and long warm-ups; the mass-matrix update equals NumPy's variance with
  Stan's regularization; dual averaging restarts at each window's end.
* Differential: with window adaptation and the progress bar on, every chain
  of the autobatched sampler equals the Python reference run chain by chain,
  and the progress bar (fed by the last chain) ends at its last transition.
* The API: one key for many chains, `num_chains`, a NumPyro model's potential
  (`divergences`, the adapted `inverse_mass_matrix` and ArviZ conversion: test_posteriors.py).
"""
from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pcbatch.mcmc import adaptation, diagnostics, nuts, reporting, targets


@pytest.mark.parametrize("num_warmup", [10, 19, 20, 50, 149, 150, 151, 300, 1000, 1234])
def test_schedule_equals_blackjax(num_warmup):
    window_adaptation = pytest.importorskip("blackjax.adaptation.window_adaptation")
    theirs = np.asarray(window_adaptation.build_schedule(num_warmup))   # (slow?, window end?) per step
    slow, end = adaptation.schedule(num_warmup)
    np.testing.assert_array_equal(slow[:num_warmup], theirs[:, 0] == 1)
    np.testing.assert_array_equal(end[:num_warmup], theirs[:, 1] == 1)
    assert not slow[num_warmup] and not end[num_warmup]


def test_stan_windows():
    # Stan's documented defaults for 1000 warm-up iterations: 75 | 25 50 100 200 500 | 50.
    assert [w.stop - w.start for w in adaptation.slow_windows(1000)] == [25, 50, 100, 200, 500]
    assert adaptation.slow_windows(19) == []
    assert adaptation.slow_windows(100) == [adaptation.Window(15, 90)]   # 15% | 75% | 10%


def test_window_update_is_stan_regularized_variance_and_restarts_dual_averaging():
    slow, end = adaptation.schedule(40)            # 6 | 30 | 4: one window, transitions 6..35
    tables = (jnp.asarray(slow), jnp.asarray(end))
    draws = np.random.default_rng(0).standard_normal((40, 3)) * np.array([0.5, 1.0, 3.0])
    welford = adaptation.welford_start(jnp.zeros(3), True)
    mass = adaptation.mass_start(jnp.ones(3), jnp.zeros(3), True)
    da = adaptation.dual_averaging_start(0.5, jnp.float32)
    for i in range(40):
        da = adaptation.dual_averaging_update(da, jnp.int32(i), 0.6, 40, 0.8)
        before = da
        welford, mass, da = adaptation.window_update(tables, jnp.int32(i), jnp.asarray(draws[i], jnp.float32),
                                                     welford, mass, da)
        if i == 35:
            window = draws[6:36]
            n = len(window)
            expected = n / (n + 5) * window.var(axis=0, ddof=1) + 1e-3 * 5 / (n + 5)
            np.testing.assert_allclose(np.asarray(mass), expected, rtol=1e-5)
            assert int(da.start) == 36 and float(da.h_avg) == 0.0
            np.testing.assert_allclose(float(da.step_size), float(before.step_size))
            np.testing.assert_allclose(float(da.mu), np.log(10 * float(before.step_size)), rtol=1e-6)
        elif i < 35:
            np.testing.assert_array_equal(np.asarray(mass), 1.0)
    assert float(welford.count) == 0.0


SCALES = np.array([0.1, 1.0, 5.0], np.float32)


def _scaled_gaussian(x):
    return -0.5 * jnp.sum((x / SCALES) ** 2)


def test_window_adaptation_differential_with_progress_bar():
    chains, warmup, samples, every = 2, 20, 3, 5
    total = warmup + samples
    args, per_step, per_mass = nuts.prepare(jnp.zeros(3), jax.random.PRNGKey(4), 1.0, None, total,
                                            num_chains=chains, progress_every=every)
    np.testing.assert_array_equal(np.asarray(args[-1]), [total, every])   # only the last chain reports
    # Depth 3: the oracle runs half the leaves of depth 4, and the windows still adapt the mass
    # (by ~0.005 to ~0.8 across the scales below).
    prog = nuts.sampler(_scaled_gaussian, num_samples=samples, num_warmup=warmup, adaptation="window",
                        max_tree_depth=3, progress=True)
    bar = reporting.ProgressBar(total, chains, "test")
    calls = []
    update = bar.update
    bar.update = lambda i: (calls.append(np.asarray(i).copy()), update(i))
    reporting.PROGRESS.append(bar)
    try:
        out = jax.block_until_ready(prog(*args))
    finally:
        reporting.PROGRESS.remove(bar)
        bar.close()
    # The last chain reported after each chunk of `every` transitions, the last one included.
    assert [int(c.max()) for c in calls] == list(range(every, total, every)) + [total]
    assert bar.done == total          # what the reports said (closing the bar fills it regardless)
    # The same program without the progress bar, run chain by chain in Python (the oracle).
    ref = nuts.sampler(_scaled_gaussian, num_samples=samples, num_warmup=warmup, adaptation="window",
                       max_tree_depth=3).reference(*args)
    for name in ("num_integration_steps", "num_trajectory_expansions", "is_divergent"):
        np.testing.assert_array_equal(np.asarray(getattr(out.info, name)), np.asarray(getattr(ref.info, name)))
    # Adapted values differ in the last bits (exp, sqrt), which trajectories amplify.
    for a, b in ((out.position, ref.position), (out.step_size, ref.step_size),
                 (out.inverse_mass_matrix, ref.inverse_mass_matrix)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-2, atol=1e-3)
    mass = np.asarray(out.inverse_mass_matrix)
    assert mass.shape == (chains, 3) and not np.allclose(mass, 1.0)      # adapted away from the identity
    assert np.all(mass[:, 0] < mass[:, 2])                              # ... in the right direction


def test_sample_arguments():
    with pytest.raises(ValueError, match="adaptation"):
        nuts.sampler(_scaled_gaussian, num_samples=2, num_warmup=30, adaptation="dense")
    with pytest.raises(ValueError, match="step_size"):
        nuts.sample(_scaled_gaussian, jnp.zeros(3), jax.random.PRNGKey(0), num_chains=2, num_samples=2)
    with pytest.raises(ValueError, match="num_chains"):
        nuts.prepare(jnp.zeros((2, 3)), jax.random.PRNGKey(0), 0.1, None, 2, num_chains=3)
    # One key for many chains: the same as splitting it ourselves.
    one = nuts.prepare(jnp.zeros(3), jax.random.PRNGKey(5), 0.1, None, 2, num_chains=4)[0]
    many = nuts.prepare(jnp.zeros((4, 3)), jax.random.split(jax.random.PRNGKey(5), 4), 0.1, None, 2)[0]
    for a, b in zip(one, many):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    typed = nuts.prepare(jnp.zeros(3), jax.random.key(5), 0.1, None, 2, num_chains=4)[0]
    np.testing.assert_array_equal(np.asarray(typed[1]), np.asarray(one[1]))


# --------------------------------------------------------------------------
# a Bayesian user's workflow on eight schools (`divergences`, `to_arviz`: test_posteriors.py,
# on the run it checks against BlackJAX, so that one sampler run serves both)
# --------------------------------------------------------------------------

def test_numpyro_model_potential():
    """A NumPyro model sampled through its potential (the README's recipe), checked against BlackJAX's
    reference for the same model (eight schools, non-centered)."""
    numpyro = pytest.importorskip("numpyro", reason="numpyro not installed (pip install numpyro)")
    import numpyro.distributions as dist
    from jax.flatten_util import ravel_pytree
    from numpyro.infer.util import initialize_model

    def model(sigma, y=None):              # as in the README
        mu = numpyro.sample("mu", dist.Normal(0, 5))
        tau = numpyro.sample("tau", dist.HalfCauchy(5))
        with numpyro.plate("school", len(sigma)):
            theta_tilde = numpyro.sample("theta_tilde", dist.Normal(0, 1))
            numpyro.sample("obs", dist.Normal(mu + tau * theta_tilde, sigma), obs=y)

    info, potential_fn, postprocess_fn, _ = initialize_model(   # info: ParamInfo (z: the unconstrained start)
        jax.random.PRNGKey(0), model, model_args=(targets.EIGHT_SCHOOLS_SIGMA,),
        model_kwargs={"y": targets.EIGHT_SCHOOLS_Y}, dynamic_args=False)
    flat, unravel = ravel_pytree(info.z)
    out = nuts.sample(lambda x: -potential_fn(unravel(x)), flat, jax.random.PRNGKey(1), num_chains=4,
                      num_warmup=300, num_samples=500, adaptation="window")
    idata = out.to_arviz(lambda x: postprocess_fn(unravel(x)))
    mu = idata.posterior["mu"].values[..., None].astype(np.float64)
    tau = idata.posterior["tau"].values[..., None].astype(np.float64)
    ref = json.loads(pathlib.Path(__file__).with_name("references.json").read_text())["eight_schools"]
    for x, r in ((mu, ref["mu"]), (tau, ref["tau"])):
        se = np.sqrt(x.var(ddof=1) / diagnostics.ess(x)[0] + r["mcse"][0] ** 2)
        assert abs(x.mean() - r["mean"][0]) < 4.5 * se, (x.mean(), r["mean"][0], se)
