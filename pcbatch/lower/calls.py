"""Merge every function's blocks into one list (Figure 2 -> Figure 4 skeleton).

* variables are qualified by function (`fib.n`);
* `out = f(args)` ends its block with the callee's parameters assigned (one
  parallel copy, so `gcd(b, a % b)` swaps correctly) and `PushJump(f, cont)`;
  the continuation block starts with `out = f.ret`;
* `return v` becomes `f.ret = v; Return`;
* a self call in tail position becomes a plain jump (no pc push, no stack);
* a `Fork` spawns each callee's entry with its (non-constant) parameters, and
  its join block starts with a `Join` of the callees' return values; a
  `Launch` spawns the same way, and a `Collect` reads the callee's `<ret>`;
* assignments of machine constants are hoisted into the prelude.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from pcbatch.ir.core import (Await, Block, Branch, Call, Collect, Fork, Join, Jump, Launch, Op, Prim, Program, PushJump,
                             Return, Spawn)
from pcbatch.lower.constants import qualify


def ret_var(fn: str) -> str:
    """The return value of `fn`; `<ret>` cannot clash with a Python name."""
    return qualify(fn, "<ret>")


def _copy(outs: tuple[str, ...], ins: tuple[str, ...], loc=None) -> Prim:
    return Prim(outs, ins, lambda *xs: xs, "", loc)


@dataclass
class Merged:
    blocks: list[Block] = field(default_factory=list)
    block_function: list[str] = field(default_factory=list)
    prelude: list[Prim] = field(default_factory=list)
    entry_of: dict[str, int] = field(default_factory=dict)


def _qualify_prim(op: Prim, fn: str) -> Prim:
    return Prim(tuple(qualify(fn, v) for v in op.outs), tuple(qualify(fn, v) for v in op.ins), op.fn, op.text, op.loc)


def _param_pairs(callee, caller: str, args: tuple[str, ...], consts: dict[str, str]) -> list[tuple[str, str]]:
    """(callee parameter, caller argument), qualified, for the parameters a call assigns
    (constant and invariant parameters already hold their value)."""
    return [(qualify(callee.name, p), qualify(caller, a)) for p, a in zip(callee.params, args)
            if qualify(callee.name, p) not in consts]


def _spawn(program: Program, caller: str, call: Call, consts: dict[str, str], entry_of: dict[str, int]) -> Spawn:
    """A call run in a lane of its own: the callee's entry, its (non-constant) parameters from the caller's arguments."""
    callee = program.function(call.callee)
    pairs = _param_pairs(callee, caller, call.args, consts)
    return Spawn(entry_of[callee.name], tuple(p for p, _ in pairs), tuple(a for _, a in pairs))


def merge_functions(program: Program, consts: dict[str, str]) -> Merged:
    m = Merged()
    # Block indices: functions in order, each function's blocks in order, with
    # room for the continuation blocks that calls split off.
    offset = 0
    layout: dict[str, list[int]] = {}
    for f in program.functions:
        m.entry_of[f.name] = offset
        starts = []
        for b in f.blocks:
            starts.append(offset)
            offset += 1 + sum(isinstance(op, Call) for op in b.ops)
        layout[f.name] = starts
    for f in program.functions:
        starts = layout[f.name]
        joins = {b.term.join: b.term.calls for b in f.blocks if isinstance(b.term, Fork)}
        for bi, b in enumerate(f.blocks):
            ops: list[Op] = []
            if bi in joins:
                ops.append(Join(tuple(qualify(f.name, c.out) for c in joins[bi]),
                                tuple(ret_var(c.callee) for c in joins[bi])))
            index = starts[bi]
            label = f"{f.name}.{b.label}"
            loc = b.loc
            ops_left = list(b.ops)
            while ops_left:
                op = ops_left.pop(0)
                if isinstance(op, Prim):
                    q = _qualify_prim(op, f.name)
                    if q.outs and all(o in consts for o in q.outs):
                        m.prelude.append(q)
                    else:
                        ops.append(q)
                    continue
                if isinstance(op, Launch):
                    ops.append(Launch(_spawn(program, f.name, op.call, consts, m.entry_of)))
                    continue
                if isinstance(op, Collect):
                    ops.append(Collect(qualify(f.name, op.out), ret_var(op.ret), qualify(f.name, op.flag),
                                       None if op.when is None else qualify(f.name, op.when)))
                    continue
                callee = program.function(op.callee)
                pairs = _param_pairs(callee, f.name, op.args, consts)
                if pairs:
                    outs, ins = zip(*pairs)
                    ops.append(_copy(outs, ins, op.loc))
                tail = (not ops_left and callee.name == f.name and isinstance(b.term, Return)
                        and b.term.value == op.out)
                if tail:
                    m.blocks.append(Block(label, tuple(ops), Jump(m.entry_of[f.name]), loc))
                    m.block_function.append(f.name)
                    ops = None
                    break
                m.blocks.append(Block(label, tuple(ops), PushJump(m.entry_of[callee.name], index + 1), loc))
                m.block_function.append(f.name)
                index += 1
                label = f"{f.name}.{b.label}.after_{callee.name}"
                loc = op.loc
                ops = [_copy((qualify(f.name, op.out),), (ret_var(callee.name),), op.loc)]
            if ops is None:  # ended in a tail call; pad the unused continuation slots
                while len(m.blocks) < starts[bi] + 1 + sum(isinstance(o, Call) for o in b.ops):
                    m.blocks.append(Block("unreachable", (), Jump(len(m.blocks)), None))
                    m.block_function.append(f.name)
                continue
            term = b.term
            if isinstance(term, Return):
                ops.append(_copy((ret_var(f.name),), (qualify(f.name, term.value),), term.loc))
                term = Return()
            elif isinstance(term, Jump):
                term = Jump(starts[term.target])
            elif isinstance(term, Branch):
                term = Branch(qualify(f.name, term.cond), starts[term.true], starts[term.false], term.loc)
            elif isinstance(term, Fork):
                spawns = tuple(_spawn(program, f.name, c, consts, m.entry_of) for c in term.calls)
                term = Fork(spawns, starts[term.join], starts[term.seq], term.loc)
            elif isinstance(term, Await):
                term = Await(starts[term.target], None if term.cond is None else qualify(f.name, term.cond),
                             None if term.false is None else starts[term.false])
            m.blocks.append(Block(label, tuple(ops), term, loc))
            m.block_function.append(f.name)
    return m
