"""Collects every autobatched function reachable from an entry into a `Program`."""
from __future__ import annotations

import inspect
from dataclasses import replace
from typing import Any, Callable, Optional

from pcbatch.frontend.bound import BoundFunction
from pcbatch.frontend.converter import convert_function
from pcbatch.frontend.forks import form_forks
from pcbatch.frontend.loop_forks import form_loop_forks, launching_functions
from pcbatch.ir.cfg import closure, duplicate_return_tails
from pcbatch.ir.core import Call, Program
from pcbatch.ir.verify import verify_program


def convert_program(entry: BoundFunction, unwrap: Callable[[Any], Optional[BoundFunction]]) -> Program:
    """The block IR of `entry` and, transitively, the autobatched functions it
    calls, before fork formation.

    `unwrap(obj)` returns the function behind an autobatched object (with any
    parameters fixed by a partial or a bound method), or None for anything
    else; callees are looked up in each function's globals now, so mutual
    recursion works in any definition order.
    """
    names: dict[BoundFunction, str] = {}
    queue: list[BoundFunction] = []

    def name_for(fn: BoundFunction) -> str:
        if fn not in names:
            base = fn.qualname.replace(".<locals>.", ".")
            name, k = base, 1
            while name in names.values():
                k += 1
                name = f"{base}_{k}"
            names[fn] = name
            queue.append(fn)
        return names[fn]

    def resolve(obj: Any) -> Optional[tuple[str, inspect.Signature]]:
        fn = unwrap(obj)
        return None if fn is None else (name_for(fn), fn.signature)

    entry_name = name_for(entry)
    functions = []
    while queue:
        fn = queue.pop(0)
        functions.append(convert_function(fn.fn, names[fn], resolve, dict(fn.constants)))
    # Functions only called from dead code are converted (their errors still
    # count) but are not part of the program.
    calls = {f.name: {op.callee for b in f.blocks for op in b.ops if isinstance(op, Call)} for f in functions}
    live = closure([entry_name], calls.__getitem__)
    return Program(tuple(f for f in functions if f.name in live), entry_name)


def form_program(program: Program, fork: bool = True, loops: bool = True) -> Program:
    """With `fork`, independent calls in a block become a `Fork`
    (`form_forks`) and, with `loops` too, a loop's independent calls are
    launched at once (`form_loop_forks`; its notes say which loops did not
    fork and why)."""
    kept = program.functions
    notes: list[str] = []
    if fork and loops:
        # Twice: the first pass finds which functions launch calls in their caller's lane;
        # the second splits no loop that also calls one of them (results would mix).
        first = tuple(f for f, _ in (form_loop_forks(f) for f in kept))
        launching = launching_functions(first)
        split = [form_loop_forks(f, launching) for f in kept]
        kept = tuple(f for f, _ in split)
        notes = [n for _, ns in split for n in ns]
    if fork:
        # Tails are duplicated only here: along a fork path a step saved per
        # tree level outweighs the lost sharing; one lane per example gains little.
        kept = tuple(replace(f, blocks=duplicate_return_tails(form_forks(f).blocks)) for f in kept)
    program = Program(kept, program.entry, tuple(notes))
    verify_program(program)
    return program
