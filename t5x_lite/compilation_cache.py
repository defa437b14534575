"""The persistent compilation cache of the `t5x-lite` commands: an XLA program one command
compiled is loaded from disk, not compiled again, by the next command that needs it.

A researcher's day is the same programs in many processes: a run resumed after a preemption,
`finetune` then `eval` of its checkpoint, a sweep's workers, the same model again with one
setting changed (the objective, rate and span length are traced, so another objective is the
same program). Each would otherwise compile everything anew: seconds on a CPU, minutes for the
paper's model on an accelerator.

Where and how (`use_default`, called once by `cli.main` before anything compiles):
- `$JAX_COMPILATION_CACHE_DIR` when set: JAX's own variable, and then every other setting is
  JAX's (e.g. `JAX_COMPILATION_CACHE_MAX_SIZE`); the test suite points it at a session folder;
- otherwise `DEFAULT_DIR` under `$XDG_CACHE_HOME` (default `~/.cache`), kept under
  `DEFAULT_MAX_BYTES` (or `$JAX_COMPILATION_CACHE_MAX_SIZE` when set) by JAX, least recently
  used entries deleted first;
- `JAX_ENABLE_COMPILATION_CACHE=false` turns it off; `t5x-lite bench` always does
  (`turned_off`): the compile time it reports is a measurement.
JAX stores a program only if compiling it took at least a second (its default,
`JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`), and its key holds the program, the XLA flags,
the devices and the JAX version, so another machine, mesh or release never loads a stale one.
Compilations loaded from the cache still count as compilations (`compile_events`), so a run's
`compiles` and `step_compiles` mean what they meant without it; its `compile_s` is shorter.
"""
from __future__ import annotations

import contextlib
import os
import sys
import warnings
from pathlib import Path
from typing import Iterator

DEFAULT_DIR = Path("t5x_lite") / "jax_compilation_cache"  # under the user's cache folder
DEFAULT_MAX_BYTES = 4 * 2**30
# The prefixes of JAX's variables that choose its cache (folder, size, on or off): with any of
# them set, the choice is the user's. Without them, an environment gets the commands' default.
JAX_VARIABLE_PREFIXES = ("JAX_COMPILATION_CACHE", "JAX_ENABLE_COMPILATION_CACHE")


def _user_cache_base() -> Path:
    """The user's cache folder: `$XDG_CACHE_HOME`, default `~/.cache`."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")


def user_cache_dir() -> Path:
    """t5x_lite's folder in the user's cache folder: the compiled programs (`default_dir`),
    and the data builds unless `data.data_dir` says otherwise."""
    return _user_cache_base() / DEFAULT_DIR.parent


def default_dir() -> Path:
    """`DEFAULT_DIR` under the user's cache folder."""
    return _user_cache_base() / DEFAULT_DIR


def use_default() -> Path | None:
    """Turn on the persistent compilation cache (see the module) unless JAX was told where or
    not to; returns the folder it uses, None when it is off.

    JAX reads its variables when it is imported. So before that, with none of them set, the
    default is put in the environment and jax is not imported here: `t5x-lite --help`, a flag's
    error, `report` and `launch` never pay its ~1.3 s import. Otherwise JAX's configuration
    says what the user chose, and an already imported JAX is updated."""
    if "jax" in sys.modules or any(name.startswith(JAX_VARIABLE_PREFIXES) for name in os.environ):
        import jax

        if not jax.config.jax_enable_compilation_cache:
            return None
        if jax.config.jax_compilation_cache_dir is not None:
            return Path(jax.config.jax_compilation_cache_dir)
    folder = default_dir()
    try:  # only this user may write it: a program in it is run as loaded (JAX's warning)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as error:  # e.g. a read-only home: the commands work, compiling anew
        warnings.warn(f"no persistent compilation cache: cannot create {folder} ({error}); "
                      "set JAX_COMPILATION_CACHE_DIR to a writable folder")
        return None
    # In the environment: for JAX when this process imports it, and for the Python processes a
    # command starts (a parallel sweep's workers), which share the cache.
    # A size the user chose (JAX_COMPILATION_CACHE_MAX_SIZE alone) stays theirs.
    chosen_size = "JAX_COMPILATION_CACHE_MAX_SIZE" in os.environ
    os.environ["JAX_COMPILATION_CACHE_DIR"] = str(folder)
    os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(DEFAULT_MAX_BYTES))
    if "jax" in sys.modules:  # it read its variables already (here above, or before)
        import jax

        jax.config.update("jax_compilation_cache_dir", str(folder))
        if not chosen_size:
            jax.config.update("jax_compilation_cache_max_size", DEFAULT_MAX_BYTES)
    return folder


@contextlib.contextmanager
def turned_off() -> Iterator[None]:
    """No persistent compilation cache while it lasts, whatever the environment says: every
    program is compiled (`t5x-lite bench`, whose compile times are measurements). The setting
    is as before afterwards, so that a caller in the same process (a notebook, a test) that
    ran `bench` through `cli.main` still loads what it compiled."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache as jax_cache

    # JAX decides whether to use its cache once, at a process's first compile: each change of
    # the setting is followed by `reset_cache`, so that the next compile decides again.
    before = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    jax_cache.reset_cache()
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", before)
        jax_cache.reset_cache()
