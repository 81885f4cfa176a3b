"""Recorded executions as dependency graphs (ED-Batch's dataflow graph G).

Which blocks an example executes does not depend on the schedule, so a run can
be recorded once and replayed offline.  Each node of an `ExecGraph` is one
block execution by one lane; its *type* is the block index.  A lane without
fork-join gives a chain; with fork-join the lanes' chains join into a DAG.

`lower_bound` is ED-Batch's Appendix A.3 bound on the number of VM steps.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any
from dataclasses import dataclass
from functools import cached_property

import numpy as np


def gather_rows(ptr: np.ndarray, idx: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Concatenation of the CSR rows `rows` (``idx[ptr[r]:ptr[r+1]]`` each), without a Python loop."""
    starts = ptr[rows]
    lens = ptr[rows + 1] - starts
    total = int(lens.sum())
    if total == 0:
        return idx[:0]
    # Output position k of row r reads idx[starts[r] + k - first_k(r)].
    first = np.cumsum(lens) - lens
    return idx[np.repeat(starts - first, lens) + np.arange(total)]


class Links:
    """CSR rows (`gather_rows`) with a fast path where every row holds at most
    one entry (a lane's chain of blocks): then a gather is one index. `repeats`:
    whether a gather's entries can repeat (some entry is in several rows)."""

    def __init__(self, ptr: np.ndarray, idx: np.ndarray) -> None:
        self.ptr, self.idx = ptr, idx
        lens = np.diff(ptr)
        self.single = None
        if lens.size and lens.max() <= 1:
            self.single = np.full(lens.size, -1, idx.dtype)
            self.single[lens == 1] = idx
        self.repeats = idx.size > np.unique(idx).size

    def gather(self, rows: np.ndarray) -> np.ndarray:
        if self.single is None:
            return gather_rows(self.ptr, self.idx, rows)
        out = self.single[rows]
        return out[out >= 0]


def _csr(rows: np.ndarray, cols: np.ndarray, num_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR (ptr, idx) of the pairs (rows[i], cols[i]); within a row, cols keep their order."""
    order = np.argsort(rows, kind="stable")
    ptr = np.zeros(num_rows + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=num_rows), out=ptr[1:])
    return ptr, cols[order].astype(np.int32)


@dataclass(frozen=True, eq=False)
class ExecGraph:
    """Block executions and their dependencies.

    node_type:  int32[N] block index of each node, in ``0 .. num_types-1``.
    parent_ptr: int64[N+1], parent_idx: int32[E]: the parents of node v are
                ``parent_idx[parent_ptr[v]:parent_ptr[v+1]]`` (CSR).
    num_types:  number of blocks of the program.
    num_lanes:  lanes the recording ran on (the denominator of utilisation).
    """

    node_type: np.ndarray
    parent_ptr: np.ndarray
    parent_idx: np.ndarray
    num_types: int
    num_lanes: int

    def __post_init__(self) -> None:
        # Normalise dtypes once so every consumer can rely on them.
        object.__setattr__(self, "node_type", np.asarray(self.node_type, np.int32))
        object.__setattr__(self, "parent_ptr", np.asarray(self.parent_ptr, np.int64))
        object.__setattr__(self, "parent_idx", np.asarray(self.parent_idx, np.int32))
        n = self.node_type.shape[0]
        if self.node_type.size and not (0 <= self.node_type.min() and self.node_type.max() < self.num_types):
            raise ValueError(f"node types must lie in [0, {self.num_types})")
        if self.parent_ptr.shape != (n + 1,) or self.parent_ptr[0] != 0 or np.any(np.diff(self.parent_ptr) < 0):
            raise ValueError("parent_ptr must be a CSR row pointer of length num_nodes + 1")
        if self.parent_ptr[-1] != self.parent_idx.size:
            raise ValueError("parent_ptr[-1] must equal len(parent_idx)")
        if self.parent_idx.size and not (0 <= self.parent_idx.min() and self.parent_idx.max() < n):
            raise ValueError("parent indices out of range")
        _ = self.waves  # computing the topological order rejects cycles up front

    @property
    def num_nodes(self) -> int:
        return int(self.node_type.shape[0])

    def parents(self, v: int) -> np.ndarray:
        return self.parent_idx[self.parent_ptr[v] : self.parent_ptr[v + 1]]

    @classmethod
    def from_chains(cls, chains: Sequence[Sequence[int]], num_types: int) -> ExecGraph:
        """One chain per lane: the block types the lane executed, in order."""
        lengths = np.array([len(c) for c in chains], np.int64)
        types = np.concatenate([np.asarray(c, np.int32) for c in chains]) if len(chains) else np.zeros(0, np.int32)
        n = types.shape[0]
        # Nodes are numbered chain by chain; every node but a chain's first has
        # its predecessor as its only parent.
        is_first = np.zeros(n, bool)
        is_first[(np.cumsum(lengths) - lengths)[lengths > 0]] = True
        parent_ptr = np.zeros(n + 1, np.int64)
        np.cumsum(~is_first, out=parent_ptr[1:])
        parent_idx = (np.flatnonzero(~is_first) - 1).astype(np.int32)
        return cls(types, parent_ptr, parent_idx, num_types, len(chains))

    @classmethod
    def from_traces(cls, traces: Sequence[Any], num_types: int) -> ExecGraph:
        """The executions of several examples side by side: one
        `pcbatch.ir.Trace` each (`blocks`, and the `parents` each block waited
        for: a chain per lane, joined at forks)."""
        types = np.asarray([b for t in traces for b in t.blocks], np.int32)
        edges, offset = [], 0
        for t in traces:
            edges += [(offset + p, offset + v) for v, ps in enumerate(t.parents) for p in ps]
            offset += len(t.blocks)
        return cls.from_edges(types, np.asarray(edges, np.int64).reshape(-1, 2), num_types, len(traces))

    @classmethod
    def from_edges(
        cls,
        types: Sequence[int] | np.ndarray,
        edges: Iterable[tuple[int, int]] | np.ndarray,
        num_types: int,
        num_lanes: int | None = None,
    ) -> ExecGraph:
        """A DAG from node types and (parent, child) edges.

        `num_lanes` defaults to the number of nodes without parents.
        """
        types = np.asarray(types, np.int32)
        n = types.shape[0]
        e = np.asarray(edges if isinstance(edges, np.ndarray) else list(edges), np.int64).reshape(-1, 2)
        e = np.unique(e, axis=0)  # a repeated edge would count twice against readiness
        if e.size and not (0 <= e.min() and e.max() < n):
            raise ValueError("edge endpoints out of range")
        parent_ptr, parent_idx = _csr(e[:, 1], e[:, 0], n)
        if num_lanes is None:
            num_lanes = int(np.count_nonzero(np.diff(parent_ptr) == 0))
        return cls(types, parent_ptr, parent_idx, num_types, num_lanes)

    @cached_property
    def children(self) -> tuple[np.ndarray, np.ndarray]:
        """CSR (ptr, idx) of each node's children."""
        n = self.num_nodes
        child_of_edge = np.repeat(np.arange(n, dtype=np.int32), np.diff(self.parent_ptr))
        return _csr(self.parent_idx, child_of_edge, n)

    @cached_property
    def child_links(self) -> Links:
        """`children` as `Links` (the simulation's fast gathers)."""
        return Links(*self.children)

    @cached_property
    def same_type_link_rows(self) -> Links:
        """`same_type_links`' rows as `Links`."""
        ptr, idx, _ = self.same_type_links
        return Links(ptr, idx)

    @cached_property
    def waves(self) -> tuple[np.ndarray, ...]:
        """Nodes grouped by topological depth (Kahn's algorithm, one wave at a time)."""
        child_ptr, child_idx = self.children
        remaining = np.diff(self.parent_ptr)
        wave = np.flatnonzero(remaining == 0).astype(np.int32)
        waves, seen = [], 0
        while wave.size:
            waves.append(wave)
            seen += wave.size
            kids = gather_rows(child_ptr, child_idx, wave)
            np.subtract.at(remaining, kids, 1)
            wave = np.unique(kids[remaining[kids] == 0])
        if seen != self.num_nodes:
            raise ValueError("the dependency graph has a cycle")
        return tuple(waves)

    @cached_property
    def depth(self) -> np.ndarray:
        """int32[N] topological depth: the longest path from a node without parents.

        For a chain this is the number of blocks the lane ran before the node,
        the same quantity as `Frontier.depth` on the device.
        """
        depth = np.zeros(self.num_nodes, np.int32)
        for d, wave in enumerate(self.waves):
            depth[wave] = d
        return depth

    @cached_property
    def same_type_links(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """What the reward of eq. (1) needs to track ``Frontier(G^a)``.

        A type-a node v is in Frontier(G^a) once it has no unexecuted type-a
        ancestor.  Ancestors execute before descendants, so it suffices to watch
        v's *nearest* type-a ancestors: those reaching v along a path with no
        type-a node in between (ED-Batch's ``node2succs_typewise``).

        Returns (ptr, idx, blockers): CSR of each node u's nearest same-type
        descendants, and for each node the number of its nearest same-type
        ancestors.
        """
        types = self.node_type.tolist()
        # last[v][t]: the type-t nodes reaching v with no type-t node in between
        # (v excluded).  Single-parent nodes share their parent's sets.
        last: list[dict[int, frozenset[int]]] = [{}] * self.num_nodes
        src, dst = [], []
        order = np.concatenate(self.waves).tolist() if self.waves else []
        for v in order:
            parents = self.parents(v).tolist()
            if len(parents) == 1:
                p = parents[0]
                merged = dict(last[p])
                merged[types[p]] = frozenset((p,))
            else:
                merged = {}
                for p in parents:
                    through = dict(last[p])
                    through[types[p]] = frozenset((p,))
                    for t, nodes in through.items():
                        merged[t] = merged[t] | nodes if t in merged else nodes
            last[v] = merged
            for u in merged.get(types[v], ()):
                src.append(u)
                dst.append(v)
        src_a = np.asarray(src, np.int64)
        dst_a = np.asarray(dst, np.int32)
        ptr, idx = _csr(src_a, dst_a, self.num_nodes)
        blockers = np.bincount(dst_a, minlength=self.num_nodes).astype(np.int64)
        return ptr, idx, blockers


def lower_bound(graph: ExecGraph) -> int:
    """ED-Batch Appendix A.3: sum over types t of Depth(G^t).

    Depth(G^t) is the largest number of type-t nodes on any dependency path;
    each of them needs its own batch, and batches of different types are
    distinct steps.
    """
    n, num_types = graph.num_nodes, graph.num_types
    if n == 0:
        return 0
    child_ptr, child_idx = graph.children
    # on_path[v, t]: most type-t nodes on a path ending at v.
    on_path = np.zeros((n, num_types), np.int32)
    for wave in graph.waves:
        on_path[wave, graph.node_type[wave]] += 1
        kids = gather_rows(child_ptr, child_idx, wave)
        via = np.repeat(wave, child_ptr[wave + 1] - child_ptr[wave])
        np.maximum.at(on_path, kids, on_path[via])
    return int(on_path.max(axis=0).sum())
