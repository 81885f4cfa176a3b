"""What the passes share about JAX's side of the IR: a variable's type (a
pytree of `ShapeDtypeStruct`s) as a hashable key, and an op's jaxpr walked
to any depth."""
from __future__ import annotations

import weakref
from typing import Any, Callable, Iterator

import jax
from jax.extend import core as jex


def type_key(t: Any) -> tuple:
    """A hashable identity of a pytree of types."""
    leaves, treedef = jax.tree_util.tree_flatten(t)
    return treedef, tuple((l.shape, l.dtype, getattr(l, "weak_type", False)) for l in leaves)


def all_eqns(jaxpr: Any) -> Iterator[Any]:
    """Every equation of `jaxpr` and of the jaxprs in its equations' parameters
    (`jit`, `cond`, `while`, ...), each before those inside it."""
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in jex.jaxprs_in_params(eqn.params):
            yield from all_eqns(sub)


# Op functions whose JAX code holds a `while` loop (`lax.while_loop`, a `fori_loop` with traced
# bounds, `jax.random.gamma`): noted when their types are inferred, read when a block runs.
_LOOPING: "weakref.WeakSet[Callable]" = weakref.WeakSet()


def note_loops(fn: Callable, jaxpr: Any) -> None:
    if any(eqn.primitive.name == "while" for eqn in all_eqns(jaxpr)):
        mark_looping(fn)


def mark_looping(fn: Callable) -> None:
    """Note that `fn` runs a `while` loop: an op made of others (the memory layout's batched
    runs) that runs one of theirs."""
    try:
        _LOOPING.add(fn)
    except TypeError:  # not weakly referenceable: never marked
        pass


def has_loop(fn: Callable) -> bool:
    """Whether `fn`'s JAX code holds a `while` loop (see `note_loops`)."""
    try:
        return fn in _LOOPING
    except TypeError:
        return False
