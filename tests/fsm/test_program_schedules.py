"""Schedulers driving the real machine: same results, and step counts that match the host simulation."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pcbatch
import pcbatch.fsm as fsm
from pcbatch import data
from pcbatch.models import nary


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


# Each cell compiles a machine: `make test` runs every schedule and both programs (fib under
# earliest and agenda, collatz under depth), `make test-matrix` the other three cells.
_NAMED_KEPT = {("fib", "earliest"), ("collatz", "depth"), ("fib", "agenda")}


@pytest.mark.parametrize("f,x,name", [
    pytest.param(f, x, name, id=f"{name}-{f.__name__}",
                 marks=() if (f.__name__, name) in _NAMED_KEPT else (pytest.mark.matrix,))
    for name in ("earliest", "depth", "agenda") for f, x in CASES])
def test_named_schedules_agree_with_python_and_simulation(f, x, name):
    g = f.with_schedule(name)
    result, status = g.checked(x)
    np.testing.assert_array_equal(result, f.reference(x))
    sim = fsm.simulate(fsm.record(f, x), fsm.get_scheduler(name))
    assert int(status.steps) == sim.steps


# Each policy compiles a machine. make test runs collatz's (the policy loaded back); fib's row
# runs a learned table in test_without_forks_a_table_learned_on_estimated_costs_is_never_measured_slower.
@pytest.mark.parametrize("f,x", [pytest.param(*CASES[0], id="fib", marks=pytest.mark.matrix),
                                 pytest.param(*CASES[1], id="collatz")])
def test_learned_policy_runs_in_the_machine(f, x, tmp_path):
    policy = fsm.learn(f, x, trials=20, seed=0, progress=False)  # any policy: the machine must follow it
    graph = fsm.record(f, x)
    simulated = fsm.simulate(graph, policy).steps
    assert fsm.lower_bound(graph) <= simulated
    policy.save(tmp_path / "policy.json")
    loaded = fsm.Policy.load(tmp_path / "policy.json")
    assert (loaded.num_types, loaded.encoding, loaded.returns, loaded.states, loaded.actions) == \
        (policy.num_types, policy.encoding, policy.returns, policy.states, policy.actions)
    # Each policy compiles a machine: fib runs the learned one, collatz the one loaded back.
    result, status = f.with_schedule(policy if f is fib else loaded).checked(x)
    np.testing.assert_array_equal(result, f.reference(x))
    assert int(status.steps) == simulated


@pcbatch.autobatch(in_axes=(0, 0), tuning=pcbatch.Tuning(lanes_per_example=16))
def tree_size(tree, node):
    """A tree walk whose pool (16 lanes per example) leaves `fork="auto"` to measure on the first call."""
    left = tree.children[node, 0]
    if left < 0:
        return 1
    return 1 + tree_size(tree, left) + tree_size(tree, tree.children[node, 1])


def test_a_learned_policy_runs_the_machine_fork_auto_kept():
    t = data.batch(data.random_binary_trees(8, seed=3, min_leaves=2, max_leaves=12))
    assert tree_size.executable(t, t.root)[0].fork_choice.measure   # not decided before a call
    policy = tree_size.learn_schedule(t, t.root, trials=20, seed=0, progress=False)   # what fsm.learn calls
    kept = tree_size.lowered(t, t.root)   # the first call decided
    assert fsm.record(tree_size, t, t.root).num_types == kept.num_blocks
    assert policy.num_types == kept.num_blocks and policy.info["forks"] is kept.has_forks
    g = tree_size.with_schedule(policy)   # a fresh cache: it must not decide again (the policy fits one program)
    np.testing.assert_array_equal(g(t, t.root), tree_size.reference(t, t.root))
    assert g.lowered(t, t.root).num_blocks == policy.num_types
    assert g.executable(t, t.root)[0].fork_choice.reason.startswith("a learned schedule")


def test_a_policy_learned_on_estimated_costs_runs_the_fork_join_machine():
    t = data.batch(data.random_binary_trees(8, seed=5, min_leaves=2, max_leaves=12))
    f = tree_size.with_options(fork=True)
    policy = f.learn_schedule(t, t.root, trials=20, seed=0, progress=False, costs="estimate")
    costs = policy.info["costs"]
    assert len(costs) == f.lowered(t, t.root).num_blocks and all(c > 0 for c in costs)
    assert policy.info["cost"] <= policy.info["fallback_cost"]
    np.testing.assert_array_equal(f.with_schedule(policy)(t, t.root), tree_size.reference(t, t.root))
    with pytest.raises(pcbatch.OptionError, match="costs"):
        f.learn_schedule(t, t.root, trials=5, progress=False, costs="fastest")


def test_without_forks_a_table_learned_on_estimated_costs_is_never_measured_slower():
    x = jnp.array([0, 3, 7, 4, 9, 1, 6, 5])
    # Earliest is fib's default schedule; by name, its checked machine is the one
    # test_named_schedules_agree_with_python_and_simulation[earliest-fib] compiled.
    earliest = fib.with_schedule("earliest")
    policy = earliest.learn_schedule(x, trials=50, seed=0, progress=False, costs="estimate")
    lookups = any(a != policy.fallback(s) for s, a in zip(policy.states, policy.actions))
    if lookups:   # kept: the machine with it measured faster than the default
        assert policy.info["measured"]["policy"] < policy.info["measured"]["default"]
    else:         # none learned, or dropped (then it says why, with the times)
        assert "measured" not in policy.info or "dropped" in policy.info
    result, status = earliest.with_schedule(policy).checked(x)
    np.testing.assert_array_equal(result, fib.reference(x))
    assert int(status.steps) == fsm.simulate(fsm.record(fib, x), policy).steps


def test_a_policy_for_another_program_is_a_clear_error():
    x = jnp.array([0, 3, 7, 4])
    policy = fsm.learn(fib, x, trials=5, seed=0, progress=False)
    policy.info.pop("forks")   # as a policy saved before the machine it ran on was recorded
    with pytest.raises(pcbatch.OptionError, match="learned for a program of"):
        fib.with_options(fork=True).with_schedule(policy)(x)


def test_unknown_schedule_name_is_an_error():
    with pytest.raises(ValueError, match="unknown schedule"):
        pcbatch.autobatch(lambda n: n, schedule="fastest")
    # The class for its instance was JAX's raw TypeError (`init() missing ... 'num_lanes'`) at the call.
    with pytest.raises(pcbatch.OptionError, match=r"schedule=Earliest\(\)"):
        pcbatch.autobatch(lambda n: n, schedule=fsm.Earliest)


# --- fork-join: the recorded executions are DAGs -----------------------------

# Lane width 31: one compiled width (they halve down to 16), and more than the
# lanes ever waiting at one block here, so every step runs all of them; the
# pool never runs out. That is the machine the DAG simulation models.
WIDE = dict(max_lanes=512, lane_width=31)


@pcbatch.autobatch(**WIDE)
def fib_forked(n):
    if n <= 1:
        return n
    return fib_forked(n - 1) + fib_forked(n - 2)


@pytest.fixture(scope="module")
def tree_case():
    trees = data.batch(data.random_binary_trees(5, seed=3, min_leaves=2, max_leaves=6, max_nodes=11))
    params = nary.init_params(jax.random.PRNGKey(0), vocab=50, hidden=4)
    return nary.nary_tree_lstm.with_options(**WIDE), (params, trees, trees.root)


def assert_close(got, want):
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


_ONCE: dict = {}


def _once(what, f, args, compute):
    if (what, id(f)) not in _ONCE:
        _ONCE[what, id(f)] = (f, compute(f, *args))   # f kept: its id stays its own
    return _ONCE[what, id(f)][1]


def recorded(f, *args):
    """`fsm.record(f, *args)`, once per fork-join program in this file (it runs every
    example in the reference interpreter)."""
    return _once("record", f, args, fsm.record)


def reference(f, *args):
    """`f.reference(*args)` (the per-example Python), once per fork-join program in this file:
    the pools below are `f` with other options, on the same arguments."""
    return _once("reference", f, args, lambda f, *a: f.reference(*a))


def _fork_cases(tree_case):
    return {"fib": (fib_forked, (jnp.array([0, 3, 6, 4, 5, 1]),)), "tree_lstm": tree_case}


def test_forked_traces_join_children(tree_case):
    f, args = tree_case
    prog = f.lowered(*args)
    traces = f.reference_trace(*args)
    for trace in traces:
        assert len(trace.parents) == len(trace.blocks) and trace.parents[0] == ()
        for v, (b, ps) in enumerate(zip(trace.blocks, trace.parents)):
            assert all(p < v for p in ps)
            ops = prog.blocks[b].ops
            if ops and type(ops[0]).__name__ == "Join":  # the Fork, then each child's last block
                assert len(ps) == 1 + len(ops[0].rets)
    assert recorded(f, *args).num_nodes == sum(len(t.blocks) for t in traces)


# Each schedule compiles a pool per program: `make test` runs every schedule on fib, whose
# pools compile in half the time of tree_lstm's, and agenda on tree_lstm (the machine
# test_trace_records_each_step_inside_the_loop checks too: compiled once); `make test-matrix` the rest.
_SCHEDULE_ROWS = [("fib", ("earliest", "depth", "fsm", "returns_last"), ()), ("tree_lstm", ("agenda",), ()),
                  ("fib", ("agenda",), (pytest.mark.matrix,)),
                  ("tree_lstm", ("earliest", "depth", "fsm", "returns_last"), (pytest.mark.matrix,))]


@pytest.mark.parametrize("case, names", [pytest.param(c, n, marks=m, id=f"{c}-{'+'.join(n)}")
                                         for c, n, m in _SCHEDULE_ROWS])
def test_forked_programs_match_the_dag_simulation(case, names, tree_case):
    f, args = _fork_cases(tree_case)[case]
    graph = recorded(f, *args)
    want = reference(f, *args)
    policy = fsm.learn(f, *args, trials=10, seed=0, progress=False) if "fsm" in names else None  # any policy
    hosts = {"earliest": fsm.Earliest(), "depth": fsm.Depth(), "agenda": fsm.Agenda(),
             "returns_last": fsm.ReturnsLast().for_program(f.lowered(*args)), "fsm": policy}
    for name in names:
        host = hosts[name]
        g = f.with_schedule(policy if name == "fsm" else name)
        got, status = g.checked(*args)
        assert_close(got, want)
        sim = fsm.simulate(graph, host)
        assert sim.sizes.max() <= WIDE["lane_width"]  # else the device takes more steps
        assert int(status.steps) == sim.steps, name
        assert fsm.lower_bound(graph) <= sim.steps


def test_trace_records_each_step_inside_the_loop(tree_case):
    f, args = tree_case
    g = f.with_schedule("agenda")
    sim = fsm.simulate(recorded(f, *args), fsm.Agenda())
    trace = g.trace(*args)
    assert trace.total == trace.steps == sim.steps == int(g.checked(*args)[1].steps)
    np.testing.assert_array_equal(trace.blocks, sim.types)
    np.testing.assert_array_equal(trace.lanes, sim.sizes)
    # The frontier before each step holds the lanes that step ran.
    np.testing.assert_array_equal(trace.counts[np.arange(trace.steps), trace.blocks], trace.lanes)
    # A truncated trace (another compile): test_per_lane_trace_gives_each_lane_its_blocks.


@pytest.fixture(scope="module")
def narrow_pool(tree_case):
    """tree_case's program on a pool where lanes wait for a slot and Forks fall back to calls:
    one object, so that its machine per schedule compiles once in this file."""
    f, _ = tree_case
    return f.with_options(max_lanes=24, lane_width=4)


# A cell of (trace x pool), ~2.6 CPU s of its own: make test traces the wide pool (above,
# against the simulation) and runs the narrow one (test_schedules_under_pool_pressure...).
@pytest.mark.matrix
def test_trace_of_a_narrow_pool_counts_the_lanes_each_step_ran(tree_case, narrow_pool):
    f, args = tree_case
    g = narrow_pool
    trace = g.trace(*args)
    assert trace.lanes.max() <= 4 and trace.num_lanes == 24
    np.testing.assert_array_equal(trace.lanes, np.minimum(trace.counts[np.arange(trace.steps), trace.blocks], 4))
    got, status = g.checked(*args)   # the default schedule: with forks, returns_last
    assert not status.unfinished.any() and not status.overflow.any() and int(status.steps) == trace.total
    assert_close(got, reference(f, *args))


# Each schedule compiles this pool's machine again: `make test` runs returns_last (the default
# with forks); depth and agenda run on the wide pool above
# (the fork-join rows, and agenda's trace); `make test-matrix` runs all three here.
@pytest.mark.parametrize("name", [pytest.param("depth", marks=pytest.mark.matrix),
                                  pytest.param("agenda", marks=pytest.mark.matrix), "returns_last"])
def test_schedules_under_pool_pressure_finish_every_example(name, tree_case, narrow_pool):
    f, args = tree_case
    g = narrow_pool if name == "returns_last" else narrow_pool.with_schedule(name)   # returns_last: its default
    got, status = g.checked(*args)
    assert not status.unfinished.any() and not status.overflow.any()
    assert_close(got, reference(f, *args))


# Each trace compiles a machine of its own: `make test` truncates fib's, `make test-matrix` collatz's too.
@pytest.mark.parametrize("f,x,truncate", [pytest.param(*CASES[0], True, id="fib"),
                                          pytest.param(*CASES[1], False, id="collatz"),
                                          pytest.param(*CASES[1], True, id="collatz-truncated",
                                                       marks=pytest.mark.matrix)])
def test_per_lane_trace_gives_each_lane_its_blocks(f, x, truncate):
    trace = f.trace(x, per_lane=True)
    ran = trace.ran()
    np.testing.assert_array_equal(ran.sum(axis=1), trace.lanes)
    chains = [t.blocks for t in f.reference_trace(x)]
    for lane, chain in enumerate(chains):
        assert trace.blocks[ran[:, lane]].tolist() == chain
    for block in range(f.lowered(x).num_blocks):
        assert trace.runs(block)[:, -1].tolist() == [c.count(block) for c in chains]
    if truncate:
        short = f.trace(x, steps=5)   # a trace kept to its first steps
        assert short.truncated and short.total == trace.total
        np.testing.assert_array_equal(short.blocks, trace.blocks[:5])
        with pytest.raises(ValueError, match="per_lane"):
            short.ran()
