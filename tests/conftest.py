import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

# JAX's persistent compilation cache: a second local `make test` reuses the XLA
# executables of the first instead of compiling every machine again. Set as
# environment variables (before jax is imported) so that the subprocesses some
# tests start (notebooks, README, 4-device sharding) share the cache too. A
# JAX_COMPILATION_CACHE_DIR of your own wins; set it to "" to turn the cache off.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(_REPO, ".cache", "jax"))
# Every program, also the ~30 ms ones: the per-example Python and the tests run thousands of
# eager ops, one tiny program per op and shape, which the other worker and the subprocesses
# then read instead of compiling (six heavy files, cold, on two workers: 4-10% less CPU).
# JAX's default threshold (1 s) would skip even half of the machines.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# The tests run small inputs, where compiling costs more than running: no LLVM
# optimizations (tests/runtime/test_fork.py, cold: 2m44 -> 2m15) and XLA:CPU's older
# elemental emitters instead of its fusion emitters (tests/core/test_corpus.py: 56 s -> 37 s),
# and each program's machine code emitted as one LLVM module, not split for parallel codegen:
# `make test` already runs a worker per core, and each split module pays LLVM's set-up again
# (tests/runtime/test_fork.py's programs: 13% less CPU). XLA's own HLO verifier, which re-checks
# the module after every pass, is off: it checks XLA, not pcbatch (machines compile ~10% faster).
# Results are checked with the same tolerances either way. Your own XLA_FLAGS win; tests that
# start a process needing a flag of its own (a device count) append it to these.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false "
                                   "--xla_cpu_parallel_codegen_split_count=1 --xla_disable_hlo_passes=hlo-verifier")

from hypothesis import HealthCheck, settings  # noqa: E402

# Each example may compile a program; wall-clock deadlines would be flaky.
settings.register_profile("pcbatch", deadline=None, suppress_health_check=[HealthCheck.too_slow],
                          derandomize=True)
settings.load_profile("pcbatch")


import gc  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402

# Tracing a machine allocates millions of short-lived objects, and the cyclic
# collector's default thresholds ran a pass every few hundred of them (~5-10% of
# a test file's time). Collect less often; what is imported so far is never garbage.
gc.freeze()
gc.set_threshold(50_000, 20, 20)


def _mapped_regions() -> int | None:
    """How many memory regions this process maps (Linux), else None."""
    try:
        with open("/proc/self/maps", "rb") as maps:
            return sum(1 for _ in maps)
    except OSError:
        return None


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
    """Drop every compiled program after a test file once the process maps
    many memory regions. XLA:CPU maps a few dozen per executable; a test
    worker that keeps thousands of them reaches the kernel's vm.max_map_count
    (65530) and segfaults (one test file adds up to ~15,000). Keeping them
    until then spares the next files compiling the same small programs again
    (~10% of their time), and each clear costs a worker 10-12 s. A whole
    `make test` peaked at ~36,700 in one worker (stop 48): no clear at all."""
    yield
    regions = _mapped_regions()
    if regions is None or regions > 45_000:
        jax.clear_caches()
