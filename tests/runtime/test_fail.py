"""Where Python raises (`raise`, a failed `assert`, a `range()` step of 0), only
those examples fail: differential against Python run example by example.

Each program runs a batch mixing good and failing examples, on the plain
machine and the fork-join pool (loop forks too): the failing examples are
flagged exactly (`status.failed`), an eager call raises `ExampleError` naming
them and quoting the line, under `jit` they are NaN (0 for integers), and the
good examples' values (and gradients) are Python's exactly."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pcbatch
from pcbatch.ir.core import Fail, Launch


def python_per_example(f, batched, shared=(), shared_first=True):
    """Per example: Python's value, or None where Python raises. `batched`: the
    batched arguments (a leading example axis each); `shared`: unbatched ones,
    passed before (or after) them."""
    values = []
    for i in range(len(batched[0])):
        one = tuple(x[i:i + 1] for x in batched)
        args = (*shared, *one) if shared_first else (*one, *shared)
        try:
            values.append(np.asarray(f.reference(*args))[0])
        except (ValueError, AssertionError):
            values.append(None)
    return values


def check_differential(f, batched, shared=(), shared_first=True, expect_failed=None):
    """`f.checked` on the batch: flags exactly where Python raises, other values exact."""
    args = (*shared, *batched) if shared_first else (*batched, *shared)
    want = python_per_example(f, batched, shared, shared_first)
    raises = np.asarray([w is None for w in want])
    assert raises.any() and not raises.all(), "a batch must mix good and failing examples"
    if expect_failed is not None:
        np.testing.assert_array_equal(np.nonzero(raises)[0], expect_failed)
    out, status = f.checked(*args)
    np.testing.assert_array_equal(np.asarray(status.failed) != 0, raises)
    assert not np.asarray(status.overflow).any() and not np.asarray(status.unfinished).any()
    good = ~raises
    np.testing.assert_allclose(np.asarray(out)[good], np.asarray([w for w in want if w is not None]),
                               rtol=1e-6)
    return out, status, raises


def check_eager_error(f, args, raises, line_text):
    with pytest.raises(pcbatch.ExampleError) as info:
        f(*args)
    assert info.value.examples == np.nonzero(raises)[0].tolist()
    assert isinstance(info.value, pcbatch.PcbatchError)
    message = str(info.value)
    assert line_text in message and "f.checked(...)" in message
    return message


def check_jit(f, args, raises, want_good):
    out = np.asarray(jax.jit(f)(*args))
    bad = np.nan if np.issubdtype(out.dtype, np.floating) else 0
    np.testing.assert_array_equal(out[raises], np.full(int(raises.sum()), bad))
    np.testing.assert_allclose(out[~raises], want_good, rtol=1e-6)


# --- guard clauses: raise in an if, assert with and without a message ----------


def guarded(x, n):
    if n < 0:
        raise ValueError("negative")
    else:
        scale = x * 2.0  # assigned only where the raise is not taken: no MaybeUnboundWarning
    assert n != 3, "n must not be 3"
    assert x < 100.0
    total = 0.0
    for i in range(n):
        total = total + scale * i
    return total


X = jnp.asarray([1.0, 2.0, 3.0, 500.0, 0.5, 4.0, 1.5])
N = jnp.asarray([4, -1, 3, 2, 0, 5, -7], jnp.int32)
GUARD_FAILS = [1, 2, 3, 6]  # negative, negative; n == 3; x >= 100


# `guarded` calls nothing, so fork=True lowers to the same plain machine (the pool's
# failures: the recursive and loop-forked callees below): that cell is a `matrix` one.
NO_CALLS_FORK = [False, pytest.param(True, marks=pytest.mark.matrix)]


@pytest.mark.parametrize("fork", NO_CALLS_FORK, ids=["plain", "fork"])
def test_guard_clauses_fail_only_their_examples(fork):
    f = pcbatch.autobatch(guarded, fork=fork, max_lanes=64)
    out, status, raises = check_differential(f, (X, N), expect_failed=GUARD_FAILS)
    # Which Fail: the line each example stopped at.
    lowered = f.lowered(X, N)
    texts = {i: lowered.blocks[int(k) - 1].term.text for i, k in enumerate(np.asarray(status.failed)) if k}
    assert texts == {1: 'raise ValueError("negative")', 2: 'assert n != 3, "n must not be 3"',
                     3: "assert x < 100.0", 6: 'raise ValueError("negative")'}
    message = check_eager_error(f, (X, N), raises, 'raise ValueError("negative")')
    assert 'assert n != 3, "n must not be 3"' in message and "assert x < 100.0" in message
    check_jit(f, (X, N), raises, np.asarray(out)[~raises])


def test_the_error_lists_at_most_ten_examples():
    f = pcbatch.autobatch(guarded)
    n = -jnp.arange(1, 15, dtype=jnp.int32)
    with pytest.raises(pcbatch.ExampleError) as info:
        f(jnp.ones(14), n)
    assert info.value.examples == list(range(14))
    assert "(and 4 more)" in str(info.value) and "13" not in str(info.value).split("(and")[0]


# --- a raise in a recursive callee that only some examples reach ------------


def tree_sum(n, bad):
    if n == bad:
        raise ValueError("reached the bad value")
    if n <= 1:
        return n * 1.0
    return tree_sum(n - 1, bad) * 0.5 + tree_sum(n - 2, bad)


TN = jnp.asarray([6, 7, 5, 8, 3, 9, 4, 6, 7, 2], jnp.int32)
TBAD = jnp.asarray([-1, 2, 99, 5, -1, -1, 0, 6, -3, -1], jnp.int32)


# Under jit each compiles another machine: the pool's here, the plain machine's failures under jit
# with test_guard_clauses_fail_only_their_examples[plain] (`make test-matrix`: this one's too).
@pytest.mark.parametrize("fork, under_jit", [pytest.param(False, False, id="plain"), pytest.param(True, True, id="fork"),
                                             pytest.param(False, True, id="plain-jit", marks=pytest.mark.matrix)])
def test_raise_in_a_recursive_callee(fork, under_jit):
    f = pcbatch.autobatch(tree_sum, fork=fork, max_lanes=256)
    assert f.lowered(TN, TBAD).has_forks == fork
    out, status, raises = check_differential(f, (TN, TBAD), expect_failed=[1, 3, 6, 7])
    check_eager_error(f, (TN, TBAD), raises, 'raise ValueError("reached the bad value")')
    if under_jit:
        check_jit(f, (TN, TBAD), raises, np.asarray(out)[~raises])


def x64_on():
    """`jax.enable_x64(True)` where JAX has it (>= 0.7), else `jax.experimental.enable_x64()`."""
    if hasattr(jax, "enable_x64") and callable(jax.enable_x64):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64  # pragma: no cover - older JAX

    return enable_x64()


# Under jit each of these compiles a second machine: `make test` runs the pool's failures
# under jit with test_raise_in_a_recursive_callee[fork], `make test-matrix` these cells.
EAGER_ONLY = [pytest.param(False, id="eager"), pytest.param(True, id="jit", marks=pytest.mark.matrix)]


@pytest.mark.parametrize("under_jit", EAGER_ONLY)
def test_a_failed_example_with_forks_under_x64(under_jit):
    with x64_on():
        f = pcbatch.autobatch(tree_sum, fork=True, max_lanes=256)
        n, bad = TN.astype(jnp.int64), TBAD.astype(jnp.int64)
        out, status, raises = check_differential(f, (n, bad), expect_failed=[1, 3, 6, 7])
        assert status.failed.dtype == jnp.int64 and out.dtype == jnp.float64
        if under_jit:
            check_jit(f, (n, bad), raises, np.asarray(out)[~raises])


# --- loop forks (Launch/Collect): a Child-Sum-like walk over children -------


def forest(seed, count, max_nodes, max_children):
    """Random trees of any arity in one node table: children lists and roots."""
    rng = np.random.default_rng(seed)
    children = np.full((count * max_nodes, max_children), -1, np.int32)
    roots = []
    for t in range(count):
        base, n = t * max_nodes, int(rng.integers(2, max_nodes + 1))
        roots.append(base)
        for node in range(1, n):
            while True:
                parent = int(rng.integers(0, node))
                k = int(np.sum(children[base + parent] >= 0))
                if k < max_children:
                    break
            children[base + parent, k] = base + node
    return jnp.asarray(children), np.asarray(roots, np.int32)


@pcbatch.autobatch(in_axes=(None, None, 0), fork=True, max_stack_depth=64, max_lanes=256)
def child_walk(children, labels, node):
    """Child-Sum-like: a loop over the node's children that recurses into each."""
    if labels[node] < 0:
        raise ValueError("a negative label")
    total = labels[node].astype(jnp.float32) * 1e-3
    for j in range(jnp.sum(children[node] >= 0)):
        total = total * 0.9 + child_walk(children, labels, children[node, j])
    return total


@pytest.mark.parametrize("under_jit", EAGER_ONLY)
def test_raise_in_a_loop_forked_callee(under_jit):
    children, roots = forest(3, 8, 12, 3)
    labels = np.arange(children.shape[0], dtype=np.int32)
    # Trees 2 and 5 hold a negative label below their root; tree 6 at its root.
    for t, depth in ((2, 1), (5, 3), (6, 0)):
        node = roots[t]
        for _ in range(depth):
            kids = np.asarray(children[node])
            node = int(kids[kids >= 0][-1]) if (kids >= 0).any() else node
        labels[node] = -1
    labels, roots = jnp.asarray(labels), jnp.asarray(roots)
    lowered = child_walk.lowered(children, labels, roots)
    assert any(isinstance(op, Launch) for b in lowered.blocks for op in b.ops), "the loop must fork"
    out, status, raises = check_differential(child_walk, (roots,), (children, labels), expect_failed=[2, 5, 6])
    check_eager_error(child_walk, (children, labels, roots), raises, 'raise ValueError("a negative label")')
    if under_jit:
        check_jit(child_walk, (children, labels, roots), raises, np.asarray(out)[~raises])


@pcbatch.autobatch(in_axes=(None, None, 0), fork=True, max_stack_depth=64, max_lanes=256)
def checked_walk(children, labels, node):
    """An assert inside the forked loop: its launch loop stops there, the collect loop fails in order."""
    total = labels[node].astype(jnp.float32) * 1e-3
    for j in range(jnp.sum(children[node] >= 0)):
        assert labels[children[node, j]] >= 0, "a negative child"
        total = total * 0.9 + checked_walk(children, labels, children[node, j])
    return total


def test_assert_inside_a_forked_loop():
    children, roots = forest(5, 8, 12, 3)
    labels = np.arange(children.shape[0], dtype=np.int32)
    labels[np.asarray(children)[roots[3], 1]] = -1
    labels[np.asarray(children)[roots[5], 0]] = -1
    labels, roots = jnp.asarray(labels), jnp.asarray(roots)
    assert any("a loop fork" in note for note in checked_walk.ir().notes)
    check_differential(checked_walk, (roots,), (children, labels), expect_failed=[3, 5])


# --- range() with a step of 0 at run time ------------------------------------


def stepped(a, b, step):
    total = 0
    for i in range(a, b, step):
        total += i
    return total


@pytest.mark.parametrize("fork", NO_CALLS_FORK, ids=["plain", "fork"])  # `stepped` calls nothing either
def test_a_range_step_of_zero_fails_like_python(fork):
    f = pcbatch.autobatch(stepped, fork=fork, max_lanes=64)
    a, b = jnp.asarray([0, 5, 0, 9, 1], jnp.int32), jnp.asarray([10, 0, 4, 2, 1], jnp.int32)
    step = jnp.asarray([3, -2, 0, -1, 0], jnp.int32)
    out, status, raises = check_differential(f, (a, b, step), expect_failed=[2, 4])
    fails = [blk.term for blk in f.lowered(a, b, step).blocks if isinstance(blk.term, Fail)]
    assert [t.text for t in fails] == ["range() step is 0"]
    message = check_eager_error(f, (a, b, step), raises, "for i in range(a, b, step):")
    assert "range() step is 0" in message
    check_jit(f, (a, b, step), raises, np.asarray(out)[~raises])


def test_a_constant_nonzero_step_needs_no_check():
    f = pcbatch.autobatch(lambda_free_range)
    assert not f.lowered(jnp.arange(3)).fail_blocks


def lambda_free_range(n):
    total = 0
    for i in range(0, n, 2):
        total += i
    return total


# --- gradients ----------------------------------------------------------------


def smooth(x, n, bad):
    if n == bad:
        raise ValueError("reached the bad value")
    if n <= 1:
        return jnp.sin(x)
    return smooth(x * 0.9, n - 1, bad) * 0.5 + smooth(x, n - 2, bad)


def python_smooth(x, n):
    return jnp.sin(x) if n <= 1 else python_smooth(x * 0.9, n - 1) * 0.5 + python_smooth(x, n - 2)


# Each differentiated machine compiles again under jit: the plain one's `make test` runs
# eagerly and under jit, the pool's eagerly (`make test-matrix`: under jit too).
@pytest.mark.parametrize("fork, under_jit", [pytest.param(False, True, id="plain"), pytest.param(True, False, id="fork"),
                                             pytest.param(True, True, id="fork-jit", marks=pytest.mark.matrix)])
def test_gradients_are_nan_for_failed_examples_only(fork, under_jit):
    f = pcbatch.autobatch(smooth, fork=fork, max_lanes=256)
    x = jnp.asarray([0.3, 0.7, -0.2, 1.1, 0.5])
    n = jnp.asarray([5, 6, 4, 3, 6], jnp.int32)
    bad = jnp.asarray([-1, 6, -1, 1, -1], jnp.int32)  # example 1 fails at its root, 3 in a callee
    assert f.lowered(x, n, bad).has_forks == fork
    good = np.asarray([0, 2, 4])

    def loss(x):
        out, _ = f.checked(x, n, bad)
        return jnp.sum(out)

    want = [float(jax.grad(python_smooth)(x[i], int(n[i]))) for i in good]
    grads = [jax.grad(loss)(x)] + ([jax.jit(jax.grad(lambda x: jnp.sum(f(x, n, bad))))(x)] if under_jit else [])
    for grad in grads:
        grad = np.asarray(grad)
        assert np.isnan(grad[[1, 3]]).all()
        np.testing.assert_allclose(grad[good], want, rtol=1e-5)
    with pytest.raises(pcbatch.ExampleError) as info:  # eager jax.grad of the plain call raises
        jax.grad(lambda x: jnp.sum(f(x, n, bad)))(x)
    assert info.value.examples == [1, 3]


@pcbatch.autobatch(fork=True)
def busy_after_children(n):
    """A loop after the join: on a failed child's junk value it would run on (or forever)."""
    if n == 3:
        raise ValueError("three")
    if n <= 1:
        return n
    a = busy_after_children(n - 1)
    b = busy_after_children(n - 2)
    k = 0
    while k < 200:
        k = k + 1
    return a + b + k


def test_the_lanes_of_a_failed_example_stop_at_their_next_branch():
    # A child fails; its parent used to go on with a junk value through its loop (200 steps per
    # level above the failure: a loop on the junk might never end). Now every lane of the failed
    # example stops at its next branch or jump once it holds no children.
    # Both batches of 6 (one compiled pool): the good one ends in a copy of its first example.
    good = jnp.asarray([2, 1, 0, 2, 1, 2], jnp.int32)
    out_good, status_good = busy_after_children.checked(good)
    with_failing = jnp.asarray([2, 1, 0, 2, 1, 7], jnp.int32)  # 7 -> 6 -> 5 -> 4 -> 3 fails
    out, status = busy_after_children.checked(with_failing)
    np.testing.assert_array_equal(np.asarray(status.failed) != 0, [False] * 5 + [True])
    np.testing.assert_array_equal(np.asarray(out)[:5], np.asarray(out_good)[:5])
    np.testing.assert_array_equal(np.asarray(out_good), busy_after_children.reference(good))
    assert int(status.steps) <= int(status_good.steps) + 20, (int(status.steps), int(status_good.steps))
