import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from hypothesis import HealthCheck, settings  # noqa: E402

# Each example may compile a program; wall-clock deadlines would be flaky.
settings.register_profile("pcbatch", deadline=None, suppress_health_check=[HealthCheck.too_slow],
                          derandomize=True)
settings.load_profile("pcbatch")


import jax  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
    """Drop every compiled program after each test file. XLA:CPU maps a few
    memory regions per executable; a test worker that keeps thousands of them
    reaches the kernel's vm.max_map_count (65530) and segfaults."""
    yield
    jax.clear_caches()
