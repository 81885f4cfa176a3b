"""The machine's own schedule, reported back to the host.

`fsm.record` and `fsm.simulate` rebuild a schedule offline: the examples run
one at a time through the reference interpreter, then a host policy replays
them. That is exact for the named schedulers and learned policies, but slow
for long runs (hundreds of NUTS transitions) and unavailable for a scheduler
that only exists as device code. `Recorded(scheduler)` instead wraps the
scheduler the machine runs: every VM step it sends the step number, the
block chosen and each lane's pc to the host (`jax.debug.callback`). After a
run, `graph()` and `schedule()` are the `ExecGraph` the lanes executed and
the `Schedule` the machine followed: the objects `fsm.record` and
`fsm.simulate` give, so every plot of `pcbatch.viz` takes them.

The callback is a host round trip per step: for looking at a run, not for
timing one. Each run overwrites the previous recording. Programs with forks
(whose lanes are not one chain per example) are not supported, nor are runs
sharded over a mesh (each device would report its own steps).

>>> import jax.numpy as jnp, pcbatch, pcbatch.fsm as fsm
>>> @pcbatch.autobatch(fork=False)
... def fib(n):
...     return n if n <= 1 else fib(n - 1) + fib(n - 2)
>>> rec = fsm.Recorded("earliest")
>>> result, status = fib.with_schedule(rec).checked(jnp.array([3, 7, 4]))
>>> rec.schedule().steps == int(status.steps)
True
>>> [len(c) for c in rec.chains()] == status.blocks_run.tolist()
True
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pcbatch.fsm.base import Frontier, bind
from pcbatch.fsm.graph import ExecGraph
from pcbatch.fsm.simulate import Schedule

__all__ = ["Recorded"]


class Recorded:
    """A scheduler that chooses as `inner` does (a name or a scheduler
    object) and records every choice of the machine that runs it."""

    def __init__(self, inner: Any = "auto"):
        from pcbatch.fsm import get_scheduler

        self._unbound = get_scheduler(inner)
        self.inner = self._unbound
        self.name = f"recorded({getattr(self._unbound, 'name', type(self._unbound).__name__)})"
        self._rows: list[tuple[int, int, np.ndarray]] = []
        self._num_blocks: int | None = None

    def __repr__(self) -> str:
        return f"Recorded({self.inner!r})"

    # --- the scheduler interface ------------------------------------------

    def for_program(self, prog: Any) -> "Recorded":
        if getattr(prog, "has_forks", False):
            raise ValueError("Recorded: programs with forks run trees of lanes, which a recording "
                             "(one chain per lane) cannot represent; use fork=False")
        self.inner = bind(self._unbound, prog)
        return self

    def init(self, num_blocks: int, num_lanes: int) -> Any:
        self._num_blocks = int(num_blocks)
        return self.inner.init(num_blocks, num_lanes), jnp.zeros((), jnp.int32)

    def choose(self, carry: Any, frontier: Frontier) -> tuple[jax.Array, Any]:
        inner, step = carry
        block, inner = self.inner.choose(inner, frontier)
        jax.debug.callback(self._record, step, block, frontier.pc, ordered=False)
        return block, (inner, step + 1)

    def _record(self, step: Any, block: Any, pc: Any) -> None:
        if int(step) == 0:  # a new run
            self._rows = []
        self._rows.append((int(step), int(block), np.array(pc, np.int32)))

    # --- the recording ----------------------------------------------------

    def _steps(self) -> tuple[np.ndarray, np.ndarray]:
        """(int32[steps] block chosen, bool[steps, lanes] lanes that ran it)."""
        jax.effects_barrier()  # every callback of the last run has arrived
        rows = sorted(self._rows, key=lambda r: r[0])
        if not rows or [r[0] for r in rows] != list(range(len(rows))):
            raise RuntimeError("Recorded: no complete run recorded (run the program with this scheduler first)")
        types = np.asarray([r[1] for r in rows], np.int32)
        pcs = np.stack([r[2] for r in rows])
        return types, pcs == types[:, None]

    def chains(self) -> list[list[int]]:
        """The blocks each lane ran, in order (what `f.trace(*args)` lists per example)."""
        types, ran = self._steps()
        return [types[ran[:, lane]].tolist() for lane in range(ran.shape[1])]

    def graph(self) -> ExecGraph:
        """The lanes' executions as an `ExecGraph` (one chain per lane), as `fsm.record` builds it."""
        assert self._num_blocks is not None
        return ExecGraph.from_chains(self.chains(), self._num_blocks)

    def schedule(self) -> Schedule:
        """The machine's schedule: the block and the number of lanes at each VM
        step, and the step at which each node of `graph()` ran."""
        types, ran = self._steps()
        node_step = np.concatenate([np.flatnonzero(ran[:, lane]) for lane in range(ran.shape[1])])
        return Schedule(types, ran.sum(axis=1).astype(np.int32), node_step.astype(np.int32), ran.shape[1])
