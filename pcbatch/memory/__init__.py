"""Batching-aware memory layout: a PQ-tree, ED-Batch's layout passes (§3.2),
and the block-layout pass that uses them to batch ops inside a block.

``plan_layout(variables, batches, sizes)`` orders variables so that each
batched op's operands are contiguous, aligned slices of one packed buffer.
``layout_program(prog)`` batches independent same-type ops of each block of a
stack program on such a layout (run by `autobatch`, option ``layout``).
"""

from .layout import BatchPlacement, LayoutResult, OperandSlice, batch_from_ops, plan_layout
from .pqtree import PQNode, PQTree
from .report import BlockLayout, GroupReport, LayoutReport, PackReport
from .static import layout_program

__all__ = [
    "BatchPlacement",
    "BlockLayout",
    "GroupReport",
    "LayoutReport",
    "LayoutResult",
    "OperandSlice",
    "PQNode",
    "PQTree",
    "PackReport",
    "batch_from_ops",
    "layout_program",
    "plan_layout",
]
