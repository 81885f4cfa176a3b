"""What a run's status says went wrong, told to the caller.

Outside `jit` a call raises a named error (`raise_for`): `ExampleError` where
examples reached a `raise`/`assert` (quoting its line; reported first: a
failed example's later overflow says nothing), `StackOverflowError`
with how deep the overflowing examples need to go (a short replay in the
reference interpreter, `depths_needed`), or `MaxStepsExceededError` with
where the unfinished examples stopped. Inside `jit` Python cannot raise:
`check_in_trace` records the failures with checkify and makes the failed
examples' float results NaN.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from pcbatch.arguments import Bound
from pcbatch.errors import ExampleError, MaxStepsExceededError, StackOverflowError
from pcbatch.ir.core import Fail, StackProgram
from pcbatch.ir.interpret import run_stack_program
from pcbatch.options import Options
from pcbatch.runtime import Status
from pcbatch.runtime.lanes import nan_where

tree_util = jax.tree_util

# The overflow error replays a few examples in Python to say how deep they go, within a
# budget of blocks they share (~50 us each: well under a second). Steps, not seconds: the
# error says the same on a loaded host as on a quiet one.
REPLAY_EXAMPLES = 3
REPLAY_STEPS = 10_000


def example_inputs(prog: StackProgram, bound: Bound, i: int) -> dict[str, Any]:
    """Example `i`'s inputs keyed by the program's entry parameters."""
    return dict(zip(prog.entry_params, bound.example(i).values()))


def raise_for(status: Status, prog: StackProgram | None, bound: Bound, options: Options) -> None:
    """Raise the named error for the examples `status` flags, if any."""
    failed_at = np.asarray(status.failed)
    failed = np.nonzero(failed_at)[0].tolist()
    if failed:
        raise ExampleError(failed, {i: fail_source(prog, int(failed_at[i]) - 1) for i in failed[:10]},
                           _not_computed(status, options))
    overflow = np.nonzero(np.asarray(status.overflow))[0].tolist()
    if overflow:
        raise StackOverflowError(overflow, options.max_stack_depth,
                                 depths_needed(prog, bound, overflow, options.max_stack_depth),
                                 forked=prog.has_forks)
    unfinished = np.nonzero(np.asarray(status.unfinished))[0].tolist()
    if unfinished:
        pcs = np.asarray(status.pc)
        where = []
        for i in unfinished[:10]:
            pc = int(pcs[i])
            waiting = pc < 0  # blocked on its forked calls, to continue at -1 - pc
            pc = -1 - pc if waiting else pc
            block = prog.blocks[pc]
            where.append(f"example {i} " + ("waiting for its forked calls, then " if waiting else "")
                         + f"at b{pc} ({block.label}" + (f", {block.loc}" if block.loc else "") + ")")
        raise MaxStepsExceededError(unfinished, options.max_steps, where)


def _not_computed(status: Status, options: Options) -> str:
    """Which examples that did not fail overflowed or ran out of steps, for
    `ExampleError`'s hint (it is raised first, and would say every other
    example's result was computed)."""
    ok = np.asarray(status.failed) == 0
    said = []
    for flags, why in ((status.overflow, f"overflowed max_stack_depth={options.max_stack_depth}"),
                       (status.unfinished, f"were unfinished after max_steps={options.max_steps}")):
        which = np.nonzero(np.asarray(flags) & ok)[0].tolist()
        if which:
            said.append(f"example{'s' if len(which) > 1 else ''} {', '.join(map(str, which[:10]))}"
                        f"{' ...' if len(which) > 10 else ''}, which {why}")
    return " and ".join(said)


def fail_source(prog: StackProgram, block: int) -> tuple[str, Any]:
    """What block `block`'s `Fail` quotes: its text and line."""
    term = prog.blocks[block].term
    return (term.text, term.loc) if isinstance(term, Fail) else (f"block b{block}", None)


def depths_needed(prog: StackProgram, bound: Bound, overflow: list[int], max_stack_depth: int) -> dict[int, str]:
    """How deep a few overflowing examples recurse, from a bounded replay in
    the reference interpreter (`REPLAY_STEPS` blocks in all: the error must come fast)."""
    limit = max(8 * max_stack_depth, 1024)  # a small max_stack_depth says little of what is needed
    budget = REPLAY_STEPS
    needed = {}
    # Multi-process (pcbatch/sharding.py): this process may not hold the example, so no replay.
    whole = all(getattr(x, "is_fully_addressable", True) for x in tree_util.tree_leaves(bound.values))
    bound = bound.indexable() if whole and overflow else bound
    for i in overflow[:REPLAY_EXAMPLES] if whole else []:
        if budget <= 0:
            break
        t = run_stack_program(prog, example_inputs(prog, bound, i), max_steps=budget, max_depth=limit, forks=False)
        budget -= len(t.blocks)
        needed[i] = (f"max_stack_depth={t.max_depth}" if t.finished else
                     f"more than {limit} (runaway recursion?)" if t.max_depth > limit else
                     f"more than {max_stack_depth}")
    for i in overflow:
        needed.setdefault(i, f"more than {max_stack_depth}")
    return needed


def _debug_check(ok: Any, message: str) -> None:
    try:
        checkify.check(ok, message, debug=True)
    except IndexError:
        # JAX's batching rule for the check indexes the batch: under jax.vmap over
        # an empty axis (the only way the check itself fails) there is nothing to report.
        pass


def check_in_trace(result: Any, status: Status, prog: StackProgram | None = None) -> Any:
    """Inside jit we cannot raise: report through checkify (debug checks are
    functionalized by `checkify.checkify`), poison failed examples' floats
    with NaN and set their other results to 0 (never a half-computed value).
    With `prog`, one check per `Fail` quotes its line."""
    if prog is None:
        _debug_check(~jnp.any(status.failed != 0), "pcbatch: some examples failed where Python raises")
    for b in prog.fail_blocks if prog is not None else ():
        text, loc = fail_source(prog, b)
        said = f"{text} ({loc}: {loc.line.strip()})" if loc is not None else text
        said = said.replace("{", "{{").replace("}", "}}")  # checkify formats the message
        _debug_check(~jnp.any(status.failed == b + 1), f"pcbatch: Python raises here for some examples: {said}")
    _debug_check(~jnp.any(status.overflow), "pcbatch: recursion deeper than max_stack_depth")
    _debug_check(~jnp.any(status.unfinished), "pcbatch: max_steps exceeded")
    failed = status.flagged

    def poison(x):
        rows = failed.reshape((-1,) + (1,) * (x.ndim - 1))
        if jnp.issubdtype(x.dtype, jnp.inexact):
            return nan_where(rows, x)  # its tangent (jax.jvp, jacfwd) NaN too
        return jnp.where(rows, jnp.zeros((), x.dtype), x)

    return tree_util.tree_map(poison, result)
