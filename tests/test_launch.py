"""Launchers: local, local-parallel and Ray run every point once and bring its records back;
the TPU and SLURM generators print what a person would type; bad input fails before launch."""

import dataclasses
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import types
import warnings
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import ml_collections
import pytest

from t5x_lite import cli, errors, launchers
from t5x_lite.preemption import PREEMPTED_EXIT_STATUS, Preempted
from xla_env import with_device_count

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class FakePoint:
    """Stands in for grid.GridPoint: what the launchers read of a point."""

    point: str
    mesh_shape: tuple[int, ...] = (-1, 1)

    @property
    def config(self) -> ml_collections.ConfigDict:
        return ml_collections.ConfigDict({"mesh": {"shape": self.mesh_shape}})


def describe_devices(point: FakePoint, workdir: str) -> list[dict]:
    """A point function: which process ran the point and how many devices its JAX saw."""
    import jax

    from absl import logging as absl_logging

    own_file = str(Path(launchers.__file__))  # how a warning of t5x_lite's shows there
    return [{"point": point.point, "workdir": workdir, "pid": os.getpid(),
             "devices": jax.device_count(), "log_verbosity": absl_logging.get_verbosity(),
             "warning": warnings.formatwarning("a note", UserWarning, own_file, 7)}]


def fail_on_b(point: FakePoint, workdir: str) -> list[dict]:
    if point.point == "b":
        raise RuntimeError("point b broke")
    return [{"point": point.point}]


def preempt_b(point: FakePoint, workdir: str) -> list[dict]:
    if point.point == "b":
        raise Preempted(5, [f"{workdir}/{point.point}"], "SIGTERM")
    return [{"point": point.point}]


def die(point: FakePoint, workdir: str) -> list[dict]:
    os._exit(3)  # as a worker killed by the OOM killer would


POINTS = [FakePoint(name) for name in "abcd"]


def test_local_launcher_runs_points_in_order():
    results = list(launchers.LocalLauncher().map(fail_on_b, POINTS[2:], "wd"))
    assert results == [[{"point": "c"}], [{"point": "d"}]]


def test_parallel_launcher_returns_every_point_once_with_the_workers_own_devices(tmp_path,
                                                                                monkeypatch):
    """...and the sweep's absl log level and one-line warnings: the CLI's ERROR kept TFDS's
    and orbax's routine lines out of the sweep's own process only, and the workers' warnings
    took Python's format of several lines."""
    from absl import logging as absl_logging

    monkeypatch.setattr(absl_logging, "get_verbosity", lambda: absl_logging.ERROR)
    monkeypatch.setattr(warnings, "formatwarning", errors.OneLineWarnings("sweep"))
    launcher = launchers.LocalParallelLauncher(2, gpus=[], cpu_devices_per_worker=3)
    results = list(launcher.map(describe_devices, POINTS, str(tmp_path)))
    records = [record for records in results for record in records]
    assert sorted(record["point"] for record in records) == ["a", "b", "c", "d"]
    assert {record["devices"] for record in records} == {3}  # the test process itself has 8
    assert {record["log_verbosity"] for record in records} == {absl_logging.ERROR}
    assert {record["warning"] for record in records} == {"t5x-lite sweep: warning: a note\n"}
    assert {record["workdir"] for record in records} == {str(tmp_path)}
    assert os.getpid() not in {record["pid"] for record in records}
    assert len({record["pid"] for record in records}) <= 2


def fail_on_b_while_a_runs(point: FakePoint, workdir: str) -> list[dict]:
    if point.point == "a":  # still running when b's error reaches the sweep
        deadline = time.monotonic() + 300  # a hang guard only
        while not Path(workdir, STOPPED).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    return fail_on_b(point, workdir)


STOPPED = "sweep_stopped"  # left by the sweep's `stop` event when it is set (`_StopLeavesFile`)


def test_parallel_launcher_raises_a_points_error_after_the_running_points_records(tmp_path,
                                                                                  monkeypatch):
    """A point's error stops the sweep; the points running beside it finish, and their records
    reach the sweep (results.jsonl) before the error, instead of being dropped. None starts
    after it. Point a ends only once the sweep has taken b's error (set its `stop`), which a
    timer could not promise on a loaded machine."""

    class _StopLeavesFile(threading.Event):
        def set(self) -> None:
            super().set()
            (tmp_path / STOPPED).touch()

    # Only the launcher's own Event (its `stop`): the pool's futures keep the real one.
    monkeypatch.setattr(launchers, "threading", types.SimpleNamespace(
        Event=_StopLeavesFile, current_thread=threading.current_thread,
        main_thread=threading.main_thread))
    launcher = launchers.LocalParallelLauncher(2, gpus=[])
    received = []
    with pytest.raises(RuntimeError, match="point b broke"):
        for records in launcher.map(fail_on_b_while_a_runs, POINTS, str(tmp_path)):
            received.append(records)
    assert received == [[{"point": "a"}]]


def test_a_sweep_of_several_processes_runs_its_points_with_the_local_launcher(monkeypatch,
                                                                              tmp_path):
    """Each process of a multi-process sweep (a pod's hosts, a SLURM task's srun processes) runs
    every point; a launcher of worker processes would have each run the points alone."""
    import jax

    from t5x_lite import sweep
    from t5x_lite.config import ConfigError

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(ConfigError, match=r"^this sweep runs in 2 processes \(one jax.distributed "
                       r"run, each point in all of them\); the LocalParallelLauncher would start "
                       r"processes of its own: use --launcher local$"):
        sweep.run_sweep("table2", "demo", str(tmp_path / "w"),
                        launcher=launchers.LocalParallelLauncher(2, gpus=[]))
    assert not (tmp_path / "w").exists()


def test_parallel_launcher_brings_a_preempted_point_back_as_preempted():
    """Not a failure, not a dead worker: the sweep sees the preemption (and its exit status)."""
    launcher = launchers.LocalParallelLauncher(1, gpus=[])
    with pytest.raises(Preempted) as stop:
        list(launcher.map(preempt_b, POINTS[:2], "wd"))
    assert (stop.value.step, stop.value.workdirs, stop.value.code) == (
        5, ["wd/b"], PREEMPTED_EXIT_STATUS)


def test_parallel_launcher_raises_when_a_worker_dies():
    launcher = launchers.LocalParallelLauncher(1, gpus=[])
    with pytest.raises(BrokenProcessPool):
        list(launcher.map(die, POINTS[:1], "wd"))


SIGTERM_SWEEP = """
import os, sys, time
from pathlib import Path
from t5x_lite import launchers
from t5x_lite.loop import PreemptionWatch
from t5x_lite.preemption import Preempted


def wait_for_sigterm(point, workdir):
    with PreemptionWatch() as watch:  # as a point's run does
        Path(workdir, point).write_text(str(os.getpid()))
        while watch.signal is None:
            time.sleep(0.05)
        raise Preempted(1, [f"{workdir}/{point}"], watch.cause)


if __name__ == "__main__":
    launcher = launchers.LocalParallelLauncher(2, gpus=[])
    list(launcher.map(wait_for_sigterm, ["a", "b", "c"], sys.argv[1]))
"""


@pytest.mark.parametrize("signum, to_group", [
    (signal.SIGTERM, False),  # a scheduler's preemption
    (signal.SIGINT, True),  # Ctrl-C in a terminal: the sweep's whole process group
    (signal.SIGINT, False),  # kill -INT to the sweep alone
])
def test_a_signal_to_a_parallel_sweep_stops_its_workers_as_preempted(tmp_path, signum,
                                                                     to_group):
    """SIGTERM to the sweep's process killed it at once (143, which the SLURM script does not
    requeue) and left its workers running, orphaned; SIGINT ended it in a KeyboardInterrupt
    traceback (130), to the sweep alone only once its workers' points had finished. Now the
    two points being run save and stop, the third never starts, and the sweep exits 75."""
    script = tmp_path / "sweep.py"
    script.write_text(SIGTERM_SWEEP)
    sweep = subprocess.Popen([sys.executable, str(script), str(tmp_path)], cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO)},
                             start_new_session=to_group, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300  # a hang guard only
        while not ((tmp_path / "a").exists() and (tmp_path / "b").exists()):
            assert sweep.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        if to_group:
            os.killpg(sweep.pid, signum)
        else:
            sweep.send_signal(signum)
        assert sweep.wait(timeout=300) == PREEMPTED_EXIT_STATUS
        assert "Traceback" not in sweep.stderr.read()
    finally:
        if sweep.poll() is None:
            sweep.kill()
    assert not (tmp_path / "c").exists()
    for point in "ab":  # its worker is gone, not orphaned
        with pytest.raises(ProcessLookupError):
            os.kill(int((tmp_path / point).read_text()), 0)


UNWATCHED_SWEEP = """
import os, signal, sys, time
from pathlib import Path
from t5x_lite import launchers


def unwatched(point, workdir):
    # As a point before its run's watch is set: a SIGTERM does not stop it. It notes the one
    # the sweep passes on (after the sweep has set its stop) and then ends, or ends after
    # argv[2] seconds without one.
    signalled = Path(workdir, point + ".signalled")
    signal.signal(signal.SIGTERM, lambda signum, frame: signalled.touch())
    Path(workdir, point + ".tmp").write_text(str(os.getpid()))
    os.replace(Path(workdir, point + ".tmp"), Path(workdir, point))  # seen only once written
    deadline = time.monotonic() + float(sys.argv[2])
    while not signalled.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    Path(workdir, point + ".done").write_text("")
    return [{"point": point}]


if __name__ == "__main__":
    launcher = launchers.LocalParallelLauncher(1, gpus=[])
    list(launcher.map(unwatched, ["a", "b", "c"], sys.argv[1]))
"""


def start_unwatched_sweep(tmp_path, seconds):
    """UNWATCHED_SWEEP in a process of its own, once its worker has started point a."""
    script = tmp_path / "sweep.py"
    script.write_text(UNWATCHED_SWEEP)
    sweep = subprocess.Popen([sys.executable, str(script), str(tmp_path), str(seconds)],
                             cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                             stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300  # a hang guard only
    while not (tmp_path / "a").exists():
        assert sweep.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    return sweep


def test_a_sigterm_no_running_point_takes_still_stops_a_parallel_sweep_as_preempted(tmp_path):
    """A SIGTERM that came before a worker's point could take it let the running point finish
    and start no other, and the sweep then exited 0 with points unrun (no scheduler requeues
    that). Now it exits 75 and says why."""
    sweep = start_unwatched_sweep(tmp_path, seconds=300)  # point a ends once signalled
    try:
        sweep.send_signal(signal.SIGTERM)
        assert sweep.wait(timeout=300) == PREEMPTED_EXIT_STATUS
    finally:
        if sweep.poll() is None:
            sweep.kill()
    assert (tmp_path / "a.done").exists() and not (tmp_path / "b").exists()
    assert (f"SIGTERM: stopping with exit status 75 before the next run of {tmp_path}"
            in sweep.stderr.read())


def test_a_parallel_sweep_s_workers_die_with_it(tmp_path):
    """A sweep killed with SIGKILL left its workers training on in the workdir (the sweep run
    again was refused as "being run by another process"), then idle for good."""
    sweep = start_unwatched_sweep(tmp_path, seconds=600)
    worker = int((tmp_path / "a").read_text())
    sweep.kill()
    sweep.wait(timeout=60)
    deadline = time.monotonic() + 60
    while running(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    if running(worker):  # the failure, without leaving the worker behind
        os.kill(worker, signal.SIGKILL)
        pytest.fail("the worker outlived its sweep")


def running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (killed, not yet reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:  # gone
        return False
    return state != "Z"


def test_worker_environments_share_out_gpus_and_set_cpu_device_counts():
    envs = launchers.worker_environments(2, ["0", "1", "2", "3", "4"])
    assert [env["CUDA_VISIBLE_DEVICES"] for env in envs] == ["0,1", "2,3,4"]
    envs = launchers.worker_environments(2, [], 4, "--xla_force_host_platform_device_count=8 --x")
    assert envs == [{"XLA_FLAGS": "--x --xla_force_host_platform_device_count=4"}] * 2


def test_worker_environments_bad_input():
    with pytest.raises(ValueError, match="workers=3 needs at least one GPU each, but only 2"):
        launchers.worker_environments(3, ["0", "1"])
    with pytest.raises(ValueError, match="workers=0 must be an integer >= 1"):
        launchers.LocalParallelLauncher(0)


def test_resource_request_follows_the_points_mesh():
    pinned, flexible = FakePoint("a", (2, 2)), FakePoint("b", (-1, 1))
    assert launchers.resource_request(pinned, "gpu") == {"num_cpus": 1, "num_gpus": 4}
    assert launchers.resource_request(flexible, "gpu", devices_per_point=2)["num_gpus"] == 2
    assert launchers.resource_request(pinned, "tpu")["resources"] == {"TPU": 4}
    assert launchers.resource_request(pinned, "cpu") == {"num_cpus": 4}
    with pytest.raises(ValueError, match="accelerator='npu'; choose one of cpu, gpu, tpu"):
        launchers.resource_request(pinned, "npu")


def test_make_launcher_names():
    assert isinstance(launchers.make_launcher("local"), launchers.LocalLauncher)
    with pytest.raises(ValueError, match="launcher='slurm'; choose one of local, parallel, ray"):
        launchers.make_launcher("slurm")


# ---------------------------------------------------------------------------------------------
# Ray


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def child_env():
    """For every child process of this module: two CPU devices with the test flags (and the
    session's compilation cache, which they inherit; see the sweep tests below)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XLA_FLAGS", with_device_count("", 2))
        yield


@pytest.fixture(scope="module")
def ray_address(child_env):
    """A Ray head on loopback, started (and stopped, by its process id) by this test module."""
    pytest.importorskip("ray", reason="Ray is an optional extra: pip install '.[ray]'")
    port = _free_port()
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0",
               # Ray's workers import the point functions of this file and t5x_lite from here.
               PYTHONPATH=os.pathsep.join([str(REPO / "tests"), str(REPO)]))
    head = subprocess.Popen(
        [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", f"--port={port}",
         "--node-ip-address=127.0.0.1", "--num-cpus=2", "--include-dashboard=false",
         "--disable-usage-stats", "--block"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        deadline = time.monotonic() + 600  # a hang guard only: a loaded machine starts slowly
        while head.poll() is None and time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail(f"the Ray head did not start (exited, or not listening after 600 s):"
                        f"\n{head.stdout.read()[-3000:]}")
        yield f"127.0.0.1:{port}"
    finally:
        head.terminate()  # --block: the head stops the Ray processes it started
        head.communicate(timeout=600)


def test_ray_launcher_runs_every_point_in_its_own_process(ray_address, tmp_path):
    launcher = launchers.RayLauncher(ray_address)
    records = [r for rs in launcher.map(describe_devices, POINTS[:2], str(tmp_path)) for r in rs]
    assert sorted(record["point"] for record in records) == ["a", "b"]
    assert len({record["pid"] for record in records}) == 2  # max_calls=1: a fresh worker each
    assert os.getpid() not in {record["pid"] for record in records}


def test_ray_address_that_does_not_answer_fails_fast(monkeypatch):
    """Fast means one bounded probe of the address before Ray is imported or ray.init (which
    retries for minutes) is called; checked by what is called, not by a wall clock that a
    loaded machine could run past."""
    address = f"127.0.0.1:{_free_port()}"
    probes = []

    def probe(where, timeout=None, *args, **kwargs):
        probes.append((where, timeout))
        return real_create_connection(where, timeout, *args, **kwargs)

    real_create_connection = socket.create_connection
    monkeypatch.setattr(launchers.socket, "create_connection", probe)
    monkeypatch.setitem(sys.modules, "ray", None)  # importing Ray would raise ImportError
    with pytest.raises(ConnectionError, match=f"Ray address '{address}' does not answer"):
        launchers.RayLauncher(address)
    assert len(probes) == 1 and probes[0][0] == ("127.0.0.1", int(address.split(":")[1]))
    assert probes[0][1] is not None and 0 < probes[0][1] <= 10
    with pytest.raises(ValueError, match="must be 'host:port', 'ray://host:port' or 'auto'"):
        launchers.RayLauncher("headnode")


@pytest.mark.parametrize("address, message", [
    (None, "does not answer"), ("headnode", "must be 'host:port'")])
def test_sweep_command_with_a_bad_ray_address_says_so_in_one_line(address, message, tmp_path):
    """`t5x-lite sweep --launcher ray` with an address that does not answer (or is no address)
    exits with one line naming it before any work: no traceback, nothing in the workdir."""
    address = address or f"127.0.0.1:{_free_port()}"
    with pytest.raises(SystemExit) as stopped:
        cli.main(["t5x-lite", "sweep", "table2", "--preset", "demo",
                  f"--workdir={tmp_path / 'sweep'}", "--launcher", "ray", "--address", address])
    text = str(stopped.value.code)
    assert text.startswith("t5x-lite sweep: Ray address") and message in text
    assert "\n" not in text and not (tmp_path / "sweep").exists()


# ---------------------------------------------------------------------------------------------
# A real sweep through each launcher, and the Colab notebook
#
# Both run the encoder-decoder's two Table 2 points (denoising, LM) with TINY_OVERRIDES on two CPU
# devices, in processes of their own, so that what the first compiles the others find in JAX's
# persistent compilation cache (compiling dominates their time; Ray's test runs two sweeps).

MESH = "mesh.shape=(2, 1)"  # the notebook's mesh on two devices: every local device
TINY_OVERRIDES = [
    "model.d_model=32", "model.d_ff=64", "model.num_heads=2",
    "model.d_kv=16", "model.num_layers=2", "model.vocab_size=256", "model.num_sentinels=16",
    "objective.inputs_length=16", "train.batch_size=4", "train.steps=4", "train.warmup_steps=1",
    "train.log_every=2", "checkpoint.every=4", "finetune.steps=4", "finetune.batch_size=4",
    "finetune.inputs_length=24", "finetune.targets_length=16", "finetune.eval_every=4",
    "finetune.eval_examples=8", "sweep.tasks=('builtin_reverse',)", "sweep.progress=False",
]
TWO_POINT_EXPERIMENT = """
from t5x_lite import grid

_table2 = grid.load_experiment("table2")
GRID = (_table2.GRID[0], _table2.GRID[5])
get_config = _table2.get_config
"""


# The same two points on an architecture the file registers: a copy of encoder_decoder under
# a name of its own, which a worker process knows only by loading the file.
REGISTERING_EXPERIMENT = TWO_POINT_EXPERIMENT + """
import dataclasses
from t5x_lite import architectures

architectures.register(dataclasses.replace(architectures.get("encoder_decoder"),
                                           name="my_encoder_decoder"))
GRID = tuple({**row, "overrides": {**row["overrides"], "model.arch": "my_encoder_decoder"}}
             for row in GRID)
"""


@pytest.fixture(scope="module")
def two_point_experiment(tmp_path_factory):
    path = tmp_path_factory.mktemp("experiments") / "two_points.py"
    path.write_text(TWO_POINT_EXPERIMENT)
    return str(path)


def _comparable(records: list[dict]) -> list[dict]:
    from t5x_lite import sweep_point

    return sorted(({k: v for k, v in r.items() if k not in sweep_point.TIMING_FIELDS}
                   for r in records), key=lambda r: r["point"])


def _sweep(experiment: str, workdir: Path, launcher) -> list[dict]:
    from t5x_lite import sweep

    records = sweep.run_sweep(experiment, "demo", str(workdir), launcher=launcher,
                              overrides=[MESH, *TINY_OVERRIDES])
    assert records == [json.loads(line) for line in (workdir / "results.jsonl").open()]
    return _comparable(records)


@pytest.fixture(scope="module")
def local_sweep(child_env, two_point_experiment, tmp_path_factory):
    """The records of the sweep with the default launcher, run in a child process (this one's
    JAX already has its devices and its cache settings)."""
    workdir = tmp_path_factory.mktemp("local")
    code = ("import sys; from t5x_lite import sweep; "
            "sweep.run_sweep(sys.argv[1], 'demo', sys.argv[2], overrides=sys.argv[3:])")
    subprocess.run(
        [sys.executable, "-c", code, two_point_experiment, str(workdir), MESH, *TINY_OVERRIDES],
        check=True, cwd=REPO,
    )
    records = [json.loads(line) for line in (workdir / "results.jsonl").open()]
    assert [(r["point"], r["status"]) for r in records] == [
        ("encoder_decoder/denoising", "ok"), ("encoder_decoder/lm", "ok")]
    return _comparable(records)


@pytest.mark.slow
def test_ray_sweep_writes_the_records_of_a_local_sweep(ray_address, two_point_experiment,
                                                       local_sweep, tmp_path):
    # ray_address first: without Ray this skips before the local sweep runs.
    launcher = launchers.RayLauncher(ray_address)
    assert _sweep(two_point_experiment, tmp_path, launcher) == local_sweep


@pytest.mark.slow
def test_parallel_sweep_runs_two_real_points_at_once_with_the_local_records(
        local_sweep, tmp_path):
    """`--launcher parallel` on the two real points: two worker processes of two CPU devices
    each give the default launcher's records, and the points ran at the same time: the spans
    over which each point's workdir was written overlap. The points' architecture is one that
    the experiment file registers (the same network under another name), which the workers
    know only by loading the file as the sweep's process did (they once failed the whole
    sweep: "model.arch='my_encoder_decoder' is not allowed"). The sweep runs in a child, so
    that this process's registry stays as it is."""
    experiment = tmp_path / "registering.py"
    experiment.write_text(REGISTERING_EXPERIMENT)
    code = ("import sys; from t5x_lite import launchers, sweep; "
            "sweep.run_sweep(sys.argv[1], 'demo', sys.argv[2], overrides=sys.argv[3:], "
            "launcher=launchers.LocalParallelLauncher(2, gpus=[], cpu_devices_per_worker=2))")
    workdir = tmp_path / "sweep"
    subprocess.run([sys.executable, "-c", code, str(experiment), str(workdir), MESH,
                    *TINY_OVERRIDES], check=True, cwd=REPO)
    records = _comparable([json.loads(line) for line in (workdir / "results.jsonl").open()])
    renamed = ("experiment", "config_hash")  # the file's name, and the arch in the config
    assert ([{k: v for k, v in r.items() if k not in renamed} for r in records]
            == [{k: v for k, v in r.items() if k not in renamed} for r in local_sweep])
    spans = []
    for point_dir in sorted((workdir / "points").glob("*/*/seed*")):
        written = [path.stat().st_mtime for path in point_dir.rglob("*") if path.is_file()]
        spans.append((min(written), max(written)))
    assert len(spans) == 2, spans
    (first_start, first_end), (second_start, second_end) = spans
    assert max(first_start, second_start) < min(first_end, second_end), spans


@pytest.mark.slow
def test_colab_notebook_runs_on_cpu_with_tiny_settings(child_env, tmp_path, monkeypatch):
    from conftest import require_module

    nbclient, nbformat, _ = map(require_module, ("nbclient", "nbformat", "ipykernel"))
    # The kernel inherits this environment (child_env); the notebook makes the mesh itself.
    monkeypatch.setenv("T5X_LITE_NOTEBOOK_TINY", " ".join(TINY_OVERRIDES))
    monkeypatch.setenv("T5X_LITE_NOTEBOOK_WORKDIR", str(tmp_path))
    notebook = nbformat.read(REPO / "launch" / "colab_tpu_demo.ipynb", as_version=4)
    nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(REPO)}}).execute()
    outputs = "".join(output.get("text", "") for cell in notebook.cells
                      for output in cell.get("outputs", []))
    assert "2 cpu device(s)" in outputs
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").open()]
    assert [(r["point"], r["status"]) for r in records] == [
        ("encoder_decoder/denoising", "ok"), ("encoder_decoder/lm", "ok")]
    assert "Encoder-decoder" in outputs  # the table's row label
    # The preview shows the denoising objective's sentinels in inputs and targets.
    assert "  inputs:  " in outputs and "<extra_id_0>" in outputs
    # Changed one thing (the feed-forward layer) and ran again into a workdir of its own.
    changed = [json.loads(line) for line in open(f"{tmp_path}_gated_gelu/results.jsonl")]
    assert [(r["point"], r["status"]) for r in changed] == [
        ("encoder_decoder/denoising", "ok"), ("encoder_decoder/lm", "ok")]
    assert {r["config_hash"] for r in changed}.isdisjoint({r["config_hash"] for r in records})
    comparison = outputs[outputs.index(f"Against {tmp_path}"):].splitlines()
    assert comparison[2].split() == ["Row", "builtin_reverse", "Average", "Held-out", "loss"]
    row = next(line for line in comparison if line.startswith("Encoder-decoder (Denoising)"))
    # Its score, average and held-out loss after the change, each with its difference.
    assert len(row.split()) == 2 + 2 * 3 and "–" not in row


# ---------------------------------------------------------------------------------------------
# TPU pods and SLURM


def test_tpu_dry_run_prints_the_expected_commands(capsys):
    """...and warns of a relative workdir: each host runs the sweep in its own checkout, so
    it would be a folder per host."""
    with pytest.warns(UserWarning, match=r"^--workdir runs/table2 in SWEEP_ARGS is relative: "
                      r"each TPU host would write its own folder"):
        cli.main(["t5x-lite", "launch",
            "tpu", "--tpu", "t5-pod", "--zone", "us-central2-b", "--project", "my-project",
            "--repo", "https://github.com/ORG/t5x_lite",
            "--", "table2", "--preset", "tiny", "--workdir", "runs/table2",
            "--config.train.steps=100",
        ])
    assert capsys.readouterr().out == (DATA / "launch_tpu.txt").read_text()


@pytest.mark.parametrize("missing", ["tpu", "zone", "repo"])
def test_tpu_launch_without_a_required_flag_says_which(missing):
    given = dict(tpu="t5-pod", zone="us-central2-b", repo="https://h/t5x_lite", project=None)
    given[missing] = None
    with pytest.raises(ValueError, match=f"{missing} is required for a TPU pod launch"):
        launchers.tpu_commands(["table2"], **given)


def test_tpu_launch_without_sweep_arguments():
    with pytest.raises(ValueError, match="sweep_args is empty"):
        launchers.tpu_commands([], tpu="t5-pod", zone="us-central2-b", repo="https://h/t5x_lite")


def test_slurm_script_for_a_two_point_sweep():
    script = launchers.slurm_script(
        ["table2", "--preset", "tiny", "--workdir", "/scratch/table2"], num_points=2,
        partition="gpu", nodes=2, gpus_per_node=4, time="12:00:00",
        setup=["source ~/t5x_lite/.venv/bin/activate"],
    )
    assert script == (DATA / "launch_slurm.txt").read_text()


def test_a_setup_line_bash_cannot_parse_is_refused_before_anything_is_submitted(capsys):
    """An unbalanced quote made a script `bash -n` rejects; `launch slurm` printed it (and
    would have submitted it) with status 0."""
    with pytest.raises(ValueError, match=r"""^--setup lines \['echo "hi'\] are not a script """
                                         r"bash can run \("):
        launchers.slurm_script(["table2"], num_points=1, partition="gpu", setup=['echo "hi'])
    # Lines are one script: an `if` may span several.
    launchers.slurm_script(["table2"], num_points=1, partition="gpu",
                           setup=["if [ -d ~/venv ]; then", "  . ~/venv/bin/activate", "fi"])
    with pytest.raises(SystemExit):
        cli.main(["t5x-lite", "launch", "slurm", "--partition", "gpu", "--setup", 'echo "hi',
                  "--", "table2", "--preset", "tiny", "--workdir", "/scratch/t2"])
    printed = capsys.readouterr()
    assert printed.out == "" and """--setup lines ['echo "hi'] are not a script""" in printed.err


def test_launch_readme_shows_the_script_its_slurm_command_prints(capsys):
    """launch/README.md's `t5x-lite launch slurm ...` example and the script it says that
    command prints, read from the README and compared with what the command prints."""
    readme = (Path(__file__).resolve().parents[1] / "launch" / "README.md").read_text()
    command, script = re.search(r"```bash\n(t5x-lite launch slurm .*?)```\nprints the script "
                                r"\(for a grid of 10 runs\):\n```bash\n(.*?)```", readme,
                                re.S).groups()
    cli.main(["t5x-lite", *shlex.split(command.replace("\\\n", " "))[1:]])
    assert capsys.readouterr().out == script


def test_slurm_script_requeues_a_task_when_slurm_signals_the_whole_job(tmp_path):
    """At the time limit or on preemption SLURM sends SIGTERM to the batch shell as well as to
    srun's processes. The sweep saves and exits 75; the script must outlive the signal to
    requeue the array task. Run with stand-ins for srun (a sweep that saves on SIGTERM) and
    scontrol (which logs its arguments)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "log"
    for name, body in (
            ("srun", f'trap \'sleep 0.3; echo saved >> {log}; exit 75\' TERM\n'
                     f'echo started >> {log}\nwhile true; do sleep 0.05; done'),
            ("scontrol", f'echo "scontrol $*" >> {log}')):
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    script = tmp_path / "job.sbatch"
    script.write_text(launchers.slurm_script(["table2"], num_points=2, partition="gpu"))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "1"}
    job = subprocess.Popen(["bash", str(script)], env=env, start_new_session=True)
    deadline = time.monotonic() + 30
    while not (log.exists() and "started" in log.read_text()):
        assert time.monotonic() < deadline and job.poll() is None, "srun never started"
        time.sleep(0.05)
    os.killpg(job.pid, signal.SIGTERM)  # as SLURM signals the job: every process of it
    assert job.wait(timeout=30) == PREEMPTED_EXIT_STATUS
    assert log.read_text().splitlines() == ["started", "saved", "scontrol requeue 7_1"]


def test_slurm_without_a_partition_fails_before_writing_anything(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"partition is required for a SLURM launch"):
        launchers.slurm_script(["table2"], num_points=2, partition=None)
    script = tmp_path / "sweep.sbatch"
    with pytest.raises(SystemExit):
        cli.main(["t5x-lite", "launch", "slurm", "--submit", "--script", str(script), "--",
                  "table2"])
    assert "partition is required for a SLURM launch" in capsys.readouterr().err
    assert not script.exists()


def test_a_failing_cluster_command_stops_the_launch_in_one_line(tmp_path, monkeypatch):
    """gcloud not logged in (any command exiting non-zero) ended `launch tpu --submit` in a
    CalledProcessError traceback; it names the command that failed, and how far it got."""
    fake = tmp_path / "bin" / "gcloud"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'ERROR: (gcloud) You do not currently have an active "
                    "account selected.' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    with pytest.raises(SystemExit) as stopped:
        cli.main(["t5x-lite", "launch", "tpu", "--submit", "--tpu", "t", "--zone", "z",
                  "--repo", "https://h/t5x_lite", "--", "table2", "--preset", "demo",
                  "--workdir", "runs/t2"])
    message = str(stopped.value.code)
    commands = launchers.tpu_commands(["table2"], tpu="t", zone="z", repo="r")
    assert message.startswith("t5x-lite launch: gcloud ") and "\n" not in message
    assert message.endswith(" exited with status 1 (its output above says why); commands run "
                            f"before it: 0 of {len(commands)}")


def test_launch_command_reports_bad_input_without_a_traceback(capsys):
    with pytest.raises(SystemExit):
        cli.main(["t5x-lite", "launch", "tpu", "--zone", "us-central2-b", "--repo", "https://h/t",
                  "--", "table2"])
    assert "tpu is required for a TPU pod launch (--tpu)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["t5x-lite", "launch", "slurm", "--partition", "gpu", "--", "table9",
                  "--workdir", "w"])
    assert "experiment='table9' does not exist" in capsys.readouterr().err
    # The sweep's arguments are checked with the sweep's own parser before anything starts.
    with pytest.raises(SystemExit):
        cli.main(["t5x-lite", "launch", "tpu", "--tpu", "t", "--zone", "z", "--repo", "r", "--",
                  "table2", "--workdir", "w", "--vmapp=2"])
    assert "t5x-lite sweep: error: unrecognised arguments: --vmapp=2" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # every job of the array would stop on it
        cli.main(["t5x-lite", "launch", "slurm", "--partition", "gpu", "--", "table2",
                  "--workdir", "w", "--workers", "4"])
    assert ("in SWEEP_ARGS: --workers is for --launcher parallel; this sweep's launcher is "
            "local") in capsys.readouterr().err
    with pytest.raises(SystemExit):  # Ray sizes its tasks per point: no vmapped chunks
        cli.main(["t5x-lite", "launch", "slurm", "--partition", "gpu", "--", "table2",
                  "--workdir", "w", "--launcher", "ray", "--vmap", "2"])
    assert ("in SWEEP_ARGS: --vmap is for --launcher local or parallel; this sweep's launcher "
            "is ray") in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["t5x-lite", "launch", "slurm", "--partition", "gpu"])
    assert "give the sweep's arguments after '--'" in capsys.readouterr().err


@pytest.mark.parametrize("target, sweep_flags, message", [
    ("slurm", ["--dry_run"], "--dry_run in SWEEP_ARGS would only print a plan on every host"),
    ("tpu", ["--dry_run"], "--dry_run in SWEEP_ARGS would only print a plan on every host"),
    ("slurm", ["--point_index", "3"], "--point_index in SWEEP_ARGS: the job array sets it"),
    ("tpu", ["--point_index", "99"], "point_index=99 must be in [0, 10)"),
    ("slurm", ["--launcher", "parallel", "--workers", "0"],
     "argument --workers: '0' is not an integer >= 1"),
    ("tpu", ["--launcher", "parallel", "--workers", "2"],
     "--launcher parallel in SWEEP_ARGS: launch starts the sweep's processes itself"),
    ("slurm", ["--launcher", "ray"], "--launcher ray in SWEEP_ARGS: launch starts the sweep's "
     "processes itself"),
])
def test_a_launched_sweep_that_cannot_work_is_refused_here_not_on_the_cluster(
        target, sweep_flags, message, capsys):
    """Each printed a script or commands (exit 0): every array task would have only planned,
    had its index overridden, or failed on the cluster."""
    flags = (["--partition", "gpu"] if target == "slurm"
             else ["--tpu", "t", "--zone", "z", "--repo", "r"])
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["t5x-lite", "launch", target, *flags, "--", "table2", "--preset", "demo",
                  "--workdir", "w", *sweep_flags])
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    assert message in err and out == ""


def test_slurm_bad_sizes():
    with pytest.raises(ValueError, match="gpus_per_node=0 must be an integer >= 1"):
        launchers.slurm_script(["table2"], num_points=2, partition="gpu", gpus_per_node=0)


@pytest.mark.parametrize("time", ["90", "30:00", "12:00:00", "2-12", "2-12:30", "2-12:30:00",
                                  "UNLIMITED"])
def test_slurm_takes_every_sbatch_time_format(time):
    script = launchers.slurm_script(["table2"], num_points=2, partition="gpu", time=time)
    assert f"#SBATCH --time={time}\n" in script


@pytest.mark.parametrize("time", ["24h", "1:2:3:4", "", "12:00:00 ", "2 days"])
def test_slurm_refuses_a_time_sbatch_would_reject(time, capsys):
    """It was written into the script as given, and sbatch refused the job on the cluster."""
    with pytest.raises(ValueError, match=rf"time={time!r} is not a SLURM time limit"):
        launchers.slurm_script(["table2"], num_points=2, partition="gpu", time=time)
    with pytest.raises(SystemExit):
        cli.main(["t5x-lite", "launch", "slurm", "--partition", "gpu", "--time", time, "--",
                  "table2", "--preset", "demo", "--workdir", "w"])
    out, err = capsys.readouterr()
    assert out == "" and f"time={time!r} is not a SLURM time limit" in err



def test_launchers_do_not_import_the_sweep():
    """The dependency goes one way: sweep imports launchers, never the other way round."""
    code = ("import sys; import t5x_lite.launchers; "
            "assert 't5x_lite.sweep' not in sys.modules, 'launchers imported sweep'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO,
                   env={**os.environ, "PYTHONPATH": str(REPO)})
    source = (REPO / "t5x_lite" / "launchers.py").read_text()
    assert "t5x_lite.sweep import" not in source and "import sweep" not in source
