"""Compiled programs and the arrays fed to them: a jitted function compiled ahead of time once
per argument shape (its compile count and seconds kept for the run's metrics), refused in one line
when the compiled program cannot fit a device's memory, the memory maps the compiled programs
hold, and host values placed on the mesh as global arrays, each process passing its own rows of
the batch.

`t5x_lite.train_step` builds its train, fine-tuning and eval steps on these.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from t5x_lite.config import ConfigError


class Program:
    """One jitted function and its AOT-compiled executables, keyed by argument shapes."""

    def __init__(self, jitted: Any):
        self.jitted = jitted
        self.executables: dict[Any, Any] = {}
        # Why an argument shape's program cannot run here (`require_fits_on_devices`): said
        # again without compiling again, e.g. for each chunk of a vmapped sweep.
        self.refusals: dict[Any, str] = {}
        self.last_executable: Any = None  # the one the latest call ran (`program_memory_bytes`)
        self.compiles = 0
        self.compile_seconds = 0.0

    def __call__(self, *args: Any) -> Any:
        leaves, treedef = jax.tree.flatten(args)
        # Shapes are tuples and dtypes hashable as they are: str(dtype) cost ~0.7 ms a step.
        key = (treedef, tuple((x.shape, x.dtype) for x in leaves))
        if key in self.refusals:
            raise ConfigError(self.refusals[key])
        if key not in self.executables:
            start = time.perf_counter()
            executable = self.jitted.lower(*args).compile()
            self.compile_seconds += time.perf_counter() - start
            self.compiles += 1
            try:
                require_fits_on_devices(executable)
            except ConfigError as refusal:
                self.refusals[key] = str(refusal)
                raise
            self.executables[key] = executable
        self.last_executable = self.executables[key]
        return self.last_executable(*args)


def program_memory_bytes(executable: Any) -> int | None:
    """What XLA's buffer assignment gives a compiled program on each device: temporaries,
    arguments and outputs, less the outputs that reuse a donated argument's buffer. None where
    the backend does not say."""
    analysis = executable.memory_analysis()
    if analysis is None:
        return None
    return (analysis.temp_size_in_bytes + analysis.argument_size_in_bytes
            + analysis.output_size_in_bytes - analysis.alias_size_in_bytes)


def device_memory_limit() -> int | None:
    """The bytes the smallest local device's allocator can hold (`memory_stats`'
    `bytes_limit`); None where JAX keeps no memory statistics (CPU)."""
    limits = [(device.memory_stats() or {}).get("bytes_limit") for device in jax.local_devices()]
    return None if None in limits else min(limits)


def require_fits_on_devices(executable: Any) -> None:
    """A `ConfigError` when a compiled step needs more memory on each device than the device's
    allocator holds: such a program could only stop with an out-of-memory error once it runs
    (a vmapped step holds K points' activations: Table 6's small-preset step needs 84 GiB at
    K = 1 and 335 GiB at K = 4 without remat, by XLA's analysis on a CPU)."""
    limit = device_memory_limit()
    needed = None if limit is None else program_memory_bytes(executable)
    if needed is not None and needed > limit:
        # JAX's GPU allocator takes 75 % of the device's memory unless told otherwise.
        share = (", or give JAX more of the GPU (XLA_PYTHON_CLIENT_MEM_FRACTION)"
                 if jax.default_backend() == "gpu" else "")
        raise ConfigError(
            f"the train step needs {needed / 2**30:.1f} GiB on each device and a device holds "
            f"{limit / 2**30:.1f} GiB: set model.remat=True, lower train.batch_size, or "
            f"pre-train fewer grid points in one step (--vmap){share}")


def memory_maps() -> tuple[int, int] | None:
    """(the memory maps this process holds, the most the kernel allows one process), or None
    where the system does not say (not Linux).

    Why it matters: every program XLA:CPU compiles keeps its kernels' code in memory maps of
    its own (README, "Commands": how many a demo sweep holds), and a process that reaches
    Linux's limit (vm.max_map_count) dies of a segmentation fault inside the compiler.
    `train_step.release_programs_near_map_limit` reads this."""
    try:
        with open("/proc/self/maps", "rb") as maps:
            held = sum(1 for _ in maps)
        with open("/proc/sys/vm/max_map_count") as limit:
            return held, int(limit.read())
    except FileNotFoundError:  # no /proc: not Linux, where no such limit was seen
        return None


def replicated_array(x: Any, mesh: Mesh) -> jax.Array:
    """A host value every process holds identically -> a global array replicated on `mesh`."""
    return jax.make_array_from_process_local_data(
        NamedSharding(mesh, PartitionSpec()), np.asarray(x)
    )


def global_rows(local: Any, sharding: NamedSharding, global_shape: tuple[int, ...],
                 name: str, rows_axis: int = 0) -> jax.Array:
    """This process's rows (split on `rows_axis`) of a batch-sharded array (numpy, or an
    already global jax.Array of `global_shape`) -> the global array; a wrong shape is an error
    naming `name`."""
    if isinstance(local, jax.Array) and local.shape == global_shape:
        return jax.device_put(local, sharding)  # a no-op if it is already placed so
    local = np.asarray(local)
    processes = jax.process_count()
    expected = list(global_shape)
    expected[rows_axis] //= processes
    if list(local.shape) != expected or expected[rows_axis] * processes != global_shape[rows_axis]:
        raise ValueError(
            f"{name} has shape {local.shape}; each of the {processes} processes must pass "
            f"its share of the batch rows: {expected}"
        )
    return jax.make_array_from_process_local_data(sharding, local, global_shape)


