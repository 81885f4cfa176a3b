"""`pcbatch.autobatch`: the user-facing decorator."""
from __future__ import annotations

import dataclasses
import functools
import inspect
import types
from typing import TYPE_CHECKING, Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from pcbatch import _context, call, differentiation, failures
from pcbatch import sharding as _sharding
from pcbatch.arguments import Bound, bind, check_in_axes, check_signature, reference_call, target_of
from pcbatch.call import Function
from pcbatch.compile import Cache, Executable, block_ir
from pcbatch.errors import HELPER_CALL_HINT, ArgumentError, Loc, OptionError, UnsupportedSyntaxError
from pcbatch.frontend import BoundFunction
from pcbatch.fsm import Policy, get_scheduler
from pcbatch.ir.core import Program, StackProgram
from pcbatch.ir.interpret import Trace, run_stack_program
from pcbatch.ir.keys import is_key
from pcbatch.memory import LayoutReport, layout_program
from pcbatch.options import Options
from pcbatch.runtime import Status
from pcbatch.runtime.grad import DEFAULT_TAPE_SIZE, TapeInfo
from pcbatch.runtime.steps import StepTrace

if TYPE_CHECKING:
    from pcbatch.fsm.graph import ExecGraph

tree_util = jax.tree_util


def _stack_examples(*values: Any) -> jax.Array:
    """One result leaf of every example, stacked as JAX promotes them (a Python
    number takes the others' type: `0` beside int8 stays int8), except where
    that type cannot hold an example's value (a Python int beyond int32 beside
    an int32 under x64, a float beyond float16's range): then in the wider type
    of the values, never wrapped or overflowed to inf."""
    arrays = [_example_array(v, values) for v in values]
    stacked = jnp.stack(arrays)
    if is_key(stacked.dtype):  # typed PRNG keys: no NumPy dtype, no promotion (one impl, or jnp.stack raised)
        return stacked
    wide = np.result_type(*(a.dtype for a in arrays))
    if wide == stacked.dtype or any(isinstance(a, jax.core.Tracer) for a in arrays):
        return stacked  # traced (`jax.grad` of the reference): no values to check, JAX's promotion
    narrow = np.asarray(stacked).astype(wide)
    exact = np.stack([np.asarray(a).astype(wide) for a in arrays])
    lost = (np.isfinite(exact) & ~np.isfinite(narrow)) if np.issubdtype(stacked.dtype, np.inexact) else exact != narrow
    return jnp.asarray(exact) if np.any(lost) else stacked


def _example_array(value: Any, values: tuple[Any, ...]) -> jax.Array:
    """One example's result leaf as an array. A Python int beyond JAX's default
    integer (int32 without x64: a `range` counter over uint32 bounds) takes the
    type the other examples' arrays have, or uint32, where that holds it."""
    try:
        return jnp.asarray(value)
    except OverflowError:
        typed = [jnp.result_type(v) for v in values if hasattr(v, "dtype")]
        for dtype in ([np.result_type(*typed)] if typed else []) + [np.dtype(np.uint32)]:
            if np.issubdtype(dtype, np.integer) and np.iinfo(dtype).min <= value <= np.iinfo(dtype).max:
                return jnp.asarray(value, dtype)
        raise


class Autobatched:
    """A function written for one example that runs on a whole batch.

    >>> import jax.numpy as jnp, pcbatch
    >>> @pcbatch.autobatch
    ... def fib(n):
    ...     if n <= 1:
    ...         return n
    ...     return fib(n - 1) + fib(n - 2)
    >>> fib(jnp.array([3, 7, 4, 5]))
    Array([ 2, 13,  3,  5], dtype=int32)
    """

    def __init__(self, fn: Callable, options: Options | None = None, **changes: Any):
        self.options = options.replace(**changes) if options is not None else Options.of(**changes)
        self.target = target_of(fn)
        check_signature(self.target)
        check_in_axes(self.options.in_axes, self.target)
        functools.update_wrapper(self, self.target.fn)
        self.fn = self.target.fn  # the Python function whose source is converted
        self._original = fn
        self.scheduler = get_scheduler(self.schedule)
        self.signature = self.target.signature
        self._cache = Cache()  # the pipeline's stages (pcbatch/compile.py), and this object's copies
        self.trace_count = 0  # machines traced so far; a cache hit does not add one
        sharding = None if self.mesh is None else _sharding.BatchSharding.of(self.mesh, self.axis_name)
        self._function = Function(self.target, self._callee, self.options, self._cache, sharding, self._traced)

    def __repr__(self) -> str:
        return f"<autobatched {self.fn.__qualname__}>"

    def __get__(self, instance: Any, owner: Any = None) -> "Autobatched":
        """A method decorated with `autobatch`: `obj.f` is autobatched with `self` fixed."""
        if instance is None:
            return self
        key = ("method", id(instance))
        cached = self._cache.find(key)
        if cached is None or cached[0] is not instance:  # the id of an instance since collected
            cached = (instance, Autobatched(types.MethodType(self._original, instance), self.options))
            self._cache.put(key, cached)
        return cached[1]

    def _callee(self, obj: Any) -> BoundFunction | None:
        """The function behind a name called in the converted code, if it is
        autobatched: any `Autobatched`, and also the very function being
        autobatched (`fast = autobatch(fib)`: `fib` calling `fib` is recursion)."""
        if isinstance(obj, Autobatched):
            return obj.target
        if getattr(obj, "__func__", obj) is self.fn:
            return target_of(obj)
        return None

    # --- the program at each level --------------------------------------

    def ir(self) -> Program:
        """The block IR (Figure 2): one control-flow graph per function (with
        `fork="auto"`, the IR with forks; `f.lowered(*args)` shows whether a
        call keeps them)."""
        return block_ir(self.target, self._callee, self.options, self._cache)

    def lowered(self, *args: Any, **kwargs: Any) -> StackProgram:
        """The stack program (Figure 4) for these arguments, with each variable's
        class (temporary / register / stacked / constant), type and stack shape."""
        exe, _ = self.executable(*args, **kwargs)
        return dataclasses.replace(exe.prog, lanes=exe.config(exe.signature.local_batch)[0],
                                   stack_depth=self.max_stack_depth)

    # --- calling ---------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _context.python_mode():
            return self.target(*args, **kwargs)
        if _context.building():
            e = UnsupportedSyntaxError(
                f"autobatched function `{self.__qualname__}` was called from primitive code",
                Loc(self.fn.__code__.co_filename, self.fn.__code__.co_firstlineno), HELPER_CALL_HINT)
            e.callee = self.__qualname__  # type inference quotes the line that reached it
            raise e
        return call.call(self._function, self._bind(args, kwargs))

    def checked(self, *args: Any, **kwargs: Any) -> tuple[Any, Status]:
        """Like calling, but returns `(result, status)` instead of raising, so it
        can be used inside `jax.jit`: `status.overflow`, `status.unfinished` and
        `status.failed` (where Python raises: 1 + the `Fail` block, else 0) are
        per-example flags; results of flagged examples are not meaningful."""
        return call.checked(self._function, self._bind(args, kwargs))

    def tape_info(self, *args: Any, **kwargs: Any) -> TapeInfo:
        """The gradient tape a differentiated call on these arguments records
        (`pcbatch.runtime.grad.TapeInfo`): rows per block, memory, and
        `needed`, the `tape_size=` that holds it (to size the tape for
        `jax.jit(jax.grad(...))`, where it cannot grow).

        >>> import jax.numpy as jnp, pcbatch
        >>> @pcbatch.autobatch
        ... def power(x, n):
        ...     return 1.0 if n == 0 else x * power(x, n - 1)
        >>> power.tape_info(jnp.array([2.0, 3.0]), jnp.array([3, 40])).needed
        22
        """
        exe, inputs = self._host_side("tape_info", args, kwargs)
        if exe.batch == 0:
            return TapeInfo(self.options.tape_size or DEFAULT_TAPE_SIZE, 0, {}, 0, 0, 0, 0)
        return exe.gradient_machine().info(inputs)

    def _host_side(self, what: str, args: tuple, kwargs: dict) -> tuple[Executable, dict[str, Any]]:
        """The executable and inputs of a call whose record Python reads (`trace`,
        `tape_info`): its arguments must be concrete."""
        bound = self._bind(args, kwargs)
        if differentiation.traced(tree_util.tree_leaves(bound.values)):
            raise ArgumentError(self.__name__, f"`{what}` runs the machine and reads its record in Python, so it "
                                               "needs concrete arguments, outside jax.jit/grad/vmap",
                                "call it outside the transformation, on the same shapes.")
        return self._executable(bound)

    def reference(self, *args: Any, **kwargs: Any) -> Any:
        """Run the original Python one example at a time (the test oracle)."""
        bound = self._bind(args, kwargs)
        if bound.batch == 0:
            return call.run_empty(self._function, bound)[0]
        bound = bound.indexable()
        outs = []
        with _context.in_python_mode():
            try:
                for i in range(bound.batch):
                    outs.append(reference_call(self.target, bound.example(i)))
            except jax.errors.ConcretizationTypeError as e:
                if not differentiation.traced(tree_util.tree_leaves(bound.values)):
                    raise  # the user's own Python, on concrete values: as Python raises it
                raise ArgumentError(
                    self.__name__, "`reference` runs the original Python on each example, and under this "
                                   "transformation (jax.jit, or a traced value) Python's `if`/`while` on a "
                                   f"per-example value cannot be decided ({type(e).__name__})",
                    "call f.reference outside jax.jit, on concrete values (jax.grad of it works where the "
                    "Python does not branch on the differentiated values).") from e
        return tree_util.tree_map(_stack_examples, *outs)

    def trace(self, *args: Any, steps: int = 4096, per_lane: bool = False, **kwargs: Any) -> StepTrace:
        """Run the machine on these arguments and record, inside the loop, each
        step's block, the lanes it ran and the ready lanes per block (the
        frontier the scheduler chose from): the first `steps` steps are kept;
        with `per_lane`, also each lane's pc (`steps x lanes` integers). The
        result plots with `pcbatch.viz.schedule_gantt`, `utilization` and
        `lane_progress`. A sharded function is traced on one device.

        >>> import jax.numpy as jnp, pcbatch
        >>> @pcbatch.autobatch
        ... def fib(n):
        ...     return n if n <= 1 else fib(n - 1) + fib(n - 2)
        >>> t = fib.with_options(fork=False).trace(jnp.array([3, 7, 4, 5]))
        >>> t.total == t.steps, int(t.lanes.max()) <= 4
        (True, True)
        """
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or not 1 <= steps < 2 ** 31:
            raise OptionError("steps", f"must be a positive int below 2**31, got {steps!r}",
                              "the number of steps whose trace is kept (buffers of that many rows), e.g. steps=4096.")
        steps = int(steps)
        exe, inputs = self._host_side("trace", args, kwargs)
        if exe.batch == 0:  # nothing runs
            idx = np.dtype(exe.signature.index_dtype)
            return StepTrace(np.zeros(0, idx), np.zeros(0, idx), np.zeros((0, exe.prog.num_blocks), idx), 0, 0, 0,
                             np.zeros((0, 0), idx) if per_lane else None, np.zeros((0, 0), bool) if per_lane else None)
        with _context.in_building():
            return exe.step_tracer(steps, per_lane)(inputs)[2]

    def reference_trace(self, *args: Any, max_steps: int | None = None, **kwargs: Any) -> list[Trace]:
        """What each example executes, from the reference interpreter: one
        `pcbatch.ir.Trace` each (blocks of `lowered(*args)` and what each waited
        for; the executions a scheduler learns from, `pcbatch.fsm.record`)."""
        bound = self._bind(args, kwargs)
        prog = self._executable(bound)[0].prog
        indexable = bound.indexable()
        examples = [failures.example_inputs(prog, indexable, i) for i in range(bound.batch)]
        return [run_stack_program(prog, example, max_steps=max_steps) for example in examples]

    def execution_graph(self, *args: Any, **kwargs: Any) -> ExecGraph:
        """What this function executes on a sample batch, as a
        `pcbatch.fsm.ExecGraph` (`reference_trace`'s traces: one chain of
        blocks per example, with fork-join a DAG), for `fsm.simulate` and
        `learn_schedule`. Under `fork="auto"` it is the machine the first eager
        call keeps (run here if no call has decided yet)."""
        from pcbatch.fsm.graph import ExecGraph
        exe, _ = self.executable(*args, **kwargs)
        if exe.fork_choice is not None and exe.fork_choice.measure:
            self(*args, **kwargs)
        return ExecGraph.from_traces(self.reference_trace(*args, **kwargs), self.lowered(*args, **kwargs).num_blocks)

    def learn_schedule(self, *sample_args: Any, encoding: str = "sort", trials: int = 1000, seed: int = 0,
                       progress: bool = True, config: Any = None, costs: Any = None) -> Policy:
        """A scheduling `pcbatch.fsm.Policy` learned offline (Q-learning over
        `execution_graph(*sample_args)`); run it with `with_schedule(policy)`.
        Under `fork="auto"` the policy records the machine it was learned on,
        and `fork="auto"` keeps to it wherever the policy schedules.

        `costs`: what the policy minimises. None (the default, ED-Batch's
        objective): the number of steps. `"estimate"`: the time they take, a
        step running each block costing what `pcbatch.step_costs.estimate`
        measures for this machine (a few timed calls, a second or two); the
        table is dropped for its fallback where the model says it would not be
        faster; the learned machine is timed against the default
        (`policy.info["measured"]`, seconds a call), learned once more with
        the model corrected where it measured slower, and dropped if still
        slower (`pcbatch.step_costs.learn`). Or one positive number per block of
        `lowered(*args)`. A state the table does not know runs what the
        machine's default schedule would (the earliest ready block, or with
        forks the earliest that does not return)."""
        from pcbatch.fsm.base import ReturnsLast
        from pcbatch.fsm.qlearn import QConfig, learn_from_graphs
        graph = self.execution_graph(*sample_args)
        exe, _ = self.executable(*sample_args)
        # Unseen states fall back to what the machine runs by default: ReturnsLast with forks.
        default = get_scheduler(exe.options.schedule, exe.prog)
        returns = default.returns if isinstance(default, ReturnsLast) else None
        qconfig = config if config is not None else QConfig()

        def learn(costs: Any) -> Policy:
            return learn_from_graphs([graph], graph.num_types, encoding=encoding, trials=trials, seed=seed,
                                     progress=progress, config=qconfig, costs=costs, returns=returns)

        if isinstance(costs, str):
            if costs != "estimate":
                raise OptionError("costs", f"must be None, 'estimate' or one number per block; got {costs!r}")
            from pcbatch import step_costs
            policy = step_costs.learn(self, graph, default, learn, *sample_args)
        else:
            policy = learn(costs)
        policy.info["forks"] = exe.prog.has_forks  # read by `compile.executable`
        return policy

    def executable(self, *args: Any, **kwargs: Any) -> tuple[Executable, dict[str, Any]]:
        """The compiled machine for these arguments' signature
        (`pcbatch.compile.Executable`: its program, runners, machine settings
        and workspace), compiled on first use, and the call's inputs by entry
        parameter: `exe.runner(inputs, exe.new_workspace())` runs it."""
        return self._executable(self._bind(args, kwargs))

    def layout_report(self, *args: Any, **kwargs: Any) -> LayoutReport:
        """What the block-layout pass does for these arguments: per run of
        straight-line code with independent same-type ops, the groups found,
        the PQ-tree, the order chosen, the constants packed before the loop and
        the planning time. `print` it; `pcbatch.viz.pq_tree(report[0].layout.tree)`
        draws a tree. With `layout=False` it says what the pass would do."""
        exe, _ = self.executable(*args, **kwargs)
        if exe.layout_report is not None:
            return exe.layout_report
        prog = exe.prog
        with _context.in_building():
            report = layout_program(prog, "auto")[1]
        return dataclasses.replace(report, applied=False)

    def with_schedule(self, schedule: Any) -> "Autobatched":
        """The same function run under another scheduler. Asked again for the
        same schedule (a name, or the same scheduler object), it returns the
        same copy, so its compiled machines are reused rather than rebuilt."""
        key = schedule if isinstance(schedule, str) else id(schedule)  # the copy keeps the object alive
        return self._cache.get(("schedule", key), lambda: self.with_options(schedule=schedule))

    def with_options(self, **options: Any) -> "Autobatched":
        """A copy with some of `autobatch`'s options changed, e.g.
        `tree_lstm.with_options(fork=False)` for one lane per example
        (a fresh compile cache)."""
        other = Autobatched(self._original, self.options.replace(**options))
        other._cache.inherit(self._cache)  # the block IR and lowered programs, where still valid
        return other

    # --- internals -------------------------------------------------------

    def _bind(self, args: Sequence[Any], kwargs: dict[str, Any]) -> Bound:
        return self._function.bind(args, kwargs)

    def _executable(self, bound: Bound) -> tuple[Executable, dict[str, Any]]:
        return self._function.executable(bound)

    def _traced(self) -> None:
        self.trace_count += 1


def autobatch(fn: Callable | None = None, *, options: Options | None = None, **changes: Any) -> Any:
    """Batch a single-example function (recursion and control flow included).

    Usable as `@autobatch`, `@autobatch(in_axes=(0, None))` or `autobatch(f, ...)`.
    The options below are the fields of `pcbatch.Options`; pass them as
    keywords, or one `options=pcbatch.Options(...)` (keywords then change it).
    A bad value or an unknown name raises `OptionError` at decoration.

    Args:
      in_axes: like `jax.vmap`: per argument `0` (batched along that axis) or
        `None` (shared by the whole batch, e.g. parameters); pytrees allowed.
      max_stack_depth: deepest recursion (active frames) any example may reach.
      max_steps: bound on machine steps; `None` means unbounded.
      schedule: `"auto"` (earliest block first; with forks, returning blocks
        last), `"earliest"`, `"depth"`, `"agenda"`, or a scheduler object such
        as a learned `pcbatch.fsm.Policy` (see `pcbatch.fsm`).
      fork: `True` runs independent calls (`f(l) + f(r)`) at once in lanes of
        their own, so a tree is processed level by level, not node by node.
        `False`: one lane per example, calls one after another. `"auto"` (the
        default) forks only where it is expected to pay: the forked calls
        walk each example's data (an argument read from an input array, such
        as a tree's child index), the batch has at least 8 examples and the
        pool 64 lanes per example (with 8-63, the first eager call times both
        machines and keeps the faster), and, under `jax.jit`, the lane pool
        is small; or where `max_lanes` or `lane_width` is given (see
        `pcbatch.fork_choice`; `f.executable(*args)[0].fork_choice` says
        what it chose and why).
      max_lanes: the fork-join lane pool (default 128 per example, at most
        32768, fewer if the stacks, `max_stack_depth` frames per lane, would
        pass 1 GiB; where that caps it, eager calls first try 32 frames
        per lane, `Tuning.pool_first_stack_depth`); when it runs out, calls
        run sequentially in the caller's lane (slower, same result).
      lane_width: most lanes one VM step runs (default 2 per example, within
        64..256).
      layout: batch independent same-type ops inside a block (the gate
        matmuls of a cell written with separate weight matrices) on a
        PQ-tree memory layout, weights packed once before the loop. The same
        operations on the same values (a packed matmul may round differently
        in the last bit). `True`: in blocks with a matmul group; `"all"`:
        wherever a group is found; `False`: off. See `layout_report`.
      mesh, axis_name: shard the batch over `axis_name` of this
        `jax.sharding.Mesh` (default: its only axis), one machine and
        scheduler per device with no communication inside the loop; the
        result's batch axis stays sharded (when the devices divide the
        batch; otherwise the batch is padded, the padding never runs, and
        the result comes back replicated). The lane pool and lane width are
        per device, from the per-device batch. See `pcbatch.sharded` to
        shard every call in a block.
      tape_size: gradients (`jax.grad` and friends): rows the tape holds per
        block per example, i.e. how often one example may run each block
        (default 256). Outside `jit` a tape that overflows grows and the call
        re-runs; inside `jit` the gradients are NaN and a checkify error
        names the size needed. Given explicitly, it does not grow
        (`TapeOverflowError`).
      tuning: `pcbatch.Tuning`, the machine's speed/memory knobs (switch
        vs in-place blocks, compiled widths, default pool and width); they
        never change a result.

    >>> import jax.numpy as jnp, pcbatch
    >>> @pcbatch.autobatch
    ... def collatz(n):
    ...     steps = 0
    ...     while n != 1:
    ...         n = n // 2 if n % 2 == 0 else 3 * n + 1
    ...         steps += 1
    ...     return steps
    >>> collatz(jnp.array([1, 6, 27]))
    Array([  0,   8, 111], dtype=int32)
    """
    if fn is None:
        return lambda f: Autobatched(f, options, **changes)
    return Autobatched(fn, options, **changes)


# Each option reads as an attribute (`f.max_stack_depth`); the signature lists them.
for _name in Options.names():
    setattr(Autobatched, _name, property(lambda self, _n=_name: getattr(self.options, _n),
                                         doc=f"The `{_name}` option (see `pcbatch.Options`)."))
autobatch.__signature__ = inspect.Signature(
    [inspect.Parameter("fn", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None),
     inspect.Parameter("options", inspect.Parameter.KEYWORD_ONLY, default=None)]
    + [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default)
       for f in dataclasses.fields(Options)])
