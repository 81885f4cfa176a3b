"""`autobatch`'s options: one frozen dataclass, validated once."""
from __future__ import annotations

import difflib
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from pcbatch.errors import OptionError
from pcbatch.fsm import get_scheduler
from pcbatch.runtime.options import Tuning


# What each option is for, said when its value is bad.
HINTS = {
    "max_stack_depth": "the deepest recursion (active frames) any example may reach, e.g. max_stack_depth=256.",
    "max_steps": "a bound on the machine's steps, e.g. max_steps=100_000; None (the default) for no bound.",
    "max_lanes": "the fork-join lane pool, e.g. max_lanes=4096; None (the default) sizes it from the batch.",
    "lane_width": "the most lanes one step runs, e.g. lane_width=256; None (the default) sizes it from the batch.",
    "tape_size": "gradient tape rows per block per example, e.g. tape_size=1024 (see f.tape_info); None (the "
                 "default) starts at 256 and grows outside jit.",
    "layout": "True (blocks with a matmul group), 'all' (wherever a group is found) or False (off).",
    "fork": "True runs independent calls in lanes of their own; False gives one lane per example; 'auto' (the "
            "default) picks fork-join where it is expected to pay (see pcbatch.fork_choice).",
}


def _positive_int(name: str, value: Any, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise OptionError(name, f"must be a positive int{' or None' if optional else ''}, got {value!r}",
                          HINTS[name])


@dataclass(frozen=True, eq=False)
class Options:
    """Everything `pcbatch.autobatch` accepts besides the function (see its
    docstring for each one's meaning). Build it with keywords; a bad value
    raises `OptionError` naming the option, here and nowhere later.

    >>> import pcbatch
    >>> opts = pcbatch.Options(max_stack_depth=128, fork=False)
    >>> opts.replace(max_steps=10_000).max_steps
    10000
    """

    in_axes: Any = 0
    max_stack_depth: int = 64
    max_steps: int | None = None
    schedule: Any = "auto"
    fork: bool | str = "auto"
    max_lanes: int | None = None
    lane_width: int | None = None
    layout: bool | str = True
    mesh: Any = None
    axis_name: Any = None
    tape_size: int | None = None
    tuning: Tuning | None = None  # None: Tuning(), the defaults

    def __post_init__(self) -> None:
        _positive_int("max_stack_depth", self.max_stack_depth)
        for name in ("max_steps", "max_lanes", "lane_width", "tape_size"):
            _positive_int(name, getattr(self, name), optional=True)
        if not (self.layout is True or self.layout is False or self.layout == "all"):
            raise OptionError("layout", f"must be True, False or 'all', got {self.layout!r}", HINTS["layout"])
        if not (self.fork is True or self.fork is False or (isinstance(self.fork, str) and self.fork == "auto")):
            raise OptionError("fork", f"must be True, False or 'auto', got {self.fork!r}", HINTS["fork"])
        if self.axis_name is not None and self.mesh is None:
            raise OptionError("axis_name", f"needs mesh= (the jax.sharding.Mesh whose axis it names), got "
                              f"{self.axis_name!r} alone",
                              "pass mesh= too, or use `with pcbatch.sharded(mesh, axis_name=...)`.")
        if self.tuning is None:
            object.__setattr__(self, "tuning", Tuning())
        if not isinstance(self.tuning, Tuning):
            raise OptionError("tuning", f"must be a pcbatch.Tuning, got {type(self.tuning).__name__}",
                              "pcbatch.Tuning(large_register_bytes=..., ...)")
        get_scheduler(self.schedule)  # raises for an unknown schedule

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def of(cls, **options: Any) -> "Options":
        """`Options(**options)`, with an unknown name a named error (and a guess)."""
        check_names(options)
        return cls(**options)

    def replace(self, **changes: Any) -> "Options":
        """A copy with some options changed (validated)."""
        check_names(changes)
        return replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.names()}


def check_names(options: dict[str, Any]) -> None:
    known = Options.names()
    unknown = sorted(set(options) - set(known))
    if unknown:
        guesses = [g for u in unknown for g in difflib.get_close_matches(u, known, n=1)]
        hint = (f"did you mean {', '.join(guesses)}? " if guesses else "") + f"The options are {', '.join(known)}."
        raise OptionError(", ".join(unknown), "unknown autobatch option" + ("s" if len(unknown) > 1 else ""), hint)
