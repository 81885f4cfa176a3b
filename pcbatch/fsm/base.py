"""The scheduler interface: how the machine asks which block to run next.

A scheduler runs *inside* the `lax.while_loop`, so it is pure traced JAX: it
sees a `Frontier` (where every lane is waiting) and returns one block index.
It may keep a small carry of its own between steps.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp


class Frontier(NamedTuple):
    """What a scheduler may look at each VM step.

    pc:     int32[lanes] block each lane waits at; `num_blocks` means halted
            (or, with fork-join, blocked on children).
    counts: int32[num_blocks] number of ready lanes per block.
    depth:  int32[lanes] blocks each lane's thread has executed so far
            (its topological depth in the executed chain/DAG).
    """

    pc: jax.Array
    counts: jax.Array
    depth: jax.Array


class Scheduler(Protocol):
    """Chooses the next block. `choose` must return a block with counts > 0
    whenever any count is positive."""

    def init(self, num_blocks: int, num_lanes: int) -> Any: ...

    def choose(self, carry: Any, frontier: Frontier) -> tuple[jax.Array, Any]: ...


class Earliest:
    """Radul et al.'s default: the lowest-numbered block with a ready lane."""

    name = "earliest"

    def init(self, num_blocks: int, num_lanes: int) -> Any:
        return ()

    def choose(self, carry: Any, frontier: Frontier) -> tuple[jax.Array, Any]:
        # Halted lanes sit at num_blocks, so the minimum pc is the earliest ready block.
        return jnp.min(frontier.pc), carry

    def __repr__(self) -> str:
        return "Earliest()"
