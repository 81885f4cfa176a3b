"""What the machine did, step by step, recorded inside the loop.

`StepRecorder` rides along `while_loop_recorded` like the gradient tape does:
each step it writes the chosen block, the lanes that block runs and the ready
lanes per block (the frontier the scheduler saw) into fixed-size buffers, so
the loop needs no host callback and keeps static shapes. `StepTrace` is the
host-side result (`f.trace(*args)`); it has the fields of an
`fsm.Schedule`, so the plots of `pcbatch.viz` take either.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pcbatch.runtime.dtypes import index_dtype


class StepRecorder:
    """Per-step records of up to `size` steps of a machine whose steps run at
    most `width` lanes of the chosen block (later steps are counted, not kept);
    with `per_lane`, also every lane's pc before each step and the lanes it
    ran (the machine hands them to `before`)."""

    def __init__(self, num_blocks: int, width: int, size: int, per_lane: bool = False):
        self.num_blocks, self.width, self.size, self.per_lane = num_blocks, width, size, per_lane

    def init(self, state: dict[str, Any]) -> dict[str, jax.Array]:
        idx = index_dtype()
        tape = {"t": jnp.zeros((), idx),
                "block": jnp.full((self.size,), -1, idx),
                "lanes": jnp.zeros((self.size,), idx),
                "counts": jnp.zeros((self.size, self.num_blocks), idx)}
        if self.per_lane:
            tape["pc"] = jnp.zeros((self.size,) + state.pc.shape, idx)
            tape["ran"] = jnp.zeros((self.size,) + state.pc.shape, bool)
        return tape

    def before(self, tape: dict[str, jax.Array], pre: Any, block: jax.Array, lanes: jax.Array):
        nb, pc = self.num_blocks, pre.pc
        # Ready lanes wait at a block; halted, done, free and blocked lanes sit outside [0, nb).
        counts = jnp.zeros((nb,), pc.dtype).at[jnp.where((pc >= 0) & (pc < nb), pc, nb)].add(1, mode="drop")
        t = tape["t"]
        at = jnp.minimum(t, self.size)  # past the end: dropped
        new = {"t": t + 1,
               "block": tape["block"].at[at].set(block, mode="drop"),
               "lanes": tape["lanes"].at[at].set(jnp.minimum(counts[block], self.width), mode="drop"),
               "counts": tape["counts"].at[at].set(counts, mode="drop")}
        if self.per_lane:
            new["pc"] = tape["pc"].at[at].set(pc, mode="drop")
            ran = jnp.zeros(pc.shape, bool).at[lanes].set(True, mode="drop")
            new["ran"] = tape["ran"].at[at].set(ran, mode="drop")
        return new, None, new["t"]

    def after(self, tape: dict[str, jax.Array], taken: Any, new: dict[str, Any], info: Any) -> dict[str, jax.Array]:
        return tape


@dataclass(frozen=True, eq=False)
class StepTrace:
    """One run of the machine, step by step (integers: `dtypes.index_dtype()`).

    blocks:    int[kept] block run at each step.
    lanes:     int[kept] lanes that block ran.
    counts:    int[kept, num_blocks] ready lanes per block before the step
               (the frontier the scheduler chose from).
    total:     steps the run took; more than `kept` when the buffer was too
               small (`truncated`; pass a larger `steps=` to `f.trace`).
    num_lanes: lanes of the machine (the batch, or the fork-join lane pool).
    width:     the most lanes one step runs.
    pc:        int[kept, num_lanes] each lane's pc before each step, or None
               (`f.trace(..., per_lane=True)` records it).
    ran_lanes: bool[kept, num_lanes] the lanes each step ran, or None (with `pc`).
    """

    blocks: np.ndarray
    lanes: np.ndarray
    counts: np.ndarray
    total: int
    num_lanes: int
    width: int
    pc: np.ndarray | None = None
    ran_lanes: np.ndarray | None = None

    @classmethod
    def from_tape(cls, tape: dict[str, Any], num_lanes: int, width: int) -> StepTrace:
        total = int(tape["t"])
        kept = min(total, int(tape["block"].shape[0]))
        pc = np.asarray(tape["pc"][:kept]) if "pc" in tape else None
        ran = np.asarray(tape["ran"][:kept]) if "ran" in tape else None
        return cls(np.asarray(tape["block"][:kept]), np.asarray(tape["lanes"][:kept]),
                   np.asarray(tape["counts"][:kept]), total, num_lanes, width, pc, ran)

    @property
    def truncated(self) -> bool:
        return self.total > self.blocks.shape[0]

    @property
    def steps(self) -> int:
        return int(self.blocks.shape[0])

    # The names `fsm.Schedule` uses, for `pcbatch.viz`.
    @property
    def types(self) -> np.ndarray:
        return self.blocks

    @property
    def sizes(self) -> np.ndarray:
        return self.lanes

    @property
    def utilisation(self) -> float:
        """Fraction of lane slots doing useful work over the kept steps."""
        slots = self.steps * self.num_lanes
        return float(self.lanes.sum()) / slots if slots else 1.0

    def ran(self) -> np.ndarray:
        """bool[kept, num_lanes]: the lanes each step ran (needs `pc`)."""
        if self.ran_lanes is None:
            raise ValueError("this trace has no per-lane record: use f.trace(..., per_lane=True)")
        return self.ran_lanes

    def runs(self, block: int) -> np.ndarray:
        """int[num_lanes, kept]: how often each lane has run `block` by the end
        of each step (for NUTS, with the block that ends a transition: each
        chain's transitions done over the run)."""
        return np.cumsum(self.ran() & (self.blocks == block)[:, None], axis=0).T

    def frontier(self) -> np.ndarray:
        """int[kept]: blocks with a ready lane before each step."""
        return np.count_nonzero(self.counts, axis=1)

    def __repr__(self) -> str:
        more = f" (first {self.steps} kept)" if self.truncated else ""
        return f"StepTrace({self.total} steps{more}, {self.num_lanes} lanes, utilisation {self.utilisation:.0%})"
