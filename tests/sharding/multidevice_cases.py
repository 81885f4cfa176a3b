"""Sharded runs on 4 forced host devices; run by `test_sharding.py` in a subprocess
with `XLA_FLAGS=--xla_force_host_platform_device_count=4` (the main pytest
process has already initialized JAX with one device). Not collected on its own
(the name does not start with `test_`).

Every sharded result is compared with the same function run unsharded on one
device (the single-device machine) and, where cheap, with `.reference` (the
original Python): ints exactly, floats to rtol 1e-6. Cells marked `matrix` run under
`make test-matrix` (`test_sharding.py` passes its marker expression on).
"""
from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec

import pcbatch
from pcbatch.compile import machine_config
from pcbatch.runtime import run_machine
from benchmarks.sharding import collectives, compiled_text
from pcbatch import data
from pcbatch.errors import MaxStepsExceededError, StackOverflowError
from pcbatch.models import nary

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "core"))
from corpus import CASES_BY_NAME  # noqa: E402
from weights import numpy_weights  # noqa: E402  (tests/: its conftest)

tree_leaves = jax.tree_util.tree_leaves
AXIS = "batch"


def test_four_devices():
    assert jax.device_count() == 4, "run with XLA_FLAGS=--xla_force_host_platform_device_count=4"


MESH4 = jax.make_mesh((4,), (AXIS,))                                   # Explicit axis (make_mesh's default)
MESH2 = jax.make_mesh((2,), (AXIS,), axis_types=(AxisType.Auto,), devices=jax.devices()[2:])

_VARIANTS: dict = {}


def on(fn, mesh, **options):
    """`fn` sharded over `mesh` (made once per option set: each copy compiles anew)."""
    key = (id(fn), mesh, tuple(sorted(options.items())))
    if key not in _VARIANTS:
        _VARIANTS[key] = fn.with_options(mesh=mesh, **options)
    return _VARIANTS[key]


def assert_same(got, want, rtol=1e-6, atol=1e-6):
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for g, w in zip(tree_leaves(got), tree_leaves(want)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        if np.issubdtype(g.dtype, np.inexact):
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
        else:
            np.testing.assert_array_equal(g, w)


def assert_batch_sharded(result, mesh):
    """The result's leading (batch) axis is split over the mesh axis."""
    for x in tree_leaves(result):
        assert isinstance(x.sharding, NamedSharding) and x.sharding.mesh == mesh, x.sharding
        assert tuple(x.sharding.spec)[:1] == (AXIS,), x.sharding.spec
        assert len({s.device for s in x.addressable_shards}) == mesh.size


# --- the core corpus: recursion, loops, pytrees, shared arguments ------------
#
# One lane per example (fork=False: compiles in about a second; fork-join is
# covered by the padding test, the TreeLSTM and the workspace test). Batch 7:
# 2 per device, one padding example.

# Recursion and trees in make test; the rest of the corpus in the matrix.
CORPUS = ["fib", "tree_sum"] + [pytest.param(n, marks=pytest.mark.matrix) for n in ("collatz", "ack", "simulate", "bsearch")]


@pytest.mark.parametrize("name", CORPUS)
def test_corpus(name):
    case = CASES_BY_NAME[name]
    args = case.args(case.batch(7))
    single = on(case.fn, None, fork=False)
    got, status = on(case.fn, MESH4, fork=False).checked(*args)
    want, ref = single.checked(*args)
    assert not np.any(status.overflow | status.unfinished)
    assert_same(got, want)
    assert_same(got, case.fn.reference(*args), atol=1e-5)
    np.testing.assert_array_equal(status.blocks_run, ref.blocks_run)
    # One machine per device: the slowest device's steps, at most the single machine's.
    assert 0 < int(status.steps) <= int(ref.steps)
    if name == "fib":
        loop, outside = collectives(compiled_text(on(case.fn, MESH4, fork=False), *args))
        assert loop == 0 and outside > 0     # only before and after the loop (padding, gathering)


def padding_blocks(fn, mesh, *args):
    """`fn(*args)` sharded over `mesh` by the sharded runner around the real
    machine, whose status also reports (in `peak_lanes`, summed over devices)
    the blocks its inactive (padding) lanes ran."""
    plan = pcbatch.sharding.BatchSharding.of(mesh)
    exe, inputs = fn.executable(*args)
    prog, batch = exe.prog, exe.batch

    def machine(local, inputs, workspace, active):
        result, status, workspace = run_machine(prog, inputs, local, exe.config(local)[1], workspace, active)
        return result, status._replace(peak_lanes=jnp.sum(jnp.where(active, 0, status.blocks_run))), workspace

    shared = dict(zip(prog.entry_params, exe.shared))
    with pcbatch.sharded(mesh):
        workspace = fn.executable(*args)[0].new_workspace()   # per device
    result, status, _ = plan.runner(machine, batch, shared)(inputs, workspace)
    padded = plan.devices * plan.per_device(batch)
    return result, status, int(status.peak_lanes) + padded - batch  # the runner takes the padding's lanes off


@pytest.mark.parametrize("fork", [pytest.param(False, marks=pytest.mark.matrix), True])
def test_padding_runs_no_blocks(fork):
    """Batch 5 on 4 devices: 2 per device, 3 padding examples (copies of the
    last, a long-running one) that start halted and run no block. Results are
    right; without forks, blocks run per example equal the single-device
    run's (lane pools sized per device fork differently)."""
    fn = on(CASES_BY_NAME["fib"].fn, None, fork=fork, **({"lane_width": 16} if fork else {}))
    x = jnp.array([3, 0, 5, 1, 11], jnp.int32)
    got, status, padding = padding_blocks(fn, MESH4, x)
    assert padding == 0
    assert got.shape == (5,) and status.blocks_run.shape == (5,)
    assert np.all(np.asarray(status.blocks_run) > 0)
    if fork:  # (the single-device fork-join machine is compared in test_nary_tree_lstm, a matrix cell)
        assert_same(got, fn.reference(x))
    else:
        want, ref = fn.checked(x)
        assert_same(got, want)
        np.testing.assert_array_equal(status.blocks_run, ref.blocks_run)
        sharded = on(CASES_BY_NAME["fib"].fn, MESH4, fork=False).checked(x)[1]
        assert int(sharded.peak_lanes) == int(ref.peak_lanes) == 5  # the padding's lanes are not counted


# --- batch sizes, meshes, jit, errors -----------------------------------------

def test_batch_smaller_than_devices_and_two_device_mesh():
    """Batch 3 and 6 on 4 devices (a device with no example at all), 3 and 4 on
    a 2-device mesh with Auto axes."""
    fn = CASES_BY_NAME["collatz"].fn
    for mesh, batch in ((MESH4, 3), (MESH4, 6), (MESH2, 3), (MESH2, 4)):
        x = jnp.asarray(np.arange(batch) * 13 + 1, jnp.int32)
        got, status = on(fn, mesh, fork=False).checked(x)
        assert_same(got, fn.reference(x))
        assert np.all(np.asarray(status.blocks_run) > 0) and not np.any(status.unfinished)
        if batch % mesh.size == 0:
            assert_batch_sharded(got, mesh)
        else:  # the padding is cut off: a batch the devices do not divide comes back replicated
            assert got.sharding.is_fully_replicated


@pytest.mark.matrix  # the two-process run (test_multi_process.py) checks the same on a global mesh
def test_under_jit_and_cache():
    """Recursion with a shared pytree of parameters (replicated), inside
    `jax.jit` (errors through checkify) and eagerly; the compile cache and
    the donated workspace, one block per device."""
    case = CASES_BY_NAME["tree_sum"]
    fn = on(case.fn, MESH4, fork=False)
    args = case.args(case.batch(8))
    want = case.fn.reference(*args)
    before = fn.trace_count
    assert_same(jax.jit(fn)(*args), want)
    for _ in range(2):                         # the second call gets the first one's donated workspace
        got = fn(*args)
        assert_same(got, want)
        assert_batch_sharded(got, MESH4)
    assert fn.trace_count - before == 2        # once under jit, once eagerly; the third call hits the cache
    assert_workspace_per_device(fn, *args)
    # Inputs the caller already placed on the mesh, batch-sharded.
    placed = jax.device_put(args[1], NamedSharding(MESH4, PartitionSpec(AXIS)))
    assert_same(fn(args[0], placed), want)
    loop, outside = collectives(compiled_text(fn, *args))
    assert loop == 0 and outside == 2          # status.steps (max) and peak_lanes (sum), after the loop


def assert_workspace_per_device(fn, *args):
    ws = fn.executable(*args)[0].workspace   # the last call's, kept for the next call of this signature
    for leaf in tree_leaves(ws):
        assert leaf.shape[0] == 4 and not leaf.is_deleted()
        assert sorted(s.index[0].start for s in leaf.addressable_shards) == [0, 1, 2, 3]
        assert {s.data.shape[0] for s in leaf.addressable_shards} == {1}


@pytest.mark.matrix  # the two-process run (test_multi_process.py) checks the same on a global mesh
def test_context_manager_and_own_mesh():
    fn = CASES_BY_NAME["gcd"].fn
    x = (jnp.array([12, 7, 233, 100], jnp.int32), jnp.array([18, 0, 144, 75], jnp.int32))
    with pcbatch.sharded(MESH2):
        got = fn(*x)
    assert_batch_sharded(got, MESH2)
    assert_same(got, fn.reference(*x))
    with pcbatch.sharded(MESH2):               # a function's own mesh wins over the context's
        got = on(fn, MESH4)(*x)
    assert_batch_sharded(got, MESH4)


def test_an_explicitly_sharded_argument_without_a_mesh_is_a_named_error():
    fn = CASES_BY_NAME["fib"].fn
    x = jax.device_put(jnp.array([3, 7, 4, 5, 1, 2, 6, 0]), NamedSharding(MESH4, PartitionSpec(AXIS)))
    with pytest.raises(pcbatch.OptionError, match="sharded over a mesh's explicit axes"):
        fn.with_options(fork=False)(x)
    assert_same(on(fn, MESH4, fork=False)(x), fn.reference(x))  # with the mesh it runs; the oracle takes x too


@pytest.mark.matrix  # the two-process run (test_multi_process.py) checks the same on a global mesh
def test_stack_overflow_names_global_examples():
    fn = on(CASES_BY_NAME["fib"].fn, MESH4, fork=False, max_stack_depth=6)
    x = jnp.array([1, 2, 3, 4, 5, 9, 2, 1, 10], jnp.int32)   # 9 and 10 need depth 9/10: on devices 1 and 3
    with pytest.raises(StackOverflowError) as err:
        fn(x)
    assert err.value.examples == [5, 8]
    assert "max_stack_depth=10" in str(err.value)
    _, status = fn.checked(x)
    np.testing.assert_array_equal(np.nonzero(np.asarray(status.overflow))[0], [5, 8])


def test_max_steps_names_global_examples():
    fn = on(CASES_BY_NAME["collatz"].fn, MESH4, max_steps=30)
    x = jnp.array([1, 2, 4, 1, 1, 27, 2, 97], jnp.int32)      # 27 and 97 need ~100+ steps
    with pytest.raises(MaxStepsExceededError) as err:
        fn(x)
    assert err.value.examples == [5, 7]
    assert "example 5 at b" in str(err.value)


# --- fork-join: a TreeLSTM batch on per-device lane pools ----------------------

@pytest.mark.matrix  # fork-join on a mesh stays in make test: test_padding_runs_no_blocks[True]
def test_nary_tree_lstm():
    """10 trees on 4 devices: 3 per device (2 padding), a lane pool per device
    sized from its 3 examples; the same results and blocks as on one device."""
    params = numpy_weights(nary.init_params, 50, 4)
    trees = data.batch(data.random_binary_trees(10, seed=3, min_leaves=1, max_leaves=9, max_nodes=17, vocab=50))
    args = (params, trees, trees.root)
    fn = on(nary.nary_tree_lstm, None, lane_width=16)    # one width bucket: a quarter of the compile time
    sharded = on(fn, MESH4)
    want, ref = fn.checked(*args)
    for _ in range(2):                                     # the second call reuses the donated pool stacks
        got, status = sharded.checked(*args)
        assert not np.any(status.overflow | status.unfinished)
        assert_same(got, want, rtol=1e-5)
        np.testing.assert_array_equal(status.blocks_run, ref.blocks_run)
    assert_workspace_per_device(sharded, *args)
    prog = fn.lowered(*args)
    assert prog.has_forks and sharded.lowered(*args).lanes == machine_config(prog, 3, fn.options)[0] < prog.lanes
    assert int(status.peak_lanes) > 10                     # the trees forked


# --- library code over autobatch, sharded by the context -----------------------

@pytest.mark.matrix  # the context itself: test_multi_process.py (fib), test_context_manager_and_own_mesh
def test_nuts_under_the_sharded_context():
    """`pcbatch.mcmc.nuts.sample` (built on autobatch) under `pcbatch.sharded`: 8
    chains, 2 per device, equal to the same chains run unsharded."""
    from pcbatch.mcmc import nuts

    def logp(x):
        return -0.5 * jnp.sum(x * x / jnp.array([1.0, 4.0]))

    keys = jax.random.split(jax.random.PRNGKey(1), 8)
    x0 = jax.random.normal(jax.random.PRNGKey(2), (8, 2))
    options = dict(step_size=0.5, num_samples=3, max_tree_depth=4)
    want = nuts.sample(logp, x0, keys, **options)
    with pcbatch.sharded(MESH4):
        got = nuts.sample(logp, x0, keys, **options)
    assert_batch_sharded(got.position, MESH4)
    assert_same(got, want, rtol=1e-5, atol=1e-5)
