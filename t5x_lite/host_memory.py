"""Keep the host memory XLA:CPU frees, so the next train step does not fault it in again.

XLA:CPU gives every execution of a program one temporary buffer and frees it when the
execution ends: 324 MB for the tiny preset's train step. glibc serves a block that large with a
fresh `mmap` and returns it with `munmap`, so every step touches ~80,000 new pages, each a page
fault the kernel answers with a zeroed page: ~180 ms of system CPU time per 0.7 s step on two
cores. Three `mallopt` settings make the next step reuse the same pages:

- `M_ARENA_MAX=1`: XLA's worker threads allocate from the main heap, the only arena that can
  hold a block that large (a thread's own arena is capped at 64 MB and falls back to `mmap`);
- `M_MMAP_MAX=0`: large blocks come from the heap, never from `mmap`;
- `M_TRIM_THRESHOLD` high: freed memory stays in the heap instead of going back to the system.

Opt-in, with `T5X_LITE_RETAIN_HOST_MEMORY=1` in the environment of `t5x-lite` (the CLI and
the parallel launcher's workers apply it at start): it pays in long runs of one big step and
costs in runs that mostly compile. Measured on two cores: the tiny step 1.2x faster in one
process alternating steps with and without the settings; a 120-step `t5x-lite train --preset
tiny` at 4,100 tokens/s instead of 3,270, with 0.4 M page faults instead of 10.6 M and the same
peak memory. But `t5x-lite demo` (30 short runs of a small model, mostly compiling and
decoding) took 468 s instead of 429 s, and the test suite's multi-device tests 1.4x longer
(also with `M_ARENA_MAX=1` alone): with one arena, every thread that allocates (compiler,
runtime, devices) waits on one lock. In memory, the process keeps the heap it once needed (as
an accelerator runtime keeps its pool), and while the heap settles, small allocations that
split a freed block can make it grow by one more temporary.

Never on an accelerator (the temporaries live in device memory there) nor with the CPU split
into several simulated devices (many threads, one lock), and only with glibc.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import platform
import re

# mallopt parameter numbers from glibc's <malloc.h>.
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8
_TRIM_THRESHOLD = 1 << 30  # larger than any heap top a CPU run frees in one go

ENV_VAR = "T5X_LITE_RETAIN_HOST_MEMORY"
# The XLA flag that splits the CPU into simulated devices (the launchers set it for workers).
DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
retained = False  # whether this process runs with the settings (benchmarks report it)


def _runs_on_cpu() -> bool:
    """Whether JAX will pick its CPU backend: named first in JAX_PLATFORMS, or no accelerator
    plugin (a `jax_plugins` module, libtpu) installed when JAX_PLATFORMS is unset."""
    platforms = os.environ.get("JAX_PLATFORMS", "")
    if platforms:
        return platforms.split(",")[0].strip().lower() == "cpu"
    return all(importlib.util.find_spec(name) is None for name in ("jax_plugins", "libtpu"))


def with_cpu_device_count(xla_flags: str, count: int) -> str:
    """`xla_flags` (an XLA_FLAGS value) with its CPU device count (`DEVICE_COUNT_FLAG`) set to
    `count`, the other flags kept in order."""
    kept = [flag for flag in xla_flags.split() if not flag.startswith(DEVICE_COUNT_FLAG)]
    return " ".join(kept + [f"{DEVICE_COUNT_FLAG}={count}"])


def _simulated_cpu_devices() -> int:
    """The CPU device count XLA_FLAGS forces (`DEVICE_COUNT_FLAG`), or 1."""
    counts = re.findall(rf"{DEVICE_COUNT_FLAG}=(\d+)", os.environ.get("XLA_FLAGS", ""))
    return int(counts[-1]) if counts else 1


def retain_freed_memory() -> bool:
    """Apply the settings above to this process; True if applied.

    A no-op (False) off glibc, when JAX will run on an accelerator, or when XLA_FLAGS splits the
    CPU into several devices (see the module docstring). Call it before JAX runs
    anything: a thread picks its malloc arena at its first allocation, so XLA's worker threads,
    once started, keep arenas that cannot hold the step's temporaries.
    """
    global retained
    if (platform.system() != "Linux" or platform.libc_ver()[0] != "glibc" or not _runs_on_cpu()
            or _simulated_cpu_devices() > 1):
        return False
    libc = ctypes.CDLL(None)  # the C library this interpreter is linked against
    settings = ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))
    retained = all(libc.mallopt(param, value) == 1 for param, value in settings)
    return retained


def retain_if_requested() -> bool:
    """`retain_freed_memory()` when the environment sets T5X_LITE_RETAIN_HOST_MEMORY=1."""
    return os.environ.get(ENV_VAR, "0") == "1" and retain_freed_memory()
