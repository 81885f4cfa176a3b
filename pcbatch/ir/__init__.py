"""The block IR: types, printer, verifier and reference interpreters."""
from pcbatch.ir.core import (
    CONSTANT,
    INVARIANT,
    REGISTER,
    STACKED,
    TEMPORARY,
    Block,
    Branch,
    Call,
    Fail,
    Function,
    Jump,
    Peek,
    Pop,
    Prim,
    Program,
    Push,
    PushJump,
    Return,
    StackProgram,
    Update,
)
from pcbatch.ir.interpret import ExampleFailed, Trace, run_program, run_stack_program
from pcbatch.ir.printer import format_program, format_stack_program
from pcbatch.ir.verify import IRError, verify_program, verify_stack_program

__all__ = [
    "CONSTANT", "INVARIANT", "REGISTER", "STACKED", "TEMPORARY", "Block", "Branch", "Call", "ExampleFailed", "Fail", "Function", "IRError",
    "Jump",
    "Peek", "Pop", "Prim", "Program", "Push", "PushJump", "Return", "StackProgram", "Trace", "Update", "run_program",
    "format_program", "format_stack_program", "run_stack_program", "verify_program", "verify_stack_program",
]
