"""What a machine step running each block costs, estimated for one call
signature: the cost model behind `learn_schedule(costs="estimate")`.

A step costs a fixed part (choosing the block, the lanes' bookkeeping, the
loop) plus its block's arithmetic. The arithmetic is XLA's flop count of the
block's ops at the width a step runs (`runtime.block.block_flops`: every lane
for one lane per example, the lane width for the fork-join pool) at the flop
rate this machine reaches on a matrix product of that width; the fixed part
is what is left of a timed run of the machine (its steps per block from
replaying its own schedule on the execution graph). Counting steps, as
ED-Batch does, treats a step that runs a cell and a step that moves a pc
alike; a schedule with fewer steps can then take longer.
"""
from __future__ import annotations

import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from pcbatch.fsm import get_scheduler
from pcbatch.fsm.graph import ExecGraph
from pcbatch.fsm.simulation import simulate
from pcbatch.runtime.block import block_flops

_REPEATS = 5


def _median_seconds(fn: Any, repeats: int = _REPEATS) -> float:
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def flop_rate(width: int, depth: int = 256, iterations: int = 16) -> float:
    """Flops per second of a `[width, depth] @ [depth, depth]` product in a
    `fori_loop`, as a machine step would run it."""
    x = jnp.ones((width, depth), jnp.float32)
    w = jnp.full((depth, depth), 1.0 / depth, jnp.float32)
    run = jax.jit(lambda x, w: lax.fori_loop(0, iterations, lambda _, y: y @ w, x))
    seconds = _median_seconds(lambda: run(x, w))
    return 2.0 * width * depth * depth * iterations / max(seconds, 1e-9)


def estimate(f: Any, graph: ExecGraph, *args: Any, **kwargs: Any) -> np.ndarray:
    """Seconds a step running each block of `f`'s machine for these
    arguments takes (see the module docstring); `graph` is
    `f.execution_graph(*args, **kwargs)`."""
    exe, _ = f.executable(*args, **kwargs)
    prog = exe.prog
    lanes, config = exe.config(exe.signature.local_batch)  # per device where sharded
    width = min(config.lane_width or lanes, lanes) if prog.has_forks else lanes
    flops = np.asarray(block_flops(prog, int(width)), np.float64)
    rate = flop_rate(int(width))
    seconds = _median_seconds(lambda: f(*args, **kwargs))
    steps = max(1, int(np.asarray(f.checked(*args, **kwargs)[1].steps)))
    # The machine's own schedule, replayed: how many of its steps run each block.
    replay = simulate(graph, get_scheduler(exe.options.schedule, prog))
    per_block = np.bincount(replay.types, minlength=prog.num_blocks) * (steps / max(1, replay.steps))
    arithmetic = float(per_block @ flops) / rate
    # What the steps' arithmetic leaves of the run is their fixed part (never less than 5% of a step).
    fixed = max(seconds - arithmetic, 0.05 * seconds) / steps
    return fixed + flops / rate
