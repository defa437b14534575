"""Where a sweep's grid points run: in this process, in worker processes, on Ray, on a TPU pod
or on a SLURM cluster.

t5x_lite has no cluster manager of its own. One run scales through JAX's multi-controller
runtime (`jax.distributed` + XLA SPMD); a sweep's points are spread by something that exists:

- `LocalLauncher` (default): the points one after another, in this process.
- `LocalParallelLauncher(workers=N)`: N worker processes on this machine, each with its own
  devices (a share of the GPUs through CUDA_VISIBLE_DEVICES, or its own CPU devices).
- `RayLauncher(address=...)`: each point is a Ray task with a CPU/GPU/TPU request.
- `tpu_commands(...)`: the `gcloud ... tpu-vm ssh --worker=all` commands that install this
  repository and start the same sweep on every host of a TPU pod slice.
- `slurm_script(...)`: an sbatch job array, one array task per grid point, one process per GPU.

A launcher only moves points and records: `sweep.run_sweep` calls `launcher.map(run_point,
points, workdir)` (`sweep_point`'s; `run_chunk` over chunks of points under --vmap) and stays
the one writer of results.jsonl, appending records as they arrive.
A point preempted where it runs raises `preemption.Preempted`, which comes back through `map`
(from a worker process too) and stops the sweep with its exit status, the point unrecorded,
so a re-run resumes it; the SLURM script requeues its array task on that status.
The dependency goes one way: sweep imports this module, this module knows a grid point only
as a `Point` (its config). `t5x-lite launch` (`cli.py`) is the command line of the TPU and
SLURM generators.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import importlib.util
import math
import multiprocessing
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import warnings
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Iterator, Protocol, Sequence

import ml_collections
from absl import logging as absl_logging

from t5x_lite import host_memory
from t5x_lite.distributed import TPU_POD_ENV
from t5x_lite.errors import CommandFailed, OneLineWarnings
from t5x_lite.preemption import PREEMPTED_EXIT_STATUS, Preempted


class Point(Protocol):
    """What a launcher reads of a grid point (`grid.GridPoint` is one): its config, for the
    devices the point asks for."""

    config: ml_collections.ConfigDict


PointFn = Callable[[Point, str], list[dict]]
LAUNCHERS = ("local", "parallel", "ray")
ACCELERATORS = ("cpu", "gpu", "tpu")
# The flag that makes `t5x-lite sweep` run only the grid point with this index (SLURM arrays).
POINT_INDEX_FLAG = "--point_index"


class Launcher(Protocol):
    """Runs `fn(point, workdir)` for every point and yields each point's records as it finishes
    (in completion order, not necessarily the order of `points`)."""

    def map(self, fn: PointFn, points: Sequence[Point], workdir: str) -> Iterator[list[dict]]:
        ...


# ---------------------------------------------------------------------------------------------
# In this process, in local worker processes


class LocalLauncher:
    """The points one after another in this process (the default)."""

    def map(self, fn: PointFn, points: Sequence[Point], workdir: str) -> Iterator[list[dict]]:
        for point in points:
            yield fn(point, workdir)


def visible_gpus() -> list[str]:
    """The GPU ids this process may use, found without initialising JAX: CUDA_VISIBLE_DEVICES
    when set, else one id per GPU that `nvidia-smi -L` lists, else none."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [gpu.strip() for gpu in listed.split(",") if gpu.strip()]
    if shutil.which("nvidia-smi") is None:
        return []
    lines = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True).stdout
    return [str(i) for i, line in enumerate(lines.splitlines()) if line.startswith("GPU ")]


def worker_environments(
    workers: int, gpus: Sequence[str], cpu_devices_per_worker: int = 1, xla_flags: str = ""
) -> list[dict[str, str]]:
    """The environment variables that give each of `workers` processes its own devices.

    With GPUs: contiguous, near-equal shares of `gpus` as CUDA_VISIBLE_DEVICES. Without: XLA_FLAGS
    (`xla_flags` with its host device count replaced) so that each worker's JAX sees
    `cpu_devices_per_worker` CPU devices. (A TPU host's chips are not split: use one worker.)
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers={workers!r} must be an integer >= 1")
    if cpu_devices_per_worker < 1:
        raise ValueError(f"cpu_devices_per_worker={cpu_devices_per_worker!r} must be >= 1")
    if gpus:
        if len(gpus) < workers:
            raise ValueError(
                f"workers={workers} needs at least one GPU each, but only {len(gpus)} are "
                f"visible ({','.join(gpus)}); use workers <= {len(gpus)}"
            )
        bounds = [round(i * len(gpus) / workers) for i in range(workers + 1)]
        return [
            {"CUDA_VISIBLE_DEVICES": ",".join(gpus[bounds[i]:bounds[i + 1]])}
            for i in range(workers)
        ]
    flags = host_memory.with_cpu_device_count(xla_flags, cpu_devices_per_worker)
    return [{"XLA_FLAGS": flags} for _ in range(workers)]


def _die_with(parent: int) -> None:
    """Have the kernel kill this process when its parent, the sweep (pid `parent`), dies
    (Linux's PR_SET_PDEATHSIG; elsewhere nothing): a sweep killed with SIGKILL left its
    workers training on in the workdir, refusing the sweep run again ("being run by another
    process"), then idle for good. Killed, a worker's point resumes from its checkpoint."""
    if not os.path.exists("/proc/self"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # it died before the call above
        os._exit(1)


_PR_SET_PDEATHSIG = 1  # from <sys/prctl.h>


def _claim_environment(slots: Any, environments: list[dict[str, str]], log_verbosity: int,
                       warning_format: OneLineWarnings | None, parent: int) -> None:
    """Worker initializer: die with the sweep (`_die_with`), take a free slot's environment
    before anything starts JAX's backend (JAX reads these variables when it first creates its
    devices, not at import), the sweep's absl log level (the CLI's keeps TFDS's and orbax's
    routine lines out) and its one-line warnings, if the CLI set them."""
    _die_with(parent)
    os.environ.update(environments[slots.get()])
    absl_logging.set_verbosity(log_verbosity)
    if warning_format is not None:
        warnings.formatwarning = warning_format
    host_memory.retain_if_requested()
    # Between points a SIGTERM (passed on by the sweep: `_signals_passed_to_workers`) or a
    # terminal's Ctrl-C has no point to save; within one, the point's own handler takes it.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)


class LocalParallelLauncher:
    """`workers` processes on this machine, each with its own devices (see
    `worker_environments`). Points go to whichever worker is free; the records come back to the
    calling (sweep) process. An exception in `fn`, or a worker that dies, is raised here once the
    points already running have finished and their records have come back; no point starts
    after it.

    gpus: the GPU ids to share out (default `visible_gpus()`); an empty list means CPU workers.
    """

    def __init__(
        self, workers: int, *, gpus: Sequence[str] | None = None, cpu_devices_per_worker: int = 1
    ):
        gpus = visible_gpus() if gpus is None else list(gpus)
        self.environments = worker_environments(
            workers, gpus, cpu_devices_per_worker, os.environ.get("XLA_FLAGS", ""))
        # How many devices each worker holds (shares of the GPUs may differ by one): a point
        # may run on any of them, so its mesh and batches must fit each.
        self.device_counts = tuple(sorted(
            {len(env["CUDA_VISIBLE_DEVICES"].split(",")) for env in self.environments}
            if gpus else {cpu_devices_per_worker}))

    def map(self, fn: PointFn, points: Sequence[Point], workdir: str) -> Iterator[list[dict]]:
        # spawn, not fork: a forked child would inherit this process's JAX runtime and threads.
        context = multiprocessing.get_context("spawn")
        slots = context.Queue()
        for slot in range(len(self.environments)):
            slots.put(slot)
        pool = concurrent.futures.ProcessPoolExecutor(
            len(self.environments), mp_context=context, initializer=_claim_environment,
            initargs=(slots, self.environments, absl_logging.get_verbosity(),
                      warnings.formatwarning if isinstance(warnings.formatwarning,
                                                           OneLineWarnings) else None,
                      os.getpid()),
        )
        # One point per worker in flight: a point handed to the pool cannot be taken back (its
        # call queue holds one more than it has workers), and after a SIGTERM none may start.
        stop, left, running = threading.Event(), iter(points), set()
        signals: list[str] = []  # the signal that set `stop`, if one did

        def start_next() -> None:
            point = _NO_POINT if stop.is_set() else next(left, _NO_POINT)
            if point is not _NO_POINT:
                running.add(pool.submit(fn, point, workdir))

        failure: BaseException | None = None
        try:
            with _signals_passed_to_workers(stop, signals):
                for _ in self.environments:
                    start_next()
                while running:
                    done, _ = concurrent.futures.wait(
                        running, return_when=concurrent.futures.FIRST_COMPLETED)
                    running -= done
                    errors = [f.exception() for f in done if f.exception() is not None]
                    if errors:
                        # Start no more; the points in flight finish and their records
                        # still come back before the first error is raised.
                        failure = failure or errors[0]
                        stop.set()
                    for future in done:
                        if future.exception() is None:
                            start_next()
                            yield future.result()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        if signals and isinstance(failure, BrokenProcessPool):
            # After the signal a worker ended abruptly (a terminal's Ctrl-C reaching one still
            # starting, before it ignored SIGINT; or one killed as it saved): said, and the
            # sweep stops as preempted, which a scheduler requeues; its points resume from their
            # checkpoints (a damaged newest one falls back to an older one).
            print(f"a worker ended abruptly after {signals[0]}: {failure}", file=sys.stderr,
                  flush=True)
            failure = Preempted(None, [workdir], signals[0])
            print(failure, file=sys.stderr, flush=True)
        if failure is not None:
            raise failure
        # A signal that came before a worker's point could take it (ignored there) let every
        # running point finish: the points never started still make the sweep preempted, not
        # finished (it exited 0 with 8 of 10 points unrun, which no scheduler requeues).
        if signals and next(left, _NO_POINT) is not _NO_POINT:
            stop = Preempted(None, [workdir], signals[0])
            print(stop, file=sys.stderr, flush=True)
            raise stop


_NO_POINT = object()  # `LocalParallelLauncher.map`'s end of the points


@contextlib.contextmanager
def _signals_passed_to_workers(stop: threading.Event, signals: list[str]) -> Iterator[None]:
    """While it lasts, a SIGTERM or SIGINT to this process goes to its worker processes as
    SIGTERM, is added to `signals` by name and sets `stop` (no further point starts): a worker
    in a point saves it and stops (`preemption.Preempted`, which comes back here as the point's
    result and stops the sweep with its exit status); one between points ignores it
    (`_claim_environment`). Otherwise the sweep died at once (a SIGINT: a KeyboardInterrupt
    traceback, exit status 130, once its workers' points had finished) and its workers,
    orphaned, went on writing the workdir. SIGINT goes on as SIGTERM because a terminal's
    Ctrl-C reaches the workers itself too (they share its process group), and a second SIGINT
    would stop them without saving (a worker counts only a second SIGINT so, whichever of the
    two comes first); a second SIGINT here raises KeyboardInterrupt, as a run's does
    (`loop.PreemptionWatch`)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def forward(signum: int, frame: Any) -> None:
        if signum == signal.SIGINT and "SIGINT" in signals:
            raise KeyboardInterrupt  # a second Ctrl-C stops without waiting for the saves
        signals.append(signal.Signals(signum).name)
        stop.set()
        for child in multiprocessing.active_children():
            os.kill(child.pid, signal.SIGTERM)

    previous = {signum: signal.signal(signum, forward)
                for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


# ---------------------------------------------------------------------------------------------
# Ray


def _require_accelerator(accelerator: str) -> None:
    if accelerator not in ACCELERATORS:
        raise ValueError(f"accelerator={accelerator!r}; choose one of {', '.join(ACCELERATORS)}")


def resource_request(
    point: Point, accelerator: str = "cpu", devices_per_point: int = 1, num_cpus: float = 1
) -> dict[str, Any]:
    """The Ray resources one grid point asks for: as many accelerators as its mesh has devices
    (`config.mesh.shape` when it holds no -1, else `devices_per_point`), plus `num_cpus`."""
    _require_accelerator(accelerator)
    shape = tuple(point.config.mesh.shape)
    devices = math.prod(shape) if -1 not in shape else devices_per_point
    if accelerator == "gpu":
        return {"num_cpus": num_cpus, "num_gpus": devices}
    if accelerator == "tpu":
        return {"num_cpus": num_cpus, "resources": {"TPU": devices}}
    return {"num_cpus": max(num_cpus, devices)}


def check_address_answers(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast, naming the address, when nothing listens at a Ray 'host:port' or
    'ray://host:port' address (ray.init itself would retry for minutes)."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(
            f"Ray address {address!r} must be 'host:port', 'ray://host:port' or 'auto'"
        )
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as error:
        raise ConnectionError(
            f"Ray address {address!r} does not answer ({error}); start the cluster with "
            f"`ray start --head --port={port}` or pass the address it printed"
        ) from None


class RayLauncher:
    """Each grid point is a Ray task with `resource_request(point, ...)`; the records come back
    to the sweep process as tasks finish.

    address: a running cluster ('host:port', 'ray://host:port', or 'auto' for the one this
    machine belongs to); None starts a Ray instance on this machine. An address that does not
    answer, or Ray not installed, is an error here, before the sweep starts anything. Every task
    runs in a fresh worker process (`max_calls=1`), so each point's JAX sees the devices Ray
    gave it. runtime_env: passed to `ray.init`, e.g. {"working_dir": "."} to ship this checkout.
    """

    def __init__(
        self, address: str | None = None, *, accelerator: str = "cpu", devices_per_point: int = 1,
        num_cpus: float = 1, runtime_env: dict[str, Any] | None = None,
    ):
        _require_accelerator(accelerator)
        if address not in (None, "auto"):
            check_address_answers(address)
        if importlib.util.find_spec("ray") is None:
            raise ImportError("RayLauncher needs Ray: pip install 't5x-lite[ray]'")
        self.address, self.runtime_env = address, runtime_env
        self.request = dict(
            accelerator=accelerator, devices_per_point=devices_per_point, num_cpus=num_cpus
        )

    def map(self, fn: PointFn, points: Sequence[Point], workdir: str) -> Iterator[list[dict]]:
        import ray

        # A session the caller opened (e.g. in a notebook) is used as it is and left open.
        connected_here = not ray.is_initialized()
        if connected_here:
            ray.init(address=self.address, runtime_env=self.runtime_env)
        try:
            remote_fn = ray.remote(max_calls=1)(fn)
            pending = [
                remote_fn.options(**resource_request(point, **self.request)).remote(point, workdir)
                for point in points
            ]
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                yield ray.get(done[0])
        finally:
            if connected_here:
                ray.shutdown()


def make_launcher(name: str = "local", *, workers: int = 1, address: str | None = None,
                  accelerator: str = "cpu") -> Launcher:
    """The launcher a `--launcher NAME` flag selects: local | parallel (`workers`) | ray."""
    if name == "local":
        return LocalLauncher()
    if name == "parallel":
        return LocalParallelLauncher(workers)
    if name == "ray":
        return RayLauncher(address, accelerator=accelerator)
    raise ValueError(f"launcher={name!r}; choose one of {', '.join(LAUNCHERS)}")


# ---------------------------------------------------------------------------------------------
# TPU pods and SLURM clusters: commands and scripts that start `t5x-lite sweep` there


def _require_sweep_args(sweep_args: Sequence[str]) -> None:
    if not sweep_args:
        raise ValueError("sweep_args is empty; give the sweep's arguments after '--', e.g. "
                         "-- table2 --preset tiny --workdir runs/table2")


def sweep_command(sweep_args: Sequence[str]) -> list[str]:
    """`t5x-lite sweep ARGS` as a module call: a remote shell may lack pip's script directory on
    its PATH, but always has the interpreter."""
    _require_sweep_args(sweep_args)
    return ["python3", "-m", "t5x_lite.cli", "sweep", *sweep_args]


def tpu_commands(
    sweep_args: Sequence[str], *, tpu: str, zone: str, repo: str, project: str | None = None
) -> list[list[str]]:
    """The two `gcloud compute tpus tpu-vm ssh NAME --worker=all` commands for a TPU pod slice:
    on every host, clone (or update) the git repository `repo` into ~/t5x_lite and install it
    with JAX for TPUs; then start the same sweep there on every host. A checkout, not a wheel,
    because the sweep reads its grids from the repository's experiments/. Each host joins
    `jax.distributed` by itself, told to by `distributed.TPU_POD_ENV` (JAX finds the slice's
    hosts in the TPU VMs' metadata).
    """
    for name, value in (("tpu", tpu), ("zone", zone), ("repo", repo)):
        if not value:
            raise ValueError(
                f"{name} is required for a TPU pod launch (--{name}); e.g. --tpu my-v4-32 "
                "--zone us-central2-b --repo https://github.com/ORG/t5x_lite"
            )
    ssh = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", tpu, f"--zone={zone}"]
    ssh += [f"--project={project}"] if project else []
    ssh += ["--worker=all"]
    install = (
        f"(git clone --depth=1 {shlex.quote(repo)} ~/t5x_lite || git -C ~/t5x_lite pull) && "
        'python3 -m pip install -U "jax[tpu]" -e ~/t5x_lite'
    )
    return [
        ssh + [f"--command={install}"],
        ssh + [f"--command=cd ~/t5x_lite && {TPU_POD_ENV}=1 "
               f"{shell_join(sweep_command(sweep_args))}"],
    ]


def require_partition(partition: str | None) -> None:
    """Raise the one-line error of a SLURM launch without a partition (before any work)."""
    if not partition:
        raise ValueError("partition is required for a SLURM launch (--partition NAME); "
                         "`sinfo -s` lists the cluster's partitions")


# sbatch's --time formats (`man sbatch`): minutes, minutes:seconds, hours:minutes:seconds,
# days-hours, days-hours:minutes, days-hours:minutes:seconds, or no limit.
_SLURM_TIME = re.compile(r"\d+(:\d\d?){0,2}|\d+-\d+(:\d\d?){0,2}|UNLIMITED|INFINITE")


def slurm_script(
    sweep_args: Sequence[str], *, num_points: int, partition: str | None, nodes: int = 1,
    gpus_per_node: int = 1, time: str = "24:00:00", job_name: str = "t5x-lite",
    account: str | None = None, setup: Sequence[str] = (),
) -> str:
    """An sbatch script for a sweep: a job array with one array task per grid point; inside a
    task, `srun` starts one process per GPU on each of `nodes` nodes. Every process joins
    `jax.distributed` from the SLURM environment (distributed.initialize_distributed) and runs the
    grid point `$SLURM_ARRAY_TASK_ID` (the sweep's `--point_index`). A task whose sweep exits
    with `PREEMPTED_EXIT_STATUS` (its point saved, not recorded) is put back in the queue
    (`scontrol requeue`; `--requeue` also lets SLURM requeue it after its own preemption or a
    node failure), where it resumes the point. `setup`: shell lines run first (module loads,
    activating a virtualenv)."""
    require_partition(partition)
    for name, value in (("num_points", num_points), ("nodes", nodes),
                        ("gpus_per_node", gpus_per_node)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be an integer >= 1")
    if not _SLURM_TIME.fullmatch(time):
        raise ValueError(f"time={time!r} is not a SLURM time limit; write MINUTES, HH:MM:SS or "
                         "DAYS-HH:MM:SS (e.g. 90, 12:00:00, 2-00:00:00)")
    options = {
        "job-name": job_name, "partition": partition, "account": account,
        "array": f"0-{num_points - 1}", "nodes": nodes, "ntasks-per-node": gpus_per_node,
        "gpus-per-node": gpus_per_node, "time": time, "output": "slurm-%A_%a.out",
    }
    command = shell_join(sweep_command(sweep_args))
    lines = [
        "#!/bin/bash",
        f"# t5x-lite sweep: array task i runs grid point i of {num_points}, one process per GPU on",
        "# every node; a task's processes form one jax.distributed run (coordinator from SLURM).",
        *(f"#SBATCH --{key}={value}" for key, value in options.items() if value is not None),
        "#SBATCH --requeue",
        "set -eo pipefail",  # not -u: module and virtualenv scripts read unset variables
        *setup,
        f"# A preempted grid point saves its checkpoints and exits {PREEMPTED_EXIT_STATUS}: back in "
        "the queue,",
        "# the array task resumes it. SLURM signals this shell too (at the time limit, on",
        "# preemption): it waits for srun instead of dying before the requeue.",
        "trap : TERM",
        "status=0",
        f'srun {command} {POINT_INDEX_FLAG}="$SLURM_ARRAY_TASK_ID" || status=$?',
        f'if [ "$status" -eq {PREEMPTED_EXIT_STATUS} ]; then',
        '  scontrol requeue "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"',
        "fi",
        'exit "$status"',
    ]
    _require_shell_syntax(setup)
    return "\n".join(lines) + "\n"


def _require_shell_syntax(setup: Sequence[str]) -> None:
    """`--setup` lines bash cannot parse (an unbalanced quote) were found on the cluster, after
    the job had queued: a one-line `ValueError` with bash's complaint, from `bash -n` over the
    lines together (an `if` may span several), where bash is here."""
    if not setup or shutil.which("bash") is None:
        return
    checked = subprocess.run(["bash", "-n"], input="\n".join(setup) + "\n", text=True,
                             capture_output=True)
    if checked.returncode:
        problem = " ".join(checked.stderr.split()).replace("bash: ", "")
        raise ValueError(f"--setup lines {list(setup)!r} are not a script bash can run "
                         f"({problem})")


def require_program(name: str) -> None:
    """Raise before anything is submitted when the cluster's client program is missing."""
    if shutil.which(name) is None:
        raise FileNotFoundError(f"{name!r} is not on PATH; install it, or print the dry run")


def shell_join(command: Sequence[str]) -> str:
    """`command` as one shell line, quoting a `--flag=value` argument's value only, so the
    printed line reads as one would type it."""
    def quote(arg: str) -> str:
        flag, sep, value = arg.partition("=")
        if arg.startswith("--") and sep and shlex.quote(flag) == flag:
            return f"{flag}={shlex.quote(value)}"
        return shlex.quote(arg)

    return " ".join(quote(arg) for arg in command)


def run_commands(commands: Sequence[Sequence[str]], *, dry_run: bool = True) -> None:
    """Print the commands (dry run), or run them one after another, stopping at a failure
    (`CommandFailed`, naming the command; its output says why)."""
    if not dry_run:
        require_program(commands[0][0])
    for number, command in enumerate(commands):
        print(shell_join(command), flush=True)
        if not dry_run:
            status = subprocess.run(command).returncode
            if status:
                raise CommandFailed(
                    f"{shell_join(command)} exited with status {status} (its output above "
                    f"says why); commands run before it: {number} of {len(commands)}")
