"""Structural checks of both IR levels. A failure is a pcbatch bug, not a user error."""
from __future__ import annotations

from pcbatch.ir.core import (
    Block,
    Branch,
    STACK_OPS,
    Await,
    Call,
    Collect,
    Fail,
    Fork,
    Join,
    Launch,
    Peek,
    Pop,
    Prim,
    Program,
    PushJump,
    Return,
    StackProgram,
    op_reads,
    op_writes,
    successors,
    term_reads,
)


class IRError(AssertionError):
    """The IR is malformed (an internal error)."""


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise IRError(message)


def _check_targets(blocks: tuple[Block, ...], where: str) -> None:
    for i, b in enumerate(blocks):
        _check(b.term is not None, f"{where} b{i} has no terminator")
        if isinstance(b.term, Fail):  # the error quotes it
            _check(bool(b.term.text), f"{where} b{i}: a Fail without its text")
        for s in successors(b.term):
            _check(0 <= s < len(blocks), f"{where} b{i} jumps to missing block b{s}")


def verify_program(program: Program) -> None:
    names = [f.name for f in program.functions]
    _check(len(set(names)) == len(names), "duplicate function names")
    _check(program.entry in names, f"entry {program.entry} missing")
    arity = {f.name: len(f.params) for f in program.functions}
    for f in program.functions:
        _check(len(f.blocks) > 0, f"{f.name} has no blocks")
        _check_targets(f.blocks, f.name)
        defined = set(f.params)
        for b in f.blocks:
            for op in b.ops:
                _check(isinstance(op, (Prim, Call, Launch, Collect)), f"{f.name}: {op} is not a Figure 2 op")
                defined.update(op_writes(op))
                if isinstance(op, Launch):
                    op = op.call
                if isinstance(op, Collect):
                    _check(op.ret in arity, f"{f.name} collects from unknown {op.ret}")
                if isinstance(op, Call):
                    _check(op.callee in arity, f"{f.name} calls unknown {op.callee}")
                    _check(len(op.args) == arity[op.callee], f"{f.name} calls {op.callee} with wrong arity")
            _check(not isinstance(b.term, PushJump), f"{f.name}: PushJump in a Figure 2 program")
            if isinstance(b.term, Return):
                _check(b.term.value is not None, f"{f.name}: Return without a value")
            if isinstance(b.term, Fork):
                outs = [c.out for c in b.term.calls]
                _check(len(set(outs)) == len(outs), f"{f.name}: a Fork assigns one variable twice")
                for j, c in enumerate(b.term.calls):
                    _check(isinstance(c, Call) and c.callee in arity and len(c.args) == arity[c.callee],
                           f"{f.name}: bad Fork call {c}")
                    # Every call's arguments are read before any runs: reading the variable a call
                    # (itself or a later one) writes reads its old value, as Python does; an
                    # earlier call's result would not be there yet.
                    _check(not set(c.args) & set(outs[:j]), f"{f.name}: a Fork call reads another's result")
                    defined.add(c.out)
        for b in f.blocks:
            for v in [r for op in b.ops for r in op_reads(op)] + list(term_reads(b.term)):
                _check(v in defined, f"{f.name} reads {v}, which nothing defines")


def verify_stack_program(prog: StackProgram) -> None:
    _check_targets(prog.blocks, "program")
    _check(0 <= prog.entry_block < prog.num_blocks, "entry block out of range")
    stacked = set()
    for i, b in enumerate(prog.blocks):
        reads: dict[str, int] = {}
        writes: dict[str, int] = {}
        for op in b.ops:
            _check(not isinstance(op, Call), "Call left in a stack program")
            if isinstance(op, STACK_OPS):
                stacked.add(op.var)
                # The machine gathers each stack's top once per step and scatters
                # once: at most one read, then at most one write, per block.
                stack = prog.stack_of.get(op.var, op.var)
                kind = reads if isinstance(op, (Pop, Peek)) else writes
                kind[stack] = kind.get(stack, 0) + 1
                _check(kind[stack] == 1 and not (kind is reads and stack in writes),
                       f"b{i}: stack {stack} needs more than one read then one write")
        if isinstance(b.term, Return):
            _check(b.term.value is None, "stack-program Return carries a value")
        if isinstance(b.term, Fork):
            _check(prog.blocks[b.term.join].ops and isinstance(prog.blocks[b.term.join].ops[0], Join),
                   f"b{i}: a Fork's join block must start with a Join")
            for c in b.term.calls:
                _check(0 <= c.target < prog.num_blocks, f"b{i} spawns missing block b{c.target}")
        collects = [k for k, op in enumerate(b.ops) if isinstance(op, Collect)]
        # A step either appends to the lane's child list or takes from its head, not both.
        _check(not (collects and any(isinstance(op, Launch) for op in b.ops)),
               f"b{i}: a block may collect or launch, not both")
        for op in b.ops:
            if isinstance(op, Launch):
                _check(0 <= op.call.target < prog.num_blocks, f"b{i} launches missing block b{op.call.target}")
    if prog.var_class:
        for b in prog.blocks:
            for op in b.ops:
                for v in op_reads(op) + op_writes(op):
                    _check(v in prog.var_class, f"{v} has no variable class")
        for v in stacked:
            _check(prog.var_class[v] == "stacked", f"{v} is pushed but classed {prog.var_class[v]}")
