"""A learned FSM batching policy (ED-Batch §2.2): frontier state -> next block.

The state is an encoding of which blocks have ready lanes:

- ``base``: E_base, the set of blocks with a ready lane, ascending.
- ``max``:  E_max, the most common ready block (lowest on ties), then E_base.
- ``sort``: E_sort, the blocks with a ready lane, most ready lanes first
  (ties: lower block first).

On the host a state is a tuple of block indices.  On the device it is the same
tuple padded with ``num_types`` to a fixed width, computed from
`Frontier.counts` (one argsort) and matched exactly against the rows of a
table compiled into the program: the key is hashed (uint32), found by binary
search among the table's sorted hashes and checked against that one row, so a
step costs O(log rows), with no host round trip, for any number of blocks.

A state missing from the table falls back to the earliest ready block, or,
for a policy given `returns` (which blocks end in a return: fork-join
programs, whose default is `ReturnsLast`), the earliest ready block that does
not return; so does a table action that is not ready, which a valid table
never has. Entries that choose the fallback's block anyway are left out of the
device table.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from pcbatch.errors import OptionError
from pcbatch.fsm.base import Frontier

if TYPE_CHECKING:  # the offline simulation: only a type here, never imported by the machine
    from pcbatch.fsm.simulation import Simulation

ENCODINGS = ("base", "max", "sort")
State = tuple[int, ...]
_FORMAT = "pcbatch.fsm.Policy/1"


def encode_state(counts: np.ndarray, encoding: str) -> State:
    """Host-side state encoding of the ready-lane counts per block (in Python:
    a handful of blocks, where NumPy's per-call overhead would dominate)."""
    c = counts.tolist()
    ready = [t for t, n in enumerate(c) if n > 0]
    if encoding == "base":
        return tuple(ready)
    if encoding == "max":
        return (max(range(len(c)), key=lambda t: (c[t], -t)), *ready)
    if encoding == "sort":
        # Most lanes first, the lower block first on ties (sorted is stable).
        return tuple(sorted(ready, key=lambda t: -c[t]))
    raise ValueError(f"unknown encoding {encoding!r}; expected one of {ENCODINGS}")


def encode_state_device(counts: jax.Array, encoding: str) -> jax.Array:
    """Device-side `encode_state`, padded with num_blocks to a static width."""
    num_blocks = counts.shape[0]
    ready = counts > 0
    if encoding == "sort":
        order = jnp.argsort(-counts, stable=True)
    else:
        order = jnp.argsort(~ready, stable=True)  # ready blocks first, ascending
    key = jnp.where(ready[order], order, num_blocks).astype(jnp.int32)
    if encoding == "max":
        key = jnp.concatenate([jnp.argmax(counts)[None].astype(jnp.int32), key])
    return key


# Odd multipliers for the state hash, tried in turn until a table's hashes are distinct.
_MULTIPLIERS = (0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F, 0x165667B1, 0xD3A2646C | 1, 0xFD7046C5, 0xB55A4F09)


def _hash(keys: Any, mult: Any) -> Any:
    """uint32 polynomial hash of the last axis of int32 `keys` (NumPy or JAX,
    the same wrapping arithmetic on both)."""
    xp = jnp if isinstance(keys, jax.Array) else np
    h = xp.zeros(keys.shape[:-1], xp.uint32)
    for k in range(keys.shape[-1]):
        h = h * mult + keys[..., k].astype(xp.uint32) + xp.uint32(1)  # wraps modulo 2**32
    return h


def key_width(num_types: int, encoding: str) -> int:
    """Length of the device-side state key."""
    return num_types + (encoding == "max")


class Policy:
    """A table state -> block, usable as a device `Scheduler` and a host policy.

    transitions: (from_state, to_state, count) seen when the policy was
    replayed on its training graphs.
    info: free-form training statistics (JSON-serialisable).
    """

    name = "fsm"

    def __init__(
        self,
        num_types: int,
        encoding: str,
        table: Mapping[State, int],
        transitions: Sequence[tuple[State, State, int]] = (),
        info: Mapping[str, Any] | None = None,
        returns: Sequence[bool] | None = None,
    ) -> None:
        if encoding not in ENCODINGS:
            raise ValueError(f"unknown encoding {encoding!r}; expected one of {ENCODINGS}")
        self._lookup: dict[State, int] = {tuple(int(t) for t in s): int(a) for s, a in table.items()}
        for state, block in self._lookup.items():
            if block not in state or not all(0 <= t < num_types for t in state):
                raise ValueError(f"bad table entry {state} -> {block}")
        self.num_types = num_types
        self.encoding = encoding
        self.returns = None if returns is None else tuple(bool(r) for r in returns)
        if self.returns is not None and len(self.returns) != num_types:
            raise ValueError(f"returns names {len(self.returns)} blocks, not {num_types}")
        # The fallback's order: the earliest ready block first (returning ones last, given `returns`).
        self._rank = np.arange(num_types) + (num_types * np.asarray(self.returns, np.int64)
                                             if self.returns is not None else 0)
        # Deterministic order: shorter states first, then lexicographic.
        self.states: list[State] = sorted(self._lookup, key=lambda s: (len(s), s))
        self.actions: list[int] = [self._lookup[s] for s in self.states]
        index = {s: i for i, s in enumerate(self.states)}
        # As (from_index, to_index, count) into self.states.
        self.transitions = [(index[tuple(a)], index[tuple(b)], int(n)) for a, b, n in transitions]
        self.info = dict(info or {})

    def fallback(self, state: State) -> int:
        """The block the policy runs in `state` without a table entry."""
        return min(state, key=lambda t: self._rank[t])

    def lookup(self, state: State) -> int | None:
        """The block the table chooses in `state`, or None for an unseen state."""
        return self._lookup.get(state)

    # -- host side -------------------------------------------------------------

    def __call__(self, sim: Simulation) -> int:
        block = self.lookup(encode_state(sim.counts, self.encoding))
        if block is None or sim.counts[block] == 0:
            return int(np.argmin(np.where(sim.counts > 0, self._rank, 2 * self.num_types)))
        return block

    # -- device side (the `Scheduler` protocol) --------------------------------

    @cached_property
    def _device_table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.uint32]:
        """(hashes, keys, actions, multiplier): the entries' state keys, sorted by hash."""
        # Entries choosing the fallback's block are left out.
        rows = [(s, a) for s, a in zip(self.states, self.actions) if a != self.fallback(s)]
        keys = np.full((len(rows), key_width(self.num_types, self.encoding)), self.num_types, np.int32)
        for i, (state, _) in enumerate(rows):
            keys[i, : len(state)] = state
        actions = np.asarray([a for _, a in rows], np.int32)
        # A multiplier under which no two entries' hashes collide (a collision
        # would only send one of them to the fallback, but there is no need).
        for mult in _MULTIPLIERS:
            hashes = _hash(keys, np.uint32(mult))
            if np.unique(hashes).size == hashes.size:
                break
        order = np.argsort(hashes, kind="stable")
        return hashes[order], keys[order], actions[order], np.uint32(mult)

    def init(self, num_blocks: int, num_lanes: int) -> Any:
        if num_blocks != self.num_types:
            raise OptionError("schedule", f"this policy was learned for a program of {self.num_types} blocks; the "
                                          f"one running has {num_blocks}",
                              "learn it with pcbatch.fsm.learn on the same function, options and argument types "
                              "(fork=True and fork=False lower to different programs)")
        return ()

    def choose(self, carry: Any, frontier: Frontier) -> tuple[jax.Array, Any]:
        counts = frontier.counts
        if self.returns is None:
            fallback = jnp.argmax(counts > 0).astype(jnp.int32)
        else:
            rank = jnp.asarray(self._rank, jnp.int32)
            fallback = jnp.argmin(jnp.where(counts > 0, rank, 2 * self.num_types)).astype(jnp.int32)
        hashes, keys, actions, mult = self._device_table
        if not len(hashes):
            return fallback, carry
        # The state's key, hashed, then a binary search and one row compared:
        # O(log entries) per step, not a compare against every entry.
        key = encode_state_device(counts, self.encoding)
        h = _hash(key, jnp.uint32(mult))
        row = jnp.minimum(jnp.searchsorted(jnp.asarray(hashes), h), len(hashes) - 1)
        block = jnp.asarray(actions)[row]
        ok = (jnp.asarray(hashes)[row] == h) & jnp.all(jnp.asarray(keys)[row] == key) & (counts[block] > 0)
        return jnp.where(ok, block, fallback).astype(jnp.int32), carry

    # -- inspection and persistence ----------------------------------------------

    def table(self, names: Sequence[str] | None = None) -> str:
        """The table as text, one ``state -> block`` line per state."""
        label = (lambda t: names[t]) if names is not None else str
        order = {
            "base": "ready blocks",
            "max": "most ready, then ready blocks",
            "sort": "ready blocks, most lanes first",
        }
        lines = [
            f"FSM policy: encoding={self.encoding}, {len(self.states)} states, "
            f"unseen states run the earliest ready block{' that does not return' if self.returns else ''}",
            f"state ({order[self.encoding]}) -> block to run",
        ]
        lines += [f"[{', '.join(label(t) for t in s)}] -> {label(a)}" for s, a in zip(self.states, self.actions)]
        return "\n".join(lines)

    def graph(self) -> dict[str, list]:
        """The FSM as plain data: states, chosen blocks, transitions seen.

        ``{"states": [[block, ...], ...], "chosen": [block, ...],
        "transitions": [(from_index, to_index, count), ...]}``
        """
        return {
            "states": [list(s) for s in self.states],
            "chosen": list(self.actions),
            "transitions": list(self.transitions),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "format": _FORMAT,
            "num_types": self.num_types,
            "encoding": self.encoding,
            "states": [list(s) for s in self.states],
            "actions": self.actions,
            "transitions": [list(t) for t in self.transitions],
            "info": self.info,
            **({"returns": list(self.returns)} if self.returns is not None else {}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Policy:
        if data.get("format") != _FORMAT:
            raise ValueError(f"not a saved policy (format {data.get('format')!r})")
        states = [tuple(s) for s in data["states"]]
        table = dict(zip(states, data["actions"], strict=True))
        transitions = [(states[a], states[b], n) for a, b, n in data["transitions"]]
        return cls(data["num_types"], data["encoding"], table, transitions, data["info"], data.get("returns"))

    def save(self, path: str | os.PathLike) -> None:
        with open(path, "w") as f:
            json.dump(self.to_json(), f, indent=1)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Policy:
        with open(path) as f:
            return cls.from_json(json.load(f))

    def __repr__(self) -> str:
        return f"Policy(encoding={self.encoding!r}, num_types={self.num_types}, states={len(self.states)})"
