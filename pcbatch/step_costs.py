"""What a machine step running each block costs, estimated for one call
signature: the cost model behind `learn_schedule(costs="estimate")`.

A step costs a fixed part (choosing the block, the lanes' bookkeeping, the
loop) plus its block's arithmetic. The arithmetic is timed: each block's ops
alone (`runtime.block.block_function`) at the width a step runs (every lane
for one lane per example, the lane width for the fork-join pool), in a
`fori_loop` as the machine runs them. The fixed part is what is left of a
timed run of the machine (its steps per block from replaying its own
schedule on the execution graph). Counting steps, as ED-Batch does, treats a
step that runs a cell and a step that moves a pc alike; a schedule with
fewer steps can then take longer.
"""
from __future__ import annotations

import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from pcbatch.fsm import Policy, get_scheduler
from pcbatch.fsm.base import Earliest, ReturnsLast
from pcbatch.fsm.graph import ExecGraph
from pcbatch.fsm.simulation import simulate
from pcbatch.runtime.block import block_function

_REPEATS = 7


def _fastest_seconds(fn: Any, repeats: int = _REPEATS) -> float:
    """The fastest of `repeats` calls (after one to compile): what a call costs
    when nothing else runs, so that a busy machine moves the model less (every
    cost feeds one objective; their ratios are what matter)."""
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return min(times)


def _zeros(specs: Any) -> Any:
    return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), specs)


def _loop_seconds(body: Any, inputs: Any, iterations: int) -> float:
    """Seconds one trip of `body(inputs, c) -> c` takes in a `fori_loop` (the
    carry perturbs the inputs, so XLA cannot hoist the work out)."""
    def trip(_, c):
        moved = jax.tree_util.tree_map(
            lambda a: a + c.astype(a.dtype) if jnp.issubdtype(a.dtype, jnp.inexact) else a, inputs)
        return body(moved, c)

    run = jax.jit(lambda c: lax.fori_loop(0, iterations, trip, c))
    return _fastest_seconds(lambda: run(jnp.zeros((), jnp.float32))) / iterations


def arithmetic_seconds(prog: Any, width: int, iterations: int = 32) -> np.ndarray:
    """Seconds each block's ops take on `width` rows in a loop, less an empty
    trip's (0 for blocks without arithmetic)."""
    def keep(out: Any, c: jax.Array) -> jax.Array:
        # One element of every float result reaches the carry: nothing is dead code.
        leaves = [x for x in jax.tree_util.tree_leaves(out) if jnp.issubdtype(x.dtype, jnp.inexact) and x.size]
        firsts = sum((jnp.real(jnp.ravel(x)[0]).astype(jnp.float32) for x in leaves), jnp.zeros((), jnp.float32))
        return c * 0.5 + firsts * 1e-30

    empty = _loop_seconds(lambda inputs, c: keep(inputs, c), {"x": jnp.zeros((width,), jnp.float32)}, iterations)
    out = np.zeros(prog.num_blocks)
    for b in range(prog.num_blocks):
        made = block_function(prog, b, width)
        if made is not None:
            run, specs = made
            out[b] = max(0.0, _loop_seconds(lambda inputs, c: keep(run(inputs), c), _zeros(specs), iterations) - empty)
    return out


def estimate(f: Any, graph: ExecGraph, *args: Any, **kwargs: Any) -> np.ndarray:
    """Seconds a step running each block of `f`'s machine for these
    arguments takes (see the module docstring); `graph` is
    `f.execution_graph(*args, **kwargs)`."""
    exe, _ = f.executable(*args, **kwargs)
    prog = exe.prog
    lanes, config = exe.config(exe.signature.local_batch)  # per device where sharded
    width = min(config.lane_width or lanes, lanes) if prog.has_forks else lanes
    arithmetic = arithmetic_seconds(prog, int(width))
    seconds = _fastest_seconds(lambda: f(*args, **kwargs))
    steps = max(1, int(np.asarray(f.checked(*args, **kwargs)[1].steps)))
    # The machine's own schedule, replayed: how many of its steps run each block.
    replay = simulate(graph, get_scheduler(exe.options.schedule, prog))
    per_block = np.bincount(replay.types, minlength=prog.num_blocks) * (steps / max(1, replay.steps))
    # What the steps' arithmetic leaves of the run is their fixed part (never less than 5% of a step).
    fixed = max(seconds - float(per_block @ arithmetic), 0.05 * seconds) / steps
    return fixed + arithmetic


def compare(f: Any, g: Any, *args: Any, rounds: int = 9) -> tuple[float, float]:
    """Median seconds of a call of `f` and of `g` on these arguments, timed
    alternately (compiled first)."""
    calls = [lambda: f(*args), lambda: g(*args)]
    times: list[list[float]] = [[], []]
    for call in calls:
        jax.block_until_ready(call())
    for _ in range(rounds):
        for k, call in enumerate(calls):
            t0 = time.perf_counter()
            jax.block_until_ready(call())
            times[k].append(time.perf_counter() - t0)
    return statistics.median(times[0]), statistics.median(times[1])


def learn(f: Any, graph: ExecGraph, default: Any, learn_policy: Any, *args: Any, rounds: int = 2) -> Policy:
    """A policy learned for time: `learn_policy(costs)` on the estimated
    costs, timed against the default schedule (`default`, a host policy) and,
    where it measured slower, learned again once the model is corrected: the
    steps it runs more often than the default were dearer than estimated, by
    what the model missed. Still slower, it is dropped for its fallback where
    that is the default (`Earliest`, `ReturnsLast`). `policy.info["measured"]`:
    seconds a call, the policy's and the default's (absent where no table was
    learned)."""
    costs = estimate(f, graph, *args)
    base_counts = np.bincount(simulate(graph, default).types, minlength=costs.size)
    for done in range(1, rounds + 1):
        policy = learn_policy(costs)
        if all(a == policy.fallback(s) for s, a in zip(policy.states, policy.actions)):
            return policy
        mine, base = compare(f.with_schedule(policy), f, *args)
        policy.info.update(measured={"policy": mine, "default": base}, rounds=done)
        if mine < base:
            return policy
        if done == rounds:  # no round left to use a corrected model
            break
        extra = np.bincount(simulate(graph, policy).types, minlength=costs.size) - base_counts
        missed = (mine - base) - float(extra @ costs)
        more = extra > 0
        if missed <= 0 or not more.any():
            break
        costs = costs.copy()
        costs[more] += missed / float(extra[more].sum())
    if isinstance(default, (Earliest, ReturnsLast)):  # slower even so, and the fallback is the default
        return Policy(policy.num_types, policy.encoding, {}, returns=policy.returns, info={
            **policy.info, "dropped": "the learned table measured slower than the default"})
    return policy
