"""The test set-up itself: 8 CPU devices whatever the developer exported, children on their
own device counts sharing the session's compilation cache, shared-data tests that skip locally
but fail under CI=true, and the compilation counter and cold program cache other tests rely
on."""
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

import conftest
from t5x_lite import compile_events
from compile_events import cold_program_cache, compilations
from xla_env import FAST_COMPILE_FLAGS, child_env, with_device_count

TESTS = os.path.dirname(os.path.abspath(__file__))


def test_a_killed_sessions_compilation_cache_is_removed_by_the_next_one(tmp_path):
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    dead = tmp_path / f"{conftest.CACHE_PREFIX}{ended.stdout.strip()}_abc"
    alive = tmp_path / f"{conftest.CACHE_PREFIX}{os.getpid()}_def"
    other = tmp_path / "another_folder_1"
    for folder in (dead, alive, other):
        folder.mkdir()
    assert conftest.remove_caches_of_ended_sessions(str(tmp_path)) == [str(dead)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, other.name])


def test_the_session_has_eight_cpu_devices():
    assert jax.default_backend() == "cpu"
    assert [d.platform for d in jax.devices()] == ["cpu"] * 8


FAST = " ".join(FAST_COMPILE_FLAGS)


@pytest.mark.parametrize("flags, expected", [
    ("", f"{FAST} --xla_force_host_platform_device_count=8"),
    ("--xla_force_host_platform_device_count=1",
     f"{FAST} --xla_force_host_platform_device_count=8"),
    (f"--xla_cpu_enable_fast_math=false --xla_force_host_platform_device_count=2 {FAST} "
     "--xla_dump_to=/d",
     f"--xla_cpu_enable_fast_math=false --xla_dump_to=/d {FAST} "
     "--xla_force_host_platform_device_count=8"),
])
def test_the_device_count_flag_is_replaced_and_other_flags_kept(flags, expected):
    assert with_device_count(flags, 8) == expected


def test_exported_platform_and_device_count_are_overridden():
    """A developer's JAX_PLATFORMS=cuda and a device count of 1 still give the tests 8 CPUs."""
    env = {**os.environ, "JAX_PLATFORMS": "cuda",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=1 --xla_cpu_enable_fast_math=false"}
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import conftest, os, jax; "
            "print(os.environ['XLA_FLAGS']); print(jax.device_count(), jax.default_backend())")
    out = subprocess.run([sys.executable, "-c", code, TESTS], env=env, capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert out == [f"--xla_cpu_enable_fast_math=false {FAST} "
                   "--xla_force_host_platform_device_count=8", "8 cpu"]


def test_on_an_accelerator_the_platform_and_xla_flags_are_left_alone():
    """T5X_LITE_TEST_ON_ACCELERATOR=1: the CPU-only fast-compile flags, which abort XLA's GPU
    build, are not added, and JAX_PLATFORMS is not forced to cpu; float32 matmuls run at
    float32 precision (a GPU's default is TF32)."""
    env = {**os.environ, "T5X_LITE_TEST_ON_ACCELERATOR": "1", "JAX_PLATFORMS": "cpu,tpu",
           "XLA_FLAGS": "--xla_dump_to=/d"}
    env.pop("JAX_DEFAULT_MATMUL_PRECISION", None)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import conftest, os, jax; "
            "print(os.environ['XLA_FLAGS']); print(os.environ['JAX_PLATFORMS']); "
            "print(jax.config.jax_default_matmul_precision)")
    out = subprocess.run([sys.executable, "-c", code, TESTS], env=env, capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert out == ["--xla_dump_to=/d", "cpu,tpu", "highest"]


def test_children_get_their_device_count_and_the_session_compilation_cache():
    """A child on 2 devices compiles with the test flags into this session's cache, which the
    next child loads from."""
    cache = os.environ["JAX_COMPILATION_CACHE_DIR"]
    assert os.path.isdir(cache) and cache == jax.config.jax_compilation_cache_dir
    code = ("import jax, jax.numpy as jnp, os; hits = []; "
            "jax.monitoring.register_event_listener(lambda event, **kwargs: hits.append(event) "
            "if event.endswith('/cache_hits') else None); "
            "print(jax.device_count()); print(jax.config.jax_compilation_cache_dir); "
            "jax.jit(lambda x: x * 3 + 1)(jnp.arange(7.0)).block_until_ready(); print(len(hits))")
    before = set(os.listdir(cache))
    first, second = (subprocess.run([sys.executable, "-c", code], env=child_env(2),
                                    capture_output=True, text=True, check=True
                                    ).stdout.splitlines() for _ in range(2))
    assert first[:2] == second[:2] == ["2", cache]
    assert set(os.listdir(cache)) > before  # the first child wrote its program there
    assert int(second[2]) >= 1  # the second loaded it


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
    assert compile_events.count(compiled, "double") == 2  # as the train loop counts its step's
    with compilations() as compiled:
        step(np.ones(4, np.float32))
    assert compiled == []
    with compile_events.compile_seconds() as seconds:
        step(np.ones(4, np.float32))  # cached
        step(np.ones(5, np.float32))  # compiled
    assert len(seconds) == 1 and 0 < seconds[0] < 60


def test_a_cold_program_cache_hides_the_programs_made_before_and_keeps_the_new_ones():
    """Nothing here compiles: making a step only looks its program up (or adds it)."""
    from t5x_lite import objectives, partitioning, train_step
    from tiny_configs import tiny_train_config

    config, other = tiny_train_config(mesh=(1, 1)), tiny_train_config(mesh=(1, 1))
    other.train.learning_rate = 0.0123  # keys a program of its own
    mesh = partitioning.make_mesh(config.mesh)
    layout = objectives.layout_for([config.objective], "encoder_decoder", 160, 32)
    warm = train_step.make_train_step(config, layout, mesh).program
    programs_before = dict(train_step._PROGRAMS)
    with cold_program_cache():
        inside = train_step.make_train_step(config, layout, mesh).program
        assert inside is not warm and inside.compiles == 0 and not inside.executables
        assert train_step.make_train_step(config, layout, mesh).program is inside
        train_step.make_train_step(other, layout, mesh)
        made_inside = dict(train_step._PROGRAMS)
    assert len(made_inside) == 2
    assert train_step.make_train_step(config, layout, mesh).program is warm
    for key, program in made_inside.items():  # kept where the cache had none; else the old one
        assert train_step._PROGRAMS[key] is programs_before.get(key, program)
    assert all(train_step._PROGRAMS[key] is p for key, p in programs_before.items())
