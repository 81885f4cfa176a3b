"""Shared by the gradient tests: the differential check against Python.

The oracle is the original Python run one example at a time with
Python-level recursion on concrete inputs (`Autobatched.reference`),
differentiated by JAX itself: `jax.vjp` of the reference (its outputs stacked
over the batch, i.e. the per-example gradients summed for shared inputs) must
equal `jax.vjp` of the autobatched call, for a random output cotangent (so a
permuted or mis-summed gradient cannot pass).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

RTOL = 1e-5

tree_map = jax.tree_util.tree_map
tree_leaves = jax.tree_util.tree_leaves


def is_float(x: Any) -> bool:
    return any(jnp.issubdtype(jnp.result_type(a), jnp.inexact) for a in tree_leaves(x))


def float_positions(args: Sequence[Any]) -> tuple[int, ...]:
    return tuple(i for i, a in enumerate(args) if is_float(a))


def random_cotangent(out: Any, seed: int = 0) -> Any:
    """Normal float cotangents, float0 zeros for integer outputs."""
    key = iter(jax.random.split(jax.random.PRNGKey(seed), len(tree_leaves(out)) + 1))

    def leaf(x):
        if jnp.issubdtype(x.dtype, jnp.inexact):
            return jax.random.normal(next(key), x.shape, x.dtype)
        return np.zeros(x.shape, jax.dtypes.float0)

    return tree_map(leaf, out)


def partial_args(fn: Callable, args: Sequence[Any], positions: Sequence[int], **kwargs) -> Callable:
    """`fn` as a function of the arguments at `positions` (the others fixed)."""
    def call(*diff):
        full = list(args)
        for i, a in zip(positions, diff):
            full[i] = a
        return fn(*full, **kwargs)
    return call


def assert_close(got: Any, want: Any, rtol: float = RTOL, what: str = "") -> None:
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want), what
    for g, w in zip(tree_leaves(got), tree_leaves(want)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape, (what, g.dtype, w.dtype, g.shape, w.shape)
        if g.dtype == jax.dtypes.float0:
            continue
        scale = float(np.max(np.abs(w), initial=0.0))
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * max(scale, 1e-3), err_msg=what)


def check_vjp(f, args: Sequence[Any], positions: Sequence[int] | None = None, seed: int = 0,
              rtol: float = RTOL, jit: bool | tuple[bool, ...] = False, **kwargs) -> Any:
    """`jax.vjp` of `f` (autobatched) equals that of `f.reference` w.r.t. the
    arguments at `positions` (default: every argument with a float leaf).
    `jit`: the autobatched vjp inside `jax.jit`; a tuple such as `(False, True)`
    checks each mode in turn against one run of the reference (the oracle's
    eager vjp costs seconds on long loops). Returns the autobatched gradients."""
    positions = float_positions(args) if positions is None else tuple(positions)
    assert positions, "nothing to differentiate"
    diff = [args[i] for i in positions]
    want_out, want_pull = jax.vjp(partial_args(f.reference, args, positions, **kwargs), *diff)
    ct = random_cotangent(want_out, seed)
    want = want_pull(ct)
    for jitted in (jit if isinstance(jit, tuple) else (jit,)):
        if jitted:
            got_out, got = jax.jit(lambda d, c: (lambda o, p: (o, p(c)))(*jax.vjp(
                partial_args(f, args, positions, **kwargs), *d)))(diff, ct)
        else:
            got_out, pull = jax.vjp(partial_args(f, args, positions, **kwargs), *diff)
            got = pull(ct)
        assert_close(got_out, want_out, what=f"primal (jit={jitted})")
        assert_close(got, want, rtol=rtol, what=f"cotangents (jit={jitted})")
        for g in tree_leaves(got):
            assert np.all(np.isfinite(np.asarray(g))) or np.asarray(g).dtype == jax.dtypes.float0
    return got
