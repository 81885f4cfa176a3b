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

__all__ = ["Target", "breast_cancer_logistic", "correlated_gaussian", "eight_schools", "eight_schools_unravel", "funnel",
           "logistic_regression", "student_t"]


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


# --------------------------------------------------------------------------
# posteriors with known answers (tests/mcmc/test_posteriors.py)
# --------------------------------------------------------------------------

# Rubin (1981): the SAT coaching effects of eight schools and their standard errors.
EIGHT_SCHOOLS_Y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0], np.float32)
EIGHT_SCHOOLS_SIGMA = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0], np.float32)


@functools.lru_cache(maxsize=None)
def eight_schools() -> Target:
    """Eight schools, non-centered: mu ~ N(0, 5), tau ~ HalfCauchy(5),
    theta_tilde ~ N(0, 1), y_j ~ N(mu + tau theta_tilde_j, sigma_j). The
    position is `[mu, log tau, theta_tilde[0..7]]` (log tau unconstrained,
    with the log-Jacobian). `unravel(x)` names them (`tau` and
    `theta = mu + tau theta_tilde` included)."""
    y, sigma = jnp.asarray(EIGHT_SCHOOLS_Y), jnp.asarray(EIGHT_SCHOOLS_SIGMA)

    def logdensity(x):
        mu, log_tau, tt = x[0], x[1], x[2:]
        tau = jnp.exp(log_tau)
        theta = mu + tau * tt
        lp = -0.5 * (mu / 5.0) ** 2 - jnp.log1p((tau / 5.0) ** 2) + log_tau   # HalfCauchy(5) + Jacobian
        lp = lp - 0.5 * jnp.sum(tt * tt)
        return lp - 0.5 * jnp.sum(((y - theta) / sigma) ** 2)

    return Target(logdensity, 10, data={"y": EIGHT_SCHOOLS_Y, "sigma": EIGHT_SCHOOLS_SIGMA})


def eight_schools_unravel(x):
    """`[mu, log tau, theta_tilde[8]]` -> named parameters (for `to_arviz`)."""
    tau = jnp.exp(x[1])
    return {"mu": x[0], "tau": tau, "theta": x[0] + tau * x[2:], "theta_tilde": x[2:]}


@functools.lru_cache(maxsize=None)
def funnel(dim: int = 5, scale: float = 1.5) -> Target:
    """Neal's funnel: v ~ N(0, scale^2), x_i | v ~ N(0, e^v), i < dim - 1;
    the position is `[v, x...]`. Marginals are known: v ~ N(0, scale^2),
    E[x_i] = 0, E[x_i^2] = E[e^v] = exp(scale^2 / 2). (Neal's scale 3 has a
    neck NUTS cannot enter without divergences; 1.5 keeps it honest.)"""

    def logdensity(z):
        v, x = z[0], z[1:]
        return -0.5 * (v / scale) ** 2 - 0.5 * jnp.sum(x * x) * jnp.exp(-v) - 0.5 * (dim - 1) * v

    return Target(logdensity, dim)


@functools.lru_cache(maxsize=None)
def student_t(dim: int = 50, df: float = 5.0) -> Target:
    """The multivariate Student-t with `df` degrees of freedom, location 0,
    scale I: every coordinate is marginally t(df) (variance df / (df - 2)),
    and |x|^2 / dim ~ F(dim, df)."""

    def logdensity(x):
        return -0.5 * (df + dim) * jnp.log1p(jnp.sum(x * x) / df)

    return Target(logdensity, dim, mean=np.zeros(dim), cov=np.eye(dim) * df / (df - 2.0))


@functools.lru_cache(maxsize=None)
def breast_cancer_logistic(prior_scale: float = 1.0) -> Target:
    """Bayesian logistic regression on scikit-learn's breast-cancer data
    (569 tumours, 30 features, shipped with scikit-learn: no download):
    features standardized, an intercept first, weights ~ N(0, prior_scale^2)."""
    from sklearn.datasets import load_breast_cancer
    data = load_breast_cancer()
    X = (data.data - data.data.mean(axis=0)) / data.data.std(axis=0)
    X = np.concatenate([np.ones((X.shape[0], 1)), X], axis=1).astype(np.float32)
    signs = np.where(data.target == 1, 1.0, -1.0).astype(np.float32)
    Xj, sj = jnp.asarray(X), jnp.asarray(signs)

    def logdensity(w):
        return jnp.sum(jax.nn.log_sigmoid(sj * (Xj @ w))) - 0.5 * jnp.sum(w * w) / prior_scale ** 2

    return Target(logdensity, X.shape[1], data={"features": X, "signs": signs,
                                               "prior_scale": np.float32(prior_scale)})
