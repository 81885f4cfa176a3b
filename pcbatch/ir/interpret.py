"""Single-example reference interpreters of both IR levels.

`run_program` runs a Figure 2 program with Python recursion: the oracle that
the IR means what the source meant. `run_stack_program` runs a Figure 4
program with explicit stacks, one example at a time, and records the blocks it
executes: the oracle for the machine, and the tracer that schedulers learn from.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pcbatch.ir.core import (Await, Branch, Collect, Fail, Fork, Join, Jump, Launch, Peek, Pop, Prim, Program, Push,
                             PushJump, Return, StackProgram, Update)
from pcbatch.ir.keys import is_key


class ExampleFailed(Exception):
    """`run_program` reached a `Fail` (where Python raises): `fail` is it."""

    def __init__(self, fail: Fail):
        self.fail = fail
        super().__init__(fail.text)


def _truthy(x: Any) -> bool:
    return bool(np.asarray(x))


def run_program(program: Program, *args: Any) -> Any:
    """Run the entry function of a Figure 2 program on one example; raises
    `ExampleFailed` where it reaches a `Fail`."""
    functions = {f.name: f for f in program.functions}

    def call(name: str, values: tuple) -> Any:
        f = functions[name]
        env = dict(zip(f.params, values))
        block = f.blocks[0]
        launched: list[Any] = []  # the results of launched calls not yet collected
        last: dict[str, Any] = {}  # per callee, the last result collected
        while True:
            for op in block.ops:
                if isinstance(op, Prim):
                    env.update(zip(op.outs, op.fn(*(env[v] for v in op.ins))))
                elif isinstance(op, Launch):
                    launched.append(call(op.call.callee, tuple(env[a] for a in op.call.args)))
                elif isinstance(op, Collect):
                    take = op.when is None or _truthy(env[op.when])
                    env[op.flag] = take and bool(launched)
                    # Not taken: any value of the callee's result type (the code after it is masked).
                    env[op.out] = launched.pop(0) if env[op.flag] else last.get(op.ret, 0)
                    last[op.ret] = env[op.out]
                else:
                    env[op.out] = call(op.callee, tuple(env[a] for a in op.args))
            t = block.term
            if isinstance(t, Return):
                return env[t.value]
            if isinstance(t, Jump):
                block = f.blocks[t.target]
            elif isinstance(t, Await):
                block = f.blocks[t.target if t.cond is None or _truthy(env[t.cond]) else t.false]
            elif isinstance(t, Fork):
                for c in t.calls:
                    env[c.out] = call(c.callee, tuple(env[a] for a in c.args))
                block = f.blocks[t.join]
            elif isinstance(t, Fail):
                raise ExampleFailed(t)
            else:
                block = f.blocks[t.true if _truthy(env[t.cond]) else t.false]

    return call(program.entry, args)


@dataclass
class Trace:
    """What one example did: the result, each block it ran, and its deepest recursion.

    `parents[i]` are the executions block `blocks[i]` waited for (indices into
    `blocks`): the lane's previous block, or for a lane's first block the Fork
    that started it; a Join waits for its lane's Fork and each child's last
    block. Without forks this is a chain. `failed`: the block ending in `Fail`
    the example stopped at (where Python raises; `result` is then None).
    """

    result: Any
    blocks: list[int] = field(default_factory=list)
    parents: list[tuple[int, ...]] = field(default_factory=list)
    max_depth: int = 1
    finished: bool = True
    failed: int | None = None


def run_stack_program(prog: StackProgram, inputs: dict[str, Any], max_steps: int | None = None,
                      max_depth: int | None = None, forks: bool = True) -> Trace:
    """Run a Figure 4 program on one example (`inputs` maps entry parameters to values).

    A Fork runs its children one after another, each as a lane of its own
    (own registers, stacks and pc stack), depth first; `blocks` lists every
    block any of the example's lanes ran, in that order, and `max_depth` is
    the deepest pc stack of any lane. A Launch runs its child the same way, at
    once; an Await waits for the lane's last block and its children's. With
    `forks=False` every Fork takes its sequential path and no Launch finds a
    lane instead (what a lane does when the pool is exhausted; its
    depth bounds what any schedule needs). Stops early, with `finished=False`,
    after `max_steps` blocks or on reaching `max_depth` frames (the depth the
    machine would have needed is then at least `max_depth + 1`). A `Fail` (in any of its lanes) ends the
    example there: `failed` names its block."""
    env: dict[str, Any] = dict(inputs)
    for op in prog.prelude:
        env.update(zip(op.outs, op.fn(*(env[v] for v in op.ins))))
    trace = Trace(None)
    halt = prog.num_blocks

    def junk(var: str) -> Any:
        # NumPy has no typed PRNG key dtype; JAX makes zeros of one
        return jax.tree_util.tree_map(lambda s: (jnp.zeros if is_key(s.dtype) else np.zeros)(s.shape, s.dtype),
                                      prog.var_types[var])

    class Stop(Exception):
        pass

    def lane(pc: int, env: dict[str, Any], waits: tuple[int, ...]) -> tuple[dict[str, Any], int]:
        """Runs a lane from `pc` until it halts; `waits` are the parents of its
        first block. Returns its registers and its last block's node."""
        stacks: dict[str, list] = {}
        pc_stack = [halt]
        children: list[dict[str, Any]] = []
        launched: list[dict[str, Any]] = []  # launched children's registers, oldest first, until collected
        launched_last: list[int] = []  # their last blocks, until the next Await
        node = -1
        while pc != halt:
            if max_steps is not None and len(trace.blocks) >= max_steps:
                raise Stop
            node = len(trace.blocks)
            trace.blocks.append(pc)
            trace.parents.append(waits)
            waits = (node,)
            block = prog.blocks[pc]
            for op in block.ops:
                if isinstance(op, Prim):
                    env.update(zip(op.outs, op.fn(*(env[v] for v in op.ins))))
                elif isinstance(op, Push):
                    stacks.setdefault(op.var, []).append(env.get(op.var))  # may be unset: never read
                elif isinstance(op, Update):
                    stacks[op.var][-1] = env[op.var]
                elif isinstance(op, Pop):
                    env[op.var] = stacks[op.var].pop()
                elif isinstance(op, Peek):
                    env[op.var] = stacks[op.var][-1]
                elif isinstance(op, Join):
                    env.update((v, child[r]) for v, r, child in zip(op.outs, op.rets, children))
                elif isinstance(op, Launch) and forks:
                    c = op.call
                    child, last = lane(c.target, {**env, **{p: env[a] for p, a in zip(c.params, c.args)}}, (node,))
                    launched.append(child)
                    launched_last.append(last)
                elif isinstance(op, Collect):
                    take = op.when is None or _truthy(env[op.when])
                    env[op.flag] = take and bool(launched)
                    # Not taken: any value of the return type (the code after it is masked).
                    env[op.out] = (launched.pop(0)[op.ret] if env[op.flag] else env[op.ret] if op.ret in env
                                   else junk(op.ret))
            t = block.term
            if isinstance(t, Jump):
                pc = t.target
            elif isinstance(t, Branch):
                pc = t.true if _truthy(env[t.cond]) else t.false
            elif isinstance(t, PushJump):
                pc_stack.append(t.ret)
                trace.max_depth = max(trace.max_depth, len(pc_stack))
                if max_depth is not None and len(pc_stack) > max_depth:
                    raise Stop
                pc = t.target
            elif isinstance(t, Await):
                waits = (node, *launched_last)
                launched_last = []
                pc = t.target if t.cond is None or _truthy(env[t.cond]) else t.false
            elif isinstance(t, Fork) and not forks:
                pc = t.seq
            elif isinstance(t, Fork):
                # A fresh lane's other registers are never read before written (liveness).
                ran = [lane(c.target, {**env, **{p: env[a] for p, a in zip(c.params, c.args)}}, (node,))
                       for c in t.calls]
                children = [child for child, _ in ran]
                waits = (node, *(last for _, last in ran))
                pc = t.join
            elif isinstance(t, Fail):
                trace.failed = pc
                raise Stop
            else:
                pc = pc_stack.pop() if prog.has_calls else halt
        return env, node

    try:
        trace.result = lane(prog.entry_block, env, ())[0].get(prog.result)
    except Stop:
        trace.finished = trace.failed is not None  # a Fail ends the example; otherwise it stopped early
    return trace
