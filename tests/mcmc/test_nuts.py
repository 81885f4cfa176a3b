"""Autobatched recursive NUTS (`pcbatch.mcmc.nuts`).

* Differential: every chain of the autobatched sampler equals the same Python
  run chain by chain (`.reference`, the oracle) with the same keys: gradient
  counts, tree depths and divergence flags exactly, samples to float tolerance.
  The configurations are chosen so that the interesting paths are taken
  (U-turns, max depth, divergences, several leapfrogs per leaf, per-chain
  step sizes) and the tests check that they were.
* Statistical: means and variances of a correlated Gaussian within Monte
  Carlo error; trajectory lengths match BlackJAX's NUTS (when installed).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pcbatch
from pcbatch.mcmc import diagnostics, nuts


def _gaussian(cov):
    prec = jnp.asarray(np.linalg.inv(cov), jnp.float32)

    def logdensity(x):
        return -0.5 * x @ prec @ x

    return logdensity


def _ar_cov(scales, rho):
    d = len(scales)
    idx = np.arange(d)
    corr = rho ** np.abs(idx[:, None] - idx[None, :])
    s = np.asarray(scales, np.float64)
    return corr * s[:, None] * s[None, :]


COV2 = _ar_cov([1.0, 2.0], 0.9)
COV3 = _ar_cov([1.0, 0.3, 2.0], 0.5)
COV5 = _ar_cov([1.0, 0.5, 2.0, 1.0, 0.25], 0.7)
LOGP2, LOGP3, LOGP5 = _gaussian(COV2), _gaussian(COV3), _gaussian(COV5)


def _run_both(logdensity, x0, keys, step_size, inv_mass, **options):
    args, per_step, per_mass = nuts.prepare(x0, keys, step_size, inv_mass)
    prog = nuts.sampler(logdensity, per_chain_step_size=per_step, per_chain_mass=per_mass, **options)
    out, status = prog.checked(*args)
    assert not np.any(np.asarray(status.overflow)) and not np.any(np.asarray(status.unfinished))
    ref = prog.reference(*args)
    return out, ref, status


def _assert_same(out, ref):
    for name in ("num_integration_steps", "num_trajectory_expansions", "is_divergent", "is_turning"):
        np.testing.assert_array_equal(np.asarray(getattr(out.info, name)),
                                      np.asarray(getattr(ref.info, name)), err_msg=name)
    np.testing.assert_allclose(np.asarray(out.position), np.asarray(ref.position), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(out.logdensity), np.asarray(ref.logdensity), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(out.info.acceptance_rate), np.asarray(ref.info.acceptance_rate),
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(out.info.energy), np.asarray(ref.info.energy), rtol=1e-4, atol=1e-4)


def _keys(seed, chains):
    return jax.random.split(jax.random.PRNGKey(seed), chains)


def test_differential_2d_uturns():
    chains = 6
    x0 = jax.random.normal(jax.random.PRNGKey(1), (chains, 2))
    out, ref, status = _run_both(LOGP2, x0, _keys(0, chains), 0.3, None, num_samples=8, max_tree_depth=6)
    _assert_same(out, ref)
    steps = np.asarray(out.info.num_integration_steps)
    assert out.position.shape == (chains, 8, 2) and steps.shape == (chains, 8)
    assert np.asarray(out.info.is_turning).all()            # every trajectory stopped on a U-turn
    assert len(np.unique(steps)) >= 3                        # trajectories of different lengths ...
    assert len(np.unique(steps.sum(axis=1))) >= 2            # ... so chains desynchronize


def test_schedules_agree_and_gradient_last_synchronizes_on_gradients():
    chains = 6
    x0 = jax.random.normal(jax.random.PRNGKey(1), (chains, 2))
    args, _, _ = nuts.prepare(x0, _keys(0, chains), 0.3, None)
    grad_last = nuts.sampler(LOGP2, num_samples=8, max_tree_depth=6)
    earliest = nuts.sampler(LOGP2, num_samples=8, max_tree_depth=6, schedule="earliest")
    assert isinstance(grad_last.scheduler, nuts.GradientLast)
    # the leaf block found from lowering alone is the one in the specialized program
    assert grad_last.scheduler.leaf == nuts.leaf_block(grad_last.lowered(*args))
    a, status_a = grad_last.checked(*args)
    b, status_b = earliest.checked(*args)
    _assert_same(a, b)
    # Gradient-last runs a leaf only with every unfinished chain there: the
    # leaf steps are at most the longest chain's leaves, far fewer than the sum.
    leaves = np.asarray(a.info.num_integration_steps).sum(axis=1)
    trace = grad_last.with_schedule(_Counting(grad_last.scheduler))
    jax.block_until_ready(trace.checked(*args))
    assert trace.scheduler.counts[grad_last.scheduler.leaf] == leaves.max()


class _Counting:
    def __init__(self, inner):
        self.inner, self.name, self.counts = inner, "count", {}

    def _record(self, block):
        self.counts[int(block)] = self.counts.get(int(block), 0) + 1

    def init(self, num_blocks, num_lanes):
        return self.inner.init(num_blocks, num_lanes)

    def choose(self, carry, frontier):
        block, carry = self.inner.choose(carry, frontier)
        jax.debug.callback(self._record, block, ordered=True)
        return block, carry


def test_differential_5d_leapfrogs_per_leaf_per_chain_step_and_max_depth():
    chains = 4
    x0 = jax.random.normal(jax.random.PRNGKey(2), (chains, 5))
    step = jnp.asarray([0.02, 0.05, 0.1, 0.2])
    inv_mass = jnp.asarray(np.diag(COV5), jnp.float32)
    out, ref, _ = _run_both(LOGP5, x0, _keys(3, chains), step, inv_mass,
                            num_samples=5, max_tree_depth=4, leapfrogs_per_leaf=4)
    _assert_same(out, ref)
    steps = np.asarray(out.info.num_integration_steps)
    assert np.all(steps % 4 == 0)
    depth = np.asarray(out.info.num_trajectory_expansions)
    assert (depth == 4).any() and (depth < 4).any()           # some hit max_tree_depth, some U-turn
    assert np.all(steps[depth == 4] == 4 * 15)                # 1 + 2 + 4 + 8 leaves


def test_differential_divergences_per_chain_mass():
    chains = 5
    x0 = jax.random.normal(jax.random.PRNGKey(4), (chains, 3))
    inv_mass = jnp.abs(jax.random.normal(jax.random.PRNGKey(5), (chains, 3))) + 0.5
    out, ref, _ = _run_both(LOGP3, x0, _keys(6, chains), 0.3, inv_mass,
                            num_samples=6, max_tree_depth=5, max_delta_energy=5.0,
                            uturn_criterion="numpyro")
    _assert_same(out, ref)
    div = np.asarray(out.info.is_divergent)
    assert div.any() and not div.all()
    assert not np.asarray(out.info.is_turning)[div].any()


def test_sample_api_and_errors():
    keys = jax.random.key(0)
    typed = jax.random.split(keys, 3)
    out = nuts.sample(LOGP2, jnp.zeros((3, 2)), typed, step_size=0.4, num_samples=4, max_tree_depth=5)
    again = nuts.sample(LOGP2, jnp.zeros((3, 2)), jax.random.key_data(typed), step_size=0.4,
                        num_samples=4, max_tree_depth=5)
    np.testing.assert_array_equal(np.asarray(out.position), np.asarray(again.position))
    assert out.info.acceptance_rate.shape == (3, 4)
    assert np.all((np.asarray(out.info.acceptance_rate) >= 0) & (np.asarray(out.info.acceptance_rate) <= 1))
    assert nuts.sampler(LOGP2, num_samples=4, max_tree_depth=5) is nuts.sampler(LOGP2, num_samples=4,
                                                                              max_tree_depth=5)
    with pytest.raises(ValueError, match="initial_positions"):
        nuts.sample(LOGP2, jnp.zeros(2), typed, step_size=0.4, num_samples=2)
    with pytest.raises(ValueError, match="keys"):
        nuts.sample(LOGP2, jnp.zeros((2, 2)), typed, step_size=0.4, num_samples=2)
    with pytest.raises(ValueError, match="inverse_mass_matrix"):
        nuts.sample(LOGP2, jnp.zeros((3, 2)), typed, step_size=0.4, inverse_mass_matrix=jnp.eye(2) * 2,
                    num_samples=2)
    with pytest.raises(ValueError, match="uturn_criterion"):
        nuts.sampler(LOGP2, num_samples=2, uturn_criterion="nope")
    # sampler() sizes the stacks for max_tree_depth; a smaller machine overflows.
    shallow = pcbatch.autobatch(nuts.sampler(LOGP2, num_samples=1, max_tree_depth=3).fn,
                                in_axes=(0, 0, None, None), max_stack_depth=2)
    with pytest.raises(pcbatch.StackOverflowError):
        shallow(*nuts.prepare(jnp.zeros((3, 2)), typed, 0.01, None)[0])


# --------------------------------------------------------------------------
# statistical
# --------------------------------------------------------------------------

COV4 = _ar_cov([1.0, 3.0, 0.5, 1.5], 0.9)
LOGP4 = _gaussian(COV4)


def test_correlated_gaussian_moments():
    chains, num_samples = 16, 250
    chol = np.linalg.cholesky(COV4)
    x0 = jnp.asarray(np.random.default_rng(0).standard_normal((chains, 4)) @ chol.T, jnp.float32)
    out = nuts.sample(LOGP4, x0, _keys(7, chains), step_size=0.25,
                      inverse_mass_matrix=jnp.asarray(np.diag(COV4), jnp.float32),
                      num_samples=num_samples, max_tree_depth=8)
    xs = np.asarray(out.position, np.float64)          # [chains, samples, dim], started at exact draws
    assert not np.asarray(out.info.is_divergent).any()
    assert np.asarray(out.info.acceptance_rate).mean() > 0.6
    assert diagnostics.rhat(xs).max() < 1.05 and diagnostics.ess(xs).min() > 500
    # Chains are independent: their means / variances give Monte Carlo errors.
    chain_means = xs.mean(axis=1)
    se = chain_means.std(axis=0, ddof=1) / np.sqrt(chains)
    assert np.all(se < 0.1 * np.sqrt(np.diag(COV4)))   # the test has power
    np.testing.assert_array_less(np.abs(chain_means.mean(axis=0)), 5 * se)
    chain_vars = xs.var(axis=1)
    se_var = chain_vars.std(axis=0, ddof=1) / np.sqrt(chains)
    np.testing.assert_array_less(np.abs(chain_vars.mean(axis=0) - np.diag(COV4)), 5 * se_var + 0.02 * np.diag(COV4))
    centered = xs - xs.mean(axis=1, keepdims=True)
    chain_cov01 = (centered[..., 0] * centered[..., 1]).mean(axis=1)
    se_cov = chain_cov01.std(ddof=1) / np.sqrt(chains)
    assert abs(chain_cov01.mean() - COV4[0, 1]) < 5 * se_cov + 0.02 * abs(COV4[0, 1])


def test_trajectory_lengths_match_blackjax():
    blackjax = pytest.importorskip("blackjax")
    stats = pytest.importorskip("scipy.stats")
    chains, num_samples, step = 16, 100, 0.3
    chol = np.linalg.cholesky(COV4)
    x0 = jnp.asarray(np.random.default_rng(1).standard_normal((chains, 4)) @ chol.T, jnp.float32)
    inv_mass = jnp.asarray(np.diag(COV4), jnp.float32)
    ours = nuts.sample(LOGP4, x0, _keys(8, chains), step_size=step, inverse_mass_matrix=inv_mass,
                       num_samples=num_samples, max_tree_depth=8, uturn_criterion="numpyro")
    kernel = blackjax.nuts(LOGP4, step_size=step, inverse_mass_matrix=inv_mass, max_num_doublings=8)

    @jax.jit
    def run(x0, key):
        def one(state, k):
            state, info = jax.vmap(kernel.step)(jax.random.split(k, chains), state)
            return state, info.num_integration_steps
        _, steps = jax.lax.scan(one, jax.vmap(kernel.init)(x0), jax.random.split(key, num_samples))
        return steps

    theirs = np.asarray(run(x0, jax.random.PRNGKey(9))).ravel()
    mine = np.asarray(ours.info.num_integration_steps).ravel()
    values = np.union1d(mine, theirs)
    table = np.asarray([[np.sum(mine == v) for v in values], [np.sum(theirs == v) for v in values]])
    table = table[:, table.sum(axis=0) >= 10]  # drop rare lengths (chi-square needs counts)
    _, pvalue, _, _ = stats.chi2_contingency(table)
    assert pvalue > 1e-3, (table, pvalue)
    assert abs(mine.mean() - theirs.mean()) < 0.1 * theirs.mean()
