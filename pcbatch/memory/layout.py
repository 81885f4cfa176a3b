"""Batching-aware memory layout (ED-Batch §3.2 and Appendix B).

A *batch* is one batched op over k ops, given as its operand groups: group j
is ``(v[0][j], ..., v[k-1][j])``, operand position j of each op (results are
just another position).  An order of the variables honours a batch when

* adjacency: every group occupies a contiguous run of the order, and
* alignment: all groups list the ops in the same order, so one batched op
  reads and writes plain slices.

Groups whose variables are all the same (a shared, broadcast operand) or of
size k = 1 constrain nothing.  A group repeating some but not all variables
cannot be one slice; it is left unconstrained and gets no slice.

Passes, as in the paper:

1. Adjacency: reduce every group into a PQ-tree.
2. BroadcastConstraint: within a batch, each group's subtree (the part of
   the tree spanning it) implies consecutive sets of op indices: a P-node's
   leaves and each pair of neighbouring Q-node children.  Since aligned
   groups must order their ops identically, each such set is applied to every
   group of the batch; repeated to a fixpoint, this makes the subtrees of
   one batch's groups isomorphic.
3. DecideNodesOrder: corresponding nodes of isomorphic subtrees must be laid
   out alike.  A union-find whose edges carry permutations (a P-node's order
   of its children, a Q-node's direction) collects these equalities and
   finds contradictions (e.g. groups ``(a, b)`` and ``(b, a)``).

Every order of the fixed tree that satisfies the equalities honours all the
batches, and every honouring order is such an order, so feasibility checks
are exact.  Batches are added greedily, in the order given; one that cannot
be honoured together with those accepted before it is dropped whole (the
paper's ``B.erase(b)``).  The greedy result is found without adding batches one
at a time: all of them are tried at once (the common case: nothing to drop,
one run of the passes), and otherwise the first batch that cannot be added is
found by bisecting over prefixes (a prefix of a feasible list is feasible), so
a plan costs O(1 + d log B) runs of the passes for d dropped batches of B.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Iterable, Mapping, Sequence

from .pqtree import LEAF, P, Q, PQNode, PQTree

__all__ = ["BatchPlacement", "LayoutResult", "OperandSlice", "batch_from_ops", "plan_layout"]

Var = Hashable
Perm = tuple[int, ...]


@dataclass(frozen=True)
class OperandSlice:
    """Where one operand group lies: ``order[start:start + count]``, i.e.
    elements ``[offset, offset + length)`` of the packed buffer.  ``stride``
    is the per-op element count when all k variables have the same size
    (so the slice reshapes to ``(count, stride)``), else None."""

    start: int
    count: int
    offset: int
    length: int
    stride: int | None


@dataclass(frozen=True)
class BatchPlacement:
    """An honoured batch: ``op_order[t]`` is the op stored t-th in every slice;
    ``slices[j]`` is operand position j's slice (None: broadcast or unaligned)."""

    op_order: tuple[int, ...]
    slices: tuple[OperandSlice | None, ...]


@dataclass
class LayoutResult:
    """The chosen ``order``; indices into the input batches that were
    ``honoured`` / ``dropped``; ``placements`` per honoured batch; packed
    buffer ``offsets``, ``sizes`` and ``total_size``; and the final ``tree``
    (every order it admits satisfies the adjacency part of honoured batches)."""

    order: list[Var]
    honoured: list[int]
    dropped: list[int]
    placements: dict[int, BatchPlacement]
    offsets: dict[Var, int]
    sizes: dict[Var, int]
    total_size: int
    tree: PQTree = field(repr=False)

    def __str__(self) -> str:
        lines = [f"order: {' '.join(map(str, self.order))}", f"tree:  {self.tree}"]
        for b in self.honoured:
            pl = self.placements[b]
            spans = ", ".join("-" if s is None else f"[{s.start}:{s.start + s.count}]"
                              for s in pl.slices)
            lines.append(f"batch {b}: ops {list(pl.op_order)} at {spans}")
        if self.dropped:
            lines.append(f"dropped batches: {self.dropped}")
        return "\n".join(lines)


def batch_from_ops(ops: Sequence[Sequence[Var]]) -> list[tuple[Var, ...]]:
    """Operand groups of a batch given per op: ``ops[i][j]`` -> ``groups[j][i]``."""
    return [tuple(g) for g in zip(*ops, strict=True)]


# --------------------------------------------------------------------- model
@dataclass(frozen=True)
class _Batch:
    k: int
    groups: tuple[tuple[Var, ...], ...]  # every operand position
    tied: tuple[tuple[Var, ...], ...]  # the positions that must be aligned slices


def _normalise(batches: Sequence[Sequence[Sequence[Var]]], known: set) -> list[_Batch]:
    out = []
    for n, batch in enumerate(batches):
        groups = tuple(tuple(g) for g in batch)
        ks = {len(g) for g in groups}
        if len(ks) > 1:
            raise ValueError(f"batch {n}: operand groups differ in length {sorted(ks)}")
        for g in groups:
            for v in g:
                if v not in known:
                    raise ValueError(f"batch {n}: unknown variable {v!r}")
        k = ks.pop() if ks else 0
        tied = tuple(g for g in groups if k >= 2 and len(set(g)) == k)
        out.append(_Batch(k, groups, tied))
    return out


# --------------------------------------------------------------- tree views
class _Shape:
    """Leaf sets of the current tree's nodes (recomputed after each change)."""

    def __init__(self, tree: PQTree):
        self.tree = tree
        self.leaves: dict[int, frozenset] = {}
        if tree.root is not None:
            self._walk(tree.root)

    def _walk(self, node: PQNode) -> frozenset:
        if node.kind == LEAF:
            s = frozenset([node.value])
        else:
            s = frozenset().union(*(self._walk(c) for c in node.children))
        self.leaves[id(node)] = s
        return s

    def _lowest(self, g: frozenset) -> tuple[PQNode, list[PQNode]]:
        """Lowest node holding all of ``g``, and its children meeting ``g``."""
        node = self.tree.root
        assert node is not None
        while True:
            nxt = next((c for c in node.children if g <= self.leaves[id(c)]), None)
            if nxt is None:
                return node, [c for c in node.children if self.leaves[id(c)] & g]
            node = nxt

    def implies(self, g: frozenset) -> bool:
        """PQTree.implies, from the cached leaf sets (no tree walk)."""
        if len(g) <= 1:
            return True
        node, kids = self._lowest(g)
        if node.kind == P:
            return len(kids) == len(node.children) and all(self.leaves[id(c)] <= g for c in kids)
        i, j = node.children.index(kids[0]), node.children.index(kids[-1])
        return all(self.leaves[id(c)] <= g for c in node.children[i : j + 1])

    def span(self, group: Iterable[Var]) -> tuple[PQNode, list[PQNode]]:
        """The subtree spanning a consecutive ``group``: its lowest node and the
        children of that node that make up the group (all, or a Q-node range)."""
        node, kids = self._lowest(frozenset(group))
        assert all(self.leaves[id(c)] <= frozenset(group) for c in kids), "group is not consecutive"
        return node, kids


def _subtree_constraints(shape: _Shape, group: tuple[Var, ...]) -> set[frozenset[int]]:
    """Consecutive sets of op indices implied by the subtree spanning ``group``
    (the paper's GetSubtreeCons, translated to op indices)."""
    index = {v: i for i, v in enumerate(group)}
    ops = lambda n: frozenset(index[v] for v in shape.leaves[id(n)])  # noqa: E731
    out: set[frozenset[int]] = set()
    node, kids = shape.span(group)
    todo = [(node, kids)]
    while todo:
        node, kids = todo.pop()
        if node.kind == P:
            out.add(frozenset().union(*map(ops, kids)))
        elif node.kind == Q:
            out.update(ops(a) | ops(b) for a, b in zip(kids, kids[1:]))
        todo.extend((c, c.children) for c in kids if c.kind != LEAF)
    return {c for c in out if 1 < len(c) < len(group)}


def _broadcast_constraints(tree: PQTree, batches: list[_Batch]) -> bool:
    """BroadcastConstraint: apply each group's op-index constraints to every
    group of its batch until nothing changes.  False if one is infeasible."""
    shape = _Shape(tree)
    changed = True
    while changed:
        changed = False
        for b in batches:
            cons: set[frozenset[int]] = set()
            for g in b.tied:
                cons |= _subtree_constraints(shape, g)
            for c in cons:
                for g in b.tied:
                    s = frozenset(g[i] for i in c)
                    if not shape.implies(s):
                        if not tree.reduce(s, atomic=False):  # on failure the caller drops the tree
                            return False
                        shape, changed = _Shape(tree), True
    return True


# ---------------------------------------------------------------- node orders
def _compose(a: Perm, b: Perm) -> Perm:
    return tuple(a[i] for i in b)


def _inverse(a: Perm) -> Perm:
    inv = [0] * len(a)
    for i, x in enumerate(a):
        inv[x] = i
    return tuple(inv)


class _OrderUnionFind:
    """Union-find over internal nodes with a permutation on each edge
    (Appendix B, Algorithm 5).  A node's *order* is a permutation: for a
    P-node with d >= 3 children, ``order[pos]`` is the child placed at pos;
    for a Q-node or two-child P-node it is (0, 1) (stored) or (1, 0)
    (reversed).  ``rel[n]`` satisfies order(n) = rel[n] o order(parent[n])."""

    def __init__(self) -> None:
        self.parent: dict[PQNode, PQNode] = {}
        self.rel: dict[PQNode, Perm] = {}

    @staticmethod
    def width(node: PQNode) -> int:
        return 2 if node.kind == Q else len(node.children)

    def find(self, node: PQNode) -> tuple[PQNode, Perm]:
        """Root of node's class, and t with order(node) = t o order(root)."""
        t: Perm = tuple(range(self.width(node)))
        while node in self.parent:
            t = _compose(t, self.rel[node])
            node = self.parent[node]
        return node, t

    def union(self, a: PQNode, b: PQNode, psi: Perm) -> bool:
        """Require order(b) = psi o order(a); False on a contradiction."""
        ra, ta = self.find(a)
        rb, tb = self.find(b)
        if ra is not rb:
            self.parent[ra] = rb
            self.rel[ra] = _compose(_inverse(ta), _compose(_inverse(psi), tb))
            return True
        return tb == _compose(psi, ta)


def _match(shape: _Shape, uf: _OrderUnionFind, ga: tuple[Var, ...], gb: tuple[Var, ...]) -> bool:
    """Walk the subtrees spanning groups ga and gb in parallel, matching nodes
    by their op-index sets, and union each matched pair's orders
    (ParseEquivNodeOrderPair).  False if not isomorphic or contradictory."""
    ia = {v: i for i, v in enumerate(ga)}
    ib = {v: i for i, v in enumerate(gb)}
    todo = [(shape.span(ga), shape.span(gb))]
    while todo:
        (na, ka), (nb, kb) = todo.pop()
        opa = [frozenset(ia[v] for v in shape.leaves[id(c)]) for c in ka]
        opb = [frozenset(ib[v] for v in shape.leaves[id(c)]) for c in kb]
        where = {s: j for j, s in enumerate(opb)}
        if len(ka) != len(kb) or any(s not in where for s in opa):
            return False
        psi = tuple(where[s] for s in opa)  # child ka[i] corresponds to kb[psi[i]]
        if Q in (na.kind, nb.kind):
            # Only a direction is free, so the matched runs must map monotonely
            # (always true at a BroadcastConstraint fixpoint; checked anyway).
            if P in (na.kind, nb.kind) and len(ka) != 2:
                return False
            ident = tuple(range(len(ka)))
            if psi == ident:
                rel = (0, 1)
            elif psi == ident[::-1]:
                rel = (1, 0)
            else:
                return False
        else:
            rel = psi
        if not uf.union(na, nb, rel):
            return False
        for a, j in zip(ka, psi):
            if a.kind != LEAF:
                todo.append(((a, a.children), (kb[j], kb[j].children)))
    return True


def _decide_orders(tree: PQTree, batches: list[_Batch]) -> _OrderUnionFind | None:
    """DecideNodesOrder: the union-find of node orders, or None on a conflict."""
    shape, uf = _Shape(tree), _OrderUnionFind()
    for b in batches:
        for g in b.tied[1:]:
            if not _match(shape, uf, b.tied[0], g):
                return None
    return uf


def _leaf_order(tree: PQTree, uf: _OrderUnionFind) -> list[Var]:
    """Depth-first traversal honouring the decided orders (GetLeafOrder);
    each class root takes the identity order."""
    out: list[Var] = []

    def walk(node: PQNode) -> None:
        if node.kind == LEAF:
            out.append(node.value)
            return
        _, t = uf.find(node)
        if node.kind == Q:
            kids = node.children if t == (0, 1) else node.children[::-1]
        else:
            kids = [node.children[i] for i in t]
        for c in kids:
            walk(c)

    if tree.root is not None:
        walk(tree.root)
    return out


def _feasible(variables: list[Var], batches: list[_Batch]) -> PQTree | None:
    """The tree honouring all ``batches`` at once (adjacency, BroadcastConstraint
    and DecideNodesOrder all succeed), or None if no order honours them all."""
    tree = PQTree(variables)
    if not all(tree.reduce(g, atomic=False) for b in batches for g in b.tied):
        return None
    if not _broadcast_constraints(tree, batches) or _decide_orders(tree, batches) is None:
        return None
    return tree


def _greedy(variables: list[Var], norm: list[_Batch]) -> tuple[PQTree, list[int], list[int]]:
    """Honoured and dropped batch indices, as adding them one by one in order
    (dropping each that conflicts with those kept before it) would give."""
    rest = [n for n, b in enumerate(norm) if b.tied]
    accepted: list[int] = []
    dropped: list[int] = []
    while True:
        tree = _feasible(variables, [norm[n] for n in accepted + rest])
        if tree is not None:
            accepted += rest
            break
        lo, hi = 0, len(rest) - 1  # accepted + rest[:lo] is feasible; accepted + rest[:hi + 1] is not
        while lo < hi:
            mid = (lo + hi) // 2
            if _feasible(variables, [norm[n] for n in accepted + rest[:mid + 1]]) is not None:
                lo = mid + 1
            else:
                hi = mid
        accepted += rest[:lo]
        dropped.append(rest[lo])
        rest = rest[lo + 1:]
    honoured = sorted(set(range(len(norm))) - set(dropped))
    return tree, honoured, dropped


# ---------------------------------------------------------------------- entry
def plan_layout(
    variables: Iterable[Var],
    batches: Sequence[Sequence[Sequence[Var]]],
    sizes: Mapping[Var, int] | None = None,
) -> LayoutResult:
    """Choose an order of ``variables`` honouring as many ``batches`` as the
    greedy pass allows (each batch: a list of operand groups, see module doc).

    ``sizes`` gives each variable's element count (default 1) for the packed
    1-D buffer offsets.

    The example of ED-Batch's Figure 3: B1 computes x4 = a(x1, x2) and
    x5 = a(x3, x1); B2 computes x8, x6, x7 = s(x3), s(x4), s(x5).

    >>> x = [f"x{i}" for i in range(1, 9)]
    >>> b1 = batch_from_ops([("x4", "x1", "x2"), ("x5", "x3", "x1")])   # per op: result, sources
    >>> b2 = batch_from_ops([("x8", "x3"), ("x6", "x4"), ("x7", "x5")])
    >>> res = plan_layout(x, [b1, b2])
    >>> res.honoured, " ".join(res.order)
    ([0, 1], 'x8 x6 x7 x2 x1 x3 x4 x5')
    >>> str(res.tree)
    '((x8 (x6 x7)) [x2 x1 x3 (x4 x5)])'
    """
    variables = list(variables)
    norm = _normalise(batches, set(variables))
    tree, honoured, dropped = _greedy(variables, norm)
    accepted = [norm[n] for n in honoured]
    uf = _decide_orders(tree, accepted)
    assert uf is not None  # _greedy checked the accepted batches together
    order = _leaf_order(tree, uf)

    size = {v: int(sizes[v]) if sizes is not None and v in sizes else 1 for v in variables}
    offsets: dict[Var, int] = {}
    total = 0
    for v in order:
        offsets[v] = total
        total += size[v]
    pos = {v: i for i, v in enumerate(order)}
    placements = {n: _place(norm[n], pos, offsets, size) for n in honoured}
    return LayoutResult(order, honoured, dropped, placements, offsets, size, total, tree)


def _place(
    b: _Batch, pos: dict[Var, int], offsets: dict[Var, int], size: dict[Var, int],
) -> BatchPlacement:
    ref = b.tied[0] if b.tied else None
    op_order = tuple(sorted(range(b.k), key=lambda i: pos[ref[i]])) if ref else tuple(range(b.k))
    slices: list[OperandSlice | None] = []
    for g in b.groups:
        if b.k == 0 or (b.k > 1 and g not in b.tied):
            slices.append(None)
            continue
        seq = [g[i] for i in op_order]
        start = pos[seq[0]]
        # Guaranteed by construction; checked because callers will slice blindly.
        assert [pos[v] for v in seq] == list(range(start, start + b.k)), "layout bug: unaligned group"
        each = {size[v] for v in seq}
        stride = each.pop() if len(each) == 1 else None
        slices.append(OperandSlice(start, b.k, offsets[seq[0]], sum(size[v] for v in seq), stride))
    return BatchPlacement(op_order, tuple(slices))
