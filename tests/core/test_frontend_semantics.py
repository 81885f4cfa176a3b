"""Python semantics the frontend must keep (each compared with the original Python
run one example at a time, `f.reference`), under both machines."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pcbatch


def same(got, want):
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def check(fn, *args, fork):
    f = pcbatch.autobatch(fn, fork=fork)
    same(f(*args), f.reference(*args))


FORKS = pytest.mark.parametrize("fork", [False, True])
# fork=False in `make test`, fork=True in `make test-matrix` only. Mostly for programs without
# an autobatched call: nothing forks, and fork=True lowers them to the very program fork=False
# does (one lane per example), so compiling it again checks nothing more. (`membership` and
# `kw_boolops` lower otherwise with fork=True: they keep both.)
FORK_TRUE_IN_MATRIX = pytest.mark.parametrize("fork", [False, pytest.param(True, marks=pytest.mark.matrix)])


# --- keyword arguments are flattened like positional ones ---------------------

def add(a, b):
    return a + b


@pcbatch.autobatch
def kw_fib(n):
    if n < 2:
        return n
    return add(a=kw_fib(n - 1), b=kw_fib(n - 2))  # autobatched calls in a plain helper's keywords


def kw_boolops(x, y):
    d = dict(b=y or 7, c=x and y)
    return add(a=x, b=y or 7) + add(x, b=y if x > 1 else -y) + d["b"] + d["c"]


@FORKS
def test_keyword_arguments_are_flattened(fork):
    x, y = jnp.array([1, 2, 3, 0]), jnp.array([0, 5, 9, 4])
    check(kw_boolops, x, y, fork=fork)
    f = kw_fib.with_options(fork=fork)
    n = jnp.array([0, 1, 5, 7])
    same(f(n), kw_fib.reference(n))


# --- `and`/`or`/`not`/chained comparisons inside comprehensions ---------------

def comprehension_boolops(x):
    a = sum([i and x for i in range(3)]) + sum([i or x for i in range(3)])  # Python's `and` on range's ints
    b = sum([x for i in range(4) if i > 0 and i < 3]) + sum([x * (0 < i < 2) for i in range(3)])
    c = sum([x for i in range(3) if not i]) + sum([(x > i) and (x < 5) for i in range(3)])
    d = sum([1 < x < 5 for i in range(2)]) + sum([x for i in range(3) if 0 < i < 2 or not i])
    return a, b, c, d


@FORK_TRUE_IN_MATRIX
def test_comprehension_boolops_keep_python_semantics(fork):
    check(comprehension_boolops, jnp.array([5, 7, 2, 0]), fork=fork)


def traced_and_in_comprehension(x):
    return sum([x and i for i in range(3)])


def test_comprehension_and_on_a_traced_number_is_a_named_error():
    f = pcbatch.autobatch(traced_and_in_comprehension)
    with pytest.raises(pcbatch.UnsupportedSyntaxError, match=r"(?s)`and` on a per-example value.*x and i.*jnp.where"):
        f(jnp.array([5, 7]))


# --- a comprehension's first iterable is read in the enclosing scope ----------

x = jnp.zeros(3, jnp.int32)  # a global `x` that `[x for x in x]` must not read


def comprehension_shadows(x, y):
    a = sum([x for x in x])
    b = sum([v * y for y in y for v in y])
    c = sum({i: y * i for i, y in enumerate(y)}.values())
    return a, b, c


@FORK_TRUE_IN_MATRIX
def test_comprehension_iterable_reads_the_enclosing_scope(fork):
    check(comprehension_shadows, jnp.arange(6).reshape(2, 3), jnp.arange(8).reshape(2, 2, 2), fork=fork)


# --- a named lambda's defaults are evaluated where it is defined --------------

def lambda_defaults(n):
    y = n + 1
    g = lambda v, k=y: v * k  # noqa: E731 -- k is n + 1, whatever y is later
    m = lambda v, k=kw_fib(n), c=(y if y > 3 else -y): v + k + c  # noqa: E731
    h = lambda v, axis=0: jnp.sum(v, axis=axis)  # noqa: E731 -- a constant default stays static
    y = n + 100
    return g(2) + m(y) + h(jnp.stack([y, n]))


# fork=True forks only inside kw_fib (lambda_defaults calls it once), whose keyword calls
# test_keyword_arguments_are_flattened[True] runs forked: `make test-matrix` runs it here too.
@FORK_TRUE_IN_MATRIX
def test_lambda_defaults_are_read_at_the_definition(fork):
    check(lambda_defaults, jnp.array([1, 2, 3, 6]), fork=fork)


def per_example(fn, *args):
    """`fn` run by plain Python on each example, stacked (independent of pcbatch)."""
    return np.stack([np.asarray(fn(*(a[j] for a in args))) for j in range(len(args[0]))])


# --- a named lambda reads its free variables in the function's scope ----------

def lambda_free_var_vs_lambda_param(x):
    k = x + 1.0
    scale = lambda v: v * k  # noqa: E731 -- f's k, also where called under `lambda k: ...`
    out = jax.tree_util.tree_map(lambda k: scale(k), (x, 2.0 * x))
    return out[0] + out[1]


def lambda_free_var_vs_comprehension(x):
    i = x * 10.0
    add = lambda v: v + i  # noqa: E731
    return sum([add(i) for i in range(3)])


def lambda_free_vars_nested(x):
    i, k = x * 10.0, x + 0.5
    add = lambda v: v + i  # noqa: E731
    twice = lambda i, *k: add(i) * 2 + len(k)  # noqa: E731 -- add inlined under twice's own i and k
    d = {i: add(i) + k for i in range(2)}  # a dict comprehension
    g = sum(twice(j) for j in [i, k] for i in range(2))  # the first iterable reads f's i
    n = sum([sum(add(k) for k in range(i)) for i in range(3)])  # nested, each binds a name add reads
    return twice(k, k, k) + d[0] + d[1] + g + n


@FORK_TRUE_IN_MATRIX
@pytest.mark.parametrize("fn, want", [(lambda_free_var_vs_lambda_param, [6.0, 18.0]),
                                      (lambda_free_var_vs_comprehension, [33.0, 63.0]),
                                      (lambda_free_vars_nested, None)])
def test_an_inlined_lambda_reads_its_free_variables_where_it_is_defined(fn, want, fork):
    x = jnp.array([1.0, 2.0])
    expected = per_example(fn, x)
    if want is not None:
        np.testing.assert_array_equal(expected, want)
    got = pcbatch.autobatch(fn, fork=fork)(x)
    np.testing.assert_array_equal(np.asarray(got), expected)


# --- range(): a bound must be an int; uint32 bounds count in uint32 -----------

def range_of_a_float(n):
    acc = 0
    for i in range(n / 2):
        acc = acc + 1
    return acc


def test_a_float_range_bound_is_a_named_error():
    n = jnp.array([1, 2, 5])
    for j in range(len(n)):
        with pytest.raises(TypeError):
            range_of_a_float(n[j])  # Python raises for every example
    with pytest.raises(pcbatch.UnsupportedSyntaxError, match=r"range\(\) of a float32 value") as info:
        pcbatch.autobatch(range_of_a_float)(n)
    assert "for i in range(n / 2):" in str(info.value)


def last_of_range(a, b):
    k = a
    for i in range(a, b):  # the implicit step 1 (an int32) does not make the counter int32
        k = i
    return k


def last_of_range_step(a, b, s):
    k = a
    for i in range(a, b, s):
        k = i
    return k


def last_of_range_literal_step(a, b):
    k = a
    for i in range(a, b, 2):
        k = i
    return k


def countdown_uint32(n):
    t = 0
    for i in range(n - 1, -1, -1):  # a literal -1 bound: a signed counter
        t = t * 2 + i
    return t


BIG = jnp.array([3_000_000_000, 5, 4_294_967_290], jnp.uint32)


@FORK_TRUE_IN_MATRIX
@pytest.mark.parametrize("fn, args, dtype", [
    (last_of_range, (BIG, BIG + 5), jnp.uint32),
    (last_of_range_step, (BIG, BIG + 5, jnp.array([1, 2, 3], jnp.uint32)), jnp.uint32),
    (last_of_range_literal_step, (BIG, BIG + 5), jnp.uint32),
    (countdown_uint32, (jnp.array([1, 3, 5], jnp.uint32),), jnp.int32),
])
def test_a_range_over_uint32_bounds_does_not_wrap(fn, args, dtype, fork):
    want = [int(fn(*(a[j] for a in args))) for j in range(3)]  # plain Python, one example at a time
    got = pcbatch.autobatch(fn, fork=fork)(*args)
    assert np.asarray(got).tolist() == want
    if not jax.config.jax_enable_x64:
        assert got.dtype == dtype


# --- a chained comparison short-circuits past an autobatched call -------------

@pcbatch.autobatch(max_stack_depth=16)
def down(n):
    if 0 < n < down(n - 1) + 100:  # down(n - 1) only where 0 < n: else it never ends
        return n
    return 0


@pcbatch.autobatch(max_stack_depth=16)
def chained_value(n):
    r = n > 0 <= n - 1 < down(n - 1) + 2 != 7  # a value, not a branch: the last comparison made
    return jnp.where(r, n, -n) + (0 < n == n < chained_value(n - 1) + 50)


@FORKS
def test_chained_comparison_with_a_call_short_circuits(fork):
    n = jnp.array([3, 2, 0, 5, -1])
    for f in (down, chained_value):
        same(f.with_options(fork=fork)(n), f.reference(n))


def membership(op, a, b):
    if op in (0, 1):
        a = a + b
    if op not in [2, 5]:
        a = a * 2
    if 0 <= op in (1, 2, 3):
        a = a - 1
    return a * b


@pytest.mark.parametrize("fork", [False, True])
def test_membership_in_a_literal_tuple_compares_like_python(fork):
    args = jnp.array([0, 1, 2, 3, 5, -1]), jnp.array([2, 3, 4, 5, 6, 7]), jnp.array([5, 6, 7, 8, 9, 10])
    check(membership, *args, fork=fork)


ODD_SMALL = (1, 3, 5)


def membership_beyond_literals(n):
    a = (n in ODD_SMALL) + 2 * (n not in range(-3, 7, 3)) + 4 * (n in range(n // 2, 3))
    return a + 8 * ((n * 0.5) in range(3)) + 16 * (2 in range(n, 10, 2))


def test_membership_in_a_global_tuple_and_a_range_compares_like_python():
    """Found by a bug hunt: `n in G` (a global tuple) and `n in range(a, b)` were
    JAX's TracerBoolConversionError (Python's `in` calls bool() on each `==`)."""
    n = jnp.array([0, 1, 2, 3, 5, -1, 4, 6, -3])
    python = [int(membership_beyond_literals(n[i])) for i in range(len(n))]
    assert pcbatch.autobatch(membership_beyond_literals, fork=False)(n).tolist() == python


def optional_offset(x, y=None):
    if y is None:
        return x
    return x + y


def test_a_parameter_left_at_none_is_a_named_error():
    f = pcbatch.autobatch(optional_offset)
    np.testing.assert_array_equal(f(jnp.arange(3), jnp.ones(3, jnp.int32)), jnp.arange(3) + 1)
    with pytest.raises(pcbatch.UnsupportedSyntaxError, match="`y` is None here") as info:
        f(jnp.arange(3))
    assert info.value.lineno == optional_offset.__code__.co_firstlineno + 3


def last_counter(n):
    acc = n
    for k in range(4):
        acc = acc + k
    return acc + k


def never_runs(n):
    acc = n
    for k in range(0):
        acc = acc + k
    return acc + k


def test_a_loop_over_a_constant_nonempty_range_assigns_its_variable():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error", pcbatch.MaybeUnboundWarning)
        check(last_counter, jnp.array([1, 2]), fork=False)
    with pytest.warns(pcbatch.MaybeUnboundWarning, match="`k` may be read before it is assigned"):
        pcbatch.autobatch(never_runs).lowered(jnp.array([1, 2]))


def walk_none(n):
    if n > 0:
        walk_none(n - 1)  # its result, None, is read and dropped


@FORK_TRUE_IN_MATRIX
def test_a_function_that_returns_nothing_calls_itself(fork):
    n = [0, 2, 5]
    want = [walk_none(k) for k in n]  # Python: None for each
    assert want == [None] * 3
    assert pcbatch.autobatch(walk_none, fork=fork)(jnp.array(n)) is None


def comprehension_if_exp(x):
    return sum([x * i if i % 2 else -i for i in range(4)])


def traced_if_exp_in_comprehension(x):
    return sum([x if x > i else -x for i in range(3)])


def test_a_conditional_expression_in_a_comprehension():
    check(comprehension_if_exp, jnp.array([1, 2, 3]), fork=False)  # on Python values: Python's
    f = pcbatch.autobatch(traced_if_exp_in_comprehension)
    with pytest.raises(pcbatch.UnsupportedSyntaxError, match="conditional expression on a per-example value"):
        f(jnp.array([1, 2, 3]))


def mixed_tuple_assignment(n):
    i, m = 0, n * 2  # i varies in the loop, m is fixed per example
    while i < m:
        i = i + 1
    return i + m


@FORK_TRUE_IN_MATRIX
def test_a_tuple_assignment_of_a_loop_variable_and_a_fixed_value(fork):
    check(mixed_tuple_assignment, jnp.array([1, 2, 3]), fork=fork)


# --- the builtin max/min on per-example scalars: Python's fold -------------------

def tree_height(left, right, node):
    if left[node] < 0:
        return 0
    return 1 + max(tree_height(left, right, left[node]), tree_height(left, right, right[node]))


def max_min_mix(x, y, n):
    return max(x, y, 0.5) + min(n, 3) + max(jnp.stack([x, y])) + min([x, y]) + max(2, 3)


# fork=True in `make test`, where the recursion's two calls in max() fork; fork=False (one lane
# per example, which every other test of this file runs) in `make test-matrix`.
@pytest.mark.parametrize("fork", [pytest.param(False, marks=pytest.mark.matrix), True])
def test_builtin_max_and_min_of_per_example_scalars(fork):
    """`1 + max(height(l), height(r))` was JAX's TracerBoolConversionError. Python
    keeps the first of equals and compares with `>`, so NaN first wins and NaN
    later loses (jnp.maximum would give NaN for both)."""
    left = jnp.array([[1, -1, -1, -1, -1], [1, 3, -1, -1, -1], [-1, -1, -1, -1, -1]])
    right = jnp.array([[2, -1, -1, -1, -1], [2, 4, -1, -1, -1], [-1, -1, -1, -1, -1]])
    node = jnp.zeros(3, jnp.int32)
    h = pcbatch.autobatch(tree_height, in_axes=(0, 0, 0), fork=fork)
    python = [tree_height(left[i], right[i], node[i]) for i in range(3)]
    assert h(left, right, node).tolist() == [int(p) for p in python] == [1, 2, 0]
    x, y = jnp.array([1.0, jnp.nan, 0.2, 0.7]), jnp.array([jnp.nan, 2.0, 0.1, 0.7])
    n = jnp.array([1, 5, 3, -2])
    f = pcbatch.autobatch(max_min_mix, fork=fork)
    python = np.array([float(max_min_mix(x[i], y[i], n[i])) for i in range(4)], np.float32)
    np.testing.assert_array_equal(np.asarray(f(x, y, n)), python)   # NaN where Python's is NaN
    assert np.isnan(python[1]) and not np.isnan(python[0])


def not_of_python_values(n):
    return (not (n,)) + (not ()) * 2 + (not None) * 4 + (not n) * 8


def test_not_of_a_python_value_is_pythons():
    """Found by a bug hunt: `not (n,)` was JAX's raw TypeError (jnp.logical_not of a tuple)."""
    n = jnp.array([0, 3])
    python = [int(not_of_python_values(n[i])) for i in range(2)]
    assert pcbatch.autobatch(not_of_python_values, fork=False)(n).tolist() == python
