"""The heuristic schedulers ED-Batch compares against, on both sides.

Each class is a device `Scheduler` (pure jnp, static shapes, used inside the
VM's `lax.while_loop`) and, when called with a `Simulation`, the matching host
policy.  Both sides break ties the same way, so they produce the same schedule.

- `Earliest`: the lowest-numbered block with a ready lane (Radul et al.).
- `Depth` (TensorFlow Fold / DyNet mode 2): the smallest topological depth
  with a ready node, then the lowest block among ready nodes at that depth.
  The VM then runs *all* lanes waiting at that block, whatever their depth.
- `Agenda` (DyNet mode 1): among blocks with ready lanes, the one whose ready
  lanes have the smallest mean depth; ties go to the lower block.  (DyNet
  averages over all unexecuted nodes of a type; the device only sees ready
  lanes, so both sides use those.)
"""
from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from pcbatch.errors import OptionError
from pcbatch.fsm import base
from pcbatch.fsm.base import Frontier

if TYPE_CHECKING:  # the offline simulation: only a type here, never imported by the machine
    from pcbatch.fsm.simulation import Simulation

_INT32_MAX = np.iinfo(np.int32).max


Earliest = base.Earliest  # device scheduler and host twin in one


class Depth:
    """Batch by (topological depth, block)."""

    name = "depth"

    def init(self, num_blocks: int, num_lanes: int) -> Any:
        return ()

    def choose(self, carry: Any, frontier: Frontier) -> tuple[jax.Array, Any]:
        num_blocks = frontier.counts.shape[0]
        ready = frontier.pc < num_blocks
        shallowest = jnp.min(jnp.where(ready, frontier.depth, _INT32_MAX))
        block = jnp.min(jnp.where(ready & (frontier.depth == shallowest), frontier.pc, num_blocks))
        # No ready lane: any valid block will do.
        return jnp.where(block < num_blocks, block, 0).astype(jnp.int32), carry

    def __call__(self, sim: Simulation) -> int:
        # min_depth is NO_DEPTH for types without ready nodes; argmin takes the lowest tie.
        return int(np.argmin(sim.min_depth))

    def __repr__(self) -> str:
        return "Depth()"


class Agenda:
    """Batch the block whose ready lanes have the smallest mean depth.

    Means are compared exactly (no float rounding) so that device and host
    agree: mean = q + r/c with q = sum // c, r = sum % c, compared first on q
    and then on r/c by cross-multiplication, which stays below lanes**2 and so
    fits int32 for fewer than 46341 lanes.  The final comparison is pairwise,
    O(num_blocks**2) per step.
    """

    name = "agenda"

    def init(self, num_blocks: int, num_lanes: int) -> Any:
        return ()

    def choose(self, carry: Any, frontier: Frontier) -> tuple[jax.Array, Any]:
        num_blocks = frontier.counts.shape[0]
        ready = frontier.pc < num_blocks
        sums = jax.ops.segment_sum(
            jnp.where(ready, frontier.depth, 0), jnp.where(ready, frontier.pc, num_blocks), num_segments=num_blocks + 1
        )[:num_blocks]
        has = frontier.counts > 0
        c = jnp.maximum(frontier.counts, 1)
        q, r = sums // c, sums % c
        cand = has & (q == jnp.min(jnp.where(has, q, _INT32_MAX)))
        # beats[a, b]: candidate b has a smaller mean than a, or an equal one and a lower index.
        frac_b = r[None, :] * c[:, None]
        frac_a = r[:, None] * c[None, :]
        idx = jnp.arange(num_blocks)
        beats = cand[None, :] & ((frac_b < frac_a) | ((frac_b == frac_a) & (idx[None, :] < idx[:, None])))
        return jnp.argmax(cand & ~jnp.any(beats, axis=1)).astype(jnp.int32), carry

    def __call__(self, sim: Simulation) -> int:
        ready = np.flatnonzero(sim.counts).tolist()
        return min(ready, key=lambda t: (Fraction(int(sim.depth_sum[t]), int(sim.counts[t])), t))

    def __repr__(self) -> str:
        return "Agenda()"


BASELINES: dict[str, type] = {"earliest": Earliest, "depth": Depth, "agenda": Agenda}


def by_name(name: str) -> Earliest | Depth | Agenda:
    """A fresh baseline scheduler: "earliest", "depth" or "agenda"."""
    try:
        return BASELINES[name]()
    except KeyError:
        raise OptionError("schedule", f"unknown schedule {name!r}; expected one of {sorted(BASELINES)}") from None
