"""The user-facing API: decorator forms, in_axes, pytree results, batch-size
checks, and the readable IR / lowered listings."""
from __future__ import annotations

import re
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pcbatch


class Pair(NamedTuple):
    lo: Any
    hi: Any


def _collatz(n):
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


def collatz_py(n: int) -> int:
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


N = np.asarray([1, 6, 27, 7, 2], np.int32)
COLLATZ = [collatz_py(int(n)) for n in N]   # plain Python ints: an independent oracle


# --- decorator forms --------------------------------------------------------

@pcbatch.autobatch
def bare(n):
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


@pcbatch.autobatch(max_stack_depth=16, max_steps=100_000)
def with_options(n):
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


functional = pcbatch.autobatch(_collatz, in_axes=0)
functional_bare = pcbatch.autobatch(_collatz)


@pytest.mark.parametrize("f", [bare, with_options, functional, functional_bare],
                         ids=["@autobatch", "@autobatch(...)", "autobatch(fn, ...)", "autobatch(fn)"])
def test_decorator_forms(f):
    assert isinstance(f, pcbatch.Autobatched)
    np.testing.assert_array_equal(f(N), COLLATZ)
    assert f(N).shape == (len(N),)


def test_decorator_keeps_metadata_and_options():
    assert with_options.__name__ == "with_options"
    assert with_options.max_stack_depth == 16
    assert with_options.max_steps == 100_000
    assert functional.__name__ == "_collatz"
    assert "with_options" in repr(with_options)


def test_decorator_rejects_bad_arguments():
    with pytest.raises(TypeError):
        pcbatch.autobatch(42)
    with pytest.raises(ValueError):
        pcbatch.autobatch(_collatz, max_stack_depth=0)


def test_exports():
    for name in ("autobatch", "Autobatched", "PcbatchError", "UnsupportedSyntaxError", "TypeMismatchError",
                 "StackOverflowError", "MaxStepsExceededError"):
        assert hasattr(pcbatch, name)


# --- in_axes ----------------------------------------------------------------

@pcbatch.autobatch(in_axes=(None, 0))
def lookup_walk(table, i):
    """Follow table[i] until it is 0; shared table, per-example start."""
    hops = 0
    while table[i] != 0:
        i = table[i]
        hops += 1
    return hops


TABLE = np.asarray([0, 0, 1, 2, 3, 4], np.int32)  # table[i] = i - 1 for i >= 1: hops(i) = i - 1 (i >= 1)


def test_in_axes_tuple_with_shared_argument():
    starts = np.asarray([1, 5, 3, 0], np.int32)
    # i = 1 -> table[1] = 0: 0 hops; i = 5 -> 4 -> 3 -> 2 -> 1: 4 hops; i = 3: 2 hops; i = 0: 0 hops
    np.testing.assert_array_equal(lookup_walk(TABLE, starts), [0, 4, 2, 0])
    np.testing.assert_array_equal(lookup_walk(TABLE, starts), lookup_walk.reference(TABLE, starts))


@pcbatch.autobatch(in_axes=0)
def scale_sum(xs, k):
    total = 0.0
    for i in range(k):
        total = total + xs[i] * (i + 1)
    return total


def test_in_axes_int_and_nonzero_axis():
    xs = np.arange(12, dtype=np.float32).reshape(3, 4)  # 3 examples of 4 values
    k = np.asarray([0, 2, 4], np.int32)
    # example 0: empty sum; example 1: 4*1 + 5*2 = 14; example 2: 8 + 18 + 30 + 44 = 100
    expected = [0.0, 14.0, 100.0]
    np.testing.assert_array_equal(scale_sum(xs, k), expected)
    # The same examples with the batch on axis 1 of xs.
    transposed = pcbatch.autobatch(scale_sum.fn, in_axes=(1, 0))
    np.testing.assert_array_equal(transposed(xs.T, k), expected)
    np.testing.assert_array_equal(transposed.reference(xs.T, k), expected)


@pcbatch.autobatch(in_axes=({"w": None, "x": 0}, 0))
def pytree_prefix(p, n):
    """p["w"] is shared, p["x"] is per example."""
    acc = p["x"]
    for i in range(n):
        acc = acc * p["w"][i % 2] + 1
    return {"acc": acc, "w0": p["w"][0]}


def test_in_axes_pytree_prefix():
    p = {"w": np.asarray([2, 3], np.int32), "x": np.asarray([1, 0, 5], np.int32)}
    n = np.asarray([0, 3, 1], np.int32)
    out = pytree_prefix(p, n)
    # example 0: 1; example 1: ((0*2+1)*3+1)*2+1 = 9; example 2: 5*2+1 = 11
    np.testing.assert_array_equal(out["acc"], [1, 9, 11])
    # a shared value returned is broadcast along the batch
    np.testing.assert_array_equal(out["w0"], [2, 2, 2])
    ref = pytree_prefix.reference(p, n)
    jax.tree_util.tree_map(np.testing.assert_array_equal, out, ref)


@pcbatch.autobatch(in_axes=(0, None))
def shared_scalar(n, k):
    return n * k + 1


def test_in_axes_shared_scalar_and_python_values():
    np.testing.assert_array_equal(shared_scalar(np.asarray([0, 1, 2], np.int32), 10), [1, 11, 21])


def test_mismatched_batch_sizes_raise_value_error():
    with pytest.raises(ValueError, match="batch"):
        scale_sum(np.zeros((3, 4), np.float32), np.asarray([1, 2], np.int32))


def test_in_axes_errors():
    with pytest.raises(ValueError):  # nothing is batched
        pcbatch.autobatch(_collatz, in_axes=None)(N)
    with pytest.raises(ValueError):  # in_axes has the wrong length
        pcbatch.autobatch(scale_sum.fn, in_axes=(0, 0, 0))(np.zeros((2, 4), np.float32), np.asarray([1, 2], np.int32))


# --- pytree results ---------------------------------------------------------

@pcbatch.autobatch
def minmax(xs, n):
    lo = xs[0]
    hi = xs[0]
    for i in range(1, n):
        lo = jnp.minimum(lo, xs[i])
        hi = jnp.maximum(hi, xs[i])
    return Pair(lo, hi)


@pcbatch.autobatch
def as_dict(n):
    if n < 0:
        return {"sign": -1, "abs": -n}
    return {"sign": 1, "abs": n}


@pcbatch.autobatch
def as_tuple(n):
    return n, (n * 2, n * 0.5)


def test_namedtuple_return():
    xs = np.asarray([[3, 1, 4, 1], [5, 9, 2, 6], [5, 3, 5, 8]], np.int32)
    n = np.asarray([1, 4, 3], np.int32)
    out = minmax(xs, n)
    assert isinstance(out, Pair)
    np.testing.assert_array_equal(out.lo, [3, 2, 3])
    np.testing.assert_array_equal(out.hi, [3, 9, 5])


def test_dict_and_tuple_returns():
    n = np.asarray([-3, 0, 4], np.int32)
    out = as_dict(n)
    assert isinstance(out, dict) and set(out) == {"sign", "abs"}
    np.testing.assert_array_equal(out["sign"], [-1, 1, 1])
    np.testing.assert_array_equal(out["abs"], [3, 0, 4])
    out = as_tuple(n)
    assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure((0, (0, 0)))
    np.testing.assert_array_equal(out[0], n)
    np.testing.assert_array_equal(out[1][0], 2 * n)
    np.testing.assert_array_equal(out[1][1], n * 0.5)
    assert out[1][1].dtype == jnp.float32


def test_pytree_result_structure_matches_reference():
    n = np.asarray([-3, 0, 4], np.int32)
    for f, args in ((as_dict, (n,)), (as_tuple, (n,)),
                    (minmax, (np.ones((3, 2), np.int32), np.asarray([1, 2, 1], np.int32)))):
        out, ref = f(*args), f.reference(*args)
        assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(ref)
        for leaf in jax.tree_util.tree_leaves(out):
            assert leaf.shape[0] == 3


# --- caching ----------------------------------------------------------------

def test_with_schedule_returns_the_same_copy_and_its_machines():
    f = pcbatch.autobatch(_collatz)
    depth = f.with_schedule("depth")
    depth(N)
    count = depth.trace_count
    assert f.with_schedule("depth") is depth and f.with_schedule("agenda") is not depth
    f.with_schedule("depth")(N)
    assert depth.trace_count == count   # not compiled again
    assert f.trace_count == 0           # the original compiled nothing


def test_cache_per_signature():
    f = pcbatch.autobatch(_collatz)
    f(N)
    count = f.trace_count
    assert count >= 1
    f(N + 1)  # same shape and dtype
    assert f.trace_count == count
    f(np.asarray([3, 5], np.int32))  # new batch size: a new machine
    assert f.trace_count > count
    count = f.trace_count
    f(np.asarray([9, 10], np.int32))
    assert f.trace_count == count



def test_executable_per_signature_and_stages_shared():
    """`f.executable(*args)`: one `Executable` per call `Signature`, the one a
    call runs; `with_options` reuses the block IR (and lowered programs) its
    options leave valid, never the executables."""
    from pcbatch.compile import Signature
    f = pcbatch.autobatch(_collatz)
    exe, inputs = f.executable(N)
    assert isinstance(exe.signature, Signature) and exe.batch == N.shape[0] and exe.shared == (False,)
    assert list(inputs) == list(exe.prog.entry_params)
    np.testing.assert_array_equal(exe.runner(inputs, exe.new_workspace())[0], f(N))
    assert f.executable(N + 1)[0] is exe                          # same shapes and dtypes
    assert f.executable(N[:2])[0] is not exe                      # another batch size
    assert hash(exe.signature) == hash(f.executable(N + 1)[0].signature)
    g = f.with_options(max_steps=10_000)
    assert g.ir() is f.ir() and g.executable(N)[0] is not exe
    assert f.with_options(fork=False).ir() is not f.ir()


def test_works_under_jit_and_vmap_of_results():
    out = jax.jit(lambda n: bare(n) * 2)(N)
    np.testing.assert_array_equal(out, [2 * c for c in COLLATZ])


def test_a_call_on_concrete_arguments_inside_jit_is_traced_into_it():
    """Arguments closed over by a jitted function (or a lax.cond branch, a scan body) are
    concrete there: the call ran the eager machine inside the trace, which raised JAX's
    "compiler_options can only be passed to top-level jax.jit" or kept a leaked tracer as
    its workspace, and every later call raised UnexpectedTracerError."""
    n = jnp.asarray(N)
    for _ in range(2):
        np.testing.assert_array_equal(jax.jit(lambda: bare(n) * 2)(), [2 * c for c in COLLATZ])
        np.testing.assert_array_equal(jax.jit(lambda: bare.checked(n)[0])(), COLLATZ)
    np.testing.assert_array_equal(bare(n), COLLATZ)


def test_reference_under_jit_is_a_named_error():
    """The original Python cannot decide its `while` on traced values: a named error
    (JAX's TracerBoolConversionError came out of the user's own line before)."""
    np.testing.assert_array_equal(bare.reference(N[:2]), COLLATZ[:2])
    with pytest.raises(pcbatch.ArgumentError, match="reference.*outside jax.jit"):
        jax.jit(bare.reference)(N[:2])


# --- listings ---------------------------------------------------------------

@pcbatch.autobatch
def fib(n):
    if n <= 1:
        return n
    return fib(n - 1) + fib(n - 2)


def test_ir_listing_shows_blocks_and_calls():
    text = str(fib.ir())
    assert "fib" in text
    assert len(re.findall(r"\bb\d+\b", text)) >= 3, text  # several blocks
    assert re.search(r"\bcall\b", text), text
    assert re.search(r"\breturn\b", text), text
    assert re.search(r"\bbranch\b", text), text
    loop_text = str(bare.ir())
    assert not re.search(r"\bcall\b", loop_text), loop_text


def test_lowered_listing_shows_variable_classes():
    text = str(fib.lowered(N))
    for word in ("stacked", "register", "temporary", "push", "pop", "pushjump"):
        assert word in text, (word, text)


def test_loop_only_program_needs_no_stacks():
    text = str(bare.lowered(N))
    assert "register" in text
    assert not re.search(r"^\s*stacked:", text, re.M), text
    assert "push" not in text and "pop" not in text


def test_trace_has_one_entry_per_example():
    traces = fib.with_options(fork=True).reference_trace(np.asarray([0, 5, 2], np.int32))
    assert len(traces) == 3
    assert all(t.finished for t in traces)
    assert [int(t.result) for t in traces] == [0, 5, 1]  # fib(0), fib(5), fib(2)
    # fib(5) makes 15 calls, fib(2) 3, fib(0) 1: more work means more blocks run
    assert len(traces[0].blocks) < len(traces[2].blocks) < len(traces[1].blocks)
    # With fork-join every call runs in a lane of its own: no lane recurses.
    assert all(t.max_depth == 1 for t in traces)
    sequential = fib.with_options(fork=False).reference_trace(np.asarray([0, 5, 2], np.int32))
    assert [int(t.result) for t in sequential] == [0, 5, 1]
    assert sequential[0].max_depth < sequential[2].max_depth < sequential[1].max_depth


def test_reference_runs_original_python():
    np.testing.assert_array_equal(bare.reference(N), COLLATZ)


@pcbatch.autobatch
def int_or_float(d, x):
    if d <= 0:
        return 0              # a Python int on this path
    return x * 0.25 + d       # a float on the other


def test_reference_with_mixed_result_types_under_jax_grad():
    """The reference stacks a Python int beside a traced float (found by the
    gradient fuzz: it converted the tracer to NumPy to check for lost values)."""
    d, x = jnp.asarray([0, 2, 0]), jnp.asarray([1.0, 2.0, 3.0])
    got = jax.grad(lambda x: int_or_float.reference(d, x).sum())(x)
    np.testing.assert_array_equal(got, [0.0, 0.25, 0.0])
    np.testing.assert_array_equal(jax.grad(lambda x: int_or_float(d, x).sum())(x), got)


@pcbatch.autobatch
def last_counter(a, b, s):
    last = a
    for i in range(a, b, s):
        last = i              # a Python int in the per-example Python
    return last


def test_reference_holds_python_ints_beyond_int32():
    """A `range` counter over uint32 bounds is a Python int past int32 in the
    per-example Python: the reference stacks it as the uint32 the other
    examples give (it raised OverflowError), equal to the machine's."""
    a = np.array([4294967290, 0, 7], np.uint32)
    b = np.array([4294967295, 4294967295, 3], np.uint32)
    s = np.array([4, 2147483648, 1], np.uint32)
    want = np.array([4294967294, 2147483648, 7], np.uint32)
    for got in (last_counter.reference(a, b, s), last_counter(a, b, s)):
        np.testing.assert_array_equal(got, want)
        assert got.dtype == np.uint32
    np.testing.assert_array_equal(last_counter.reference(a[:2], b[:2], s[:2]), want[:2])   # all Python ints


def test_trace_and_tape_info_on_an_empty_batch_and_under_jit():
    """Host-side introspection: a batch of 0 records nothing (as `f(...)` returns empty
    results); traced arguments are a named error, not a JAX internal one."""
    power = pcbatch.autobatch(lambda_free_power)
    trace = power.trace(jnp.zeros((0,)), jnp.zeros((0,), jnp.int32))
    assert trace.total == 0 and trace.blocks.shape == (0,) and trace.counts.shape[0] == 0
    info = power.tape_info(jnp.zeros((0,)), jnp.zeros((0,), jnp.int32))
    assert info.needed == 0 and info.steps == 0
    for what in (power.trace, power.tape_info):
        with pytest.raises(pcbatch.ArgumentError, match="concrete arguments"):
            jax.jit(lambda x: what(x, jnp.array([1, 2])))(jnp.ones(2))


_COMPILES: list[str] = []
_COUNTING = [False]


def _count_compiles(event: str, duration: float, **_: Any) -> None:
    if _COUNTING[0] and event.startswith("/jax/core/compile/"):   # tracing, lowering or compiling
        _COMPILES.append(event)


jax.monitoring.register_event_duration_secs_listener(_count_compiles)


def test_trace_compiles_once_per_signature():
    """`f.trace` keeps its jitted run: a second trace of the same shapes traces and
    compiles nothing (each took a full compile before: ~3 s for fib) and records the same steps."""
    power = pcbatch.autobatch(lambda_free_power, fork=False)
    x, n = jnp.array([2.0, 3.0, 0.5]), jnp.array([3, 0, 5], jnp.int32)
    first = power.trace(x, n, steps=64)
    other_x = jax.block_until_ready(x + 1)
    _COMPILES.clear()
    _COUNTING[0] = True
    try:
        again = power.trace(other_x, n, steps=64)
    finally:
        _COUNTING[0] = False
    assert _COMPILES == []
    np.testing.assert_array_equal(again.blocks, first.blocks)
    assert again.total == first.total > 0


def lambda_free_power(x, n):
    return 1.0 if n == 0 else x * lambda_free_power(x, n - 1)


def test_eager_vmap_of_an_autobatched_function_warns_nothing():
    import warnings
    fib_like = pcbatch.autobatch(lambda_free_power)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = jax.vmap(fib_like)(jnp.full((3, 2), 2.0), jnp.array([[1, 2], [3, 0], [2, 2]]))
    np.testing.assert_allclose(np.asarray(out), [[2.0, 4.0], [8.0, 1.0], [4.0, 4.0]])


def test_a_pool_compiled_for_checked_also_runs_plain_calls():
    """f.checked and f(x) on a fork-join pool, in either order: one machine compiled, not
    two (a pool compiles in seconds; its block count costs ~2% of a step). A plain machine
    keeps its lean twin for plain calls (there the count costs ~37%)."""
    @pcbatch.autobatch(fork=True)
    def tree(n):
        if n <= 1:
            return n
        return tree(n - 1) + tree(n - 2)

    n = jnp.array([3, 6, 1, 7], jnp.int32)
    out, status = tree.checked(n)
    assert int(status.peak_lanes) > 4 and tree.trace_count == 1
    np.testing.assert_array_equal(tree(n), out)
    np.testing.assert_array_equal(out, tree.reference(n))
    assert tree.trace_count == 1
    other = tree.with_options(max_lanes=64)  # plain call first
    np.testing.assert_array_equal(other(n), out)
    np.testing.assert_array_equal(other.checked(n)[0], out)
    assert other.trace_count == 1
    plain = tree.with_options(fork=False)
    plain.checked(n)
    plain(n)
    assert plain.trace_count == 2
