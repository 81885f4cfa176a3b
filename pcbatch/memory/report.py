"""What the block-layout pass did, per run of straight-line code: `LayoutReport`.

    >>> import jax.numpy as jnp, pcbatch
    >>> @pcbatch.autobatch(in_axes=(None, 0, 0))
    ... def gates(p, x, n):
    ...     for _ in range(n):
    ...         x = jnp.tanh(p["A"] @ x) + jnp.tanh(p["B"] @ x)
    ...     return x
    >>> report = gates.layout_report({"A": jnp.eye(2), "B": jnp.eye(2)}, jnp.ones((4, 2)), jnp.arange(4))
    >>> [b.rewritten for b in report]
    [True]
    >>> print(report[0].groups[0].summary())
    G0 dot_general x2 [kept]: x:0 = p.A @ x, x:2 = p.B @ x
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

from .layout import LayoutResult

__all__ = ["BlockLayout", "GroupReport", "LayoutReport", "PackReport"]


@dataclass(frozen=True)
class GroupReport:
    """One candidate group: ``members`` (each ``out = prim(operands)``, by
    value name) in program order; ``order`` the member order chosen (indices
    into ``members``, as laid out in memory); ``operands`` how each operand
    position is read; ``status`` "kept" or why it was dropped; ``lines`` the
    source lines of the members."""

    index: int
    kind: str
    primitive: str
    members: tuple[str, ...]
    outs: tuple[str, ...]
    operands: tuple[str, ...]
    order: tuple[int, ...]
    status: str
    lines: tuple[str, ...] = ()

    @property
    def kept(self) -> bool:
        return self.status == "kept"

    def summary(self) -> str:
        shown = ", ".join(self.members[i] for i in self.order)
        return f"G{self.index} {self.primitive} x{len(self.members)} [{self.status}]: {shown}"


@dataclass(frozen=True)
class PackReport:
    """A constant packed once before the loop: variable ``var`` holds
    ``members`` (in this order) concatenated along ``axis``; ``shape`` its shape."""

    var: str
    members: tuple[str, ...]
    axis: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class BlockLayout:
    """One run of Prims in block ``block`` (``label``).

    ``rewritten`` says whether the run was replaced by batched code, and
    ``reason`` why (not); ``groups`` are all candidate groups (kept or not);
    ``layout`` is the PQ-tree plan over the groups' values (None when no group
    was found); ``plan_ms`` the time to choose the groups and lay them out,
    ``total_ms`` the whole pass on this run (tracing and code generation too).
    """

    block: int
    label: str
    ops: tuple[str, ...]
    rewritten: bool
    reason: str
    groups: tuple[GroupReport, ...]
    layout: LayoutResult | None
    packs: tuple[PackReport, ...]
    plan_ms: float
    total_ms: float
    memory_ops: tuple[str, ...] = field(default=())

    @property
    def kept(self) -> tuple[GroupReport, ...]:
        return tuple(g for g in self.groups if g.kept)

    def __str__(self) -> str:
        head = f"b{self.block} ({self.label}): " + ("rewritten" if self.rewritten else "unchanged")
        lines = [f"{head} -- {self.reason}",
                 f"  planning {self.plan_ms:.2f} ms (pass total {self.total_ms:.2f} ms); {len(self.ops)} statements"]
        for grp in self.groups:
            lines.append("  " + grp.summary())
            lines.append("      operands: " + "; ".join(grp.operands))
            lines.append("      source: " + ", ".join(grp.lines))
        if self.layout is not None:
            lines.append(f"  PQ-tree: {self.layout.tree}")
            lines.append(f"  order:   {' '.join(map(str, self.layout.order))}")
        for p in self.packs:
            shape = "x".join(map(str, p.shape))
            lines.append(f"  packed before the loop: {p.var} [{shape}] = concat(axis={p.axis}) {', '.join(p.members)}")
        return "\n".join(lines)


@dataclass(frozen=True)
class LayoutReport:
    """The block-layout pass over one program: a `BlockLayout` per run of
    straight-line code that had something to batch (runs with no candidate
    group are not listed).  ``applied`` is False when the function runs with
    ``layout=False`` (the report then says what the pass would do)."""

    blocks: tuple[BlockLayout, ...]
    mode: str
    applied: bool = True

    def __iter__(self) -> Iterator[BlockLayout]:
        return iter(self.blocks)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> BlockLayout:
        return self.blocks[i]

    @property
    def rewritten(self) -> tuple[BlockLayout, ...]:
        return tuple(b for b in self.blocks if b.rewritten)

    def __str__(self) -> str:
        status = "" if self.applied else " (not applied: layout=False)"
        head = (f"block layout ({self.mode}){status}: {len(self.rewritten)} of {len(self.blocks)} "
                "runs with candidate groups rewritten")
        return "\n\n".join([head] + [str(b) for b in self.blocks])
