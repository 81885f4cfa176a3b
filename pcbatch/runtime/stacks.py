"""Which stack each saved variable uses, and the stacks' workspace."""
from __future__ import annotations

from typing import Any, NamedTuple

import jax

from pcbatch.ir.core import STACKED, Pop, Push, StackProgram, Update
from pcbatch.runtime.dtypes import index_dtype

tree_map = jax.tree_util.tree_map


class StackLayout(NamedTuple):
    """Which (shared) stack each stacked variable uses, each stack's frame
    type, the blocks that write each stack, and which pointer each stack
    uses (`pointer_of`): stacks that every block moves alike (pushed and
    popped together, as NUTS's trajectory state) always point at the same
    row and share one, so a machine carries one array for them, not one
    each that XLA would see as one value and copy apart."""

    stack_of: dict[str, str]
    stacks: dict[str, Any]
    writers: dict[str, list[int]]
    pointer_of: dict[str, str]

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
        moves = {s: [0] * len(prog.blocks) for s in stacks}  # each block's net change of each pointer
        for b, blk in enumerate(prog.blocks):
            for op in blk.ops:
                if isinstance(op, (Push, Pop)):
                    moves[stack_of[op.var]][b] += 1 if isinstance(op, Push) else -1
        first: dict[tuple[int, ...], str] = {}
        pointer_of = {s: first.setdefault(tuple(m), s) for s, m in sorted(moves.items())}
        return StackLayout(stack_of, stacks, writers, pointer_of)

    def pointers(self, sps: dict[str, Any]) -> dict[str, Any]:
        """Each stack's pointer from the shared ones (`sps`: all or some of them)."""
        return {s: sps[p] for s, p in self.pointer_of.items() if p in sps}

    def shared(self, sps: dict[str, Any]) -> dict[str, Any]:
        """The shared pointers (one per group) from each stack's."""
        return {s: x for s, x in sps.items() if self.pointer_of[s] == s}

    def workspace_shapes(self, depth: int, lanes: int) -> dict[str, Any]:
        """The stacks and the pc stack: large, and never read before written,
        so a caller may pass the previous call's (donated) instead of
        zero-filling new ones."""
        stacks = {s: tree_map(lambda x: jax.ShapeDtypeStruct((depth, lanes) + x.shape, x.dtype), t)
                  for s, t in self.stacks.items()}
        return {"stacks": stacks, "pc_stack": jax.ShapeDtypeStruct((depth, lanes), index_dtype())}
