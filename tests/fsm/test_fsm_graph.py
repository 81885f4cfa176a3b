"""ExecGraph construction, the lower bound, and host replay (Algorithm 1) with the baselines."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pcbatch.fsm.baselines import Agenda, Depth, Earliest, by_name
from pcbatch.fsm.graph import ExecGraph, lower_bound
from pcbatch.fsm.simulation import Simulation, simulate


@st.composite
def dags(draw, max_nodes: int = 14, max_types: int = 3) -> ExecGraph:
    """Random DAGs: edges only go from lower to higher node ids."""
    n = draw(st.integers(0, max_nodes))
    num_types = draw(st.integers(1, max_types))
    types = draw(st.lists(st.integers(0, num_types - 1), min_size=n, max_size=n))
    pairs = [(u, v) for v in range(n) for u in range(v)]
    edges = draw(st.lists(st.sampled_from(pairs), max_size=2 * n)) if pairs else []
    return ExecGraph.from_edges(types, edges, num_types)


def ancestors(graph: ExecGraph) -> list[set[int]]:
    """Brute-force transitive closure (node ids of `dags` are already topological)."""
    anc: list[set[int]] = []
    for v in range(graph.num_nodes):
        anc.append(set())
        for p in graph.parents(v).tolist():
            anc[v] |= anc[p] | {p}
    return anc


def test_from_chains_links_each_node_to_its_predecessor():
    g = ExecGraph.from_chains([[0, 1, 1], [], [2]], num_types=3)
    assert g.node_type.tolist() == [0, 1, 1, 2]
    assert [g.parents(v).tolist() for v in range(4)] == [[], [0], [1], []]
    assert g.num_lanes == 3
    assert g.depth.tolist() == [0, 1, 2, 0]


def test_from_edges_dedupes_edges_and_counts_source_lanes():
    g = ExecGraph.from_edges([0, 0, 1], [(0, 2), (1, 2), (0, 2)], num_types=2)
    assert sorted(g.parents(2).tolist()) == [0, 1]
    assert g.num_lanes == 2


@pytest.mark.parametrize(
    "types, edges, message",
    [([0, 0], [(0, 1), (1, 0)], "cycle"), ([0, 3], [], "types"), ([0], [(0, 1)], "range")],
)
def test_bad_graphs_are_rejected(types, edges, message):
    with pytest.raises(ValueError, match=message):
        ExecGraph.from_edges(types, edges, num_types=2)


def test_figure1_depths(figure1):
    g = figure1
    # leaves 0, internal nodes 1..3, outputs one deeper than their node, R after the deepest output.
    assert g.depth.tolist() == [0, 0, 0, 0, 1, 2, 3] + [1, 1, 1, 1, 2, 3, 4] + [5]


@pytest.mark.parametrize(
    "graph, bound",
    [
        # type 0 appears twice on the first chain, type 1 once on each: 2 + 1.
        (ExecGraph.from_chains([[0, 1, 0], [1, 0]], 2), 3),
        # Chains are independent: the longest run of each type counts, 3 + 2.
        (ExecGraph.from_chains([[0, 0, 0], [1, 1], [0, 1]], 2), 5),
        # A type absent from the graph contributes nothing.
        (ExecGraph.from_chains([[2, 2]], 4), 2),
        # Diamond 0 -> {1, 2} -> 3 with types a, b, a, a: the path 0-2-3 holds three a's, b once.
        (ExecGraph.from_edges([0, 1, 0, 0], [(0, 1), (0, 2), (1, 3), (2, 3)], 2), 4),
        (ExecGraph.from_chains([], 3), 0),
    ],
)
def test_lower_bound_by_hand(graph, bound):
    assert lower_bound(graph) == bound


def test_lower_bound_of_figure1(figure1):
    # I on the path leaf-int1-int2-int3 (4), one O, one R: the paper's optimum of 6.
    assert lower_bound(figure1) == 6


@settings(max_examples=60, deadline=None)
@given(dags())
def test_lower_bound_matches_brute_force_paths(g):
    # Enumerate every path by DFS and count each type on it.
    best = np.zeros(g.num_types, int)
    kids = [[] for _ in range(g.num_nodes)]
    for v in range(g.num_nodes):
        for p in g.parents(v).tolist():
            kids[p].append(v)

    def walk(v: int, counts: np.ndarray) -> None:
        counts = counts.copy()
        counts[g.node_type[v]] += 1
        np.maximum(best, counts, out=best)
        for c in kids[v]:
            walk(c, counts)

    for v in range(g.num_nodes):
        walk(v, np.zeros(g.num_types, int))
    assert lower_bound(g) == best.sum()


@settings(max_examples=60, deadline=None)
@given(dags())
def test_same_type_links_block_exactly_the_nodes_with_a_same_type_ancestor(g):
    ptr, idx, blockers = g.same_type_links
    anc = ancestors(g)
    types = g.node_type.tolist()

    def nearest(v: int) -> set[int]:
        """Same-type nodes reaching v along a path whose inner nodes all have other types."""
        found, stack, seen = set(), g.parents(v).tolist(), set()
        while stack:
            u = stack.pop()
            if u in seen:
                continue
            seen.add(u)
            if types[u] == types[v]:
                found.add(u)
            else:
                stack += g.parents(u).tolist()
        return found

    for v in range(g.num_nodes):
        near = nearest(v)
        assert blockers[v] == len(near)
        assert {u for u in range(g.num_nodes) if v in idx[ptr[u] : ptr[u + 1]].tolist()} == near
        # What the reward relies on: blocked exactly when some same-type ancestor exists.
        assert (blockers[v] == 0) == all(types[u] != types[v] for u in anc[v])


# -- host replay ---------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(dags(), st.integers(0, 2**32 - 1))
def test_replay_runs_every_node_once_in_dependency_order(g, seed):
    rng = np.random.default_rng(seed)
    sched = simulate(g, lambda sim: int(rng.choice(np.flatnonzero(sim.counts))))
    step, types = sched.node_step, g.node_type
    assert sched.sizes.sum() == g.num_nodes and np.all(sched.sizes > 0)
    assert np.all(step >= 0) and np.array_equal(np.bincount(step, minlength=sched.steps), sched.sizes)
    assert np.array_equal(sched.types[step], types)  # a step only runs nodes of its type
    for v in range(g.num_nodes):
        parents = g.parents(v)
        ready_at = int(step[parents].max()) + 1 if parents.size else 0
        assert ready_at <= step[v]
        # Algorithm 1 runs *all* ready nodes of the chosen type: v was never passed over.
        assert types[v] not in sched.types[ready_at : step[v]].tolist()
    assert sched.steps >= lower_bound(g)


@settings(max_examples=60, deadline=None)
@given(dags(), st.integers(0, 2**32 - 1))
def test_sub_frontier_counts_unrun_nodes_without_unrun_same_type_ancestor(g, seed):
    rng = np.random.default_rng(seed)
    anc = ancestors(g)
    types = g.node_type.tolist()
    sim = Simulation(g, track_reward=True)
    while not sim.done:
        unrun = set(np.flatnonzero(sim.node_step < 0).tolist())
        for t in range(g.num_types):
            expected = sum(1 for v in unrun if types[v] == t and not any(types[u] == t for u in anc[v] & unrun))
            assert sim.sub_frontier(t) == expected
        sim.step(int(rng.choice(np.flatnonzero(sim.counts))))


def test_step_rejects_a_type_without_ready_nodes():
    sim = Simulation(ExecGraph.from_chains([[0, 1]], 3))
    for t in (1, 2, 3, -1):
        with pytest.raises(ValueError, match="no ready node"):
            sim.step(t)


def test_utilisation_counts_idle_lane_slots():
    # Two lanes; earliest runs [0 0] (both lanes) then [1] (one lane): 3 of 4 slots busy.
    sched = simulate(ExecGraph.from_chains([[0, 1], [0]], 2), Earliest())
    assert sched.types.tolist() == [0, 1] and sched.sizes.tolist() == [2, 1]
    assert sched.utilisation == 0.75


def test_baselines_on_figure1(figure1):
    """Hand-run on Figure 1 (I=0, O=1, R=2).

    earliest: I whenever ready, so all four I levels, then every O at once, then R.
    depth:    I(leaves), I(int1, depth 1 beats the depth-1 Os by block number),
              O (the four depth-1 Os; the VM runs all 5 ready Os), I(int2), I(int3 ties
              O at depth 3), O (2), R.
    agenda:   I, I (means tie at 1), O (mean 6/5 < 2), I, I (tie at 3), O, R.
    (The paper's 9 and 7 come from running only one depth per batch, and from
    averaging over all unrun nodes; the VM can do neither.)
    """
    runs = {name: simulate(figure1, by_name(name)) for name in ("earliest", "depth", "agenda")}
    assert runs["earliest"].types.tolist() == [0, 0, 0, 0, 1, 2]
    assert runs["depth"].types.tolist() == [0, 0, 1, 0, 0, 1, 2]
    assert runs["depth"].sizes.tolist() == [4, 1, 5, 1, 1, 2, 1]
    assert runs["agenda"].types.tolist() == [0, 0, 1, 0, 0, 1, 2]


def test_agenda_compares_mean_depths_exactly():
    # After running block 3, block 1's ready nodes sit at depths {0, 1} (mean 1/2)
    # and block 2's at {0, 0, 1, 1} (mean 2/4): a tie, so the lower block wins;
    # one more depth-0 node for block 2 (mean 2/5) makes it win.
    g = ExecGraph.from_chains([[1], [3, 1], [2], [2], [3, 2], [3, 2]], 4)
    sim = Simulation(g)
    sim.step(3)
    assert (sim.counts.tolist(), sim.depth_sum.tolist()) == ([0, 2, 4, 0], [0, 1, 2, 0])
    assert Agenda()(sim) == 1
    sim = Simulation(ExecGraph.from_chains([[1], [3, 1], [2], [2], [2], [3, 2], [3, 2]], 4))
    sim.step(3)
    assert Agenda()(sim) == 2


def test_depth_prefers_the_shallowest_ready_node():
    # Block 2 waits at depth 0 on one lane while blocks 0, 1 are deeper.
    g = ExecGraph.from_chains([[3, 3, 0], [3, 1], [2]], 4)
    sim = Simulation(g)
    assert Depth()(sim) == 2  # depth 0: blocks 2 and 3; lowest wins
    sim.step(2)
    assert Depth()(sim) == 3
    sim.step(3)
    assert Depth()(sim) == 1  # block 1 at depth 1 beats block 3 at depth 1 by number
