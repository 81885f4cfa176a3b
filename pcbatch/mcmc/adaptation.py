"""Warm-up adaptation for `pcbatch.mcmc.nuts`, run per chain inside the sampler's loop.

* Step size: Nesterov dual averaging of log(step size) towards a target mean
  acceptance statistic (Hoffman & Gelman 2014, Algorithm 5, with Stan's
  constants).
* Window adaptation (`adaptation="window"`), Stan's schedule (Stan Reference
  Manual, "HMC algorithm parameters: automatic parameter tuning"): an initial
  fast window (step size only), then slow windows that double in length, each
  estimating the diagonal inverse mass matrix from its own draws (Welford's
  running variance, shrunk towards 1e-3 as Stan does) and restarting dual
  averaging from the current step size, then a final fast window. The last
  slow window is stretched to meet the final one.

The schedule is static (it depends on `num_warmup` only), so the sampler
indexes two boolean tables with the transition number; every chain adapts
its own step size and mass matrix without waiting for the others.

    >>> from pcbatch.mcmc import adaptation
    >>> [(w.start, w.stop) for w in adaptation.slow_windows(1000)]
    [(75, 100), (100, 150), (150, 250), (250, 450), (450, 950)]
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["DualAveraging", "Welford", "Window", "dual_averaging_start", "dual_averaging_update",
           "mass_start", "schedule", "slow_windows", "welford_start", "window_update"]


# --------------------------------------------------------------------------
# the schedule (numpy, static)
# --------------------------------------------------------------------------

class Window(NamedTuple):
    start: int   # first warm-up transition (0-based) whose draw is accumulated
    stop: int    # one past the last; the mass matrix is updated after transition stop - 1


def slow_windows(num_warmup: int, initial_buffer: int = 75, first_window: int = 25,
                 final_buffer: int = 50) -> list[Window]:
    """Stan's slow windows for `num_warmup` transitions. With fewer than 20
    there are none (step size only). When the three default sizes do not fit,
    Stan's fallback: 15% initial buffer, 10% final buffer, one slow window
    in between."""
    if num_warmup < 20:
        return []
    if initial_buffer + first_window + final_buffer > num_warmup:
        initial_buffer = int(0.15 * num_warmup)
        final_buffer = int(0.1 * num_warmup)
        first_window = num_warmup - initial_buffer - final_buffer
    end = num_warmup - final_buffer          # where the final fast window starts
    windows, start, size = [], initial_buffer, first_window
    while start < end:
        # The next window (twice as long) must fit before the final buffer;
        # if it would not, this one takes the rest.
        stop = start + size if start + 3 * size <= end else end
        windows.append(Window(start, stop))
        start, size = stop, 2 * size
    return windows


def schedule(num_warmup: int, **sizes: int) -> tuple[np.ndarray, np.ndarray]:
    """Per warm-up transition: `(slow, window_end)` booleans, `[num_warmup + 1]`
    (one spare entry, False, so the sampler may index with `num_warmup`)."""
    slow = np.zeros(num_warmup + 1, bool)
    end = np.zeros(num_warmup + 1, bool)
    for w in slow_windows(num_warmup, **sizes):
        slow[w.start:w.stop] = True
        end[w.stop - 1] = True
    return slow, end


# --------------------------------------------------------------------------
# dual averaging (traced inline in the sampler)
# --------------------------------------------------------------------------

class DualAveraging(NamedTuple):
    """Nesterov dual averaging of log(step size) (Hoffman & Gelman 2014, Alg. 5,
    as Stan does it, with its constants; BlackJAX averages the previous iterate)."""
    step_size: Any      # the step size the next transition uses
    log_step: Any
    log_step_avg: Any
    h_avg: Any          # running mean of (target - acceptance statistic)
    mu: Any             # shrinkage target, log(10 * initial step size)
    start: Any = 0      # the transition at which it (re)started: its iterations count from there


def dual_averaging_start(step_size: Any, dtype: Any, start: Any = 0) -> DualAveraging:
    step = jnp.asarray(step_size, dtype)
    zero = jnp.zeros((), dtype)
    return DualAveraging(step, jnp.log(step), zero, zero, jnp.log(10.0 * step), jnp.asarray(start, jnp.int32))


def _where(c, a, b):
    return jax.tree_util.tree_map(lambda u, v: jnp.where(c, u, v), a, b)


def dual_averaging_update(state: DualAveraging, i: Any, accept: Any, num_warmup: int, target: float,
                          gamma: float = 0.05, t0: float = 10.0, kappa: float = 0.75) -> DualAveraging:
    """After transition i (0-based) of `num_warmup`: the step size for the
    next one; after the last, the averaged step size, kept from then on."""
    if num_warmup == 0:
        return state
    t = jnp.asarray(i + 1 - state.start, state.h_avg.dtype)
    h_avg = (1.0 - 1.0 / (t + t0)) * state.h_avg + (target - accept) / (t + t0)
    log_step = state.mu - jnp.sqrt(t) / gamma * h_avg
    eta = t ** -kappa
    log_step_avg = eta * log_step + (1.0 - eta) * state.log_step_avg
    step = jnp.where(i + 1 < num_warmup, jnp.exp(log_step), jnp.exp(log_step_avg))
    new = DualAveraging(step.astype(state.step_size.dtype), log_step, log_step_avg, h_avg, state.mu,
                        jnp.asarray(state.start, jnp.int32))
    return _where(i < num_warmup, new, state)


# --------------------------------------------------------------------------
# the mass matrix (traced inline in the sampler)
# --------------------------------------------------------------------------

class Welford(NamedTuple):
    """Running mean and sum of squared deviations of the current slow window's draws."""
    count: Any
    mean: Any
    m2: Any


def welford_start(x: Any, enabled: bool) -> Welford:
    """Empty accumulators shaped like `x`; zero-sized when window adaptation is
    off, so that the sampler carries nothing for it."""
    shape = x.shape if enabled else (0,)
    return Welford(jnp.zeros((), x.dtype), jnp.zeros(shape, x.dtype), jnp.zeros(shape, x.dtype))


def mass_start(inv_mass: Any, x: Any, enabled: bool) -> Any:
    """The adapted inverse mass matrix's starting value: the given one, or an
    empty array when window adaptation is off (the sampler then uses the
    argument itself)."""
    return jnp.broadcast_to(inv_mass, x.shape).astype(x.dtype) if enabled else jnp.zeros((0,), x.dtype)


def _regularized_variance(w: Welford) -> Any:
    """Stan's: the window's sample variance shrunk towards 1e-3 with weight 5 / (n + 5)."""
    n = w.count
    var = w.m2 / jnp.maximum(n - 1.0, 1.0)
    return (n / (n + 5.0)) * var + 1e-3 * (5.0 / (n + 5.0))


def window_update(tables: Any, i: Any, x: Any, welford: Welford, inv_mass: Any,
                  da: DualAveraging) -> tuple[Welford, Any, DualAveraging]:
    """After warm-up transition i landed on x: accumulate x if i is in a slow
    window; at a window's end set the inverse mass matrix to the window's
    regularized variance, empty the accumulators and restart dual averaging
    from the current step size (Stan). `tables` is `None` (no window
    adaptation: everything passes through) or `(slow, window_end)` as jnp
    arrays from `schedule`, indexed with `min(i, num_warmup)`."""
    if tables is None:
        return welford, inv_mass, da
    slow_table, end_table = tables
    k = jnp.minimum(i, slow_table.shape[0] - 1)
    slow, end = slow_table[k], end_table[k]
    count = welford.count + 1.0
    delta = x - welford.mean
    mean = welford.mean + delta / count
    m2 = welford.m2 + delta * (x - mean)
    welford = _where(slow, Welford(count, mean, m2), welford)
    inv_mass = jnp.where(end, _regularized_variance(welford).astype(inv_mass.dtype), inv_mass)
    welford = _where(end, Welford(jnp.zeros_like(welford.count), jnp.zeros_like(mean), jnp.zeros_like(m2)),
                     welford)
    restart = dual_averaging_start(da.step_size, da.step_size.dtype, i + 1)
    # `da.step_size` is already the next iterate exp(log_step): Stan restarts there.
    return welford, inv_mass, _where(end, restart, da)
