"""NUTS for one chain, the arithmetic: the integrator's edge, the running
totals over a subtree's leaves, the no-U-turn checks and the merges (Stan's
and BlackJAX's multinomial NUTS). Plain JAX functions, traced inline into the
blocks of the autobatched program (`nuts.py`)."""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from pcbatch import threefry
from pcbatch.mcmc.inputs import index_dtype



class Edge(NamedTuple):
    """The integrator's state at the growing end of the trajectory. Inside
    `build_tree` the momentum of a backward subtree is negated, so every
    subtree is integrated forward (with the same step) and never needs to
    know its direction: the no-U-turn checks only compare momenta with each
    other, so they read the same with all of them negated."""
    x: Any
    p: Any
    g: Any
    logp: Any


class Acc(NamedTuple):
    """Running totals over the leaves of the subtree being added to the
    trajectory (one doubling). `build_tree` takes them and returns them, so
    the recursion never saves them on a stack: the multinomial proposal among
    the leaves so far (reservoir sampling: each leaf replaces it with
    probability weight / total weight, so it ends up distributed as the
    weights, as the per-merge choice of Stan/BlackJAX), the log of the summed
    weights exp(H0 - H), the sum of min(1, exp(H0 - H)), the number of leaves,
    a divergence flag; `H0`, the step size, the random key and the adapted
    inverse mass matrix (window adaptation; else empty) ride along."""
    prop_x: Any
    prop_g: Any
    prop_logp: Any
    log_weight: Any
    sum_metro: Any
    n_leaves: Any
    divergent: Any
    H0: Any
    step_size: Any
    key: Any
    inv_mass: Any


class Subtree(NamedTuple):
    """What the caller of `build_tree` needs about the subtree for the
    no-U-turn checks of the merge (momenta in the subtree's own frame)."""
    rho: Any        # summed momenta of its leaves
    p_beg: Any      # momentum of its first leaf (Stan's criterion; else empty)
    valid: Any      # no divergence and no U-turn inside


class Trajectory(NamedTuple):
    """The top-level trajectory of one transition, in time order."""
    left: Edge
    right: Edge
    rho: Any
    log_weight: Any
    prop_x: Any
    prop_logp: Any
    prop_g: Any


def kinetic(p, inv_mass):
    return 0.5 * jnp.sum(inv_mass * p * p)


def no_uturn(p_minus, p_plus, rho, inv_mass, criterion):
    """The generalized criterion: both ends' velocities still point along the
    summed momentum `rho` of the (sub)trajectory between them. NumPyro and
    BlackJAX count the two end points with weight 1/2 in `rho`."""
    if criterion == "numpyro":
        rho = rho - 0.5 * (p_minus + p_plus)
    return (jnp.dot(inv_mass * p_plus, rho) > 0) & (jnp.dot(inv_mass * p_minus, rho) > 0)


def where(c, a, b):
    return jax.tree_util.tree_map(lambda u, v: jnp.where(c, u, v), a, b)


def per_chain(flag):
    """`flag`, computed once per chain. XLA fuses a chain's scalar into every
    `[chains, dim]` select that reads it and recomputes it there per element:
    a threefry hash (~100 ops) ten times over on a 10-d target. A reduction
    is a kernel of its own, so the value behind it is computed once (eight
    schools and the funnel at 128 chains: 1.2-1.3x faster per call)."""
    return jnp.any(jnp.stack([flag, jnp.zeros_like(flag)]), axis=0)


def leaf(value_and_grad, steps, edge, acc, inv_mass, max_delta_energy):
    """`steps` leapfrog steps from the edge; the last state is the leaf. It
    joins the running totals (and maybe becomes the proposal)."""
    x, p, g, logp = edge
    step_size = acc.step_size
    for _ in range(steps):
        p = p + 0.5 * step_size * g
        x = x + step_size * inv_mass * p
        logp, g = value_and_grad(x)
        p = p + 0.5 * step_size * g
    H = -logp + kinetic(p, inv_mass)
    delta = acc.H0 - jnp.where(jnp.isnan(H), jnp.inf, H)
    divergent = -delta > max_delta_energy
    key, k_take = threefry.split(acc.key)
    log_weight = jnp.logaddexp(acc.log_weight, delta)
    take = per_chain(threefry.uniform(k_take) < jnp.exp(delta - log_weight))
    acc = Acc(prop_x=jnp.where(take, x, acc.prop_x), prop_g=jnp.where(take, g, acc.prop_g),
              prop_logp=jnp.where(take, logp, acc.prop_logp), log_weight=log_weight,
              sum_metro=acc.sum_metro + jnp.minimum(1.0, jnp.exp(delta)).astype(x.dtype),
              n_leaves=acc.n_leaves + 1, divergent=acc.divergent | divergent, H0=acc.H0,
              step_size=acc.step_size, key=key, inv_mass=acc.inv_mass)
    return Edge(x, p, g, logp), acc


def seam(p, criterion):
    """A momentum only Stan's extra checks across a merge read: with the
    NumPyro/BlackJAX criterion an empty array, so it costs no stack traffic."""
    return p if criterion == "stan" else p[:0]


def join(p_beg, p_end, rho, sub, p_new_end, inv_mass, criterion):
    """The no-U-turn checks for a tree (first momentum `p_beg`, last `p_end`,
    summed `rho`) joined with the subtree that follows it (ending at
    `p_new_end`): on the joined tree, and with Stan's criterion also the two
    across the seam. Returns the joined tree's `rho` and whether it is valid."""
    rho_all = rho + sub.rho
    persist = no_uturn(p_beg, p_new_end, rho_all, inv_mass, criterion)
    if criterion == "stan":
        persist = (persist & no_uturn(p_beg, sub.p_beg, rho + sub.p_beg, inv_mass, criterion)
                   & no_uturn(p_end, p_new_end, sub.rho + p_end, inv_mass, criterion))
    return rho_all, sub.valid & persist


def bottom(value_and_grad, steps, levels, depth, edge, acc, inv_mass, max_delta_energy, criterion):
    """The bottom `levels` levels of the recursion, unrolled into one block: a
    subtree of depth `min(depth, levels)`, its 2**levels leaves computed in
    one machine step, so the blocks between gradient steps are paid once per
    2**levels leaves (`leaves_per_step`). Leaves past what the subtree needs
    are wasted (computed, not used or counted): past `depth` (a transition's
    first doublings), or after a half that diverged or turned.
    Returns the edge, the running totals, and the subtree's rho, first
    momentum and validity."""
    if levels == 0:
        edge, acc = leaf(value_and_grad, steps, edge, acc, inv_mass, max_delta_energy)
        return edge, acc, edge.p, edge.p, ~acc.divergent
    args = (inv_mass, max_delta_energy, criterion)
    edge1, acc1, rho1, p_beg, valid1 = bottom(value_and_grad, steps, levels - 1, depth, edge, acc, *args)
    # The second half: a whole subtree of depth levels - 1, joined on.
    edge2, acc2, rho2, p_beg2, valid2 = bottom(value_and_grad, steps, levels - 1, levels - 1, edge1, acc1, *args)
    second = Subtree(rho2, seam(p_beg2, criterion), valid2)
    rho, valid = join(p_beg, seam(edge1.p, criterion), rho1, second, edge2.p, inv_mass, criterion)
    use2 = per_chain(valid1 & (depth >= levels))
    return (where(use2, edge2, edge1), where(use2, acc2, acc1), jnp.where(use2, rho, rho1), p_beg,
            jnp.where(use2, valid, valid1))


def start(x, p, g, logp):
    edge = Edge(x, p, g, logp)
    return Trajectory(left=edge, right=edge, rho=p, log_weight=jnp.zeros((), x.dtype),
                      prop_x=x, prop_logp=logp, prop_g=g)


def outer_edge(traj, forward):
    """The end to extend from, in the subtree's frame (momentum negated going backward)."""
    e = where(forward, traj.right, traj.left)
    return Edge(e.x, jnp.where(forward, e.p, -e.p), e.g, e.logp)


def fresh_acc(edge, H0, step_size, key, adapted_mass):
    return Acc(prop_x=edge.x, prop_g=edge.g, prop_logp=edge.logp,
               log_weight=jnp.full((), -jnp.inf, edge.x.dtype), sum_metro=jnp.zeros((), edge.x.dtype),
               n_leaves=jnp.zeros((), index_dtype()), divergent=jnp.zeros((), bool), H0=H0, step_size=step_size,
               key=key, inv_mass=adapted_mass)


def mass(adapted, inv_mass):
    """The inverse mass matrix in use: the adapted one (window adaptation),
    else the argument. Kept apart so that without window adaptation the
    argument stays a constant of the machine, not a value pushed with every
    recursive call."""
    return adapted if adapted.shape[0] else inv_mass


def extend(traj, edge, acc, sub, forward, key, inv_mass, criterion):
    """Merge a new subtree (its far end `edge`, totals `acc`, summary `sub`,
    in its own frame) into the trajectory if it is valid: biased progressive
    sampling of the proposal, then the no-U-turn checks (Stan's: three).
    Returns the trajectory (unchanged for an invalid subtree) and whether it
    keeps going."""
    sign = jnp.where(forward, 1.0, -1.0).astype(edge.x.dtype)
    end = Edge(edge.x, sign * edge.p, edge.g, edge.logp)
    sub_rho, sub_p_beg = sign * sub.rho, sign * sub.p_beg
    take = per_chain(sub.valid & (threefry.uniform(key) < jnp.exp(acc.log_weight - traj.log_weight)))
    left = where(forward, traj.left, end)
    right = where(forward, end, traj.right)
    rho = traj.rho + sub_rho
    persist = no_uturn(left.p, right.p, rho, inv_mass, criterion)
    if criterion == "stan":
        # bck / fwd: the earlier and the later part in time order.
        bck_right_p = jnp.where(forward, traj.right.p, sub_p_beg)
        fwd_left_p = jnp.where(forward, sub_p_beg, traj.left.p)
        rho_bck = jnp.where(forward, traj.rho, sub_rho)
        rho_fwd = jnp.where(forward, sub_rho, traj.rho)
        persist = (persist & no_uturn(left.p, fwd_left_p, rho_bck + fwd_left_p, inv_mass, criterion)
                   & no_uturn(bck_right_p, right.p, rho_fwd + bck_right_p, inv_mass, criterion))
    new = Trajectory(left=left, right=right, rho=rho, log_weight=jnp.logaddexp(traj.log_weight, acc.log_weight),
                     prop_x=jnp.where(take, acc.prop_x, traj.prop_x),
                     prop_logp=jnp.where(take, acc.prop_logp, traj.prop_logp),
                     prop_g=jnp.where(take, acc.prop_g, traj.prop_g))
    return where(sub.valid, new, traj), persist


def transition_start(x, logp, g, key, noise, inv_mass):
    """Transition i's momentum (from standard normal `noise`) and the one-point trajectory at x."""
    key, k_traj = threefry.split(key)
    p = noise / jnp.sqrt(inv_mass)
    H0 = -logp + kinetic(p, inv_mass)
    return key, k_traj, H0, start(x, p, g, logp)
