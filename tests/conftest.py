"""Test-wide set-up: 8 simulated CPU devices for the sharding tests, float32, hypothesis profile,
and `shared_data`, the one way a test asks for ../shared/data."""
import importlib
import importlib.util
import os
import re
import shutil
import tempfile
from typing import Any

import pytest
from hypothesis import settings

from xla_env import with_device_count

# Must be set before jax is imported anywhere. Forced, not defaulted: a developer who exports
# JAX_PLATFORMS=cuda or XLA_FLAGS=--xla_force_host_platform_device_count=1 would otherwise get
# fewer devices and failing mesh tests. The user's other XLA flags are kept; the fast-compile
# flags are added (xla_env.py says why).
# T5X_LITE_TEST_ON_ACCELERATOR=1 leaves JAX_PLATFORMS and XLA_FLAGS as they are, so that a test
# file can run on the machine's accelerator (benchmarks/accelerator_check.py runs the
# objectives' and decoding tests there): XLA's GPU build aborts the process at its first
# computation on the CPU-only fast-compile flags ("Unknown flag in XLA_FLAGS", seen on an
# H200). Tests that build 8-device meshes need the simulated CPU devices and fail there.
# There float32 matmuls run at full float32 precision too: JAX's default precision lets a GPU
# run them in TF32 (10 mantissa bits), under which cached decoding's float32 scores differed
# from the teacher-forced forward's by up to 2.6e-4 relative on an H200 (the tests ask 1e-5).
DEVICE_COUNT = 8
ON_ACCELERATOR = os.environ.get("T5X_LITE_TEST_ON_ACCELERATOR") == "1"
if ON_ACCELERATOR:
    os.environ["JAX_DEFAULT_MATMUL_PRECISION"] = "highest"
else:
    os.environ["XLA_FLAGS"] = with_device_count(os.environ.get("XLA_FLAGS", ""), DEVICE_COUNT)
    os.environ["JAX_PLATFORMS"] = "cpu"
# One persistent compilation cache for the session (xla_env.py): made here by the first process
# (pytest itself, before xdist starts its workers, which inherit the variable), removed by it.
# Its name holds that process's id, so that the next session removes the cache of one killed
# before it could (`remove_caches_of_ended_sessions`).
CACHE_PREFIX = "t5x_lite_tests_jax_cache_"


def remove_caches_of_ended_sessions(folder: str) -> list[str]:
    """Delete the session caches in `folder` whose process has ended; returns their paths."""
    removed = []
    for name in os.listdir(folder):
        pid = name[len(CACHE_PREFIX):].split("_")[0] if name.startswith(CACHE_PREFIX) else ""
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(folder, name), ignore_errors=True)
            removed.append(os.path.join(folder, name))
        except PermissionError:  # alive, another user's
            pass
    return removed


_OWN_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    remove_caches_of_ended_sessions(tempfile.gettempdir())
    _OWN_CACHE = tempfile.mkdtemp(prefix=f"{CACHE_PREFIX}{os.getpid()}_")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_CACHE
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


def pytest_unconfigure(config):
    if _OWN_CACHE is not None and not hasattr(config, "workerinput"):
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)


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
        _skip_or_fail_in_ci(f"shared data {path} is not present (the data tests need "
                            "../shared/data beside the checkout)")
    return path


def _skip_or_fail_in_ci(message: str) -> None:
    """Skip the test with `message`, or under CI=true (set by .ci/run) fail it: CI must not
    pass by skipping what it checks."""
    if in_ci():
        pytest.fail(message + "; CI=true, so this is a failure, not a skip", pytrace=False)
    pytest.skip(message)


def require_module(name: str) -> Any:
    """`import name` for a test that needs a package of the test extra (`pip install
    ".[test]"`): when it is missing the test skips, except under CI=true, where it fails, since
    CI installs the extra and must not pass by skipping what it checks (Ray, not in the extra,
    skips with `pytest.importorskip`)."""
    try:
        return importlib.import_module(name)
    except ImportError as error:
        _skip_or_fail_in_ci(f"{name} is not installed ({error}); it is in the test extra: "
                            "pip install '.[test]'")


def readme_python_block(marker: str) -> str:
    """The README's ```python block that holds `marker`: an example the tests run as written."""
    readme = os.path.join(os.path.dirname(__file__), "..", "README.md")
    with open(readme, encoding="utf-8") as f:
        return next(block for block in re.findall(r"```python\n(.*?)```", f.read(), re.S)
                    if marker in block)


@pytest.fixture
def shared_data():
    """`shared_data(*parts)` -> the path under ../shared/data, or skip (fail under CI=true)."""
    return require_shared_data


@pytest.fixture(scope="session")
def benchmark_script():
    """`benchmark_script(name)` -> benchmarks/NAME.py imported as a module (the benchmarks are
    scripts, not a package), for the tests of their own logic."""
    def load(name):
        path = os.path.join(os.path.dirname(__file__), "..", "benchmarks", f"{name}.py")
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    return load


@pytest.fixture(autouse=True, scope="module")
def release_compiled_programs():
    """Let go of the programs a test module compiled once it ends
    (`train_step.release_compiled_programs`: the steps, the state initialisers and JAX's own
    caches). Each XLA:CPU program keeps its kernels' code in
    memory maps of its own, ~800 for a tiny train step, and the caches keep every program a
    process compiled: an xdist worker that ran half the suite held ~39,000 maps, and one that
    reached the kernel's default limit (vm.max_map_count, 65,530) died of a segmentation fault
    in XLA's compiler (2026-12-05, three of five suite runs). Released here, a worker holds at
    most one module's programs; later modules load theirs from the session's compilation
    cache."""
    yield
    from t5x_lite import train_step

    train_step.release_compiled_programs()
