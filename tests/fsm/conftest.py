"""Fixtures: synthetic execution graphs shaped like ED-Batch's workloads, and
policies learned on them.

Everything is generated from fixed seeds, so the numbers the tests check are
deterministic.  Tests get these through fixtures only (importing conftest
would clash with other test directories' conftest modules).
"""
from __future__ import annotations

import numpy as np
import pytest

from pcbatch.fsm.graph import ExecGraph
from pcbatch.fsm.qlearn import learn_from_graphs

# Block types of the Figure 1 graph.
I, O, R = 0, 1, 2


def figure1() -> ExecGraph:
    """ED-Batch Figure 1: a right-branching parse tree over 4 words.

    Internal/leaf cells are I, every tree node has an output O, and one R
    reduces all outputs.  Nodes 0-3: leaves; 4 = (2, 3), 5 = (1, 4),
    6 = (0, 5); 7-13: the outputs of 0-6; 14: R.
    """
    types = [I] * 7 + [O] * 7 + [R]
    edges = [(2, 4), (3, 4), (1, 5), (4, 5), (0, 6), (5, 6)]
    edges += [(v, 7 + v) for v in range(7)] + [(7 + v, 14) for v in range(7)]
    return ExecGraph.from_edges(types, edges, 3)


def random_binary_tree(rng: np.random.Generator, leaves: int) -> dict[int, tuple[int, int]]:
    """Children of each internal node; leaves are 0..leaves-1, the root is the largest id."""
    roots, children = list(range(leaves)), {}
    while len(roots) > 1:
        i, node = int(rng.integers(len(roots) - 1)), leaves + len(children)
        children[node] = (roots[i], roots[i + 1])
        roots[i : i + 2] = [node]
    return children


def tree_lstm(rng: np.random.Generator, batch: int, two_types: bool = False) -> ExecGraph:
    """TreeLSTM (Figure 1 generalised) or TreeLSTM-2Type over random parse trees.

    Types: 0 leaf cell, 1 internal cell (TreeLSTM-2Type: 1 or 2 with
    probability 1/2 each), then an output per tree node and one reduction per tree.
    """
    out = 3 if two_types else 2
    types: list[int] = []
    edges: list[tuple[int, int]] = []
    for _ in range(batch):
        leaves = int(rng.integers(2, 16))
        children = random_binary_tree(rng, leaves)
        size = leaves + len(children)
        base = len(types)
        types += [0] * leaves + [1 + int(two_types and rng.random() < 0.5) for _ in children]
        edges += [(base + c, base + v) for v, pair in children.items() for c in pair]
        types += [out] * size + [out + 1]
        edges += [(base + v, base + size + v) for v in range(size)]
        edges += [(base + size + v, base + 2 * size) for v in range(size)]
    return ExecGraph.from_edges(types, edges, out + 2)


def bilstm_chains(rng: np.random.Generator, lanes: int) -> ExecGraph:
    """BiLSTM tagger lanes: n forward cells (0), n backward cells (1), n taggers (2)."""
    lengths = rng.integers(3, 15, size=lanes)
    return ExecGraph.from_chains([[0] * n + [1] * n + [2] * n for n in lengths.tolist()], 3)


def recursion_chains(rng: np.random.Generator, lanes: int) -> ExecGraph:
    """A stack machine running a tree recursion, one lane per tree.

    Blocks: 0 enter an internal node, 1 leaf, 2 combine after both calls return.
    """
    chains = []
    for _ in range(lanes):
        leaves = int(rng.integers(1, 10))
        children = random_binary_tree(rng, leaves)

        def visit(v: int) -> list[int]:
            if v < leaves:
                return [1]
            left, right = children[v]
            return [0, *visit(left), *visit(right), 2]

        chains.append(visit(leaves + len(children) - 1))
    return ExecGraph.from_chains(chains, 3)


def lattice(rng: np.random.Generator, batch: int) -> ExecGraph:
    """Lattice LSTM: a chain of character cells (0) and word cells (1) that
    start at one character and feed a later one."""
    types: list[int] = []
    edges: list[tuple[int, int]] = []
    for _ in range(batch):
        n, base = int(rng.integers(5, 25)), len(types)
        types += [0] * n
        edges += [(base + i, base + i + 1) for i in range(n - 1)]
        for i in range(n - 1):
            if rng.random() < 0.5:
                word, end = len(types), min(n - 1, i + int(rng.integers(1, 4)))
                types.append(1)
                edges += [(base + i, word), (word, base + end)]
    return ExecGraph.from_edges(types, edges, 2)


MAKERS = {
    "bilstm": lambda rng: bilstm_chains(rng, 16),
    "rec": lambda rng: recursion_chains(rng, 16),
    "tree": lambda rng: tree_lstm(rng, 16),
    "tree2": lambda rng: tree_lstm(rng, 16, two_types=True),
    "lattice": lambda rng: lattice(rng, 16),
}


@pytest.fixture(name="figure1")
def figure1_fixture() -> ExecGraph:
    return figure1()


@pytest.fixture(scope="session")
def workloads() -> dict[str, tuple[list[ExecGraph], list[ExecGraph]]]:
    """name -> (training graphs, held-out graphs)."""
    rng = np.random.default_rng(2024)
    return {name: ([make(rng) for _ in range(2)], [make(rng) for _ in range(3)]) for name, make in MAKERS.items()}


class _LearnedOnDemand(dict):
    """name -> Policy, each learned the first time a test asks for it: a test file
    reads two or four of the five (~1.5 s of learning each), and with `--dist
    loadfile` the files run in different workers."""

    def __init__(self, workloads):
        super().__init__()
        self.workloads = workloads

    def __missing__(self, name: str):
        train, _ = self.workloads[name]
        self[name] = learn_from_graphs(train, train[0].num_types, encoding="sort", trials=400, seed=0,
                                       progress=False)
        return self[name]


@pytest.fixture(scope="session")
def learned(workloads):
    """name -> Policy learned (E_sort, seed 0) on that workload's training graphs."""
    return _LearnedOnDemand(workloads)
