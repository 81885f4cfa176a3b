"""The scheduler interface: how the machine asks which block to run next.

A scheduler runs *inside* the `lax.while_loop`, so it is pure traced JAX: it
sees a `Frontier` (where every lane is waiting) and returns one block index.
It may keep a small carry of its own between steps.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from pcbatch.errors import OptionError
from pcbatch.ir.core import Return


class Frontier(NamedTuple):
    """What a scheduler may look at each VM step.

    pc:     int32[lanes] block each lane waits at; `num_blocks` means halted
            (or, with fork-join, blocked on children).
    counts: int32[num_blocks] number of ready lanes per block.
    depth:  int32[lanes] blocks each lane's thread has executed so far
            (its topological depth in the executed chain/DAG).
    earliest: the lowest block with a ready lane, where the machine knows it
            cheaper than `min(pc)` (the fork-join pool: from `counts`, not
            from every lane of the pool), or None.
    """

    pc: jax.Array
    counts: jax.Array
    depth: jax.Array
    earliest: jax.Array | None = None


class Scheduler(Protocol):
    """Chooses the next block. `choose` must return a block with counts > 0
    whenever any count is positive.

    A scheduler may also name `follow`: blocks the plain machine runs after
    the chosen one in every step, in that order, each for the lanes waiting
    at it then (a lane can pass through several in one step). Cheap control
    blocks between two expensive ones then cost no steps of their own
    (`pcbatch.ir.flow.follow_order` gives an order). A chosen block that is
    also followed runs once, in its place in that order."""

    def init(self, num_blocks: int, num_lanes: int) -> Any: ...

    def choose(self, carry: Any, frontier: Frontier) -> tuple[jax.Array, Any]: ...


class Earliest:
    """Radul et al.'s default: the lowest-numbered block with a ready lane."""

    name = "earliest"

    def init(self, num_blocks: int, num_lanes: int) -> Any:
        return ()

    def choose(self, carry: Any, frontier: Frontier) -> tuple[jax.Array, Any]:
        if frontier.earliest is not None:
            return frontier.earliest, carry
        # Halted lanes sit at num_blocks, so the minimum pc is the earliest ready block.
        return jnp.min(frontier.pc), carry

    def __call__(self, sim: Any) -> int:
        """The host twin (a policy for `fsm.simulate`)."""
        return int(np.argmax(sim.counts > 0))

    def __repr__(self) -> str:
        return "Earliest()"


class ReturnsLast:
    """The earliest ready block that does not end in a return; a returning
    block only when nothing else is ready. With fork-join this starts
    children as early as possible and lets finished work (leaves, joins)
    pile up to be run together: about 3 steps per tree level for a TreeLSTM,
    where earliest-block takes about 4."""

    name = "returns_last"

    def __init__(self, returns: tuple[bool, ...] | None = None):
        self.returns = returns

    def for_program(self, prog: Any) -> "ReturnsLast":
        return ReturnsLast(tuple(isinstance(b.term, Return) for b in prog.blocks))

    def init(self, num_blocks: int, num_lanes: int) -> Any:
        return ()

    def _rank(self, n: int) -> np.ndarray:
        """Each block's rank among ready ones: returning blocks after all others."""
        returns = np.asarray(self.returns if self.returns is not None else (False,) * n)
        return np.arange(n) + returns * n

    def choose(self, carry: Any, frontier: Frontier) -> tuple[jax.Array, Any]:
        n = frontier.counts.shape[0]
        key = jnp.where(frontier.counts > 0, jnp.asarray(self._rank(n)), 2 * n)
        return jnp.argmin(key).astype(jnp.int32), carry

    def __call__(self, sim: Any) -> int:
        """The host twin (a policy for `fsm.simulate`)."""
        n = sim.counts.shape[0]
        return int(np.argmin(np.where(sim.counts > 0, self._rank(n), 2 * n)))

    def __repr__(self) -> str:
        return "ReturnsLast()"


class Auto:
    """The default: `Earliest` for programs without forks, `ReturnsLast` with them."""

    name = "auto"

    def for_program(self, prog: Any) -> Any:
        return ReturnsLast().for_program(prog) if prog.has_forks else Earliest()

    def init(self, num_blocks: int, num_lanes: int) -> Any:
        return ()

    def choose(self, carry: Any, frontier: Frontier) -> tuple[jax.Array, Any]:
        return Earliest().choose(carry, frontier)

    def __repr__(self) -> str:
        return "Auto()"


class Fair:
    """Any scheduler, made starvation-free: a block whose lanes have been
    ready for `patience` steps runs next. Used when `max_steps` is set, so
    that one runaway example (a loop that never ends keeps its blocks the
    earliest ready ones) cannot keep the others from finishing."""

    def __init__(self, inner: Any, patience: int | None = None):
        self.inner, self.patience = inner, patience
        self.name = f"fair({getattr(inner, 'name', inner)})"

    def for_program(self, prog: Any) -> "Fair":
        # Every ready block runs at least once per ~patience steps: the others
        # keep at least a 1/(2 * blocks) share of the machine.
        return Fair(bind(self.inner, prog), 2 * prog.num_blocks)

    def init(self, num_blocks: int, num_lanes: int) -> Any:
        return self.inner.init(num_blocks, num_lanes), jnp.zeros(num_blocks, jnp.int32)

    @property
    def follow(self) -> tuple[int, ...]:
        return tuple(getattr(self.inner, "follow", ()))

    def choose(self, carry: Any, frontier: Frontier) -> tuple[jax.Array, Any]:
        inner_carry, waited = carry
        block, inner_carry = self.inner.choose(inner_carry, frontier)
        ready = frontier.counts > 0
        waited = jnp.where(ready, waited + 1, 0)
        patience = self.patience if self.patience is not None else 2 * waited.shape[0]
        overdue = jnp.where(ready, waited, -1)
        block = jnp.where(jnp.max(overdue) >= patience, jnp.argmax(overdue), block).astype(jnp.int32)
        return block, (inner_carry, waited.at[block].set(0))

    def __repr__(self) -> str:
        return f"Fair({self.inner!r})"


class Guarded:
    """A scheduler written outside pcbatch, its answers checked in the loop:
    an index outside the program's blocks, or a block no lane waits at, runs
    the earliest ready block instead (the pool would read a negative index
    from the end of its queues while its switch clamped it: wrong lanes, wrong
    results; a block without lanes would repeat forever). An answer that is
    not an integer scalar is an `OptionError` when the machine is traced."""

    def __init__(self, inner: Any):
        self.inner = inner

    @property
    def name(self) -> str:
        return getattr(self.inner, "name", type(self.inner).__name__)

    @property
    def follow(self) -> tuple[int, ...]:
        return tuple(getattr(self.inner, "follow", ()))

    def for_program(self, prog: Any) -> "Guarded":
        follow = self.follow
        bad = [b for b in follow if isinstance(b, bool) or not isinstance(b, (int, np.integer))
               or not 0 <= b < prog.num_blocks]
        if bad:
            raise OptionError("schedule", f"follow names blocks {bad[:5]} outside the program's "
                                          f"{prog.num_blocks} blocks (0..{prog.num_blocks - 1})")
        return Guarded(bind(self.inner, prog))

    def init(self, num_blocks: int, num_lanes: int) -> Any:
        return self.inner.init(num_blocks, num_lanes)

    def choose(self, carry: Any, frontier: Frontier) -> tuple[jax.Array, Any]:
        answer = self.inner.choose(carry, frontier)
        if not (isinstance(answer, tuple) and len(answer) == 2):
            raise OptionError("schedule", f"{self.inner!r}.choose must return (block, carry), got {answer!r}")
        block, new_carry = answer
        if jax.tree_util.tree_structure(new_carry) != jax.tree_util.tree_structure(carry):
            raise OptionError("schedule", f"{self.inner!r}.choose must return its carry in the structure init "
                                          f"gave it: {jax.tree_util.tree_structure(carry)}, got "
                                          f"{jax.tree_util.tree_structure(new_carry)}")
        _check_carry_leaves(self.inner, carry, new_carry)
        carry = new_carry
        if isinstance(block, (int, np.integer)) and not isinstance(block, bool):
            # A Python int past int32 would overflow in jnp.asarray: any such answer is out of range.
            block = int(np.clip(block, -1, np.iinfo(np.int32).max))
        block = jnp.asarray(block)
        if block.shape != () or not jnp.issubdtype(block.dtype, jnp.integer):
            raise OptionError("schedule", f"{self.inner!r}.choose must return an integer scalar block index, "
                                          f"got {block.dtype}{list(block.shape)}")
        num_blocks = frontier.counts.shape[0]
        earliest = jnp.minimum(Earliest().choose((), frontier)[0], num_blocks).astype(frontier.counts.dtype)
        ready = frontier.counts[jnp.clip(block, 0, num_blocks - 1)] > 0
        ok = (block >= 0) & (block < num_blocks) & ready
        return jnp.where(ok, block.astype(earliest.dtype), earliest), carry

    def __call__(self, sim: Any) -> int:
        return self.inner(sim)

    def __repr__(self) -> str:
        return repr(self.inner)


def _check_carry_leaves(inner: Any, carry: Any, new_carry: Any) -> None:
    """A carry leaf whose shape or dtype `choose` changed is a named error (the
    loop's own message would speak of `s.sched` and `while_loop`). A Python
    number that init gave is weakly typed: the loop promotes it to the dtype
    choose returns."""
    paths = jax.tree_util.tree_flatten_with_path(carry)[0]
    for (path, old), new in zip(paths, jax.tree_util.tree_leaves(new_carry)):
        old_type = (np.shape(old), jnp.result_type(old))
        new_type = (np.shape(new), old_type[1] if jax.typeof(old).weak_type else jnp.result_type(new))
        if new_type != old_type:
            where = jax.tree_util.keystr(path) or "the carry"
            raise OptionError("schedule", f"{inner!r}.choose must return its carry with the shapes and dtypes "
                                          f"init gave it: {where} was {old_type[1]}{list(old_type[0])}, choose "
                                          f"returned {new_type[1]}{list(new_type[0])}",
                              "cast it back, e.g. `carry.astype(jnp.int32)`.")


def guarded(scheduler: Any) -> Any:
    """`scheduler`, checked (`Guarded`) unless it is one of pcbatch's own."""
    if isinstance(scheduler, Guarded) or type(scheduler).__module__.split(".")[0] == "pcbatch":
        return scheduler
    return Guarded(scheduler)


def bind(scheduler: Any, prog: Any) -> Any:
    """The scheduler specialised to a program, for those that look at it."""
    return scheduler.for_program(prog) if hasattr(scheduler, "for_program") else scheduler
