"""The scheduler interface: how the machine asks which block to run next.

A scheduler runs *inside* the `lax.while_loop`, so it is pure traced JAX: it
sees a `Frontier` (where every lane is waiting) and returns one block index.
It may keep a small carry of its own between steps.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from pcbatch.ir.core import Return


class Frontier(NamedTuple):
    """What a scheduler may look at each VM step.

    pc:     int32[lanes] block each lane waits at; `num_blocks` means halted
            (or, with fork-join, blocked on children).
    counts: int32[num_blocks] number of ready lanes per block.
    depth:  int32[lanes] blocks each lane's thread has executed so far
            (its topological depth in the executed chain/DAG).
    earliest: the lowest block with a ready lane, where the machine knows it
            cheaper than `min(pc)` (the fork-join pool: from `counts`, not
            from every lane of the pool), or None.
    """

    pc: jax.Array
    counts: jax.Array
    depth: jax.Array
    earliest: jax.Array | None = None


class Scheduler(Protocol):
    """Chooses the next block. `choose` must return a block with counts > 0
    whenever any count is positive.

    A scheduler may also name `follow`: blocks the plain machine runs after
    the chosen one in every step, in that order, each for the lanes waiting
    at it then (a lane can pass through several in one step). Cheap control
    blocks between two expensive ones then cost no steps of their own
    (`pcbatch.ir.flow.follow_order` gives an order). A chosen block that is
    also followed runs once, in its place in that order."""

    def init(self, num_blocks: int, num_lanes: int) -> Any: ...

    def choose(self, carry: Any, frontier: Frontier) -> tuple[jax.Array, Any]: ...


class Earliest:
    """Radul et al.'s default: the lowest-numbered block with a ready lane."""

    name = "earliest"

    def init(self, num_blocks: int, num_lanes: int) -> Any:
        return ()

    def choose(self, carry: Any, frontier: Frontier) -> tuple[jax.Array, Any]:
        if frontier.earliest is not None:
            return frontier.earliest, carry
        # Halted lanes sit at num_blocks, so the minimum pc is the earliest ready block.
        return jnp.min(frontier.pc), carry

    def __call__(self, sim: Any) -> int:
        """The host twin (a policy for `fsm.simulate`)."""
        return int(np.argmax(sim.counts > 0))

    def __repr__(self) -> str:
        return "Earliest()"


class ReturnsLast:
    """The earliest ready block that does not end in a return; a returning
    block only when nothing else is ready. With fork-join this starts
    children as early as possible and lets finished work (leaves, joins)
    pile up to be run together: about 3 steps per tree level for a TreeLSTM,
    where earliest-block takes about 4."""

    name = "returns_last"

    def __init__(self, returns: tuple[bool, ...] | None = None):
        self.returns = returns

    def for_program(self, prog: Any) -> "ReturnsLast":
        return ReturnsLast(tuple(isinstance(b.term, Return) for b in prog.blocks))

    def init(self, num_blocks: int, num_lanes: int) -> Any:
        return ()

    def _rank(self, n: int) -> np.ndarray:
        """Each block's rank among ready ones: returning blocks after all others."""
        returns = np.asarray(self.returns if self.returns is not None else (False,) * n)
        return np.arange(n) + returns * n

    def choose(self, carry: Any, frontier: Frontier) -> tuple[jax.Array, Any]:
        n = frontier.counts.shape[0]
        key = jnp.where(frontier.counts > 0, jnp.asarray(self._rank(n)), 2 * n)
        return jnp.argmin(key).astype(jnp.int32), carry

    def __call__(self, sim: Any) -> int:
        """The host twin (a policy for `fsm.simulate`)."""
        n = sim.counts.shape[0]
        return int(np.argmin(np.where(sim.counts > 0, self._rank(n), 2 * n)))

    def __repr__(self) -> str:
        return "ReturnsLast()"


class Auto:
    """The default: `Earliest` for programs without forks, `ReturnsLast` with them."""

    name = "auto"

    def for_program(self, prog: Any) -> Any:
        return ReturnsLast().for_program(prog) if prog.has_forks else Earliest()

    def init(self, num_blocks: int, num_lanes: int) -> Any:
        return ()

    def choose(self, carry: Any, frontier: Frontier) -> tuple[jax.Array, Any]:
        return Earliest().choose(carry, frontier)

    def __repr__(self) -> str:
        return "Auto()"


class Fair:
    """Any scheduler, made starvation-free: a block whose lanes have been
    ready for `patience` steps runs next. Used when `max_steps` is set, so
    that one runaway example (a loop that never ends keeps its blocks the
    earliest ready ones) cannot keep the others from finishing."""

    def __init__(self, inner: Any, patience: int | None = None):
        self.inner, self.patience = inner, patience
        self.name = f"fair({getattr(inner, 'name', inner)})"

    def for_program(self, prog: Any) -> "Fair":
        # Every ready block runs at least once per ~patience steps: the others
        # keep at least a 1/(2 * blocks) share of the machine.
        return Fair(bind(self.inner, prog), 2 * prog.num_blocks)

    def init(self, num_blocks: int, num_lanes: int) -> Any:
        return self.inner.init(num_blocks, num_lanes), jnp.zeros(num_blocks, jnp.int32)

    @property
    def follow(self) -> tuple[int, ...]:
        return tuple(getattr(self.inner, "follow", ()))

    def choose(self, carry: Any, frontier: Frontier) -> tuple[jax.Array, Any]:
        inner_carry, waited = carry
        block, inner_carry = self.inner.choose(inner_carry, frontier)
        ready = frontier.counts > 0
        waited = jnp.where(ready, waited + 1, 0)
        patience = self.patience if self.patience is not None else 2 * waited.shape[0]
        overdue = jnp.where(ready, waited, -1)
        block = jnp.where(jnp.max(overdue) >= patience, jnp.argmax(overdue), block).astype(jnp.int32)
        return block, (inner_carry, waited.at[block].set(0))

    def __repr__(self) -> str:
        return f"Fair({self.inner!r})"


def bind(scheduler: Any, prog: Any) -> Any:
    """The scheduler specialised to a program, for those that look at it."""
    return scheduler.for_program(prog) if hasattr(scheduler, "for_program") else scheduler
