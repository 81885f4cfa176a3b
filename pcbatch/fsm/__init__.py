"""Schedulers: which block the machine runs next.

`"auto"` (the default: `"earliest"`, or `"returns_last"` for programs with
forks), `"earliest"` (Radul et al.), `"depth"` and `"agenda"` (the DyNet/Fold
baselines) by name, or a learned `Policy` (ED-Batch's finite state machine over
the set of blocks on the frontier):

>>> import jax.numpy as jnp, pcbatch, pcbatch.fsm
>>> @pcbatch.autobatch(fork=False)
... def fib(n):
...     return n if n <= 1 else fib(n - 1) + fib(n - 2)
>>> policy = pcbatch.fsm.learn(fib, jnp.arange(8), trials=50, progress=False)
>>> fib.with_schedule(policy)(jnp.array([3, 7]))
Array([ 2, 13], dtype=int32)

A policy minimises steps (ED-Batch's objective) or, with `costs`, their time
(`fsm.learn(..., costs="estimate")`, from `pcbatch.step_costs`); a state its
table does not know runs what the machine's default schedule would.

Two parts. What the machine calls each step, inside its loop: the
`Scheduler` interface and `Frontier` (`base.py`), the named schedulers
(`baselines.py`) and a learned `Policy`'s device lookup (`policy.py`).
Offline, on the host: execution graphs (`graph.py`), their simulation
(`simulation.py`) and Q-learning (`qlearn.py`), loaded on first use; the
machine never imports them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pcbatch.errors import OptionError

# What the machine calls each step (runs inside the loop, traced JAX):
from pcbatch.fsm.base import Auto, Fair, Frontier, Guarded, ReturnsLast, Scheduler, bind, guarded
from pcbatch.fsm.baselines import BASELINES, Agenda, Depth, Earliest
from pcbatch.fsm.policy import Policy
from pcbatch.ir.flow import follow_order

if TYPE_CHECKING:
    from pcbatch.fsm.graph import ExecGraph
    from pcbatch.fsm.qlearn import QConfig

# Offline, on the host (execution graphs, simulation, Q-learning): imported on
# first use, so the machine never loads them.
_OFFLINE = {"ExecGraph": "graph", "lower_bound": "graph", "QConfig": "qlearn", "learn_from_graphs": "qlearn",
            "Schedule": "simulation", "Simulation": "simulation", "simulate": "simulation"}


def __getattr__(name: str) -> Any:
    if name in _OFFLINE:
        import importlib
        return getattr(importlib.import_module(f"pcbatch.fsm.{_OFFLINE[name]}"), name)
    raise AttributeError(f"module 'pcbatch.fsm' has no attribute {name!r}")


def get_scheduler(schedule: Any, prog: Any = None) -> Scheduler:
    """A scheduler from its name, or the scheduler object itself; with a
    lowered program (`f.lowered(*args)`), specialised to it as the machine
    does (`"auto"`, `"returns_last"`). Each is also its own host policy for
    `simulate`."""
    if isinstance(schedule, str):
        named = {**BASELINES, "auto": Auto, "returns_last": ReturnsLast}
        if schedule not in named:
            raise OptionError("schedule", f"unknown schedule {schedule!r}; choose from {sorted(named)} or pass "
                                          "a scheduler")
        schedule = named[schedule]()
    elif isinstance(schedule, type):
        # The class where its instance was meant: its methods would miss `self`'s argument when traced.
        raise OptionError("schedule", f"got the class {schedule.__name__}, not a scheduler object",
                          f"pass an instance: schedule={schedule.__name__}().")
    elif not hasattr(schedule, "choose") or not hasattr(schedule, "init"):
        raise OptionError("schedule", f"must be a name or have init() and choose(); got {schedule!r}")
    schedule = guarded(schedule)
    return schedule if prog is None else bind(schedule, prog)


def record(f: Any, *sample_args: Any) -> ExecGraph:
    """What the autobatched `f` executes on a sample batch, as an `ExecGraph`
    (`f.execution_graph`): one chain of blocks per example, and with
    fork-join a DAG (a forked call's lane starts after its Fork; the Join
    waits for every child's last block). A replay of it is the machine's run
    when every step runs all lanes waiting at its block and the lane pool
    never runs out: pass `lane_width` and `max_lanes` large enough for the
    batch for the device's step counts to match."""
    return f.execution_graph(*sample_args)


def learn(f: Any, *sample_args: Any, encoding: str = "sort", trials: int = 1000, seed: int = 0,
          progress: bool = True, config: QConfig | None = None, costs: Any = None) -> Policy:
    """Learn a scheduling policy for `f` from one sample batch (offline, in
    NumPy; `f.learn_schedule`).

    Use it with `f.with_schedule(policy)` or `autobatch(..., schedule=policy)`;
    it applies to programs lowered with the same shared/batched arguments.
    It is learned on the machine `f` runs for `sample_args` (under `fork="auto"`,
    after the first call's choice), and `fork="auto"` keeps to that machine
    wherever the policy schedules. `costs="estimate"` minimises the steps'
    estimated time instead of their number (`f.learn_schedule`).
    """
    return f.learn_schedule(*sample_args, encoding=encoding, trials=trials, seed=seed, progress=progress,
                            config=config, costs=costs)


__all__ = [
    "Agenda", "Auto", "Depth", "Earliest", "Fair", "Guarded", "ReturnsLast", "ExecGraph", "Frontier", "Policy", "QConfig", "Schedule",
    "Scheduler", "Simulation", "follow_order", "get_scheduler", "learn", "learn_from_graphs", "lower_bound", "record", "simulate",
]
