"""Machine constants: values equal for every lane at every step.

Shared inputs (`in_axes=None`, e.g. model parameters) are constants, and so is
anything computed only from constants by a variable's single assignment
(`W = params["W"]`). A parameter is a constant when every call passes it the
same constant (`enc(params, left)` inside `enc`). Constants are computed once,
before the loop, and never stored per lane or on a stack; per-example
constants (`find_invariants`) once per example.
"""
from __future__ import annotations

from collections import defaultdict

from pcbatch.ir.core import Call, Collect, Launch, Prim, Program


def qualify(fn: str, var: str) -> str:
    return f"{fn}.{var}"


def find_constants(program: Program, shared_inputs: tuple[bool, ...]) -> dict[str, str]:
    """Map each constant variable (qualified) to its origin: the shared input or
    the single-assignment variable whose value it always holds."""
    defs: dict[str, list] = defaultdict(list)
    params: dict[str, tuple[str, int]] = {}
    call_args: dict[str, list[str]] = defaultdict(list)  # qualified param -> qualified args passed
    for f in program.functions:
        for k, p in enumerate(f.params):
            params[qualify(f.name, p)] = (f.name, k)
        for b in f.blocks:
            for op in b.ops:
                if isinstance(op, Prim):
                    for v in op.outs:
                        defs[qualify(f.name, v)].append((f.name, op))
                    continue
                if isinstance(op, Collect):  # another lane's result: never a constant
                    defs[qualify(f.name, op.out)].append((f.name, op))
                    defs[qualify(f.name, op.flag)].append((f.name, op))
                    continue
                if isinstance(op, Launch):
                    op = op.call
                else:
                    defs[qualify(f.name, op.out)].append((f.name, op))
                if isinstance(op, Call):
                    callee = program.function(op.callee)
                    for p, a in zip(callee.params, op.args):
                        call_args[qualify(callee.name, p)].append(qualify(f.name, a))

    const: dict[str, str | None] = {}
    for v, ds in defs.items():
        if v not in params and len(ds) == 1 and isinstance(ds[0][1], Prim):
            const[v] = v
    for p, (fn, k) in params.items():
        if p in defs:
            continue  # reassigned in the body
        if fn == program.entry:
            if shared_inputs[k]:
                const[p] = p
        else:
            const[p] = None  # origin decided by its call sites

    while True:
        _demote(const, params, defs, call_args, program.entry)
        # A parameter whose origin never resolved is only passed to itself: not a constant.
        unresolved = [v for v in const if v in params and const[v] is None]
        if not unresolved:
            return dict(const)
        for v in unresolved:
            del const[v]


def find_invariants(program: Program, shared_inputs: tuple[bool, ...]) -> dict[str, str]:
    """Per-example constants that are not machine constants: values fixed for
    the whole run of one example (a tree passed unchanged to every recursive
    call, or a value
    computed only from such, like `n = tree.num_nodes`), by the same analysis with every input treated
    as fixed. They are computed once per example and never stored per lane or
    saved on a stack."""
    fixed = find_constants(program, (True,) * len(shared_inputs))
    consts = find_constants(program, shared_inputs)
    return {v: o for v, o in fixed.items() if v not in consts}


def _demote(const, params, defs, call_args, entry) -> None:
    """Optimistic fixpoint: drop what is not provably constant."""
    changed = True
    while changed:
        changed = False
        for v in list(const):
            if v in params:
                origins = set()
                ok = True
                for a in call_args[v]:
                    if a not in const:
                        ok = False
                        break
                    if const[a] is not None:
                        origins.add(const[a])
                if params[v][0] == entry:
                    origins.add(v)
                ok = ok and len(origins) <= 1
                if not ok:
                    del const[v]
                    changed = True
                elif origins and const[v] != next(iter(origins)):
                    const[v] = next(iter(origins))
                    changed = True
            else:
                fn, op = defs[v][0]
                # An op is hoisted whole: one output that varies (`i, m = 0, 2 * n`, `i` a loop
                # counter) keeps the op, and so its other outputs, in the loop.
                if any(qualify(fn, i) not in const for i in op.ins) or any(
                        qualify(fn, o) not in const for o in getattr(op, "outs", ())):
                    del const[v]
                    changed = True
