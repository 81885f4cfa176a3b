import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from hypothesis import HealthCheck, settings  # noqa: E402

# Each example may compile a program; wall-clock deadlines would be flaky.
settings.register_profile("pcbatch", deadline=None, suppress_health_check=[HealthCheck.too_slow],
                          derandomize=True)
settings.load_profile("pcbatch")
