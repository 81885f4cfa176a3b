"""Loop forks: a loop's independent calls launched at once, each in a lane of its own.

Differential: every program's autobatched result equals the Python run per
example, with pools large and small (a lane that finds none free calls in its
own lane), eagerly and under jit."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pcbatch
from pcbatch.ir.core import Await, Collect, Launch


def random_forest(seed: int, count: int, max_nodes: int, max_children: int):
    """`count` random trees of any arity in one node table: children lists,
    first-child / next-sibling links, and the roots."""
    rng = np.random.default_rng(seed)
    children = np.full((count * max_nodes, max_children), -1, np.int32)
    first = np.full(count * max_nodes, -1, np.int32)
    nxt = np.full(count * max_nodes, -1, np.int32)
    roots = []
    for t in range(count):
        base, n = t * max_nodes, int(rng.integers(1, max_nodes + 1))
        roots.append(base)
        for node in range(1, n):  # a random parent earlier in the tree, with room for a child
            while True:
                parent = int(rng.integers(0, node))
                k = int(np.sum(children[base + parent] >= 0))
                if k < max_children:
                    break
            children[base + parent, k] = base + node
            if k == 0:
                first[base + parent] = base + node
            else:
                nxt[children[base + parent, k - 1]] = base + node
    return jnp.asarray(children), jnp.asarray(first), jnp.asarray(nxt), jnp.asarray(roots, jnp.int32)


@pcbatch.autobatch(in_axes=(None, None, None, 0), fork=True, max_stack_depth=64)
def sibling_walk(w, first, nxt, node):
    """A child-sum cell over first-child / next-sibling links (order matters: not a plain sum)."""
    acc = jnp.tanh(w * node.astype(jnp.float32))
    k = first[node]
    while k >= 0:
        h = sibling_walk(w, first, nxt, k)
        acc = jnp.tanh(0.5 * acc + w * h)
        k = nxt[k]
    return acc


@pcbatch.autobatch(in_axes=(None, 0), fork=True, max_stack_depth=64)
def range_walk(children, node):
    """A `for` over the node's children by index, with a data-dependent trip count."""
    total = node.astype(jnp.float32) * 1e-3
    for j in range(jnp.sum(children[node] >= 0)):
        total = total * 0.9 + range_walk(children, children[node, j])
    return total


@pcbatch.autobatch(in_axes=(None, 0), fork=True, max_stack_depth=64)
def guarded_walk(children, node):
    """The call under an `if` inside the loop, a second call per child, and a `break`."""
    out = jnp.float32(1.0)
    for j in range(children.shape[1]):
        c = children[node, j]
        if c < 0:
            break
        if c % 2 == 0:
            out = out + 2.0 * guarded_walk(children, c)
        out = out * 0.5 + depth(children, c)
    return out


@pcbatch.autobatch(in_axes=(None, 0), fork=True, max_stack_depth=64)
def depth(children, node):
    d = jnp.float32(0.0)
    j = 0
    while children[node, j] >= 0:
        d = jnp.maximum(d, 1.0 + depth(children, children[node, j]))
        j = j + 1
        if j >= children.shape[1]:
            return d
    return d


@pcbatch.autobatch(in_axes=(None, 0), fork=True, max_stack_depth=64)
def dependent_walk(children, node):
    """The loop's branch reads a call's result: no loop fork, and a note says why."""
    best = jnp.float32(0.0)
    j = 0
    while j < children.shape[1]:
        c = children[node, j]
        if c < 0:
            return best
        h = dependent_walk(children, c)
        if h > 3.0:
            return h
        best = best + h + 1.0
        j = j + 1
    return best


def launches(f, *args) -> bool:
    prog = f.lowered(*args)
    return any(isinstance(op, Launch) for b in prog.blocks for op in b.ops)


def test_sibling_links_fork_and_equal_python():
    _, first, nxt, roots = random_forest(0, 24, 20, 5)
    w = jnp.float32(0.7)
    expected = sibling_walk.reference(w, first, nxt, roots)
    assert launches(sibling_walk, w, first, nxt, roots)
    # A pool too small for every child: lanes that find none call in their own lane. Under jit,
    # result and status from one compiled machine (each pool, and jit, compiles one; the default
    # pool runs loop forks eagerly in range_walk's tests, sibling_walk's in the matrix test below).
    few = sibling_walk.with_options(max_lanes=len(roots) + 3)
    out, status = jax.jit(few.checked)(w, first, nxt, roots)
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    assert not np.asarray(status.overflow).any() and not np.asarray(status.unfinished).any()
    assert int(status.peak_lanes) > len(roots)  # the nodes of a tree ran in lanes of their own


@pytest.mark.matrix
def test_sibling_links_without_a_spare_lane_and_the_default_pool():
    """The cells test_sibling_links_fork_and_equal_python leaves out: no lane to spare (a
    loop fork's no-spare pool runs in test_overflow_and_step_limits_flag_only_their_examples),
    and the default pool, eagerly and under jit."""
    _, first, nxt, roots = random_forest(0, 24, 20, 5)
    w = jnp.float32(0.7)
    expected = sibling_walk.reference(w, first, nxt, roots)
    np.testing.assert_allclose(sibling_walk.with_options(max_lanes=len(roots))(w, first, nxt, roots), expected,
                               rtol=1e-6)
    out, status = sibling_walk.checked(w, first, nxt, roots)
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    assert int(status.peak_lanes) > len(roots)
    np.testing.assert_allclose(jax.jit(sibling_walk)(w, first, nxt, roots), expected, rtol=1e-6)


# The default pool with a step bound, one compiled machine for two forests of one shape: this
# one takes 37 steps, STEP_BOUND_FOREST's deepest trees more than STEP_BOUND.
OVERFLOW_FOREST = (8, 12, 16, 3)
STEP_BOUND_FOREST = (14, 12, 16, 3)
STEP_BOUND = 40
bounded_range_walk = range_walk.with_options(max_steps=STEP_BOUND)


def test_range_loop_forks_and_takes_fewer_steps():
    children, _, _, roots = random_forest(*OVERFLOW_FOREST)
    expected = range_walk.reference(children, roots)
    assert launches(range_walk, children, roots)
    out, status = bounded_range_walk.checked(children, roots)
    assert not np.asarray(status.unfinished).any()
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    _, one_lane = range_walk.with_options(fork=False).checked(children, roots)
    assert int(status.steps) < int(one_lane.steps)


def test_calls_under_an_if_and_two_callees_per_iteration():
    children, _, _, roots = random_forest(3, 12, 16, 4)
    expected = guarded_walk.reference(children, roots)
    assert launches(guarded_walk, children, roots)
    np.testing.assert_allclose(guarded_walk.with_options(max_lanes=len(roots) + 5)(children, roots), expected,
                               rtol=1e-6)


def test_a_branch_on_a_call_result_keeps_the_calls_and_says_why():
    children, _, _, roots = random_forest(4, 12, 16, 4)
    prog = dependent_walk.lowered(children, roots)
    assert not any(isinstance(op, Launch) for b in prog.blocks for op in b.ops)
    assert any("depends on a call's result" in n for n in prog.notes)
    assert "note:" in str(prog)
    np.testing.assert_allclose(dependent_walk(children, roots), dependent_walk.reference(children, roots),
                               rtol=1e-6)


def test_launch_await_collect_shape_of_the_ir():
    ir = sibling_walk.ir()
    ops = [op for f in ir.functions for b in f.blocks for op in b.ops]
    terms = [b.term for f in ir.functions for b in f.blocks]
    assert sum(isinstance(op, Launch) for op in ops) == 1
    collects = [op for op in ops if isinstance(op, Collect)]
    assert [op.when is None for op in collects] == [True, False]  # two trips a step
    assert sum(isinstance(t, Await) for t in terms) == 1
    assert any("loop fork" in n for n in ir.notes)
    # fork=False: the loop as written.
    plain = sibling_walk.with_options(fork=False).ir()
    assert not any(isinstance(op, (Launch, Collect)) for f in plain.functions for b in f.blocks for op in b.ops)


def test_x64_loop_fork():
    with jax.enable_x64(True):
        children, _, _, roots = random_forest(5, 8, 12, 3)
        children, roots = jnp.asarray(children, jnp.int64), jnp.asarray(roots, jnp.int64)
        # A fresh cache (x64 changes every type); a pool with 2 spare lanes: launches, and
        # lanes that find none free (one machine to compile: the default pool launches alike).
        f = range_walk.with_options(max_lanes=len(roots) + 2)
        expected = f.reference(children, roots)
        out, status = f.checked(children, roots)
        np.testing.assert_allclose(out, expected, rtol=1e-6)
        assert int(status.peak_lanes) == len(roots) + 2 and status.steps.dtype == jnp.int64


def test_gradient_through_a_loop_fork_equals_python():
    _, first, nxt, roots = random_forest(6, 6, 10, 3)

    def loss(w, f):
        return jnp.sum(f(w, first, nxt, roots))

    got = jax.grad(loss)(jnp.float32(0.7), sibling_walk)
    expected = jax.grad(loss)(jnp.float32(0.7), sibling_walk.reference)
    np.testing.assert_allclose(got, expected, rtol=1e-5)


# Each schedule compiles a pool: `make test` runs the learned policy on loop forks (depth and
# agenda on fork-join pools: tests/fsm/test_program_schedules.py), `make test-matrix` depth and
# agenda on loop forks.
@pytest.mark.parametrize("schedules", [pytest.param(("policy",), id="policy"),
                                       pytest.param(("depth", "agenda"), id="depth+agenda",
                                                    marks=pytest.mark.matrix)])
def test_schedules_and_a_learned_policy_run_loop_forks(schedules):
    """The reference trace the FSM learns from follows launches; every schedule gives the same results."""
    import pcbatch.fsm as fsm

    children, _, _, roots = random_forest(7, 8, 12, 4)
    expected = range_walk.reference(children, roots)
    if "policy" in schedules:
        graph = fsm.record(range_walk, children, roots)
        assert graph.num_nodes > 0
        policy = fsm.learn(range_walk, children, roots, trials=20)
    for schedule in schedules:
        schedule = policy if schedule == "policy" else schedule
        np.testing.assert_allclose(range_walk.with_schedule(schedule)(children, roots), expected, rtol=1e-6)


def test_overflow_and_step_limits_flag_only_their_examples():
    """Without spare lanes the calls run in the caller's lane and may overflow its stacks:
    those examples are flagged, the others exact; the same under a step bound (on the
    default pool, children in lanes of their own when it stops)."""
    for forest, f in ((OVERFLOW_FOREST, range_walk.with_options(max_lanes=OVERFLOW_FOREST[1], max_stack_depth=3)),
                      (STEP_BOUND_FOREST, bounded_range_walk)):
        children, _, _, roots = random_forest(*forest)
        expected = np.asarray(range_walk.reference(children, roots))
        out, status = f.checked(children, roots)
        flagged = np.asarray(status.overflow) | np.asarray(status.unfinished)
        assert flagged.any() and not flagged.all(), f.options
        np.testing.assert_allclose(np.asarray(out)[~flagged], expected[~flagged], rtol=1e-6)


@pcbatch.autobatch(in_axes=(None, 0, 0))
def offset_walk(children, node, a):  # a loop fork of its own
    s = a
    for k in range(jnp.sum(children[node] >= 0)):
        s = s + offset_walk(children, children[node, k], a)
    return s


@pcbatch.autobatch(in_axes=(None, 0), fork=True)
def walk_then_offset(children, node):
    s = 0.0
    for k in range(jnp.sum(children[node] >= 0)):
        x = walk_then_offset(children, children[node, k])  # launched
        s = s + offset_walk(children, children[node, k], x + 1.0)  # reads x: called while children wait
    return s + 1.0


def test_a_loop_that_also_calls_a_launching_function_keeps_its_calls():
    """Launched children wait in their lane's list until collected: a callee that launches in
    that lane (offset_walk) would append its own and collect the loop's (wrong sums). The
    outer loop keeps its calls and says why; the inner one still forks."""
    children, _, _, roots = random_forest(5, 12, 16, 4)
    expected = walk_then_offset.reference(children, roots)
    np.testing.assert_allclose(walk_then_offset(children, roots), expected, rtol=1e-5)
    notes = walk_then_offset.lowered(children, roots).notes
    assert any("also calls offset_walk" in n for n in notes)
    assert any("offset_walk" in n and "a loop fork" in n for n in notes)
    # 0 -> {1, 2}, 1 -> {3}, in a table and batch of the forest's shapes (the machine compiled above)
    small = np.full(children.shape, -1, np.int32)
    small[0, :2], small[1, 0] = [1, 2], 3
    root = jnp.zeros_like(roots)
    np.testing.assert_allclose(walk_then_offset(jnp.asarray(small), root), np.full(len(roots), 11.0))  # 24 before
