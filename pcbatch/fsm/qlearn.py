"""Learning an FSM policy offline by tabular Q-learning (ED-Batch §2.3).

The environment is Algorithm 1 replayed on recorded `ExecGraph`s (NumPy only).
At step t, in state S_t = F(G_t), running type a earns eq. (1):

    r = -1 + alpha * |Frontier_a(G_t)| / |Frontier(G_t^a)|

The -1 charges every batch; the ratio is 1 exactly when a's batch holds every
type-a node that has no unrun type-a ancestor, the case in which Lemma 2.1
says some shortest schedule starts with a.

With `costs` (one per block: what a step running it takes, e.g. in µs), the
objective is the schedule's total cost instead of its step count: a step of
type a earns `cost[a] * r` (costs scaled to mean 1), the greedy replays keep
the cheapest table, and a table no cheaper than its fallback alone (what the
policy runs in states it does not know) is dropped for the fallback.

Training follows the reference implementation: Q starts at 0 for each ready
type of a new state (optimistic, as rewards lie in [-1, alpha - 1]), ε-greedy
episodes with ε decaying per episode, n-step returns applied after each
episode, and every `eval_every` episodes a greedy replay of all training graphs
whose table is kept if it needs the fewest steps so far; training stops early
once that is within `stop_ratio` of the lower bound, or (our addition, for
graphs whose bound is not reachable) after `patience` greedy replays without
improvement.
"""
from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from tqdm.auto import tqdm

from pcbatch.errors import OptionError
from pcbatch.fsm.graph import ExecGraph, lower_bound
from pcbatch.fsm.policy import ENCODINGS, Policy, State, encode_state
from pcbatch.fsm.simulation import Simulation, simulate


@dataclass(frozen=True)
class QConfig:
    """Hyper-parameters; the defaults are the reference implementation's."""

    alpha: float = 1.0  # weight of the Lemma 2.1 term in eq. (1)
    lr: float = 0.4
    n_step: int = 10
    gamma: float = 1.0
    eps_start: float = 0.5
    eps_decay: float = 0.9  # per episode
    eps_min: float = 0.05
    eval_every: int = 50  # episodes between greedy replays
    stop_ratio: float = 1.01  # stop once steps <= stop_ratio * lower bound
    patience: int | None = None  # stop after this many greedy replays without a better table (None: never)
    max_states: int = 2048  # table size cap (the states the final replay visits are always kept)


def learn_from_graphs(
    graphs: Sequence[ExecGraph],
    num_types: int,
    encoding: str = "sort",
    trials: int = 1000,
    seed: int = 0,
    progress: bool = True,
    config: QConfig = QConfig(),
    costs: Sequence[float] | None = None,
    returns: Sequence[bool] | None = None,
) -> Policy:
    """Learn a policy minimising the total VM steps over `graphs` (with
    `costs`, one per type: their total cost). `returns` (which blocks end in
    a return) makes the policy fall back to the earliest ready block that does
    not return, `ReturnsLast`, the fork-join default; else the earliest.

    Episode i replays graphs[i % len(graphs)].  The result is deterministic
    given `seed`.  `policy.info` records the training outcome.
    """
    if not graphs:
        raise ValueError("need at least one graph")
    if any(g.num_types != num_types for g in graphs):
        raise ValueError(f"every graph must have num_types={num_types}")
    if encoding not in ENCODINGS:
        raise ValueError(f"unknown encoding {encoding!r}; expected one of {ENCODINGS}")
    if trials < 1:
        raise ValueError("trials must be at least 1")
    weight = None
    if costs is not None:
        weight = np.asarray(costs, np.float64)
        if weight.shape != (num_types,) or not np.all(np.isfinite(weight)) or np.any(weight <= 0):
            raise OptionError("costs", f"must be {num_types} positive numbers, one per block; got {costs!r}",
                              "one per block of `f.lowered(*args)` (its `num_blocks`), or costs='estimate'")
        weight = weight / weight.mean()

    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    q: dict[State, np.ndarray] = {}
    visits: Counter[State] = Counter()
    bound = sum(lower_bound(g) for g in graphs)
    best_table: dict[State, int] = {}
    best, stale = None, 0
    eps = config.eps_start
    bar = tqdm(range(trials), desc=f"fsm[{encoding}]", unit="episode", disable=not progress)
    episodes = 0
    for episode in bar:
        episodes += 1
        trajectory = _episode(graphs[episode % len(graphs)], q, eps, rng, encoding, config.alpha, weight)
        visits.update(trajectory[0])
        _update(q, *trajectory, config)
        eps = max(config.eps_min, eps * config.eps_decay)
        if episodes % config.eval_every == 0 or episodes == trials:
            table = {s: int(np.argmax(v)) for s, v in q.items()}
            total = _total(graphs, Policy(num_types, encoding, table, returns=returns), weight)  # steps, or cost
            if best is None or total < best:
                best, best_table, stale = total, table, 0
            else:
                stale += 1
            bar.set_postfix(**({"steps": best, "bound": bound} if weight is None else {"cost": best}))
            # (The bound counts steps: with costs only patience stops early.)
            if ((weight is None and best <= config.stop_ratio * bound)
                    or (config.patience is not None and stale >= config.patience)):
                break
    bar.close()

    fallback = None
    if weight is not None:  # a table that does no better than its own fallback is not worth a lookup per step
        fallback = _total(graphs, Policy(num_types, encoding, {}, returns=returns), weight)
        if best >= fallback:
            best_table, best = {}, fallback
    final = Policy(num_types, encoding, best_table, returns=returns)
    table, transitions = _replay(graphs, final)
    # Beyond the replayed states, keep the most visited ones whose choice
    # differs from the fallback's; the rest would not change what the policy does.
    extra = sorted((s for s, a in best_table.items() if s not in table and a != final.fallback(s)),
                   key=lambda s: -visits[s])
    table.update((s, best_table[s]) for s in extra[: max(0, config.max_states - len(table))])
    info = {
        "steps": best if weight is None else _total(graphs, final, None),
        "lower_bound": bound,
        "episodes": episodes,
        "seconds": round(time.perf_counter() - started, 3),
        "trials": trials,
        "seed": seed,
        "config": asdict(config),
    }
    if weight is not None:
        scale = float(np.mean(costs))
        info.update(costs=[float(c) for c in costs], cost=best * scale, fallback_cost=fallback * scale)
    return Policy(num_types, encoding, table, transitions, info, returns)


def _episode(
    graph: ExecGraph, q: dict[State, np.ndarray], eps: float, rng: np.random.Generator, encoding: str, alpha: float,
    weight: np.ndarray | None = None,
) -> tuple[list[State], list[int], list[float]]:
    """One ε-greedy replay of `graph`; returns its states, actions and rewards."""
    sim = Simulation(graph, track_reward=True, track_depth=False)
    states, actions, rewards = [], [], []
    while not sim.done:
        state = encode_state(sim.counts, encoding)
        values = q.get(state)
        if values is None:
            # Only ready types are actions; argmax then prefers the lowest untried one.
            values = q[state] = np.where(sim.counts > 0, 0.0, -np.inf)
        if rng.random() < eps:
            action = int(rng.choice(np.flatnonzero(sim.counts)))
        else:
            action = int(np.argmax(values))
        sub_frontier = sim.sub_frontier(action)
        batch = sim.step(action)
        states.append(state)
        actions.append(action)
        reward = -1.0 + alpha * batch / sub_frontier
        rewards.append(reward if weight is None else reward * weight[action])
    return states, actions, rewards


def _update(
    q: dict[State, np.ndarray], states: list[State], actions: list[int], rewards: list[float], config: QConfig
) -> None:
    """n-step Q-learning over a finished episode, front to back."""
    n = len(rewards)
    for i in range(n):
        j = min(i + config.n_step, n)
        ret = 0.0 if j == n else float(q[states[j]].max())
        for k in range(j - 1, i - 1, -1):
            ret = ret * config.gamma + rewards[k]
        values = q[states[i]]
        values[actions[i]] += config.lr * (ret - values[actions[i]])


def _total(graphs: Sequence[ExecGraph], policy: Policy, weight: np.ndarray | None) -> float:
    """The policy's total steps over `graphs`, or with `weight` their total weight."""
    if weight is None:
        return sum(simulate(g, policy, track_depth=False).steps for g in graphs)
    return float(sum(weight[simulate(g, policy, track_depth=False).types].sum() for g in graphs))


def _replay(graphs: Sequence[ExecGraph], policy: Policy) -> tuple[dict[State, int], list[tuple[State, State, int]]]:
    """Replays `policy` on `graphs`: the table of the states it visits, and its transitions.

    A visited state without an entry gets the fallback choice made there, so
    the policy's behaviour on `graphs` is unchanged.
    """
    table: dict[State, int] = {}
    seen: Counter[tuple[State, State]] = Counter()
    for graph in graphs:
        sim = Simulation(graph, track_depth=False)
        prev = None
        while not sim.done:
            state = encode_state(sim.counts, policy.encoding)
            block = policy(sim)
            table[state] = block
            if prev is not None:
                seen[prev, state] += 1
            prev = state
            sim.step(block)
    return table, [(a, b, n) for (a, b), n in seen.items()]
