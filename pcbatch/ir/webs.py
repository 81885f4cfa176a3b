"""Webs: one variable split where Python rebinds it to a value of another type.

A web is the union of a variable's definitions that reach a common use
(reaching definitions over the function's control-flow graph; the
definitions one use sees are merged union-find style). Webs never meet: each
may have a type of its own, as Python lets `h = jnp.ones(3)` then
`h = h.sum()` rebind `h`. Type inference keeps one type per variable, so a
variable whose definitions do not agree is split, one variable per web
(`split_webs`): the web of the parameter (or of the first definition) keeps
the name, the others get `WEB_SUFFIX` and a number, which listings and
errors drop (`errors.user_name`). Ops keep their source text (the user's
names).

Runs on the converted functions (Figure 2, before fork formation: Prims,
Calls, Branch/Jump/Return/Fail), so that a program's webs are the same with
and without forks (fork formation duplicates return tails: `if c: x = a
else: x = b` then `return x.sum()` would have two webs with forks, one
without). A parameter is a definition at the entry.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Iterator

from pcbatch.errors import WEB_SUFFIX
from pcbatch.ir.core import Block, Call, Function, Op, Prim, Program, op_reads, op_writes, successors, term_reads

Def = tuple[int, int]  # (block, op index); the parameter's is _PARAM
_PARAM: Def = (-1, -1)


def _reaching(fn: Function, var: str) -> list[frozenset[Def]]:
    """The definitions of `var` that reach each block's start (a forward
    dataflow fixpoint; the entry sees the parameter, also along a loop back to it)."""
    blocks = fn.blocks
    last: list[Def | None] = [None] * len(blocks)  # each block's last definition
    for i, b in enumerate(blocks):
        for k, op in enumerate(b.ops):
            if var in op_writes(op):
                last[i] = (i, k)
    reach: list[frozenset[Def]] = [frozenset()] * len(blocks)
    if var in fn.params:
        reach[0] = frozenset([_PARAM])
    work = list(range(len(blocks)))
    while work:
        i = work.pop()
        out = reach[i] if last[i] is None else frozenset([last[i]])
        for j in successors(blocks[i].term):
            if not out <= reach[j]:
                reach[j] |= out
                work.append(j)
    return reach


def _accesses(fn: Function, var: str) -> Iterator[tuple[int, int | None, frozenset[Def], Def | None]]:
    """Every read and write of `var`, in order: `(block, op index or None for
    the terminator, the definitions a read sees (empty for a write), the
    definition a write makes (None for a read))`."""
    reach = _reaching(fn, var)
    for i, b in enumerate(fn.blocks):
        now = reach[i]
        for k, op in enumerate(b.ops):
            if var in op_reads(op):
                yield i, k, now, None
            if var in op_writes(op):
                now = frozenset([(i, k)])
                yield i, k, frozenset(), (i, k)
        if var in term_reads(b.term):
            yield i, None, now, None


def webs(fn: Function, var: str) -> list[frozenset[Def]]:
    """`var`'s webs in `fn`, each a set of definitions, in order of their
    first definition (the parameter's first). A definition no use sees is a
    web of its own."""
    parent: dict[Def, Def] = {_PARAM: _PARAM} if var in fn.params else {}

    def find(d: Def) -> Def:
        parent.setdefault(d, d)
        while parent[d] != d:
            d = parent[d]
        return d

    for _, _, reads, write in _accesses(fn, var):
        roots = sorted({find(d) for d in reads} | ({find(write)} if write is not None else set()))
        for r in roots[1:]:
            parent[r] = roots[0]  # the earliest definition is the root
    groups: dict[Def, set[Def]] = {}
    for d in list(parent):
        groups.setdefault(find(d), set()).add(d)
    return [frozenset(groups[r]) for r in sorted(groups)]


def splittable(program: Program, variables: Iterable[str]) -> frozenset[tuple[str, str]]:
    """Of the user's variables behind `variables` (as a lowered program names
    them: `fn.h`, or a later pass's copy `fn.h%3`, `fn.h%launch`), those with
    more than one web in `program`, as `(function, variable)`."""
    functions = {f.name: f for f in program.functions}
    found = set()
    for qualified in variables:
        fn, _, local = qualified.rpartition(".")
        parts = local.split("%")
        for n in range(1, len(parts) + 1):  # `h%w2%launch`: `h`, `h%w2`, `h%w2%launch`
            var = "%".join(parts[:n])
            if fn in functions and len(webs(functions[fn], var)) > 1:
                found.add((fn, var))
    return frozenset(found)


def multi_web(program: Program) -> frozenset[tuple[str, str]]:
    """Every `(function, variable)` of `program` with more than one web."""
    return frozenset((f.name, v) for f in program.functions
                     for v in sorted({*f.params, *(w for b in f.blocks for op in b.ops for w in op_writes(op))})
                     if len(webs(f, v)) > 1)


def web_names(program: Program, fn: str, var: str) -> list[str]:
    """The variables `split_webs` makes of `var` in `fn`, one per web."""
    return [_web_name(var, n) for n in range(len(webs(program.function(fn), var)))]


def _web_name(var: str, n: int) -> str:
    return var if n == 0 else f"{var}{WEB_SUFFIX}{n + 1}"


def _renamed(op: Op, var: str, read: str | None, write: str | None) -> Op:
    """`op` with its reads of `var` renamed `read`, its writes `write` (None: as they are)."""
    def r(v: str) -> str:
        return read if v == var and read is not None else v

    def w(v: str) -> str:
        return write if v == var and write is not None else v
    if isinstance(op, Prim):
        return replace(op, ins=tuple(map(r, op.ins)), outs=tuple(map(w, op.outs)))
    if isinstance(op, Call):
        return replace(op, args=tuple(map(r, op.args)), out=w(op.out))
    raise TypeError(f"{op} before fork formation")


def _renamed_term(block: Block, var: str, read: str) -> Block:
    fields = {f: read for f in ("cond", "value") if getattr(block.term, f, None) == var}
    return replace(block, term=replace(block.term, **fields))


def _split_one(fn: Function, var: str) -> Function:
    """`fn` with each of `var`'s webs but the first renamed `var%w2`, `var%w3`, ..."""
    groups = webs(fn, var)
    if len(groups) < 2:
        return fn
    name = {d: _web_name(var, n) for n, g in enumerate(groups) for d in g}
    blocks = list(fn.blocks)
    for i, k, reads, write in _accesses(fn, var):
        if not reads and write is None:
            continue  # a read no definition reaches (Python's UnboundLocalError) keeps the name
        b = blocks[i]
        if k is None:
            blocks[i] = _renamed_term(b, var, name[next(iter(reads))])
            continue
        ops = list(b.ops)
        ops[k] = _renamed(ops[k], var, name[next(iter(reads))] if reads else None,
                          None if write is None else name[write])
        blocks[i] = replace(b, ops=tuple(ops))
    return replace(fn, blocks=tuple(blocks))


def split_webs(program: Program, variables: Iterable[tuple[str, str]]) -> Program:
    """`program` with each `(function, variable)` split into its webs."""
    by_fn: dict[str, list[str]] = {}
    for fn, var in variables:
        by_fn.setdefault(fn, []).append(var)
    functions = []
    for f in program.functions:
        for var in sorted(by_fn.get(f.name, ())):
            f = _split_one(f, var)
        functions.append(f)
    return replace(program, functions=tuple(functions))
