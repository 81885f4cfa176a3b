"""Schedulers for NUTS's autobatched program: the gradient block (the leaf)
last, or once a quorum of chains waits there."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from pcbatch.fsm import follow_order
from pcbatch.mcmc.inputs import invalid


class GradientLast:
    """The default NUTS scheduler: run the earliest ready block, except the
    leaf block (the gradient evaluations), which runs only when no lane is
    ready anywhere else. Every lane can always reach its next leaf without
    running a leaf, so each leaf step evaluates the gradient for every chain
    that has not finished all its transitions: the batch synchronizes on
    gradients only, across trajectory and transition boundaries.

    With `follow` (the default) every step also runs the other blocks once
    each, in the order a lane leaves the leaf (`pcbatch.ir.flow.follow_order`),
    for the lanes waiting at them: a chain returns, joins its subtree and
    calls the next one in the step of its gradient, not in steps of their own.
    `follow="all"` follows the leaf too, and the blocks before it: every step
    runs every block once for the lanes at it, so with masked follow blocks
    (`pcbatch.Tuning.masked_follow`) a step holds no conditional at all.
    """

    name = "gradient_last"

    def __init__(self, leaf: int, follow: bool | str = True):
        if not (isinstance(follow, bool) or follow == "all"):
            raise invalid(f"follow must be True, False or 'all', got {follow!r}")
        self.leaf, self.follows = int(leaf), follow
        self.follow: tuple[int, ...] = ()  # the blocks, once bound to a program

    def for_program(self, prog: Any) -> "GradientLast":
        bound = GradientLast(self.leaf, self.follows)
        if self.follows:
            after = follow_order(prog.blocks, self.leaf)
            if self.follows == "all":
                before = tuple(b for b in range(len(prog.blocks)) if b != self.leaf and b not in after)
                after = before + (self.leaf,) + after
            bound.follow = after
        return bound

    def init(self, num_blocks: int, num_lanes: int) -> Any:
        return ()

    def choose(self, carry: Any, frontier: Any) -> tuple[jax.Array, Any]:
        num_blocks = frontier.counts.shape[0]
        other = jnp.min(jnp.where(frontier.pc == self.leaf, num_blocks, frontier.pc))
        return jnp.where(other < num_blocks, other, self.leaf), carry

    def __repr__(self) -> str:
        return f"GradientLast(leaf=b{self.leaf}{'' if self.follows is True else f', follow={self.follows!r}'})"


class GradientQuorum:
    """A NUTS scheduler: run the leaf block (the gradient
    evaluations) once at least `quorum` of the running chains wait there, or
    when nothing else is ready; otherwise the other block with the most
    chains waiting, weighted by how many steps it has waited (so none
    starves). Waiting for every chain (`GradientLast`) makes each gradient
    step wait for the one chain that unwinds the deepest recursion; a quorum
    lets that chain catch up at the next gradient step instead. Measured
    (`benchmarks/nuts.py`, 2026-11-26): no fewer machine steps per gradient,
    lower utilization (61% against 81% on the Gaussian at 128 chains) and
    0.74-1.0x `GradientLast`'s throughput, hence not the default."""

    name = "gradient_quorum"

    def __init__(self, leaf: int, quorum: float = 0.5):
        if not 0.0 < quorum <= 1.0:
            raise invalid(f"quorum must be in (0, 1], got {quorum}")
        self.leaf, self.quorum = int(leaf), float(quorum)

    def init(self, num_blocks: int, num_lanes: int) -> Any:
        return jnp.zeros((num_blocks,), jnp.int32)  # steps each block has waited with lanes ready

    def choose(self, age: Any, frontier: Any) -> tuple[jax.Array, Any]:
        counts = frontier.counts
        others = (counts > 0) & (jnp.arange(counts.shape[0]) != self.leaf)
        score = jnp.where(others, counts * (1 + age), -1)
        other = jnp.argmax(score).astype(jnp.int32)
        leaf = (counts[self.leaf] >= self.quorum * jnp.sum(counts)) | ~jnp.any(others)
        block = jnp.where(leaf, jnp.int32(self.leaf), other)
        age = jnp.where(counts > 0, age + 1, 0).at[block].set(0)
        return block, age

    def __repr__(self) -> str:
        return f"GradientQuorum(leaf=b{self.leaf}, quorum={self.quorum})"
