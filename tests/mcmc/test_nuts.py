"""Autobatched recursive NUTS (`pcbatch.mcmc.nuts`).

* Differential: every chain of the autobatched sampler equals the same Python
  run chain by chain (`.reference`, the oracle) with the same keys: gradient
  counts, tree depths and divergence flags exactly, samples to float tolerance.
  The configurations are chosen so that the interesting paths are taken
  (U-turns, max depth, divergences, several leapfrogs per leaf, per-chain
  step sizes and masses, both U-turn criteria, warm-up) and the tests check
  that they were. Schedulers change the order of work, never the result.
* Statistical: on the 100-d correlated Gaussian, means and variances agree
  with the truth within Monte Carlo error (ESS-based standard errors), and the
  distribution of trajectory lengths matches BlackJAX's NUTS at the same step
  size and mass matrix (two-sample tests; BlackJAX's run is stored in
  references.json by make_references.py).
* Step-size adaptation: dual averaging equals BlackJAX's on the same
  acceptance statistics, and reaches the target acceptance from either side.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pcbatch
from pcbatch.mcmc import diagnostics, nuts, targets

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))  # the repo root: `benchmarks`
from benchmarks.common import hlo_computations  # noqa: E402


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
COV4 = _ar_cov([1.0, 3.0, 0.5, 1.5], 0.9)
COV5 = _ar_cov([1.0, 0.5, 2.0, 1.0, 0.25], 0.7)
LOGP2, LOGP4, LOGP5 = _gaussian(COV2), _gaussian(COV4), _gaussian(COV5)


def _run_both(logdensity, x0, keys, step_size, inv_mass, args=None, **options):
    """The sampler's draws (`checked`: no overflow, every chain finished) and the reference's."""
    if args is None:
        args = nuts.prepare(x0, keys, step_size, inv_mass, options["num_samples"] + options.get("num_warmup", 0))[0]
    per_step, per_mass = np.ndim(args[3]) == 1, np.ndim(args[4]) == 2
    prog = nuts.sampler(logdensity, per_chain_step_size=per_step, per_chain_mass=per_mass, **options)
    out, status = prog.checked(*args)
    assert not np.any(np.asarray(status.overflow)) and not np.any(np.asarray(status.unfinished))
    return out, prog.reference(*args), args


def _assert_same(out, ref, rtol=1e-4):
    """Integer statistics exactly; floats to `rtol` (the machine's fused XLA
    code and the op-by-op reference may round differently, and a trajectory
    amplifies that)."""
    for name in ("num_integration_steps", "num_trajectory_expansions", "is_divergent", "is_turning"):
        np.testing.assert_array_equal(np.asarray(getattr(out.info, name)),
                                      np.asarray(getattr(ref.info, name)), err_msg=name)
    for a, b, atol in ((out.position, ref.position, 1e-4), (out.logdensity, ref.logdensity, 1e-4),
                       (out.info.acceptance_rate, ref.info.acceptance_rate, 1e-5),
                       (out.info.energy, ref.info.energy, 1e-4), (out.step_size, ref.step_size, 1e-6)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol * rtol / 1e-4)


def _keys(seed, chains):
    return jax.random.split(jax.random.PRNGKey(seed), chains)


# The U-turn program on the 2-d Gaussian: `sampler`'s defaults, which is also what
# `sample` builds for these options with `leaves_per_step=2`, so the differential,
# budget and API tests below share one compiled machine (plain calls: a plain call
# raises where `checked` flags an overflow or an unfinished chain).
UTURNS_2D = dict(num_samples=4, max_tree_depth=6)
UTURNS_CHAINS = 3


def _uturns_2d_x0(chains: int = UTURNS_CHAINS):
    return jax.random.normal(jax.random.PRNGKey(1), (chains, 2))


def _uturns_2d_args(chains: int = UTURNS_CHAINS):
    return nuts.prepare(_uturns_2d_x0(chains), _keys(0, chains), 0.3, None, UTURNS_2D["num_samples"])[0]


def test_differential_2d_uturns_and_gradient_last():
    chains, n = UTURNS_CHAINS, UTURNS_2D["num_samples"]
    args = _uturns_2d_args(chains)
    last = nuts.sampler(LOGP2, **UTURNS_2D)  # the default scheduler
    assert isinstance(last.scheduler, nuts.GradientLast)
    assert last.scheduler.leaf == nuts.leaf_block(last.lowered(*args))
    out = last(*args)
    _assert_same(out, last.reference(*args))
    steps = np.asarray(out.info.num_integration_steps)
    assert out.position.shape == (chains, n, 2) and steps.shape == (chains, n) and out.step_size.shape == (chains,)
    assert np.asarray(out.info.is_turning).all()            # every trajectory stopped on a U-turn
    assert len(np.unique(steps)) >= 3                        # trajectories of different lengths ...
    assert len(np.unique(steps.sum(axis=1))) >= 2            # ... so chains desynchronize
    # Gradient-last runs the leaf block only with every unfinished chain there,
    # so it runs it as often as the chain that visits it most (each visit
    # evaluates one or two leaves; the visits do not depend on the scheduler).
    traces = last.reference_trace(*args)
    visits = [t.blocks.count(last.scheduler.leaf) for t in traces]
    trace = last.trace(*args)  # GradientLast runs the leaf block once for every chain waiting there
    assert not trace.truncated and int(np.sum(trace.blocks == last.scheduler.leaf)) == max(visits) < sum(visits)
    # sampler() sizes the stacks for max_tree_depth: the frames a chain needs (the stack
    # program's own interpreter counts them) fit, and more than 2 are needed. (A machine
    # compiled with 2 frames to see it overflow cost a NUTS compile: ~5 CPU-s.)
    depth = max(t.max_depth for t in traces)
    assert 2 < depth <= last.max_stack_depth == UTURNS_2D["max_tree_depth"] + 2, depth


@pytest.mark.matrix  # four more compiled samplers; make test covers each idea elsewhere (above, the 5-d test, test_targets)
def test_2d_uturns_under_gradient_quorum_earliest_and_one_leaf_per_step():
    args = _uturns_2d_args()
    last = nuts.sampler(LOGP2, **UTURNS_2D)
    ref = last.reference(*args)
    steps = np.asarray(ref.info.num_integration_steps)
    quorum = last.with_schedule(nuts.GradientQuorum(last.scheduler.leaf))
    out, status = quorum.checked(*args)
    assert not np.any(np.asarray(status.overflow)) and not np.any(np.asarray(status.unfinished))
    _assert_same(out, ref)
    _assert_same(last.with_schedule("earliest")(*args), ref)
    # Every block followed and masked (no conditional in a step, for GPUs): the same draws.
    every = last.with_schedule(nuts.GradientLast(last.scheduler.leaf, follow="all"))
    _assert_same(every.with_options(tuning=pcbatch.Tuning(masked_follow=True))(*args), ref)
    for bad in ("some", 1):
        with pytest.raises(pcbatch.PcbatchError, match="follow"):
            nuts.GradientLast(last.scheduler.leaf, follow=bad)
    visits = [t.blocks.count(last.scheduler.leaf) for t in last.reference_trace(*args)]
    # One leaf per step wastes no leaf: a chain visits the leaf block once per
    # gradient it needs (the pairs wasted one per transition). Its draws equal
    # the reference's in test_targets.py's logistic regression.
    single = nuts.sampler(LOGP2, leaves_per_step=1, **UTURNS_2D)
    trace = single.trace(*args)
    assert not trace.truncated and int(np.sum(trace.blocks == single.scheduler.leaf)) == steps.sum(axis=1).max()
    assert steps.sum(axis=1).max() < 2 * max(visits)


# `sample`'s options that build the U-turn program above (`schedule="auto"` is
# "gradient_last" on the CPU), shared by the budget and API tests (no compile of their own).
SAMPLE_CHAINS, SAMPLE_OPTIONS = UTURNS_CHAINS, dict(leaves_per_step=2, **UTURNS_2D)


def test_gradient_budget_stops_each_chain_after_its_transition_and_continues():
    chains, n, budget = SAMPLE_CHAINS, SAMPLE_OPTIONS["num_samples"], 12
    x0 = _uturns_2d_x0(chains)
    options = dict(step_size=0.3, **SAMPLE_OPTIONS)
    assert nuts.sampler(LOGP2, **UTURNS_2D) is nuts.sampler(LOGP2, leaves_per_step=2, **UTURNS_2D)
    full = nuts.sample(LOGP2, x0, _keys(0, chains), **options)
    np.testing.assert_array_equal(np.asarray(full.num_draws), [n] * chains)
    out = nuts.sample(LOGP2, x0, _keys(0, chains), gradient_budget=budget, **options)
    # Each chain stops after the transition in which its gradients reach the
    # budget (same keys: the same chain as without one, cut short).
    full_steps, full_position = np.asarray(full.info.num_integration_steps), np.asarray(full.position)
    spent = np.cumsum(full_steps, axis=1)
    want = np.where((spent >= budget).any(axis=1), np.argmax(spent >= budget, axis=1) + 1, n)
    draws = np.asarray(out.num_draws)
    np.testing.assert_array_equal(draws, want)
    assert len(np.unique(draws)) > 1 and draws.max() < n          # chains stopped at different draws
    # NumPy arrays: slicing a JAX array compiles a kernel per slice shape.
    position, logdensity = np.asarray(out.position), np.asarray(out.logdensity)
    steps, last_position = np.asarray(out.info.num_integration_steps), np.asarray(out.last_position)
    for c, k in enumerate(draws):
        np.testing.assert_allclose(position[c, :k], full_position[c, :k], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(steps[c, :k], full_steps[c, :k])
        assert np.isnan(position[c, k:]).all() and np.isnan(logdensity[c, k:]).all()
        np.testing.assert_array_equal(last_position[c], position[c, k - 1])
    assert out.equal_length().position.shape == (chains, draws.min(), 2)
    assert draws.min() < 4   # R-hat needs 4 draws a chain: the error says what to do
    with pytest.raises(ValueError, match="gradient_budget"):
        out.summary()
    # The next call continues every chain from its last draw.
    more = nuts.sample(LOGP2, out.last_position, _keys(1, chains), gradient_budget=budget, **options)
    assert np.isfinite(np.asarray(more.position[:, 0])).all() and (np.asarray(more.num_draws) >= 1).all()
    with pytest.raises(ValueError, match="warm-up"):
        nuts.sample(LOGP2, x0, _keys(0, chains), num_warmup=5, gradient_budget=budget, **options)
    with pytest.raises(ValueError, match="gradient_budget"):
        nuts.sample(LOGP2, x0, _keys(0, chains), gradient_budget=0, **options)


def test_leaves_per_step_auto_follows_the_gradient_cost():
    rng = np.random.default_rng(0)

    def quadratic(dim):  # a gradient of ~4 dim^2 flops
        a = jnp.asarray(rng.standard_normal((dim, dim)) / dim, jnp.float32)
        return lambda x: -0.5 * jnp.sum((a @ x) ** 2)

    expensive, medium = quadratic(1000), quadratic(300)   # ~4 Mflop, ~0.36 Mflop
    assert nuts.auto_leaves_per_step(expensive, jnp.zeros((1, 1000))) == 1
    assert nuts.auto_leaves_per_step(expensive, jnp.zeros((128, 1000))) == 1
    # The step's fixed cost is shared by the chains: worth a leaf only with many of them.
    assert nuts.auto_leaves_per_step(medium, jnp.zeros((1, 300))) == 2
    assert nuts.auto_leaves_per_step(medium, jnp.zeros((128, 300))) == 1
    assert nuts.auto_leaves_per_step(LOGP2, jnp.zeros((128, 2))) == 2
    # A nearly free gradient and few chains: the step's fixed cost is all, four leaves a step.
    def isotropic(x):  # ~3 flops a coordinate
        return -0.5 * jnp.sum(x * x)
    assert nuts.auto_leaves_per_step(LOGP2, jnp.zeros((16, 2))) == 4
    assert nuts.auto_leaves_per_step(isotropic, jnp.zeros((16, 50))) == 4
    assert nuts.auto_leaves_per_step(isotropic, jnp.zeros((64, 50))) == 2   # many coordinates: wasted leaves cost
    assert nuts.auto_leaves_per_step(_gaussian(np.eye(100)), jnp.zeros((16, 100))) == 2  # ~40 kflop: not free
    with pytest.raises(ValueError, match="leaves_per_step"):
        nuts.sampler(LOGP2, num_samples=2, leaves_per_step=3)


def test_schedule_auto_follows_every_block_on_accelerators_with_cheap_gradients(monkeypatch):
    """On the CPU "gradient_last"; where `jax.default_backend()` is an
    accelerator, "gradient_last_all" while a gradient step of every chain costs
    at most `ALL_BLOCKS_FLOPS`; and `sample` runs the schedule it names."""
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.standard_normal((1000, 1000)) / 1000, jnp.float32)
    expensive = lambda x: -0.5 * jnp.sum((a @ x) ** 2)   # ~4 Mflop a gradient
    assert nuts.auto_schedule(LOGP2, jnp.zeros((128, 2))) == "gradient_last"   # this test runs on the CPU
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert nuts.auto_schedule(LOGP2, jnp.zeros((128, 2))) == "gradient_last_all"
    assert nuts.auto_schedule(expensive, jnp.zeros((8, 1000))) == "gradient_last_all"   # 32 Mflop a step
    assert nuts.auto_schedule(expensive, jnp.zeros((128, 1000))) == "gradient_last"     # 512 Mflop a step
    prog = nuts.sampler(LOGP2, num_samples=2, schedule="gradient_last_all")
    assert prog.scheduler.follows == "all"


def _hashing_vector_kernels(hlo: str) -> list[str]:
    """The fused kernels of optimized HLO that write a float `[chains, dim]`
    array and evaluate a threefry round (a u32 xor) on the way."""
    found = []
    for name, lines in hlo_computations(hlo).items():
        root = next((re.match(r"ROOT \S+ = (\S+) ", ln) for ln in lines if ln.startswith("ROOT ")), None)
        if (name.startswith("fused") and root and re.match(r"f(16|32|64)\[\d+,\d+", root.group(1))
                and any(re.search(r" u32\[[^\]]*\]\{[^}]*\} xor\(", ln) for ln in lines)):
            found.append(name)
    return found


# The 5-d program, one compiled machine for what were two (a 5-d and a 3-d divergence
# program, ~6 CPU-s a compile): several leapfrogs per leaf, a step size and a mass
# matrix per chain (chains of very different trajectory lengths), four leaves per step,
# NumPyro's U-turn criterion and a low divergence threshold, run under GradientQuorum:
# make test's only test of that scheduler and of four leaves per step (the default
# GradientLast and two leaves per step run the 2-d and warm-up programs here, and this
# one in the matrix). Small steps reach max_tree_depth, middle ones U-turn, the largest
# diverge; each case is asserted.
LEAPFROGS_5D = dict(num_samples=2, max_tree_depth=4, leapfrogs_per_leaf=4, leaves_per_step=4,
                    max_delta_energy=5.0, uturn_criterion="numpyro")


def _leapfrogs_5d_args():
    steps = [0.02, 0.05, 0.1, 0.2, 0.6, 1.2]
    chains = len(steps)
    x0 = jax.random.normal(jax.random.PRNGKey(2), (chains, 5))
    scale = jnp.abs(jax.random.normal(jax.random.PRNGKey(5), (chains, 5))) + 0.5
    inv_mass = jnp.asarray(np.diag(COV5), jnp.float32) * scale   # per chain
    return nuts.prepare(x0, _keys(3, chains), jnp.asarray(steps), inv_mass, LEAPFROGS_5D["num_samples"])[0]


def _check_leapfrogs_5d(out, ref):
    _assert_same(out, ref)
    steps = np.asarray(out.info.num_integration_steps)
    assert np.all(steps % 4 == 0)
    depth = np.asarray(out.info.num_trajectory_expansions)
    div, turning = np.asarray(out.info.is_divergent), np.asarray(out.info.is_turning)
    at_limit = ~turning & ~div
    assert at_limit.any() and turning.any() and div.any()    # some hit max_tree_depth, some U-turn, some diverge
    assert np.all(steps[at_limit] == 4 * 15) and np.all(depth[at_limit] == 4)   # 1 + 2 + 4 + 8 leaves
    assert np.all(depth <= 4)
    assert not turning[div].any()


def test_differential_5d_leapfrogs_per_leaf_per_chain_step_and_mass_divergences_under_gradient_quorum():
    out, ref, _ = _run_both(LOGP5, None, None, None, None, args=_leapfrogs_5d_args(),
                            schedule="gradient_quorum", **LEAPFROGS_5D)
    assert isinstance(nuts.sampler(LOGP5, per_chain_step_size=True, per_chain_mass=True, schedule="gradient_quorum",
                                   **LEAPFROGS_5D).scheduler, nuts.GradientQuorum)
    _check_leapfrogs_5d(out, ref)


@pytest.mark.matrix  # the GradientLast cell of the 5-d program (make test: GradientQuorum, above)
def test_differential_5d_leapfrogs_per_leaf_under_gradient_last():
    out, ref, _ = _run_both(LOGP5, None, None, None, None, args=_leapfrogs_5d_args(), **LEAPFROGS_5D)
    _check_leapfrogs_5d(out, ref)


@pytest.mark.matrix  # the two-leaf cell of the 5-d program (make test: four leaves, above)
def test_differential_5d_leapfrogs_per_leaf_two_leaves_per_step():
    out, ref, _ = _run_both(LOGP5, None, None, None, None, args=_leapfrogs_5d_args(),
                            **dict(LEAPFROGS_5D, leaves_per_step=2))
    _check_leapfrogs_5d(out, ref)


def test_random_draws_are_hashed_once_per_chain_not_per_coordinate():
    # XLA fuses a chain's random flag into each [chains, dim] select that reads
    # it and recomputes the hash there per element (`trajectory.per_chain`).
    # The HLO of the 5-d test's machine, compiled once: lowering its runner
    # again reuses the executable JAX keeps for these arguments.
    args = _leapfrogs_5d_args()
    prog = nuts.sampler(LOGP5, per_chain_step_size=True, per_chain_mass=True, schedule="gradient_quorum",
                        **LEAPFROGS_5D)
    out, status = prog.checked(*args)
    assert not np.any(np.asarray(status.overflow)) and not np.any(np.asarray(status.unfinished))
    exe, inputs = prog.executable(*args)
    hlo = exe.runner.lower(inputs, exe.new_workspace()).compile().as_text()
    assert " xor(" in hlo  # the hashes are in the machine ...
    assert _hashing_vector_kernels(hlo) == []  # ... and none in a per-coordinate kernel


# A cell of (adaptation x dtype): make test runs step-size warm-up against the reference
# under x64 (test_nuts_inputs.py, step sizes compared too), float32 warm-up under window
# adaptation (test_adaptation.py), and the adapted step from too large a start
# (test_warmup_reaches_target_acceptance_from_either_side below).
@pytest.mark.matrix
def test_differential_warmup():
    chains = 3
    x0 = jax.random.normal(jax.random.PRNGKey(7), (chains, 4))
    out, ref, _ = _run_both(LOGP4, x0, _keys(8, chains), 1.5, jnp.asarray(np.diag(COV4), jnp.float32),
                            num_samples=3, num_warmup=5, max_tree_depth=6)
    # Adapted step sizes differ in the last bits (exp, sqrt), which the
    # trajectories amplify: floats to 1e-2, trajectory lengths exactly.
    _assert_same(out, ref, rtol=1e-2)
    assert out.position.shape == (chains, 3, 4)
    assert np.all(np.asarray(out.step_size) < 1.5)            # adapted down from a step that is too large


def test_dual_averaging_equals_blackjax_and_the_paper():
    """The iterates equal BlackJAX's; the average follows Hoffman & Gelman's
    Algorithm 5 and Stan (BlackJAX averages the previous iterate instead)."""
    step_size = pytest.importorskip("blackjax.adaptation.step_size")
    init, update, _ = step_size.dual_averaging_adaptation(target=0.8)
    accepts = np.random.default_rng(0).uniform(0.3, 1.0, 40).astype(np.float32)
    theirs, ours = init(0.7), nuts._adaptation_start(0.7, jnp.float32)
    mu, h_avg, log_avg = np.log(7.0), 0.0, 0.0               # the paper's recursion, in float64
    for i, a in enumerate(accepts):
        ours = nuts._adapt(ours, jnp.int32(i), a, len(accepts), 0.8)
        theirs = update(theirs, a)
        t = i + 1
        h_avg = (1 - 1 / (t + 10)) * h_avg + (0.8 - float(a)) / (t + 10)
        log_step = mu - np.sqrt(t) / 0.05 * h_avg
        log_avg = t ** -0.75 * log_step + (1 - t ** -0.75) * log_avg
        np.testing.assert_allclose(ours.log_step, theirs.log_step_size, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ours.log_step_avg, log_avg, rtol=1e-4, atol=1e-5)
        if t < len(accepts):  # the step size the next transition uses
            np.testing.assert_allclose(ours.step_size, np.exp(log_step), rtol=1e-4)
    np.testing.assert_allclose(ours.step_size, np.exp(log_avg), rtol=1e-4)  # after warm-up: the average
    later = nuts._adapt(ours, jnp.int32(len(accepts)), 0.1, len(accepts), 0.8)
    assert later.step_size == ours.step_size                 # kept after warm-up


def test_warmup_reaches_target_acceptance_from_either_side():
    chains = 8
    x0 = jnp.asarray(np.random.default_rng(0).standard_normal((chains, 4)) @ np.linalg.cholesky(COV4).T,
                     jnp.float32)
    inv_mass = jnp.asarray(np.diag(COV4), jnp.float32)
    steps = []
    for init in (0.02, 2.0):
        out = nuts.sample(LOGP4, x0, _keys(3, chains), step_size=init, inverse_mass_matrix=inv_mass,
                          num_warmup=200, num_samples=100, target_accept=0.8)
        accept = np.asarray(out.info.acceptance_rate).mean()
        assert 0.7 < accept < 0.95, accept   # dual averaging's average step lands a bit above the target
        steps.append(np.asarray(out.step_size))
    np.testing.assert_allclose(steps[0], steps[1], rtol=0.25)


def test_sample_api_and_errors():
    chains, n = SAMPLE_CHAINS, SAMPLE_OPTIONS["num_samples"]
    keys = jax.random.key(0)
    typed = jax.random.split(keys, chains)
    out = nuts.sample(LOGP2, jnp.zeros((chains, 2)), typed, step_size=0.4, **SAMPLE_OPTIONS)
    again = nuts.sample(LOGP2, jnp.zeros((chains, 2)), jax.random.key_data(typed), step_size=0.4,
                        **SAMPLE_OPTIONS)
    np.testing.assert_array_equal(np.asarray(out.position), np.asarray(again.position))
    assert out.info.acceptance_rate.shape == (chains, n)
    assert np.all((np.asarray(out.info.acceptance_rate) >= 0) & (np.asarray(out.info.acceptance_rate) <= 1))
    np.testing.assert_array_equal(np.asarray(out.step_size), np.float32(0.4))  # no warm-up: unchanged
    assert nuts.sampler(LOGP2, num_samples=4, max_tree_depth=5) is nuts.sampler(LOGP2, num_samples=4,
                                                                              max_tree_depth=5)
    with pytest.raises(ValueError, match="initial_positions"):
        nuts.sample(LOGP2, jnp.zeros(2), typed, step_size=0.4, num_samples=2)
    with pytest.raises(ValueError, match="keys"):
        nuts.sample(LOGP2, jnp.zeros((2, 2)), typed, step_size=0.4, num_samples=2)
    with pytest.raises(ValueError, match="inverse_mass_matrix"):
        nuts.sample(LOGP2, jnp.zeros((chains, 2)), typed, step_size=0.4, inverse_mass_matrix=jnp.eye(2) * 2,
                    num_samples=2)
    with pytest.raises(ValueError, match="uturn_criterion"):
        nuts.sampler(LOGP2, num_samples=2, uturn_criterion="nope")
    with pytest.raises(ValueError, match="target_accept"):
        nuts.sampler(LOGP2, num_samples=2, num_warmup=2, target_accept=1.5)
    with pytest.raises(ValueError, match="quorum"):
        nuts.GradientQuorum(3, quorum=0.0)


# --------------------------------------------------------------------------
# statistical: the 100-d correlated Gaussian
# --------------------------------------------------------------------------

GAUSS = targets.correlated_gaussian(100)
STEP, CHAINS, SAMPLES = 0.25, 32, 150


# BlackJAX's trajectory lengths at the same settings (tests/mcmc/make_references.py, run
# once: its compile and run cost this file ~6 CPU-s): gradients and depth per transition.
BLACKJAX_GAUSSIAN = json.loads(pathlib.Path(__file__).with_name("references.json").read_text())[
    "gaussian_100d_trajectories"]


@pytest.fixture(scope="module")
def gaussian_runs():
    """pcbatch on the 100-d Gaussian, and BlackJAX's run at the same step size,
    mass matrix (identity), depth limit and (NumPyro/BlackJAX) U-turn criterion,
    chains started at exact draws (so there is no burn-in)."""
    theirs = BLACKJAX_GAUSSIAN
    assert (theirs["step_size"], theirs["chains"], theirs["samples"], theirs["max_doublings"]) == (
        STEP, CHAINS, SAMPLES, 8), "settings changed: python tests/mcmc/make_references.py gaussian"
    x0 = GAUSS.draws(CHAINS, seed=11)
    ours = nuts.sample(GAUSS.logdensity, x0, _keys(12, CHAINS), step_size=STEP, num_samples=SAMPLES,
                       max_tree_depth=8, uturn_criterion="numpyro")
    steps, depths = (np.repeat(theirs[k]["values"], theirs[k]["counts"])
                     for k in ("num_integration_steps", "num_trajectory_expansions"))
    return ours, steps, depths   # BlackJAX's: every transition, flat


def test_gaussian_100d_moments_within_monte_carlo_error(gaussian_runs):
    out = gaussian_runs[0]
    xs = np.asarray(out.position, np.float64)                 # [chains, samples, dim]
    assert not np.asarray(out.info.is_divergent).any()
    summary = out.summary()
    assert summary["rhat"].max() < 1.05
    sd_true = np.sqrt(np.diag(GAUSS.cov))
    # Means: standard error sd / sqrt(ESS) per coordinate.
    se = sd_true / np.sqrt(summary["ess"])
    assert np.all(se < 0.1 * sd_true)                         # the test has power
    z = xs.mean(axis=(0, 1)) / se
    assert np.abs(z).max() < 5 and np.sum(z ** 2) < 160, (np.abs(z).max(), np.sum(z ** 2))  # chi2(100): p ~ 1e-4
    # Variances: the mean of x^2 (the mean is known, 0), with its own ESS.
    sq = xs ** 2
    se_var = sq.std(axis=(0, 1), ddof=1) / np.sqrt(diagnostics.ess(sq))
    z_var = (sq.mean(axis=(0, 1)) - np.diag(GAUSS.cov)) / se_var
    assert np.abs(z_var).max() < 5 and np.sum(z_var ** 2) < 160, (np.abs(z_var).max(), np.sum(z_var ** 2))
    # A covariance: along the leading eigenvector the variance is the largest eigenvalue.
    w, v = np.linalg.eigh(GAUSS.cov)
    proj = (xs @ v[:, -1]) ** 2
    se_proj = proj.std(ddof=1) / np.sqrt(diagnostics.ess(proj[..., None])[0])
    assert abs(proj.mean() - w[-1]) < 5 * se_proj


def test_gaussian_100d_trajectory_lengths_match_blackjax(gaussian_runs):
    stats = pytest.importorskip("scipy.stats")
    out, their_steps, their_depths = gaussian_runs
    our_steps = np.asarray(out.info.num_integration_steps)
    our_depths = np.asarray(out.info.num_trajectory_expansions)
    # Tree depths: chi-square on the contingency table (rare depths pooled).
    values = np.union1d(our_depths, their_depths)
    table = np.asarray([[np.sum(d == v) for v in values] for d in (our_depths, their_depths)])
    keep = table.sum(axis=0) >= 10
    table = np.concatenate([table[:, keep], table[:, ~keep].sum(axis=1, keepdims=True)], axis=1)
    table = table[:, table.sum(axis=0) > 0]
    _, p_depth, _, _ = stats.chi2_contingency(table)
    # Integration steps (gradients per transition): Kolmogorov-Smirnov.
    p_steps = stats.ks_2samp(our_steps.ravel(), their_steps.ravel()).pvalue
    assert p_depth > 1e-3 and p_steps > 1e-3, (table, p_depth, p_steps)
    assert abs(our_steps.mean() / their_steps.mean() - 1) < 0.05
