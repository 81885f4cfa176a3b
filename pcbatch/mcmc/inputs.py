"""What `nuts.sample` is given: checks that turn bad input into named errors,
the sampler's cache keys, keys and noise, and small cached constants."""
from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

import pcbatch
from pcbatch import threefry


def index_dtype() -> str:
    return jax.dtypes.canonicalize_dtype(np.int64).name  # int32 unless x64


@functools.lru_cache(maxsize=256)
def constant(shape: tuple[int, ...], value: Any, dtype: str) -> jax.Array:
    """A small argument `prepare` builds the same way on every call (a default
    mass matrix, a scalar step size, a budget): made once, not dispatched per
    call (a 1-chain call lasts ~1 ms; each dispatch costs ~15 us). Immutable,
    and the machine donates only its workspace, so sharing it is safe.
    Made outside any trace: a cached tracer would break every later call."""
    with jax.ensure_compile_time_eval():
        return jnp.full(shape, value, dtype)


class ByIdentity:
    """An unhashable log density or scheduler (an object with `__eq__` and no hash: a
    dataclass, an Equinox module holding arrays) as a cache key: by identity, as
    `jax.jit` keys functions. The cache keeps it alive, so its id is not reused."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any):
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, ByIdentity) and other.obj is self.obj


def cache_key(obj: Any) -> Any:
    """`obj` as a key of the sampler's caches."""
    try:
        hash(obj)
    except TypeError:
        return ByIdentity(obj)
    return obj


def from_cache_key(key: Any) -> Any:
    return key.obj if isinstance(key, ByIdentity) else key


def invalid(message: str, hint: str = "") -> pcbatch.ArgumentError:
    """Bad input to the sampler: a named pcbatch error (also a ValueError)."""
    return pcbatch.ArgumentError("pcbatch.mcmc.nuts", message, hint)


def as_array(name: str, value: Any, dtype: Any) -> jax.Array:
    """An argument as an array of `dtype`, or a named error (a string, None, a ragged list)."""
    try:
        return jnp.asarray(value, dtype)
    except (TypeError, ValueError) as e:
        raise invalid(f"{name} must be an array of numbers, got a {type(value).__name__} ({e})") from None


def concrete(x: Any) -> np.ndarray | None:
    """`x`'s values where this process knows them (None inside a caller's jit, or for
    a global array spread over several processes)."""
    if isinstance(x, jax.core.Tracer) or not getattr(x, "is_fully_addressable", True):
        return None
    return np.asarray(x)


@functools.lru_cache(maxsize=64)
def _start_values(logdensity_fn: Callable) -> Callable:
    return jax.jit(jax.vmap(jax.value_and_grad(from_cache_key(logdensity_fn))))


@functools.lru_cache(maxsize=64)  # a trace costs ~0.3 ms: not on every call
def _not_a_float_scalar(logdensity_fn: Callable, shape: tuple[int, ...], dtype: str) -> str:
    """What `logdensity_fn` returns for one position, where that is not a float scalar, else ""."""
    try:
        out = jax.eval_shape(from_cache_key(logdensity_fn), jax.ShapeDtypeStruct(shape, dtype))
    except Exception:  # its own error, where the sampler traces it
        return ""
    if not isinstance(out, jax.ShapeDtypeStruct):
        return type(out).__name__
    return "" if out.shape == () and jnp.issubdtype(out.dtype, jnp.floating) else f"{out.dtype}{list(out.shape)}"


def check_start(logdensity_fn: Callable, x: jax.Array) -> None:
    """A chain whose log density or gradient is not finite where it starts
    never moves (every proposal's weight is NaN or its own is -inf): a named
    error, before sampling, where the positions are known. A log density that
    is not a float scalar is one wherever they are."""
    got = _not_a_float_scalar(cache_key(logdensity_fn), x.shape[1:], x.dtype.name)
    if got:
        raise invalid(f"logdensity_fn must return a float scalar for one position [{x.shape[-1]}], got {got}",
                      "sum the terms of the log density: jnp.sum(...) (jax.grad needs a scalar)")
    if concrete(x) is None:
        return
    with jax.ensure_compile_time_eval():  # positions known inside a caller's jit (closed over): evaluated now
        logp, grad = _start_values(cache_key(logdensity_fn))(x)
    if concrete(logp) is None or concrete(grad) is None:  # the density reads a tracer (data the jit is given)
        return
    logp, grad = np.asarray(logp), np.asarray(grad)
    bad = ~np.isfinite(logp) | ~np.isfinite(grad).reshape(len(grad), -1).all(axis=1)
    if bad.any():
        chains = np.nonzero(bad)[0].tolist()
        shown = ", ".join(f"chain {c}: log density {logp[c]}" + ("" if np.isfinite(grad[c]).all() else
                                                                 ", gradient not finite")
                          for c in chains[:10])
        raise invalid(f"the log density or its gradient is not finite at the initial positions of "
                      f"{len(chains)} chain(s) ({shown})",
                      "start every chain inside the support, where logdensity_fn and its gradient are "
                      "finite (e.g. at a draw from the prior, or at zeros of an unconstrained parametrization)")


def raw_keys(keys: Any, chains: int) -> jax.Array:
    """`[chains, 2]` raw keys from as many keys, or from ONE key (split in `chains`)."""
    if not isinstance(keys, jax.Array):
        try:
            keys = jnp.asarray(keys)
        except (TypeError, ValueError) as e:
            raise invalid(f"keys must be one key or one per chain (jax.random.split(key, chains)), got a "
                          f"{type(keys).__name__} ({e})") from None
    if jnp.issubdtype(keys.dtype, jax.dtypes.prng_key):
        keys = jax.random.key_data(keys)
    if keys.shape == (2,) and keys.dtype == jnp.uint32:
        keys = threefry.split(keys, chains)  # one key for all chains, as BlackJAX users pass (jax.random's keys)
    if keys.ndim != 2 or keys.dtype != jnp.uint32:
        raise invalid(f"keys must be one key, [chains, 2] uint32 (jax.random.split(key, chains)) "
                      f"or [chains] typed keys; got {keys.shape} {keys.dtype}")
    return keys


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def split_keys(keys: jax.Array, num_transitions: int, dim: int, dtype: str) -> tuple[jax.Array, jax.Array]:
    """Each chain's key -> (the tree's key, the standard normal noise of its
    momenta, one row per transition, in the positions' `dtype`). Drawn before the loop: inside it, a
    normal draw for the few chains starting a transition would cost every lane."""
    def one(key):
        k_tree, k_noise = threefry.split(key)
        return k_tree, threefry.normal(k_noise, (num_transitions, dim), dtype)
    return jax.vmap(one)(keys)
