"""A function with some parameters fixed: what `functools.partial` and bound
methods give. The fixed values are constants of the program, like a closure's
variables (as `jax.vmap` treats them); the rest are its parameters."""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True, eq=False)
class BoundFunction:
    fn: Callable
    constants: tuple[tuple[str, Any], ...] = ()
    keyword_fixed: frozenset[str] = frozenset()  # fixed by a partial's keyword, not by position
    signature: inspect.Signature = field(init=False, repr=False)
    _full: inspect.Signature = field(init=False, repr=False)

    def __post_init__(self) -> None:
        fixed = {name for name, _ in self.constants}
        sig = inspect.signature(self.fn)
        object.__setattr__(self, "_full", sig)
        object.__setattr__(self, "signature", sig.replace(parameters=self._free(sig, fixed)))

    def _free(self, sig: inspect.Signature, fixed: set[str]) -> list[inspect.Parameter]:
        """The parameters left to the caller. As for `functools.partial`, those
        after one fixed by keyword take keywords only: `partial(f, a=1)(x)` on
        `f(a, b)` gives `x` to `a` (Python's TypeError), never to `b`."""
        free, keyword_only = [], False
        varargs = any(p.kind is p.VAR_POSITIONAL for p in sig.parameters.values())  # an error anyway
        for name, p in sig.parameters.items():
            keyword_only = keyword_only or (name in self.keyword_fixed and not varargs)
            if name not in fixed:
                free.append(p.replace(kind=p.KEYWORD_ONLY) if keyword_only and p.kind is p.POSITIONAL_OR_KEYWORD
                            else p)
        return free

    @property
    def qualname(self) -> str:
        return self.fn.__qualname__

    def _key(self) -> tuple:
        # The same function bound to the same objects (a method reached through
        # `self.f` twice gives two bound-method objects but one function).
        return (self.fn, tuple((name, id(value)) for name, value in self.constants))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BoundFunction) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Calls the Python function (the reference semantics)."""
        if not self.constants:  # the reference calls this once per Python call: no binding to pay for
            return self.fn(*args, **kwargs)
        bound = self.signature.bind(*args, **kwargs)
        values = {**dict(self.constants), **bound.arguments}
        params = self._full.parameters
        positional = [values[name] for name, p in params.items() if p.kind is p.POSITIONAL_ONLY and name in values]
        keywords = {name: values[name] for name, p in params.items() if p.kind is not p.POSITIONAL_ONLY
                    and name in values}
        return self.fn(*positional, **keywords)
