"""The No-U-Turn Sampler, written for ONE chain, autobatched across chains.

This is the recursive NUTS of Hoffman & Gelman (2014) with the refinements
Stan and BlackJAX use: multinomial trajectory sampling (biased progressive
sampling between doublings, uniform within a subtree) and the generalized
no-U-turn criterion checked on every merged subtree, including Stan's two
extra checks across the seam between merged subtrees. As in Radul et al.
(2020, section 4), a leaf of the tree may take several leapfrog steps
(`leapfrogs_per_leaf`); only the last state of a leaf is a candidate.

The code below is plain single-chain Python. `run_chains` loops over
`num_samples` transitions and calls the recursive `build_tree`; pcbatch turns
both into ONE `lax.while_loop` program-counter machine over all chains, so
chains desynchronize across trajectories and the batch only ever
synchronizes on program points (the gradient block, mostly).

    >>> import jax, jax.numpy as jnp
    >>> from pcbatch.mcmc import nuts
    >>> logdensity = lambda x: -0.5 * jnp.sum(x * x)
    >>> keys = jax.random.split(jax.random.PRNGKey(0), 4)
    >>> out = nuts.sample(logdensity, jnp.zeros((4, 2)), keys, step_size=0.5,
    ...                   inverse_mass_matrix=jnp.ones(2), num_samples=10)
    >>> out.position.shape, out.info.num_integration_steps.shape
    ((4, 10, 2), (4, 10))

For a Bayesian workflow: `sample(logdensity, x0[dim], key, num_chains=4,
num_warmup=1000, num_samples=1000, adaptation="window")` adapts each chain's
step size and diagonal mass matrix on Stan's schedule (`adaptation.py`),
reports `out.divergences` and converts with `out.to_arviz()`; `progress_bar=True`
shows a tqdm bar fed by a host callback from inside the loop.

`sampler(...)` returns the `Autobatched` program itself, so that tests can
compare it with `.reference` (the same Python run chain by chain).

This module holds the program and the sampler's entry points; one chain's
arithmetic (leapfrog leaves, no-U-turn checks, merges) is `trajectory.py`,
the input checks `inputs.py`, the schedulers `schedules.py`, the progress
bar `reporting.py`.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import pcbatch
from pcbatch import threefry
from pcbatch.mcmc import adaptation as _adaptation, inputs, reporting, trajectory
from pcbatch.mcmc.inputs import index_dtype, invalid
from pcbatch.mcmc.reporting import report_intervals
from pcbatch.mcmc.schedules import GradientLast, GradientQuorum
from pcbatch.mcmc.trajectory import Subtree

__all__ = ["GradientLast", "NUTSInfo", "NUTSOutput", "sample", "sampler"]


class NUTSInfo(NamedTuple):
    """Per-transition statistics, each `[chains, num_samples]` (BlackJAX names)."""
    acceptance_rate: Any          # mean over the trajectory's leaves of min(1, exp(H0 - H))
    is_divergent: Any             # the energy error exceeded `max_delta_energy`
    is_turning: Any               # the trajectory stopped on a U-turn (not divergence/depth)
    num_trajectory_expansions: Any  # doublings, the last one included even if it was not merged (Stan's treedepth)
    num_integration_steps: Any    # gradient evaluations (leapfrog steps) this transition
    energy: Any                   # H of the starting state: -logp(x0) + K(p0)


class NUTSOutput(NamedTuple):
    """What `sample` returns: the draws after warm-up, their statistics, and
    each chain's step size and diagonal inverse mass matrix (adapted during
    warm-up, if any).

    `out.summary()` gives the mean, standard deviation, split-R-hat and
    effective sample size of each coordinate (`diagnostics.summary`);
    `out.divergences` the divergent transitions per chain; `out.to_arviz()`
    an ArviZ `InferenceData` (needs `pip install pcbatch[mcmc]`)."""
    position: Any                 # [chains, num_samples, dim]
    logdensity: Any               # [chains, num_samples]
    info: NUTSInfo
    step_size: Any                # [chains]
    inverse_mass_matrix: Any = None  # [chains, dim]
    num_draws: Any = None         # [chains]: rows filled (fewer than num_samples under a gradient budget)

    def summary(self) -> dict[str, Any]:
        """Per coordinate: `mean`, `sd`, split-`rhat` and `ess` over all chains
        (their first `min(num_draws)` draws: `equal_length`)."""
        from pcbatch.mcmc.diagnostics import summary
        position = self.equal_length().position
        if np.shape(position)[1] < 4 and np.shape(position)[1] < np.shape(self.position)[1]:
            raise invalid(f"summary needs at least 4 draws from every chain; under this call's gradient_budget "
                          f"one chain made {np.shape(position)[1]} (num_draws {np.asarray(self.num_draws).tolist()}): "
                          "continue the chains (out.last_position) and summarize the draws of several calls, "
                          "or give a larger budget")
        if np.shape(position)[1] < 4:
            raise invalid(f"summary needs at least 4 draws from every chain (split R-hat halves each chain), got "
                          f"{np.shape(position)[1]}: sample with num_samples >= 4")
        return summary(position)

    def equal_length(self) -> "NUTSOutput":
        """Every chain's first `min(num_draws)` draws, the length R-hat and
        ArviZ need. Without a `gradient_budget` every chain made them all and
        this is the output itself."""
        if self.num_draws is None:
            return self
        k = int(np.min(np.asarray(self.num_draws)))
        if k == np.shape(self.logdensity)[1]:
            return self
        cut = lambda a: a[:, :k]
        return self._replace(position=cut(self.position), logdensity=cut(self.logdensity),
                             info=NUTSInfo(*(cut(a) for a in self.info)))

    @property
    def last_position(self) -> Any:
        """Each chain's last draw (`[chains, dim]`): where a next `sample` call
        continues the chains (with `step_size=out.step_size`,
        `inverse_mass_matrix=out.inverse_mass_matrix` and fresh keys)."""
        n = np.shape(self.logdensity)[1] if self.num_draws is None else np.asarray(self.num_draws)
        last = np.broadcast_to(np.asarray(n) - 1, np.shape(self.position)[:1])
        return jnp.asarray(self.position)[jnp.arange(last.shape[0]), jnp.asarray(last)]

    @property
    def divergences(self) -> np.ndarray:
        """Divergent transitions after warm-up, per chain (`[chains]` ints)."""
        return np.asarray(self.info.is_divergent).sum(axis=1)

    def to_arviz(self, unravel_fn: Callable | None = None, var_name: str = "x", **kwargs: Any) -> Any:
        """The draws as ArviZ `InferenceData` (`az.summary`, `az.plot_trace`, ...).

        `unravel_fn` maps one flat position `[dim]` to a pytree of named
        parameters (a dict), e.g. the second result of
        `jax.flatten_util.ravel_pytree`; without it the posterior has one
        variable, `var_name`, of shape `[dim]`. Sample statistics use ArviZ's
        names (`lp`, `acceptance_rate`, `diverging`, `tree_depth`, `n_steps`,
        `energy`, `step_size`). Other keyword arguments go to `az.from_dict`
        (`coords`, `dims`, ...)."""
        from pcbatch.mcmc.convert import to_arviz
        return to_arviz(self.equal_length(), unravel_fn=unravel_fn, var_name=var_name, **kwargs)

    to_inference_data = to_arviz


class _Draws(NamedTuple):
    position: Any
    logdensity: Any
    info: NUTSInfo


def _empty_draws(num_samples, x):
    """Rows a chain never fills (a gradient budget stopped it) read NaN (floats), 0 and False."""
    zeros = lambda shape, dtype: jnp.zeros((num_samples,) + shape, dtype)
    nans = lambda shape: jnp.full((num_samples,) + shape, jnp.nan, x.dtype)
    return _Draws(nans(x.shape), nans(()),
                  NUTSInfo(nans(()), zeros((), bool), zeros((), bool), zeros((), index_dtype()),
                           zeros((), index_dtype()), nans(())))


def _record(draws, j, x, logp, stats):
    """Row j of every output; a warm-up transition (j < 0) writes nothing.
    (Each buffer is updated with `.at[j].set`, which the machine applies in
    place, one row per lane, rather than re-selecting the whole buffer.)"""
    n = draws.logdensity.shape[0]
    j = jnp.where(j >= 0, j, n)  # past the end: dropped
    return jax.tree_util.tree_map(lambda buf, v: buf.at[j].set(v), draws, _Draws(x, logp, stats))


# Dual averaging lives in `adaptation` (with the window schedule); the old names stay.
_DualAveraging = _adaptation.DualAveraging
_adaptation_start = _adaptation.dual_averaging_start
_adapt = _adaptation.dual_averaging_update


# --------------------------------------------------------------------------
# the autobatched program
# --------------------------------------------------------------------------

def _in_positions_dtype(value_and_grad: Callable) -> Callable:
    """The log density and gradient in the positions' dtype: a density closing over
    float64 data under x64 returns float64 for float32 positions, which made the
    chain's state change type between paths and the draw buffers a float64 scatter."""
    def in_dtype(x):
        logp, g = value_and_grad(x)
        return logp.astype(x.dtype), g.astype(x.dtype)
    return in_dtype


def _make_program(logdensity_fn: Callable, num_samples: int, num_warmup: int, target_accept: float,
                  max_tree_depth: int, leapfrogs_per_leaf: int, max_delta_energy: float,
                  uturn_criterion: str, adaptation: str = "step_size", progress: bool = False,
                  leaves_per_step: int = 2) -> Callable:
    """`run_chains(x, key, noise, step_size, inv_mass, budget, report_every)` for one chain, autobatched;
    the batch axis of `step_size` / `inv_mass` is chosen per call (`sampler`).
    With `adaptation="window"` the warm-up also adapts `inv_mass` (Stan's
    windows, `adaptation.py`); with `progress` a chain reports to the host
    every `report_every` transitions (`report_intervals`: only the last chain);
    a chain stops after the transition in which its gradient evaluations reach
    `budget` (`sample`'s `gradient_budget`).

    `build_tree(depth, ...)` returns the subtree of 2**depth leaves after
    the edge: its first leaf, then subtrees of depth 0, 1, ..., depth-1 joined
    on one after another. That is the textbook recursion (two halves of
    depth-1) with its left spine unrolled into a loop: the same binary tree
    and the same no-U-turn checks, but every call starts with its leaf, so
    between two gradient evaluations a chain runs few blocks (the leaf, then
    a call, or a return and a join per finished level). With
    `leaves_per_step` 2**k the first 2**k leaves are one block (`trajectory.bottom`)
    and the loop starts at depth k."""

    first = leaves_per_step.bit_length() - 1  # the depth of the subtree `bottom` builds when it can
    # Jitted once: the chain-by-chain Python (`f.reference`) calls it eagerly at every leapfrog
    # step, where an unjitted gradient is traced again each call (~8 ms: tests/mcmc went from
    # 97 to 72 CPU-s); in the machine it is inlined like any other op.
    value_and_grad = jax.jit(_in_positions_dtype(jax.value_and_grad(logdensity_fn)))

    def bottom(value_and_grad, steps, depth, edge, acc, inv_mass, max_delta_energy, criterion):
        return trajectory.bottom(value_and_grad, steps, first, depth, edge, acc, inv_mass, max_delta_energy, criterion)

    @pcbatch.autobatch
    def build_tree(depth, edge, acc, inv_mass):
        edge, acc, rho, p_beg, valid = bottom(value_and_grad, leapfrogs_per_leaf, depth, edge, acc,
                                              trajectory.mass(acc.inv_mass, inv_mass), max_delta_energy,
                                              uturn_criterion)
        level = first
        if (depth > first) & valid:
            while True:
                p_end = trajectory.seam(edge.p, uturn_criterion)
                edge, acc, sub = build_tree(level, edge, acc, inv_mass)
                rho, valid = trajectory.join(p_beg, p_end, rho, sub, edge.p, trajectory.mass(acc.inv_mass, inv_mass),
                                             uturn_criterion)
                level = level + 1
                if (level == depth) | ~valid:
                    break
        return edge, acc, Subtree(rho, trajectory.seam(p_beg, uturn_criterion), valid)

    total = num_warmup + num_samples
    if adaptation == "window" and num_warmup > 0:
        with jax.ensure_compile_time_eval():  # the program is cached: no tracer of a caller's jit in it
            tables = tuple(jnp.asarray(t) for t in _adaptation.schedule(num_warmup))
    else:
        tables = None

    def window(i, x, welford, mass, adapt):
        return _adaptation.window_update(tables, i, x, welford, mass, adapt)

    def report(i):
        return reporting.report(progress, i)

    def run_chains(x, key, noise, step_size, inv_mass, budget, report_every):
        logp, g = value_and_grad(x)
        draws = _empty_draws(num_samples, x)
        adapt = _adaptation_start(step_size, x.dtype)
        welford = _adaptation.welford_start(x, tables is not None)
        mass = _adaptation.mass_start(inv_mass, x, tables is not None)  # adapted inverse mass (or empty)
        key, k_traj, H0, traj = trajectory.transition_start(x, logp, g, key, noise[0], trajectory.mass(mass, inv_mass))
        i = 0
        depth = 0
        n_leaves = 0
        used = 0  # gradient evaluations so far (`budget`)
        sum_metro = jnp.zeros((), x.dtype)
        divergent = False
        while True:
            # Transitions in chunks of `report_every`; the host hears of each
            # chunk's end (a chain that does not report runs one chunk).
            stop = jnp.minimum(i + report_every, total)
            while True:
                # One doubling: a subtree of 2**depth leaves in a random direction.
                k_traj, k_direction, k_sub, k_accept = threefry.split(k_traj, 4)
                forward = trajectory.per_chain(threefry.uniform(k_direction) < 0.5)
                edge = trajectory.outer_edge(traj, forward)
                edge, acc, sub = build_tree(depth, edge, trajectory.fresh_acc(edge, H0, adapt.step_size, k_sub, mass),
                                            inv_mass)
                n_leaves = n_leaves + acc.n_leaves
                sum_metro = sum_metro + acc.sum_metro
                divergent = divergent | acc.divergent
                traj, persist = trajectory.extend(traj, edge, acc, sub, forward, k_accept,
                                                  trajectory.mass(mass, inv_mass), uturn_criterion)
                turning = jnp.where(sub.valid, ~persist, ~acc.divergent)
                depth = depth + sub.valid
                if ~sub.valid | ~persist | (depth == max_tree_depth):
                    # The transition is over: record it (after warm-up), adapt
                    # the step size and mass matrix (during warm-up), start the next one.
                    x, logp, g = traj.prop_x, traj.prop_logp, traj.prop_g
                    accept = sum_metro / jnp.maximum(n_leaves, 1)
                    stats = NUTSInfo(accept, divergent, turning, depth + ~sub.valid, n_leaves * leapfrogs_per_leaf,
                                     H0)
                    draws = _record(draws, i - num_warmup, x, logp, stats)
                    used = used + n_leaves * leapfrogs_per_leaf
                    adapt = _adapt(adapt, i, accept, num_warmup, target_accept)
                    welford, mass, adapt = window(i, x, welford, mass, adapt)
                    i = i + 1
                    key, k_traj, H0, traj = trajectory.transition_start(x, logp, g, key, noise[i % total],
                                                                        trajectory.mass(mass, inv_mass))
                    depth = 0
                    n_leaves = 0
                    sum_metro = jnp.zeros((), x.dtype)
                    divergent = False
                    if (i == stop) | (used >= budget):
                        break
            reports = report_every < total
            if reports:
                i = i + report(jnp.where(reports, i, 0))  # lanes that do not report run along masked
            if (i == total) | (used >= budget):
                break
        return NUTSOutput(draws.position, draws.logdensity, draws.info, adapt.step_size,
                          trajectory.mass(mass, inv_mass), i - num_warmup)

    return run_chains


def leaf_block(prog: Any) -> int:
    """Index of the leaf block (the one calling `trajectory.bottom`: every gradient) in a lowered program."""
    import inspect
    src, start = inspect.getsourcelines(_make_program)
    line = start + next(i for i, text in enumerate(src) if "= bottom(" in text)
    found = [i for i, b in enumerate(prog.blocks)
             if any(getattr(op, "loc", None) is not None and op.loc.lineno == line for op in b.ops)]
    if len(found) != 1:
        raise RuntimeError(f"pcbatch.mcmc.nuts: cannot find the leaf block (line {line}): {found}")
    return found[0]


@functools.lru_cache(maxsize=64)
def _cached(logdensity_fn, num_samples, num_warmup, target_accept, max_tree_depth, leapfrogs_per_leaf,
            max_delta_energy, uturn_criterion, step_axis, mass_axis, schedule, adaptation="step_size",
            progress=False, leaves_per_step=2):
    logdensity_fn, schedule = inputs.from_cache_key(logdensity_fn), inputs.from_cache_key(schedule)
    run_chains = _make_program(logdensity_fn, num_samples, num_warmup, target_accept, max_tree_depth,
                               leapfrogs_per_leaf, max_delta_energy, uturn_criterion, adaptation, progress,
                               leaves_per_step)
    # Frames: run_chains, then build_tree for the doubling and its nested subtrees.
    in_axes = (0, 0, 0, step_axis, mass_axis, 0, 0)
    prog = pcbatch.autobatch(run_chains, in_axes=in_axes, max_stack_depth=max_tree_depth + 2)
    if schedule in ("gradient_quorum", "gradient_last", "gradient_last_all"):
        # Block numbers come from lowering alone (types do not renumber them).
        from pcbatch.lower import lower
        leaf = leaf_block(lower(prog.ir(), tuple(a is None for a in in_axes)))
        prog = prog.with_schedule(GradientQuorum(leaf) if schedule == "gradient_quorum"
                                  else GradientLast(leaf, follow="all" if schedule == "gradient_last_all" else True))
    elif schedule != "earliest":
        prog = prog.with_schedule(schedule)
    return prog


def check_settings(*, num_samples: Any, num_warmup: Any, target_accept: Any, max_tree_depth: Any,
                   leapfrogs_per_leaf: Any, max_delta_energy: Any, uturn_criterion: Any, adaptation: Any) -> None:
    """The sampler's settings, each a named error. `sample` checks them before it
    builds any argument from the counts (a negative total made a raw JAX shape error)."""
    if uturn_criterion not in ("stan", "numpyro"):
        raise invalid(f"uturn_criterion must be 'stan' or 'numpyro', got {uturn_criterion!r}")
    if adaptation not in ("step_size", "window"):
        raise invalid(f"adaptation must be 'step_size' or 'window', got {adaptation!r}")
    counts = {"num_samples": num_samples, "num_warmup": num_warmup, "max_tree_depth": max_tree_depth,
              "leapfrogs_per_leaf": leapfrogs_per_leaf}
    for name, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise invalid(f"{name} must be an integer, got {value!r}")
    real = lambda v: isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
    if not (real(max_delta_energy) and max_delta_energy > 0):
        raise invalid(f"max_delta_energy must be positive (an energy error above it is a divergence; Stan: 1000), "
                      f"got {max_delta_energy!r}")
    if num_samples < 1 or max_tree_depth < 1 or leapfrogs_per_leaf < 1 or num_warmup < 0:
        raise invalid("num_samples, max_tree_depth and leapfrogs_per_leaf must be at least 1, "
                      "num_warmup at least 0")
    if not (real(target_accept) and 0.0 < target_accept < 1.0):
        raise invalid(f"target_accept must be in (0, 1), got {target_accept}")


def sampler(logdensity_fn: Callable, *, num_samples: int, num_warmup: int = 0, target_accept: float = 0.8,
            max_tree_depth: int = 10, leapfrogs_per_leaf: int = 1, max_delta_energy: float = 1000.0,
            uturn_criterion: str = "stan", per_chain_step_size: bool = False,
            per_chain_mass: bool = False, schedule: Any = "gradient_last", adaptation: str = "step_size",
            progress: bool = False, leaves_per_step: int = 2) -> pcbatch.Autobatched:
    """The autobatched program `run_chains(positions, keys, noise, step_size, inverse_mass_matrix,
    report_every)` (arguments as `prepare` makes them; options as `sample`'s; `progress`:
    chains report to the progress bar every `report_every` transitions).

    Batched over chains (axis 0 of positions, keys and noise; of step_size
    and the inverse mass matrix too when `per_chain_*`). Cached per
    arguments, so calling `sample` twice with the same `logdensity_fn`
    compiles once. `.reference(*args)` runs the same Python chain by chain."""
    check_settings(num_samples=num_samples, num_warmup=num_warmup, target_accept=target_accept,
                   max_tree_depth=max_tree_depth, leapfrogs_per_leaf=leapfrogs_per_leaf,
                   max_delta_energy=max_delta_energy, uturn_criterion=uturn_criterion, adaptation=adaptation)
    if leaves_per_step not in (1, 2, 4, 8):
        raise invalid(f"leaves_per_step must be 1, 2, 4 or 8 (or 'auto' in `sample`), got {leaves_per_step!r}")
    return _cached(inputs.cache_key(logdensity_fn), int(num_samples), int(num_warmup), float(target_accept),
                   int(max_tree_depth), int(leapfrogs_per_leaf), float(max_delta_energy), uturn_criterion,
                   0 if per_chain_step_size else None, 0 if per_chain_mass else None, inputs.cache_key(schedule),
                   adaptation if num_warmup > 0 else "step_size", bool(progress), int(leaves_per_step))


# `auto_leaves_per_step`: one leaf per step once a gradient costs more XLA
# flops than this per step plus this per chain (2-core CPU, 2026-11-26).
SINGLE_LEAF_FLOPS = (2 ** 21, 2 ** 17)
# Every block every step (`GradientLast(follow="all")`) on an accelerator where a
# gradient step of all chains costs at most this many flops (one H100, 2026-11-27:
# the 100-d Gaussian at 1024 chains, 42 Mflop, 1.2x faster; the logistic regression
# at 128 chains, 538 Mflop, 0.86x).
ALL_BLOCKS_FLOPS = 2 ** 27


def auto_schedule(logdensity_fn: Callable, initial_positions: Any) -> str:
    """`sample`'s `schedule="auto"`: "gradient_last_all" on an accelerator
    where a gradient step is cheap, else "gradient_last".

    There follow blocks run masked (`pcbatch.Tuning.masked_follow`: XLA:GPU
    waits on the host for each `lax.cond`), so following the leaf and the
    entry block too leaves no conditional in a step: the leaf's gradient then
    runs every step, for the chains at it, whether or not others are still
    on their way there. That pays where the gradient costs less than the
    host round trips it saves (`ALL_BLOCKS_FLOPS`, over all chains). On the
    CPU a skipped block costs nothing, and "gradient_last" waits for every
    chain."""
    if jax.default_backend() == "cpu":
        return "gradient_last"
    chains, _, flops = _gradient_cost(logdensity_fn, initial_positions)
    return "gradient_last_all" if flops is not None and flops * chains <= ALL_BLOCKS_FLOPS else "gradient_last"


# Four leaves per step where a gradient costs at most this many flops, with at
# most this many chains and coordinates over all chains (2-core CPU, 2026-11-27).
FOUR_LEAVES = (2 ** 10, 64, 2 ** 11)


def auto_leaves_per_step(logdensity_fn: Callable, initial_positions: Any) -> int:
    """`sample`'s `leaves_per_step="auto"`: 1 where a gradient costs more than
    the machine steps that pairs of leaves save, 4 where gradients are cheap and
    the chains few, else 2.

    Two leaves per step halve the machine steps between gradients but waste
    one gradient per transition (its first doubling needs one leaf). A step's
    fixed cost is shared by the chains, so the rule is per chain: one leaf
    where XLA's flop count of `value_and_grad` is at least `SINGLE_LEAF_FLOPS[0]
    / chains + SINGLE_LEAF_FLOPS[1]`. Measured (`benchmarks/nuts.py`): Bayesian
    logistic regression on 10,000 points (4.2 Mflop) runs 1.08-1.15x faster
    with one leaf at 1, 16 and 128 chains, the 100-d Gaussian (41 kflop)
    1.4-1.7x slower.

    Where a gradient is nearly free and few chains share a step, the step's
    fixed cost is the run's cost, and four leaves per step pay for the leaves
    they waste: `FOUR_LEAVES` (flops, chains, chains x coordinates). Measured
    at 16-64 chains (interleaved, same draws): the funnel and eight schools
    (10-d, 50 and 199 flops) 1.1-1.3x faster, the 50-d Student-t and the
    centered funnel at 16 chains 1.1x; at 128 chains the wasted leaves cost
    more than the steps saved (the Student-t 0.9x, the centered funnel 0.8x)."""
    chains, dim, flops = _gradient_cost(logdensity_fn, initial_positions)
    if flops is None:  # no cost model on this backend: the default
        return 2
    per_step, per_chain = SINGLE_LEAF_FLOPS
    if flops >= per_step / chains + per_chain:
        return 1
    cheap, few, coordinates = FOUR_LEAVES
    return 4 if flops <= cheap and chains <= few and chains * dim <= coordinates else 2


def _gradient_cost(logdensity_fn: Callable, initial_positions: Any) -> tuple[int, int, float | None]:
    """Chains, coordinates and XLA's flop count of one gradient (None where the backend has no cost model)."""
    x = initial_positions if isinstance(initial_positions, jax.Array) else jnp.asarray(initial_positions)
    chains = x.shape[0] if x.ndim == 2 else 1
    return chains, x.shape[-1], _gradient_flops(inputs.cache_key(logdensity_fn), x.shape[-1], jnp.dtype(x.dtype).name)


@functools.lru_cache(maxsize=64)
def _gradient_flops(logdensity_fn: Callable, dim: int, dtype: str) -> float | None:
    one = jax.ShapeDtypeStruct((dim,), dtype if jnp.issubdtype(dtype, jnp.floating) else jnp.float32)
    cost = jax.jit(jax.value_and_grad(inputs.from_cache_key(logdensity_fn))).lower(one).cost_analysis()
    flops = (cost or {}).get("flops")
    return None if flops is None else float(flops)


def prepare(initial_positions: Any, keys: Any, step_size: Any, inverse_mass_matrix: Any,
            num_transitions: int, num_chains: int | None = None,
            progress_every: int = 0, gradient_budget: int | None = None) -> tuple[tuple, bool, bool]:
    """`sample`'s arguments as the program's (`sampler`), for `num_transitions`
    = warm-up + samples: `(args, per_chain_step_size, per_chain_mass)`.
    `progress_every` > 0: the last chain reports every that many transitions;
    `gradient_budget`: see `sample`."""
    try:
        x = jnp.asarray(initial_positions)
    except (TypeError, ValueError) as e:
        raise invalid(f"initial_positions must be one array, [chains, dim] or [dim]; got a "
                      f"{type(initial_positions).__name__} ({e})",
                      "flatten a pytree of parameters: x, unravel = jax.flatten_util.ravel_pytree(params), and "
                      "write the log density of the flat vector (see pcbatch.mcmc.convert)") from None
    if jnp.issubdtype(x.dtype, jnp.complexfloating):  # a cast would drop the imaginary part silently
        raise invalid(f"initial_positions must be real, got dtype {x.dtype}",
                      "sample the real and imaginary parts as two coordinates each")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.float32)
    if num_chains is not None and (isinstance(num_chains, bool) or not isinstance(num_chains, (int, np.integer))
                                   or num_chains < 1):
        raise invalid(f"num_chains must be a positive integer, got {num_chains!r}")
    if x.ndim == 1 and num_chains is not None:
        x = jnp.broadcast_to(x, (int(num_chains), x.shape[0]))  # every chain starts there
    if x.ndim != 2:
        raise invalid(f"initial_positions must be [chains, dim] (or [dim] with num_chains), got shape {x.shape}")
    if num_chains is not None and x.shape[0] != num_chains:
        raise invalid(f"num_chains={num_chains} but initial_positions has {x.shape[0]} rows")
    if x.dtype not in (jnp.float32, jnp.float64):
        raise invalid(f"pcbatch.mcmc.nuts runs in float32 (or float64 under jax_enable_x64); got "
                      f"initial_positions of dtype {x.dtype}", "cast them: initial_positions.astype(jnp.float32)")
    chains, dim = x.shape
    if chains == 0 or dim == 0:
        raise invalid(f"initial_positions has shape {x.shape}: NUTS needs at least one chain of at least one "
                      "dimension")
    values = inputs.concrete(x)
    if values is not None and not np.isfinite(values).all():
        bad = sorted(set(np.nonzero(~np.isfinite(values))[0].tolist()))
        raise invalid(f"initial_positions of chain(s) {bad[:10]} are not finite",
                      "start every chain where the log density is finite")
    keys = inputs.raw_keys(keys, chains)
    if keys.shape[0] != chains:
        raise invalid(f"{keys.shape[0]} keys for {chains} chains")
    if isinstance(step_size, (int, float)) and not isinstance(step_size, bool):
        step = inputs.constant((), float(step_size), x.dtype.name)
    else:
        step = inputs.as_array("step_size", step_size, x.dtype)
    mass = (inputs.constant((dim,), 1.0, x.dtype.name) if inverse_mass_matrix is None
            else inputs.as_array("inverse_mass_matrix", inverse_mass_matrix, x.dtype))
    if step.ndim not in (0, 1) or (step.ndim == 1 and step.shape[0] != chains):
        raise invalid(f"step_size must be a scalar or [chains], got shape {step.shape}")
    if mass.shape not in ((dim,), (chains, dim)):
        raise invalid(f"inverse_mass_matrix must be diagonal: [dim] or [chains, dim], got {mass.shape}")
    for name, value in (("step_size", step), ("inverse_mass_matrix", mass)):
        known = inputs.concrete(value)
        if known is not None and not (np.isfinite(known).all() and (known > 0).all()):
            raise invalid(f"{name} must be finite and positive, got {known if known.size <= 8 else known.ravel()[:8]}",
                          "a step size of 0 never moves a chain; a negative one or a non-positive mass "
                          "has no meaning in the dynamics")
    tree_keys, noise = inputs.split_keys(keys, int(num_transitions), dim, x.dtype.name)
    report_every = report_intervals(chains, int(num_transitions), int(progress_every))
    int_dtype = index_dtype()
    if gradient_budget is not None and (int(gradient_budget) != gradient_budget or gradient_budget < 1):
        raise invalid(f"gradient_budget must be a positive integer (gradient evaluations per chain), "
                      f"got {gradient_budget!r}")
    limit = np.iinfo(int_dtype).max if gradient_budget is None else int(gradient_budget)
    budget = inputs.constant((chains,), limit, int_dtype)
    return (x, tree_keys, noise, step, mass, budget, report_every), step.ndim == 1, mass.ndim == 2


def sample(logdensity_fn: Callable, initial_positions: Any, keys: Any, *, step_size: Any = None,
           inverse_mass_matrix: Any = None, num_samples: int, num_warmup: int = 0,
           adaptation: str = "step_size", num_chains: int | None = None,
           target_accept: float = 0.8, max_tree_depth: int = 10, leapfrogs_per_leaf: int = 1,
           max_delta_energy: float = 1000.0, uturn_criterion: str = "stan",
           schedule: Any = "auto", progress_bar: bool = False,
           progress_every: int | None = None, leaves_per_step: Any = "auto",
           gradient_budget: int | None = None) -> NUTSOutput:
    """Run `num_warmup + num_samples` NUTS transitions on each chain, all
    chains in ONE autobatched program (chains never wait for each other at
    transition boundaries, only at gradient steps).

    Args:
      logdensity_fn: `x[dim] -> scalar` log density (up to a constant), JAX-traceable.
        Data it needs can be captured by closure. Use the same function object
        across calls to reuse the compiled program.
      initial_positions: `[chains, dim]` float32 (float64 under `jax_enable_x64`), or
        `[dim]` with `num_chains` (every chain starts there). The log density and its
        gradient must be finite there (checked where the positions are known: not
        inside your `jit`).
      keys: ONE key (split into one per chain), `[chains, 2]` uint32
        (`jax.random.split(key, chains)`) or `[chains]` typed keys.
      step_size: scalar, or `[chains]`; with `num_warmup`, the starting point of
        adaptation (default 1.0 then; without warm-up it is required).
      inverse_mass_matrix: diagonal, `[dim]` or `[chains, dim]`; default identity.
        With `adaptation="window"`, the starting point of adaptation.
      num_samples: transitions per chain recorded (static).
      num_warmup: transitions before those, not recorded, during which each
        chain adapts its own step size by dual averaging (Stan's/BlackJAX's:
        Hoffman & Gelman 2014, Algorithm 5, towards `target_accept` mean
        acceptance statistic); the averaged step size is used from then on.
      adaptation: "step_size" (default): the step size only. "window": also
        the diagonal inverse mass matrix, on Stan's schedule (an initial fast
        window, slow windows doubling in length whose draws' variance becomes
        the mass matrix, a final fast window; `adaptation.py`), as Stan's and
        BlackJAX's `window_adaptation`. Use `num_warmup` >= 150 for its
        default windows (75 + 25 + 50); fewer shrink them as Stan does.
      num_chains: with `[dim]` initial positions, how many chains.
      max_tree_depth: at most `2**max_tree_depth` leaves per trajectory.
      leapfrogs_per_leaf: leapfrog steps per tree leaf (Radul et al. use 4).
      max_delta_energy: an energy error above this is a divergence (Stan: 1000).
      uturn_criterion: "stan" (default): the generalized criterion on every
        merged (sub)tree plus Stan's two extra checks across the seam of the
        merge. "numpyro": NumPyro's and BlackJAX's (one check per merge, the
        end points' momenta counted half), for like-for-like comparisons.
      schedule: "auto" (default): "gradient_last", or "gradient_last_all" on a
        GPU or TPU where gradients are cheap (`auto_schedule`). "gradient_last"
        (`GradientLast`: every gradient step waits for every running chain),
        "gradient_last_all" (`GradientLast(follow="all")`: every block every
        step, for the chains at it), "gradient_quorum" (`GradientQuorum`:
        once half of them wait; measured slower on every target of
        `benchmarks/nuts.py`), "earliest" (pcbatch's default), or any pcbatch
        scheduler object. Results do not depend on it.
      progress_bar: show a tqdm bar of the last chain's transitions, fed from
        inside the loop by a host callback every `progress_every` of them
        (default: a tenth). Only one chain reports, so the loop calls the host
        about ten times per run. Off by default; results do not depend on it
        (see benchmarks/README.md for its cost).
      leaves_per_step: 2: the first two leaves of every subtree in one machine
        step, so half the steps between gradients, but a transition's first
        doubling (one leaf) computes a second, wasted one. 1: one leaf per step,
        nothing wasted. 4 or 8: fewer steps still, more leaves wasted (the first
        doublings, and a subtree cut short inside the step). "auto" (default):
        1 where gradients dominate the machine's steps, 4 where they are nearly
        free and the chains few (up to 64), else 2 (`auto_leaves_per_step`).
        The draws are the same up to floating-point rounding (a gradient is
        computed in a batch of another width), which warm-up can grow into
        different draws from the same distribution.
      gradient_budget: for chains that stay slow (a funnel's neck: 1023 leaves
        a transition, transition after transition), each chain stops after the
        transition in which its gradient evaluations reach this many, or after
        `num_samples` draws: a call lasts about the budget plus one trajectory,
        not the slowest chain's `num_samples` trajectories, and fast chains make
        more draws than slow ones. `out.num_draws` says how many each made (later
        rows are NaN); continue the chains with another call from
        `out.last_position` (and `out.step_size`, `out.inverse_mass_matrix`,
        fresh keys). Not with warm-up. Each chain's draws are its own Markov
        chain: average per chain, not the pooled draws (a slow region's chains
        draw less).

    Returns:
      `NUTSOutput(position [chains, num_samples, dim], logdensity [chains, num_samples],
      info: NUTSInfo, step_size [chains], inverse_mass_matrix [chains, dim], num_draws [chains])`;
      `info.num_integration_steps` counts gradient evaluations per transition
      (the initial gradient is not counted). `out.summary()` gives R-hat and
      ESS per coordinate (over the draws every chain made: `equal_length`),
      `out.divergences` the divergences per chain, `out.to_arviz()` ArviZ's
      InferenceData.
    """
    check_settings(num_samples=num_samples, num_warmup=num_warmup, target_accept=target_accept,
                   max_tree_depth=max_tree_depth, leapfrogs_per_leaf=leapfrogs_per_leaf,
                   max_delta_energy=max_delta_energy, uturn_criterion=uturn_criterion, adaptation=adaptation)
    if not callable(logdensity_fn):
        raise invalid(f"logdensity_fn must be a function x[dim] -> scalar, got a {type(logdensity_fn).__name__}")
    if step_size is None:
        if num_warmup == 0:
            raise invalid("step_size is required without warm-up (num_warmup=0)")
        step_size = 1.0
    if gradient_budget is not None and num_warmup > 0:
        raise invalid("gradient_budget stops chains at different transitions, so it cannot share a call "
                      "with warm-up: warm up in a call of its own (num_samples=1 is enough), then continue "
                      "from out.last_position with out.step_size and out.inverse_mass_matrix")
    total = num_warmup + num_samples
    every = 0
    if progress_bar:
        every = max(1, total // 10) if progress_every is None else progress_every
        if isinstance(every, bool) or not isinstance(every, (int, np.integer)) or every < 1:
            raise invalid(f"progress_every must be an integer of at least 1 (transitions between reports), "
                          f"got {progress_every!r}")
    args, per_step, per_mass = prepare(initial_positions, keys, step_size, inverse_mass_matrix, total, num_chains,
                                       every, gradient_budget)
    inputs.check_start(logdensity_fn, args[0])
    prog = sampler(logdensity_fn, num_samples=num_samples, num_warmup=num_warmup, target_accept=target_accept,
                   max_tree_depth=max_tree_depth, leapfrogs_per_leaf=leapfrogs_per_leaf,
                   max_delta_energy=max_delta_energy, uturn_criterion=uturn_criterion,
                   per_chain_step_size=per_step, per_chain_mass=per_mass,
                   schedule=auto_schedule(logdensity_fn, args[0]) if schedule == "auto" else schedule,
                   adaptation=adaptation, progress=progress_bar,
                   leaves_per_step=auto_leaves_per_step(logdensity_fn, args[0])
                   if leaves_per_step == "auto" else leaves_per_step)
    if not progress_bar:
        return prog(*args)
    bar = reporting.ProgressBar(total, args[0].shape[0], "NUTS")
    reporting.PROGRESS.append(bar)
    try:
        return jax.block_until_ready(prog(*args))
    finally:
        reporting.PROGRESS.remove(bar)
        bar.close()
