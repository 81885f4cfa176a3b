"""Sharding the batch over devices (`autobatch(mesh=...)`, `pcbatch.sharded`).

The main pytest process has initialized JAX with one CPU device, so the
multi-device tests (`multidevice_cases.py`: corpus programs, padding, batch
sizes, a 2-device mesh, jit, errors and a TreeLSTM batch, each against
the single-device run; NUTS: `test_multi_process.py`) run in a subprocess with
`XLA_FLAGS=--xla_force_host_platform_device_count=4`. Here: argument checks,
a 1-device mesh, and the runtime's `active` mask.
"""
from __future__ import annotations

import doctest
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

import pcbatch
from pcbatch import sharding
from pcbatch.compile import machine_config
from pcbatch.runtime import run_machine

HERE = os.path.dirname(__file__)
ROOT = os.path.dirname(os.path.dirname(HERE))


@pcbatch.autobatch
def halvings(n):
    k = 0
    while n > 1:
        n = n // 2
        k += 1
    return k


@pcbatch.autobatch(fork=False)
def fib(n):
    if n <= 1:
        return n
    return fib(n - 1) + fib(n - 2)


@pytest.mark.parametrize("cells", ["not slow and not matrix", pytest.param("matrix", marks=pytest.mark.matrix)])
def test_on_four_devices_in_a_subprocess(cells):
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"  # the last one wins
    env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-m", cells, os.path.join(HERE, "multidevice_cases.py")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-20000:] + proc.stderr[-5000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]


def test_one_device_mesh_equals_unsharded():
    mesh = jax.make_mesh((1,), ("batch",))
    x = jnp.array([1, 2, 8, 1000, 5], jnp.int32)
    got, status = halvings.with_options(mesh=mesh).checked(x)
    want, ref = halvings.checked(x)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(status.blocks_run, ref.blocks_run)
    assert int(status.steps) == int(ref.steps) and int(status.peak_lanes) == int(ref.peak_lanes)
    assert got.sharding.mesh == mesh


def test_sharded_doctest_and_context_nesting():
    failures, tried = doctest.testmod(sharding)
    assert tried > 0 and failures == 0
    m1, m2 = Mesh(jax.devices(), ("a",)), Mesh(np.asarray(jax.devices()).reshape(1, 1), ("x", "y"))
    assert sharding.current() is None
    with pcbatch.sharded(m1) as outer:
        assert sharding.current() == outer == sharding.BatchSharding(m1, "a")
        with pcbatch.sharded(m2, ("x", "y")):
            assert sharding.current().axis == ("x", "y")
            assert sharding.current(outer) is outer      # a function's own mesh wins
        assert sharding.current() == outer
    assert sharding.current() is None


def test_argument_errors():
    mesh2d = Mesh(np.asarray(jax.devices()).reshape(1, 1), ("data", "model"))
    with pytest.raises(TypeError, match="jax.sharding.Mesh"):
        pcbatch.autobatch(halvings.fn, mesh=jax.devices())
    with pytest.raises(ValueError, match="needs mesh="):
        pcbatch.autobatch(halvings.fn, axis_name="batch")
    with pytest.raises(ValueError, match=r"mesh has axes \('data', 'model'\).*axis_name='data'"):
        halvings.with_options(mesh=mesh2d)
    with pytest.raises(ValueError, match="'batch' is not an axis of the mesh"):
        halvings.with_options(mesh=mesh2d, axis_name="batch")
    f = halvings.with_options(mesh=mesh2d, axis_name="data")
    assert f.with_options(max_steps=10).mesh is mesh2d and f.with_options(max_steps=10).axis_name == "data"
    assert sharding.BatchSharding.of(mesh2d, ("data", "model")).devices == 1


def test_inactive_lanes_start_halted():
    """`run_machine(..., active=mask)`: lanes that are False run no block and
    report nothing wrong; the others are unaffected (the padding of a sharded batch)."""
    x = jnp.array([12, 5, 9, 9], jnp.int32)
    prog = fib.lowered(x)
    config = machine_config(prog, 4, fib.options)[1]
    active = jnp.array([True, True, False, False])
    out, status, _ = run_machine(prog, {prog.entry_params[0]: x}, 4, config, active=active)
    want, ref = fib.checked(x)
    np.testing.assert_array_equal(status.blocks_run, np.where(active, ref.blocks_run, 0))
    np.testing.assert_array_equal(out[:2], want[:2])
    assert not np.any(status.overflow | status.unfinished)
    assert int(status.steps) < int(ref.steps)
