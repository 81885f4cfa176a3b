"""Useful gradient evaluations per second of NUTS across many chains (issues 7 and 18).

    pip install -e '.[bench]'          # BlackJAX, NumPyro, matplotlib
    pip install -e '.[bench,bench-tfp]' # and TensorFlow Probability's autobatched NUTS
    python -m benchmarks.nuts          # both targets, 1, 16, 128, 1024 chains (10-15 minutes on 2 CPU cores)
    python -m benchmarks.nuts --targets gaussian --chains 16,128 --samples 10 --repeats 2
    python -m benchmarks.nuts --variants quorum,4   # also pcbatch's other configurations
    python -m benchmarks.nuts --targets student_t,eight_schools,funnel,funnel_centered --chains 16,128 --peers blackjax

Targets (`pcbatch.mcmc.targets`, Radul et al. 2020, section 4): (a) the 100-d
correlated Gaussian (a fixed random rotation of variances log-spaced in
[0.1, 1]), chains started from exact draws; (b) Bayesian logistic regression,
100 regressors and 10,000 synthetic points, chains started from draws of the
posterior's Laplace approximation (near stationarity, so no warm-up is needed
in the timed calls). Issue 18's: (c) a 50-d Student-t with 3 degrees of
freedom, from exact draws, step 0.5; (d) eight schools, non-centered, from
where 100 transitions of pcbatch's NUTS end, step 0.5; (e) Neal's funnel,
10-d, non-centered (the sampler sees N(0, I)), exact draws, step 0.8; (f)
the same funnel centered (scale 3), exact draws, at the small fixed step
0.1 (where chains desynchronize most: in the neck a trajectory takes 1023
steps). Fixed step size (the Gaussian 0.15; the regression 0.1, about what
dual averaging to 0.8 acceptance finds; (c)-(e) about that too), identity mass matrix,
`max_tree_depth` 10, the NumPyro/BlackJAX U-turn criterion, no adaptation.
For each number of chains it times (compilation excluded; median of
`--repeats`, each at least 0.2 s of calls, the peers round-robin) `--samples`
NUTS transitions per chain (default 10 on the Gaussian, 5 on the regression:
its gradients cost 100x more; the whole default run takes about 10 minutes
on a 2-core CPU under a load of 5-7, most of it compiling and TFP) with

* **pcbatch**: `pcbatch.mcmc.nuts` (recursive single-chain NUTS, autobatched:
  one program for all transitions, so chains desynchronize across
  trajectories), the sampler's default configuration (`schedule` and
  `leaves_per_step` as `nuts.sample`'s "auto" picks them: on the CPU
  `GradientLast`, every gradient step waits for every running chain; one
  leapfrog step per leaf).
  `--variants` adds `pcbatch/1leaf`, `pcbatch/2leaves`, `pcbatch/4leaves` and
  `pcbatch/8leaves` (`leaves_per_step` forced), `pcbatch/quorum` (`GradientQuorum`:
  a gradient step once half the running chains wait for one), `pcbatch/4` (4 leapfrogs per leaf
  as Radul et al. did: other trajectories, leaves of 4 steps of size step/4)
  `pcbatch/nofollow` (`GradientLast(follow=False)`: every control block
  between two gradient steps a VM step of its own, as before 2026-11-26),
  `pcbatch/masked` and `pcbatch/conds` (the follow blocks masked, or each
  under a `lax.cond`, whatever `Tuning.masked_follow`'s backend default),
  `pcbatch/allmasked` (`GradientLast(follow="all")`, masked: every block
  every step, no conditional; the default on accelerators where gradients are
  cheap, `nuts.auto_schedule`) and `pcbatch/last` (`GradientLast` whatever the backend);
* **blackjax**: BlackJAX's iterative NUTS, `jax.vmap` over chains, `lax.scan`
  over transitions, all in one `jax.jit`;
* **numpyro**: NumPyro's iterative NUTS kernel (`numpyro.infer.NUTS` on a
  `potential_fn`, adaptation off) vectorized over chains as
  `MCMC(..., chain_method="vectorized")` does it: `jax.vmap` of its `sample`,
  `lax.scan` over transitions, one `jax.jit`;
* **tfp**: TensorFlow Probability's program-counter autobatched NUTS
  (`tfp.experimental.mcmc.NoUTurnSampler`, Radul et al.'s) in
  `tfp.mcmc.sample_chain` under `tf.function(jit_compile=True)`. It is
  Hoffman & Gelman's Algorithm 3 (slice sampling, the original U-turn check),
  so its trajectories differ: the comparison is of gradients per second.
  Each `sample_chain` step is one trajectory of every chain, so its rate does
  not depend on the number of transitions: it runs at most `--tfp-samples`
  (default 2), as it is slow;
* **limit**: a `lax.fori_loop` over `vmap(grad(logdensity))` taking as many
  gradient steps per chain as pcbatch's average chain: no control flow.

Peers whose package is absent are skipped with a message. pcbatch, BlackJAX
and NumPyro run the same algorithm (multinomial NUTS, same step size, mass
matrix, `max_tree_depth` and U-turn criterion), so their gradient counts agree
in distribution. "Useful" gradients are those the chains' trajectories need
(`num_integration_steps`, NumPyro's `num_steps`, TFP's `leapfrogs_taken`,
summed). "Utilization" is useful / executed gradient lanes (Radul et al.,
Fig. 7): for pcbatch, executed = chains x (times the machine ran its leaf
block) x leaves per leaf block x leapfrogs per leaf, the leaf block counted
by a scheduler that reports its choices, in a separate untimed run; for the
vmapped samplers every transition runs until its slowest chain is done, so
executed = chains x sum over transitions of the longest trajectory (a lower
bound: a doubling's inner loop also waits for its slowest chain). TFP's is not
counted.

At the most chains BlackJAX ran, each target's posterior means and variances
from one call's draws are compared with BlackJAX's and with the truth where
known (the Gaussian, the Student-t, the funnels' v): the largest |z| over the
coordinates, standard errors from the spread of the chains' own estimates.

The figure (`--figure`): per target, useful gradients/s and utilization
against the number of chains.
"""
from __future__ import annotations

import argparse
import datetime
import functools
import importlib
import importlib.metadata
import logging
import os
import platform
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import fmt_rate, print_table, time_calls
import pcbatch
from pcbatch.mcmc import nuts, targets


@dataclass(frozen=True)
class Problem:
    name: str
    title: str
    target: targets.Target
    step_size: float
    samples: int          # default transitions per chain per timed call
    start: Callable[[int], np.ndarray] | None = None   # chains -> exact draws (or near-stationary points)
    truth: tuple[np.ndarray, np.ndarray] | None = None  # each coordinate's mean and variance, where known


def _student_t_draws(dim: int, df: float) -> Callable[[int], np.ndarray]:
    def draws(chains: int) -> np.ndarray:
        rng = np.random.default_rng(chains)
        return rng.standard_normal((chains, dim)) / np.sqrt(rng.chisquare(df, (chains, 1)) / df)
    return draws


def _funnel_draws(dim: int, scale: float) -> Callable[[int], np.ndarray]:
    def draws(chains: int) -> np.ndarray:
        rng = np.random.default_rng(chains)
        v = scale * rng.standard_normal((chains, 1))
        return np.concatenate([v, np.exp(v / 2) * rng.standard_normal((chains, dim - 1))], axis=1)
    return draws


def _pilot_draws(name: str) -> Callable[[int], np.ndarray]:
    """Where 100 transitions of pcbatch's NUTS from N(0, 0.25 I) end (no exact draws)."""
    def draws(chains: int) -> np.ndarray:
        p = problem(name)
        x = jnp.asarray(0.5 * np.random.default_rng(chains).standard_normal((chains, p.target.dim)), jnp.float32)
        out = nuts.sample(p.target.logdensity, x, jax.random.split(jax.random.PRNGKey(chains + 7), chains),
                          step_size=p.step_size, num_samples=100, uturn_criterion="numpyro")
        return np.asarray(out.position[:, -1])
    return draws


@functools.lru_cache(maxsize=None)
def _standard_normal(dim: int) -> targets.Target:
    """Neal's funnel non-centered: `[v, x] = [scale z0, exp(v / 2) z[1:]]` with z ~ N(0, I): the sampler sees z."""
    return targets.Target(lambda z: -0.5 * jnp.sum(z * z), dim, mean=np.zeros(dim), cov=np.eye(dim))


def problem(name: str) -> Problem:
    if name == "gaussian":
        t = targets.correlated_gaussian(100)
        return Problem(name, "100-d correlated Gaussian", t, 0.15, 10, truth=(t.mean, np.diag(t.cov)))
    if name == "logistic":
        return Problem(name, "logistic regression, 100 regressors, 10,000 points",
                       targets.logistic_regression(100, 10_000), 0.1, 5)
    if name == "student_t":   # every coordinate t(3): variance 3
        return Problem(name, "50-d Student-t, 3 degrees of freedom", targets.student_t(50, 3.0), 0.5, 10,
                       _student_t_draws(50, 3.0), (np.zeros(50), np.full(50, 3.0)))
    if name == "eight_schools":
        return Problem(name, "eight schools, non-centered", targets.eight_schools(), 0.5, 10,
                       _pilot_draws(name))
    if name == "funnel":      # the sampler's coordinates are N(0, I)
        return Problem(name, "Neal's funnel, 10-d, non-centered", _standard_normal(10), 0.8, 10,
                       lambda chains: np.random.default_rng(chains).standard_normal((chains, 10)),
                       (np.zeros(10), np.ones(10)))
    if name == "funnel_centered":   # v ~ N(0, 9); the x's have variance E[e^v] = e^4.5 (not compared)
        return Problem(name, "Neal's funnel, 10-d, centered (scale 3), small fixed step",
                       targets.funnel(10, 3.0), 0.1, 10, _funnel_draws(10, 3.0),
                       (np.zeros(1), np.full(1, 9.0)))
    raise ValueError(f"unknown target {name!r} ({', '.join(TARGET_NAMES)})")


TARGET_NAMES = ("gaussian", "logistic", "student_t", "eight_schools", "funnel", "funnel_centered")


@functools.lru_cache(maxsize=None)
def _laplace(name: str) -> tuple[np.ndarray, np.ndarray]:
    """Mode and covariance of the posterior's Laplace approximation (Newton's
    method: the log density is concave)."""
    t = problem(name).target
    grad, hess = jax.jit(jax.grad(t.logdensity)), jax.jit(jax.hessian(t.logdensity))
    at = lambda f, w: np.asarray(f(jnp.asarray(w, jnp.float32)), np.float64)
    w = np.zeros(t.dim)
    for _ in range(20):
        w = w - np.linalg.solve(at(hess, w), at(grad, w))
    return w, np.linalg.inv(-at(hess, w))


@functools.lru_cache(maxsize=None)
def _start(name: str, chains: int) -> np.ndarray:
    return np.asarray(problem(name).start(chains), np.float32)


def start_positions(p: Problem, chains: int) -> jax.Array:
    if p.start is not None:
        return jnp.asarray(_start(p.name, chains))
    if p.target.cov is not None:
        return p.target.draws(chains, seed=chains)
    mode, cov = _laplace(p.name)
    z = np.random.default_rng(chains).standard_normal((chains, p.target.dim))
    return jnp.asarray(mode + z @ np.linalg.cholesky(cov).T, jnp.float32)


@dataclass
class Run:
    fn: Callable[[], Any]      # one timed call
    useful: int                # gradient evaluations the trajectories need
    executed: int | None       # gradient lanes run (None: not counted)
    positions: np.ndarray | None = None   # one call's draws, [chains, transitions, dim]


PCBATCH_VARIANTS = {"": (1, "auto", "auto"), "quorum": (1, "gradient_quorum", "auto"),
                    "4": (4, "gradient_last", "auto"), "nofollow": (1, "gradient_last_nofollow", "auto"),
                    "1leaf": (1, "gradient_last", 1), "2leaves": (1, "gradient_last", 2),
                    "4leaves": (1, "gradient_last", 4), "8leaves": (1, "gradient_last", 8),
                    "masked": (1, "gradient_last", "auto", True), "conds": (1, "gradient_last", "auto", False),
                    "allmasked": (1, "gradient_last_all", "auto", True),
                    "last": (1, "gradient_last", "auto")}


def pcbatch_run(p: Problem, x0: jax.Array, keys: jax.Array, samples: int, depth: int, variant: str) -> Run:
    lpl, schedule, leaves, *masked = PCBATCH_VARIANTS[variant]
    if leaves == "auto":  # as `nuts.sample` chooses
        leaves = nuts.auto_leaves_per_step(p.target.logdensity, x0)
    if schedule == "auto":
        schedule = nuts.auto_schedule(p.target.logdensity, x0)
    make = functools.partial(nuts.sampler, p.target.logdensity, num_samples=samples, max_tree_depth=depth,
                             leapfrogs_per_leaf=lpl, uturn_criterion="numpyro", leaves_per_step=leaves)
    args = nuts.prepare(x0, keys, p.step_size / lpl, None, samples)[0]
    if schedule == "gradient_last_nofollow":   # each control block a step of its own (before 2026-11-26)
        schedule = nuts.GradientLast(nuts.leaf_block(make().lowered(*args)), follow=False)
    prog = make(schedule=schedule)
    if masked:   # follow blocks masked or under conditionals, whatever the backend's default
        prog = prog.with_options(tuning=pcbatch.Tuning(masked_follow=masked[0]))
    out, status = prog.checked(*args)
    if np.any(np.asarray(status.overflow)) or np.any(np.asarray(status.unfinished)):
        raise RuntimeError("pcbatch: a chain overflowed its stacks or did not finish")
    # The same run, each step's block recorded in the loop. A trace runs no
    # follow blocks (each is a step there), but GradientLast's leaf steps, and
    # the lanes in them, are the same with and without them.
    # (Each traced step runs a block for at least one lane: the blocks all lanes ran bound them.)
    trace = prog.trace(*args, steps=int(np.sum(np.asarray(status.blocks_run))))
    leaf = nuts.leaf_block(prog.lowered(*args))
    executed = int(np.sum(trace.blocks == leaf)) * x0.shape[0] * lpl * leaves   # leaves per leaf block
    # Timed as `checked` (earlier, interleaved with BlackJAX, the plain call measured 1.3-2x slower; after
    # stop 33's host-work changes `checked`, the plain call and `nuts.sample` measure within 3% of each
    # other, interleaved, at 16 and 128 chains: 2026-11-26, stop 34).
    return Run(lambda: prog.checked(*args), int(np.asarray(out.info.num_integration_steps).sum()), executed,
               np.asarray(out.position))


def _vmapped(fn: Callable[[], Any], steps: np.ndarray, positions: np.ndarray | None = None) -> Run:
    """A vmapped sampler's run from its `[transitions, chains]` gradient counts:
    each transition runs until its slowest chain is done."""
    return Run(fn, int(steps.sum()), int(steps.max(axis=1).sum()) * steps.shape[1],
               None if positions is None else np.swapaxes(positions, 0, 1))


def blackjax_run(p: Problem, x0: jax.Array, samples: int, depth: int) -> Run:
    import blackjax
    kernel = blackjax.nuts(p.target.logdensity, step_size=p.step_size,
                           inverse_mass_matrix=jnp.ones((p.target.dim,), jnp.float32), max_num_doublings=depth)

    @jax.jit
    def run(x0: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        def one(state, k):
            state, info = jax.vmap(kernel.step)(jax.random.split(k, x0.shape[0]), state)
            return state, (state.position, info.num_integration_steps)
        return jax.lax.scan(one, jax.vmap(kernel.init)(x0), jax.random.split(key, samples))[1]

    fn = lambda: run(x0, jax.random.PRNGKey(1))
    positions, steps = fn()
    return _vmapped(fn, np.asarray(steps), np.asarray(positions))


def numpyro_run(p: Problem, x0: jax.Array, samples: int, depth: int) -> Run:
    from numpyro.infer import NUTS
    logdensity = p.target.logdensity
    kernel = NUTS(potential_fn=lambda x: -logdensity(x), step_size=p.step_size,
                  inverse_mass_matrix=jnp.ones((p.target.dim,), jnp.float32), adapt_step_size=False,
                  adapt_mass_matrix=False, max_tree_depth=depth)

    @jax.jit
    def run(x0: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        # What NUTS.init does for batched keys, without rebinding the kernel's
        # sample function to its vmap (that would nest a vmap per compilation).
        keys = jax.random.split(key, x0.shape[0])
        state = jax.vmap(lambda k, x: kernel.init(k, 0, x, (), {}))(keys, x0)
        sample = jax.vmap(kernel.sample, in_axes=(0, None, None))

        def one(state, _):
            state = sample(state, (), {})
            return state, (state.z, state.num_steps)
        return jax.lax.scan(one, state, None, length=samples)[1]

    fn = lambda: run(x0, jax.random.PRNGKey(1))
    return _vmapped(fn, np.asarray(fn()[1]))


def _tf_logdensity(p: Problem, tf: Any) -> Callable:
    """The target's log density in TensorFlow, batched over chains (`[chains, dim] -> [chains]`)."""
    d = p.target.data
    if p.name not in ("gaussian", "logistic"):
        raise NotImplementedError(f"no TensorFlow log density for {p.name}")
    if p.name == "gaussian":
        prec = tf.constant(d["precision"])
        return lambda x: -0.5 * tf.reduce_sum(x * tf.linalg.matmul(x, prec), axis=-1)
    X, signs, scale = tf.constant(d["features"]), tf.constant(d["signs"]), float(d["prior_scale"])
    return lambda w: (tf.reduce_sum(tf.math.log_sigmoid(signs * tf.linalg.matmul(w, X, transpose_b=True)), axis=-1)
                      - 0.5 * tf.reduce_sum(w * w, axis=-1) / scale ** 2)


def tfp_run(p: Problem, x0: jax.Array, samples: int, depth: int) -> Run:
    import tensorflow as tf
    import tensorflow_probability as tfp
    for logger in (tf.get_logger(), logging.getLogger("absl")):   # deprecation notes from inside TFP
        logger.setLevel(logging.ERROR)
    # Its one_step takes no seed argument: the seed is the kernel's.
    kernel = tfp.experimental.mcmc.NoUTurnSampler(_tf_logdensity(p, tf), step_size=p.step_size,
                                                  max_tree_depth=depth, seed=1)

    @tf.function(jit_compile=True)
    def run(x: Any) -> Any:
        return tfp.mcmc.sample_chain(samples, x, kernel=kernel, trace_fn=lambda _, r: r.leapfrogs_taken)

    x = tf.constant(np.asarray(x0))
    fn = lambda: run(x)[1].numpy()   # .numpy() waits for the result
    taken = fn()                     # [transitions, chains], counted from the first transition
    return Run(fn, int(taken[-1].sum()), None)


def limit_run(p: Problem, x0: jax.Array, steps: int) -> Run:
    grad = jax.grad(p.target.logdensity)

    @jax.jit
    def run(x: jax.Array) -> jax.Array:
        return jax.lax.fori_loop(0, steps, lambda _, x: x + 1e-3 * jax.vmap(grad)(x), x)

    jax.block_until_ready(run(x0))   # compiled before timing, like the others
    chains = x0.shape[0]
    return Run(lambda: run(x0), steps * chains, steps * chains)


PEERS = ("blackjax", "numpyro", "tfp")
PEER_RUNS = {"blackjax": blackjax_run, "numpyro": numpyro_run, "tfp": tfp_run}
PEER_MODULES = {"blackjax": ("blackjax",), "numpyro": ("numpyro",), "tfp": ("tensorflow", "tensorflow_probability")}
PEER_DISTS = {"blackjax": ("blackjax",), "numpyro": ("numpyro",), "tfp": ("tensorflow", "tensorflow-probability")}
PEER_INSTALL = {"blackjax": "pip install -e '.[bench]'", "numpyro": "pip install -e '.[bench]'",
                "tfp": "pip install -e '.[bench-tfp]'"}


def available_peers(wanted: list[str]) -> list[str]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")   # TensorFlow's C++ warnings drown the tables
    found = []
    for peer in wanted:
        try:
            for module in PEER_MODULES[peer]:
                importlib.import_module(module)
        except ImportError as e:
            print(f"{peer}: skipped ({e.name} is not installed: {PEER_INSTALL[peer]})")
            continue
        found.append(peer)
    if found:
        print("peers: " + ", ".join(f"{d} {importlib.metadata.version(d)}" for p in found for d in PEER_DISTS[p]))
    return found


# Issues 7 and 18's targets, against pcbatch's default configuration, per
# target: (chains, peer, least ratio of useful gradients/s).
THROUGHPUT_TARGETS = {
    "gaussian": ((128, "tfp", 10.0), (128, "blackjax", 3.0), (128, "limit", 0.4), (16, "blackjax", 1.0),
                 (1, "blackjax", 0.8)),
    "logistic": ((128, "blackjax", 0.95),),
    "student_t": ((128, "blackjax", 4.0), (16, "blackjax", 1.0)),
    "eight_schools": ((128, "blackjax", 2.0), (16, "blackjax", 1.0)),
    "funnel": ((128, "blackjax", 2.0), (16, "blackjax", 1.0)),
    "funnel_centered": ((128, "blackjax", 1.0), (16, "blackjax", 1.0)),
}
UTILIZATION_TARGET = (128, 2.0)   # pcbatch's utilization over the vmapped samplers', at that many chains
Results = dict[int, dict[str, tuple[float, Run, float]]]   # chains -> name -> (useful/s, run, seconds per call)


def measure(p: Problem, chain_counts: list[int], names: list[str], peers: list[str], samples: int,
            tfp_samples: int, depth: int, repeats: int) -> Results:
    results: Results = {}
    for chains in chain_counts:
        x0 = start_positions(p, chains)
        keys = jax.random.split(jax.random.PRNGKey(chains), chains)
        runs = {f"pcbatch/{v}" if v else "pcbatch": pcbatch_run(p, x0, keys, samples, depth, v)
                for v in names}
        for peer in peers:
            if peer == "tfp" and p.name not in ("gaussian", "logistic"):
                continue   # its log density is written for those two
            runs[peer] = PEER_RUNS[peer](p, x0, min(samples, tfp_samples) if peer == "tfp" else samples, depth)
        runs["limit"] = limit_run(p, x0, max(1, runs["pcbatch"].useful // chains))
        # Each ran once above (compiled); a repeat of the short calls (few chains) lasts 0.2 s.
        times = time_calls({k: r.fn for k, r in runs.items()}, repeats, min_time=0.2, warm=True)
        results[chains] = {k: (r.useful / times[k], r, times[k]) for k, r in runs.items()}
        rates = ", ".join(f"{k} {fmt_rate(v[0])}/s" for k, v in results[chains].items())
        print(f"  {p.name}, {chains} chains: {rates}", flush=True)
    return results


def utilization(run: Run) -> float:
    return float("nan") if run.executed is None else run.useful / run.executed


def report(p: Problem, results: Results) -> list[str]:
    """Prints the tables; returns the verdict lines on the issue's targets."""
    names = list(next(iter(results.values())))
    ratios = [n for n in ("blackjax", "numpyro", "tfp", "limit") if n in names]
    print(f"\n{p.title}: useful gradient evaluations per second (utilization = useful / executed gradient lanes)")
    rows = []
    for chains, r in results.items():
        cells = [str(chains)]
        for n in names:
            u = utilization(r[n][1])
            cells.append(f"{fmt_rate(r[n][0])}/s" + ("" if u != u else f" ({100 * u:.0f}%)"))
        cells += [f"{r['pcbatch'][0] / r[n][0]:.2f}x" for n in ratios]
        rows.append(cells)
    print_table(["chains"] + names + [f"pcbatch : {n}" for n in ratios], rows)
    print("per call: median wall time, useful gradients")
    print_table(["chains"] + names, [[str(c)] + [f"{r[n][2] * 1e3:.1f} ms, {r[n][1].useful}" for n in names]
                                     for c, r in results.items()])
    verdicts = []
    for chains, peer, least in THROUGHPUT_TARGETS.get(p.name, ()):
        if chains in results and peer in results[chains]:
            ratio = results[chains]["pcbatch"][0] / results[chains][peer][0]
            verdicts.append(f"{p.name}: {chains} chains, pcbatch : {peer} = {ratio:.2f}x (target >= {least}x): "
                            + ("met" if ratio >= least else "NOT met"))
    chains, least = UTILIZATION_TARGET
    for ours in (n for n in names if n.startswith("pcbatch")):   # the variants' too, where run
        for peer in ("blackjax", "numpyro"):
            if chains in results and peer in results[chains]:
                ratio = utilization(results[chains][ours][1]) / utilization(results[chains][peer][1])
                verdicts.append(f"{p.name}: {chains} chains, utilization {ours} : {peer} = {ratio:.2f}x "
                                f"(target >= {least}x): " + ("met" if ratio >= least else "NOT met"))
    return verdicts


def _chain_moments(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Mean and variance per coordinate of `[chains, draws, dim]`, each with a
    standard error from the spread of the chains' own estimates (independent chains)."""
    chains = x.shape[0]
    m_chain = x.mean(axis=1)
    mean = m_chain.mean(axis=0)
    v_chain = ((x - mean) ** 2).mean(axis=1)
    var = v_chain.mean(axis=0)
    return mean, m_chain.std(axis=0, ddof=1) / np.sqrt(chains), var, v_chain.std(axis=0, ddof=1) / np.sqrt(chains)


def agreement(p: Problem, results: Results) -> str | None:
    """Posterior means and variances of pcbatch against BlackJAX's and the
    truth (where known), as the largest |z| over the coordinates, at the most
    chains both ran: Monte-Carlo agreement is |z| of 2-3 (many coordinates), a
    bug is tens."""
    both = [c for c, r in results.items() if "blackjax" in r and r["blackjax"][1].positions is not None]
    if not both:
        return None
    chains = max(both)
    ours, theirs = results[chains]["pcbatch"][1].positions, results[chains]["blackjax"][1].positions
    k = len(p.truth[0]) if p.truth is not None else ours.shape[-1]   # the coordinates compared
    (m1, s1, v1, t1), (m2, s2, v2, t2) = (_chain_moments(np.asarray(x[..., :k], np.float64)) for x in (ours, theirs))
    z = lambda a, b, sa, sb: float(np.max(np.abs(a - b) / np.sqrt(sa ** 2 + sb ** 2)))
    line = (f"{p.name}, {chains} chains x {ours.shape[1]} draws, {k} coordinates: means |z| <= {z(m1, m2, s1, s2):.1f}, "
            f"variances |z| <= {z(v1, v2, t1, t2):.1f} (pcbatch : blackjax)")
    if p.truth is not None:
        mu, var = p.truth
        line += (f"; against the truth: pcbatch {z(m1, mu, s1, 0):.1f} / {z(v1, var, t1, 0):.1f}, "
                 f"blackjax {z(m2, mu, s2, 0):.1f} / {z(v2, var, t2, 0):.1f}")
    return line


def save_figure(path: str, measured: list[tuple[Problem, Results]]) -> None:
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no figure")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(measured), 2, figsize=(11, 4 * len(measured)), squeeze=False)
    for (p, results), (ax_rate, ax_util) in zip(measured, axes):
        chain_counts = list(results)
        for name in results[chain_counts[0]]:
            rate = [results[c][name][0] for c in chain_counts]
            ax_rate.plot(chain_counts, rate, "o-", label=name)
            util = [utilization(results[c][name][1]) for c in chain_counts]
            if name != "limit" and not all(u != u for u in util):
                ax_util.plot(chain_counts, [100 * u for u in util], "o-", label=name)
        ax_rate.set(xscale="log", yscale="log", xlabel="chains", ylabel="useful gradients / s", title=p.title)
        ax_util.set(xscale="log", ylim=(0, 105), xlabel="chains", ylabel="gradient-lane utilization (%)",
                    title=f"{p.name}: useful / executed gradient lanes")
        for ax in (ax_rate, ax_util):
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"figure saved to {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", default="gaussian,logistic", help="of " + ", ".join(TARGET_NAMES))
    ap.add_argument("--chains", default="1,16,128,1024")
    ap.add_argument("--samples", type=int, default=None,
                    help="transitions per chain per timed call (default: 10 on the Gaussian, 5 on the regression)")
    ap.add_argument("--tfp-samples", type=int, default=2,
                    help="at most this many transitions per call for TFP (its rate does not depend on it)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tree-depth", type=int, default=10)
    ap.add_argument("--peers", default=",".join(PEERS), help="of " + ", ".join(PEERS))
    ap.add_argument("--variants", default="",
                    help="pcbatch configurations besides the default: quorum, 4, nofollow, "
                         "1leaf, 2leaves, 4leaves, 8leaves, masked, conds, allmasked, last")
    ap.add_argument("--figure", default="nuts_benchmark.png", help="where to save the figure ('' for none)")
    args = ap.parse_args()
    chain_counts = [int(c) for c in args.chains.split(",")]
    variants = [""] + [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in PCBATCH_VARIANTS] + [
        p for p in args.peers.split(",") if p and p not in PEERS]
    if unknown:
        raise SystemExit(f"unknown variant or peer: {', '.join(unknown)}")
    problems = [problem(name) for name in args.targets.split(",")]
    peers = available_peers([p for p in args.peers.split(",") if p])

    print(f"NUTS: step sizes {', '.join(f'{p.name} {p.step_size}' for p in problems)}, identity mass matrix, "
          f"max tree depth {args.max_tree_depth}; median of {args.repeats}")
    print(f"{datetime.datetime.now():%Y-%m-%d %H:%M}, jax {jax.__version__} on {jax.devices()[0].platform} "
          f"({platform.processor() or platform.machine()}, {os.cpu_count()} cores), "
          f"load average {os.getloadavg()[0]:.1f}")
    measured, verdicts = [], []
    for p in problems:
        samples = args.samples or p.samples
        print(f"{p.title}: {samples} transitions per chain per call")
        measured.append((p, measure(p, chain_counts, variants, peers, samples, args.tfp_samples,
                                    args.max_tree_depth, args.repeats)))
    for p, results in measured:
        verdicts += report(p, results)
    agree = [line for p, results in measured if (line := agreement(p, results))]
    if agree:
        print("\nposterior means and variances (largest |z| over coordinates; standard errors from the chains' spread):")
        for line in agree:
            print("  " + line)
    print("\nissues 7 and 18's targets (throughput: pcbatch's default configuration):")
    for line in verdicts:
        print("  " + line)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    if args.figure:
        save_figure(args.figure, measured)


if __name__ == "__main__":
    main()
