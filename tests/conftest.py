"""Test-wide set-up: 8 simulated CPU devices for the sharding tests, host memory retained as
the CLI retains it (`t5x_lite.host_memory`), hypothesis profile."""
import os

# Must be set before jax is imported anywhere: gives the multi-device tests 8 CPU devices.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from t5x_lite import host_memory  # noqa: E402

host_memory.retain_freed_memory()  # as the CLI does: train steps reuse XLA's freed buffers

from hypothesis import settings  # noqa: E402

settings.register_profile("t5x_lite", deadline=None, max_examples=40, derandomize=True)
settings.load_profile("t5x_lite")
