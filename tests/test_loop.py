"""The loop (`t5x_lite.loop`): a non-finite loss stops it unsaved, metrics.jsonl holds one record
per step of the trajectory, and a run stopped by SIGTERM / SIGINT, or by a preemption notice
to one of two processes, saves the step it reached and exits with `PREEMPTED_EXIT_STATUS`. The
signal tests run child processes that train a toy state (no model) through the one run set-up
and loop."""
import json
import os
import pathlib
import pickle
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import types

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from jax.sharding import SingleDeviceSharding

from t5x_lite import loop, run_setup, tensorboard
from t5x_lite.checkpointing import Checkpointer
from t5x_lite.config import default_config
from t5x_lite.preemption import PREEMPTED_EXIT_STATUS, Preempted
from t5x_lite.train_state import TrainState
from xla_env import child_env

REPO = pathlib.Path(__file__).resolve().parents[1]


class _FakeStep:
    """Stands in for a TrainStep: returns scripted losses, never compiles, and notes in
    `events` each call ("step N") and each read of a step's metrics ("read N")."""

    compiles, function_name = 0, "fake_step"
    program = types.SimpleNamespace(compile_seconds=0.0)

    def __init__(self, losses, events=None):
        self.losses, self.calls = list(losses), 0
        self.events = [] if events is None else events

    def __call__(self, state, batch, *step_args):
        self.calls += 1
        self.events.append(f"step {self.calls}")
        return state, {"loss": _Metric(self.losses[self.calls - 1], self.calls, self.events),
                       "learning_rate": 0.1, "accuracy": 0.0}


class _Metric:
    """A device value as `jax.device_get` sees it: read through `__array__`, noted when read."""

    def __init__(self, value, step, events):
        self.value, self.step, self.events = value, step, events

    def __array__(self, dtype=None, copy=None):
        self.events.append(f"read {self.step}")
        return np.asarray(self.value, dtype)


class _FakeCheckpointer:
    def __init__(self, saves_at=(), events=None):
        self.saves_at, self.asked, self.saved = set(saves_at), [], []
        self.events = [] if events is None else events

    def should_save(self, step):
        self.asked.append(step)
        return step in self.saves_at

    def maybe_save(self, step, state, force=False):
        self.events.append(f"save {step}")
        self.saved.append((step, force))

    def latest_step(self):
        return self.saved[-1][0] if self.saved else None


def _fake_run(tmp_path, step, checkpointer, total):
    return loop.Run(
        mesh=None, step=step,
        data=types.SimpleNamespace(batch=lambda step: np.zeros((8, 4), np.int32)),
        step_args=(None, None), state=None, start=0, total=total,
        points=[loop.Point(tmp_path, checkpointer, loop.MetricsWriter(tmp_path))],
        vmapped=False, speed=loop.Throughput(tokens_per_step=10, flops_per_step=1.0, peak=None),
        progress=loop.Progress(0, total, every=1, enabled=False),
        preemption=loop.PreemptionWatch())


@pytest.mark.parametrize("schedule_wants_step_2", [False, True])
def test_a_non_finite_loss_stops_the_loop_without_saving_that_state(tmp_path,
                                                                     schedule_wants_step_2):
    """Whether or not step 2 is due for a checkpoint, its NaN loss stops the run with nothing
    saved. When it is not due, step 3 was already queued (its state is dropped)."""
    checkpointer = _FakeCheckpointer(saves_at={2} if schedule_wants_step_2 else ())
    run = _fake_run(tmp_path, _FakeStep([2.0, float("nan"), 1.0]), checkpointer, total=5)
    with pytest.raises(FloatingPointError, match="loss is nan at step 2; stopping without saving"):
        loop.run_loop(run)
    run.points[0].writer.close()
    assert checkpointer.saved == []
    assert run.step.calls == (2 if schedule_wants_step_2 else 3)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]  # the bad step is on record


def test_the_loop_queues_the_next_step_before_reading_metrics_except_where_it_needs_the_state(
        tmp_path):
    """Step N + 1 is called (queued on the device) before step N's metrics are read, so the
    host's work overlaps the device's; before a checkpoint (step 2), the hook (every 3 steps)
    and the last step, the step's metrics are read first and nothing is queued ahead."""
    events = []
    checkpointer = _FakeCheckpointer(saves_at={2}, events=events)
    run = _fake_run(tmp_path, _FakeStep([1.0] * 7, events), checkpointer, total=7)
    records = loop.run_loop(run, loop.Every(3, lambda step, state: events.append(f"hook {step}")))
    run.points[0].writer.close()
    assert events == ["step 1", "step 2", "read 1", "read 2", "save 2",
                      "step 3", "read 3", "hook 3",
                      "step 4", "step 5", "read 4", "step 6", "read 5", "read 6", "hook 6",
                      "step 7", "read 7", "hook 7", "save 7"]
    assert [record["step"] for record in records] == list(range(1, 8))
    assert [r["step"] for r in map(json.loads, (tmp_path / "metrics.jsonl").open())] == [
        *range(1, 8)]
    assert checkpointer.saved == [(2, False), (7, True)]


def test_metrics_writer_appends_json_lines_and_tensorboard_events(tmp_path):
    writer = loop.MetricsWriter(tmp_path)
    writer.write({"step": 1, "loss": 2.5, "mfu": None})
    writer.write({"step": 2, "loss": 2.0, "mfu": 0.5})
    writer.close()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["loss"]) for r in lines] == [(1, 2.5), (2, 2.0)]
    events = list((tmp_path / loop.TENSORBOARD_DIR).glob("events.out.tfevents.*"))
    assert len(events) == 1
    records = _tfrecords(events[0].read_bytes())
    # The version event, then one event per scalar: loss at step 1 (mfu None is left out);
    # loss and mfu at step 2.
    assert len(records) == 4
    assert records[0].endswith(b"brain.Event:2")
    assert [b"train/loss" in r for r in records[1:]] == [True, True, False]
    assert b"train/mfu" in records[3]


def _tfrecords(data: bytes) -> list[bytes]:
    """The records of a TFRecord file, each checked against its two masked CRC-32Cs."""
    records = []
    while data:
        header, data = data[:12], data[12:]
        length = struct.unpack("<Q", header[:8])[0]
        assert header[8:] == tensorboard._masked_crc(header[:8])
        record, crc, data = data[:length], data[length:length + 4], data[length + 4:]
        assert crc == tensorboard._masked_crc(record)
        records.append(record)
    return records


def _scalar(record: bytes) -> tuple[str, float, int]:
    """(tag, value, step) of a scalar event, read by the layout the tensorboard module's
    docstring gives: wall_time (field 1, a double), step (2, a varint), summary (5) holding one
    value (1) of tag (1) and simple_value (2, a float)."""
    assert record[0] == 0x09 and record[9] == 0x10  # wall_time's key, then step's
    step, shift, at = 0, 0, 10
    while True:
        step |= (record[at] & 0x7F) << shift
        shift, at = shift + 7, at + 1
        if not record[at - 1] & 0x80:
            break
    summary = record[at + 2:]  # field 5's key and its one-byte length
    value = summary[2:]  # field 1's key and its one-byte length
    tag = value[2:2 + value[1]].decode()
    assert value[2 + value[1]] == 0x15  # simple_value's key
    (number,) = struct.unpack("<f", value[3 + value[1]:7 + value[1]])
    return tag, number, step


def test_eval_log_writes_json_lines_and_each_number_to_tensorboard(tmp_path):
    """Validation and held-out records go to eval.jsonl and, as `eval/<task>/<name>` scalars,
    to an event file of their own beside the training metrics'; non-numbers stay out."""
    log = loop.EvalLog(tmp_path, start_step=0)
    assert not (tmp_path / loop.TENSORBOARD_DIR).exists()  # nothing until the first record
    log.add(10, {"held_out": {"loss": 3.5, "token_accuracy": 21.25, "examples": "1fb5e0848b05",
                              "metrics": {}}})
    log.add(300, {"glue_sst2": {"loss": 0.75, "token_accuracy": 90.0,
                                "metrics": {"accuracy": 88.5}}})
    records = [json.loads(line) for line in (tmp_path / "eval.jsonl").read_text().splitlines()]
    assert [(r["step"], r["task"], r["loss"]) for r in records] == [
        (10, "held_out", 3.5), (300, "glue_sst2", 0.75)]
    (events,) = (tmp_path / loop.TENSORBOARD_DIR).glob("events.out.tfevents.*.eval")
    tfrecords = _tfrecords(events.read_bytes())
    assert tfrecords[0].endswith(b"brain.Event:2")  # one version event, then the scalars
    assert [_scalar(record) for record in tfrecords[1:]] == [
        ("eval/held_out/loss", 3.5, 10), ("eval/held_out/token_accuracy", 21.25, 10),
        ("eval/glue_sst2/loss", 0.75, 300), ("eval/glue_sst2/token_accuracy", 90.0, 300),
        ("eval/glue_sst2/accuracy", 88.5, 300)]
    # The training metrics' writer of the same process writes a file of its own.
    writer = loop.MetricsWriter(tmp_path)
    writer.write({"step": 1, "loss": 2.5})
    writer.close()
    assert len(list((tmp_path / loop.TENSORBOARD_DIR).glob("events.out.tfevents.*"))) == 2


def test_crc32c_is_the_castagnoli_crc():
    # The check value of CRC-32C (the CRC catalogue's "123456789") and RFC 3720's test vectors.
    assert tensorboard.crc32c(b"123456789") == 0xE3069283
    assert tensorboard.crc32c(bytes(32)) == 0x8A9136AA
    assert tensorboard.crc32c(bytes([0xFF] * 32)) == 0x62A8AB43
    assert tensorboard.crc32c(bytes(range(32))) == 0x46DD794E


def test_event_files_hold_the_bytes_tensorboardx_writes(tmp_path):
    """tensorboardX (the reference writer; it imports torch, so only here) and ours write the
    same records for the same scalars, steps and wall times; the version events differ only in
    their wall time (the first field: a 1-byte key and an 8-byte double)."""
    from conftest import require_module

    tensorboardx = require_module("tensorboardX")  # the reference the files are checked against
    scalars = [("train/loss", 2.5, 1), ("train/mfu", 0.375, 1), ("eval/loss", -1e-3, 2),
               ("train/lr", 3e-4, 2**40)]
    theirs = tensorboardx.SummaryWriter(str(tmp_path / "theirs"))
    ours = tensorboard.EventFileWriter(tmp_path / "ours")
    for tag, value, step in scalars:
        theirs.add_scalar(tag, value, step, walltime=1234.5)
        ours.add_scalars({tag: value}, step, wall_time=1234.5)
    theirs.close()
    (their_file,) = (tmp_path / "theirs").glob("events.out.tfevents.*")
    their_records = _tfrecords(their_file.read_bytes())
    our_records = _tfrecords(ours.path.read_bytes())
    assert our_records[1:] == their_records[1:] and len(our_records) == len(scalars) + 1
    assert our_records[0][9:] == their_records[0][9:]


def test_metrics_of_steps_after_the_resumed_checkpoint_are_replaced(tmp_path):
    """Resuming from step 3 drops the records of steps 4-5 that the crashed run logged after
    its checkpoint (and a line cut short by the crash), so each step appears exactly once."""
    lines = [json.dumps({"step": step, "loss": 10.0 - step}) for step in range(1, 6)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 6, "lo')
    with pytest.warns(UserWarning, match="partly written last line"):
        writer = loop.MetricsWriter(tmp_path, start_step=3)
    writer.write({"step": 4, "loss": 1.5})
    writer.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["loss"]) for r in records] == [(1, 9.0), (2, 8.0), (3, 7.0), (4, 1.5)]


def test_the_logged_record_of_a_run_that_trained_nothing_is_its_files_last(tmp_path):
    """A run resumed at its end reports the step's logged loss: the file's last record (read
    from its tail, here 200 kB long), and nothing when the last record is another step's."""
    assert loop.logged_record(tmp_path, 3) == {}  # no file (e.g. a process other than 0)
    lines = [json.dumps({"step": step, "loss": 1.0 / step, "note": "x" * 100})
             for step in range(1, 2001)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert loop.logged_record(tmp_path, 2000)["loss"] == 1.0 / 2000
    assert loop.logged_record(tmp_path, 1999) == {}
    summary = loop.summarize([], tmp_path, 2000)
    assert (summary["step"], summary["loss"], summary["step_s"]) == (2000, 1.0 / 2000, None)


def test_a_damaged_metrics_line_in_the_middle_is_an_error_not_a_silent_loss(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        loop.MetricsWriter(tmp_path, start_step=2)


# --- preemption --------------------------------------------------------------------------------

def toy_plan(workdir: pathlib.Path, config: ml_collections.ConfigDict):
    """A toy run for run_setup.set_up and loop.run_loop: its state is a step counter and a [2]
    vector over the data axis, both +1 per step, checkpointed every 1000 steps."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    from t5x_lite import run_setup

    def fresh_state(config, mesh):
        rows, whole = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
        scalar = lambda value: jax.make_array_from_callback(  # noqa: E731
            (), whole, lambda _: np.asarray(value))
        w = jax.make_array_from_callback((2,), rows, lambda index: np.zeros(2, np.float32)[index])
        return TrainState(step=scalar(np.int32(0)), params={"w": w},
                          opt_state=scalar(np.float32(0)))

    class ToyStep:
        compiles, program = 0, types.SimpleNamespace(compile_seconds=0.0)
        function_name = "toy_step"
        increment = staticmethod(jax.jit(lambda state: jax.tree.map(lambda x: x + 1, state)))

        def __call__(self, state, batch):
            return self.increment(state), {"loss": 0.0, "accuracy": 0.0, "learning_rate": 0.0}

    return run_setup.RunPlan(
        configs=[config], workdirs=[workdir],
        make_data=lambda: types.SimpleNamespace(batch=lambda step: None),
        make_step=lambda mesh: ToyStep(), step_args=(), lengths=(1, 1), fresh_state=fresh_state)


# `toy_plan`'s run in a child process, one step per 50 ms, each step's number printed. With
# `port process_id` arguments it is one of 2 processes (one CPU device each) in a JAX cluster.
CHILD = textwrap.dedent(
    """
    import sys, time
    import jax
    workdir, *cluster = sys.argv[1:]
    if cluster:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(f"localhost:{cluster[0]}", num_processes=2, process_id=int(cluster[1]))
    import pathlib
    sys.path.insert(0, "tests")
    from test_loop import toy_plan
    from t5x_lite import loop, run_setup
    from t5x_lite.config import default_config

    def show(step, state):
        print(step, flush=True)
        time.sleep(0.05)

    with run_setup.set_up(toy_plan(pathlib.Path(workdir), default_config()), steps=10_000,
                          progress=False) as run:
        loop.run_loop(run, loop.Every(1, show))
    """
)


def spawn(*args: str) -> subprocess.Popen:
    env = child_env(1)
    return subprocess.Popen([sys.executable, "-c", CHILD, *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, text=True)


def signal_at_step_3(child: subprocess.Popen, signum: int) -> None:
    for line in child.stdout:
        if line.strip() == "3":
            child.send_signal(signum)
            return


def stopped_at(child: subprocess.Popen) -> int:
    """The last step the child printed, after checking it stopped as a preempted run does (3
    if it printed nothing after the signal at step 3)."""
    output, _ = child.communicate(timeout=600)  # a hang guard only
    assert child.returncode == PREEMPTED_EXIT_STATUS
    return max([3, *(int(line) for line in output.splitlines() if line.strip().isdigit())])


def assert_checkpoint_at(workdir: pathlib.Path, step: int) -> None:
    whole = SingleDeviceSharding(jax.devices()[0])
    scalar = lambda dtype: jax.ShapeDtypeStruct((), dtype, sharding=whole)  # noqa: E731
    target = TrainState(step=scalar(jnp.int32), opt_state=scalar(jnp.float32),
                        params={"w": jax.ShapeDtypeStruct((2,), jnp.float32, sharding=whole)})
    with Checkpointer(workdir / "checkpoints", every=1000, keep=3,
                      config=default_config()) as ckpt:
        assert ckpt.latest_step() == step
        restored = ckpt.restore(target)
    assert int(restored.step) == step
    np.testing.assert_array_equal(restored.params["w"], np.full(2, step, np.float32))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_signal_saves_the_step_reached_and_exits_with_the_preempted_status(tmp_path, signum):
    child = spawn(str(tmp_path))
    signal_at_step_3(child, signum)
    reached = stopped_at(child)
    assert 3 <= reached < 10_000  # stopped by the signal, not by running out of steps
    assert_checkpoint_at(tmp_path, reached)


def test_only_a_second_ctrl_c_stops_without_saving():
    """A parallel sweep's worker gets the sweep's SIGTERM and the terminal's SIGINT in either
    order for one Ctrl-C: a SIGINT after a SIGTERM still saves; a second SIGINT does not."""
    with loop.PreemptionWatch() as watch:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        assert watch.signal == signal.SIGTERM  # the first, which the save reports
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)


def test_a_signal_at_the_last_step_ends_the_run_as_finished(tmp_path, capsys):
    """A signal as the last step ran (its final validation, say) made a finished run exit 75
    ("run the same command again to resume"), which a scheduler requeues; it now saves and
    ends."""
    def signal_at_3(step, state):
        if step == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    config = default_config()
    config.mesh.shape = (1, 1)
    with run_setup.set_up(toy_plan(tmp_path, config), steps=3, progress=False) as run:
        records = loop.run_loop(run, loop.Every(1, signal_at_3))
    assert [record["step"] for record in records] == [1, 2, 3]
    assert "received SIGTERM: saving a checkpoint after the current step" in \
        capsys.readouterr().err
    assert_checkpoint_at(tmp_path, 3)


def test_the_eta_is_the_rate_since_the_first_step_shown_not_since_set_up(monkeypatch, capsys):
    """The set-up and the first step's compile counted as step time: 'eta 546s' early in a
    resumed run that had 14 s left."""
    clock = [1000.0]
    monkeypatch.setattr(loop.time, "perf_counter", lambda: clock[0])
    progress = loop.Progress(start=100, total=400, every=10, enabled=True)
    clock[0] += 300.0  # set-up and compile
    record = {"loss": 1.0, "accuracy": 0.5, "learning_rate": 1e-3, "tokens_per_s": 10.0,
              "step_s": 0.2}
    progress.update({**record, "step": 101})
    for step in range(102, 111):
        clock[0] += 0.1
        progress.update({**record, "step": step})
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1].endswith("eta 29s")  # 9 steps in 0.9 s, 290 to go


def test_multihost_preemption_notice_to_one_process_stops_all_at_one_step(tmp_path):
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        port = probe.getsockname()[1]
    children = [spawn(str(tmp_path), str(port), str(i)) for i in range(2)]
    signal_at_step_3(children[1], signal.SIGTERM)  # only process 1 gets the notice
    reached = [stopped_at(child) for child in children]
    assert reached[0] == reached[1] >= 3
    assert reached[0] < 10_000  # stopped by the notice, not by running out of steps
    assert_checkpoint_at(tmp_path, reached[0])


def test_preempted_is_an_exit_with_its_status_that_survives_a_process_boundary():
    """What a parallel sweep's worker sends back: the step, workdirs and cause stay, and it is
    a SystemExit (past `except Exception`, the failure handling) with the preempted status."""
    stop = pickle.loads(pickle.dumps(Preempted(7, [pathlib.Path("runs/a")], "SIGTERM")))
    assert isinstance(stop, SystemExit) and not isinstance(stop, Exception)
    assert stop.code == PREEMPTED_EXIT_STATUS
    assert (stop.step, stop.workdirs, stop.cause) == (7, ["runs/a"], "SIGTERM")
    assert str(stop).startswith(f"SIGTERM at step 7: stopping with exit status "
                                f"{PREEMPTED_EXIT_STATUS} once the checkpoints of runs/a")
