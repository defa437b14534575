"""Test-wide set-up: 8 simulated CPU devices for the sharding tests, float32, hypothesis profile."""
import os

# Must be set before jax is imported anywhere: gives the multi-device tests 8 CPU devices.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from hypothesis import settings  # noqa: E402

settings.register_profile("t5x_lite", deadline=None, max_examples=40, derandomize=True)
settings.load_profile("t5x_lite")
