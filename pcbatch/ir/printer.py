"""Readable listings of both IR levels, in the spirit of the jaxpr printer."""
from __future__ import annotations

import inspect
import os
import re
import sys
from typing import Any, Mapping, Sequence

import jax

from pcbatch.errors import user_name
from pcbatch.ir.core import (
    FORMATTERS,
    CONSTANT,
    INVARIANT,
    REGISTER,
    STACKED,
    TEMPORARY,
    Await,
    Block,
    Branch,
    Call,
    Collect,
    Fail,
    Fork,
    Join,
    Jump,
    Launch,
    Op,
    Peek,
    Pop,
    Prim,
    Program,
    Push,
    PushJump,
    Return,
    StackProgram,
    Terminator,
    Update,
    op_reads,
    op_writes,
    term_reads,
)

_TEMP = re.compile(r"^(?P<fn>.*?)(?P<prefix>_+t)(?P<n>\d+)$")   # the frontend's temporaries: _t1, __t1, ...


def _short(leaf: Any) -> str:
    name = f"{leaf.dtype.name}[{','.join(map(str, leaf.shape))}]"
    return name.replace("float", "f").replace("uint", "u").replace("int", "i")


def format_type(t: Any, qualified: bool = False) -> str:
    """`f32[3,4]` for one array; a pytree of types as its structure. With
    `qualified`, classes are named by module, qualname and the line that
    defines them (`pkg.mod.Point@mod.py:12`): two classes of one name differ."""
    if qualified:
        return _format_qualified(t)
    leaves, treedef = jax.tree_util.tree_flatten(t)
    short = [_short(leaf) for leaf in leaves]
    if treedef == jax.tree_util.tree_structure(0):
        return short[0]
    return str(jax.tree_util.tree_unflatten(treedef, short)).replace("'", "")


def class_name(cls: type) -> str:
    """`module.qualname@file:line`; the line only where it is surely this
    class's (`collections.namedtuple` has none, and inspect would find
    another class of the same name)."""
    name = f"{cls.__module__}.{cls.__qualname__}"
    module = sys.modules.get(cls.__module__)
    if "<locals>" not in cls.__qualname__:
        owner = module
        for part in cls.__qualname__.split("."):
            owner = getattr(owner, part, None)
        if owner is not cls:
            return name
    try:
        _, line = inspect.getsourcelines(cls)
        return f"{name}@{os.path.basename(inspect.getsourcefile(cls) or '?')}:{line}"
    except (OSError, TypeError):
        return name


def _format_qualified(t: Any) -> str:
    if t is None:
        return "None"
    kids, treedef = jax.tree_util.tree_flatten(t, is_leaf=lambda x: x is not t)
    if jax.tree_util.treedef_is_leaf(treedef):
        return _short(t)
    inner = [_format_qualified(k) for k in kids]
    if isinstance(t, tuple) and hasattr(t, "_fields"):
        return f"{class_name(type(t))}({', '.join(f'{f}={v}' for f, v in zip(t._fields, inner))})"
    if type(t) is tuple:
        return f"({', '.join(inner)}{',' if len(inner) == 1 else ''})"
    if type(t) is list:
        return f"[{', '.join(inner)}]"
    if type(t) is dict:
        return "{" + ", ".join(f"{k}: {v}" for k, v in zip(sorted(t), inner)) + "}"
    return f"{class_name(type(t))}({', '.join(inner)})"


def _temp_numbers(blocks: Sequence[Block]) -> dict[str, str]:
    """Temporaries renumbered 1, 2, ... per function in the order the listing
    first shows them (passes drop many, which left gaps)."""
    renamed: dict[str, str] = {}
    counts: dict[tuple[str, str], int] = {}
    for block in blocks:
        for var in [v for op in block.ops for v in (*op_reads(op), *op_writes(op))] + list(term_reads(block.term)):
            m = _TEMP.match(var)
            if m and var not in renamed:
                key = (m["fn"], m["prefix"])
                counts[key] = counts.get(key, 0) + 1
                renamed[var] = f"{m['fn']}{m['prefix']}{counts[key]}"
    return renamed


class _Names:
    """Prints variables unqualified inside their own function (temporaries renumbered)."""

    def __init__(self, owner: str | None, types: Mapping[str, Any] | None = None,
                 renamed: Mapping[str, str] | None = None):
        self.owner = owner
        self.types = types or {}
        self.renamed = renamed or {}
        # An op's text names its function's own variables unqualified.
        # (A function's own listing has unqualified names: those too.)
        self.local_renamed = {self._local(old): self._local(new) for old, new in self.renamed.items()
                              if old.rpartition(".")[0] in (owner or "", "")}

    def __call__(self, var: str, typed: bool = False) -> str:
        shown = self.renamed.get(var, var)
        if typed and var in self.types:
            return f"{self._local(shown)}:{format_type(self.types[var])}"
        return self._local(shown)

    def text(self, text: str) -> str:
        """An op's source text with its temporaries renumbered."""
        if not self.local_renamed:
            return text
        return re.sub(r"\b_+t\d+(?![\w%])", lambda m: self.local_renamed.get(m.group(0), m.group(0)), text)

    def _local(self, var: str) -> str:
        var = user_name(var)  # a web prints as the user's variable
        fn, _, local = var.rpartition(".")
        return local if fn == self.owner or not fn else var


def _format_child(c: Any, names: _Names, function_of: Sequence[str] | None) -> str:
    """A call another lane runs: a Figure 2 `Call`, or a lowered `Spawn`."""
    if isinstance(c, Call):
        return f"{names(c.out)} = {c.callee}({', '.join(names(a) for a in c.args)})"
    args = ", ".join(f"{names(p)}={names(a)}" for p, a in zip(c.params, c.args))
    # A lowered child starts at a block: name the function it is an entry of.
    return f"{function_of[c.target]}({args}) @b{c.target}" if function_of else f"b{c.target}({args})"


def _format_op(op: Op, names: _Names, function_of: Sequence[str] | None = None) -> str:
    if isinstance(op, Prim):
        outs = ", ".join(names(v, typed=True) for v in op.outs)
        text = names.text(op.text) if op.text else ", ".join(names(v) for v in op.ins)  # or a copy
        return f"{outs} = {text}" if op.outs else text
    if isinstance(op, Call):
        return f"{names(op.out)} = call {op.callee}({', '.join(names(a) for a in op.args)})"
    if isinstance(op, Join):
        return f"{', '.join(names(v, typed=True) for v in op.outs)} = join {', '.join(names(r) for r in op.rets)}"
    if isinstance(op, Launch):
        return f"launch {_format_child(op.call, names, function_of)}"
    if isinstance(op, Collect):
        when = "" if op.when is None else f" if {names(op.when)}"
        return f"{names(op.out, typed=True)}, {names(op.flag)} = collect {names(op.ret)}{when}"
    kind = {Push: "push", Pop: "pop", Peek: "peek", Update: "update"}[type(op)]
    return f"{kind} {names(op.var)}"


def _format_term(term: Terminator, names: _Names, function_of: Sequence[str] | None = None) -> str:
    if isinstance(term, Jump):
        return f"jump b{term.target}"
    if isinstance(term, Branch):
        return f"branch {names(term.cond)} ? b{term.true} : b{term.false}"
    if isinstance(term, PushJump):
        return f"pushjump b{term.target}, return to b{term.ret}"
    if isinstance(term, Return):
        return f"return {names(term.value)}" if term.value is not None else "return"
    if isinstance(term, Fork):
        children = "; ".join(_format_child(c, names, function_of) for c in term.calls)
        return f"fork [{children}] join b{term.join}, else sequential b{term.seq}"
    if isinstance(term, Await):
        if term.cond is None:
            return f"await children, then b{term.target}"
        return f"await children, then {names(term.cond)} ? b{term.target} : b{term.false}"
    if isinstance(term, Fail):
        return f"fail  # {term.text}" + (f"  ({term.loc})" if term.loc else "")
    raise TypeError(term)


def _format_block(index: int, block: Block, names: _Names, function_of: Sequence[str] | None = None) -> list[str]:
    where = f"   # {block.loc}" if block.loc else ""
    lines = [f"  b{index} ({block.label}):{where}"]
    lines += [f"    {_format_op(op, names, function_of)}" for op in block.ops]
    lines.append(f"    {_format_term(block.term, names, function_of)}")
    return lines


def _format_notes(notes: Sequence[str]) -> list[str]:
    return [f"# note: {n}" for n in notes]


def format_program(program: Program) -> str:
    out = _format_notes(program.notes)
    for fn in program.functions:
        entry = "  # entry" if fn.name == program.entry else ""
        out.append(f"def {fn.name}({', '.join(fn.params)}):{entry}")
        names = _Names(fn.name, renamed=_temp_numbers(fn.blocks))
        for i, block in enumerate(fn.blocks):
            out += _format_block(i, block, names)
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def format_stack_program(prog: StackProgram) -> str:
    types = prog.var_types
    renamed = _temp_numbers([*([Block("prelude", tuple(prog.prelude), Return())] if prog.prelude else []), *prog.blocks])
    out = [f"stack program: {prog.num_blocks} blocks, entry b{prog.entry_block}, result {prog.result}"]
    out.append(f"  inputs: {', '.join(prog.entry_params)}")
    out += ["  " + n for n in _format_notes(prog.notes)]
    for cls in (CONSTANT, INVARIANT, STACKED, REGISTER, TEMPORARY):
        vs = prog.vars_of_class(cls)
        if vs:
            shown = ", ".join(_Names(None, types, renamed)(v, typed=cls != TEMPORARY) for v in vs)
            out.append(f"  {cls}: {shown}")
    if prog.lanes is not None and prog.stack_depth is not None:
        out.append(f"  machine: {prog.lanes} lanes; pc stack i32[{prog.stack_depth},{prog.lanes}]"
                   if prog.has_calls else f"  machine: {prog.lanes} lanes; no pc stack")
        shared: dict[str, list[str]] = {}
        for v in prog.vars_of_class(STACKED):
            shared.setdefault(prog.stack_of.get(v, v), []).append(v)
        for name, members in sorted(shared.items()):
            leaves = jax.tree_util.tree_leaves(types.get(members[0]))
            shapes = ", ".join(format_type(jax.ShapeDtypeStruct((prog.stack_depth, prog.lanes) + l.shape, l.dtype))
                               for l in leaves)
            shown = [user_name(renamed.get(v, v)) for v in (name, *members)]
            out.append(f"    stack {shown[0]} ({', '.join(shown[1:])}): {shapes}")
    if prog.prelude:
        out.append("  prelude (before the loop: once, or once per example for invariants):")
        out += [f"    {_format_op(op, _Names(None, types, renamed))}" for op in prog.prelude]
    for i, block in enumerate(prog.blocks):
        owner = prog.block_function[i] if prog.block_function else None
        out += _format_block(i, block, _Names(owner, types, renamed), prog.block_function or None)
    return "\n".join(out) + "\n"


FORMATTERS[Program] = format_program
FORMATTERS[StackProgram] = format_stack_program
