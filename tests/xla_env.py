"""The XLA flags and compilation cache of every test process and of every child a test starts.

Tests compile far more than they run (tiny models, a few steps), so:
- XLA's CPU backend skips its slow optimisation passes and emits fusions with its older
  emitters (`FAST_COMPILE_FLAGS`); the programs compute the same thing, faster to compile (the
  first two flags: the every-architecture fine-tuning test 40 s -> 30 s; the third: the scanned
  models' parity and decoding tests 52 s -> 39 s, -n 0, two runs each; measured on this
  project's 2-core CI machine);
- all processes of one test session share one persistent compilation cache
  (`COMPILATION_CACHE_VARIABLES`, set up by conftest.py), so a program compiled by one test, xdist
  worker or child process is loaded by the others: a killed run and its resumption, a sweep run
  twice, the same tiny step in several files. The cache key holds the flags and the device
  count, so a child with other devices never loads another's program.
A test that starts a child gives it `child_env(devices)`, never its own XLA_FLAGS, unless the
child runs far more than it compiles (test_host_memory.py).
"""
from __future__ import annotations

import os

from t5x_lite.host_memory import with_cpu_device_count

FAST_COMPILE_FLAGS = ("--xla_backend_optimization_level=0",
                      "--xla_llvm_disable_expensive_passes=true",
                      "--xla_cpu_use_fusion_emitters=false")
# The persistent cache's variables (the directory is conftest's); every program is cached.
COMPILATION_CACHE_VARIABLES = ("JAX_COMPILATION_CACHE_DIR",
                               "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
                               "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES")


def with_device_count(flags: str, count: int) -> str:
    """`flags` with the CPU device count set to `count` and the fast-compile flags added; the
    other flags are kept."""
    kept = [flag for flag in flags.split() if flag not in FAST_COMPILE_FLAGS]
    return with_cpu_device_count(" ".join(kept + list(FAST_COMPILE_FLAGS)), count)


def child_env(devices: int, base: dict[str, str] | None = None, **variables: str) -> dict[str, str]:
    """The environment of a child process on `devices` CPU devices: `base` (default: this
    process's environment) with the test XLA flags, the session's compilation cache and
    `variables`."""
    env = dict(os.environ if base is None else base)
    env.update({name: os.environ[name] for name in COMPILATION_CACHE_VARIABLES
                if name in os.environ})
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=with_device_count("", devices), **variables)
    return env


def user_env(devices: int, cache_home: str, **variables: str) -> dict[str, str]:
    """`child_env(devices)` as a user's shell would have it: none of JAX's compilation cache
    variables (the commands choose their cache, `t5x_lite.compilation_cache`), the user's cache
    folder at `cache_home`, and every program stored however fast it compiled; `variables` on
    top."""
    # Imported here: it imports jax, which conftest.py must not do before it sets the variables.
    from t5x_lite.compilation_cache import JAX_VARIABLE_PREFIXES

    env = {name: value for name, value in child_env(devices).items()
           if not name.startswith(JAX_VARIABLE_PREFIXES)}
    return {**env, "XDG_CACHE_HOME": cache_home, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            **variables}
