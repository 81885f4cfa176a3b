"""`autobatch(mesh=...)` under JAX's multi-process runtime, for real: two
processes on localhost (`jax.distributed.initialize`, CPU collectives over
gloo), two forced host devices each, one global mesh over all four devices
(and, marked slow, four processes of one device each).

Each pytest test launches this file as its workers (`python
test_multi_process.py PROCESS_ID NUM_PROCESSES PORT DEVICES`); every worker runs the
same program; its last check runs a function with no mesh of its own under
`pcbatch.sharded(global_mesh)` (NUTS under the context: `multidevice_cases.py`). Each feeds its local shard of the batch
(`jax.make_array_from_process_local_data`) or, for a batch the devices do not
divide, the whole batch as a NumPy array; every result is gathered and compared
with the per-example Python (`f.reference`) on the whole batch, in every
process. A worker exits nonzero on the first mismatch.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PROCESSES, DEVICES_PER_PROCESS = 2, 2

# What a worker checks, in order: the pytest tests assert every name is reported.
CHECKS = ["local-shards", "numpy-whole-batch-padded", "checked-status", "jit", "shared-argument", "gradient-error",
          "auto-axis", "no-collectives-in-loop", "overflow-error", "no-mesh-error", "fork-join", "sharded-context"]


# --- the worker (a fresh process: JAX is configured before first use) -------

def worker(process_id: int, num_processes: int, port: int, devices: int) -> None:
    os.environ["JAX_PLATFORMS"] = "cpu"
    # The device count after the flags the tests run with (tests/conftest.py): the last one wins.
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"
    import jax
    # Cross-process collectives on CPU (gloo is JAX 0.10's default; said for older
    # versions): the machine's loop needs none, gathering results and padding do.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=num_processes,
                               process_id=process_id, initialization_timeout=120)
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import AxisType, NamedSharding, PartitionSpec

    import pcbatch
    from benchmarks.sharding import collectives, compiled_text
    from pcbatch.errors import OptionError, StackOverflowError

    assert jax.process_count() == num_processes and jax.device_count() == num_processes * devices
    mesh = jax.make_mesh((jax.device_count(),), ("batch",))                 # Explicit axis
    auto = jax.make_mesh((jax.device_count(),), ("batch",), axis_types=(AxisType.Auto,))

    def ok(name: str) -> None:
        print(f"CHECK-OK {name}", flush=True)

    def local_part(whole: np.ndarray) -> np.ndarray:
        """This process's contiguous part of a batch (its devices' shards)."""
        per = len(whole) // jax.process_count()
        return whole[jax.process_index() * per:(jax.process_index() + 1) * per]

    def feed(whole: np.ndarray, on=mesh):
        return jax.make_array_from_process_local_data(NamedSharding(on, PartitionSpec("batch")), local_part(whole))

    def gather(x):
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))

    def same(got, want) -> None:
        got, want = np.asarray(got), np.asarray(want)
        assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
        if np.issubdtype(got.dtype, np.inexact):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        else:
            np.testing.assert_array_equal(got, want)

    def fib(n):
        if n <= 1:
            return n
        return fib(n - 1) + fib(n - 2)

    ns = np.array([3, 9, 1, 6, 0, 11, 4, 7], np.int32)                      # 2 per device

    f = pcbatch.autobatch(fib, fork=False, mesh=mesh)
    want = np.asarray(f.reference(ns))

    # Each process feeds its local shard; the result is a global array, still
    # split over the mesh, and each device's shard is its own examples' results.
    got = f(feed(ns))
    assert got.shape == ns.shape and got.sharding.spec[0] == "batch" and not got.is_fully_addressable, got.sharding
    for shard in got.addressable_shards:
        same(shard.data, want[shard.index])
    same(gather(got), want)
    ok("local-shards")

    # A batch the 4 devices do not divide: no process can feed an even local
    # shard, so every process passes the whole batch (as for a shared argument);
    # the padding is cut off and the result comes back replicated.
    odd = np.array([5, 2, 8, 1, 10, 3], np.int32)
    got = f(odd)
    assert got.is_fully_replicated
    same(got, f.reference(odd))
    ok("numpy-whole-batch-padded")

    got, status = f.checked(feed(ns))
    same(gather(got), want)
    assert not np.asarray(status.overflow).any() and not np.asarray(status.unfinished).any()
    assert int(status.steps) > 0 and int(status.peak_lanes) == len(ns)
    ok("checked-status")

    got = jax.jit(lambda x: f(x) * 2)(feed(ns))
    same(gather(got), want * 2)
    ok("jit")

    @pcbatch.autobatch(fork=False, mesh=mesh, in_axes=(None, 0))
    def power(x, n):
        if n == 0:
            return 1.0
        return x * power(x, n - 1)

    base = np.float32(1.5)
    got = power(base, feed(ns))
    same(gather(got), power.reference(base, ns))
    # A shared argument may also be a global array, replicated over every process.
    everywhere = jax.make_array_from_process_local_data(NamedSharding(mesh, PartitionSpec()), base)
    same(gather(power(everywhere, feed(ns))), power.reference(base, ns))
    # Floats under jit take the differentiable path: undifferentiated, the sharded machine.
    got = jax.jit(power)(everywhere, feed(ns))
    same(gather(got), power.reference(base, ns))
    ok("shared-argument")

    # Gradients record one machine over the whole batch, which no process holds:
    # a named error rather than a wrong or hanging result.
    try:
        jax.grad(lambda b: power(b, feed(ns)).sum())(base)
    except OptionError as err:
        assert err.option == "mesh" and "processes" in str(err), err
    else:
        raise AssertionError("no OptionError")
    ok("gradient-error")

    fa = f.with_options(mesh=auto)
    same(gather(fa(feed(ns, auto))), want)
    ok("auto-axis")

    loop, _ = collectives(compiled_text(f, feed(ns)))
    assert loop == 0, f"{loop} collectives inside the machine's loop"
    ok("no-collectives-in-loop")

    # Every process raises the same error, naming global example indices.
    deep = np.array([1, 2, 3, 4, 5, 9, 2, 10], np.int32)                    # 9 and 10 need depth 9/10
    shallow = f.with_options(max_stack_depth=6)
    try:
        shallow(feed(deep))
    except StackOverflowError as err:
        assert err.examples == [5, 7], err.examples
    else:
        raise AssertionError("no StackOverflowError")
    ok("overflow-error")

    # A global array without a mesh over its processes: a named error, not a
    # machine partitioned by XLA whose status no process can read.
    for wrong in (fib_plain := pcbatch.autobatch(fib, fork=False),
                  f.with_options(mesh=jax.make_mesh((devices,), ("batch",), devices=jax.local_devices()))):
        try:
            wrong(feed(ns))
        except OptionError as err:
            assert err.option == "mesh" and "spans several processes" in str(err), err
        else:
            raise AssertionError(f"no OptionError from {wrong}")
    same(fib_plain(ns), want)                                               # NumPy: one machine, as ever
    ok("no-mesh-error")

    forked = pcbatch.autobatch(fib, mesh=mesh)                               # fork=True: a lane pool per device
    same(gather(forked(feed(ns))), want)
    ok("fork-join")

    # A function without a mesh, sharded by the context over every process.
    with pcbatch.sharded(mesh):
        got = fib_plain(feed(ns))
    assert got.sharding.spec[0] == "batch" and not got.is_fully_addressable, got.sharding
    same(gather(got), want)
    ok("sharded-context")


# --- the pytest side -----------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def launch(processes: int = PROCESSES, devices: int = DEVICES_PER_PROCESS,
           timeout: float = 600) -> list[str]:
    """Run the worker in `processes` processes of `devices` CPU devices each; their outputs."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
           "JAX_PLATFORMS": "cpu"}
    port = free_port()
    logs = [tempfile.TemporaryFile("w+") for _ in range(processes)]
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), str(i), str(processes), str(port), str(devices)],
                              cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
             for i, log in enumerate(logs)]
    deadline = time.monotonic() + timeout
    try:
        # A failed worker leaves the others waiting on it: stop them all then.
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.poll() not in (None, 0) for p in procs):
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
        log.close()
    for i, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"process {i} exited {p.returncode}:\n{out[-8000:]}"
    return outputs


def check(**launch_options) -> None:
    for i, out in enumerate(launch(**launch_options)):
        reported = [ln.split()[1] for ln in out.splitlines() if ln.startswith("CHECK-OK ")]
        assert reported == CHECKS, f"process {i} reported {reported}:\n{out[-4000:]}"


def test_two_processes_four_devices_equal_reference():
    check()


@pytest.mark.slow  # four JAX processes on a small machine: about a minute
def test_four_processes_one_device_each():
    check(processes=4, devices=1)


if __name__ == "__main__":
    worker(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
