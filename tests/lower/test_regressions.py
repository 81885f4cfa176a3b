"""Bugs the fuzzer found, kept as regressions (each compared with plain Python)."""
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pcbatch


def cells(fns, forks, keep):
    """`fns` x `forks` as parameters; the (fn, fork) cells not in `keep` are marked
    `matrix` (each compiles a machine or more). `keep` holds every fn once or more, and
    every fork but "auto" (`make test-matrix` only: the default picks one of the two)."""
    assert {f for f, _ in keep} == set(fns) and {k for _, k in keep} == set(forks) - {"auto"}
    return [pytest.param(fn, fork, marks=() if (fn, fork) in keep else (pytest.mark.matrix,),
                         id=f"{fn.__name__}-{fork}") for fn in fns for fork in forks]


@pcbatch.autobatch
def dynamic_step(n, s):
    acc = 0
    for i in range(0, n, s):
        acc += i
    return acc


def test_range_with_data_dependent_step():
    n, s = jnp.array([5, 6, 3, 7]), jnp.array([1, 2, 3, -1])
    np.testing.assert_array_equal(dynamic_step(n, s), dynamic_step.reference(n, s))


@pcbatch.autobatch
def only_dead_call(d):
    return d
    return self_recursive(d)  # noqa: unreachable on purpose


@pcbatch.autobatch
def self_recursive(d):
    if d <= 0:
        return 0
    return self_recursive(d - 1)


def test_function_called_only_from_dead_code():
    x = jnp.array([1, 2])
    np.testing.assert_array_equal(only_dead_call(x), only_dead_call.reference(x))
    assert [f.name for f in only_dead_call.ir().functions] == ["only_dead_call"]


@pcbatch.autobatch(in_axes=(None, 0))
def passes_itself(k, n):
    if n <= 0:
        return k
    return passes_itself(k + 1, n - 1) + passes_itself(k, n - 2)


def test_parameter_changed_on_some_calls_is_not_a_constant():
    k, n = jnp.int32(3), jnp.array([0, 1, 4, 6])
    assert "passes_itself.k" not in passes_itself.lowered(k, n).vars_of_class("constant")
    np.testing.assert_array_equal(passes_itself(k, n), passes_itself.reference(k, n))


@pcbatch.autobatch
def reads_param_after_second_call(n):
    if n <= 0:
        return 0
    m = n - 1
    a = reads_param_after_second_call(m)
    b = reads_param_after_second_call(m)  # the argument copy here must not end n's life
    return a + b + n


def test_parameter_read_only_after_the_second_call_is_saved_across_the_first():
    n = jnp.array([0, 1, 2, 3, 4])
    np.testing.assert_array_equal(reads_param_after_second_call(n), [0, 1, 4, 11, 26])  # 2*f(n-1) + n
    np.testing.assert_array_equal(reads_param_after_second_call(n), reads_param_after_second_call.reference(n))


@pcbatch.autobatch(in_axes=(0, None))
def forks_invariant_args(d, a):
    if d <= 0:
        return d % 1000
    a, v = fork_callee(d - 1, d)  # `d - 1` is fixed per example: an invariant, not a register
    return fork_callee(d - 1, d)[0] % 1000 + a


@pcbatch.autobatch
def fork_callee(d, a):
    return d % 1000, a % 7


def test_fork_with_per_example_invariant_arguments():
    d = jnp.array([0, 3, 5])
    assert "fork" in str(forks_invariant_args.ir())
    np.testing.assert_array_equal(forks_invariant_args(d, 0), forks_invariant_args.reference(d, 0))


# --- a function's return value is not live across its own call (issue 16, item 9) ---
# A port of TFP's recursive NUTS (tfp.experimental.mcmc.nuts_autobatching):
# `build_tree` returns a 6-tuple (three Points: 15 arrays), unpacked into
# locals before the second recursive call; `evolve` calls it from a loop.


class Point(NamedTuple):
    state: Any
    logp: Any
    grad: Any
    mom: Any


def _where(c, a, b):
    return jax.tree_util.tree_map(lambda u, v: jnp.where(c, u, v), a, b)


def _leapfrog(cur, step, direction):
    s = direction * step
    m = cur.mom + 0.5 * s * cur.grad
    x = cur.state + s * m
    m = m + 0.5 * s * -x
    return Point(x, -0.5 * jnp.sum(x * x), -x, m)


@pcbatch.autobatch
def many_steps(num_steps, cur, step, log_slice, leapfrogs):
    if num_steps > 0:
        nxt, new_leapfrogs = evolve(cur, cur, cur, step, log_slice, 0, 1, 0, True)
        return many_steps(num_steps - 1, nxt, step, log_slice, leapfrogs + new_leapfrogs)
    return cur, leapfrogs


@pcbatch.autobatch
def evolve(reverse, forward, next_, step, log_slice, depth, num_states, leapfrogs, cont):
    if cont:
        direction = jnp.where(forward.state[0] > 0, -1.0, 1.0)
        into = _where(direction < 0, reverse, forward)
        reverse_out, forward_out, next_in_subtree, n_sub, more, cont = build_tree(into, direction, depth, step,
                                                                                  log_slice)
        reverse = _where(direction < 0, reverse_out, reverse)
        forward = _where(direction < 0, forward, forward_out)
        next_ = _where(cont & (n_sub * 2 > num_states), next_in_subtree, next_)
        cont = cont & (depth < 3) & (jnp.sum((forward.state - reverse.state) * forward.mom) > 0)
        return evolve(reverse, forward, next_, step, log_slice, depth + 1, num_states + n_sub, leapfrogs + more,
                      cont)
    return next_, leapfrogs


@pcbatch.autobatch
def build_tree(cur, direction, depth, step, log_slice):
    if depth > 0:
        reverse, forward, next_, num_states, leapfrogs, cont = build_tree(cur, direction, depth - 1, step,
                                                                          log_slice)
        more = 0
        if cont:
            in_ = _where(direction < 0, reverse, forward)
            rev_out, fwd_out, far, far_n, more, far_cont = build_tree(in_, direction, depth - 1, step, log_slice)
            reverse = _where(direction < 0, rev_out, reverse)
            forward = _where(direction < 0, forward, fwd_out)
            num_states = num_states + far_n
            next_ = _where(far_n * 2 > num_states, far, next_)
            cont = far_cont & (jnp.sum((forward.state - reverse.state) * forward.mom) > 0)
        return reverse, forward, next_, num_states, leapfrogs + more, cont
    next_ = _leapfrog(cur, step, direction)
    joint = next_.logp - 0.5 * jnp.sum(next_.mom ** 2)
    return next_, next_, next_, jnp.where(joint > log_slice, 1, 0), 1, joint > log_slice - 1000.0


def _nuts_args():
    x = jnp.arange(10, dtype=jnp.float32).reshape(5, 2) / 4 - 0.6
    cur = Point(x, -0.5 * jnp.sum(x * x, 1), -x, jnp.ones((5, 2)) * jnp.array([[1.0], [-0.5], [0.3], [2.0], [1.0]]))
    return jnp.array([0, 1, 2, 3, 4]), cur, jnp.full((5,), 0.1), jnp.full((5,), -3.0), jnp.zeros(5, jnp.int32)


@pytest.mark.parametrize("fork", [True, False])
def test_tuple_return_unpacked_before_second_call_is_never_stacked(fork):
    prog = many_steps.with_options(fork=fork).lowered(*_nuts_args())
    assert "build_tree.<ret>" in prog.vars_of_class("register")
    assert not any(v.endswith(".<ret>") for v in prog.vars_of_class("stacked"))


# Each fork mode's machine compiles in ~2-4 CPU-s: make test runs one lane per example (no call
# here can fork: the lane pool would run every call sequentially), make test-matrix the pool;
# the pool runs forked programs throughout this file.
@pytest.mark.parametrize("fork", [pytest.param(True, marks=pytest.mark.matrix), False])
def test_nuts_port_matches_python(fork):
    args = _nuts_args()
    _assert_trees_close(many_steps.with_options(fork=fork)(*args), many_steps.reference(*args))


def _assert_trees_close(out, ref):
    assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(ref)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), out, ref)


# What the return value may be coalesced with: a local that is live across a
# call of its own function must keep its own slot (the callee writes `<ret>`).


@pcbatch.autobatch
def first_result_kept_across_second_call(d, x):
    if d <= 0:
        return x, x * 2
    r = first_result_kept_across_second_call(d - 1, x + 1)  # read once: `return r` copies it
    a, b = first_result_kept_across_second_call(d - 1, x + 3)
    if a > b - 2 * x:
        return r
    return a + 1, b


@pcbatch.autobatch
def unpacked_then_returned_whole(d, x):
    if d <= 0:
        return x, x + 1, x % 3
    first = unpacked_then_returned_whole(d - 1, x + 1)
    a, b, c = first
    a2, b2, c2 = unpacked_then_returned_whole(d - 1, a + b)
    out = first if c2 > c else (a2, b2 + a, c2)
    return out


@pcbatch.autobatch
def kept_past_a_branch_call(d, x):
    if d <= 0:
        return x, x * 2
    r = kept_past_a_branch_call(d - 1, x + 1)
    s = x
    if x % 2 == 0:  # the second call in another block: no fork
        a, b = kept_past_a_branch_call(d - 1, x + 3)
        s = b - a
    if s > 0:
        return r
    return s, s + 1


@pytest.mark.parametrize("fn, fork", cells(
    [first_result_kept_across_second_call, unpacked_then_returned_whole, kept_past_a_branch_call], [True, False],
    keep=[(first_result_kept_across_second_call, True), (unpacked_then_returned_whole, False),
          (kept_past_a_branch_call, True)]))
def test_value_live_across_a_self_call_keeps_its_own_slot(fn, fork):
    f = fn.with_options(fork=fork)
    d, x = jnp.array([0, 1, 2, 3, 4, 5]), jnp.array([3, -2, 7, 1, 0, 5])
    _assert_trees_close(f(d, x), f.reference(d, x))


@pcbatch.autobatch
def hof_female(n):
    if n <= 0:
        return 1
    return n - hof_male(hof_female(n - 1))


@pcbatch.autobatch
def hof_male(n):
    if n <= 0:
        return 0
    return n - hof_female(hof_male(n - 1))


# No call here can fork (each call's argument is the other's result): fork=True compiles the
# very machine fork=False does, so `make test` runs one, `make test-matrix` both.
@pytest.mark.parametrize("fork", [pytest.param(True, marks=pytest.mark.matrix), False])
def test_mutual_recursion_saves_no_return_value(fork):
    # Each `<ret>` is copied out right after its call: neither lives across one.
    f = hof_female.with_options(fork=fork)
    n = jnp.arange(12)
    assert f.lowered(n).vars_of_class("stacked") == ("hof_female.n", "hof_male.n")
    np.testing.assert_array_equal(f(n), f.reference(n))


@pcbatch.autobatch
def or_of_bool_and_int(k):
    j = k * 0
    return (-((j % 4 == 1) or 8)) % 1000 - 50 + k


def test_short_circuit_or_of_a_bool_and_an_int_types_as_the_join():
    """Found by `make fuzz`: `c or 8` was typed bool from its first arm alone, so
    `-(c or 8)` failed to trace ("neg does not accept dtype bool") before the
    join with the int arm was seen."""
    k = jnp.array([1, 2, 5])
    np.testing.assert_array_equal(or_of_bool_and_int(k), [943, 944, 947])
    np.testing.assert_array_equal(or_of_bool_and_int(k), or_of_bool_and_int.reference(k))


# A local passed to a self-call and read after it (`c = n - 1; x = f(c); ... c`): copy
# coalescing merged `c` into the parameter `n`, and the save across the call was placed
# where the parameter copy had been, before `n = n - 1`: the caller read its old `n`.

def halve_and_add(x):
    if x > 1.0:
        y = x * 0.5
        r = halve_and_add(y)
        return r * 3.0 + y
    return x


def count_down(n):
    if n > 0:
        c = n - 1
        x = count_down(c)
        return x * 2.0 + c
    return 1.0


def loop_of_calls(n):
    s = 0
    while n > 0:
        c = n - 1
        s = s + loop_of_calls(c) * 2 + c
        n = c - 1
    return s


_SELF_CALL_INPUTS = {count_down: [0, 1, 2, 3, 5], loop_of_calls: [0, 1, 2, 3, 6], halve_and_add: [0.5, 1.5, 3.0, 7.0]}


@pytest.mark.parametrize("fn, fork", cells([count_down, loop_of_calls, halve_and_add], [False, True, "auto"],
                                           keep=[(count_down, False), (loop_of_calls, True), (halve_and_add, False)]))
def test_local_passed_to_a_self_call_and_read_after_it(fn, fork):
    xs = _SELF_CALL_INPUTS[fn]
    f = pcbatch.autobatch(fn, fork=fork)
    x = jnp.asarray(xs)
    if fn is halve_and_add:   # the value from the differentiated call's forward: one machine less
        out, pull = jax.vjp(f, x)
        want = jax.grad(lambda v: sum(fn(v[i]) for i in range(len(xs))))(x)
        np.testing.assert_allclose(np.asarray(pull(jnp.ones_like(out))[0]), np.asarray(want), rtol=1e-6)
    else:
        out = f(x)
    np.testing.assert_allclose(np.asarray(out), np.asarray(f.reference(x)))


# Two independent calls where a call's argument is the variable it (or a later call)
# assigns: `i = f(d - 1, i)` or `x = g(d - 1, y); y = g(d - 2, 3)`. Every argument is read
# before either call runs, as in Python; the IR check rejected the Fork (IRError).

def own_result_as_argument(d, i):
    if d <= 0:
        return i + 1
    i = own_result_as_argument(d - 1, i)
    k = d - 1
    return own_result_as_argument(k, d) + i


def later_result_as_argument(d, y):
    if d <= 0:
        return y + 1
    x = later_result_as_argument(d - 1, y)
    y = later_result_as_argument(d - 2, 3)
    return x * 10 + y


# The Fork was rejected: fork=True on both, fork=False (no Fork) on one.
@pytest.mark.parametrize("fn, fork", cells([own_result_as_argument, later_result_as_argument], [True, False, "auto"],
                                           keep=[(own_result_as_argument, True), (later_result_as_argument, True),
                                                 (later_result_as_argument, False)]))
def test_a_call_reading_the_variable_a_sibling_call_assigns(fn, fork):
    f = pcbatch.autobatch(fn, fork=fork)
    d, v = jnp.asarray([0, 1, 2, 3, 5]), jnp.asarray([5, 1, 2, 0, 7])
    np.testing.assert_array_equal(np.asarray(f(d, v)), np.asarray(f.reference(d, v)))


# Calls in one block are regrouped around Forks by their dataflow; a variable's last write
# keeps the name that reads of its value from before the block use, and the regrouping
# ignored that order (write after read): `t = b` moved below `b = f(...)`, or
# `y = y + 1` above a call that reads the old y. Wrong values and gradients.

def read_then_call_overwrites(n, b):
    if n <= 0:
        return b
    t = b
    b = read_then_call_overwrites(0, b * 2 + 5)
    c = read_then_call_overwrites(0, b)
    return t * t + c


def call_read_then_overwrite(n, b):
    if n <= 0:
        return b
    a = call_read_then_overwrite(0, 1.0)
    t = b
    b = call_read_then_overwrite(0, 5.0)
    return a + t * b


def call_then_update_argument(n, y):
    if n <= 0:
        return y
    a = call_then_update_argument(n - 1, y)
    y = y + 1.0
    b = call_then_update_argument(0, y)
    return a + b * y


# Regrouping around Forks: fork=True on all three, fork=False on one.
@pytest.mark.parametrize("fn, fork", cells([read_then_call_overwrites, call_read_then_overwrite,
                                            call_then_update_argument], [True, False, "auto"],
                                           keep=[(read_then_call_overwrites, True), (call_read_then_overwrite, True),
                                                 (call_then_update_argument, True),
                                                 (read_then_call_overwrites, False)]))
def test_regrouped_calls_keep_write_after_read_order(fn, fork):
    f = pcbatch.autobatch(fn, fork=fork)
    n, x = jnp.asarray([1, 1, 2, 0]), jnp.asarray([1.0, 2.0, 3.0, 4.0])
    ref = np.asarray(f.reference(n, x))
    # The values and the gradients from one differentiated call: its forward runs the lowered
    # program the regrouping made (a plain call compiled one machine more for the same program).
    out, pull = jax.vjp(lambda v: f(n, v), x)
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-6)
    # Under jax.jit the machine compiles again: with fork="auto" perhaps another one (a traced
    # call chooses afresh); with fork=True/False the same program, so one such cell checks it.
    if fork == "auto" or (fn, fork) == (read_then_call_overwrites, True):
        np.testing.assert_allclose(np.asarray(jax.jit(f)(n, x)), ref, rtol=1e-6)
    want = jax.grad(lambda v: sum(fn(int(n[i]), v[i]) for i in range(4)))(x)
    np.testing.assert_allclose(np.asarray(pull(jnp.ones_like(out))[0]), np.asarray(want), rtol=1e-5)
