"""Schedulers driving the real machine: same results, and step counts that match the host simulation."""
import jax.numpy as jnp
import numpy as np
import pytest

import pcbatch
import pcbatch.fsm as fsm


@pcbatch.autobatch(fork=False)  # the host simulation models one lane per example
def fib(n):
    if n <= 1:
        return n
    return fib(n - 1) + fib(n - 2)


@pcbatch.autobatch
def collatz(n):
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


CASES = [(fib, jnp.array([0, 3, 7, 4, 9, 1, 6, 5])), (collatz, jnp.array([1, 6, 27, 7, 2, 3, 9, 12]))]


@pytest.mark.parametrize("f,x", CASES, ids=["fib", "collatz"])
@pytest.mark.parametrize("name", ["earliest", "depth", "agenda"])
def test_named_schedules_agree_with_python_and_simulation(f, x, name):
    g = f.with_schedule(name)
    result, status = g.checked(x)
    np.testing.assert_array_equal(result, f.reference(x))
    sim = fsm.simulate(fsm.record(f, x), fsm.get_scheduler(name))
    assert int(status.steps) == sim.steps


@pytest.mark.parametrize("f,x", CASES, ids=["fib", "collatz"])
def test_learned_policy_runs_in_the_machine(f, x, tmp_path):
    policy = fsm.learn(f, x, trials=60, seed=0, progress=False)
    graph = fsm.record(f, x)
    simulated = fsm.simulate(graph, policy).steps
    assert fsm.lower_bound(graph) <= simulated
    policy.save(tmp_path / "policy.json")
    for p in (policy, fsm.Policy.load(tmp_path / "policy.json")):
        result, status = f.with_schedule(p).checked(x)
        np.testing.assert_array_equal(result, f.reference(x))
        assert int(status.steps) == simulated


def test_unknown_schedule_name_is_an_error():
    with pytest.raises(ValueError, match="unknown schedule"):
        pcbatch.autobatch(lambda n: n, schedule="fastest")
