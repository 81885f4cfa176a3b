"""The pipeline, in order: a function to the compiled machine for one call.

    1. frontend   the function's source -> block IR (`pcbatch.frontend`)
    2. lower      block IR -> stack program, per set of shared parameters
                  (`pcbatch.lower`)
    3. specialize the stack program -> the argument types of this call
    4. layout     independent same-type ops batched on a PQ-tree memory
                  layout (`pcbatch.memory`)
    5. runtime    the `lax.while_loop` machine under `jax.jit` (or one per
                  device, `pcbatch.sharding`)

`executable` runs them top to bottom for one call `Signature` (which
parameters are shared, the batch, the shapes and dtypes, the sharding). One
`Cache` per autobatched function keeps what each stage made, keyed by what it
depends on: a second call of the same signature traces nothing, and a new
signature redoes only the stages after the ones it shares.
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

import jax
import jax.numpy as jnp
import numpy as np

from pcbatch import _context, differentiation
from pcbatch.errors import TypeMismatchError
from pcbatch.fork_choice import ForkChoice, choose_fork
from pcbatch.frontend import BoundFunction, convert_program, form_program
from pcbatch.fsm import Fair, Policy, get_scheduler
from pcbatch.ir.core import Program, StackProgram
from pcbatch.ir.webs import multi_web, split_webs, splittable, web_names
from pcbatch.lower import lower, specialize
from pcbatch.lower.constants import qualify
from pcbatch.lower.types import join as join_types
from pcbatch.memory import LayoutReport, layout_program
from pcbatch.options import Options
from pcbatch.runtime import MachineConfig, Status, run_machine
from pcbatch.runtime.dtypes import index_dtype, nbytes
from pcbatch.runtime.grad import Differentiable
from pcbatch.runtime.options import Tuning
from pcbatch.runtime.run import check_fits, new_workspace, step_tracer, workspace_shapes
from pcbatch.runtime.stacks import StackLayout
from pcbatch.runtime.steps import StepTrace

tree_util = jax.tree_util


@dataclass(frozen=True)
class Signature:
    """A call's cache key: everything its compiled machine depends on besides
    the function and its options. Per entry parameter, in order: whether the
    batch shares it, its tree structure and its leaves' shapes, dtypes and
    weak types (batch axis included; a Python number is weakly typed: `x * k`
    with `k=100` and `x` int8 stays int8); `index_dtype`: a machine built under
    `jax_enable_x64` keeps int64 state."""

    shared: tuple[bool, ...]
    batch: int
    sharding: Any  # a `pcbatch.sharding.BatchSharding`, or None
    trees: tuple[Any, ...]
    leaves: tuple[tuple[tuple[tuple[int, ...], Any, bool], ...], ...]
    index_dtype: Any

    @classmethod
    def of(cls, shared: tuple[bool, ...], batch: int, sharding: Any, values: list[Any]) -> "Signature":
        flat = [tree_util.tree_flatten(v) for v in values]
        return cls(tuple(shared), batch, sharding, tuple(tree for _, tree in flat),
                   tuple(tuple(_shape_dtype(x) for x in leaves) for leaves, _ in flat), index_dtype())

    def types(self, params: list[str]) -> dict[str, Any]:
        """One example's argument types by entry parameter (the batch axis of
        batched ones dropped): what `specialize` needs."""
        return {p: tree_util.tree_unflatten(tree, [jax.ShapeDtypeStruct(shape[0 if s else 1:], dtype,
                                                                        weak_type=weak)
                                                   for shape, dtype, weak in leaves])
                for p, s, tree, leaves in zip(params, self.shared, self.trees, self.leaves)}

    @property
    def local_batch(self) -> int:
        """Examples per machine: the batch, or its share per device when sharded."""
        return self.batch if self.sharding is None else self.sharding.per_device(self.batch)


def _shape_dtype(x: Any) -> tuple[tuple[int, ...], Any, bool]:
    """A leaf's shape, `jnp.result_type` and weak type, read straight off a
    plain array (the type lattice and `np.shape` take several µs a leaf, every call)."""
    if isinstance(x, jax.Array) and not getattr(x, "weak_type", False):  # a typed PRNG key has none
        return x.shape, x.dtype, False  # already canonical
    if isinstance(x, np.ndarray):
        return x.shape, jax.dtypes.canonicalize_dtype(x.dtype), False
    weak = (isinstance(x, jax.Array) and x.weak_type) or type(x) in (int, float, complex)  # as jnp.asarray
    return np.shape(x), jnp.result_type(x), weak


def machine_config(prog: StackProgram, batch: int, options: Options) -> tuple[int, MachineConfig]:
    """Machine lanes and settings for a batch (the lane pool only matters with forks)."""
    tuning = options.tuning
    if not prog.has_forks:
        lanes = batch
    elif options.max_lanes is not None:
        lanes = max(options.max_lanes, batch)
    else:
        # Lanes per example, capped so the stacks (every lane has
        # max_stack_depth frames) stay within a budget.
        affordable = tuning.pool_stack_bytes // (frame_bytes(prog) * options.max_stack_depth)
        lanes = max(batch, min(uncapped_pool(batch, tuning), affordable))
    width = options.lane_width or max(tuning.min_lane_width, min(tuning.width_per_example * batch,
                                                                 tuning.max_lane_width))
    scheduler = get_scheduler(options.schedule)
    # With a step bound, no example may starve another (one runaway must not spoil the batch).
    if options.max_steps is not None:
        scheduler = Fair(scheduler)
    # The step counter is the index type: a bound past it is no bound (and no int32 overflow).
    max_steps = None if options.max_steps is None else min(options.max_steps, int(np.iinfo(index_dtype()).max))
    return lanes, MachineConfig(options.max_stack_depth, max_steps, scheduler, lanes, width, tuning)


def first_stack_depth(prog: StackProgram, batch: int, options: Options) -> int:
    """How many frames per lane eager calls try first
    (`Tuning.pool_first_stack_depth`): only where the stack budget caps the
    default pool, so that fewer frames per lane buy lanes (a forked call's
    lane rarely nests deep); 0: never."""
    tuning, depth = options.tuning, options.tuning.pool_first_stack_depth
    if not prog.has_forks or options.max_lanes is not None or not 0 < depth < options.max_stack_depth:
        return 0
    return depth if machine_config(prog, batch, options)[0] < uncapped_pool(batch, tuning) else 0


def uncapped_pool(batch: int, tuning: Tuning) -> int:
    """The default lane pool before the stack budget: `lanes_per_example` per
    example, at most `max_pool_lanes`, never fewer than the batch."""
    return max(batch, min(tuning.lanes_per_example * batch, tuning.max_pool_lanes))


def frame_bytes(prog: StackProgram) -> int:
    """One lane's stack frame: the pc, then each stack's slot."""
    return index_dtype().itemsize + nbytes(StackLayout.of(prog).stacks)


def fork_choice(prog: StackProgram, signature: Signature, options: Options, traced: bool) -> ForkChoice:
    """`fork="auto"`'s choice for `prog` (lowered with forks) on this call
    (`traced`: under `jax.jit` or a gradient)."""
    if prog.has_forks and (options.max_lanes is not None or options.lane_width is not None):
        return ForkChoice(True, "max_lanes or lane_width was given: the fork-join lane pool was asked for")
    batch = signature.local_batch
    lanes, _ = machine_config(prog, batch, options)
    pool_bytes = frame_bytes(prog) * options.max_stack_depth * lanes
    shallow = first_stack_depth(prog, batch, options) if not traced and signature.sharding is None else 0
    if shallow:  # an eager call runs on shallow stacks first: its pool is that one
        lanes = machine_config(prog, batch, options.replace(max_stack_depth=shallow))[0]
    return choose_fork(prog, batch, lanes, pool_bytes, traced, options.tuning,
                       measurable=signature.sharding is None)


@dataclass(eq=False)
class Executable:
    """What one call signature compiled to. `runner(inputs, workspace)` runs
    the machine (`(result, status, workspace)`); `lean_runner` is the same
    with `status.blocks_run` zeros (a plain call never shows it, and counting
    costs a copy and a kernel per step; a pool's is its `runner`: there the
    count costs ~2% of a step, a second compile 0.5-2 s); `workspace` is the last call's stacks,
    donated to the next (never read before written: no zero fill);
    `differentiable` is built on the first differentiated call, from
    `gradient_program()` where given (the program without loop forks, whose
    launches the gradient pass does not replay);
    `fork_choice`: what `fork="auto"` chose and why (None for fork=True/False);
    `step_tracers`: `f.trace`'s runs, each compiled once."""

    prog: StackProgram
    signature: Signature
    options: Options
    runner: Callable
    lean_runner: Callable
    layout_report: LayoutReport | None = None
    fork_choice: ForkChoice | None = None
    workspace: Any = None
    shallow_depth: int = -1  # frames per lane eager calls try first: -1 until the first call decides, 0 never
    shallow_tries: int = 0
    shallow_misses: int = 0  # shallow runs that overflowed and ran again on full stacks
    differentiable: Differentiable | None = None
    gradient_program: Callable[[], StackProgram] | None = None
    step_tracers: dict = field(default_factory=dict)  # `f.trace`'s jitted runs, by (steps, per_lane)

    @property
    def batch(self) -> int:
        return self.signature.batch

    @property
    def shared(self) -> tuple[bool, ...]:
        """Which entry parameters the batch shares."""
        return self.signature.shared

    def config(self, batch: int) -> tuple[int, MachineConfig]:
        """Machine lanes and settings for `batch` examples (`machine_config`)."""
        return machine_config(self.prog, batch, self.options)

    def new_workspace(self, eager: bool = False) -> Any:
        """Fresh stacks for one run (per device when sharded); `eager`: outside any trace."""
        sharding = self.signature.sharding
        if sharding is None:
            return new_workspace(self.prog, self.batch, self.config(self.batch)[1], eager)
        local = self.signature.local_batch
        config = self.config(local)[1]
        shapes = workspace_shapes(self.prog, local, config)
        check_fits(nbytes(shapes), local, config)  # one device's share
        return sharding.new_workspace(shapes)

    def step_tracer(self, steps: int, per_lane: bool) -> Callable[[dict[str, Any]], tuple[Any, Status, StepTrace]]:
        """`f.trace`'s jitted run for `steps` steps (`runtime.run.step_tracer`), built once."""
        if (steps, per_lane) not in self.step_tracers:
            self.step_tracers[steps, per_lane] = step_tracer(self.prog, self.batch, self.config(self.batch)[1],
                                                             steps, per_lane)
        return self.step_tracers[steps, per_lane]

    def gradient_machine(self) -> Differentiable:
        """The machine under a custom_jvp (`runtime.grad.Differentiable`), built once."""
        if self.differentiable is None:
            prog = self.prog if self.gradient_program is None else self.gradient_program()
            batched = frozenset(p for p, s in zip(prog.entry_params, self.shared) if not s)
            self.differentiable = Differentiable(prog, self.batch, machine_config(prog, self.batch, self.options)[1],
                                                 batched, self.options.tape_size)
        return self.differentiable


class Cache:
    """What the pipeline made for one autobatched function and its options:
    one dict, keyed by each stage's inputs: `("converted",)` (the frontend's
    conversion, before forks), `("webs", split)` (variables split into their
    webs, `specialized`), `("frontend", fork, loops, split)`, `("lower", fork,
    loops, shared, split)`, `("specialize", fork, loops, signature)`,
    `("fork choice", signature, traced)` and `("machine", signature, fork)`;
    and the function's copies: `("method", id)` (bound to an instance),
    `("schedule", key)`, `("shallow", depth)` and how `("bind", shapes)`
    binds positional arrays."""

    # Stages that depend on nothing but their key (not on other options): a copy with other options reuses them.
    _OPTION_FREE = ("frontend", "converted", "webs", "lower", "specialize")

    def __init__(self) -> None:
        self._entries: dict[Hashable, Any] = {}

    def get(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """The entry for `key`, built by `build()` the first time."""
        if key not in self._entries:
            self._entries[key] = build()
        return self._entries[key]

    def find(self, key: Hashable) -> Any:
        """The entry for `key`, or None (nothing is built)."""
        return self._entries.get(key)

    def put(self, key: Hashable, value: Any) -> None:
        """Replace the entry for `key` (a fork choice once measured)."""
        self._entries[key] = value

    def of_kind(self, kind: str) -> list[Any]:
        """The entries whose key starts with `kind`, in the order they were made."""
        return [v for k, v in self._entries.items() if isinstance(k, tuple) and k[0] == kind]

    def inherit(self, other: "Cache") -> None:
        """Take `other`'s block IR, lowered and specialized programs (the same
        function; their keys hold all they depend on), not what depends on
        its other options (fork choices, machines)."""
        for key, value in other._entries.items():
            if key[0] in self._OPTION_FREE:
                self._entries.setdefault(key, value)


Callee = Callable[[Any], BoundFunction | None]
Split = frozenset[tuple[str, str]]  # (function, variable)s split into their webs (`ir/webs.py`)


def block_ir(target: BoundFunction, callee: Callee, options: Options, cache: Cache,
             fork: bool | None = None, loops: bool = True, split: Split = frozenset()) -> Program:
    """Stage 1, the frontend: the block IR, one control-flow graph per function
    (with `fork="auto"`, the IR with forks unless `fork` says otherwise;
    `loops=False`: without loop forks, for the gradient pass), with each
    `(function, variable)` in `split` split into its webs (`ir/webs.py`)."""
    fork = (options.fork is not False) if fork is None else fork
    loops = loops and fork
    return cache.get(("frontend", fork, loops, split),
                     lambda: form_program(webs_ir(target, callee, cache, split), fork, loops))


def webs_ir(target: BoundFunction, callee: Callee, cache: Cache, split: Split = frozenset()) -> Program:
    """The block IR before fork formation, converted once for every fork mode,
    with each `(function, variable)` in `split` split into its webs."""
    converted = cache.get(("converted",), lambda: convert_program(target, callee))
    return cache.get(("webs", split), lambda: split_webs(converted, split)) if split else converted


def specialized(target: BoundFunction, callee: Callee, signature: Signature, options: Options, cache: Cache,
                fork: bool, loops: bool = True) -> StackProgram:
    """Stages 1-3: the frontend, lowering (per set of shared parameters: shared
    values become constants) and specialization to this call's argument types.
    Where a variable's assignments do not agree on one type because Python
    rebinds it (`h = h.sum()`), it is split into its webs and all is done
    again, until the types agree or no split helps (the error is raised); a
    program whose types agree is lowered as without webs."""
    loops = loops and fork

    def build() -> StackProgram:
        split: Split = frozenset()
        while True:
            try:
                return _specialized(target, callee, signature, options, cache, fork, loops, split)
            except TypeMismatchError as e:
                more = splittable(webs_ir(target, callee, cache, split), e.ir_vars) - split
                if not more:
                    return _split_everywhere(target, callee, signature, options, cache, fork, loops, e)
                split |= more
    return cache.get(("specialize", fork, loops, signature), build)


def _specialized(target: BoundFunction, callee: Callee, signature: Signature, options: Options, cache: Cache,
                 fork: bool, loops: bool, split: Split) -> StackProgram:
    program = block_ir(target, callee, options, cache, fork, loops, split)
    lowered = cache.get(("lower", fork, loops, signature.shared, split), lambda: lower(program, signature.shared))
    with _context.in_building():
        return specialize(lowered, signature.types(lowered.entry_params))


def _split_everywhere(target: BoundFunction, callee: Callee, signature: Signature, options: Options, cache: Cache,
                      fork: bool, loops: bool, error: TypeMismatchError) -> StackProgram:
    """Where the variable that fails has one web, the type it got may have
    come from another's (`total = total + r`, typed before `r = f(...)`
    rebinds `r` to another shape): split every variable with more than one
    web, then keep split only those whose webs' types do not join. Raises
    `error` where that fails too."""
    converted = webs_ir(target, callee, cache)
    every = multi_web(converted)
    try:
        prog = _specialized(target, callee, signature, options, cache, fork, loops, every)
    except TypeMismatchError:
        raise error from None
    needed = frozenset(v for v in every if not _webs_join(prog, converted, *v))
    if needed == every:
        return prog
    try:
        return _specialized(target, callee, signature, options, cache, fork, loops, needed)
    except TypeMismatchError:  # a join of the others' webs widened a dtype that mattered
        return prog


def _webs_join(prog: StackProgram, converted: Program, fn: str, var: str) -> bool:
    """Whether the types `prog` gave `var`'s webs join (as one variable's assignments)."""
    coalesced = {u: slot for slot, us in prog.merged.items() for u in us}
    names = [coalesced.get(q, q) for q in (qualify(fn, v) for v in web_names(converted, fn, var))]
    types = [prog.var_types[q] for q in names if q in prog.var_types]  # not there: dropped (dead)
    try:
        for t in types[1:]:
            types[0] = join_types(var, types[0], None, t, None)
    except TypeMismatchError:
        return False
    return True


def executable(target: BoundFunction, callee: Callee, signature: Signature, options: Options, cache: Cache,
               traced: bool = False, on_trace: Callable[[], None] = lambda: None,
               fork: bool | None = None) -> Executable:
    """The machine for one call signature, each stage once per `cache`.
    `callee(obj)` is the autobatched function behind a name the code calls
    (the frontend's `unwrap`); `traced`: the call is traced (under `jax.jit`
    or a gradient), which `fork="auto"` weighs; `on_trace` is called each
    time the machine is traced; `fork` overrides what `fork="auto"` chose
    (`measure_fork`). Eager and traced calls share a machine wherever they
    choose alike."""
    choice = None
    fork = options.fork if fork is None else fork
    learned = options.schedule.info.get("forks") if isinstance(options.schedule, Policy) else None
    if fork == "auto" and learned is not None:
        choice = ForkChoice(learned, f"a learned schedule runs the program it was learned on (fork={learned})")
        fork = learned
    if fork == "auto":  # lowered with forks; kept only where they are expected to pay
        with_forks = specialized(target, callee, signature, options, cache, True)
        choice = cache.get(("fork choice", signature, traced),
                           lambda: fork_choice(with_forks, signature, options, traced))
        fork = choice.fork or not with_forks.has_forks  # nothing forks: the program lowered with forks is the same
    def build() -> Executable:
        exe = compile_program(specialized(target, callee, signature, options, cache, fork), signature, options,
                              choice, on_trace)
        if exe.prog.has_launches:
            exe.gradient_program = lambda: specialized(target, callee, signature, options, cache, fork, loops=False)
        return exe
    exe = cache.get(("machine", signature, fork), build)
    if choice is not None and choice.measure:
        exe.fork_choice = choice  # a traced call's machine, shared: this eager call still measures
    return exe


def measure_fork(target: BoundFunction, callee: Callee, signature: Signature, options: Options, cache: Cache,
                 run: Callable[[Executable], None], on_trace: Callable[[], None] = lambda: None,
                 repeats: int = 3, budget_s: float = 0.2, max_repeats: int = 15) -> Executable:
    """Where `fork="auto"`'s rule cannot tell (`ForkChoice.measure`): build
    both machines, run each on this call's inputs (`run(exe)`, blocking) once
    to warm up, then interleaved at least `repeats` times and, while both
    together took less than `budget_s`, up to `max_repeats` (the two are often
    within 10% of each other: a few ms calls need many samples), keep the
    faster for the signature (its choice says the best times) and return it."""
    machines = {f: executable(target, callee, signature, options, cache, False, on_trace, fork=f)
                for f in (True, False)}
    for exe in machines.values():
        run(exe)
    best = {True: float("inf"), False: float("inf")}
    spent = 0.0
    for k in range(max_repeats):
        if k >= repeats and spent >= budget_s:
            break
        for f, exe in machines.items():
            start = time.perf_counter()
            run(exe)
            took = time.perf_counter() - start
            best[f], spent = min(best[f], took), spent + took
    fork = best[True] < best[False]
    lanes, _ = machine_config(machines[True].prog, signature.local_batch, options)
    why = ("a loop fork, which pays or not by the data's shape" if machines[True].prog.has_launches
           else "where the rule cannot tell")
    choice = ForkChoice(fork, f"measured on the first call ({lanes // signature.local_batch} pool lanes per "
                              f"example, {why}): fork-join {best[True] * 1e3:.3g} ms, one "
                              f"lane per example {best[False] * 1e3:.3g} ms")
    cache.put(("fork choice", signature, False), choice)
    machines[fork].fork_choice = choice
    machines[not fork].workspace = None  # the loser's stacks (a pool's can be ~1 GiB) are not kept
    return machines[fork]


@dataclass(frozen=True)
class TopLevelJit:
    """A machine's `jit`, compiled with XLA options (`Tuning.compiler_options`)
    when called with concrete values: JAX takes compiler options only on a
    top-level `jax.jit`; inside a caller's trace the caller's options rule."""

    traced: Callable  # the jitted machine, without options: for calls inside a trace
    top: Callable     # the same with the options, for concrete calls

    def __call__(self, inputs: Any, workspace: Any) -> Any:
        traced = differentiation.traced(jax.tree_util.tree_leaves((inputs, workspace)))
        return (self.traced if traced else self.top)(inputs, workspace)

    def lower(self, inputs: Any, workspace: Any) -> Any:
        return self.top.lower(inputs, workspace)


def _top_level(jit: Callable[[Callable], Any], fn: Callable, xla: dict[str, str | bool]) -> Callable:
    traced = jit(fn)
    return TopLevelJit(traced, jax.jit(traced, donate_argnums=(1,), compiler_options=xla)) if xla else traced


def compile_program(prog: StackProgram, signature: Signature, options: Options, choice: ForkChoice | None,
                    on_trace: Callable[[], None]) -> Executable:
    """Stages 4 and 5 for a specialized program: its memory layout, then the machine."""
    # 4. memory layout
    report = None
    if options.layout:
        with _context.in_building():
            prog, report = layout_program(prog, "all" if options.layout == "all" else "auto")

    # 5. runtime
    def machine(prog: StackProgram, batch: int, inputs: dict[str, Any], workspace: Any,
                active: Any = None, lean: bool = False) -> tuple[Any, Status, Any]:
        on_trace()
        with _context.in_building():
            result, status, workspace = run_machine(prog, inputs, batch, machine_config(prog, batch, options)[1],
                                                    workspace, active)
        if lean:  # nobody reads the per-example block counts: XLA drops their updates from the loop
            status = status._replace(blocks_run=jnp.zeros_like(status.blocks_run))
        return result, status, workspace

    batch, sharding = signature.batch, signature.sharding
    xla = options.tuning.compiler_options()
    if sharding is None:
        def jit(fn: Callable) -> Callable:
            return jax.jit(fn, donate_argnums=(1,))
    else:  # one machine per device (pcbatch/sharding.py)
        def jit(fn: Callable) -> Callable:
            return sharding.runner(fn, batch, dict(zip(prog.entry_params, signature.shared)))
    runner = _top_level(jit, functools.partial(machine, prog, batch) if sharding is None
                        else functools.partial(machine, prog), xla)
    # A plain machine's block count costs ~37% of a step (collatz, 1024 lanes): plain calls get a lean
    # twin. A pool's costs ~2%: one machine, compiled once (0.5-2 s), serves plain and checked calls.
    lean = runner if prog.has_forks or sharding is not None else \
        _top_level(jit, functools.partial(machine, prog, batch, lean=True), xla)
    return Executable(prog, signature, options, runner, lean, report, fork_choice=choice)
