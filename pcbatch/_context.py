"""Process-wide flags shared by the API and the code it traces."""
from __future__ import annotations

import contextlib
import threading

_state = threading.local()


def python_mode() -> bool:
    """True while `Autobatched.reference` runs the original Python."""
    return getattr(_state, "python", 0) > 0


def building() -> bool:
    """True while pcbatch traces a program's primitive code."""
    return getattr(_state, "building", 0) > 0


@contextlib.contextmanager
def _flag(name: str):
    setattr(_state, name, getattr(_state, name, 0) + 1)
    try:
        yield
    finally:
        setattr(_state, name, getattr(_state, name) - 1)


def in_python_mode():
    return _flag("python")


def in_building():
    return _flag("building")
