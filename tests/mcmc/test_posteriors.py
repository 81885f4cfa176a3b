"""NUTS with window adaptation on posteriors with known answers, all offline.

Each posterior is checked within Monte-Carlo error against numbers that do
not come from pcbatch's sampler: analytic moments (Neal's funnel, the
Student-t) or long BlackJAX runs (eight schools, logistic regression on
scikit-learn's breast-cancer data; tests/mcmc/references.json, made by
tests/mcmc/make_references.py). The z-scores combine our standard error
(sd / sqrt(ESS)) with the reference's. Fixed seeds; the default sizes run in
seconds, the `slow` versions are ten times longer and held to the same bound.
"""
from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pcbatch.mcmc import diagnostics, nuts, targets

REFS = json.loads(pathlib.Path(__file__).with_name("references.json").read_text())
Z = 4.5          # |z| bound per quantity: a few dozen quantities per test, p ~ 1e-4 overall


def _run(target, seed, warmup, samples, chains=4, **kw):
    out = nuts.sample(target.logdensity, jnp.zeros(target.dim), jax.random.PRNGKey(seed), num_chains=chains,
                      num_warmup=warmup, num_samples=samples, adaptation="window", **kw)
    assert np.asarray(out.position).shape == (chains, samples, target.dim)
    return out


def _z_mean(x, ref_mean, ref_se=0.0):
    """z-scores of the means of x [chains, draws, k] against the reference."""
    ess = diagnostics.ess(x)
    se = np.sqrt(x.var(axis=(0, 1), ddof=1) / ess + np.square(ref_se))
    return (x.mean(axis=(0, 1)) - np.asarray(ref_mean)) / se


def _check_against(x, ref, what):
    """Means and standard deviations, as z-scores. The sd's standard error
    comes from the squared deviations (their variance and ESS), not from the
    normal-theory sd / sqrt(2 ESS), which is too small for skewed or
    heavy-tailed marginals such as eight schools' log tau; the reference's
    own error is the same with its ESS, (sd / mcse)^2."""
    z = _z_mean(x, ref["mean"], ref["mcse"])
    assert np.abs(z).max() < Z, (what, z)
    sd = x.std(axis=(0, 1), ddof=1)
    sq = (x - x.mean(axis=(0, 1))) ** 2
    var_sq = sq.var(axis=(0, 1), ddof=1)
    ess_ref = np.square(np.asarray(ref["sd"]) / np.asarray(ref["mcse"]))
    se_sd = np.sqrt(var_sq / diagnostics.ess(sq) + var_sq / ess_ref) / (2 * sd)
    z_sd = (sd - np.asarray(ref["sd"])) / se_sd
    assert np.abs(z_sd).max() < Z, (what, sd, ref["sd"], z_sd)


def _eight_schools(warmup, samples, out=None):
    out = _run(targets.eight_schools(), 0, warmup, samples) if out is None else out
    assert out.summary()["rhat"].max() < 1.05
    assert out.divergences.sum() <= 0.01 * out.position.shape[0] * samples   # non-centered: (almost) none
    xs = jnp.asarray(out.position)
    named = jax.vmap(jax.vmap(targets.eight_schools_unravel))(xs)
    ref = REFS["eight_schools"]
    for name in ("mu", "tau", "theta"):
        x = np.asarray(named[name], np.float64).reshape(xs.shape[0], xs.shape[1], -1)
        _check_against(x, ref[name], name)
    _check_against(np.asarray(xs[:, :, 1:2], np.float64), ref["log_tau"], "log_tau")


@pytest.fixture(scope="module")
def eight_schools_out():
    """One run for the posterior check and the API test (`divergences`, `to_arviz`)."""
    return _run(targets.eight_schools(), 0, 300, 500)


def test_eight_schools_noncentered_matches_blackjax(eight_schools_out):
    _eight_schools(300, 500, eight_schools_out)


def test_result_divergences_and_arviz(eight_schools_out):
    out = eight_schools_out
    np.testing.assert_array_equal(out.divergences, np.asarray(out.info.is_divergent).sum(axis=1))
    assert out.divergences.shape == (4,) and out.inverse_mass_matrix.shape == (4, 10)
    az = pytest.importorskip("arviz")
    idata = out.to_arviz(targets.eight_schools_unravel, dims={"theta": ["school"], "theta_tilde": ["school"]})
    assert idata.posterior["theta"].shape == (4, 500, 8) and idata.posterior["mu"].shape == (4, 500)
    np.testing.assert_allclose(idata.posterior["mu"].values, np.asarray(out.position)[:, :, 0])
    np.testing.assert_array_equal(idata.sample_stats["diverging"].values, np.asarray(out.info.is_divergent))
    assert int(idata.sample_stats["diverging"].sum()) == out.divergences.sum()
    summary = az.summary(idata, var_names=["mu", "tau"])
    assert list(summary.index) == ["mu", "tau"] and (summary["r_hat"] < 1.05).all()
    plain = out.to_inference_data()
    assert plain.posterior["x"].shape == (4, 500, 10)


@pytest.mark.slow
def test_eight_schools_noncentered_matches_blackjax_long():
    _eight_schools(1000, 5000)


def _funnel(warmup, samples):
    t = targets.funnel(dim=5, scale=1.5)
    out = _run(t, 1, warmup, samples)
    xs = np.asarray(out.position, np.float64)
    v, x = xs[..., :1], xs[..., 1:]
    assert out.divergences.sum() <= 0.01 * xs.shape[0] * samples
    # v ~ N(0, 1.5^2): its mean and second moment; E[x_i] = 0, E[x_i^2] = exp(1.5^2 / 2).
    assert abs(_z_mean(v, [0.0])[0]) < Z
    assert abs(_z_mean(v ** 2, [1.5 ** 2])[0]) < Z
    assert np.abs(_z_mean(x, np.zeros(4))).max() < Z
    assert np.abs(_z_mean(x ** 2, np.full(4, np.exp(1.5 ** 2 / 2)))).max() < Z
    assert np.all(diagnostics.ess(v) > 100)                  # the test has power in v


def test_funnel_analytic_marginals():
    _funnel(400, 1000)


@pytest.mark.slow
def test_funnel_analytic_marginals_long():
    _funnel(1000, 10_000)


def _student_t(warmup, samples):
    stats = pytest.importorskip("scipy.stats")
    df, dim = 5.0, 50
    out = _run(targets.student_t(dim, df), 2, warmup, samples)
    xs = np.asarray(out.position, np.float64)
    assert out.summary()["rhat"].max() < 1.05
    assert np.abs(_z_mean(xs, np.zeros(dim))).max() < Z
    # Bounded statistics of the marginals (x^2 has no finite variance... of its own variance at df=5):
    # P(|x_i| < 1) for every coordinate, and |x|^2 / dim ~ F(dim, df) through P(below its median) = 1/2.
    inside = (np.abs(xs) < 1.0).astype(np.float64)
    assert np.abs(_z_mean(inside, np.full(dim, 2 * stats.t.cdf(1.0, df) - 1))).max() < Z
    below = (np.sum(xs ** 2, axis=-1, keepdims=True) / dim < stats.f.median(dim, df)).astype(np.float64)
    assert abs(_z_mean(below, [0.5])[0]) < Z
    # The adapted inverse mass matrix is near the marginal variance df / (df - 2) (a loose check: windows are short).
    np.testing.assert_allclose(np.asarray(out.inverse_mass_matrix).mean(), df / (df - 2), rtol=0.3)


def test_student_t_50d_analytic():
    _student_t(300, 400)


@pytest.mark.slow
def test_student_t_50d_analytic_long():
    _student_t(1000, 4000)


def _logistic(warmup, samples):
    pytest.importorskip("sklearn")
    out = _run(targets.breast_cancer_logistic(), 3, warmup, samples)
    assert out.summary()["rhat"].max() < 1.05 and out.divergences.sum() == 0
    _check_against(np.asarray(out.position, np.float64), REFS["breast_cancer_logistic"]["w"], "w")


def test_breast_cancer_logistic_regression_matches_blackjax():
    _logistic(200, 300)


@pytest.mark.slow
def test_breast_cancer_logistic_regression_matches_blackjax_long():
    _logistic(1000, 4000)
