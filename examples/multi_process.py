"""pcbatch over several processes: JAX's multi-process runtime on one machine.

    python examples/multi_process.py                 # launches 2 worker processes on localhost

Each worker is what you would run once per host of a cluster:

    python examples/multi_process.py PROCESS_ID NUM_PROCESSES COORDINATOR_ADDRESS

(CPU by default; export JAX_PLATFORMS=cuda to use each host's GPUs instead.)
It joins the others (`jax.distributed.initialize`), builds one global mesh over
every process's devices (here 2 forced CPU devices per process), feeds only its
own part of the batch (`jax.make_array_from_process_local_data`) and calls the
autobatched function with `mesh=`: each device runs its own machine on its
shard; the result is a global array, split over the mesh like the input. Every
worker gathers it, prints it and checks it against the per-example Python
(`fib.reference`). On CPU, the gathers need gloo collectives; the machine's
loop itself needs none.
"""
import os
import socket
import subprocess
import sys
import time

DEVICES_PER_PROCESS = 2


def worker(process_id: int, num_processes: int, coordinator: str) -> None:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if os.environ["JAX_PLATFORMS"] == "cpu":  # pretend each CPU process has several devices
        os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DEVICES_PER_PROCESS}"
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                               process_id=process_id)
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding, PartitionSpec

    import pcbatch

    mesh = jax.make_mesh((jax.device_count(),), ("batch",))       # every process's devices

    @pcbatch.autobatch(mesh=mesh)
    def fib(n):
        if n <= 1:
            return n
        return fib(n - 1) + fib(n - 2)

    # The whole batch is known here only to print and check it; each process
    # feeds its contiguous part (a multiple of the device count in all).
    batch = np.array([(5 * i + 3) % 16 for i in range(8 * jax.process_count())], np.int32)
    per = len(batch) // jax.process_count()
    mine = batch[jax.process_index() * per:(jax.process_index() + 1) * per]
    n = jax.make_array_from_process_local_data(NamedSharding(mesh, PartitionSpec("batch")), mine)

    out = fib(n)                                                  # a global array, sharded over "batch"
    local = {int(s.device.id): s.data.tolist() for s in out.addressable_shards}
    whole = np.asarray(multihost_utils.process_allgather(out, tiled=True))
    want = np.asarray(fib.reference(batch))
    print(f"process {jax.process_index()}/{jax.process_count()}: fed {mine.tolist()}; "
          f"its devices' results {local}", flush=True)
    if jax.process_index() == 0:
        print(f"fib({batch.tolist()}) = {whole.tolist()}")
        print("matches the per-example Python:", bool(np.array_equal(whole, want)), flush=True)
    if not np.array_equal(whole, want):
        sys.exit(f"process {jax.process_index()}: result differs from fib.reference")


def launch(num_processes: int = 2) -> int:
    """Run `num_processes` workers on localhost; the worst exit status."""
    with socket.socket() as s:  # a free port for the coordinator
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), str(i), str(num_processes),
                               f"localhost:{port}"], env=env) for i in range(num_processes)]
    while any(p.poll() is None for p in procs):
        if any(p.poll() for p in procs):  # one failed: the others would wait for it forever
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.2)
    return max(abs(p.returncode) for p in procs)


if __name__ == "__main__":
    if len(sys.argv) == 1:
        sys.exit(launch())
    worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
