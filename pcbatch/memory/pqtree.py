"""PQ-tree (Booth & Lueker, 1976) over a universe of hashable leaves.

A PQ-tree represents a set of permutations of its leaves: a P-node's children
may appear in any order, a Q-node's children in their stored order or its
reverse.  ``reduce(S)`` restricts the set to the permutations that also keep
``S`` consecutive.

This is the simple O(n)-per-reduce variant rather than the linear-time one:
each reduce counts the pertinent leaves below every node, walks down to the
pertinent root (the lowest node holding all of S), and rewrites the pertinent
subtree bottom-up with the Booth-Lueker templates.  A node is *empty* (no
leaf of S), *full* (only leaves of S) or *partial*.  Full and empty subtrees
are left untouched, so only partial nodes are rewritten; every partial node
below the pertinent root is turned into a Q-node whose children run from its
empty end to its full end, which is what its parent's template expects.

Templates (names as in the paper):
  L1, P1, Q1  -- leaf / P / Q-node whose leaves are all in S: labelled full.
  P2, P4, P6  -- P-node at the pertinent root with 0, 1 or 2 partial children.
  P3, P5      -- P-node below the root with 0 or 1 partial child.
  Q2          -- Q-node below the root: full children at one end, at most
                 one partial child next to them.
  Q3          -- Q-node at the root: full children in the middle, at most
                 one partial child on each side.
Anything else means S is not consecutive-compatible with the tree.
"""

from __future__ import annotations

import itertools
from typing import Hashable, Iterable, Iterator

__all__ = ["PQNode", "PQTree"]

P, Q, LEAF = "P", "Q", "leaf"
_EMPTY, _FULL, _PARTIAL = 0, 1, 2


class PQNode:
    """A node: ``kind`` is "P", "Q" or "leaf"; leaves carry ``value``."""

    __slots__ = ("kind", "children", "value")

    def __init__(self, kind: str, children: list[PQNode] | None = None, value: Hashable = None):
        self.kind = kind
        self.children: list[PQNode] = children if children is not None else []
        self.value = value

    def leaves(self) -> Iterator[Hashable]:
        """Leaf values below this node, in stored order."""
        if self.kind == LEAF:
            yield self.value
        else:
            for child in self.children:
                yield from child.leaves()

    def copy(self) -> PQNode:
        if self.kind == LEAF:
            return PQNode(LEAF, value=self.value)
        return PQNode(self.kind, [c.copy() for c in self.children])

    def __str__(self) -> str:
        if self.kind == LEAF:
            return str(self.value)
        inner = " ".join(str(c) for c in self.children)
        return f"({inner})" if self.kind == P else f"[{inner}]"

    def __repr__(self) -> str:
        return f"PQNode<{self}>"


class _Infeasible(Exception):
    pass


def _group(nodes: list[PQNode]) -> PQNode:
    """One node standing for ``nodes``: the node itself, or a new P-node."""
    return nodes[0] if len(nodes) == 1 else PQNode(P, nodes)


class PQTree:
    """PQ-tree over distinct hashable ``leaves``; starts out admitting every order.

    >>> t = PQTree("abcd")
    >>> t.reduce("ab"), t.reduce("bc")          # keep {a, b} and {b, c} consecutive
    (True, True)
    >>> str(t)                                  # ( ) P-node: any order; [ ] Q-node: this order or reversed
    '(d [a b c])'
    >>> t.reduce("ac")                          # a and c are never next to each other now
    False
    """

    def __init__(self, leaves: Iterable[Hashable]):
        values = list(leaves)
        if len(set(values)) != len(values):
            raise ValueError("PQTree leaves must be distinct")
        self.universe: tuple[Hashable, ...] = tuple(values)
        self._known = frozenset(values)
        nodes = [PQNode(LEAF, value=v) for v in values]
        self.root: PQNode | None = None if not nodes else _group(nodes)

    # ----------------------------------------------------------- inspection
    def frontier(self) -> list[Hashable]:
        """One admissible order: the leaves in stored order."""
        return [] if self.root is None else list(self.root.leaves())

    def nodes(self) -> Iterator[PQNode]:
        """All nodes, pre-order (parents before children)."""
        stack = [] if self.root is None else [self.root]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))

    def orders(self) -> Iterator[tuple[Hashable, ...]]:
        """Every order the tree admits (exponential: meant for small trees)."""
        if self.root is None:
            yield ()
            return
        yield from _orders(self.root)

    def copy(self) -> PQTree:
        new = PQTree.__new__(PQTree)
        new.universe, new._known = self.universe, self._known
        new.root = None if self.root is None else self.root.copy()
        return new

    def __str__(self) -> str:
        return "" if self.root is None else str(self.root)

    def __repr__(self) -> str:
        return f"PQTree({self})"

    # ----------------------------------------------------------- constraints
    def implies(self, subset: Iterable[Hashable]) -> bool:
        """True when every admitted order already keeps ``subset`` consecutive."""
        s = self._check(subset)
        if len(s) <= 1:
            return True
        count, size = self._tally(s)
        node, _ = self._pertinent_root(s, count)
        if count[id(node)] == size[id(node)]:
            return True
        if node.kind != Q:
            return False
        labels = [self._label(c, count, size) for c in node.children]
        hit = [i for i, lab in enumerate(labels) if lab != _EMPTY]
        return all(labels[i] == _FULL for i in range(hit[0], hit[-1] + 1))

    def reduce(self, subset: Iterable[Hashable], *, atomic: bool = True) -> bool:
        """Restrict the tree so every order keeps ``subset`` consecutive.

        Returns False, leaving the tree unchanged, if no admitted order does.
        With ``atomic=False`` a failed reduce may leave the tree half-rewritten
        (for callers that discard the tree on failure: no copy is made).
        """
        s = self._check(subset)
        if len(s) <= 1:
            return True
        # Work on a copy so a template failing half-way leaves us untouched.
        trial = self.copy() if atomic else self
        try:
            trial._reduce(s)
        except _Infeasible:
            return False
        self.root = trial.root
        return True

    # ----------------------------------------------------------- internals
    def _check(self, subset: Iterable[Hashable]) -> frozenset:
        s = frozenset(subset)
        unknown = s - self._known
        if unknown:
            raise ValueError(f"not leaves of this PQTree: {sorted(map(repr, unknown))}")
        return s

    def _tally(self, s: frozenset) -> tuple[dict[int, int], dict[int, int]]:
        """Per node (by id): leaves of ``s`` below it, and all leaves below it."""
        count: dict[int, int] = {}
        size: dict[int, int] = {}

        def walk(node: PQNode) -> None:
            if node.kind == LEAF:
                count[id(node)], size[id(node)] = int(node.value in s), 1
                return
            c = n = 0
            for child in node.children:
                walk(child)
                c += count[id(child)]
                n += size[id(child)]
            count[id(node)], size[id(node)] = c, n

        assert self.root is not None
        walk(self.root)
        return count, size

    def _pertinent_root(self, s: frozenset, count: dict[int, int]) -> tuple[PQNode, PQNode | None]:
        """Lowest node whose subtree holds all of ``s``, and its parent."""
        assert self.root is not None
        parent, node = None, self.root
        while True:
            nxt = next((c for c in node.children if count[id(c)] == len(s)), None)
            if nxt is None:
                return node, parent
            parent, node = node, nxt

    @staticmethod
    def _label(node: PQNode, count: dict[int, int], size: dict[int, int]) -> int:
        c = count[id(node)]
        return _EMPTY if c == 0 else _FULL if c == size[id(node)] else _PARTIAL

    def _reduce(self, s: frozenset) -> None:
        count, size = self._tally(s)
        node, parent = self._pertinent_root(s, count)
        if count[id(node)] == size[id(node)]:
            return  # L1/P1/Q1 at the root: S is exactly one node's leaves
        new = _Templates(count, size).root(node)
        if parent is None:
            self.root = new
        else:
            parent.children[[id(c) for c in parent.children].index(id(node))] = new


class _Templates:
    """Applies the templates for one reduce; ``count``/``size`` are from _tally."""

    def __init__(self, count: dict[int, int], size: dict[int, int]):
        self.count, self.size = count, size

    def _split(self, node: PQNode) -> tuple[list[int], list[PQNode]]:
        """Children labels, and children with partial ones rewritten (bottom-up)."""
        labels = [PQTree._label(c, self.count, self.size) for c in node.children]
        kids = [self.partial(c) if lab == _PARTIAL else c for c, lab in zip(node.children, labels)]
        return labels, kids

    def partial(self, node: PQNode) -> PQNode:
        """Rewrite a partial node below the pertinent root into a Q-node ordered
        empty end -> full end (templates P3, P5, Q2)."""
        labels, kids = self._split(node)
        if node.kind == Q:
            return self._q(node, labels, kids, is_root=False)
        empty = [k for k, lab in zip(kids, labels) if lab == _EMPTY]
        full = [k for k, lab in zip(kids, labels) if lab == _FULL]
        parts = [k for k, lab in zip(kids, labels) if lab == _PARTIAL]
        if not parts:  # P3
            return PQNode(Q, [_group(empty), _group(full)])
        if len(parts) == 1:  # P5
            q = parts[0]
            head = [_group(empty)] if empty else []
            q.children = head + q.children + ([_group(full)] if full else [])
            return q
        raise _Infeasible  # two partial children below the root: S would need a gap

    def root(self, node: PQNode) -> PQNode:
        """Rewrite the pertinent root (templates P2, P4, P6, Q2, Q3); returns its replacement."""
        labels, kids = self._split(node)
        if node.kind == Q:
            return self._q(node, labels, kids, is_root=True)
        empty = [k for k, lab in zip(kids, labels) if lab == _EMPTY]
        full = [k for k, lab in zip(kids, labels) if lab == _FULL]
        parts = [k for k, lab in zip(kids, labels) if lab == _PARTIAL]
        if len(parts) > 2:
            raise _Infeasible
        if not parts:  # P2: the full children move under one new P-node
            node.children = empty + [_group(full)]
            return node
        q = parts[0]
        if len(parts) == 1:  # P4: full children join the partial Q-node at its full end
            q.children = q.children + ([_group(full)] if full else [])
        else:  # P6: two partial Q-nodes merge, full children in between
            middle = [_group(full)] if full else []
            q.children = q.children + middle + parts[1].children[::-1]
        if not empty:
            return q
        node.children = empty + [q]
        return node

    @staticmethod
    def _q(node: PQNode, labels: list[int], kids: list[PQNode], is_root: bool) -> PQNode:
        """Templates Q2 (below the root) and Q3 (at the root) on a Q-node."""
        hit = [i for i, lab in enumerate(labels) if lab != _EMPTY]
        lo, hi = hit[0], hit[-1]
        # The non-empty children must be one run, partial ones only at its ends.
        if any(labels[i] != _FULL for i in range(lo + 1, hi)):
            raise _Infeasible
        if not is_root:
            # Q2: the run must reach one end of the node with a full child
            # there (or be a single partial child at that end); flip so that
            # end is the right one, making the result ordered empty -> full.
            def ok(lab: list[int], a: int, b: int) -> bool:
                return b == len(lab) - 1 and (lab[b] == _FULL or a == b)

            if not ok(labels, lo, hi):
                n = len(labels)
                labels, kids = labels[::-1], kids[::-1]
                lo, hi = n - 1 - hi, n - 1 - lo
                if not ok(labels, lo, hi):
                    raise _Infeasible
        # Splice partial children in, their full ends facing the run's interior
        # (a lone partial child at the right end keeps its full end outwards).
        out: list[PQNode] = []
        for i, (kid, lab) in enumerate(zip(kids, labels)):
            if lab != _PARTIAL:
                out.append(kid)
            elif i == lo:
                out.extend(kid.children)  # empty ... full
            else:
                out.extend(kid.children[::-1])  # full ... empty
        node.children = out
        return node


def _orders(node: PQNode) -> Iterator[tuple[Hashable, ...]]:
    if node.kind == LEAF:
        yield (node.value,)
        return
    sub = [list(_orders(c)) for c in node.children]
    idx = range(len(sub))
    arrangements = itertools.permutations(idx) if node.kind == P else (tuple(idx), tuple(reversed(idx)))
    for arrangement in arrangements:
        for parts in itertools.product(*(sub[i] for i in arrangement)):
            yield tuple(itertools.chain.from_iterable(parts))
