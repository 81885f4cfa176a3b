"""Sharding the batch over devices: one machine and one scheduler per device.

A single `lax.while_loop` over a batch sharded across devices would have to
agree, every step, on which block runs next (an all-reduce per step) and would
make every device wait for the slowest. Instead `jax.shard_map` runs the
ordinary machine (`pcbatch.runtime`) on each device's shard of the batch, with
its own scheduler, stacks and (fork-join) lane pool sized from the per-device
batch. Nothing inside the loop communicates; a device whose examples finish
early stops looping. The runtime knows nothing about meshes: this module pads
the batch to a multiple of the device count, marks the padding inactive (it
starts halted and runs no block), maps the machine over the mesh axis and
removes the padding again.

    mesh = jax.make_mesh((4,), ("batch",))
    f = pcbatch.autobatch(fib, mesh=mesh)               # or f.with_options(mesh=mesh)
    with pcbatch.sharded(mesh):                         # or every call in a block
        out = nuts.sample(...)

Results keep the batch sharding: their leading axis is sharded over the mesh
axis. (When the device count does not divide the batch, the padding is cut off
and the result comes back replicated.) Shared (`in_axes=None`) arguments are
replicated. In `Status`, the per-example fields are global (indices are global
example indices); `steps` is the most steps any device took and `peak_lanes`
the sum of each device's peak, less the padding examples' lanes.

A mesh may span several processes (`jax.distributed`): each process passes its
part of the batch as a global array (`jax.make_array_from_process_local_data`)
or the whole batch as a NumPy array; nothing changes inside the loop. Results
stay global arrays; the per-example status fields are gathered after the loop
(every process must read them to raise the same error). Gradients are not
supported there (`undifferentiable`): the tape machine is not sharded.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from pcbatch.errors import OptionError
from pcbatch.runtime import Status

__all__ = ["BatchSharding", "check_global_inputs", "current", "sharded"]

tree_map = jax.tree_util.tree_map

# `machine(batch, inputs, workspace, active) -> (result, status, workspace)`:
# the single-device machine for a (per-device) batch.
MachineFn = Callable[[int, dict[str, Any], Any, jax.Array], tuple[Any, Status, Any]]


@dataclass(frozen=True)
class BatchSharding:
    """The batch axis sharded over `axis` (a name or a tuple of names) of `mesh`;
    other mesh axes, if any, hold replicas. Hashable: part of the compile cache key."""

    mesh: Mesh
    axis: str | tuple[str, ...]

    @staticmethod
    def of(mesh: Any, axis_name: Any = None) -> "BatchSharding":
        """Validate `autobatch`'s `mesh=` / `axis_name=`."""
        if not isinstance(mesh, Mesh):
            raise OptionError("mesh", f"must be a jax.sharding.Mesh (e.g. jax.make_mesh((4,), ('batch',))), "
                                      f"got {type(mesh).__name__}")
        names = tuple(mesh.axis_names)
        if axis_name is None:
            if len(names) != 1:
                raise OptionError("axis_name", f"the mesh has axes {names}: say which the batch is sharded "
                                               f"over, e.g. axis_name={names[0]!r}")
            axis_name = names[0]
        axes = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
        unknown = [a for a in axes if a not in names]
        if unknown or not axes:
            raise OptionError("axis_name", f"{axis_name!r} is not an axis of the mesh (its axes: {names})")
        kinds = {mesh.axis_types[names.index(a)] for a in axes}
        if len(kinds) > 1:
            raise OptionError("axis_name", f"the batch axes {axes} mix axis types {sorted(map(str, kinds))}: make "
                                           "them all Explicit or all Auto (jax.make_mesh(..., axis_types=...))")
        return BatchSharding(mesh, axes[0] if len(axes) == 1 else axes)

    @property
    def axes(self) -> tuple[str, ...]:
        return self.axis if isinstance(self.axis, tuple) else (self.axis,)

    @property
    def explicit(self) -> bool:
        """Whether the batch axes are `AxisType.Explicit` (`jax.make_mesh`'s
        default): arrays then carry their sharding in their type, and data
        moves only where we say so (`jax.reshard`)."""
        names = tuple(self.mesh.axis_names)
        return all(self.mesh.axis_types[names.index(a)] == AxisType.Explicit for a in self.axes)

    def _reshard(self, x: Any, spec: PartitionSpec) -> Any:
        # Auto axes: shard_map and XLA move the data as the specs say.
        return jax.reshard(x, NamedSharding(self.mesh, spec)) if self.explicit else x

    def _replicate(self, x: Any) -> Any:
        """`x` on every device (an all-gather, outside the loop). Auto axes
        too: there XLA would otherwise be free to leave it sharded."""
        replicated = NamedSharding(self.mesh, PartitionSpec())
        return jax.reshard(x, replicated) if self.explicit else jax.lax.with_sharding_constraint(x, replicated)

    @property
    def multi_process(self) -> bool:
        """Whether the mesh spans several processes (`jax.distributed`): then no
        process can read a batch-sharded array whole."""
        return self.mesh.is_multi_process

    @property
    def devices(self) -> int:
        """How many shards the batch is cut into."""
        return math.prod(self.mesh.shape[a] for a in self.axes)

    def per_device(self, batch: int) -> int:
        """Examples per device: the batch padded up to a multiple of `devices`."""
        return -(-batch // self.devices)

    def runner(self, machine: MachineFn, batch: int, shared: dict[str, bool]) -> Callable:
        """`jit`ted `(inputs, workspace) -> (result, status, workspace)` for a
        global batch: each device runs `machine` on its shard. `shared[p]`:
        entry parameter `p` is the same for every example (replicated);
        `workspace` (see `new_workspace`) is donated."""
        devices, local = self.devices, self.per_device(batch)
        padded = devices * local
        split = PartitionSpec(self.axis)

        def shard(inputs, active, workspace):
            # The workspace has a leading device axis, one block per device, so
            # this module need not know where the runtime keeps its lane axis.
            result, status, workspace = machine(local, inputs, tree_map(lambda x: x[0], workspace), active)
            # Scalars become one entry per device, reduced outside the loop.
            status = status._replace(steps=status.steps[None], peak_lanes=status.peak_lanes[None])
            return result, status, tree_map(lambda x: x[None], workspace)

        def run(inputs, workspace):
            if padded > batch:
                # Copies of the last example: well-defined inputs for the prelude
                # (per-example invariants); they never run a block.
                pad = lambda x: jnp.pad(x, [(0, padded - batch)] + [(0, 0)] * (x.ndim - 1), mode="edge")  # noqa: E731
                inputs = {p: x if shared[p] else tree_map(pad, x) for p, x in inputs.items()}
            inputs = {p: tree_map(lambda a: self._reshard(a, PartitionSpec() if shared[p] else split), x)
                      for p, x in inputs.items()}
            active = self._reshard(jnp.arange(padded) < batch, split)
            workspace = tree_map(lambda a: self._reshard(a, split), workspace)  # made inside a trace: unplaced
            in_specs = ({p: PartitionSpec() if shared[p] else split for p in inputs}, split, split)
            out_specs = (split, Status(*[split] * len(Status._fields)), split)
            # check_vma=False: every output is split over the axis (nothing is
            # claimed replicated), so there is nothing for the check to prove.
            mapped = jax.shard_map(shard, mesh=self.mesh, in_specs=in_specs, out_specs=out_specs,
                                   check_vma=False)
            result, status, workspace = mapped(inputs, active, workspace)
            if padded > batch:
                # Cutting the padding leaves a batch the devices do not divide:
                # the result comes back replicated (XLA does the same for Auto axes).
                cut = lambda x: self._replicate(x)[:batch]  # noqa: E731
                result = tree_map(cut, result)
                status = status._replace(**{f: cut(getattr(status, f))
                                            for f in ("overflow", "unfinished", "failed", "pc", "blocks_run")})
            elif self.multi_process:
                # Every process reads the per-example flags to raise the same
                # error for the same examples; a small all-gather after the loop.
                status = status._replace(**{f: self._replicate(getattr(status, f))
                                            for f in ("overflow", "unfinished", "failed", "pc", "blocks_run")})
            # Each padding example holds its lane (halted) on its device: not a lane the batch used.
            peak = jnp.sum(status.peak_lanes) - (padded - batch)
            status = status._replace(steps=jnp.max(status.steps), peak_lanes=peak.astype(status.peak_lanes.dtype))
            return result, status, workspace

        return jax.jit(run, donate_argnums=(1,))

    def undifferentiable(self, primal: Callable) -> Callable:
        """`primal` (the sharded machine, `inputs -> (result, status)`), raising
        `OptionError` when differentiated. Gradients (`pcbatch/runtime/grad/`)
        record and replay one machine over the whole batch; over a multi-process
        mesh no process holds the whole batch, so that machine cannot run there.
        Undifferentiated calls (inside `jax.jit` too) run the sharded machine."""

        @jax.custom_vjp
        def call(inputs):
            return primal(inputs)

        def fwd(inputs):
            raise OptionError("mesh", f"gradients through an autobatched call over a mesh that spans "
                                      f"{len({d.process_index for d in self.mesh.devices.flat})} processes "
                                      "(jax.distributed) are not supported yet",
                              "differentiate on a single-process mesh (each process on its own devices, "
                              "e.g. jax.make_mesh(..., devices=jax.local_devices())) and combine the "
                              "gradients yourself, or call without differentiating.")

        def bwd(res, ct):  # never reached: fwd raises
            raise AssertionError("unreachable")

        call.defvjp(fwd, bwd)
        return call

    def new_workspace(self, shapes: Any) -> Any:
        """A zero workspace for every device: `shapes` (one device's, as
        `pcbatch.runtime.run.workspace_shapes`) with a leading device axis,
        each device's block allocated on that device."""
        sharding = NamedSharding(self.mesh, PartitionSpec(self.axis))
        make = jax.jit(lambda: tree_map(lambda s: jnp.zeros((self.devices,) + s.shape, s.dtype), shapes),
                       out_shardings=tree_map(lambda _: sharding, shapes))
        return make()


def check_global_inputs(sharding: BatchSharding | None, leaves: list[Any]) -> None:
    """Arguments that span several processes (global `jax.Array`s under
    `jax.distributed`) need a `mesh=` over those processes: without one, the
    single machine would be partitioned by XLA (collectives every step) and no
    process could read the status it must check."""
    if jax.process_count() == 1:  # nothing can span processes (and this runs on every call)
        return
    spanning = [x for x in leaves if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)
                and not x.is_fully_addressable]
    if spanning and (sharding is None or not sharding.multi_process):
        raise OptionError("mesh", "an argument is a jax.Array that spans several processes (jax.distributed), "
                                  "but the call " + ("has no mesh" if sharding is None else
                                                     "has a mesh of this process's devices only"),
                          "pass the global mesh the array is sharded over: pcbatch.autobatch(..., mesh=mesh), "
                          "f.with_options(mesh=mesh) or `with pcbatch.sharded(mesh):`.")


_current: contextvars.ContextVar[BatchSharding | None] = contextvars.ContextVar("pcbatch_sharding", default=None)


def current(own: BatchSharding | None = None) -> BatchSharding | None:
    """The sharding a call uses: the function's own (`autobatch(mesh=...)`),
    else the innermost `with pcbatch.sharded(...)`, else none."""
    return own if own is not None else _current.get()


@contextlib.contextmanager
def sharded(mesh: Mesh, axis_name: str | tuple[str, ...] | None = None) -> Iterator[BatchSharding]:
    """Shard the batch of every autobatched call in the block over `mesh`,
    one machine per device (for functions without their own `mesh=`). Useful
    for library code built on `autobatch`, such as `pcbatch.mcmc.nuts.sample`.
    Read when a call is traced: inside `jax.jit`, enter it around the traced code.

    >>> import jax, jax.numpy as jnp, pcbatch
    >>> @pcbatch.autobatch
    ... def halvings(n):
    ...     k = 0
    ...     while n > 1:
    ...         n = n // 2
    ...         k += 1
    ...     return k
    >>> mesh = jax.make_mesh((len(jax.devices()),), ("batch",))
    >>> with pcbatch.sharded(mesh):
    ...     halvings(jnp.array([1, 2, 8, 1000]))
    Array([0, 1, 3, 9], dtype=int32)
    """
    token = _current.set(BatchSharding.of(mesh, axis_name))
    try:
        yield _current.get()
    finally:
        _current.reset(token)
