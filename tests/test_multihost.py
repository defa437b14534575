"""Multi-process runs on localhost (gloo collectives on CPU, as srun or a TPU pod starts them).

Two processes (2 CPU devices each) train 3 steps, each feeding only its half of the global
batch, then score one checkpoint zero-shot; their losses and scores equal a single-process
run's. And a sweep (pre-train -> fine-tune -> evaluate) through the CLI on two processes
resumes a partial workdir and gives the records and validation logs of one process.

Run as a script, this file is one of the worker processes of the first test.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tiny_configs import tiny_train_config as tiny_config
from xla_env import child_env

STEPS = 3
PROCESSES = 2
DEVICES_PER_PROCESS = 2


def losses(mesh, process_rows: slice) -> list[float]:
    """Train STEPS updates on the fixed global batch, passing only `process_rows` of it."""
    import jax

    from t5x_lite import objectives, train_state, train_step

    config = tiny_config()
    layout = objectives.layout_for([config.objective], "encoder_decoder", 160, 32)
    global_batch = np.random.default_rng(0).integers(3, 128, (8, layout.raw_length), dtype=np.int32)
    spec = objectives.spec_from_config(config.objective)
    state = train_state.init_state(config, mesh)
    step = train_step.make_train_step(config, layout, mesh)
    history = []
    for _ in range(STEPS):
        state, metrics = step(state, global_batch[process_rows], spec, jax.random.key(0))
        history.append(float(metrics["loss"]))
    return history


def worker(port: int, process_id: int, out: str) -> None:
    """Process `process_id` of PROCESSES: its losses (`losses`), then its zero-shot scores of
    the model in out/model (`zero_shot_scores`)."""
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    from t5x_lite import distributed, partitioning

    assert distributed.initialize_distributed(f"localhost:{port}", PROCESSES, process_id)
    assert jax.device_count() == PROCESSES * DEVICES_PER_PROCESS
    mesh = partitioning.make_mesh(tiny_config().mesh)  # (-1, 1): data over all 4 devices
    rows = 8 // PROCESSES
    result = losses(mesh, slice(process_id * rows, (process_id + 1) * rows))
    Path(out, f"losses_{process_id}.json").write_text(json.dumps(result))
    zero_shot_scores(out, str(Path(out, "model")), str(process_id))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


_TESTS = Path(__file__).resolve().parent


def _environment(devices: int, **variables: str) -> dict[str, str]:
    """A worker's environment: CPU with `devices` devices and the session's compilation cache,
    this checkout (and tiny_configs) importable, no multi-process settings but `variables`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "SLURM_", "TPU_"))}
    return child_env(devices, env, PYTHONPATH=f"{_TESTS.parent}{os.pathsep}{_TESTS}",
                     **variables)


def _run_together(commands: list[list[str]], envs: list[dict[str, str]]) -> list[tuple[int, str]]:
    """Run the commands at once, each with its environment: (exit status, output) of each. The
    timeout only guards against a hang (e.g. a process left waiting in a collective)."""
    workers = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
               for command, env in zip(commands, envs)]
    try:
        outputs = [w.communicate(timeout=600)[0] for w in workers]
    finally:
        for w in workers:
            w.kill()
    return [(w.returncode, output) for w, output in zip(workers, outputs)]


def _run_all(commands: list[list[str]], envs: list[dict[str, str]]) -> list[str]:
    """`_run_together`, where every command must succeed: their outputs."""
    results = _run_together(commands, envs)
    for returncode, output in results:
        assert returncode == 0, output[-3000:]
    return [output for _, output in results]


@pytest.mark.slow  # three processes build the vocabulary and compile training and scoring
def test_two_processes_match_a_single_process_run(tmp_path):
    """Training: each process feeds its half of every batch, and both get the one-process
    losses. Zero-shot scoring of one checkpoint: each process feeds its rows of every batch of
    (example, option) rows; every process gets every option's log-likelihood, and the scores
    of this one process (8 devices)."""
    import jax

    from t5x_lite import partitioning

    scores = zero_shot_scores(str(tmp_path), str(tmp_path / "model"), "one")  # saves the model
    port = _free_port()
    _run_all([[sys.executable, __file__, str(port), str(i), str(tmp_path)]
              for i in range(PROCESSES)],
             [_environment(DEVICES_PER_PROCESS)] * PROCESSES)

    mesh = partitioning.make_mesh(tiny_config().mesh, jax.devices()[:1])
    reference = losses(mesh, slice(None))
    per_process = [
        json.loads((tmp_path / f"losses_{i}.json").read_text()) for i in range(PROCESSES)
    ]
    assert per_process[0] == per_process[1]  # every process sees the same global loss
    np.testing.assert_allclose(per_process[0], reference, rtol=1e-5)

    assert np.shape(scores["log_likelihoods"]) == (8, 4)  # eval_examples x label options
    for i in range(PROCESSES):
        result = json.loads((tmp_path / f"zero_shot_{i}.json").read_text())
        np.testing.assert_allclose(result["log_likelihoods"], scores["log_likelihoods"],
                                   rtol=1e-5)
        assert result["metrics"] == scores["metrics"]


# One Table 2 point, tiny (tiny_configs.tiny_sweep_config: 6 pre-training steps, 4 fine-tuning
# steps, validation on 8 examples of a builtin task), its batch rows over every device.
ONE_POINT = '''
from tiny_configs import tiny_sweep_config

GRID = (dict(point="denoising", row="Encoder-decoder", objective="Denoising",
             overrides={"objective.name": "span_corruption"}),)


def get_config(preset):
    config = tiny_sweep_config(preset)
    config.mesh.shape = (-1, 1)  # data over all devices: each process's rows on its own
    config.checkpoint.every = 100  # saves only at the end, which fine-tuning starts from
    return config
'''


def _close(ours, theirs, where="record"):
    """Equal JSON values, numbers to float tolerance (reductions run in another order)."""
    if isinstance(ours, dict):
        assert ours.keys() == theirs.keys(), where
        for key in ours:
            _close(ours[key], theirs[key], f"{where}.{key}")
    elif isinstance(ours, list):
        assert len(ours) == len(theirs), where
        for index, (a, b) in enumerate(zip(ours, theirs)):
            _close(a, b, f"{where}[{index}]")
    elif isinstance(ours, float):
        assert ours == pytest.approx(theirs, rel=1e-5, abs=1e-6), where
    else:
        assert ours == theirs, where


def test_a_sweep_through_the_cli_on_two_processes_resumes_and_gives_the_single_process_records(
        tmp_path):
    """As a user starts it: `t5x-lite sweep` once per process with JAX_COORDINATOR_ADDRESS /
    JAX_NUM_PROCESSES / JAX_PROCESS_ID; the CLI picks gloo itself. 4 devices either way.

    One process runs seeds 0 and 1. The two processes resume a shared workdir holding only
    seed 0 (a partial sweep): they run seed 1 alone, to the one-process record, and process 0
    is the one writer. Run again, they find everything done and exit. Two processes that see
    different workdirs (each host its own) are refused on both, instead of hanging."""
    from t5x_lite import sweep_point
    from t5x_lite.results import RESULTS_FILE

    experiment = tmp_path / "one_point.py"
    experiment.write_text(ONE_POINT)

    def command(workdir):
        return [sys.executable, "-m", "t5x_lite.cli", "sweep", str(experiment),
                "--preset", "demo", "--workdir", str(workdir), "--config.sweep.seeds=(0,1)"]

    def two_processes(*workdirs):
        port = _free_port()
        return _run_together(
            [command(w) for w in workdirs],
            [_environment(DEVICES_PER_PROCESS, JAX_COORDINATOR_ADDRESS=f"localhost:{port}",
                          JAX_NUM_PROCESSES=str(PROCESSES), JAX_PROCESS_ID=str(i))
             for i in range(PROCESSES)])

    one, two = tmp_path / "one", tmp_path / "two"
    _run_all([command(one)], [_environment(PROCESSES * DEVICES_PER_PROCESS)])
    seed0_line, seed1_line = (one / RESULTS_FILE).read_text().splitlines()
    shutil.copytree(one, two, ignore=lambda d, names: ["seed1"] if d.endswith("denoising") else [])
    (two / RESULTS_FILE).write_text(seed0_line + "\n")  # seed 0 finished, seed 1 not begun

    resumed = two_processes(two, two)
    assert [code for code, _ in resumed] == [0, 0], resumed[0][1][-3000:] + resumed[1][1][-3000:]
    lines = (two / RESULTS_FILE).read_text().splitlines()
    assert len(lines) == 2 and lines[0] == seed0_line, lines  # one writer; seed 0 untouched

    def without_timing(line):
        return {k: v for k, v in json.loads(line).items() if k not in sweep_point.TIMING_FIELDS}

    def eval_log(workdir):
        log = workdir / "points/denoising/seed1/finetune/builtin_reverse/eval.jsonl"
        return [json.loads(line) for line in log.read_text().splitlines()]

    record = without_timing(lines[1])
    assert record["seed"] == 1 and record["status"] == "ok", record
    _close(record, without_timing(seed1_line))
    _close(eval_log(two), eval_log(one), "eval.jsonl")

    again = two_processes(two, two)
    assert [code for code, _ in again] == [0, 0] and "0 to run" in again[0][1], again[0][1][-3000:]
    assert (two / RESULTS_FILE).read_text().splitlines() == lines

    disagreeing = two_processes(two, tmp_path / "host_local")
    for code, output in disagreeing:
        assert code != 0 and "see different finished points" in output, output[-3000:]
        assert "Traceback" not in output, output[-3000:]


def test_initialize_distributed_needs_all_three_settings(monkeypatch):
    from t5x_lite import distributed
    from t5x_lite.config import ConfigError

    for name in (
        "JAX_COORDINATOR_ADDRESS",
        "JAX_NUM_PROCESSES",
        "JAX_PROCESS_ID",
        "SLURM_NTASKS",
        "TPU_WORKER_HOSTNAMES",
        distributed.TPU_POD_ENV,
    ):
        monkeypatch.delenv(name, raising=False)
    assert distributed.initialize_distributed() is False  # single process: nothing to join
    with pytest.raises(ConfigError, match="missing num_processes, process_id"):
        distributed.initialize_distributed(coordinator="localhost:1234")
    monkeypatch.setenv("JAX_NUM_PROCESSES", "two")
    with pytest.raises(ConfigError, match="JAX_NUM_PROCESSES='two' must be a non-negative integer"):
        distributed.initialize_distributed()
    with pytest.raises(ConfigError, match=r"process_id=2 must be in \[0, num_processes=2\)"):
        distributed.initialize_distributed("localhost:1234", 2, 2)


def test_a_tpu_pod_slice_joins_by_jax_cluster_detection_when_asked(monkeypatch):
    """A TPU VM's shell need not name the slice's hosts (JAX reads them from the metadata
    server once asked to join), so the TPU_WORKER_HOSTNAMES check alone never joined a pod
    started by `launch tpu`: its command sets TPU_POD_ENV, which joins with no arguments."""
    import jax

    from t5x_lite import distributed, launchers

    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID",
                 "SLURM_NTASKS", "TPU_WORKER_HOSTNAMES"):
        monkeypatch.delenv(name, raising=False)
    joined = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda *args: joined.append(args))
    monkeypatch.setenv(distributed.TPU_POD_ENV, "0")
    assert distributed.initialize_distributed() is False and joined == []
    monkeypatch.setenv(distributed.TPU_POD_ENV, "1")
    assert distributed.initialize_distributed() is True and joined == [()]
    _, start = launchers.tpu_commands(["table2"], tpu="t", zone="z", repo="r")
    assert f"&& {distributed.TPU_POD_ENV}=1 python3 -m t5x_lite.cli sweep table2" in start[-1]


def test_several_cpu_processes_get_gloo_collectives_by_themselves(monkeypatch):
    """What the CLI's commands call first: even where jax defaults to no CPU collectives."""
    import jax

    from t5x_lite import distributed

    joined = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda *args: joined.append(args))
    before = jax.config.jax_cpu_collectives_implementation
    try:
        jax.config.update("jax_cpu_collectives_implementation", None)  # no collectives
        assert distributed.initialize_distributed("localhost:1234", 1, 0)  # one process: left alone
        assert jax.config.jax_cpu_collectives_implementation is None
        assert distributed.initialize_distributed("localhost:1234", 2, 1)
        assert jax.config.jax_cpu_collectives_implementation == "gloo"
        jax.config.update("jax_cpu_collectives_implementation", "mpi")  # the user's choice
        assert distributed.initialize_distributed("localhost:1234", 2, 0)
        assert jax.config.jax_cpu_collectives_implementation == "mpi"
    finally:
        jax.config.update("jax_cpu_collectives_implementation", before)
    assert joined == [("localhost:1234", 1, 0), ("localhost:1234", 2, 1), ("localhost:1234", 2, 0)]


def test_a_batch_size_the_processes_cannot_share_is_refused_before_any_work(tmp_path,
                                                                           monkeypatch):
    import jax
    from tiny_configs import tiny_sweep_config

    from t5x_lite import finetune, sweep
    from t5x_lite.config import ConfigError

    experiment = tmp_path / "one_point.py"
    experiment.write_text(ONE_POINT)
    monkeypatch.setattr(jax, "process_count", lambda: 3)
    with pytest.raises(ConfigError, match=r"train.batch_size=4 must be divisible by the number "
                                          r"of processes \(3\)"):
        sweep.run_sweep(str(experiment), "demo", str(tmp_path / "sweep"))
    config = tiny_sweep_config("demo")
    config.finetune.tasks = ("builtin_reverse",)
    with pytest.raises(ConfigError, match=r"finetune.batch_size=4 must be divisible by the "
                                          r"number of processes \(3\)"):
        finetune.finetune(config, tmp_path / "finetune", init_from=None)
    assert not list(tmp_path.glob("sweep*")) and not list(tmp_path.glob("finetune*"))


def zero_shot_scores(out: str, checkpoint: str, name: str) -> dict:
    """Zero-shot scores of builtin_module and every option's log-likelihood, of the model in
    `checkpoint`, written to out/zero_shot_<name>.json. In a single process (`name` "one") the
    model is made here first, from the seed; in a worker (`name` its process id) it is read."""
    import jax

    from t5x_lite import checkpointing, partitioning, train_state, zero_shot
    from t5x_lite.data import pipeline, tasks
    from t5x_lite.evaluation import TaskSplit, params_of
    from tiny_configs import tiny_sweep_config

    config = tiny_sweep_config("demo", "builtin_module")
    config.mesh.shape = (-1, 1)  # rows over every device: each process scores its own
    config.finetune.batch_size = 8  # divides over the test process's 8 devices too
    mesh = partitioning.make_mesh(config.mesh)
    if jax.process_count() == 1:
        with checkpointing.Checkpointer(Path(checkpoint, "checkpoints"), every=1, keep=1,
                                        config=config) as saver:
            saver.maybe_save(0, train_state.init_state(config, mesh), force=True)
    vocab = pipeline.vocabulary_from_config(config)
    split = TaskSplit(tasks.TASKS["builtin_module"], "validation", config, vocab,
                      config.finetune.eval_examples)
    scorer = zero_shot.ZeroShotScorer(config, [split], vocab, mesh)
    params = params_of(config, checkpoint, mesh)
    table, = scorer.log_likelihoods(params)
    result = {"log_likelihoods": table.tolist(), "metrics": scorer(params)["builtin_module"]}
    Path(out, f"zero_shot_{name}.json").write_text(json.dumps(result))
    return result


if __name__ == "__main__":
    worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
