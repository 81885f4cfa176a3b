"""The machine's tuning knobs: one frozen, validated object passed down.

None of them changes a result, only how fast and in how much memory it comes.
`pcbatch.autobatch(..., tuning=pcbatch.Tuning(...))` sets them per function.
"""
from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass, fields

import jax
import numpy as np

from pcbatch.errors import OptionError


# The options that take True, False or None (chosen when the machine is built, by the hint's measure).
_CHOSEN_WHEN_NONE = {"masked_follow": "backend", "carry_stacks": "the number of lanes and the backend",
                     "masked_pool_updates": "backend", "grad_switch": "backend"}


def _on_accelerator() -> bool:
    """Whether JAX's default backend is an accelerator (XLA:GPU waits on the host for each `lax.cond`)."""
    return jax.default_backend() != "cpu"


@dataclass(frozen=True)
class Tuning:
    """How the machine is built (defaults measured by `benchmarks/`).

    large_register_bytes: a register or stack frame this large (bytes, all
        lanes together) never passes through the step's `lax.switch` (XLA
        copies every switch operand a branch returns unchanged); the blocks
        that touch it run in place, each under a `lax.cond`.
    switch_max_leaves: with more small register leaves than this, every
        block runs in place (the switch's per-leaf copies then cost more than
        a `lax.cond` per block; -1: every block runs in place).
    carry_stacks: how the blocks in the switch reach the stacks they pop and
        push. True: the stacks are switch operands and results, each branch
        gathers its tops and scatters its pushes itself; False: the tops are
        gathered before the switch, the branch returns its writes and one
        scatter per stack runs after it, under a `lax.cond` on the blocks that
        push. None: True with more than one lane or on an accelerator
        (measured on the CPU: 1.1-2.7x faster on recursive programs from 2
        lanes up; at one lane XLA:CPU runs the second form faster, fib 0.28
        against 1.2 ms; XLA:GPU waits on the host for each of its conds).
    max_widths, min_width: the fork-join pool compiles every block at up to
        `max_widths` lane widths, halving from the widest down to no fewer
        than `min_width` lanes; a step runs at the narrowest that holds its
        lanes. Each width is another compiled copy of every block (the
        Tree-LSTM: 2.3 s to compile at one width, 7.2 s at four), and one
        narrow width runs as fast as four wide ones.
    lanes_per_example, max_pool_lanes, pool_stack_bytes: the default lane
        pool (`max_lanes=None`): this many lanes per example, at most
        `max_pool_lanes`, fewer if the stacks would pass `pool_stack_bytes`.
    width_per_example, min_lane_width, max_lane_width: the default lane
        width (`lane_width=None`): per example, within these bounds. Narrow
        steps pad little; a wide level of a tree takes a few of them.
    fork_min_batch, fork_min_pool_lanes, fork_max_traced_pool_bytes: when
        `fork="auto"` forks (see `pcbatch.fork_choice`).
    fork_measure_min_pool_lanes: with at least this many pool lanes per
        example but fewer than `fork_min_pool_lanes`, the rule cannot tell:
        the first eager call times both machines and keeps the faster.
    pool_first_stack_depth: where `pool_stack_bytes` caps the default pool,
        eager calls first run with this many frames per lane (a forked call's
        lane rarely nests deep: more lanes in the same memory) and again with
        `max_stack_depth` only if a lane overflowed (a signature whose shallow
        runs overflow more than one time in eight stops trying); 0: never.
    masked_follow: how a follow block (`Scheduler.follow`) runs: False, under
        a `lax.cond` taken only when a lane waits at it (on the CPU a skipped
        block costs nothing); True, every step, its updates masked to the
        lanes waiting there (XLA:GPU waits on the host for every `cond`'s
        predicate, while masked blocks only queue kernels); None: True on
        accelerators, False on the CPU (`jax.default_backend()` when the
        machine is built).
    masked_pool_updates: how the fork-join pool's step applies what its
        block did (register, stack and pc-stack rows, children spawned, lanes
        freed, parents woken): False, each under a `lax.cond` on the blocks
        that do it (on the CPU a skipped update costs nothing); True, every
        step, with the lane indices of a block that does not do it pointed at
        no lane, so its scatters drop every row (no conditional but the
        block's switch: XLA:GPU waits on the host for each). None: True on
        accelerators, False on the CPU.
    grad_switch: how the gradient pass handles a step's block: False, under
        a `lax.cond` per recorded block, both where the forward appends the
        block's rows to the tape and where the backward runs its VJP; True,
        the forward appends every recorded block's rows every step, masked
        (a block not chosen writes to the tape's overflow rows, never read),
        and the backward picks the block's VJP with one `lax.switch`: one
        conditional a step where there were two per recorded block. None:
        True on accelerators (the binary Tree-LSTM's training step on an
        H100, batch 32: 19.0 against 22.9 ms, measured before the backward
        applied its updates outside the conditionals), False on the CPU
        (there 2-5% slower, 54.7 against 53.6 ms).
    cpu_xla_options: on the CPU, pcbatch compiles its own calls with two XLA
        options measured on its machines (`compiler_options`). No
        tree-reduction rewrite: XLA:CPU then fuses each reduction with what
        it reduces, so a follow block's `any(pc == b)` or the scheduler's
        `min(pc)` is one kernel, not three (a reduce-window of 32, then the
        rest). Copy insertion by region analysis: fewer copies of values a
        conditional's branch passes through. Same results bit for bit on
        every `benchmarks/nuts.py` target; NUTS 1.0-1.4x faster, collatz
        3x. A caller's own `jax.jit` compiles with the caller's options.

    >>> import pcbatch
    >>> pcbatch.Tuning(max_widths=2).widths(256)
    [128, 256]
    """

    large_register_bytes: int = 16384
    switch_max_leaves: int = 8
    max_widths: int = 1
    min_width: int = 16
    lanes_per_example: int = 128
    max_pool_lanes: int = 32768
    pool_stack_bytes: int = 1 << 30
    width_per_example: int = 2
    min_lane_width: int = 64
    max_lane_width: int = 256
    fork_min_batch: int = 8
    fork_min_pool_lanes: int = 64
    fork_max_traced_pool_bytes: int = 16 << 20
    fork_measure_min_pool_lanes: int = 8
    pool_first_stack_depth: int = 32
    masked_follow: bool | None = None
    cpu_xla_options: bool = True
    carry_stacks: bool | None = None
    masked_pool_updates: bool | None = None
    grad_switch: bool | None = None

    def __post_init__(self) -> None:
        for name, hint in _CHOSEN_WHEN_NONE.items():
            value = getattr(self, name)
            if not (value is None or isinstance(value, bool)):
                raise OptionError(f"tuning.{name}", f"must be True, False or None, got {value!r}",
                                  f"None (the default) chooses by {hint}.")
        if not isinstance(self.cpu_xla_options, bool):
            raise OptionError("tuning.cpu_xla_options", f"must be True or False, got {self.cpu_xla_options!r}")
        for f in fields(self):
            if f.name in _CHOSEN_WHEN_NONE or f.name == "cpu_xla_options":
                continue
            value = getattr(self, f.name)
            low = -1 if f.name == "switch_max_leaves" else 0
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise OptionError(f"tuning.{f.name}", f"must be an int >= {low}, got {value!r}",
                                  f"the default is {f.default}.")
        for name in ("max_widths", "min_width", "lanes_per_example", "max_pool_lanes", "width_per_example",
                     "min_lane_width", "max_lane_width", "fork_min_batch"):
            if getattr(self, name) < 1:
                raise OptionError(f"tuning.{name}", f"must be at least 1, got {getattr(self, name)}")
        if self.min_lane_width > self.max_lane_width:
            raise OptionError("tuning.min_lane_width", f"is more than max_lane_width ({self.min_lane_width} > "
                              f"{self.max_lane_width})")

    def follow_masked(self) -> bool:
        """Whether follow blocks run masked (`masked_follow`, None resolved by backend)."""
        return _on_accelerator() if self.masked_follow is None else self.masked_follow

    def pool_updates_masked(self) -> bool:
        """Whether the pool's updates run masked (`masked_pool_updates`, None resolved by backend)."""
        return _on_accelerator() if self.masked_pool_updates is None else self.masked_pool_updates

    def grad_switched(self) -> bool:
        """Whether the gradient pass picks a step's block with one switch (`grad_switch`)."""
        return _on_accelerator() if self.grad_switch is None else self.grad_switch

    def switch_carries_stacks(self, lanes: int) -> bool:
        """Whether a machine of `lanes` lanes passes stacks through its switch (`carry_stacks`)."""
        return (lanes > 1 or _on_accelerator()) if self.carry_stacks is None else self.carry_stacks

    def compiler_options(self) -> dict[str, str | bool]:
        """XLA options for the `jax.jit` of pcbatch's own calls (`cpu_xla_options`);
        pass them to your own `jax.jit` around autobatched calls for the same code."""
        if self.cpu_xla_options and not _on_accelerator():
            return {"xla_disable_hlo_passes": "tree_reduction_rewriter",
                    "xla_cpu_copy_insertion_use_region_analysis": True}
        return {}

    def widths(self, widest: int) -> list[int]:
        """The compiled widths for a widest step of `widest` lanes, ascending
        (halving: a step pads at most 2x)."""
        out = [widest]
        while out[0] // 2 >= self.min_width and len(out) < self.max_widths:
            out.insert(0, out[0] // 2)
        return out


def _named_keywords(init):
    """`Tuning(...)` with a name it does not have: OptionError with the closest name
    (as `autobatch` options), not the dataclass's TypeError."""
    @functools.wraps(init)
    def checked(self, *args, **kwargs):
        known = [f.name for f in fields(Tuning)]
        unknown = sorted(set(kwargs) - set(known))
        if unknown:
            guesses = [g for u in unknown for g in difflib.get_close_matches(u, known, n=1)]
            raise OptionError(", ".join(f"tuning.{u}" for u in unknown), "not a Tuning field",
                              (f"did you mean {', '.join(guesses)}? " if guesses else "")
                              + f"The fields are {', '.join(known)}.")
        init(self, *args, **kwargs)
    return checked


Tuning.__init__ = _named_keywords(Tuning.__init__)
