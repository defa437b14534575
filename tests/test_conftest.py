"""The test set-up itself: 8 CPU devices whatever the developer exported, shared-data tests
that skip locally but fail under CI=true, and the compilation counter other tests rely on."""
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

import conftest
from compile_events import compilations

TESTS = os.path.dirname(os.path.abspath(__file__))


def test_the_session_has_eight_cpu_devices():
    assert jax.default_backend() == "cpu"
    assert [d.platform for d in jax.devices()] == ["cpu"] * 8


@pytest.mark.parametrize("flags, expected", [
    ("", "--xla_force_host_platform_device_count=8"),
    ("--xla_force_host_platform_device_count=1",
     "--xla_force_host_platform_device_count=8"),
    ("--xla_cpu_enable_fast_math=false --xla_force_host_platform_device_count=2 --xla_dump_to=/d",
     "--xla_cpu_enable_fast_math=false --xla_dump_to=/d --xla_force_host_platform_device_count=8"),
])
def test_the_device_count_flag_is_replaced_and_other_flags_kept(flags, expected):
    assert conftest._with_device_count(flags, 8) == expected


def test_exported_platform_and_device_count_are_overridden():
    """A developer's JAX_PLATFORMS=cuda and a device count of 1 still give the tests 8 CPUs."""
    env = {**os.environ, "JAX_PLATFORMS": "cuda",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=1 --xla_cpu_enable_fast_math=false"}
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import conftest, os, jax; "
            "print(os.environ['XLA_FLAGS']); print(jax.device_count(), jax.default_backend())")
    out = subprocess.run([sys.executable, "-c", code, TESTS], env=env, capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert out == ["--xla_cpu_enable_fast_math=false --xla_force_host_platform_device_count=8",
                   "8 cpu"]


def test_missing_shared_data_skips_locally(monkeypatch, tmp_path):
    monkeypatch.setattr(conftest, "SHARED_DATA", str(tmp_path))
    monkeypatch.delenv("CI", raising=False)
    (tmp_path / "glue").mkdir()
    assert conftest.require_shared_data("glue") == str(tmp_path / "glue")
    with pytest.raises(pytest.skip.Exception, match=r"shared data .*squad is not present"):
        conftest.require_shared_data("squad")


def test_missing_shared_data_fails_under_ci(monkeypatch, tmp_path):
    monkeypatch.setattr(conftest, "SHARED_DATA", str(tmp_path))
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"squad is not present.*CI=true"):
        conftest.require_shared_data("squad")


def test_compilations_counts_each_new_program_once():
    def double(x):
        return 2 * x

    step = jax.jit(double)
    with compilations() as compiled:
        step(np.ones(3, np.float32))
        step(np.ones(3, np.float32))  # cached: no new program
        step(np.ones(4, np.float32))  # a new shape: a second one
    assert compiled == ["jit(double)", "jit(double)"]
    with compilations() as compiled:
        step(np.ones(4, np.float32))
    assert compiled == []
