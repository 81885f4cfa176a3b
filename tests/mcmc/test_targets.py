"""The samplers' test problems (`pcbatch.mcmc.targets`)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from pcbatch.mcmc import nuts, targets


def test_logistic_regression_density_and_gradient():
    t = targets.logistic_regression(num_regressors=5, num_points=200, seed=1, prior_scale=2.0)
    assert t is targets.logistic_regression(num_regressors=5, num_points=200, seed=1, prior_scale=2.0)  # cached
    X, y = t.data["features"].astype(np.float64), t.data["signs"].astype(np.float64)
    assert X.shape == (200, 5) and set(np.unique(y)) == {-1.0, 1.0} and t.mean is None
    w = np.random.default_rng(0).standard_normal(5)
    z = y * (X @ w)
    logp = -np.sum(np.log1p(np.exp(-z))) - 0.5 * w @ w / 4.0
    grad = X.T @ (y / (1.0 + np.exp(z))) - w / 4.0
    value, g = jax.value_and_grad(t.logdensity)(jnp.asarray(w, jnp.float32))
    np.testing.assert_allclose(float(value), logp, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(g), grad, rtol=1e-4, atol=1e-4)


def test_nuts_on_logistic_regression_equals_reference():
    # The log density closes over a data matrix: the machine carries it as a constant.
    t = targets.logistic_regression(num_regressors=4, num_points=100)
    chains = 3
    x0 = 0.1 * jax.random.normal(jax.random.PRNGKey(0), (chains, t.dim))
    args = nuts.prepare(x0, jax.random.split(jax.random.PRNGKey(1), chains), 0.3, None, 4)[0]
    # One leaf per step (`leaves_per_step`, what `sample` picks for an expensive regression).
    prog = nuts.sampler(t.logdensity, num_samples=4, max_tree_depth=5, leaves_per_step=1)
    out, ref = prog(*args), prog.reference(*args)
    np.testing.assert_array_equal(np.asarray(out.info.num_integration_steps),
                                  np.asarray(ref.info.num_integration_steps))
    np.testing.assert_allclose(np.asarray(out.position), np.asarray(ref.position), rtol=1e-4, atol=1e-4)
    assert np.asarray(out.info.num_integration_steps).min() >= 1
