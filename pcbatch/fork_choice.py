"""`fork="auto"`: whether a program's independent calls get lanes of their own.

Without forks every example keeps one lane, and a step runs one block on the
examples waiting there. Examples that each walk their own data (a parse tree
of its own shape) drift apart, so most steps run few of them; fork-join runs
each tree level by level in lanes of its own and wins (2x on the syntax trees
of Python's standard library at batch 16-128, `benchmarks/fork_choice.py`).
Where the calls only count (fib, a numeric recursion on vectors), forking cost
1.2-25x more than it saved (fib's calls also multiply faster than any pool
holds them). So `"auto"` forks exactly when all hold:

* a forked call's argument is read from an example's data: computed, directly
  or through other values, from an input array that stays the same for the
  whole call (a tree's child index), not only from numbers the calls pass on;
* the batch has at least `Tuning.fork_min_batch` examples (fewer leave too
  little to share between a step's lanes: 1.1-2.4x slower below 8);
* the lane pool holds `Tuning.fork_min_pool_lanes` lanes per example (fewer,
  and calls fall back to running one after another in their caller's lane;
  an eager call on a pool the stack budget caps counts the pool of its
  shallow stacks, `Tuning.pool_first_stack_depth`, which it runs first).
  Between `Tuning.fork_measure_min_pool_lanes` and that, the rule cannot tell
  (the binary Tree-LSTM on small syntax trees forked 1.34x faster with 16
  lanes per example; at H 256 on larger trees 2x slower with 31, at H 128
  1.3x slower with 63): the first
  eager call of the signature runs both machines, twice each, and keeps the
  faster (`compile.measure_fork`); a traced call there does not fork;
* a loop fork (a loop's calls launched at once) is measured the same way
  wherever the pool holds `fork_measure_min_pool_lanes` per example: it cuts
  the steps 3-6x but each is a pool step, and on the Child-Sum Tree-LSTM over
  stdlib ASTs it ran 0.5x to 1.5x one lane per tree by the trees' size;
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

import jax

from pcbatch.ir.core import CONSTANT, INVARIANT, Fork, Launch, StackProgram
from pcbatch.ir.dataflow import through_prims
from pcbatch.runtime.options import Tuning


@dataclass(frozen=True)
class ForkChoice:
    """What `fork="auto"` chose for one call signature, and why (plain words)."""

    fork: bool
    reason: str
    measure: bool = False  # the rule cannot tell: the first eager call times both machines


def walks_data(prog: StackProgram) -> bool:
    """Whether some forked call's argument is computed from an input array that
    every call shares (a per-example invariant or a constant with more than
    one element): the calls walk a data structure."""
    def is_array(v: str) -> bool:
        leaves = jax.tree_util.tree_leaves(prog.var_types.get(v))
        return any(prod(leaf.shape) > 1 for leaf in leaves)

    data = {v for v, c in prog.var_class.items() if c in (INVARIANT, CONSTANT) and is_array(v)}
    derived = through_prims((op for blk in prog.blocks for op in blk.ops), data)  # however indirectly
    calls = [c for blk in prog.blocks if isinstance(blk.term, Fork) for c in blk.term.calls]
    calls += [op.call for blk in prog.blocks for op in blk.ops if isinstance(op, Launch)]
    return any(a in derived for call in calls for a in call.args)


def choose_fork(prog: StackProgram, batch: int, lanes: int, pool_bytes: int, traced: bool,
                tuning: Tuning, measurable: bool = True) -> ForkChoice:
    """Fork-join for `prog` (lowered with forks) on `batch` examples, with a
    pool of `lanes` lanes whose stacks take `pool_bytes`; `traced`: the call
    is traced (its pool cannot be reused); `measurable`: an eager call could
    time both machines (not when sharded)."""
    if not prog.has_forks:
        return ForkChoice(False, "the program has no independent calls to fork")
    if not walks_data(prog):
        return ForkChoice(False, "the forked calls read none of each example's data, only numbers they pass on, "
                                 "as in fib: such recursions ran 1.2-25x faster without forking")
    if batch < tuning.fork_min_batch:
        return ForkChoice(False, f"the batch is small ({batch} < fork_min_batch={tuning.fork_min_batch}): too "
                                 f"little to share between a step's lanes")
    in_pool = lanes // batch
    if prog.has_launches and in_pool >= tuning.fork_measure_min_pool_lanes:
        # A loop fork's steps are fewer but each costs what a pool step costs: measured
        # 0.5x (Child-Sum Tree-LSTM, H 64, batch 64) to faster, by tree shape and width.
        if not traced and measurable:
            return ForkChoice(False, f"a loop fork (calls launched from a loop) pays or not by the data's shape: "
                                     f"the first call times both machines ({in_pool} lanes per example)",
                              measure=True)
        return ForkChoice(False, "a loop fork (calls launched from a loop) pays or not by the data's shape, and a "
                                 "traced call cannot time both machines: one lane per example (fork=True forks)")
    if in_pool < tuning.fork_min_pool_lanes:
        if not traced and measurable and in_pool >= tuning.fork_measure_min_pool_lanes:
            return ForkChoice(False, f"the lane pool holds {in_pool} lanes per example, between "
                                     f"fork_measure_min_pool_lanes={tuning.fork_measure_min_pool_lanes} and "
                                     f"fork_min_pool_lanes={tuning.fork_min_pool_lanes}: the first call times both "
                                     f"machines", measure=True)
        return ForkChoice(False, f"the lane pool is small ({in_pool} lanes per example < fork_min_pool_lanes="
                                 f"{tuning.fork_min_pool_lanes}): most calls would run one after another anyway")
    if traced and pool_bytes > tuning.fork_max_traced_pool_bytes:
        return ForkChoice(False, f"traced calls build the lane pool's stacks afresh each time, and they are large "
                                 f"({pool_bytes / 2**20:.1f} MiB > fork_max_traced_pool_bytes="
                                 f"{tuning.fork_max_traced_pool_bytes})")
    return ForkChoice(True, f"the forked calls walk each example's data, which drifts apart without forking; "
                            f"{batch} examples, {in_pool} lanes each in the pool")
