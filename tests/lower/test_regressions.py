"""Bugs the fuzzer found, kept as regressions (each compared with plain Python)."""
import jax.numpy as jnp
import numpy as np

import pcbatch


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
