"""What a machine is built with (`MachineConfig`) and what it reports (`Status`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import jax

from pcbatch.fsm.base import Scheduler
from pcbatch.runtime.options import Tuning


class Status(NamedTuple):
    """How each example ended: `overflow` (recursion deeper than the stacks),
    `unfinished` (still running when `max_steps` ran out), the final pc of its
    root lane (`-1 - b` while it waits for forked calls before block b), the
    number of VM steps taken, the blocks run by all of each example's lanes,
    the most lanes in use at once (fork-join; otherwise the batch size), and
    `failed`: where the example reached a `raise`, a failed `assert` or a
    `range()` step of 0 (Python raises there), 0 for none, else 1 + the index
    of the block ending in that `Fail` (`StackProgram.blocks`); index dtype."""

    overflow: jax.Array
    unfinished: jax.Array
    pc: jax.Array
    steps: jax.Array
    blocks_run: jax.Array
    peak_lanes: jax.Array
    failed: jax.Array

    @property
    def flagged(self) -> jax.Array:
        """Per example: its result is not meaningful (it failed, overflowed or did not finish)."""
        return self.overflow | self.unfinished | (self.failed != 0)


@dataclass(frozen=True)
class MachineConfig:
    max_stack_depth: int
    max_steps: int | None
    scheduler: Scheduler
    max_lanes: int | None = None  # fork-join: the lane pool (default: the batch)
    lane_width: int | None = None  # fork-join: most lanes one step runs (default: the pool)
    tuning: Tuning = Tuning()
