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

`sampler(...)` returns the `Autobatched` program itself, so that tests can
compare it with `.reference` (the same Python run chain by chain).
"""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import pcbatch

__all__ = ["GradientLast", "NUTSInfo", "NUTSOutput", "sample", "sampler"]


class NUTSInfo(NamedTuple):
    """Per-transition statistics, each `[chains, num_samples]` (BlackJAX names)."""
    acceptance_rate: Any          # mean over the trajectory's leaves of min(1, exp(H0 - H))
    is_divergent: Any             # the energy error exceeded `max_delta_energy`
    is_turning: Any               # the trajectory stopped on a U-turn (not divergence/depth)
    num_trajectory_expansions: Any  # tree depth: doublings that were merged
    num_integration_steps: Any    # gradient evaluations (leapfrog steps) this transition
    energy: Any                   # H of the starting state: -logp(x0) + K(p0)


class NUTSOutput(NamedTuple):
    position: Any                 # [chains, num_samples, dim]
    logdensity: Any               # [chains, num_samples]
    info: NUTSInfo


# --------------------------------------------------------------------------
# plain helpers (traced inline as JAX code)
# --------------------------------------------------------------------------

class Tree(NamedTuple):
    """What `build_tree` returns for one subtree, in its direction of travel."""
    x: Any          # the last leaf (the new edge of the trajectory) ...
    p: Any
    g: Any
    logp: Any
    p_beg: Any      # momentum of the first leaf (next to where the subtree started)
    prop_x: Any     # the subtree's multinomial proposal
    prop_logp: Any
    prop_g: Any
    log_weight: Any  # log of the summed weights exp(H0 - H) of the leaves
    rho: Any        # sum of the leaves' momenta
    valid: Any      # no divergence and no U-turn inside
    divergent: Any
    n_leaves: Any
    sum_metro: Any  # sum over leaves of min(1, exp(H0 - H))


class Trajectory(NamedTuple):
    """The top-level trajectory of one transition, in time order."""
    xl: Any
    pl: Any
    gl: Any
    logpl: Any
    xr: Any
    pr: Any
    gr: Any
    logpr: Any
    rho: Any
    log_weight: Any
    prop_x: Any
    prop_logp: Any
    prop_g: Any


def _kinetic(p, inv_mass):
    return 0.5 * jnp.sum(inv_mass * p * p)


def _no_uturn(p_minus, p_plus, rho, inv_mass, criterion):
    """The generalized criterion: both ends' velocities still point along the
    summed momentum `rho` of the (sub)trajectory between them. NumPyro and
    BlackJAX count the two end points with weight 1/2 in `rho`."""
    if criterion == "numpyro":
        rho = rho - 0.5 * (p_minus + p_plus)
    return (jnp.dot(inv_mass * p_plus, rho) > 0) & (jnp.dot(inv_mass * p_minus, rho) > 0)


def _uniform_below(key, log_ratio):
    """True with probability min(1, exp(log_ratio))."""
    return jax.random.uniform(key) < jnp.exp(log_ratio)


def _leaf(logdensity_fn, steps, x, p, g, direction, step_size, inv_mass, H0, max_delta_energy):
    """`steps` leapfrog steps; the final state is the leaf."""
    eps = direction * step_size
    logp = jnp.zeros((), x.dtype)
    for _ in range(steps):
        p = p + 0.5 * eps * g
        x = x + eps * inv_mass * p
        logp, g = jax.value_and_grad(logdensity_fn)(x)
        p = p + 0.5 * eps * g
    H = -logp + _kinetic(p, inv_mass)
    H = jnp.where(jnp.isnan(H), jnp.inf, H)
    delta = H0 - H
    divergent = -delta > max_delta_energy
    return Tree(x=x, p=p, g=g, logp=logp, p_beg=p, prop_x=x, prop_logp=logp, prop_g=g,
                log_weight=delta, rho=p, valid=~divergent, divergent=divergent,
                n_leaves=jnp.int32(1), sum_metro=jnp.minimum(1.0, jnp.exp(delta)).astype(x.dtype))


def _merge_subtrees(init, final, key, inv_mass, criterion):
    """Join two adjacent subtrees (same direction): uniform multinomial choice
    of the proposal, and the no-U-turn checks on the joined subtree (with
    Stan's criterion, also the two across the seam)."""
    log_weight = jnp.logaddexp(init.log_weight, final.log_weight)
    take_final = _uniform_below(key, final.log_weight - log_weight)
    rho = init.rho + final.rho
    persist = _no_uturn(init.p_beg, final.p, rho, inv_mass, criterion)
    if criterion == "stan":
        persist = (persist & _no_uturn(init.p_beg, final.p_beg, init.rho + final.p_beg, inv_mass, criterion)
                   & _no_uturn(init.p, final.p, final.rho + init.p, inv_mass, criterion))
    return Tree(x=final.x, p=final.p, g=final.g, logp=final.logp, p_beg=init.p_beg,
                prop_x=jnp.where(take_final, final.prop_x, init.prop_x),
                prop_logp=jnp.where(take_final, final.prop_logp, init.prop_logp),
                prop_g=jnp.where(take_final, final.prop_g, init.prop_g),
                log_weight=log_weight, rho=rho, valid=final.valid & persist,
                divergent=init.divergent | final.divergent,
                n_leaves=init.n_leaves + final.n_leaves, sum_metro=init.sum_metro + final.sum_metro)


def _start(x, p, g, logp):
    return Trajectory(xl=x, pl=p, gl=g, logpl=logp, xr=x, pr=p, gr=g, logpr=logp, rho=p,
                      log_weight=jnp.zeros((), x.dtype), prop_x=x, prop_logp=logp, prop_g=g)


def _edge(traj, forward):
    """The state to extend from: the right end going forward, else the left."""
    return (jnp.where(forward, traj.xr, traj.xl), jnp.where(forward, traj.pr, traj.pl),
            jnp.where(forward, traj.gr, traj.gl), jnp.where(forward, traj.logpr, traj.logpl))


def _extend(traj, sub, forward, key, inv_mass, criterion):
    """Merge a valid new subtree into the trajectory: biased progressive
    sampling of the proposal, then the no-U-turn checks (Stan's: three).
    Returns the new trajectory and whether it keeps going."""
    take_new = _uniform_below(key, sub.log_weight - traj.log_weight)
    # bck / fwd: the earlier and the later part in time order.
    bck_left_p = jnp.where(forward, traj.pl, sub.p)
    bck_right_p = jnp.where(forward, traj.pr, sub.p_beg)
    fwd_left_p = jnp.where(forward, sub.p_beg, traj.pl)
    fwd_right_p = jnp.where(forward, sub.p, traj.pr)
    rho_bck = jnp.where(forward, traj.rho, sub.rho)
    rho_fwd = jnp.where(forward, sub.rho, traj.rho)
    rho = rho_bck + rho_fwd
    persist = _no_uturn(bck_left_p, fwd_right_p, rho, inv_mass, criterion)
    if criterion == "stan":
        persist = (persist
                   & _no_uturn(bck_left_p, fwd_left_p, rho_bck + fwd_left_p, inv_mass, criterion)
                   & _no_uturn(bck_right_p, fwd_right_p, rho_fwd + bck_right_p, inv_mass, criterion))
    new = Trajectory(
        xl=jnp.where(forward, traj.xl, sub.x), pl=jnp.where(forward, traj.pl, sub.p),
        gl=jnp.where(forward, traj.gl, sub.g), logpl=jnp.where(forward, traj.logpl, sub.logp),
        xr=jnp.where(forward, sub.x, traj.xr), pr=jnp.where(forward, sub.p, traj.pr),
        gr=jnp.where(forward, sub.g, traj.gr), logpr=jnp.where(forward, sub.logp, traj.logpr),
        rho=rho, log_weight=jnp.logaddexp(traj.log_weight, sub.log_weight),
        prop_x=jnp.where(take_new, sub.prop_x, traj.prop_x),
        prop_logp=jnp.where(take_new, sub.prop_logp, traj.prop_logp),
        prop_g=jnp.where(take_new, sub.prop_g, traj.prop_g))
    return new, persist


# --------------------------------------------------------------------------
# the autobatched program
# --------------------------------------------------------------------------

def _make_program(logdensity_fn: Callable, num_samples: int, max_tree_depth: int,
                  leapfrogs_per_leaf: int, max_delta_energy: float,
                  uturn_criterion: str) -> Callable:
    """`run_chains(x, key, step_size, inv_mass)` for one chain, autobatched;
    the batch axis of `step_size` / `inv_mass` is chosen per call (`sampler`)."""

    @pcbatch.autobatch
    def build_tree(depth, x, p, g, logp, direction, H0, key, step_size, inv_mass):
        if depth == 0:
            return _leaf(logdensity_fn, leapfrogs_per_leaf, x, p, g, direction, step_size, inv_mass,
                         H0, max_delta_energy)
        k_init, k_final, k_choice = jax.random.split(key, 3)
        init = build_tree(depth - 1, x, p, g, logp, direction, H0, k_init, step_size, inv_mass)
        if not init.valid:
            return init
        final = build_tree(depth - 1, init.x, init.p, init.g, init.logp, direction, H0, k_final,
                           step_size, inv_mass)
        return _merge_subtrees(init, final, k_choice, inv_mass, uturn_criterion)

    def run_chains(x, key, step_size, inv_mass):
        logp, g = jax.value_and_grad(logdensity_fn)(x)
        positions = jnp.zeros((num_samples,) + x.shape, x.dtype)
        logps = jnp.zeros((num_samples,), x.dtype)
        acceptance = jnp.zeros((num_samples,), x.dtype)
        energies = jnp.zeros((num_samples,), x.dtype)
        divergences = jnp.zeros((num_samples,), bool)
        turnings = jnp.zeros((num_samples,), bool)
        depths = jnp.zeros((num_samples,), jnp.int32)
        grads = jnp.zeros((num_samples,), jnp.int32)
        for i in range(num_samples):
            key, k_momentum, k_tree = jax.random.split(key, 3)
            p = jax.random.normal(k_momentum, x.shape, x.dtype) / jnp.sqrt(inv_mass)
            H0 = -logp + _kinetic(p, inv_mass)
            traj = _start(x, p, g, logp)
            depth = 0
            n_leaves = 0
            sum_metro = jnp.zeros((), x.dtype)
            divergent = False
            turning = False
            while depth < max_tree_depth:
                k_tree, k_direction, k_sub, k_accept = jax.random.split(k_tree, 4)
                forward = jax.random.bernoulli(k_direction)
                direction = jnp.where(forward, 1.0, -1.0).astype(x.dtype)
                ex, ep, eg, elogp = _edge(traj, forward)
                sub = build_tree(depth, ex, ep, eg, elogp, direction, H0, k_sub, step_size, inv_mass)
                n_leaves = n_leaves + sub.n_leaves
                sum_metro = sum_metro + sub.sum_metro
                divergent = divergent | sub.divergent
                if not sub.valid:
                    turning = ~sub.divergent
                    break
                depth += 1
                traj, persist = _extend(traj, sub, forward, k_accept, inv_mass, uturn_criterion)
                if not persist:
                    turning = True
                    break
            x, logp, g = traj.prop_x, traj.prop_logp, traj.prop_g
            positions = positions.at[i].set(x)
            logps = logps.at[i].set(logp)
            acceptance = acceptance.at[i].set(sum_metro / jnp.maximum(n_leaves, 1))
            energies = energies.at[i].set(H0)
            divergences = divergences.at[i].set(divergent)
            turnings = turnings.at[i].set(turning)
            depths = depths.at[i].set(depth)
            grads = grads.at[i].set(n_leaves * leapfrogs_per_leaf)
        return NUTSOutput(positions, logps, NUTSInfo(acceptance, divergences, turnings, depths, grads, energies))

    return run_chains


class GradientLast:
    """A pcbatch scheduler for NUTS: run the earliest ready block, except the
    leaf block (the gradient evaluations), which runs only when no lane is
    ready anywhere else. Every lane can always reach its next leaf without
    running a leaf, so each leaf step evaluates the gradient for every chain
    that has not finished all its transitions: the batch synchronizes on
    gradients only, across trajectory and transition boundaries."""

    name = "gradient_last"

    def __init__(self, leaf: int):
        self.leaf = int(leaf)

    def init(self, num_blocks: int, num_lanes: int) -> Any:
        return ()

    def choose(self, carry: Any, frontier: Any) -> tuple[jax.Array, Any]:
        num_blocks = frontier.counts.shape[0]
        other = jnp.min(jnp.where(frontier.pc == self.leaf, num_blocks, frontier.pc))
        return jnp.where(other < num_blocks, other, self.leaf), carry

    def __repr__(self) -> str:
        return f"GradientLast(leaf=b{self.leaf})"


def leaf_block(prog: Any) -> int:
    """Index of the leaf block (the one calling `_leaf`) in a lowered program."""
    import inspect
    src, start = inspect.getsourcelines(_make_program)
    line = start + next(i for i, text in enumerate(src) if "return _leaf(" in text)
    found = [i for i, b in enumerate(prog.blocks) if b.loc is not None and b.loc.lineno == line]
    if len(found) != 1:
        raise RuntimeError(f"pcbatch.mcmc.nuts: cannot find the leaf block (line {line}): {found}")
    return found[0]


@functools.lru_cache(maxsize=64)
def _cached(logdensity_fn, num_samples, max_tree_depth, leapfrogs_per_leaf, max_delta_energy,
            uturn_criterion, step_axis, mass_axis, schedule):
    run_chains = _make_program(logdensity_fn, num_samples, max_tree_depth, leapfrogs_per_leaf,
                               max_delta_energy, uturn_criterion)
    # Frames: run_chains, then build_tree at depths max_tree_depth-1 .. 0.
    in_axes = (0, 0, step_axis, mass_axis)
    prog = pcbatch.autobatch(run_chains, in_axes=in_axes, max_stack_depth=max_tree_depth + 2)
    if schedule == "gradient_last":
        # Block numbers come from lowering alone (types do not renumber them).
        from pcbatch.lower import lower
        leaf = leaf_block(lower(prog.ir(), tuple(a is None for a in in_axes)))
        prog = prog.with_schedule(GradientLast(leaf))
    elif schedule != "earliest":
        prog = prog.with_schedule(schedule)
    return prog


def sampler(logdensity_fn: Callable, *, num_samples: int, max_tree_depth: int = 10,
            leapfrogs_per_leaf: int = 1, max_delta_energy: float = 1000.0,
            uturn_criterion: str = "stan", per_chain_step_size: bool = False,
            per_chain_mass: bool = False, schedule: Any = "gradient_last") -> pcbatch.Autobatched:
    """The autobatched program `run_chains(positions, keys, step_size, inverse_mass_matrix)`.

    Batched over chains (axis 0 of positions and keys; of step_size and the
    inverse mass matrix too when `per_chain_*`). Cached per arguments, so
    calling `sample` twice with the same `logdensity_fn` compiles once."""
    if uturn_criterion not in ("stan", "numpyro"):
        raise ValueError(f"uturn_criterion must be 'stan' or 'numpyro', got {uturn_criterion!r}")
    if num_samples < 1 or max_tree_depth < 1 or leapfrogs_per_leaf < 1:
        raise ValueError("num_samples, max_tree_depth and leapfrogs_per_leaf must be at least 1")
    return _cached(logdensity_fn, int(num_samples), int(max_tree_depth), int(leapfrogs_per_leaf),
                   float(max_delta_energy), uturn_criterion, 0 if per_chain_step_size else None,
                   0 if per_chain_mass else None, schedule)


def _raw_keys(keys: Any) -> jax.Array:
    keys = jnp.asarray(keys) if not isinstance(keys, jax.Array) else keys
    if jnp.issubdtype(keys.dtype, jax.dtypes.prng_key):
        keys = jax.random.key_data(keys)
    if keys.ndim != 2 or keys.dtype != jnp.uint32:
        raise ValueError(f"keys must be [chains, 2] uint32 (jax.random.split(key, chains)) "
                         f"or [chains] typed keys; got {keys.shape} {keys.dtype}")
    return keys


def prepare(initial_positions, keys, step_size, inverse_mass_matrix):
    """Normalize `sample`'s arguments: `(args, per_chain_step_size, per_chain_mass)`."""
    x = jnp.asarray(initial_positions)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.float32)
    if x.ndim != 2:
        raise ValueError(f"initial_positions must be [chains, dim], got shape {x.shape}")
    chains, dim = x.shape
    keys = _raw_keys(keys)
    if keys.shape[0] != chains:
        raise ValueError(f"{keys.shape[0]} keys for {chains} chains")
    step = jnp.asarray(step_size, x.dtype)
    mass = jnp.ones((dim,), x.dtype) if inverse_mass_matrix is None else jnp.asarray(inverse_mass_matrix, x.dtype)
    if step.ndim not in (0, 1) or (step.ndim == 1 and step.shape[0] != chains):
        raise ValueError(f"step_size must be a scalar or [chains], got shape {step.shape}")
    if mass.shape not in ((dim,), (chains, dim)):
        raise ValueError(f"inverse_mass_matrix must be diagonal: [dim] or [chains, dim], got {mass.shape}")
    return (x, keys, step, mass), step.ndim == 1, mass.ndim == 2


def sample(logdensity_fn: Callable, initial_positions: Any, keys: Any, *, step_size: Any,
           inverse_mass_matrix: Any = None, num_samples: int, max_tree_depth: int = 10,
           leapfrogs_per_leaf: int = 1, max_delta_energy: float = 1000.0,
           uturn_criterion: str = "stan", schedule: Any = "gradient_last") -> NUTSOutput:
    """Run `num_samples` NUTS transitions on each chain, all chains in ONE
    autobatched program.

    Args:
      logdensity_fn: `x[dim] -> scalar` log density (up to a constant), JAX-traceable.
        Data it needs can be captured by closure. Use the same function object
        across calls to reuse the compiled program.
      initial_positions: `[chains, dim]`.
      keys: `[chains, 2]` uint32 (`jax.random.split(key, chains)`) or typed keys.
      step_size: scalar, or `[chains]` for per-chain step sizes.
      inverse_mass_matrix: diagonal, `[dim]` or `[chains, dim]`; default identity.
      num_samples: transitions per chain (static).
      max_tree_depth: at most `2**max_tree_depth` leaves per trajectory.
      leapfrogs_per_leaf: leapfrog steps per tree leaf (Radul et al. use 4).
      max_delta_energy: an energy error above this is a divergence (Stan: 1000).
      uturn_criterion: "stan" (default): the generalized criterion on every
        merged (sub)tree plus Stan's two extra checks across the seam of the
        merge. "numpyro": NumPyro's and BlackJAX's (one check per merge, the
        end points' momenta counted half), for like-for-like comparisons.
      schedule: "gradient_last" (default, `GradientLast`: gradient steps wait
        until every running chain is at one), "earliest" (pcbatch's default),
        or any pcbatch scheduler object. Results do not depend on it.

    Returns:
      `NUTSOutput(position [chains, num_samples, dim], logdensity [chains, num_samples],
      info: NUTSInfo)`; `info.num_integration_steps` counts gradient evaluations
      per transition (the initial gradient is not counted).
    """
    args, per_step, per_mass = prepare(initial_positions, keys, step_size, inverse_mass_matrix)
    prog = sampler(logdensity_fn, num_samples=num_samples, max_tree_depth=max_tree_depth,
                   leapfrogs_per_leaf=leapfrogs_per_leaf, max_delta_energy=max_delta_energy,
                   uturn_criterion=uturn_criterion, per_chain_step_size=per_step,
                   per_chain_mass=per_mass, schedule=schedule)
    return prog(*args)
