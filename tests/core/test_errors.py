"""Every error a user can cause: the exception type, where it points, what it says.

Expected line numbers are computed from the source (the line marked `# BAD`,
or `# LINE1` / `# LINE2`), never hard-coded.
"""
from __future__ import annotations

import inspect
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify, io_callback

import pcbatch
from pcbatch import (
    MaxStepsExceededError,
    PcbatchError,
    StackOverflowError,
    TypeMismatchError,
    UnsupportedSyntaxError,
)


def marked(fn, marker="# BAD"):
    """(line number, code text) of the line carrying `marker` in fn's source."""
    fn = getattr(fn, "fn", fn)
    lines, start = inspect.getsourcelines(fn)
    hits = [(start + k, line.split("#")[0].strip()) for k, line in enumerate(lines) if marker in line]
    assert len(hits) == 1, (fn, marker, hits)
    return hits[0]


def same_file(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


N = np.asarray([0, 1, 2, 3], np.int32)


@pcbatch.autobatch
def fib(n):
    if n <= 1:
        return n
    return fib(n - 1) + fib(n - 2)


# --------------------------------------------------------------------------
# UnsupportedSyntaxError
# --------------------------------------------------------------------------

@pcbatch.autobatch
def uses_try(n):
    try:  # BAD
        n = n + 1
    except ValueError:
        n = n - 1
    return n


@pcbatch.autobatch
def uses_with(n):
    with jax.disable_jit():  # BAD
        n = n + 1
    return n


@pcbatch.autobatch
def uses_yield(n):
    while n > 0:
        yield n  # BAD
        n -= 1


@pcbatch.autobatch
def uses_lambda_ifexp(n):
    g = lambda v: v if v > 0 else -v  # BAD  # noqa: E731
    return g(n)


@pcbatch.autobatch
def uses_lambda_boolop(n):
    return jax.tree_util.tree_map(lambda v: v > 0 and v < 3, n)  # BAD


@pcbatch.autobatch
def uses_nested_def(n):
    def inner(v):  # BAD
        return v + 1
    return inner(n)


COUNTER = 0


@pcbatch.autobatch
def uses_global(n):
    global COUNTER  # BAD
    COUNTER = n
    return n


def _make_nonlocal():
    total = 0

    @pcbatch.autobatch
    def uses_nonlocal(n):
        nonlocal total  # BAD
        total = n
        return n

    return uses_nonlocal


uses_nonlocal = _make_nonlocal()


@pcbatch.autobatch
def uses_del(n):
    m = n + 1
    del m  # BAD
    return n


@pcbatch.autobatch
def uses_for_over_array(xs):
    s = 0
    for x in xs:  # BAD
        s += x
    return s


@pcbatch.autobatch
def uses_for_over_reversed(n):
    s = 0
    for i in reversed(range(n)):  # BAD
        s += i
    return s


@pcbatch.autobatch
def uses_while_else(n):
    while n > 0:  # BAD
        n -= 1
    else:
        n = 5
    return n


@pcbatch.autobatch
def uses_for_else(n):
    s = 0
    for i in range(n):  # BAD
        s += i
    else:
        s = -1
    return s


@pcbatch.autobatch
def uses_walrus(n):
    if (m := n + 1) > 2:  # BAD
        return m
    return n


@pcbatch.autobatch
def uses_subscript_assign(xs):
    xs[0] = 1  # BAD
    return xs


@pcbatch.autobatch
def uses_subscript_augassign(xs):
    xs[0] += 1  # BAD
    return xs


@pcbatch.autobatch
def uses_raise(n):
    if n < 0:
        raise ValueError("negative")  # BAD
    return n


@pcbatch.autobatch
def uses_assert(n):
    assert n >= 0  # BAD
    return n


@pcbatch.autobatch
def uses_import(n):
    import math  # BAD
    return n * math.pi


@pcbatch.autobatch
def uses_class(n):
    class Box:  # BAD
        pass
    return n


@pcbatch.autobatch
def uses_match(n):
    match n:  # BAD
        case 0:
            return 1
    return n


def uses_varargs(*ns):  # BAD
    return ns[0]


@pcbatch.autobatch
def uses_kwonly(n, *, k=1):
    return n + k


@pcbatch.autobatch
def uses_starred_call(n):
    args = (n,)
    return fib(*args)  # BAD


@pcbatch.autobatch
def uses_bad_call_signature(n):
    return fib(n, n)  # BAD


@pcbatch.autobatch
def uses_call_in_comprehension(n):
    return sum([fib(i) for i in range(3)]) + n  # BAD


@pcbatch.autobatch
def uses_tuple_loop_target(n):
    s = 0
    for i, j in range(n):  # BAD
        s += i
    return s


@pcbatch.autobatch
def uses_zero_step(n):
    s = 0
    for i in range(0, n, 0):  # BAD
        s += i
    return s


# Python that needs a concrete value of a per-example one (JAX raises during type inference).
@pcbatch.autobatch
def uses_float_of_value(n):
    return float(n) * 2  # BAD


@pcbatch.autobatch
def uses_tuple_compare(n):
    if (n % 2, n % 3) == (1, 1):  # BAD
        return 1
    return 0


@pcbatch.autobatch
def uses_int_of_value(n):
    k = int(n) + 1  # BAD
    return k


@pcbatch.autobatch
def uses_boolean_mask(n):
    return jnp.arange(4)[jnp.arange(4) < n].sum()  # BAD


CONCRETE = [uses_float_of_value, uses_tuple_compare, uses_int_of_value, uses_boolean_mask]


UNSUPPORTED = [
    uses_try, uses_with, uses_yield, uses_lambda_ifexp, uses_lambda_boolop, uses_nested_def, uses_global,
    uses_nonlocal, uses_del, uses_for_over_array, uses_for_over_reversed, uses_while_else, uses_for_else,
    uses_walrus, uses_subscript_assign, uses_subscript_augassign, uses_import,
    uses_class, uses_match, uses_starred_call, uses_bad_call_signature,
    uses_call_in_comprehension, uses_tuple_loop_target, uses_zero_step,
]


def _call(f):
    if f is uses_for_over_array or f is uses_subscript_assign or f is uses_subscript_augassign:
        return f(np.zeros((4, 3), np.int32))
    return f(N)


@pytest.mark.parametrize("f", UNSUPPORTED, ids=[f.__name__ for f in UNSUPPORTED])
def test_unsupported_syntax(f):
    lineno, code = marked(f)
    with pytest.raises(UnsupportedSyntaxError) as info:
        _call(f)
    e = info.value
    assert isinstance(e, PcbatchError)
    assert e.lineno == lineno, str(e)
    assert same_file(e.filename, __file__)
    message = str(e)
    assert code in message, "the message must quote the offending line"
    assert "Hint:" in message, "the message must say what to write instead"
    # .ir() reports the same error.
    with pytest.raises(UnsupportedSyntaxError):
        f.ir()


def rewritten_float(n):
    return n.astype(jnp.float32) * 2


def rewritten_tuple_compare(n):
    if (n % 2 == 1) & (n % 3 == 1):
        return 1
    return 0


def rewritten_int(n):
    k = n.astype(jnp.int32) + 1
    return k


def rewritten_mask(n):
    return jnp.sum(jnp.where(jnp.arange(4) < n, jnp.arange(4), 0))


@pytest.mark.parametrize("f, rewritten", list(zip(CONCRETE, [rewritten_float, rewritten_tuple_compare, rewritten_int,
                                                              rewritten_mask])), ids=[f.__name__ for f in CONCRETE])
def test_python_that_needs_a_concrete_value_is_named_with_a_rewrite(f, rewritten):
    """Python runs these one example at a time; pcbatch cannot (a named error from
    JAX's, not JAX's own), and the rewrite its hint names gives Python's values."""
    n = np.array([0, 1, 2, 4, 7], np.int32)
    python = [int(f.fn(jnp.int32(v))) for v in n]  # the original function, plain Python
    lineno, code = marked(f)
    with pytest.raises(UnsupportedSyntaxError, match="traced per-example value") as info:
        f(n)
    e = info.value
    assert e.lineno == lineno and same_file(e.filename, __file__) and code in str(e) and "Hint:" in str(e)
    assert isinstance(e.__cause__, (jax.errors.JAXTypeError, jax.errors.JAXIndexError))
    assert np.asarray(pcbatch.autobatch(rewritten)(n)).tolist() == python


@pytest.mark.parametrize("f", [uses_raise, uses_assert], ids=["raise", "assert"])
def test_raise_and_assert_fail_their_examples_quoting_the_line(f):
    """Once unsupported syntax: now the examples where Python raises are reported, by line."""
    lineno, code = marked(f)
    n = np.array([3, -1, 0, -7], np.int32)
    with pytest.raises(pcbatch.ExampleError) as info:
        f(n)
    assert info.value.examples == [1, 3] and isinstance(info.value, PcbatchError)
    assert code in str(info.value) and f"line {lineno}" in str(info.value)


def test_varargs_is_an_error_at_decoration():
    lineno, code = marked(uses_varargs)
    with pytest.raises(UnsupportedSyntaxError) as info:
        pcbatch.autobatch(uses_varargs)
    assert info.value.lineno == lineno and code in str(info.value)
    assert "*ns" in str(info.value) and "Supported Python" in str(info.value)


def test_keyword_only_parameters_bind_like_python():
    n = np.array([1, 2, 3], np.int32)
    np.testing.assert_array_equal(uses_kwonly(n), n + 1)
    np.testing.assert_array_equal(uses_kwonly(n, k=np.array([5, 6, 7], np.int32)), n + [5, 6, 7])
    with pytest.raises(pcbatch.ArgumentError, match="positional"):
        uses_kwonly(n, n)


def test_autobatch_of_a_lambda():
    f = pcbatch.autobatch(lambda n: n + 1)  # BAD
    lineno, _ = marked(test_autobatch_of_a_lambda)
    with pytest.raises(UnsupportedSyntaxError) as info:
        f(N)
    assert info.value.lineno == lineno
    assert same_file(info.value.filename, __file__)
    assert "def" in str(info.value)


def test_source_unavailable():
    namespace = {"pcbatch": pcbatch}
    exec("def g(n):\n    return n + 1\n", namespace)
    f = pcbatch.autobatch(namespace["g"])
    with pytest.raises(UnsupportedSyntaxError) as info:
        f(N)
    assert "source" in str(info.value)


def _plain_helper(n):
    return fib(n) + 1  # BAD


@pcbatch.autobatch
def calls_helper_that_calls_autobatched(n):
    return _plain_helper(n)  # BAD


def test_autobatched_call_from_plain_helper():
    """A plain helper is inlined as primitive code; it cannot make batched calls.
    The error quotes the line that calls the helper (it quoted `fib`'s decorator)."""
    lineno, code = marked(calls_helper_that_calls_autobatched)
    with pytest.raises(UnsupportedSyntaxError) as info:
        calls_helper_that_calls_autobatched(N)
    assert "fib" in str(info.value)
    assert "Hint:" in str(info.value)
    assert info.value.lineno == lineno and code in str(info.value)


def test_unsupported_in_callee_points_at_callee():
    @pcbatch.autobatch
    def caller(n):
        return uses_del(n) + 1

    lineno, code = marked(uses_del)
    with pytest.raises(UnsupportedSyntaxError) as info:
        caller(N)
    assert info.value.lineno == lineno
    assert code in str(info.value)


# --------------------------------------------------------------------------
# TypeMismatchError
# --------------------------------------------------------------------------

@pcbatch.autobatch
def shape_mismatch(n):
    if n > 0:
        x = jnp.zeros(3)  # LINE1
    else:
        x = jnp.zeros(4)  # LINE2
    return x.sum()


@pcbatch.autobatch
def structure_mismatch(n):
    if n > 0:
        x = (n, n)  # LINE1
    else:
        x = n  # LINE2
    return jax.tree_util.tree_leaves(x)[0]  # x is read after the join: one web of two structures


@pcbatch.autobatch
def loop_shape_mismatch(n):
    x = jnp.zeros(2)  # LINE1
    for i in range(n):
        x = jnp.concatenate([x, x])  # LINE2
    return n


@pcbatch.autobatch
def return_mismatch(n):
    if n > 0:
        return n, n  # LINE1
    return n  # LINE2


@pcbatch.autobatch
def recursive_return_mismatch(n):
    if n <= 0:
        return jnp.zeros(2)  # LINE1
    return jnp.zeros(3) + recursive_return_mismatch(n - 1).sum()  # LINE2


@pytest.mark.parametrize("f,var", [(shape_mismatch, "x"), (structure_mismatch, "x"), (loop_shape_mismatch, "x")],
                         ids=["shape", "structure", "loop"])
def test_type_mismatch_names_variable_and_lines(f, var):
    with pytest.raises(TypeMismatchError) as info:
        f(N)
    e = info.value
    assert isinstance(e, PcbatchError)
    message = str(e)
    assert re.search(rf"`(\w+\.)?{var}`", message), message
    assert e.var.split(".")[-1] == var
    for marker in ("# LINE1", "# LINE2"):
        lineno, code = marked(f, marker)
        assert f"line {lineno}" in message, (marker, message)
        assert code in message


@pytest.mark.parametrize("f", [return_mismatch, recursive_return_mismatch], ids=["return", "recursive"])
def test_return_type_mismatch(f):
    with pytest.raises(TypeMismatchError) as info:
        f(N)
    message = str(info.value)
    assert f.__name__ in message
    for marker in ("# LINE1", "# LINE2"):
        lineno, _ = marked(f, marker)
        assert f"line {lineno}" in message, (marker, message)


@pcbatch.autobatch
def and_or_mismatch(n):
    return n <= 0 and (n, n) or and_or_mismatch(n - 1)  # LINE1


def test_a_temporary_is_named_as_part_of_the_expression():
    """`n <= 0 and (n, n)` is `False` or a tuple: the value that holds either is the
    frontend's temporary, which the user never named (it read `f._t2` before)."""
    with pytest.raises(TypeMismatchError) as info:
        and_or_mismatch(N)
    message = str(info.value)
    assert "_t" not in message and "a value computed in `and_or_mismatch`" in message, message
    assert "`a and b` / `a or b` give one of their operands" in message
    lineno, code = marked(and_or_mismatch, "# LINE1")
    assert f"line {lineno}" in message and code in message


def test_type_join_is_not_a_mismatch():
    @pcbatch.autobatch
    def join(n):
        acc = 0
        for i in range(n):
            acc = acc + 0.5
        return acc

    out = join(N)
    assert out.dtype == jnp.float32
    np.testing.assert_array_equal(out, N * 0.5)


# --------------------------------------------------------------------------
# StackOverflowError
# --------------------------------------------------------------------------

def _depth(n):
    if n <= 0:
        return 0
    return 1 + depth(n - 1)


depth = pcbatch.autobatch(_depth, max_stack_depth=8)


@pcbatch.autobatch(max_stack_depth=8)
def fdepth(x, n):
    if n <= 0:
        return x
    return 0.5 + fdepth(x, n - 1)


DEEP = np.asarray([2, 50, 3, 1000, 0], np.int32)  # examples 1 and 3 need far more than 8 frames


def test_stack_overflow_raises_and_names_examples():
    with pytest.raises(StackOverflowError) as info:
        depth(DEEP)
    e = info.value
    assert isinstance(e, PcbatchError)
    assert e.examples == [1, 3]
    message = str(e)
    assert "example 1" in message and "example 3" in message
    assert "example 0" not in message and "example 2" not in message and "example 4" not in message
    assert "max_stack_depth" in message


def test_stack_overflow_reports_the_depth_needed():
    """Example 1 (n = 50) finishes within the 8x search limit; the depth the
    error says it needs must be enough, and one less must not be."""
    with pytest.raises(StackOverflowError) as info:
        depth(DEEP)
    m = re.search(r"example 1 needs max_stack_depth=(\d+)", str(info.value))
    assert m, str(info.value)
    needed = int(m.group(1))
    n = np.asarray([50], np.int32)
    np.testing.assert_array_equal(pcbatch.autobatch(_depth, max_stack_depth=needed)(n), n)
    with pytest.raises(StackOverflowError):
        pcbatch.autobatch(_depth, max_stack_depth=needed - 1)(n)


def test_stack_overflow_checked_flags_only_deep_examples():
    result, status = depth.checked(DEEP)
    np.testing.assert_array_equal(np.asarray(status.overflow), [False, True, False, True, False])
    np.testing.assert_array_equal(np.asarray(status.unfinished), [False] * 5)
    ok = [0, 2, 4]
    np.testing.assert_array_equal(np.asarray(result)[ok], DEEP[ok])  # depth(n) = n
    # and bit-identical to running the shallow examples alone
    np.testing.assert_array_equal(np.asarray(result)[ok], depth(DEEP[ok]))


def test_stack_overflow_boundary_is_exact():
    """Whatever depth `n` takes, max_stack_depth is the deepest that fits: find the
    first n that overflows and check n - 1 runs and matches the reference."""
    ns = np.arange(0, 12, dtype=np.int32)
    _, status = depth.checked(ns)
    flags = np.asarray(status.overflow)
    assert flags.any() and not flags.all()
    first = int(np.argmax(flags))
    assert not flags[:first].any() and flags[first:].all(), "overflow must be monotone in recursion depth"
    ok = ns[:first]
    np.testing.assert_array_equal(depth(ok), depth.reference(ok))


# --------------------------------------------------------------------------
# MaxStepsExceededError
# --------------------------------------------------------------------------

# Terminating examples return BEFORE the loop, in a block with a lower index
# than the loop's: with the default "earliest" scheduler, a lane spinning in a
# lower-numbered block than another lane's next block would starve that lane
# (it legitimately counts as unfinished), which is not what these tests probe.
@pcbatch.autobatch(max_steps=200)
def spin(n):
    """Returns 0 for n <= 0, loops forever otherwise."""
    if n <= 0:
        return 0
    k = 0
    while n > 0:
        k += 1
    return k


@pcbatch.autobatch(max_steps=200)
def fspin(x, n):
    if n <= 0:
        return x
    while n > 0:
        x = x + 1.0
    return x


SPIN = np.asarray([0, 5, -1, 1], np.int32)


def test_max_steps_raises_and_names_examples():
    with pytest.raises(MaxStepsExceededError) as info:
        spin(SPIN)
    e = info.value
    assert isinstance(e, PcbatchError)
    assert e.examples == [1, 3]
    assert e.max_steps == 200
    assert "example 1" in str(e) and "example 3" in str(e)
    assert "example 0" not in str(e)


def test_max_steps_checked_flags():
    result, status = spin.checked(SPIN)
    np.testing.assert_array_equal(np.asarray(status.unfinished), [False, True, False, True])
    np.testing.assert_array_equal(np.asarray(status.overflow), [False] * 4)
    np.testing.assert_array_equal(np.asarray(result)[[0, 2]], [0, 0])


def test_max_steps_not_hit_when_everything_terminates():
    np.testing.assert_array_equal(spin(np.asarray([0, -3], np.int32)), [0, 0])


def test_error_hierarchy():
    for cls in (UnsupportedSyntaxError, TypeMismatchError, StackOverflowError, MaxStepsExceededError):
        assert issubclass(cls, pcbatch.PcbatchError)
        assert issubclass(cls, Exception)


# --------------------------------------------------------------------------
# inside jax.jit: `checked` flags and checkify
# --------------------------------------------------------------------------

def test_checked_under_jit():
    result, status = jax.jit(depth.checked)(DEEP)
    np.testing.assert_array_equal(np.asarray(status.overflow), [False, True, False, True, False])
    np.testing.assert_array_equal(np.asarray(result)[[0, 2, 4]], DEEP[[0, 2, 4]])
    result, status = jax.jit(spin.checked)(SPIN)
    np.testing.assert_array_equal(np.asarray(status.unfinished), [False, True, False, True])


def test_checkify_reports_stack_overflow_under_jit():
    err, out = checkify.checkify(jax.jit(depth))(DEEP)
    assert err.get() is not None
    assert "max_stack_depth" in err.get()
    with pytest.raises(Exception, match="max_stack_depth"):
        err.throw()
    err, out = checkify.checkify(jax.jit(depth))(DEEP[[0, 2, 4]])
    assert err.get() is None
    np.testing.assert_array_equal(out, DEEP[[0, 2, 4]])


def test_checkify_reports_max_steps_under_jit():
    err, _ = checkify.checkify(jax.jit(spin))(SPIN)
    assert err.get() is not None and "max_steps" in err.get()
    err, out = checkify.checkify(jax.jit(spin))(np.asarray([0, -1, 0, -2], np.int32))
    assert err.get() is None
    np.testing.assert_array_equal(out, [0, 0, 0, 0])


def test_failed_examples_never_return_garbage_under_plain_jit():
    """Without checkify, float results of failed examples are NaN, others exact."""
    x = np.asarray([1.0, 2.0, 3.0, 4.0, 5.0], np.float32)
    out = jax.jit(fdepth)(x, DEEP)
    out = np.asarray(out)
    assert np.isnan(out[[1, 3]]).all()
    np.testing.assert_array_equal(out[[0, 2, 4]], fdepth.reference(x[[0, 2, 4]], DEEP[[0, 2, 4]]))
    out = np.asarray(jax.jit(fspin)(x[:4], SPIN))
    assert np.isnan(out[[1, 3]]).all()
    np.testing.assert_array_equal(out[[0, 2]], x[[0, 2]])


def too_wide_literal(n, x):
    v = 3_000_000_000  # WIDE_LITERAL
    if n > 0:
        v = x
    return v


def test_a_literal_past_the_default_int_is_a_named_error():
    """Found by a bug hunt: JAX's raw OverflowError (without x64 a Python int
    past int32 is no array)."""
    f = pcbatch.autobatch(too_wide_literal, fork=False)
    with pytest.raises(pcbatch.UnsupportedSyntaxError, match="default type cannot hold") as e:
        f(jnp.asarray([0, 1]), jnp.asarray([1, 2], jnp.uint32))
    assert "WIDE_LITERAL" in str(e.value)


def ordered_callback(x, n):
    if n <= 0:
        io_callback(lambda v: None, None, x, ordered=True)  # UNBATCHABLE
        return x
    return x + 1.0


def test_a_line_jax_cannot_batch_is_a_named_error():
    """Found by a bug hunt: JAX's raw ValueError from vmapping an ordered
    io_callback (its type inference, one example at a time, passes)."""
    with pytest.raises(UnsupportedSyntaxError, match="cannot be batched") as e:
        pcbatch.autobatch(ordered_callback, fork=False)(jnp.asarray([1.0, 2.0]), jnp.asarray([1, 0]))
    assert "UNBATCHABLE" in str(e.value) and isinstance(e.value.__cause__, ValueError)


def function_alias(n):
    g = jnp.abs  # ALIAS
    return g(n)


def test_a_variable_holding_a_function_is_a_named_error():
    """Found by a bug hunt: `g = jnp.abs` (or `g = f`, an autobatched function) was
    JAX's raw TypeError from an internal function returning a non-JAX value."""
    with pytest.raises(UnsupportedSyntaxError, match="assigned to `g`. is not an array") as e:
        pcbatch.autobatch(function_alias, fork=False)(jnp.asarray([1, -2]))
    assert "ALIAS" in str(e.value) and "lambda" in str(e.value)


def condition_on_a_tuple(n):
    t = (n,)
    if t:  # TUPLE_TEST
        return n
    return -n


def test_a_condition_on_a_tuple_is_a_named_error():
    """Found by a bug hunt: `if t:` on a one-element tuple passed the check for one
    scalar per example and failed in the runtime with JAX's raw ValueError."""
    with pytest.raises(UnsupportedSyntaxError, match=r"a condition on \(i32\[\],\)") as e:
        pcbatch.autobatch(condition_on_a_tuple, fork=False)(jnp.asarray([1, 2]))
    assert "TUPLE_TEST" in str(e.value)
