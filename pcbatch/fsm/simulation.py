"""Host-side replay of ED-Batch's Algorithm 1 on a recorded `ExecGraph`.

Each step a policy picks a type (block) among those with ready nodes, and every
ready node of that type runs: exactly what one VM step does with the lanes
waiting at that block.  This is the training environment of `qlearn` and the
reference the device schedulers are checked against, so it is written for
speed: work per step is proportional to the batch, not the graph.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pcbatch.fsm.graph import ExecGraph

# min_depth of a type with no ready node: larger than any depth.
NO_DEPTH = np.iinfo(np.int64).max


class Simulation:
    """The state of Algorithm 1 part-way through a graph.

    What host policies may read:
      counts:    int64[num_types] ready nodes per type (the device's `Frontier.counts`).
      depth_sum: int64[num_types] sum of the topological depths of those nodes.
      min_depth: int64[num_types] smallest such depth (`NO_DEPTH` if none ready).
    """

    def __init__(self, graph: ExecGraph, track_reward: bool = False, track_depth: bool = True) -> None:
        num_types = graph.num_types
        self.counts = np.zeros(num_types, np.int64)
        self.depth_sum = np.zeros(num_types, np.int64)
        self.min_depth = np.full(num_types, NO_DEPTH, np.int64)
        self.node_step = np.full(graph.num_nodes, -1, np.int32)
        self.num_steps = 0
        self._types = graph.node_type
        self._depth = graph.depth.astype(np.int64)
        self._children = graph.child_links
        self._remaining = np.diff(graph.parent_ptr)
        self._ready: list[list[np.ndarray]] = [[] for _ in range(num_types)]
        self._left = graph.num_nodes
        self._track_depth = track_depth  # depth_sum and min_depth: only the depth and agenda policies read them
        self._add_ready(np.flatnonzero(self._remaining == 0))
        self._track_reward = track_reward
        if track_reward:
            _, _, blockers = graph.same_type_links
            self._near = graph.same_type_link_rows
            self._blockers = blockers.copy()
            # |Frontier(G^a)| per type: unrun type-a nodes with no unrun type-a ancestor.
            self._sub_frontier = np.bincount(self._types[blockers == 0], minlength=num_types)

    @property
    def done(self) -> bool:
        return self._left == 0

    def sub_frontier(self, t: int) -> int:
        """|Frontier(G_t^a)| for a = t, the denominator of eq. (1)."""
        if not self._track_reward:
            raise RuntimeError("construct the Simulation with track_reward=True")
        return int(self._sub_frontier[t])

    def step(self, t: int) -> int:
        """Run every ready node of type t; returns the batch size."""
        if not 0 <= t < self.counts.shape[0] or self.counts[t] == 0:
            raise ValueError(f"type {t} has no ready node")
        chunks = self._ready[t]
        batch = chunks[0] if len(chunks) == 1 else np.concatenate(chunks)
        self._ready[t] = []
        self.counts[t] = 0
        self.depth_sum[t] = 0
        self.min_depth[t] = NO_DEPTH
        self.node_step[batch] = self.num_steps
        self.num_steps += 1
        self._left -= batch.size

        kids = self._children.gather(batch)
        if kids.size:
            if self._children.repeats:
                np.subtract.at(self._remaining, kids, 1)
            else:  # no node is a child of two: a plain (faster) update
                self._remaining[kids] -= 1
            ready = kids[self._remaining[kids] == 0]
            # A node with several parents in this batch appears once per parent.
            self._add_ready(np.unique(ready) if ready.size > 1 and self._children.repeats else ready)

        if self._track_reward:
            self._sub_frontier[t] -= batch.size
            near = self._near.gather(batch)
            if near.size:
                if self._near.repeats:
                    np.subtract.at(self._blockers, near, 1)
                else:
                    self._blockers[near] -= 1
                freed = near[self._blockers[near] == 0]
                self._sub_frontier[t] += np.unique(freed).size if self._near.repeats else freed.size
        return int(batch.size)

    def _add_ready(self, nodes: np.ndarray) -> None:
        if nodes.size == 0:
            return
        types = self._types[nodes]
        num_types = self.counts.shape[0]
        self.counts += np.bincount(types, minlength=num_types)
        if self._track_depth:
            depth = self._depth[nodes]
            self.depth_sum += np.bincount(types, weights=depth, minlength=num_types).astype(np.int64)
            np.minimum.at(self.min_depth, types, depth)
        first = int(types[0])
        if nodes.size == 1 or not np.any(types != first):  # one type: the common case, no split
            self._ready[first].append(nodes)
            return
        for t in np.unique(types).tolist():
            self._ready[t].append(nodes[types == t])


HostPolicy = Callable[[Simulation], int]
"""Chooses the next type from a `Simulation`; must pick one with counts > 0."""


@dataclass(frozen=True, eq=False)
class Schedule:
    """The result of replaying a graph.

    types:     int32[steps] block run at each step.
    sizes:     int32[steps] nodes (lanes) run at each step.
    node_step: int32[N] the step at which each node ran.
    num_lanes: lanes of the recording.
    """

    types: np.ndarray
    sizes: np.ndarray
    node_step: np.ndarray
    num_lanes: int

    @property
    def steps(self) -> int:
        return int(self.types.shape[0])

    @property
    def utilisation(self) -> float:
        """Fraction of lane slots doing useful work: nodes / (steps * lanes)."""
        slots = self.steps * self.num_lanes
        return float(self.sizes.sum()) / slots if slots else 1.0


def simulate(graph: ExecGraph, policy: HostPolicy, track_depth: bool = True) -> Schedule:
    """Algorithm 1: until the graph is empty, run all ready nodes of policy's type
    (`track_depth=False`: for policies that read only `counts`, faster)."""
    sim = Simulation(graph, track_depth=track_depth)
    types, sizes = [], []
    while not sim.done:
        t = int(policy(sim))
        sizes.append(sim.step(t))
        types.append(t)
    return Schedule(np.asarray(types, np.int32), np.asarray(sizes, np.int32), sim.node_step, graph.num_lanes)
