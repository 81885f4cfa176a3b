"""Groups of independent same-type ops in a block's graph (static batching).

A *group* is a set of nodes that one primitive application can compute, on
operands packed side by side along one axis:

* `dot_general`s with equal dimension numbers that share one operand (the
  same value) and whose other operand is a machine constant (a weight):
  ``W_i @ x, W_f @ x, ...`` become ``W_ifo @ x`` with the weights packed
  along an output (free) dimension, so every output element is the same
  reduction as before, in the same order.
* elementwise ops with equal primitive, parameters and member shapes, whose
  operands are each either one shared scalar, literals, machine constants,
  or outputs of one earlier group (a slice of its result).

Only operands that need no copy inside the loop are allowed (a constant is
packed once before the loop; a slice of a packed result is a view): an op
whose operand would have to be gathered every step is left alone, because
that copy costs more than the kernel it saves (see benchmarks/README.md,
block_layout).

Grouping is by depth, DyNet's heuristic for batching: a node's depth is one
more than its deepest non-constant operand's, and a group's members share a
depth.  Nodes of one depth never depend on each other, and edges between
groups always go to a greater depth, so the batched code is acyclic by
construction.  Within a depth, nodes with equal *signatures* (what the
rules above need to agree) form one group, in program order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .graph import Atom, BlockGraph, Lit, Node, params_key

__all__ = ["ELEMENTWISE", "Group", "Operand", "find_groups"]

ELEMENTWISE = frozenset("""
    abs acos acosh add and asin asinh atan atan2 cbrt ceil clamp conj convert_element_type copy cos cosh
    digamma div eq erf erf_inv erfc exp exp2 expm1 floor ge gt imag integer_pow is_finite le lgamma log log1p
    logistic lt max min mul ne neg nextafter not or pow real reduce_precision rem round rsqrt select_n
    shift_left shift_right_arithmetic shift_right_logical sign sin sinh sqrt square sub tan tanh xor
""".split())

SHARED, PACK, LITERAL, SLICE = "shared", "pack", "literal", "slice"


@dataclass(frozen=True)
class Operand:
    """How a group gets operand position j of its members (``atoms``, one per
    member, in member order).

    ``kind``: SHARED (one value for every member: a dot's shared operand or a
    scalar), PACK (machine constants, packed once before the loop along
    ``axis``), LITERAL (literal scalars, packed into a constant), SLICE
    (outputs of group ``source``: a view of its packed result along ``axis``).
    """

    kind: str
    atoms: tuple[Atom, ...]
    axis: int | None = None
    source: int | None = None


@dataclass(frozen=True)
class Group:
    """Nodes ``members`` (program order) computed by one application of
    ``primitive`` on packed operands; its result is packed along ``axis``."""

    index: int
    kind: str  # "dot" | "elementwise"
    primitive: str
    members: tuple[int, ...]
    operands: tuple[Operand, ...]
    axis: int
    depth: int

    def outs(self, graph: BlockGraph) -> tuple[int, ...]:
        return tuple(graph.nodes[m].outs[0] for m in self.members)


def _wild(shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    return shape[:axis] + (-1,) + shape[axis + 1:]


def _dot_signature(g: BlockGraph, node: Node) -> tuple | None:
    (contract, batch) = node.params["dimension_numbers"]
    pk = params_key(node.params)
    if pk is None:
        return None
    for side in (0, 1):
        var, shared = node.ins[side], node.ins[1 - side]
        if not g.is_const(var) or g.is_const(shared) or isinstance(shared, Lit):
            continue
        shape = g.shape(var)
        free = [d for d in range(len(shape)) if d not in contract[side] and d not in batch[side]]
        if not free:
            continue
        lhs_free = len(g.shape(node.ins[0])) - len(contract[0]) - len(batch[0])
        out_axis = len(batch[0]) + (0 if side == 0 else lhs_free)
        return ("dot", pk, side, shared, _wild(shape, free[0]), str(g.dtype(var)), free[0], out_axis)
    return None


def _elementwise_signature(g: BlockGraph, node: Node, member_of: dict[int, int],
                           groups: list[Group]) -> tuple | None:
    if node.primitive not in ELEMENTWISE or len(node.outs) != 1:
        return None
    pk = params_key(node.params)
    shape = g.shape(node.outs[0])
    if pk is None or not shape:
        return None  # scalars: nothing to gain, and no axis to pack along
    positions: list[tuple] = []
    axes = set()
    for a in node.ins:
        s = g.shape(a)
        if s == () and isinstance(a, Lit) and a.traced:
            return None  # a traced scalar cannot be packed with literals into a NumPy constant
        if s == ():  # a scalar broadcasts: shared, or literals packed into a constant
            positions.append(("lit", str(g.dtype(a))) if isinstance(a, Lit) else ("value", a))
        elif s != shape:
            return None
        elif g.is_const(a):
            positions.append(("const", str(g.dtype(a))))
        elif a in member_of:
            src = member_of[a]
            positions.append(("slice", src))
            axes.add(groups[src].axis)
        else:
            return None  # a per-lane array from outside any group: would be copied every step
    if len(axes) > 1:
        return None
    axis = axes.pop() if axes else 0
    return ("ew", node.primitive, pk, str(g.dtype(node.outs[0])), _wild(shape, axis), axis, tuple(positions))


def _operands(g: BlockGraph, sig: tuple, members: list[Node]) -> tuple[Operand, ...] | None:
    cols = list(zip(*(m.ins for m in members)))
    if sig[0] == "dot":
        side, pack_axis = sig[2], sig[6]
        ops = [Operand(SHARED, cols[1 - side])]
        ops.insert(side, Operand(PACK, cols[side], pack_axis))
        return tuple(ops)
    axis, positions = sig[5], sig[6]
    out: list[Operand] = []
    for pos, atoms in zip(positions, cols):
        if pos[0] == "value":
            out.append(Operand(SHARED, atoms))
        elif pos[0] == "lit":
            same = len({a.key() for a in atoms}) == 1
            out.append(Operand(SHARED, atoms) if same else Operand(LITERAL, atoms, axis))
        elif pos[0] == "const":
            out.append(Operand(PACK, atoms, axis))
        else:
            if len(set(atoms)) != len(atoms):
                return None  # one output read twice cannot be one slice
            out.append(Operand(SLICE, atoms, axis, pos[1]))
    return tuple(out)


def depths(g: BlockGraph) -> list[int]:
    """Per node: 0 for constant nodes, else 1 + the deepest non-constant operand's depth."""
    value_depth: dict[int, int] = {}
    out: list[int] = []
    for node in g.nodes:
        if all(g.is_const(v) for v in node.outs):
            d = 0
        else:
            d = 1 + max((value_depth.get(a, 0) for a in node.ins if isinstance(a, int) and not g.is_const(a)),
                        default=0)
        out.append(d)
        for v in node.outs:
            value_depth[v] = d
    return out


def find_groups(g: BlockGraph, kinds: tuple[str, ...] = ("dot", "elementwise")) -> list[Group]:
    """Candidate groups of the graph, by depth then program order (see module
    doc); `kinds` restricts them to matmul ("dot") or "elementwise" groups."""
    depth = depths(g)
    groups: list[Group] = []
    member_of: dict[int, int] = {}  # output value -> its group
    for d in sorted(set(depth) - {0}):
        buckets: dict[Any, list[Node]] = {}
        for node in g.nodes:
            if depth[node.index] != d:
                continue
            if node.primitive == "dot_general" and len(node.outs) == 1:
                sig = _dot_signature(g, node) if "dot" in kinds else None
            else:
                sig = _elementwise_signature(g, node, member_of, groups) if "elementwise" in kinds else None
            if sig is not None:
                buckets.setdefault(sig, []).append(node)
        for sig, members in buckets.items():
            if len(members) < 2:
                continue
            operands = _operands(g, sig, members)
            if operands is None:
                continue
            kind = "dot" if sig[0] == "dot" else "elementwise"
            axis = sig[7] if kind == "dot" else sig[5]
            grp = Group(len(groups), kind, members[0].primitive, tuple(m.index for m in members), operands, axis, d)
            groups.append(grp)
            for m in members:
                member_of[m.outs[0]] = grp.index
    return groups


def member_size(g: BlockGraph, v: int) -> int:
    return int(np.prod(g.shape(v), dtype=np.int64))
