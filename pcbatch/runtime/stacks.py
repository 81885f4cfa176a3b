"""Which stack each saved variable uses, and the stacks' workspace."""
from __future__ import annotations

from typing import Any, NamedTuple

import jax

from pcbatch.ir.core import STACKED, Push, StackProgram, Update
from pcbatch.runtime.dtypes import index_dtype

tree_map = jax.tree_util.tree_map


class StackLayout(NamedTuple):
    """Which (shared) stack each stacked variable uses, each stack's frame
    type, and the blocks that write each stack."""

    stack_of: dict[str, str]
    stacks: dict[str, Any]
    writers: dict[str, list[int]]

    @staticmethod
    def of(prog: StackProgram) -> "StackLayout":
        # Stacked variables that are never saved at once share a stack (and its pointer).
        stack_of = {v: prog.stack_of.get(v, v) for v, c in prog.var_class.items() if c == STACKED}
        stacks: dict[str, Any] = {}
        for v, s in sorted(stack_of.items()):
            stacks.setdefault(s, prog.var_types[v])
        writers = {s: [b for b, blk in enumerate(prog.blocks)
                       if any(isinstance(op, (Push, Update)) and stack_of[op.var] == s for op in blk.ops)]
                   for s in stacks}
        return StackLayout(stack_of, stacks, writers)

    def workspace_shapes(self, depth: int, lanes: int) -> dict[str, Any]:
        """The stacks and the pc stack: large, and never read before written,
        so a caller may pass the previous call's (donated) instead of
        zero-filling new ones."""
        stacks = {s: tree_map(lambda x: jax.ShapeDtypeStruct((depth, lanes) + x.shape, x.dtype), t)
                  for s, t in self.stacks.items()}
        return {"stacks": stacks, "pc_stack": jax.ShapeDtypeStruct((depth, lanes), index_dtype())}
