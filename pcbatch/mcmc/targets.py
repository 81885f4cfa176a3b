"""Test targets for the samplers: the two problems of Radul et al. (2020, section 4).

    >>> from pcbatch.mcmc import targets
    >>> t = targets.correlated_gaussian(dim=3)
    >>> t.logdensity(t.mean).shape, t.cov.shape
    ((), (3, 3))

Each returns a `Target`: a `logdensity(x)` for one point (the same function
object on every call with the same arguments, so compiled samplers are reused),
its dimension, where known the exact mean and covariance, and the arrays the
log density closes over (so that a benchmark can write the same density in
another framework).
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Target", "correlated_gaussian", "logistic_regression"]


class Target(NamedTuple):
    logdensity: Callable
    dim: int
    mean: np.ndarray | None = None   # exact, where known
    cov: np.ndarray | None = None
    data: dict[str, np.ndarray] | None = None  # what `logdensity` closes over, as numpy arrays

    def draws(self, n: int, seed: int = 0) -> jax.Array:
        """`n` exact draws (Gaussian targets), e.g. to start chains at stationarity."""
        if self.cov is None:
            raise ValueError("exact draws need a Gaussian target")
        z = np.random.default_rng(seed).standard_normal((n, self.dim))
        return jnp.asarray(self.mean + z @ np.linalg.cholesky(self.cov).T, jnp.float32)


@functools.lru_cache(maxsize=None)
def correlated_gaussian(dim: int = 100, seed: int = 0, min_variance: float = 0.1,
                        max_variance: float = 1.0) -> Target:
    """N(0, Q diag(v) Q^T): a fixed random rotation Q of variances `v` log-spaced
    in [min_variance, max_variance]: every coordinate is correlated with every other."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
    cov = (q * np.logspace(np.log10(min_variance), np.log10(max_variance), dim)) @ q.T
    precision = np.linalg.inv(cov).astype(np.float32)
    prec = jnp.asarray(precision)

    def logdensity(x):
        return -0.5 * x @ (prec @ x)

    return Target(logdensity, dim, np.zeros(dim), cov, {"precision": precision})


@functools.lru_cache(maxsize=None)
def logistic_regression(num_regressors: int = 100, num_points: int = 10_000, seed: int = 0,
                        prior_scale: float = 1.0) -> Target:
    """Bayesian logistic regression on synthetic data: weights w ~ N(0,
    prior_scale^2 I) (no intercept), features ~ N(0, 1/num_regressors), labels
    ~ Bernoulli(sigmoid(X w_true)) for a w_true drawn from the prior. The
    posterior's moments are not known in closed form."""
    rng = np.random.default_rng(seed)
    features = rng.standard_normal((num_points, num_regressors)) / np.sqrt(num_regressors)
    w_true = prior_scale * rng.standard_normal(num_regressors)
    labels = rng.random(num_points) < 1.0 / (1.0 + np.exp(-features @ w_true))
    data = {"features": features.astype(np.float32), "signs": np.where(labels, 1.0, -1.0).astype(np.float32),
            "prior_scale": np.float32(prior_scale)}
    X, signs = jnp.asarray(data["features"]), jnp.asarray(data["signs"])

    def logdensity(w):
        # log sigmoid(y * x.w) summed over the data, plus the Gaussian prior.
        return jnp.sum(jax.nn.log_sigmoid(signs * (X @ w))) - 0.5 * jnp.sum(w * w) / prior_scale ** 2

    return Target(logdensity, num_regressors, data=data)
