"""fsm.Recorded: the schedule a device run followed equals the host's replay of it."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pcbatch
import pcbatch.fsm as fsm


@pcbatch.autobatch(fork=False)
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


def assert_same_run(rec, f, x, host_policy, status):
    graph, schedule = rec.graph(), rec.schedule()
    host_graph = fsm.record(f, x)
    host = fsm.simulate(host_graph, host_policy)
    assert schedule.steps == host.steps == int(status.steps)
    np.testing.assert_array_equal(schedule.types, host.types)
    np.testing.assert_array_equal(schedule.sizes, host.sizes)
    np.testing.assert_array_equal(schedule.node_step, host.node_step)
    np.testing.assert_array_equal(graph.node_type, host_graph.node_type)
    np.testing.assert_array_equal(graph.parent_ptr, host_graph.parent_ptr)
    assert graph.num_lanes == schedule.num_lanes == len(x)
    assert [len(c) for c in rec.chains()] == np.asarray(status.blocks_run).tolist()


@pytest.mark.parametrize("f,x", CASES, ids=["fib", "collatz"])
@pytest.mark.parametrize("name", ["earliest", "depth", "agenda"])
def test_recording_is_the_host_replay(f, x, name):
    rec = fsm.Recorded(name)
    result, status = f.with_schedule(rec).checked(x)
    np.testing.assert_array_equal(result, f.reference(x))
    assert_same_run(rec, f, x, fsm.get_scheduler(name), status)


def test_recording_a_learned_policy_and_a_second_run():
    x = CASES[0][1]
    policy = fsm.learn(fib, x, trials=40, seed=0, progress=False)
    rec = fsm.Recorded(policy)
    g = fib.with_schedule(rec)
    g(x[:3])  # the same recorder, an earlier run of another batch ...
    _, status = g.checked(x)  # ... is overwritten by the next one
    assert_same_run(rec, fib, x, policy, status)


def test_recording_under_jit():
    x = CASES[0][1]
    rec = fsm.Recorded("earliest")
    _, status = jax.jit(fib.with_schedule(rec).checked)(x)
    assert_same_run(rec, fib, x, fsm.get_scheduler("earliest"), status)


def test_nothing_recorded_yet_and_forks_are_refused():
    with pytest.raises(RuntimeError, match="no complete run"):
        fsm.Recorded().schedule()

    @pcbatch.autobatch  # fork=True: the two calls run in lanes of their own
    def forked(n):
        return n if n <= 1 else forked(n - 1) + forked(n - 2)

    with pytest.raises(ValueError, match="forks"):
        forked.with_schedule(fsm.Recorded())(jnp.array([3, 4]))


def test_recording_the_nuts_machine():
    """A scheduler with a carry that exists only on the device (GradientQuorum):
    the recording is what each chain executes (`trace`), and the leaf block
    runs as often as the scheduler chose it."""
    from pcbatch.mcmc import nuts

    cov = np.asarray([[1.0, 0.8], [0.8, 1.0]])
    prec = jnp.asarray(np.linalg.inv(cov), jnp.float32)
    logdensity = lambda x: -0.5 * x @ prec @ x  # noqa: E731
    chains, samples = 3, 4
    x0 = jax.random.normal(jax.random.PRNGKey(0), (chains, 2))
    args = nuts.prepare(x0, jax.random.split(jax.random.PRNGKey(1), chains), 0.4, None, samples)[0]
    prog = nuts.sampler(logdensity, num_samples=samples, max_tree_depth=4)
    rec = fsm.Recorded(prog.scheduler)
    out, status = prog.with_schedule(rec).checked(*args)
    schedule = rec.schedule()
    assert schedule.steps == int(status.steps)
    assert rec.chains() == [t.blocks for t in prog.trace(*args)]
    leaf = prog.scheduler.leaf
    assert 0 < int(np.sum(schedule.types == leaf)) < sum(c.count(leaf) for c in rec.chains())
    np.testing.assert_array_equal(out.position, prog(*args).position)


def test_docstring_example_runs():
    import doctest

    from pcbatch.fsm import recording

    failures, tried = doctest.testmod(recording)
    assert tried >= 4 and failures == 0
