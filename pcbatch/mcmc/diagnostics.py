"""Convergence diagnostics for `[chains, draws, ...]` samples (NumPy).

    >>> from pcbatch.mcmc import diagnostics, nuts
    >>> out = nuts.sample(...)                          # doctest: +SKIP
    >>> diagnostics.summary(out.position)               # doctest: +SKIP
    {'mean': ..., 'sd': ..., 'rhat': ..., 'ess': ...}

`rhat` is the split-R-hat and `ess` the effective sample size with Geyer's
initial monotone sequence estimator, both as in Gelman et al., *Bayesian Data
Analysis* (3rd ed., section 11.4-11.5) and Stan (without rank normalization).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from pcbatch.errors import ArgumentError

__all__ = ["ess", "rhat", "summary"]


def _as_draws(x: Any) -> np.ndarray:
    """`[chains, draws, ...]` with at least 4 draws: split chains of 1 draw have no
    variance (`ess` divided by zero and returned a number, or failed to reshape)."""
    x = np.asarray(x, np.float64)
    if x.ndim < 2:
        raise _invalid(f"samples must be [chains, draws, ...], got shape {x.shape}")
    if x.shape[1] < 4:
        raise _invalid(f"split R-hat and ESS need at least 4 draws per chain (each chain is halved), got "
                       f"{x.shape[1]} (samples of shape {x.shape})", "sample with num_samples >= 4")
    return x


def _invalid(message: str, hint: str = "") -> ArgumentError:
    return ArgumentError("pcbatch.mcmc.diagnostics", message, hint)


def _split(x: np.ndarray) -> np.ndarray:
    """Each chain cut into its first and second half: [2 * chains, draws // 2, ...]."""
    half = x.shape[1] // 2
    return np.concatenate([x[:, :half], x[:, x.shape[1] - half:]], axis=0)


def rhat(samples: Any) -> np.ndarray:
    """Split-R-hat per parameter (shape `samples.shape[2:]`); ~1 when chains agree."""
    x = _split(_as_draws(samples))
    m, n = x.shape[:2]
    chain_means = x.mean(axis=1)
    between = n * chain_means.var(axis=0, ddof=1)
    within = x.var(axis=1, ddof=1).mean(axis=0)
    var_plus = (n - 1) / n * within + between / n
    return np.sqrt(var_plus / within)


def _autocov(x: np.ndarray) -> np.ndarray:
    """Autocovariance along axis 1 (biased, as in Stan), via FFT."""
    n = x.shape[1]
    centered = x - x.mean(axis=1, keepdims=True)
    size = 2 ** int(np.ceil(np.log2(2 * n)))
    f = np.fft.rfft(centered, size, axis=1)
    return np.fft.irfft(f * np.conj(f), size, axis=1)[:, :n] / n


def ess(samples: Any) -> np.ndarray:
    """Effective sample size per parameter, over all chains (shape `samples.shape[2:]`)."""
    x = _split(_as_draws(samples))
    m, n = x.shape[:2]
    flat = x.reshape(m, n, -1)
    out = np.empty(flat.shape[2])
    for k in range(flat.shape[2]):
        acov = _autocov(flat[:, :, k])                       # [m, n]
        chain_var = acov[:, 0] * n / (n - 1)
        within = chain_var.mean()
        var_plus = within * (n - 1) / n + (flat[:, :, k].mean(axis=1).var(ddof=1) if m > 1 else 0.0)
        if var_plus <= 0:
            out[k] = np.nan
            continue
        rho = 1.0 - (within - acov.mean(axis=0)) / var_plus   # combined autocorrelation, rho[0] = 1
        rho[0] = 1.0
        # Geyer: sums of adjacent pairs, truncated at the first negative, made monotone;
        # as Stan, the first negative pair's leading term counts once where it is positive.
        pairs = rho[: 2 * (n // 2)].reshape(-1, 2).sum(axis=1)
        neg = np.nonzero(pairs < 0)[0]
        tail = max(rho[2 * neg[0]], 0.0) if len(neg) else 0.0
        pairs = pairs[: neg[0]] if len(neg) else pairs
        pairs = np.minimum.accumulate(pairs)
        tau = -1.0 + 2.0 * pairs.sum() + tail
        tau = max(tau, 1.0 / np.log10(m * n)) if m * n > 1 else tau
        out[k] = m * n / tau
    return out.reshape(x.shape[2:])


def summary(samples: Any) -> dict[str, np.ndarray]:
    """Mean, standard deviation, split-R-hat and ESS per parameter."""
    x = _as_draws(samples)
    return {"mean": x.mean(axis=(0, 1)), "sd": x.std(axis=(0, 1), ddof=1), "rhat": rhat(x), "ess": ess(x)}
