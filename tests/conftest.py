"""Test-wide set-up: 8 simulated CPU devices for the sharding tests, float32, hypothesis profile,
and `shared_data`, the one way a test asks for ../shared/data."""
import os
import re

import pytest

# Must be set before jax is imported anywhere. Forced, not defaulted: a developer who exports
# JAX_PLATFORMS=cuda or XLA_FLAGS=--xla_force_host_platform_device_count=1 would otherwise get
# fewer devices and failing mesh tests. The user's other XLA flags are kept.
DEVICE_COUNT = 8
_DEVICE_COUNT_FLAG = re.compile(r"--xla_force_host_platform_device_count(=\S*)?")


def _with_device_count(flags: str, count: int) -> str:
    kept = _DEVICE_COUNT_FLAG.sub("", flags).split()
    return " ".join(kept + [f"--xla_force_host_platform_device_count={count}"])


os.environ["XLA_FLAGS"] = _with_device_count(os.environ.get("XLA_FLAGS", ""), DEVICE_COUNT)
os.environ["JAX_PLATFORMS"] = "cpu"

from hypothesis import settings  # noqa: E402

settings.register_profile("t5x_lite", deadline=None, max_examples=40, derandomize=True)
settings.load_profile("t5x_lite")

# ../shared/data beside the checkout (tests/../../shared/data).
SHARED_DATA = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data"))


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def require_shared_data(*parts: str) -> str:
    """The path SHARED_DATA/parts, for a test that needs it. When it is missing the test skips
    with the path in the message, except under CI=true (set by .ci/run), where it fails: CI
    must not pass by skipping the data tests."""
    path = os.path.join(SHARED_DATA, *parts)
    if not os.path.exists(path):
        message = (f"shared data {path} is not present (the data tests need ../shared/data "
                   f"beside the checkout)")
        if in_ci():
            pytest.fail(message + "; CI=true, so this is a failure, not a skip", pytrace=False)
        pytest.skip(message)
    return path


@pytest.fixture
def shared_data():
    """`shared_data(*parts)` -> the path under ../shared/data, or skip (fail under CI=true)."""
    return require_shared_data
