"""`NUTSOutput` -> ArviZ `InferenceData` (`NUTSOutput.to_arviz`).

ArviZ is an optional dependency (`pip install pcbatch[mcmc]`), imported only here.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np

__all__ = ["to_arviz"]


def _posterior(position: np.ndarray, unravel_fn: Callable | None, var_name: str) -> dict[str, np.ndarray]:
    if unravel_fn is None:
        return {var_name: position}
    tree = jax.vmap(jax.vmap(unravel_fn))(position)
    if not isinstance(tree, dict):
        raise TypeError(f"unravel_fn must return a dict of named parameters, got {type(tree).__name__}")
    return {str(k): np.asarray(v) for k, v in tree.items()}


def to_arviz(out: Any, unravel_fn: Callable | None = None, var_name: str = "x", **kwargs: Any) -> Any:
    """See `NUTSOutput.to_arviz`."""
    try:
        import arviz as az
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("NUTSOutput.to_arviz needs ArviZ: pip install 'pcbatch[mcmc]' (or arviz)") from e
    position = np.asarray(out.position)
    chains, draws = position.shape[:2]
    info = out.info
    step = np.broadcast_to(np.asarray(out.step_size)[:, None], (chains, draws))
    stats = {"lp": np.asarray(out.logdensity), "acceptance_rate": np.asarray(info.acceptance_rate),
             "diverging": np.asarray(info.is_divergent), "tree_depth": np.asarray(info.num_trajectory_expansions),
             "n_steps": np.asarray(info.num_integration_steps), "energy": np.asarray(info.energy),
             "step_size": step}
    return az.from_dict(posterior=_posterior(position, unravel_fn, var_name), sample_stats=stats, **kwargs)
