"""The commands' persistent compilation cache (`t5x_lite.compilation_cache`): where it goes, that
a second process loads what the first compiled, and that JAX's own variables override it.

Each case runs in a child process: the cache is process-wide JAX state, and this session's
processes already use the test suite's own cache (conftest.py), which the children are given
without (`xla_env.user_env`). That `t5x-lite bench` compiles everything is checked in
test_bench.py, that it gives the cache back to its process here."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from xla_env import user_env

from t5x_lite import compilation_cache

# Turns the cache on as the commands do, compiles one small program and prints what happened.
CHILD = """
import json, warnings
import jax
from t5x_lite import compilation_cache

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    folder = compilation_cache.use_default()
hits = []
jax.monitoring.register_event_listener(
    lambda event, **kwargs: hits.append(event) if event.endswith("/cache_hits") else None)
jax.jit(lambda x: x * 2.0 + 1.0)(jax.numpy.arange(3.0)).block_until_ready()
print(json.dumps({"folder": folder and str(folder), "hits": len(hits),
                  "max_size": jax.config.jax_compilation_cache_max_size,
                  "min_compile_s": jax.config.jax_persistent_cache_min_compile_time_secs,
                  "warnings": [str(w.message) for w in caught]}))
"""


def _child(env: dict[str, str]) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_a_second_process_loads_what_the_first_compiled_from_the_users_cache_folder(tmp_path):
    env = user_env(1, str(tmp_path))  # the user's cache folder ($XDG_CACHE_HOME)
    folder = tmp_path / "t5x_lite" / "jax_compilation_cache"  # as the README says
    first = _child(env)
    assert first == {"folder": str(folder), "hits": 0, "max_size": 4 * 2**30,
                     "min_compile_s": 0.0, "warnings": []}  # user_env stores every program
    assert any(folder.iterdir()) and folder.stat().st_mode & 0o777 == 0o700
    second = _child(env)
    assert second["hits"] > 0 and second["folder"] == str(folder)


def test_only_programs_that_took_a_second_or_more_to_compile_are_stored(tmp_path):
    """JAX's default threshold, which the commands keep: this child's tiny program compiles
    faster and is not stored."""
    env = user_env(1, str(tmp_path))
    del env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]
    result = _child(env)
    assert result["min_compile_s"] == 1.0
    stored = [p.name for p in Path(result["folder"]).iterdir() if p.name != ".lockfile"]
    assert stored == []  # (JAX's lock file for its size limit aside)


def test_before_jax_is_imported_the_default_costs_no_import_of_it(tmp_path):
    """`t5x-lite --help`, a flag's error, `report` and `launch` never import jax: the default is
    put in the environment, which JAX reads when a command does import it."""
    code = ("import sys; from t5x_lite import compilation_cache; "
            "print(compilation_cache.use_default(), 'jax' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], env=user_env(1, str(tmp_path)),
                          capture_output=True, text=True, timeout=300, check=True)
    assert done.stdout.split() == [str(tmp_path / compilation_cache.DEFAULT_DIR), "False"]


def test_jax_variables_choose_the_folder_or_turn_the_cache_off(tmp_path):
    chosen = tmp_path / "chosen"
    mine = _child(user_env(1, str(tmp_path), JAX_COMPILATION_CACHE_DIR=str(chosen)))
    assert mine["folder"] == str(chosen) and mine["max_size"] == -1  # JAX's settings, not ours
    assert any(chosen.iterdir()) and not (tmp_path / compilation_cache.DEFAULT_DIR).exists()

    # A size alone: the default folder, at the user's size.
    home = tmp_path / "sized"
    sized = _child(user_env(1, str(home), JAX_COMPILATION_CACHE_MAX_SIZE="104857600"))
    assert sized["folder"] == str(home / compilation_cache.DEFAULT_DIR)
    assert sized["max_size"] == 104857600

    off = _child(user_env(1, str(tmp_path), JAX_ENABLE_COMPILATION_CACHE="false"))
    assert off["folder"] is None and not (tmp_path / "t5x_lite").exists()


def test_a_cache_folder_that_cannot_be_made_is_a_warning_not_a_failure(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    result = _child(user_env(1, str(blocker)))  # the cache folder would be under a file
    assert result["folder"] is None and result["hits"] == 0
    assert len(result["warnings"]) == 1 and "JAX_COMPILATION_CACHE_DIR" in result["warnings"][0]


def test_the_commands_turn_the_cache_on_and_pass_it_to_the_processes_they_start(tmp_path):
    """`t5x-lite preview` compiles the corruption; a worker started from the command (here, any
    Python child) inherits the folder through the environment."""
    code = ("import os, sys; from t5x_lite import cli; cli.main(['t5x-lite', *sys.argv[1:]]); "
            "print(os.environ['JAX_COMPILATION_CACHE_DIR'])")
    done = subprocess.run(
        [sys.executable, "-c", code, "preview", "table6", "--point", "rate_50", "--preset",
         "demo", "--examples", "1"],
        env=user_env(1, str(tmp_path)), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    folder = tmp_path / compilation_cache.DEFAULT_DIR
    assert done.stdout.splitlines()[-1] == str(folder) and any(folder.iterdir())
    # The corpus build and the vocabulary trained on it follow $XDG_CACHE_HOME too
    # (`builders.default_data_dir`), beside it.
    beside = {path.name for path in folder.parent.iterdir()}
    assert {"local_files", "vocab"} <= beside, beside
    assert any((folder.parent / "local_files").glob("python_docs-*"))


# Compiles a program before, inside and after `turned_off` (bench's) with the cache on, and
# prints how many entries the cache folder holds after each.
TURNED_OFF_CHILD = """
import json, os, sys
import jax
from t5x_lite import compilation_cache

folder = compilation_cache.use_default()
counts = []

def compile_one(scale):
    jax.jit(lambda x: x * scale + 1.0)(jax.numpy.arange(3.0)).block_until_ready()
    counts.append(len(os.listdir(folder)))

first = sys.argv[1] == "bench_first"
if not first:
    compile_one(2.0)
with compilation_cache.turned_off():
    compile_one(3.0)
compile_one(4.0)
print(json.dumps(counts))
"""


def test_bench_s_cache_is_off_while_it_runs_and_on_again_after(tmp_path):
    """`t5x-lite bench` compiles everything (its compile times are measurements), in a process
    that goes on too (a notebook calling `cli.main`): JAX decides once per process whether to
    use its cache, so the setting alone left a process that had used it using it in bench, and
    one whose first compile was bench's without it for good."""
    for order in ("cache_first", "bench_first"):
        done = subprocess.run([sys.executable, "-c", TURNED_OFF_CHILD, order],
                              env=user_env(1, str(tmp_path / order)), capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        *before, inside, after = [0] + json.loads(done.stdout.splitlines()[-1])
        assert inside == before[-1] < after, (order, before, inside, after)
