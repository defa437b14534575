"""Joining a multi-process run (several hosts, or several processes on one host) before JAX
starts: `initialize_distributed`, which the CLI's commands call first. JAX is imported where
it is used, so that `launchers` reads `TPU_POD_ENV` without importing it.
"""

from __future__ import annotations

import os

from t5x_lite.config import ConfigError

# Set by `launch tpu`'s command on every host of a TPU pod slice: join with JAX's own cluster
# detection. A TPU VM describes its slice in the metadata server, which JAX reads once asked
# to join; its shell environment need not name the other hosts (TPU_WORKER_HOSTNAMES is GKE's).
TPU_POD_ENV = "T5X_LITE_TPU_POD"


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None:
        return None
    if not value.strip().isdigit():
        raise ConfigError(f"environment variable {name}={value!r} must be a non-negative integer")
    return int(value)


def _use_gloo_on_cpu() -> None:
    """Give CPU processes cross-process collectives (gloo) unless some are chosen already
    (e.g. mpi) or the run is configured for an accelerator. Called only for multi-process
    runs, before `jax.distributed.initialize`.

    Without collectives (None / 'none', the default of some jax versions) CPU processes
    cannot run one sharded step together. The platform is not known before the backends start
    (which must come after `initialize`), so "CPU" means JAX_PLATFORMS (`jax_platforms`) is
    unset or names cpu first; with it unset on an accelerator host, the setting only concerns
    the CPU client, which then trains nothing.
    """
    import jax

    platforms = (jax.config.jax_platforms or "cpu").split(",")
    chosen = jax.config.jax_cpu_collectives_implementation
    if platforms[0].strip() == "cpu" and chosen in (None, "none"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")


def initialize_distributed(
    coordinator: str | None = None, num_processes: int | None = None, process_id: int | None = None
) -> bool:
    """Join a multi-process run; call before any other JAX call. Returns whether one was joined.

    Arguments win over the environment variables JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES /
    JAX_PROCESS_ID. With none of them, SLURM (SLURM_NTASKS > 1), a TPU pod slice started by
    `t5x-lite launch tpu` (`T5X_LITE_TPU_POD=1`, set by hand to run one on a slice otherwise)
    and GKE's multi-host TPUs (TPU_WORKER_HOSTNAMES lists several hosts) are left to
    `jax.distributed.initialize()`'s own cluster detection; anything else is a single-process
    run. Several processes on CPU (e.g. on localhost) exchange collectives through gloo
    (`_use_gloo_on_cpu`).
    """
    import jax

    given = {
        "coordinator": coordinator or os.environ.get("JAX_COORDINATOR_ADDRESS"),
        "num_processes": (
            num_processes if num_processes is not None else _env_int("JAX_NUM_PROCESSES")
        ),
        "process_id": process_id if process_id is not None else _env_int("JAX_PROCESS_ID"),
    }
    if any(value is not None for value in given.values()):
        missing = [name for name, value in given.items() if value is None]
        if missing:
            raise ConfigError(
                f"initialize_distributed is missing {', '.join(missing)}: give coordinator, "
                "num_processes and process_id together (or JAX_COORDINATOR_ADDRESS, "
                "JAX_NUM_PROCESSES and JAX_PROCESS_ID)"
            )
        if not 0 <= given["process_id"] < given["num_processes"]:
            raise ConfigError(
                f"process_id={given['process_id']} must be in "
                f"[0, num_processes={given['num_processes']})"
            )
        if given["num_processes"] > 1:
            _use_gloo_on_cpu()
        jax.distributed.initialize(
            given["coordinator"], given["num_processes"], given["process_id"]
        )
        return True
    if (_env_int("SLURM_NTASKS") or 1) > 1:
        _use_gloo_on_cpu()
        jax.distributed.initialize()
        return True
    if os.environ.get(TPU_POD_ENV, "") not in ("", "0") or "," in os.environ.get(
            "TPU_WORKER_HOSTNAMES", ""):
        jax.distributed.initialize()
        return True
    return False
