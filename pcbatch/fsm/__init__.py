"""Schedulers: which block the machine runs next."""
from __future__ import annotations

from typing import Any

from pcbatch.fsm.base import Earliest, Frontier, Scheduler

_BY_NAME: dict[str, Any] = {"earliest": Earliest}


def get_scheduler(schedule: Any) -> Scheduler:
    """A scheduler from its name, or the scheduler object itself."""
    if isinstance(schedule, str):
        if schedule not in _BY_NAME:
            raise ValueError(f"unknown schedule {schedule!r}; choose from {sorted(_BY_NAME)} or pass a scheduler")
        return _BY_NAME[schedule]()
    if not hasattr(schedule, "choose") or not hasattr(schedule, "init"):
        raise TypeError(f"schedule must be a name or have init() and choose(); got {schedule!r}")
    return schedule


__all__ = ["Earliest", "Frontier", "Scheduler", "get_scheduler"]
