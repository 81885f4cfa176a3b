"""Batching-aware memory layout: a PQ-tree and ED-Batch's layout passes (§3.2).

``plan_layout(variables, batches, sizes)`` orders variables so that each
batched op's operands are contiguous, aligned slices of one packed buffer.
"""

from .layout import BatchPlacement, LayoutResult, OperandSlice, batch_from_ops, plan_layout
from .pqtree import PQNode, PQTree

__all__ = [
    "BatchPlacement",
    "LayoutResult",
    "OperandSlice",
    "PQNode",
    "PQTree",
    "batch_from_ops",
    "plan_layout",
]
