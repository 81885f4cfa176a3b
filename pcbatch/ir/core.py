"""The block IR: small immutable dataclasses.

Two levels share the same ops:

* Figure 2 of Radul et al. (a `Program` of `Function`s): each function is its
  own control-flow graph; `Call` is an op and `Return` carries a value.
* Figure 4 (a `StackProgram`): every function's blocks are merged into one list;
  calls are `PushJump` terminators plus explicit per-variable `Push`/`Pop`/
  `Update`; `Return` pops the program-counter stack.

Variables are names. In a `StackProgram` they are qualified by function
(`fib.n`). Values are per-example pytrees of arrays.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Mapping, Union

from pcbatch.errors import Loc, user_name

# How programs print: filled in by `pcbatch.ir.printer` (imported with the
# package), so that the IR does not import its own printer.
FORMATTERS: dict[type, Callable[[Any], str]] = {}


# --- ops -----------------------------------------------------------------


@dataclass(frozen=True)
class Prim:
    """`outs = fn(*ins)`: straight-line JAX code on one example's values.

    `fn` returns a tuple with one value per out. `text` is the source it came
    from, for printing.
    """

    outs: tuple[str, ...]
    ins: tuple[str, ...]
    fn: Callable[..., tuple] = field(compare=False, repr=False)
    text: str = ""
    loc: Loc | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Call:
    """`out = callee(*args)`, a call to another autobatched function (Figure 2 only)."""

    out: str
    callee: str
    args: tuple[str, ...]
    loc: Loc | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Push:
    """Save the variable's current value on its stack (Figure 4)."""

    var: str


@dataclass(frozen=True)
class Pop:
    """Restore the variable's current value from its stack (Figure 4)."""

    var: str


@dataclass(frozen=True)
class Peek:
    """Load the variable's current value from the top of its stack, leaving it
    there (a Pop whose matching re-Push was eliminated) (Figure 4)."""

    var: str


@dataclass(frozen=True)
class Update:
    """Overwrite the top of the variable's stack with its current value: what a
    Pop ... Push pair becomes when the variable is reassigned in between (Figure 4)."""

    var: str


@dataclass(frozen=True)
class Join:
    """Figure 4, first op of a Fork's join block: `outs[k]` takes the return
    value `rets[k]` from the lane of the parent's k-th child, which is then freed."""

    outs: tuple[str, ...]
    rets: tuple[str, ...]


@dataclass(frozen=True)
class Launch:
    """Start `call` in a lane of its own and go on without waiting (a loop's
    independent calls, `frontend/loop_forks.py`). The child joins the lane's
    list of launched children, in launch order. Where no lane is free the
    lane stops launching until its next `Await`: those calls run later in its
    own lane (`Collect` finds no child). `call` is a `Call` in Figure 2, a
    `Spawn` in Figure 4."""

    call: Any


@dataclass(frozen=True)
class Collect:
    """`out` takes the return value `ret` (the callee in Figure 2, its return
    variable in Figure 4) of the lane's oldest launched child still held,
    which is then freed; `flag` says whether there was one (where not, `out`
    is junk and the code calls the function itself). With `when`, only where
    that variable is truthy (elsewhere nothing is taken)."""

    out: str
    ret: str
    flag: str
    when: str | None = None


Op = Union[Prim, Call, Push, Pop, Peek, Update, Join, Launch, Collect]
STACK_OPS = (Push, Pop, Peek, Update)


# --- terminators ---------------------------------------------------------


@dataclass(frozen=True)
class Jump:
    target: int


@dataclass(frozen=True)
class Branch:
    """Go to `true` where `cond` is truthy, else `false`."""

    cond: str
    true: int
    false: int
    loc: Loc | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Return:
    """Figure 2: return `value`. Figure 4: `value` is None; pop the pc stack."""

    value: str | None = None
    loc: Loc | None = field(default=None, compare=False)


@dataclass(frozen=True)
class PushJump:
    """Jump to `target` after pushing `ret` on the pc stack (a call)."""

    target: int
    ret: int


@dataclass(frozen=True)
class Spawn:
    """One child of a Figure 4 Fork: a free lane starts at block `target` (a
    function's entry) with `params` assigned from the parent's `args`."""

    target: int
    params: tuple[str, ...]
    args: tuple[str, ...]


@dataclass(frozen=True)
class Fork:
    """Independent calls run at once, each in a lane of its own.

    Figure 2: `calls` are `Call`s that do not read each other's results; they
    run (in any order), then control continues at `join`. `seq` is the same
    calls followed by the same continuation, run one after another in the
    caller's lane: the machine takes it when too few lanes are free.
    Figure 4: `calls` are `Spawn`s; the parent waits off the frontier until
    every child has returned, then runs `join` (whose first op is a `Join`).
    """

    calls: tuple
    join: int
    seq: int
    loc: Loc | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Await:
    """Wait off the frontier until every child the lane launched has returned,
    then go to `target`; with a `cond` (computed before the wait), to `target`
    where it is truthy and to `false` elsewhere."""

    target: int
    cond: str | None = None
    false: int | None = None


@dataclass(frozen=True)
class Fail:
    """Where Python raises (`raise`, a failed `assert`, `range()` with step 0):
    the lane's example stops and is reported failed, quoting `text` (the
    statement, or what went wrong) at `loc`. No successors: nothing runs after
    it, and nothing is live there."""

    text: str
    loc: Loc | None = field(default=None, compare=False)


Terminator = Union[Jump, Branch, Return, PushJump, Fork, Await, Fail]


# --- containers ----------------------------------------------------------


@dataclass(frozen=True)
class Block:
    label: str
    ops: tuple[Op, ...]
    term: Terminator
    loc: Loc | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Function:
    """One function's control-flow graph; block 0 is the entry."""

    name: str
    params: tuple[str, ...]
    blocks: tuple[Block, ...]
    loc: Loc | None = field(default=None, compare=False)
    param_locs: tuple[Loc | None, ...] = field(default=(), compare=False)  # where each parameter is declared


@dataclass(frozen=True)
class Program:
    """Figure 2: functions by name, and which one is called from outside."""

    functions: tuple[Function, ...]
    entry: str
    notes: tuple[str, ...] = field(default=(), compare=False)  # what the frontend did not do, and why

    def function(self, name: str) -> Function:
        for f in self.functions:
            if f.name == name:
                return f
        raise KeyError(name)

    def __str__(self) -> str:
        return FORMATTERS[Program](self)


TEMPORARY, REGISTER, STACKED, CONSTANT = "temporary", "register", "stacked", "constant"
INVARIANT = "invariant"  # fixed for one example's whole run: computed once per example


@dataclass(frozen=True)
class StackProgram:
    """Figure 4: one merged block list run by the machine.

    `prelude` ops compute machine constants (values that are the same for every
    lane at every step: shared inputs and what is computed from them) and
    per-example invariants (INVARIANT: batched inputs every call passes on
    unchanged, and what is computed from them) once, before the loop.
    `var_class` maps every variable to one of TEMPORARY, REGISTER, STACKED,
    CONSTANT or INVARIANT. `var_types` maps every non-temporary
    variable to a pytree of `jax.ShapeDtypeStruct` (per example), filled in by
    type inference. `entry_params` get the machine's inputs; `result` holds the
    answer when a lane halts.
    """

    blocks: tuple[Block, ...]
    entry_block: int
    entry_params: tuple[str, ...]
    result: str
    prelude: tuple[Prim, ...] = ()
    var_class: Mapping[str, str] = field(default_factory=dict)
    var_types: Mapping[str, Any] = field(default_factory=dict, compare=False)
    block_function: tuple[str, ...] = ()
    stack_conflicts: frozenset = frozenset()  # stacked variables that may not share a stack
    crossing: frozenset = frozenset()  # variables whose value crosses a block boundary (need a lane slot)
    stack_of: Mapping[str, str] = field(default_factory=dict)  # stacked variable -> its (shared) stack
    lanes: int | None = None  # set once the machine's size is known
    stack_depth: int | None = None
    param_locs: Mapping[str, Loc] = field(default_factory=dict, compare=False)  # every function's parameters
    notes: tuple[str, ...] = field(default=(), compare=False)  # the frontend's (`Program.notes`)
    merged: Mapping[str, tuple[str, ...]] = field(default_factory=dict, compare=False)  # slot -> the copies it took over

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    # Cached: an eager call asks these every time, and they walk every op.
    @cached_property
    def has_calls(self) -> bool:
        return any(isinstance(b.term, PushJump) for b in self.blocks)

    @cached_property
    def has_forks(self) -> bool:
        return any(isinstance(b.term, Fork) for b in self.blocks) or self.has_launches

    @cached_property
    def fail_blocks(self) -> tuple[int, ...]:
        """The blocks that end in `Fail` (the machine flags an example that runs one)."""
        return tuple(b for b, blk in enumerate(self.blocks) if isinstance(blk.term, Fail))

    @cached_property
    def has_launches(self) -> bool:
        return any(isinstance(op, Launch) for b in self.blocks for op in b.ops)

    def vars_of_class(self, cls: str) -> tuple[str, ...]:
        return tuple(sorted(v for v, c in self.var_class.items() if c == cls))

    def __str__(self) -> str:
        return FORMATTERS[StackProgram](self)


def op_reads(op: Op) -> tuple[str, ...]:
    if isinstance(op, Prim):
        return op.ins
    if isinstance(op, Call):
        return op.args
    if isinstance(op, Launch):
        return op.call.args
    if isinstance(op, Collect):
        return () if op.when is None else (op.when,)
    if isinstance(op, (Push, Update)):
        return (op.var,)
    return ()


def op_writes(op: Op) -> tuple[str, ...]:
    if isinstance(op, Prim):
        return op.outs
    if isinstance(op, Call):
        return (op.out,)
    if isinstance(op, (Pop, Peek)):
        return (op.var,)
    if isinstance(op, Join):
        return op.outs  # `rets` are read from the children's lanes, not this one
    if isinstance(op, Collect):
        return (op.out, op.flag)
    return ()


def term_reads(term: Terminator) -> tuple[str, ...]:
    if isinstance(term, Branch):
        return (term.cond,)
    if isinstance(term, Return) and term.value is not None:
        return (term.value,)
    if isinstance(term, Await) and term.cond is not None:
        return (term.cond,)
    if isinstance(term, Fork):
        return tuple(a for c in term.calls for a in c.args)
    return ()


def successors(term: Terminator) -> tuple[int, ...]:
    """Intra-function successors (a PushJump continues at `ret` after the call;
    a Return and a Fail have none)."""
    if isinstance(term, Jump):
        return (term.target,)
    if isinstance(term, Branch):
        return (term.true, term.false)
    if isinstance(term, PushJump):
        return (term.target, term.ret)
    if isinstance(term, Fork):
        return (term.join, term.seq)
    if isinstance(term, Await):
        return (term.target,) if term.cond is None else (term.target, term.false)
    return ()


def spawn_targets(term: Terminator) -> tuple[int, ...]:
    """Where a Figure 4 Fork starts its children (other lanes: not successors)."""
    if isinstance(term, Fork):
        return tuple(c.target for c in term.calls if isinstance(c, Spawn))
    return ()


def launch_targets(block: Block) -> tuple[int, ...]:
    """Where a Figure 4 block's Launches start children (other lanes)."""
    return tuple(op.call.target for op in block.ops if isinstance(op, Launch) and isinstance(op.call, Spawn))


def retext(text: str, reads: Mapping[str, str]) -> str:
    """An op's source text with its renamed inputs renamed, so the IR listing
    stays true. `reads` maps names as in `Prim.ins` (qualified or not; the
    text names its own function's variables unqualified). A name is matched
    whole, suffixes included (`h_k%3` is not `h_k`), never inside a string or
    after a dot."""
    local = {}
    for old, new in reads.items():
        # The text names a web (`ir/webs.py`) as the user's variable.
        old_fn, _, old_name = user_name(old).rpartition(".")
        new_fn, _, new_name = user_name(new).rpartition(".")
        if old_name != new_name and old_fn == new_fn:
            local[old_name] = new_name
    if not local or not text:
        return text
    names = "|".join(re.escape(k) for k in sorted(local, key=len, reverse=True))
    return re.sub(rf"(?<![\w.%'\"])({names})(?![\w%])", lambda m: local[m.group(1)], text)
