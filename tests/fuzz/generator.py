"""A hypothesis strategy for random autobatchable programs.

`fuzz_cases()` draws a `FuzzCase`: the Python source of a small module with one
or two `@pcbatch.autobatch` functions, plus a batch of inputs for its entry
function `f0`.  The programs use integer (and some float) arithmetic on a few
variables, nested `if/elif/else`, `while` loops, `for i in range(a, b, s)` with
data-dependent bounds and steps (negative steps and zero trips included; a stop or
step held in a variable that the body may reassign), a call's depth argument held in a
local that code after the call reads, a call's target kept in a local before the call,
`break`, `continue`, `pass`, early returns (inside loops too), conditional
expressions, `and`/`or`/`not` (on booleans and, for their value, on ints),
chained comparisons, augmented assignment, tuple unpacking and tuple returns,
indexing a module-level array, calls to an ordinary (inlined) helper, recursion,
mutual recursion, tail calls, calls nested in arguments, keyword arguments and
parameter defaults, and (sometimes) an entry argument shared by the batch
(`in_axes=None`).

The entry call itself binds like Python: some arguments by keyword, in any
order, defaults skipped (a later keyword after an omitted default); batches
of 0 and 1 examples; and sometimes tight `max_steps`/`max_stack_depth` limits,
under which every example the machine does not flag must still be exact; each
case runs with `fork=True` (1 or 2 compiled lane widths, the default pool or
one with 0-3 spare lanes) or the default
`fork="auto"` (one lane per example for these scalar programs).

Every generated program is well-defined Python that terminates quickly:

* Every variable is assigned at the top of the function, so it is defined on
  all paths.
* Integers stay far from int32 overflow: an assignment reduces its value
  modulo a constant, products are reduced (`(x * y % 97)`), and augmented
  assignments only add or subtract an atom.  (The oracle runs the original
  Python, where a literal-only computation is an unbounded Python int, so an
  overflow would be a difference in the test, not in pcbatch.)
* Denominators are `(e % 7 + 1)`-style, never zero; `range` steps are never zero.
* Floats are multiples of 0.25 of modest size, so every float operation is
  exact and branching on a float cannot depend on rounding.
* `while` loops burn a fuel counter as the first statement of their body
  (before any `continue`); `for` bounds are small.
* Every call passes a depth argument `d - 1` or `d - 2` and is only reached
  where `d > 0` (under `if d > 0:`, after `if d <= 0: return ...`, or as
  `(f(d - 1, ...) if d > 0 else ...)` / `d > 0 and f(d - 1, ...) ...`), so
  recursion depth is bounded by the input depth.  The input depth is chosen from
  a static bound on the number of calls and loop trips, which keeps the
  per-example Python oracle cheap.
"""
from __future__ import annotations

import dataclasses
import zlib
from typing import Any, Callable

import numpy as np
from hypothesis import strategies as st

INT_BOUND = 1000        # assignments keep |int| below about this
MAX_FUNCS = 2
MAX_LOOP_NEST = 2
MAX_NEST = 3            # nesting of compound statements
MAX_CALL_SITES = 3      # per function
CALL_BUDGET = 40        # bound on calls per example (static estimate)
WORK_BUDGET = 600       # bound on executed statements per example (static estimate)
MAX_INPUT_DEPTH = 7
BATCH_SIZES = (0, 1, 3, 8)
GUARD = "fuzz guard"    # the message of the generated raise/assert statements
SMALL = 8               # statements per function in `make test` (keeps XLA compile time low)
LARGE = 14              # for `make fuzz`


@dataclasses.dataclass(frozen=True)
class FuzzCase:
    source: str
    entry: str
    param_kinds: tuple[str, ...]      # 'd' (depth), 'i' (int) or 'f' (float) per parameter
    max_depth: int                    # largest input depth the budget allows
    inputs: tuple[np.ndarray, ...]    # one array per parameter (batched on axis 0 unless in_axes says None)
    in_axes: tuple[Any, ...] = ()
    passing: tuple[str, ...] = ()     # per parameter: 'pos', 'kw' or 'omit' (its default is used)
    limits: dict[str, int] | None = None  # max_steps / max_stack_depth, tight enough to stop some examples
    fork: bool | str = True               # the entry's `fork` option: fork-join, or the default "auto"
    max_widths: int | None = None         # fork=True: the pool's compiled widths (Tuning.max_widths)
    spare_lanes: int | None = None        # fork=True: a pool of batch + this many lanes (None: the default)

    def call_args(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The entry call's positional and keyword arguments (keywords in a drawn order)."""
        passing = self.passing or ("pos",) * len(self.inputs)
        args = tuple(x for x, how in zip(self.inputs, passing) if how == "pos")
        order = [int(k) for k in self.kw_order] if self.kw_order else range(len(self.inputs))
        names = self.param_names()
        kwargs = {names[k]: self.inputs[k] for k in order if passing[k] == "kw"}
        return args, kwargs

    kw_order: tuple[int, ...] = ()

    def describe(self) -> str:
        args, kwargs = self.call_args()
        text = [repr(np.asarray(x).tolist()) for x in args] + [f"{k}={np.asarray(x).tolist()!r}"
                                                                for k, x in kwargs.items()]
        notes = [] if all(ax == 0 for ax in self.in_axes) else [f"in_axes={self.in_axes!r}"]
        if self.limits:
            notes.append(f"options {self.limits}")
        notes.append(f"fork={self.fork!r}" + (f", max_widths={self.max_widths}" if self.max_widths else "")
                     + (f", max_lanes=batch+{self.spare_lanes}" if self.spare_lanes is not None else ""))
        note = f"  # {'; '.join(notes)}" if notes else ""
        return f"--- program ---\n{self.source}--- inputs ---\n{self.entry}({', '.join(text)}){note}\n"

    def param_names(self) -> list[str]:
        return _param_names(self.param_kinds)

    def __repr__(self) -> str:  # what hypothesis prints for a falsifying example
        return "FuzzCase(\n" + self.describe() + ")"


def _param_names(kinds: tuple[str, ...]) -> list[str]:
    names, ni = [], 0
    for k in kinds:
        if k == "d":
            names.append("d")
        elif k == "f":
            names.append("x")
        else:
            names.append("ab"[ni] if ni < 2 else f"p{ni}")
            ni += 1
    return names


@dataclasses.dataclass
class _Func:
    name: str
    kinds: tuple[str, ...]
    ret: str                 # 'i', 'ii' or 'if'
    n_locals: int
    has_float: bool
    default: int | None = None   # default value of the last parameter (an int) if any
    default_prev: int | None = None  # and of the one before it (entry only; needs `default`)
    decorator: str = "@pcbatch.autobatch"
    calls: int = 0           # call sites emitted so far
    branching: int = 0       # sum over call sites of the enclosing loops' trip bounds
    work: int = 0            # statements executed per invocation (static bound)


@dataclasses.dataclass(frozen=True)
class _Ctx:
    loop_depth: int = 0
    mult: int = 1            # product of enclosing loops' trip bounds
    guarded: bool = False    # d > 0 holds here
    nest: int = 0


class _Builder:
    """Draws one function body.  `draw` is hypothesis' draw."""

    def __init__(self, draw: Callable, me: _Func, callees: list[_Func], max_stmts: int, guards: bool = False):
        self.draw = draw
        self.guards = guards  # some `pass` statements become a raise or an assert that some examples fail
        self.me = me
        self.callees = callees
        self.lines: list[str] = []
        self.stmt_budget = draw(st.integers(2, max_stmts))
        self.no_prelude = False  # building an `elif` test: no line may go before it

    # --- small helpers -----------------------------------------------------

    def choice(self, options: list[Any]) -> Any:
        return self.draw(st.sampled_from(options))

    def weighted(self, options: list[tuple[int, Any]]) -> Any:
        options = [(w, o) for w, o in options if w > 0]
        total = sum(w for w, _ in options)
        k = self.draw(st.integers(0, total - 1))
        for w, o in options:
            if k < w:
                return o
            k -= w
        raise AssertionError

    def int_vars(self, writable: bool) -> list[str]:
        names = _param_names(self.me.kinds)
        out = [n for n, k in zip(names, self.me.kinds) if k == "i" or (k == "d" and not writable)]
        out += [f"v{j}" for j in range(self.me.n_locals)]
        out += [f"i{j}" for j in range(MAX_LOOP_NEST)]
        if not writable:
            out += [f"k{j}" for j in range(MAX_LOOP_NEST)]
            if self.callees:
                out.append("dd")
        return out

    def emit(self, ctx: _Ctx, text: str) -> None:
        self.lines.append("    " * (ctx.nest + 1) + text)
        self.me.work += ctx.mult

    # --- expressions ---------------------------------------------------------

    def literal(self) -> str:
        return str(self.draw(st.integers(-3, 9)))

    def int_atom(self) -> str:
        if self.weighted([(4, "var"), (1, "lit")]) == "var":
            return self.choice(self.int_vars(False))
        return self.literal()

    def int_expr(self, ctx: _Ctx, depth: int = 2) -> str:
        if depth <= 0:
            return self.int_atom()
        kind = self.weighted([
            (6, "atom"), (4, "add"), (2, "sub"), (2, "mul"), (1, "floordiv"), (1, "mod"), (1, "neg"),
            (1, "abs"), (1, "minmax"), (1, "bit"), (2, "ifexp"), (1, "andor"),
            (2 if self.can_call(ctx) else 0, "call"), (1, "mixed_andor"),
            (1 if self.me.has_float else 0, "float_cmp_pick"), (1, "table"), (1, "helper"),
        ])
        e = lambda: self.int_expr(ctx, depth - 1)  # noqa: E731
        if kind == "atom":
            return self.int_atom()
        if kind == "add":
            return f"({e()} + {e()})"
        if kind == "sub":  # `+ 0`: two `mixed_andor` bools, which jnp does not subtract
            return f"({e()} - ({e()} + 0))"
        if kind == "mul":
            return f"({e()} * {e()} % 97)"
        if kind == "floordiv":
            return f"({e()} // ({e()} % 7 + 1))"
        if kind == "mod":
            return f"({e()} % ({e()} % 5 + 1))"
        if kind == "neg":  # `+ 0`: a `mixed_andor` may be a bool, which jnp does not negate
            return f"(-({e()} + 0))"
        if kind == "abs":
            return f"abs({e()} + 0)"
        if kind == "minmax":
            return f"jnp.{self.choice(['minimum', 'maximum'])}({e()}, {e()})"
        if kind == "bit":
            return f"({e()} {self.choice(['&', '|', '^'])} {e()})"
        if kind == "ifexp":
            return f"({e()} if {self.cond(ctx, depth - 1)} else {e()})"
        if kind == "andor":  # value semantics of and/or on ints
            return f"({e()} {self.choice(['and', 'or'])} {e()})"
        if kind == "mixed_andor":  # a bool or an int: the variable's type is the join (int)
            return f"(({self.cond(ctx, 0)}) {self.choice(['and', 'or'])} {e()})"
        if kind == "table":  # indexing a module-level array
            return f"TABLE[{e()} % 8]"
        if kind == "helper":  # an ordinary Python function: inlined as primitive code
            return f"mix({e()}, {e()})"
        if kind == "float_cmp_pick":
            return f"({e()} if {self.float_expr(ctx, 0)} {self.choice(['<', '>=', '=='])} {e()} else {e()})"
        return self.call_expr(ctx, "i")

    def float_expr(self, ctx: _Ctx, depth: int = 1) -> str:
        """Multiples of 0.25 of modest size (exact in float32)."""
        fvars = (["fl"] if self.me.has_float else []) + (["x"] if "f" in self.me.kinds else [])
        if depth <= 0:
            if not fvars:
                return self.choice(["0.5", "-1.25", "2.0", f"{self.int_atom()} * 0.25"])
            return self.weighted([(4, self.choice(fvars)), (1, self.choice(["0.5", "-1.25", "2.0"]))])
        kind = self.weighted([(3, "atom"), (3, "lin"), (1, "sub"), (1, "neg"), (1, "ifexp"),
                              (1 if self.can_call(ctx) and self.float_callees() else 0, "call")])
        if kind == "atom":
            return self.float_expr(ctx, 0)
        if kind == "lin":
            k = self.draw(st.integers(-2, 3))
            return f"(({self.float_expr(ctx, depth - 1)} * {k} + {self.int_expr(ctx, 1)} * 0.25) % 256.0)"
        if kind == "sub":
            return f"({self.float_expr(ctx, depth - 1)} - {self.choice(['0.5', '1.75'] + fvars)})"
        if kind == "neg":
            return f"(-{self.float_expr(ctx, depth - 1)})"
        if kind == "ifexp":
            return f"({self.float_expr(ctx, depth - 1)} if {self.cond(ctx, 0)} else {self.float_expr(ctx, depth - 1)})"
        return self.call_expr(ctx, "f")

    def cond(self, ctx: _Ctx, depth: int = 1) -> str:
        kind = self.weighted([
            (6, "cmp"), (2, "parity"), (1, "chain"), (1 if depth > 0 else 0, "not"),
            (2 if depth > 0 else 0, "andor"), (1 if self.me.has_float else 0, "fcmp"), (1, "truthy"),
            (1 if self.can_call(ctx) else 0, "guarded_call"),
        ])
        op = lambda: self.choice(["<", "<=", ">", ">=", "==", "!="])  # noqa: E731
        if kind == "cmp":
            return f"{self.int_expr(ctx, 1)} {op()} {self.int_expr(ctx, 1)}"
        if kind == "parity":
            return f"{self.int_expr(ctx, 1)} % {self.draw(st.integers(2, 4))} == {self.draw(st.integers(0, 1))}"
        if kind == "chain":
            return f"{self.int_atom()} {op()} {self.int_atom()} {op()} {self.int_atom()}"
        if kind == "not":
            return f"not ({self.cond(ctx, depth - 1)})"
        if kind == "andor":
            return f"({self.cond(ctx, depth - 1)}) {self.choice(['and', 'or'])} ({self.cond(ctx, depth - 1)})"
        if kind == "fcmp":
            return f"{self.float_expr(ctx, 0)} {op()} {self.int_atom()}"
        if kind == "truthy":
            return f"{self.int_expr(ctx, 1)}"
        # `d > 0 and f(d - 1, ...) ...`: short-circuit protects the call
        inner = _Ctx(ctx.loop_depth, ctx.mult, True, ctx.nest)
        return f"d > 0 and {self.call_expr(inner, 'i')} {op()} {self.int_atom()}"

    # --- calls -----------------------------------------------------------------

    def unpackable(self) -> list[_Func]:
        return [f for f in self.callees if f.ret == "ii" or (f.ret == "if" and self.me.has_float)]

    def float_callees(self) -> list[_Func]:
        return [f for f in self.callees if f.ret == "if"]

    def can_call(self, ctx: _Ctx) -> bool:
        return bool(self.callees) and self.me.calls < MAX_CALL_SITES

    def call_expr(self, ctx: _Ctx, want: str) -> str:
        """A call yielding an int ('i') or a float ('f'), guarded by `d > 0`."""
        callees = self.callees if want == "i" else self.float_callees()
        callee = self.choice(callees)
        text = self.call(ctx, callee)
        if callee.ret != "i":
            text += "[1]" if want == "f" else self.choice(["[0]", "[1]"] if callee.ret == "ii" else ["[0]"])
        if ctx.guarded:
            return text
        other = self.int_atom() if want == "i" else self.float_expr(ctx, 0)
        return f"({text} if d > 0 else {other})"

    def call(self, ctx: _Ctx, callee: _Func) -> str:
        self.me.calls += 1
        self.me.branching += ctx.mult
        inner = _Ctx(ctx.loop_depth, ctx.mult, True, ctx.nest)
        args = []
        for k in callee.kinds:
            if k == "d":
                arg = self.choice(["d - 1", "d - 1", "d - 2"])
                # Sometimes the depth goes through a local that later code reads: `dd = d - 1`
                # then `f(dd, ...)`, with dd live after the call. Picked from the text, not drawn.
                if not self.no_prelude and zlib.crc32("\n".join(self.lines).encode()) % 3 == 0:
                    self.lines.append("    " * (ctx.nest + 1) + f"dd = {arg}")
                    arg = "dd"
                args.append(arg)
            elif k == "i":
                args.append(self.int_expr(inner, 1))
            else:
                args.append(self.float_expr(inner, 1))
        names = _param_names(callee.kinds)
        if callee.default is not None and self.draw(st.booleans()):
            args, names = args[:-1], names[:-1]  # use the default
        if len(args) > 1 and self.draw(st.integers(0, 3)) == 0:
            # keyword arguments, in any order, after a positional prefix
            cut = self.draw(st.integers(0, len(args) - 1))
            kw = self.draw(st.permutations([f"{n}={a}" for n, a in zip(names[cut:], args[cut:])]))
            args = args[:cut] + list(kw)
        return f"{callee.name}({', '.join(args)})"

    # --- statements ------------------------------------------------------------

    def ret_expr(self, ctx: _Ctx) -> str:
        tail = [f for f in self.callees if f.ret == self.me.ret] if self.can_call(ctx) else []
        if tail and (ctx.guarded or self.me.ret == "i") and self.draw(st.integers(0, 3)) == 0:
            # a tail call (becomes a jump), e.g. `return f0(d - 1, b, a)`
            call = self.call(ctx, self.choice(tail))
            return call if ctx.guarded else f"({call} if d > 0 else {self.int_atom()})"
        i = f"{self.int_expr(ctx)} % {INT_BOUND}"
        if self.me.ret == "i":
            return i
        if self.me.ret == "ii":
            return f"{i}, {self.int_expr(ctx)} % {INT_BOUND}"
        return f"{i}, {self.float_expr(ctx)}"

    def block(self, ctx: _Ctx, lo: int = 1, hi: int = 3) -> None:
        n = self.draw(st.integers(lo, hi))
        start = len(self.lines)
        for _ in range(n):
            if self.stmt_budget <= 0:
                break
            self.stmt(ctx)
        if len(self.lines) == start:
            self.emit(ctx, "pass")

    def stmt(self, ctx: _Ctx) -> None:
        self.stmt_budget -= 1
        in_loop = ctx.loop_depth > 0
        compound = ctx.nest < MAX_NEST and self.stmt_budget > 0
        loops = compound and ctx.loop_depth < MAX_LOOP_NEST
        kind = self.weighted([
            (6, "assign"), (3, "aug"), (2 if self.me.has_float else 0, "fassign"), (2, "tuple"),
            (1 if self.unpackable() and self.can_call(ctx) else 0, "unpack"),
            (1 if self.can_call(ctx) else 0, "exprcall"), (3 if self.can_call(ctx) else 0, "callassign"),
            (5 if compound else 0, "if"), (2 if compound and not ctx.guarded and self.callees else 0, "ifguard"),
            (3 if loops else 0, "while"), (4 if loops else 0, "for"),
            (3 if in_loop else 0, "break"), (2 if in_loop else 0, "continue"),
            (2, "return"), (1, "pass"),
        ])
        wv = lambda: self.choice(self.int_vars(True))  # noqa: E731
        if kind == "assign":
            self.emit(ctx, f"{wv()} = {self.int_expr(ctx)} % {self.choice([INT_BOUND, 97, 13])}"
                      + self.choice(["", "", " - 50"]))
        elif kind == "aug":
            op = self.choice(["+=", "-=", "%=", "//="])
            rhs = self.int_atom() if op in ("+=", "-=") else str(self.draw(st.integers(1, 9)))
            self.emit(ctx, f"{wv()} {op} {rhs}")
        elif kind == "fassign":
            self.emit(ctx, f"fl = {self.float_expr(ctx, 2)}")
        elif kind == "tuple":
            a, b = wv(), wv()
            if a == b:
                self.emit(ctx, f"{a} = {self.int_expr(ctx)} % {INT_BOUND}")
            elif self.draw(st.booleans()):
                self.emit(ctx, f"{a}, {b} = {b}, {a}")
            else:
                self.emit(ctx, f"{a}, {b} = {self.int_expr(ctx, 1)} % {INT_BOUND}, {self.int_expr(ctx, 1)} % {INT_BOUND}")
        elif kind == "unpack":
            callee = self.choice(self.unpackable())
            a = wv()
            b = self.choice([v for v in self.int_vars(True) if v != a]) if callee.ret == "ii" else "fl"
            if ctx.guarded:
                self.emit(ctx, f"{a}, {b} = {self.call(ctx, callee)}")
            else:
                self.emit(ctx, "if d > 0:")
                inner = dataclasses.replace(ctx, guarded=True, nest=ctx.nest + 1)
                self.emit(inner, f"{a}, {b} = {self.call(inner, callee)}")
        elif kind == "callassign":  # the call writes its target directly, e.g. `a = f0(d - 1, a, b)`
            target = wv()
            # Sometimes the target's old value is kept first (`v1 = a; a = f0(...)`): a read
            # that must stay before the call's write however calls are regrouped. Picked
            # from the text, not drawn.
            keep = [v for v in self.int_vars(True) if v != target and v.startswith("v")]
            if keep and zlib.crc32("\n".join(self.lines).encode()) % 3 == 0:
                self.emit(ctx, f"{keep[len(self.lines) % len(keep)]} = {target}")
            self.emit(ctx, f"{target} = {self.call_expr(ctx, 'i')}")
        elif kind == "exprcall":
            callee = self.choice(self.callees)
            if ctx.guarded:
                self.emit(ctx, self.call(ctx, callee))
            elif callee.ret == "i":
                self.emit(ctx, f"({self.call(ctx, callee)} if d > 0 else 0)")
            else:
                self.emit(ctx, "if d > 0:")
                inner = dataclasses.replace(ctx, guarded=True, nest=ctx.nest + 1)
                self.emit(inner, self.call(inner, callee))
        elif kind == "if":
            self.emit(ctx, f"if {self.cond(ctx)}:")
            inner = dataclasses.replace(ctx, nest=ctx.nest + 1)
            self.block(inner)
            n_elif = self.weighted([(4, 0), (2, 1), (1, 2)])
            for _ in range(n_elif):
                self.no_prelude = True
                test = self.cond(ctx)
                self.no_prelude = False
                self.emit(ctx, f"elif {test}:")
                self.block(inner)
            if self.draw(st.booleans()):
                self.emit(ctx, "else:")
                self.block(inner)
        elif kind == "ifguard":
            self.emit(ctx, self.choice(["if d > 0:", "if d >= 1:", "if not d <= 0:"]))
            self.block(dataclasses.replace(ctx, nest=ctx.nest + 1, guarded=True))
            if self.draw(st.booleans()):
                self.emit(ctx, "else:")
                self.block(dataclasses.replace(ctx, nest=ctx.nest + 1))
        elif kind == "while":
            self.while_loop(ctx)
        elif kind == "for":
            self.for_loop(ctx)
        elif kind in ("break", "continue"):
            if self.draw(st.integers(0, 3)) == 0:
                self.emit(ctx, kind)
            else:
                self.emit(ctx, f"if {self.cond(ctx)}:")
                self.emit(dataclasses.replace(ctx, nest=ctx.nest + 1), kind)
        elif kind == "return":
            if self.draw(st.integers(0, 2)) == 0:
                self.emit(ctx, f"return {self.ret_expr(ctx)}")
            else:
                self.emit(ctx, f"if {self.cond(ctx)}:")
                inner = dataclasses.replace(ctx, nest=ctx.nest + 1)  # lines a call adds go inside the `if`
                self.emit(inner, f"return {self.ret_expr(inner)}")
        elif self.guards:
            self.guard(ctx)
        else:
            self.emit(ctx, "pass")

    def guard(self, ctx: _Ctx, among: list[str] | None = None) -> None:
        """A guard clause Python raises at for some examples (`GUARD` in its message), or
        `pass`, on one of the int variables (`among` them where given). Picked from the text,
        not drawn: the other programs stay the same."""
        pick = zlib.crc32("\n".join(self.lines).encode())
        names = sorted(among or self.int_vars(False))
        var = names[pick % len(names)]
        modulus, rest = (7, 11, 5)[pick // 3 % 3], pick // 9 % 5
        if pick % 3 == 0:
            self.emit(ctx, f"if {var} % {modulus} == {rest}:")
            self.emit(dataclasses.replace(ctx, nest=ctx.nest + 1), f'raise ValueError("{GUARD}")')
        elif pick % 3 == 1:
            self.emit(ctx, f'assert {var} % {modulus} != {rest}, "{GUARD}"')
        else:
            self.emit(ctx, "pass")

    def while_loop(self, ctx: _Ctx) -> None:
        k = f"k{ctx.loop_depth}"
        fuel = self.draw(st.integers(1, 4))
        if self.draw(st.booleans()):
            self.emit(ctx, f"{k} = {fuel}")
            bound = fuel
        else:
            self.emit(ctx, f"{k} = {self.int_expr(ctx, 1)} % {fuel + 1}")
            bound = fuel
        form = self.choice(["fuel_and", "fuel_break", "true"])
        inner = _Ctx(ctx.loop_depth + 1, ctx.mult * (bound + 1), ctx.guarded, ctx.nest + 1)
        test_ctx = dataclasses.replace(ctx, mult=inner.mult)  # the test runs on every trip
        if form == "fuel_and":
            self.emit(ctx, f"while {k} > 0 and ({self.cond(test_ctx)}):")
            self.emit(inner, f"{k} -= 1")
        elif form == "fuel_break":
            self.emit(ctx, f"while {self.cond(test_ctx)}:")
            self.emit(inner, f"{k} = {k} - 1")
            self.emit(inner, f"if {k} < 0:")
            self.emit(dataclasses.replace(inner, nest=inner.nest + 1), "break")
        else:
            self.emit(ctx, "while True:")
            self.emit(inner, f"{k} -= 1")
            self.emit(inner, f"if {k} < 0:")
            deeper = dataclasses.replace(inner, nest=inner.nest + 1)
            if self.draw(st.booleans()):
                self.emit(deeper, "break")
            else:
                self.emit(deeper, f"return {self.ret_expr(deeper)}")
        self.block(inner)

    def for_loop(self, ctx: _Ctx) -> None:
        var = f"i{ctx.loop_depth}"

        def bound_expr() -> tuple[str, int, int]:
            if self.draw(st.integers(0, 3)) == 0:
                c = self.draw(st.integers(-2, 5))
                return str(c), c, c
            m = self.draw(st.integers(1, 5))
            c = self.draw(st.integers(-2, 2))
            return f"{self.int_expr(ctx, 1)} % {m}" + (f" + {c}" if c > 0 else f" - {-c}" if c < 0 else ""), c, c + m - 1

        nargs = self.weighted([(1, 1), (2, 2), (3, 3)])
        step_kind = self.choice(["1", "2", "-1", "-2", "pos", "neg", "sign"]) if nargs == 3 else "1"
        lo_t, lo_min, lo_max = bound_expr() if nargs > 1 else ("0", 0, 0)
        hi_t, hi_min, hi_max = bound_expr()
        if step_kind in ("1", "2", "-1", "-2"):
            step_t, smag = step_kind, 1
        elif step_kind == "pos":
            step_t, smag = f"{self.int_expr(ctx, 1)} % 3 + 1", 1
        elif step_kind == "neg":
            step_t, smag = f"-({self.int_expr(ctx, 1)} % 2 + 1)", 1
        else:
            step_t, smag = f"{self.int_expr(ctx, 1)} % 2 * 2 - 1", 1
        trips = max(hi_max - lo_min, lo_max - hi_min, 0) // smag + 1
        # Sometimes the stop (or the step) is a variable the body may reassign: Python reads
        # range's bounds once. Picked from the text so far, not drawn: a new draw would change
        # every program the fixed seeds give.
        pick = zlib.crc32("\n".join(self.lines).encode()) % 6
        if pick < 2 and self.me.n_locals > 0:
            held = f"v{pick % self.me.n_locals}"
            if pick == 0 or nargs < 3:
                self.lines.append("    " * (ctx.nest + 1) + f"{held} = {hi_t}")
                hi_t = held
            else:
                self.lines.append("    " * (ctx.nest + 1) + f"{held} = {step_t}")
                step_t = held
        args = {1: hi_t, 2: f"{lo_t}, {hi_t}", 3: f"{lo_t}, {hi_t}, {step_t}"}[nargs]
        self.emit(ctx, f"for {var} in range({args}):")
        inner = _Ctx(ctx.loop_depth + 1, ctx.mult * trips, ctx.guarded, ctx.nest + 1)
        self.block(inner)

    # --- the function ----------------------------------------------------------

    def function(self) -> list[str]:
        me = self.me
        names = _param_names(me.kinds)
        ctx = _Ctx()
        params = names[:-1] + [f"{names[-1]}={me.default}"] if me.default is not None else list(names)
        if me.default_prev is not None:
            params[-2] = f"{names[-2]}={me.default_prev}"
        header = [me.decorator, f"def {me.name}({', '.join(params)}):"]
        ints = [n for n, k in zip(names, me.kinds) if k == "i"]
        for j in range(me.n_locals):
            src = self.choice(ints + ["d"]) if ints else "d"
            self.emit(ctx, self.choice([f"v{j} = {self.draw(st.integers(-2, 5))}", f"v{j} = {src}",
                                        f"v{j} = {src} * {self.draw(st.integers(-2, 3))} % 11"]))
        for j in range(MAX_LOOP_NEST):
            self.emit(ctx, f"i{j} = 0")
            self.emit(ctx, f"k{j} = 0")
        if self.callees:
            self.emit(ctx, "dd = 0")
        if me.has_float:
            self.emit(ctx, self.choice(["fl = 0.0", "fl = 0", "fl = 1.5"] + (["fl = x * 0.5", "fl = x"]
                                                                             if "f" in me.kinds else [])))
        if self.callees and self.draw(st.integers(0, 2)) > 0:
            # the usual base case: the rest of the body may call freely
            self.emit(ctx, "if d <= 0:")
            base = dataclasses.replace(ctx, nest=1)
            self.emit(base, f"return {self.ret_expr(base)}")
            ctx = dataclasses.replace(ctx, guarded=True)
            if self.guards:  # past the base case: fails examples inside recursive (and forked) calls
                self.guard(ctx, [n for n, k in zip(names, me.kinds) if k in "id"])  # the locals: often constants
        self.block(ctx, 2, 6)
        self.emit(ctx, f"return {self.ret_expr(ctx)}")
        return header + self.lines


_PRELUDE = """TABLE = jnp.array([3, -1, 4, 1, -5, 9, 2, -6])


def mix(x, y):
    return (x * 3 - y) % 101

"""


def _estimate(funcs: list[_Func], depth: int) -> tuple[int, int]:
    """Static bounds on (calls, executed statements) for one example at input depth `depth`."""
    b = max(f.branching for f in funcs)
    calls = sum(b ** k for k in range(depth + 1))
    return calls, calls * max(f.work for f in funcs)


@st.composite
def programs(draw: Callable, max_stmts: int = SMALL, differentiable: bool = False,
             guards: bool = False) -> tuple[str, tuple[str, ...], int, tuple[Any, ...]]:
    """(source, entry parameter kinds, largest input depth, entry in_axes) of a random module.

    `max_stmts` bounds the statements drawn per function body (besides the
    initialisations and the final return); compile time grows with it.
    `differentiable`: the entry takes a float and returns one (the same draws
    otherwise, so the other fuzz tests' programs do not change). `guards`: some
    `pass` statements become guard clauses (`raise`, `assert`) that fail some examples."""
    n_funcs = draw(st.integers(1, MAX_FUNCS))
    funcs = []
    for j in range(n_funcs):
        n_int = draw(st.integers(1, 2))
        float_in = draw(st.integers(0, 3)) == 0 or (differentiable and j == 0)
        kinds = ("d",) + ("i",) * n_int + (("f",) if float_in else ())
        ret = draw(st.sampled_from(["i", "i", "ii", "if"]))
        if differentiable and j == 0:
            ret = "if"
        has_float = ret == "if" or "f" in kinds or draw(st.integers(0, 3)) == 0
        funcs.append(_Func(f"f{j}", kinds, ret, draw(st.integers(1, 3)), has_float))
    in_axes: tuple[Any, ...] = (0,) * len(funcs[0].kinds)
    int_params = [p for p, k in enumerate(funcs[0].kinds) if k == "i"]
    if draw(st.integers(0, 3)) == 0:
        # one argument shared by the whole batch: its values are "constant"
        shared = draw(st.sampled_from(int_params))
        in_axes = tuple(None if p == shared else 0 for p in range(len(in_axes)))
        funcs[0].decorator = f"@pcbatch.autobatch(in_axes={in_axes!r})"
    if n_funcs == 2 and funcs[1].kinds[-1] == "i" and draw(st.integers(0, 2)) == 0:
        funcs[1].default = draw(st.integers(-3, 5))
    entry = funcs[0]
    if entry.kinds[-1] == "i" and draw(st.integers(0, 2)) == 0:
        # entry defaults: the call may skip them, or skip one and pass a later one by keyword
        entry.default = draw(st.integers(-3, 5))
        if entry.kinds[-2] == "i" and draw(st.booleans()):
            entry.default_prev = draw(st.integers(-3, 5))
    lines = ["import jax.numpy as jnp", "import pcbatch", "", _PRELUDE]
    for j, me in enumerate(funcs):
        if draw(st.integers(0, 4)) == 0 and n_funcs == 1:
            callees: list[_Func] = []  # loop-only program
        elif n_funcs == 2:
            other = funcs[1 - j]
            # f0 calls f1; f1 calls f0 back (mutual recursion) and/or itself
            callees = [other] if j == 0 else draw(st.sampled_from([[other], [me], [me, other], []]))
        else:
            callees = [me]
        lines += _Builder(draw, me, callees, max_stmts, guards).function() + [""]
    max_depth = 0
    if any(f.branching for f in funcs):
        while (max_depth < MAX_INPUT_DEPTH and
               all(x <= budget for x, budget in zip(_estimate(funcs, max_depth + 1), (CALL_BUDGET, WORK_BUDGET)))):
            max_depth += 1
    else:
        max_depth = 3
    defaults = (entry.default_prev is not None) + (entry.default is not None)
    return "\n".join(lines) + "\n", funcs[0].kinds, max_depth, in_axes, defaults


@st.composite
def fuzz_cases(draw: Callable, max_stmts: int = SMALL, batch_sizes: tuple[int, ...] = BATCH_SIZES,
               forks: tuple[bool | str, ...] = (True, "auto"), differentiable: bool = False,
               guards: bool = False) -> FuzzCase:
    """A random program and a random batch of inputs for its entry function `f0`,
    run with one of `forks` as its `fork` option (fork-join with 1 or 2
    compiled widths: each width is another compiled copy of every block)."""
    source, kinds, max_depth, in_axes, defaults = draw(programs(max_stmts, differentiable, guards))
    # Few empty batches: they compile nothing, but are a case of their own.
    batch = draw(st.sampled_from(batch_sizes if draw(st.integers(0, 9)) == 0 else
                                 tuple(b for b in batch_sizes if b > 0) or batch_sizes))
    inputs = []
    for k, axis in zip(kinds, in_axes):
        if axis is None:
            inputs.append(np.asarray(draw(st.integers(-60, 60)), np.int32))
            continue
        if k == "d":
            xs = draw(st.lists(st.integers(-1, max_depth), min_size=batch, max_size=batch))
            inputs.append(np.asarray(xs, np.int32))
        elif k == "i":
            lo_hi = draw(st.sampled_from([(-5, 5), (-60, 60), (0, 20)]))
            xs = draw(st.lists(st.integers(*lo_hi), min_size=batch, max_size=batch))
            inputs.append(np.asarray(xs, np.int32))
        else:
            xs = draw(st.lists(st.integers(-32, 32), min_size=batch, max_size=batch))
            inputs.append(np.asarray(xs, np.float32) * np.float32(0.25))
    n = len(kinds)
    passing = ["pos"] * n
    if draw(st.integers(0, 2)) == 0:  # a keyword suffix (Python allows no positional after a keyword)
        cut = draw(st.integers(1, n))
        passing[cut:] = ["kw"] * (n - cut)
    for k in range(n - defaults, n):
        if draw(st.booleans()):
            passing[k] = "omit"
    if "omit" in passing:  # nothing positional may follow an omitted argument
        first = passing.index("omit")
        passing[first:] = [p if p == "omit" else "kw" for p in passing[first:]]
    if all(p == "omit" or ax is None for p, ax in zip(passing, in_axes)):
        passing[0] = "pos"  # something must be batched
    kw_order = tuple(draw(st.permutations(range(n))))
    limits = None
    if batch > 0 and draw(st.integers(0, 9)) == 0:
        limits = draw(st.sampled_from([{"max_steps": draw(st.integers(1, 60))},
                                       {"max_stack_depth": draw(st.integers(1, 4))}]))
    fork = draw(st.sampled_from(forks))
    max_widths = draw(st.sampled_from([1, 2])) if fork is True else None
    # A pool with few spare lanes: forks and loop forks fall back to calls in the caller's lane.
    # Picked from the source, not drawn: a new draw would change every program the fixed seeds give.
    spare = (None, None, 0, 1, 3)[zlib.crc32(source.encode()) % 5] if fork is True and batch > 0 else None
    return FuzzCase(source, "f0", kinds, max_depth, tuple(inputs), in_axes, tuple(passing), limits, fork,
                    max_widths, spare, kw_order)
