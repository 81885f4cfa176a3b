"""`fork="auto"`: whether a program's independent calls get lanes of their own.

Fork-join trades more work per step (a lane pool to keep, spawns and joins to
run, steps padded to a compiled width) for fewer steps (a tree level by level,
not node by node). Measured on CPU (`benchmarks/fork_choice.py`) it pays only
when all of these hold, so `"auto"` forks exactly then:

* a step has real work to share: the largest value one call keeps, times the
  batch (counted up to 16), has at least `Tuning.fork_min_step_elements`
  elements (a Tree-LSTM's `h` and `c`, not fib's `n`: scalar recursions run
  2-30x faster one lane per example; one tree alone forks only at H >= 256);
* the batch leaves room to spread out: a step may run at least
  `Tuning.fork_min_parallelism` lanes per example (by default up to batch
  128), and the pool holds `Tuning.fork_min_pool_lanes` per example (fewer,
  and calls fall back to running one after another in their caller's lane);
* the lane pool's stacks are cheap to set up: outside `jax.jit` they are built
  once and reused; a traced call (under `jax.jit` or a gradient) builds them
  afresh every time, so there they must stay under
  `Tuning.fork_max_traced_pool_bytes`.

Passing `max_lanes` or `lane_width` (the pool's own options) asks for the
pool: "auto" then forks. The choice never changes a result, only the speed;
`fork=True` / `fork=False` override it.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any

import jax

from pcbatch.ir.core import CONSTANT, INVARIANT, StackProgram
from pcbatch.runtime.options import Tuning


_BATCH_COUNTED = 16  # beyond this many examples a step's work no longer favours forking


@dataclass(frozen=True)
class ForkChoice:
    """What `fork="auto"` chose for one call signature, and why (plain words)."""

    fork: bool
    reason: str


def lane_elements(prog: StackProgram) -> int:
    """The most elements of any value one call keeps (per example; constants
    and per-example invariants such as the input tree excluded)."""
    sizes = [sum(prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(t))
             for v, t in prog.var_types.items() if prog.var_class.get(v) not in (CONSTANT, INVARIANT)]
    return max(sizes, default=1)


def choose_fork(prog: StackProgram, batch: int, lanes: int, width: int, pool_bytes: int, traced: bool,
                tuning: Tuning) -> ForkChoice:
    """Fork-join for `prog` (lowered with forks) on `batch` examples, with a
    pool of `lanes` lanes whose stacks take `pool_bytes`, steps of up to
    `width` lanes; `traced`: the call is traced (its pool cannot be reused)."""
    if not prog.has_forks:
        return ForkChoice(False, "the program has no independent calls to fork")
    elements = lane_elements(prog)
    step = elements * min(batch, _BATCH_COUNTED)
    if step < tuning.fork_min_step_elements:
        return ForkChoice(False, f"a step has little work to share ({elements} element{'s' * (elements != 1)} per "
                                 f"call x {min(batch, _BATCH_COUNTED)} examples < fork_min_step_elements="
                                 f"{tuning.fork_min_step_elements}): spawning costs more than it saves")
    per_step, in_pool = min(lanes, width) // batch, lanes // batch
    if per_step < tuning.fork_min_parallelism or in_pool < tuning.fork_min_pool_lanes:
        return ForkChoice(False, f"the batch leaves too few lanes to spread into ({per_step} per step and {in_pool} "
                                 f"in the pool per example; fork_min_parallelism={tuning.fork_min_parallelism}, "
                                 f"fork_min_pool_lanes={tuning.fork_min_pool_lanes})")
    if traced and pool_bytes > tuning.fork_max_traced_pool_bytes:
        return ForkChoice(False, f"traced calls build the lane pool's stacks afresh each time, and they are large "
                                 f"({pool_bytes / 2**20:.1f} MiB > fork_max_traced_pool_bytes="
                                 f"{tuning.fork_max_traced_pool_bytes})")
    return ForkChoice(True, f"a step has work to share ({elements} elements per call) and {per_step} lanes per "
                            f"example to spread into")
