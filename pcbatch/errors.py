"""Named exceptions. Every error a user can cause is a `PcbatchError`."""
from __future__ import annotations

import re
from dataclasses import dataclass

# A variable split into webs (`pcbatch/ir/webs.py`): `h`, `h%w2`, ... are all the user's `h`.
WEB_SUFFIX = "%w"
_WEB = re.compile(re.escape(WEB_SUFFIX) + r"\d+(?![\w])")


def user_name(var: str) -> str:
    """The name the user wrote for an IR variable (a web's suffix dropped)."""
    return _WEB.sub("", var) if WEB_SUFFIX in var else var


@dataclass(frozen=True)
class Loc:
    """A source position: file, line and the text of that line."""

    filename: str
    lineno: int
    line: str = ""

    def __str__(self) -> str:
        return f"{self.filename}:{self.lineno}"

    def quote(self) -> str:
        return f'  File "{self.filename}", line {self.lineno}\n    {self.line.strip()}'


class PcbatchError(Exception):
    """Base class of every pcbatch error."""


class MaybeUnboundWarning(UserWarning):
    """A variable may be read before any assignment on some path through the
    function: where an example takes that path, Python raises UnboundLocalError
    and pcbatch's value is unspecified (no check runs in the machine)."""


class TypeJoinWarning(UserWarning):
    """A variable holds a typed value of one dtype on one path and of another
    on another: the machine keeps one type per variable (their join), so the
    narrower value is converted and computed on in the wider type, where Python
    keeps its own (int8 wrap-around, `~` on a bool, float32 rounding may differ)."""


class UnsupportedSyntaxError(PcbatchError):
    """The function uses Python that pcbatch cannot batch.

    Has `.filename` and `.lineno`; the message quotes the line and says what to
    write instead.
    """

    def __init__(self, message: str, loc: Loc, hint: str = ""):
        self.filename = loc.filename
        self.lineno = loc.lineno
        self.loc = loc
        text = f"{message}\n{loc.quote()}"
        if hint:
            text += f"\nHint: {hint}"
        super().__init__(text)


# An autobatched function called from code pcbatch traces as one example's JAX (api.py, lower/types.py).
HELPER_CALL_HINT = ("call it directly in the body of an autobatched function, not from an ordinary helper "
                    "function, lambda or comprehension (or decorate the helper with @pcbatch.autobatch too).")


# The frontend's temporaries (`_t3`, or `__t3` where the user's own names start with `_t`):
# the value of a part of an expression the user never named.
_TEMPORARY = re.compile(r"_+t\d+")

# A temporary whose types disagree holds the alternatives of `and`/`or` or `a if c else b`.
TEMPORARY_HINT = ("Python's `a and b` / `a or b` give one of their operands, and `a if c else b` one of its "
                  "branches: pcbatch keeps one type per value, so the alternatives must have the same shape "
                  "and tree structure. Write an `if` statement that assigns or returns each alternative, or "
                  "make them agree (`jnp.where(c, a, b)` for arrays of one shape).")


def is_temporary(var: str) -> bool:
    return bool(_TEMPORARY.fullmatch(user_name(var).rpartition(".")[2]))


def _what(var: str) -> str:
    """How an error names an IR variable: `f.<ret>` is f's return value, a
    temporary the value of an expression on the quoted line."""
    var = user_name(var)
    fn, _, local = var.rpartition(".")
    if local == "<ret>":
        return f"the return value of `{fn}`"
    if is_temporary(var):
        return f"a value computed in `{fn}` (part of an expression on the quoted line)"
    return f"variable `{var}`"


class TypeMismatchError(PcbatchError):
    """A variable gets different shapes, tree structures or incompatible dtypes
    on different paths."""

    def __init__(self, var: str, first: str, first_loc: Loc | None, second: str, second_loc: Loc | None,
                 also: tuple[str, ...] = (), hint: str = ""):
        self.var = user_name(var)
        self.ir_vars = (var, *also)  # the IR's own names, merged copies included: which to split (`ir/webs.py`)
        what = _what(var)
        # Variables copied into this one and merged with it: the user wrote these names.
        named = list(dict.fromkeys(user_name(v).rpartition(".")[2] for v in also
                                   if not v.rpartition(".")[2].startswith("_")))
        if named:
            what = f"variable {', '.join(f'`{v}`' for v in named)} ({what})"
        where1 = f"\n{first_loc.quote()}" if first_loc else ""
        where2 = f"\n{second_loc.quote()}" if second_loc else ""
        if not hint:
            hint = TEMPORARY_HINT if is_temporary(var) else (
                "every assignment to a variable (and every return of a function) must have the same shape and "
                "tree structure; dtypes are joined by JAX's promotion rules. Use separate variable names, or "
                "cast/reshape explicitly.")
        super().__init__(f"{what} has type {first} here:{where1}\nbut type {second} here:{where2}\nHint: {hint}")


class DtypeOverflowError(TypeMismatchError, OverflowError):
    """A Python number that the dtype its variable has on another path cannot
    hold (`2 ** 40` beside an int32 under x64): the join would wrap it."""

    def __init__(self, var: str, value: str, dtype: str, loc: Loc | None):
        self.var = var
        where = f"\n{loc.quote()}" if loc else ""
        PcbatchError.__init__(
            self,
            f"{_what(var)} is {value} here:{where}\nwhich does not fit {dtype}, its type joined over every path "
            "(a Python number takes the type of the other paths' values, as in JAX).\n"
            "Hint: give the other paths' values a dtype that holds it (`.astype(...)`), or make this one "
            "an array of the dtype you mean (`jnp.asarray(..., jnp.int64)`).")


class StackOverflowError(PcbatchError):
    """Some example's recursion went deeper than `max_stack_depth`."""

    def __init__(self, examples: list[int], max_stack_depth: int, needed: dict[int, str], forked: bool = False):
        self.examples = examples
        self.max_stack_depth = max_stack_depth
        self.needed = needed
        shown = ", ".join(f"example {i} needs {needed.get(i, '?')}" for i in examples[:10])
        more = "" if len(examples) <= 10 else f" (and {len(examples) - 10} more)"
        lanes = (" With fork-join a lane only recurses once the lane pool is used up, so a larger "
                 "`max_lanes=` also helps." if forked else "")
        super().__init__(
            f"recursion deeper than max_stack_depth={max_stack_depth} in {len(examples)} example(s): "
            f"{shown}{more}.\nHint: pass a larger `max_stack_depth=` to pcbatch.autobatch.{lanes}"
        )


class MaxStepsExceededError(PcbatchError):
    """The machine ran `max_steps` iterations and some examples had not finished."""

    def __init__(self, examples: list[int], max_steps: int, where: list[str]):
        self.examples = examples
        self.max_steps = max_steps
        shown = ", ".join(where[:10])
        super().__init__(
            f"{len(examples)} example(s) still running after max_steps={max_steps} VM steps: {shown}.\n"
            "Hint: a loop may not terminate for these inputs; otherwise raise `max_steps=`. With a "
            "bound the scheduler takes turns (no example starves the others), which can take a few "
            "more steps than an unbounded run's `status.steps`."
        )


class ExampleError(PcbatchError):
    """Some examples reached a `raise`, a failed `assert` or a `range()` step
    of 0: where Python raises. The other examples' results were computed."""

    def __init__(self, examples: list[int], where: dict[int, tuple[str, Loc | None]], also: str = ""):
        self.examples = examples
        self.where = where  # example -> (the statement, or what went wrong; its line), for those listed
        shown = examples[:10]
        groups: dict[tuple[str, Loc | None], list[int]] = {}
        for i in shown:
            groups.setdefault(where[i], []).append(i)
        parts = []
        for (text, loc), members in groups.items():
            names = ", ".join(map(str, members))
            # The quoted line says it where the statement is the whole line; else say what failed too.
            said = "" if loc is not None and loc.line.strip() == text else f" {text}"
            parts.append(f"example{'s' if len(members) > 1 else ''} {names}:{said}"
                         + (f"\n{loc.quote()}" if loc is not None else ""))
        more = "" if len(examples) <= 10 else f"\n(and {len(examples) - 10} more)"
        # `also`: other examples that did not finish either (overflow, max_steps): their results are not computed.
        others = (f"the other examples' results were computed, except {also}: "
                  "call `f.checked(...)` to get them with the flags (`status.failed`, `status.overflow`, "
                  "`status.unfinished`).") if also else (
                  "the other examples' results were computed: call `f.checked(...)` to get them with the flags "
                  "(`status.failed`).")
        super().__init__(
            f"{len(examples)} example(s) failed where Python raises:\n" + "\n".join(parts) + more + "\n"
            "Hint: Python raises here for these examples; " + others
        )


class TapeOverflowError(PcbatchError):
    """A differentiated call recorded more than its gradient tape holds and
    the tape may not grow (inside `jit` this is a checkify error and NaN
    gradients instead)."""

    def __init__(self, tape_size: int, needed: int):
        self.tape_size = tape_size
        self.needed = needed
        super().__init__(
            f"the gradient tape overflowed: this call needs tape_size={needed} (rows per block per example), "
            f"the tape holds {tape_size}.\nHint: pass `tape_size={needed}` (or more) to pcbatch.autobatch or "
            "`f.with_options(tape_size=...)`; the tape's memory grows with it."
        )


class ForwardModeError(PcbatchError, TypeError):
    """Kept for code that catches it: pcbatch no longer raises it. Forward
    mode works everywhere, forward over reverse (`jax.hessian`) and forward
    mode of a `jit`-compiled caller included."""

    def __init__(self, name: str):
        super().__init__(f"forward-mode differentiation through autobatched `{name}`")


class ArgumentError(PcbatchError, TypeError, ValueError):
    """A call's arguments do not fit the function or `in_axes` (also a
    `TypeError`/`ValueError`, as `jax.vmap` raises for the same input)."""

    def __init__(self, function: str, message: str, hint: str = ""):
        self.function = function
        super().__init__(f"{function}: {message}" + (f"\nHint: {hint}" if hint else ""))


class OptionError(PcbatchError, TypeError, ValueError):
    """An option given to `pcbatch.autobatch` (or `with_options`) is not valid."""

    def __init__(self, option: str, message: str, hint: str = ""):
        self.option = option
        super().__init__(f"{option}: {message}" + (f"\nHint: {hint}" if hint else ""))
