"""TypeMismatchError text: two classes of one name print differently, and a
parameter's side names the parameter's line (issue 16, item 8)."""
import collections
import inspect
import os
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
import pytest

import pcbatch
from pcbatch import TypeMismatchError

HERE = os.path.basename(__file__)
HINT = ("Hint: every assignment to a variable (and every return of a function) must have the same shape and "
        "tree structure; dtypes are joined by JAX's promotion rules. Use separate variable names, or "
        "cast/reshape explicitly.")
N = np.asarray([0, 1, 2, 3], np.int32)


class Point(NamedTuple):  # DEF_POINT
    x: object
    y: object


class Shapes:
    class Point(NamedTuple):  # DEF_SHAPES_POINT
        x: object
        y: object


# Its qualname is `Point` too, and `collections.namedtuple` records no line.
LegacyPoint = collections.namedtuple("Point", "x y")
# Two classes alike in every name: only the note tells them apart.
PairA, PairB = collections.namedtuple("Pair", "a b"), collections.namedtuple("Pair", "a b")


def line_of(marker, fn=None):
    """(line number, stripped text) of the one line ending in `marker`."""
    lines, start = inspect.getsourcelines(fn) if fn else (open(__file__).read().splitlines(True), 1)
    hits = [(start + k, line.strip()) for k, line in enumerate(lines)
            if line.rstrip().endswith(marker)]
    assert len(hits) == 1, (marker, hits)
    return hits[0]


def quote(marker, fn):
    lineno, code = line_of(marker, getattr(fn, "fn", fn))
    return f'  File "{__file__}", line {lineno}\n    {code}'


@pcbatch.autobatch
def two_points(n):
    p = Point(n, n + 1)  # FIRST
    if n > 1:
        p = Shapes.Point(n, n)  # SECOND
    return p.x + p.y


@pcbatch.autobatch
def legacy_point_returned(n):
    if n > 1:
        return Point(n, n)  # FIRST
    return LegacyPoint(n, n)  # SECOND


def test_two_namedtuples_of_one_name_are_qualified_by_module_and_line():
    with pytest.raises(TypeMismatchError) as info:
        two_points(N)
    a = f"{__name__}.Point@{HERE}:{line_of('# DEF_POINT')[0]}"
    b = f"{__name__}.Shapes.Point@{HERE}:{line_of('# DEF_SHAPES_POINT')[0]}"
    assert str(info.value) == (
        f"variable `two_points.p` has type {a}(x=i32[], y=i32[]) here:\n{quote('# FIRST', two_points)}\n"
        f"but type {b}(x=i32[], y=i32[]) here:\n{quote('# SECOND', two_points)}\n{HINT}")


def test_namedtuple_without_a_source_line_is_still_told_apart():
    with pytest.raises(TypeMismatchError) as info:
        legacy_point_returned(N)
    a = f"{__name__}.Point@{HERE}:{line_of('# DEF_POINT')[0]}"
    assert str(info.value) == (
        f"the return value of `legacy_point_returned` has type {a}(x=i32[], y=i32[]) here:\n"
        f"{quote('# FIRST', legacy_point_returned)}\n"
        f"but type {__name__}.Point(x=i32[], y=i32[]) here:\n{quote('# SECOND', legacy_point_returned)}\n{HINT}")


@pcbatch.autobatch
def identical_names(n):
    p = PairA(n, n)  # FIRST
    if n > 1:
        p = PairB(n, n)  # SECOND
    return p[0]


def test_classes_alike_in_every_name_are_said_to_differ():
    with pytest.raises(TypeMismatchError) as info:
        identical_names(N)
    t = f"{__name__}.Pair(a=i32[], b=i32[])"
    assert str(info.value) == (
        f"variable `identical_names.p` has type {t} here:\n{quote('# FIRST', identical_names)}\n"
        f"but type {t} (a different tree structure that prints the same) here:\n"
        f"{quote('# SECOND', identical_names)}\n{HINT}")


@pcbatch.autobatch
def point_or_pair(n):
    p = Point(n, n)  # FIRST
    if n > 1:
        p = (n, n)  # SECOND
    return p[0]


def test_types_that_print_differently_stay_short():
    with pytest.raises(TypeMismatchError) as info:
        point_or_pair(N)
    assert str(info.value) == (
        f"variable `point_or_pair.p` has type Point(x=i32[], y=i32[]) here:\n{quote('# FIRST', point_or_pair)}\n"
        f"but type (i32[], i32[]) here:\n{quote('# SECOND', point_or_pair)}\n{HINT}")


@pcbatch.autobatch
def parameter_reassigned(n,
                         acc):  # PARAM
    if n <= 0:
        return acc
    acc = jnp.zeros(3)  # a web of its own (Python rebinds `acc`), passed to the parameter:
    return parameter_reassigned(n - 1, acc)  # SECOND


@pcbatch.autobatch
def parameter_passed_another_shape(n, x):  # PARAM
    if n <= 0:
        return x.sum()
    return parameter_passed_another_shape(n - 1, jnp.stack([x, x]))  # SECOND


@pytest.mark.parametrize("f,var", [(parameter_reassigned, "acc"), (parameter_passed_another_shape, "x")],
                         ids=["reassigned", "recursive-call"])
def test_a_parameter_side_names_the_parameter_line(f, var):
    with pytest.raises(TypeMismatchError) as info:
        f(N, np.zeros(4, np.float32))
    second = "f32[3]" if var == "acc" else "f32[2]"
    assert str(info.value) == (
        f"variable `{f.fn.__name__}.{var}` has type f32[] here:\n{quote('# PARAM', f)}\n"
        f"but type {second} here:\n{quote('# SECOND', f)}\n{HINT}")


def reshaped_then_returned(v):
    t = v * 2  # T_FIRST
    if v[0] > 0:
        t = t.sum()  # T_SECOND
    return t


def test_a_variable_merged_into_the_return_slot_is_named():
    """`t` is copied into the return value and merged with it (copy coalescing): the
    error names `t` as well as the return value, at both of t's lines (both reach
    the return: one web, which cannot be split)."""
    with pytest.raises(TypeMismatchError) as info:
        pcbatch.autobatch(reshaped_then_returned)(jnp.ones((2, 3)))
    text = str(info.value)
    assert text.startswith("variable `t` (the return value of `reshaped_then_returned`) has type f32[3] here:")
    assert line_of("# T_FIRST", reshaped_then_returned)[1] in text
    assert line_of("# T_SECOND", reshaped_then_returned)[1] in text


@pcbatch.autobatch
def none_default_then_passed(n, y=None):  # NONE_PARAM
    if y is None:
        return none_default_then_passed(n, y=n * 2)  # NONE_VALUE
    if n <= 0:
        return y
    return none_default_then_passed(n - 1, y=y + 1)


def test_a_parameter_none_at_one_call_and_a_value_at_another_says_so():
    """Found by a bug hunt: Python runs this (`y` is None only at the first call);
    pcbatch's one type per variable cannot, and the hint said to cast or reshape."""
    with pytest.raises(TypeMismatchError) as info:
        none_default_then_passed(N)
    text = str(info.value)
    assert text.startswith("variable `none_default_then_passed.y` has type None here:")
    assert quote("# NONE_VALUE", none_default_then_passed) in text
    assert "a parameter left at its `None` default" in text and "`y=0`" in text


# --------------------------------------------------------------------------
# Rebinding a name to another type: each web is a variable of its own
# (pcbatch/ir/webs.py), checked against the function run example by example.
# --------------------------------------------------------------------------

def rebinds(n, xs):
    h = xs * 2.0  # f32[3]
    h = h.sum()  # f32[]: rebound in straight-line code
    s = h
    if n > 1:
        g = xs[:2] * n  # f32[2], live across the call
        g = rebinds(n - 1, xs * 0.5) + g.sum()  # rebound to the call's f32[]: typed last (it needs the return type)
        s = g * 0.5  # so typed first with g's f32[2]: the join that fails is s's (one web), not g's
    else:
        g = (xs[0], h)  # a tuple
        g = g[0] * g[1]  # f32[] on both branches: the join after agrees
    acc = 0.0
    for i in range(n):
        v = xs * i  # a web confined to one trip of the loop
        v = v.max()
        acc = acc + v
    acc = jnp.stack([acc, s])  # rebound after the loop
    return g + acc.sum()


REBIND_N = np.asarray([0, 1, 3], np.int32)
REBIND_XS = np.arange(9, dtype=np.float32).reshape(3, 3) / 4


@pytest.mark.parametrize("fork,how", [(False, "eager"), (True, "eager")] + [
    pytest.param(fork, how, marks=pytest.mark.matrix) for fork in (False, True) for how in ("jit", "grad")])
def test_a_name_rebound_to_another_type_runs_as_python(fork, how):
    import jax
    f = pcbatch.autobatch(rebinds, fork=fork)
    examples = [(int(n), jnp.asarray(x)) for n, x in zip(REBIND_N, REBIND_XS)]
    if how == "grad":
        got = jax.grad(lambda xs: f(REBIND_N, xs).sum())(REBIND_XS)
        want = [jax.grad(lambda x, n=n: rebinds(n, x))(x) for n, x in examples]
    else:
        got = (jax.jit(f) if how == "jit" else f)(REBIND_N, REBIND_XS)
        want = [rebinds(n, x) for n, x in examples]
    np.testing.assert_allclose(got, np.stack(want), rtol=1e-6)
    if how == "eager" and not fork:  # each web prints as the user's name
        listing = str(f.lowered(REBIND_N, REBIND_XS))
        assert "%w" not in listing and "v:f32[3] = xs * i" in listing and "v:f32[] = v.max()" in listing


@pcbatch.autobatch(fork=False)
def carried_through_the_loop(n, xs):
    h = xs.sum()
    y = h * 2  # the web of the first `h` ends here: split off
    h = xs  # WEB_FIRST
    for i in range(n):
        h = h.sum()  # WEB_SECOND
    return y + h


@pcbatch.autobatch
def rebound_on_one_branch(n, xs):
    h = xs  # WEB_FIRST
    if n > 1:
        h = rebound_on_one_branch(n - 1, xs).sum()  # WEB_SECOND
    return h * 2  # both reach this use: one web


@pcbatch.autobatch(fork=False)
def conditional_expression(n, xs):
    h = (xs if n > 1  # WEB_FIRST
         else xs.sum())  # WEB_SECOND
    return h * 2


@pytest.mark.parametrize("f", [carried_through_the_loop, rebound_on_one_branch, conditional_expression],
                         ids=["loop-carried", "if-join", "if-expression"])
def test_one_web_of_two_types_is_still_a_named_error(f):
    """A use that sees both types cannot be split: the error names the user's
    variable (not a web's IR name) and quotes both lines."""
    with pytest.raises(TypeMismatchError) as info:
        f(N, np.ones((4, 3), np.float32))
    text = str(info.value)
    assert "%w" not in text and f"`{f.fn.__name__}.h`" in text and info.value.var == f"{f.fn.__name__}.h", text
    for marker in ("# WEB_FIRST", "# WEB_SECOND"):
        assert f"line {line_of(marker, f.fn)[0]}" in text, (marker, text)
