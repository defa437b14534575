"""`host_memory.retain_freed_memory`: XLA:CPU's freed temporaries are reused, not faulted in
again; only when asked for, and only for one CPU device."""
import json
import os
import platform
import subprocess
import sys

import pytest

from t5x_lite import host_memory

# A fresh process (malloc settings are process-wide and must precede JAX's threads) runs a
# program with a 133 MB temporary 30 times and prints the page faults of each call.
_FAULTS_PER_CALL = """
import json, resource, sys
from t5x_lite import host_memory
applied = host_memory.retain_freed_memory() if sys.argv[1] == "retain" else False
import jax, jax.numpy as jnp
x = jnp.ones((1 << 18,))  # 1 MB, broadcast to 64 rows whose cumsum is reversed: a temporary
f = jax.jit(lambda x: jnp.sum(jnp.cumsum(jnp.broadcast_to(x, (64, x.size)), axis=0)[::-1] * x))
temp = f.lower(x).compile().memory_analysis().temp_size_in_bytes
faults = []
for _ in range(30):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    f(x).block_until_ready()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"applied": applied, "temp_pages": temp // 4096, "faults": faults}))
"""

glibc_only = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="the malloc settings exist only in glibc",
)


def _faults_per_call(mode: str) -> dict:
    # One device and XLA's default flags: the program runs 30 times and compiles once, so the
    # tests' fast-compile flags (xla_env.py) would only make it slower (54 s -> 191 s).
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
    out = subprocess.run([sys.executable, "-c", _FAULTS_PER_CALL, mode], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


@glibc_only
def test_retained_memory_is_not_faulted_in_again():
    system = _faults_per_call("system")
    retained = _faults_per_call("retain")
    pages = system["temp_pages"]
    assert retained["applied"] and pages > 30_000
    # glibc's default: a fresh mmap per call, every page of the temporary faulted in again.
    assert all(f >= pages // 2 for f in system["faults"][1:]), system
    # Retained: while the heap settles (small allocations split freed blocks, so it grows by a
    # temporary now and then; when depends on the threads' timing, later on a loaded machine:
    # 4 of the last 10 calls once in a suite run) calls still fault; the same pages serve most
    # calls, where the system's malloc faults on every one.
    faulting = [f for f in retained["faults"][10:] if f >= pages // 2]
    assert len(faulting) <= 6, retained  # of the last 20 calls; the system's: all 20


def test_off_unless_asked_for(monkeypatch):
    monkeypatch.delenv(host_memory.ENV_VAR, raising=False)
    monkeypatch.setenv("XLA_FLAGS", "")  # one CPU device: only the missing request says no
    assert not host_memory.retain_if_requested() and not host_memory.retained


def test_only_for_one_cpu_device(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cuda,cpu")
    assert not host_memory._runs_on_cpu()
    assert not host_memory.retain_freed_memory()
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert host_memory._runs_on_cpu()
    # The tests' 8 simulated devices (conftest): one arena's lock would cost more than it saves.
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false "
                       "--xla_force_host_platform_device_count=8")
    assert host_memory._simulated_cpu_devices() == 8
    assert not host_memory.retain_freed_memory() and not host_memory.retained
    monkeypatch.setenv("XLA_FLAGS", "")
    assert host_memory._simulated_cpu_devices() == 1
