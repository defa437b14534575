"""The one training loop, and its utilities: metrics, progress, throughput, checkpoints, preemption.

    run_setup.set_up(plan) -> Run --run_loop--> one record per step --summaries--> per point

`run_loop` runs every kind of run alike (pre-training, K points in one vmapped step,
fine-tuning): the compiled step on each step's data; each step's record to every point's
`metrics.jsonl` (`MetricsWriter`, mirrored to TensorBoard) and to the progress bar or log
(`Progress`, with ETA), its speed as tokens/s, TFLOP/s and MFU (`Throughput`); a checkpoint of
every point on its schedule and at the end; and on preemption (`PreemptionWatch`: SIGTERM /
SIGINT, or JAX's preemption notice on several processes) a save at the step reached, then
`preemption.Preempted`, a distinct exit status. Something every run does per step is added
here once. The host's work per step overlaps the device's: a step is queued before the previous
one's metrics are read. `EvalLog` keeps the validation records (`eval.jsonl`) that a run's hook
(`Every`) appends: fine-tuning's, and pre-training's held-out loss.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import signal
import sys
import threading
import time
import warnings
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
import tqdm
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from t5x_lite import accounting, compile_events, tensorboard
from t5x_lite.checkpointing import Checkpointer
from t5x_lite.preemption import Preempted
from t5x_lite.results import write_atomically
from t5x_lite.train_state import TrainState, unstack_state
from t5x_lite.train_step import FinetuneStep, TrainStep

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# Metrics, progress, speed


METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"  # the run's TensorBoard event files (`tensorboard --logdir`)


class MetricsWriter:
    """One JSON object per step appended (and flushed) to `workdir/metrics.jsonl`, mirrored to
    TensorBoard event files in `workdir/tensorboard` (`tensorboard.EventFileWriter`). Only
    process 0 writes; elsewhere every method is a no-op.

    A run that resumes from step `start_step` first drops the records of later steps (logged
    after the checkpoint it resumes from, or by a run now restarted), so the file always holds
    exactly one record per step of the trajectory that produced the current state.
    """

    def __init__(self, workdir: Path, start_step: int = 0):
        self.enabled = jax.process_index() == 0
        self.path = workdir / METRICS_FILE
        if self.enabled and self.path.exists():
            keep_records_up_to(self.path, start_step)
        self._file = self.path.open("a") if self.enabled else None
        self._tensorboard = (tensorboard.EventFileWriter(workdir / TENSORBOARD_DIR)
                             if self.enabled else None)

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        self._tensorboard.add_scalars(
            {f"train/{name}": value for name, value in record.items()
             if name != "step" and isinstance(value, (int, float))}, record["step"])

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def keep_records_up_to(path: Path, step: int) -> None:
    """Rewrite the JSON-lines file `path` keeping records with `step <= step` (atomically).

    A last line cut short by a crash is dropped with a warning; any other unreadable line is
    an error, since silently dropping it would lose a finished result.
    """
    lines = path.read_text().splitlines()
    kept = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                warnings.warn(f"{path}: dropping a partly written last line (line {number})")
                continue
            raise ValueError(f"{path}: line {number} is not JSON: {line[:80]!r}") from None
        if record["step"] <= step:
            kept.append(line)
    write_atomically(path, "".join(line + "\n" for line in kept))


EVAL_FILE = "eval.jsonl"


def _selection_score(metrics: dict[str, float]) -> float:
    """What 'best' means for a validation record: the mean of the task's metrics (NaN, e.g. a
    correlation of constant predictions, counts as worst)."""
    values = [v for v in metrics.values() if not math.isnan(v)]
    return float(np.mean(values)) if len(values) == len(metrics) else -math.inf


def _eval_scalars(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """{task: record fields} -> TensorBoard's tags and values: each task's loss, token accuracy
    and task metrics (its other fields, such as the held-out examples' fingerprint, are not
    numbers)."""
    scalars = {}
    for task, result in results.items():
        numbers = {**{name: result.get(name) for name in ("loss", "token_accuracy")},
                   **result.get("metrics", {})}
        scalars.update({f"eval/{task}/{name}": value for name, value in numbers.items()
                        if isinstance(value, (int, float)) and not isinstance(value, bool)})
    return scalars


class EvalLog:
    """`workdir/eval.jsonl`: one record per (validation step, task), and the best of them:
    fine-tuning's validation (`t5x_lite.finetune`) and pre-training's held-out text
    (`t5x_lite.held_out`, task "held_out").

    Record: {"step", "task", "loss", "token_accuracy", "metrics": {name: value}}, and a
    held-out record "examples" too (`held_out.examples_fingerprint`). Opening the
    log of a run resumed at `start_step` drops the records of later steps (they belong to a
    trajectory the resumed run replaces), so the best scores are those of the run's history.
    Each record's numbers also go to TensorBoard beside the training metrics, as
    `eval/<task>/loss`, `eval/<task>/token_accuracy` and `eval/<task>/<metric>` (an event file
    of its own, `*.eval`, made at the first record).
    """

    def __init__(self, workdir: Path, start_step: int):
        self.path = workdir / EVAL_FILE
        self._tensorboard_dir = workdir / TENSORBOARD_DIR
        self._tensorboard: tensorboard.EventFileWriter | None = None
        self.records: list[dict[str, Any]] = []
        if self.path.exists():
            if jax.process_index() == 0:  # one writer; the others read what it kept
                keep_records_up_to(self.path, start_step)
            if jax.process_count() > 1:  # read only once process 0 rewrote it (cut last line)
                multihost_utils.sync_global_devices("t5x_lite_eval_log")
            self.records = [record for record in map(json.loads, self.path.read_text().splitlines())
                            if record["step"] <= start_step]

    def add(self, step: int, results: dict[str, dict[str, Any]]) -> None:
        """Append the validation `results` of `step` (only process 0 writes the file)."""
        new = [{"step": step, "task": task, **result} for task, result in results.items()]
        self.records.extend(new)
        if jax.process_index() == 0:
            with self.path.open("a") as f:
                f.writelines(json.dumps(record) + "\n" for record in new)
            if self._tensorboard is None:
                self._tensorboard = tensorboard.EventFileWriter(self._tensorboard_dir, ".eval")
            self._tensorboard.add_scalars(_eval_scalars(results), step)

    def best(self) -> dict[str, dict[str, Any]]:
        """{task: the record with the best selection score (the earliest among equals)}."""
        best: dict[str, dict[str, Any]] = {}
        for record in self.records:
            current = best.get(record["task"])
            score = _selection_score(record["metrics"])
            if current is None or score > _selection_score(current["metrics"]):
                best[record["task"]] = record
        return best


class Progress:
    """A tqdm bar with ETA when stderr is a terminal, else a log line every `every` steps."""

    def __init__(self, start: int, total: int, every: int, enabled: bool):
        self.total, self.every, self.enabled = total, every, enabled and jax.process_index() == 0
        # (time, step) of the first step shown: the rate behind the ETA leaves out the set-up
        # and the first step's compile, which counted as step time (546 s left said, 14 s
        # meant, early in a resumed run).
        self.origin: tuple[float, int] | None = None
        self.bar = (
            tqdm.tqdm(initial=start, total=total, unit="step")
            if self.enabled and sys.stderr.isatty()
            else None
        )

    def update(self, record: dict[str, Any]) -> None:
        """Show a step's record; a vmapped run's per-point values show as their mean."""
        step = record["step"]
        loss, accuracy, lr = (np.mean(record[name]) for name in ("loss", "accuracy",
                                                                   "learning_rate"))
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{record['tokens_per_s']:.0f}")
        now = time.perf_counter()
        if self.origin is None:
            self.origin = (now, step)
        if self.bar is None and self.enabled and (step % self.every == 0 or step == self.total):
            since, first = self.origin
            per_step = ((now - since) / (step - first) if step > first
                        else float(np.mean(record["step_s"])))
            print(
                f"step {step}/{self.total} loss {loss:.4f} acc {accuracy:.3f} "
                f"lr {lr:.2e} {record['tokens_per_s']:.0f} tok/s "
                f"eta {per_step * (self.total - step):.0f}s",
                file=sys.stderr,
                flush=True,
            )

    def note(self, message: str) -> None:
        """Show a line beside the steps' (e.g. a validation result), above the bar if any."""
        if self.bar is not None:
            self.bar.write(message, file=sys.stderr)
        elif self.enabled:
            print(message, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


_CPU_PEAKS: dict[str, float] = {}


def peak_flops_per_second(mesh: Mesh, dtype: str) -> float | None:
    """The mesh's peak FLOP/s: the vendor table times the device count on accelerators; on
    CPU a matmul measured once per process (simulated CPU devices share the same cores)."""
    device = mesh.devices.flat[0]
    if device.platform == "cpu":
        if dtype not in _CPU_PEAKS:
            _CPU_PEAKS[dtype] = accounting.measure_cpu_matmul_peak(jnp.dtype(dtype))
        return _CPU_PEAKS[dtype]
    peak = accounting.peak_flops(device, dtype)
    return None if peak is None else peak * mesh.devices.size


@dataclasses.dataclass(frozen=True)
class Throughput:
    """Turns one step's wall time into throughput: tokens/s, TFLOP/s and MFU.

    Tokens are every position the model reads per step (batch x (inputs + targets) lengths);
    FLOPs are the accounting module's training FLOPs (3 x forward matmuls)."""

    tokens_per_step: int
    flops_per_step: float
    peak: float | None

    @classmethod
    def of(cls, config: ml_collections.ConfigDict, lengths: tuple[int, int], mesh: Mesh, *,
           points: int = 1, peak: float | None = None) -> Throughput:
        """A step of `points` batches of `config.train.batch_size` examples, each `lengths`
        (inputs, targets) positions long. `peak`: the FLOP/s MFU is measured against, if
        already known (`bench` times its own); by default `peak_flops_per_second` of the mesh."""
        examples = points * config.train.batch_size
        return cls(
            tokens_per_step=examples * sum(lengths),
            flops_per_step=examples * accounting.train_flops_per_example(config.model, *lengths),
            peak=peak_flops_per_second(mesh, config.model.dtype) if peak is None else peak,
        )

    def __call__(self, step_s: float) -> dict[str, float | None]:
        flops_per_s = self.flops_per_step / step_s
        return {
            "step_s": step_s,
            "tokens_per_s": self.tokens_per_step / step_s,
            "tflops_per_s": flops_per_s / 1e12,
            "mfu": accounting.mfu(flops_per_s, self.peak),
        }


# ---------------------------------------------------------------------------------------------
# Preemption


class PreemptionWatch:
    """Tells the loop when to save and stop: once SIGTERM or SIGINT arrived (one process), or
    at the step all processes agreed on after a preemption notice reached any of them.

    With several processes the decision comes from JAX's preemption service (started by
    `jax.distributed.initialize`; it owns SIGTERM there, SIGINT is not handled): a notice may
    reach only some processes, at different steps, so they agree on a step a little after it,
    and `reached` returns True at that step on every one of them. This needs every process to
    call `reached` after every step. Entering installs the signal handlers (one process, main
    thread), leaving restores the previous ones; a second Ctrl-C raises KeyboardInterrupt
    without waiting for the save. Watches nest: a signal the inner one (a run's) receives is
    also the outer one's (a sweep point's, which stops at its next stage), so that a signal
    that comes as a run ends, its last step taken, still stops what would follow.
    """

    def __init__(self) -> None:
        self.signal: int | None = None
        self._interrupted = False  # a SIGINT came
        self._previous_handlers: dict[int, Any] = {}

    @property
    def cause(self) -> str:
        """What stopped the run, for its message: the signal's name, or the multi-host notice."""
        return "a preemption notice" if self.signal is None else signal.Signals(self.signal).name

    def reached(self, step: int) -> bool:
        """Whether the run should save at `step` and stop."""
        if jax.process_count() > 1:
            return ocp.multihost.reached_preemption(step)
        return self.signal is not None

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT:
            # A second Ctrl-C stops without waiting for the save; only a second: a parallel
            # sweep's worker may have its SIGTERM (the sweep's, passed on) before the Ctrl-C.
            if self._interrupted:
                raise KeyboardInterrupt
            self._interrupted = True
        self._record(signum)
        print(f"received {signal.Signals(signum).name}: saving a checkpoint after the current "
              "step, then stopping"
              + (" (a second Ctrl-C stops at once, without saving)"
                 if signum == signal.SIGINT else ""), file=sys.stderr, flush=True)

    def _record(self, signum: int) -> None:
        """Keep the first signal, and pass it on to the watch this one is nested in."""
        if self.signal is None:
            self.signal = signum
        outer = getattr(self._previous_handlers.get(signum), "__self__", None)
        if isinstance(outer, PreemptionWatch):
            outer._record(signum)

    def __enter__(self) -> PreemptionWatch:
        if jax.process_count() > 1:
            return self  # JAX's preemption service owns SIGTERM; a handler would replace it
        if threading.current_thread() is not threading.main_thread():
            log.warning("preemption handling is off: signal handlers need the main thread")
            return self
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous_handlers[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers.clear()


# ---------------------------------------------------------------------------------------------
# The loop


@dataclasses.dataclass
class Point:
    """One point of a run: its workdir, and the checkpointer and metrics writer of it."""

    workdir: Path
    checkpointer: Checkpointer
    writer: MetricsWriter


@dataclasses.dataclass
class Run:
    """A run ready for `run_loop` (`run_setup.set_up` builds it): its compiled step, the
    step-indexed data (`data.batch(step)` -> the step's data argument), the step's further
    arguments, the state at step `start`, and its points.

    A vmapped run trains its K points in one step whose state, arguments and metrics carry a
    leading [K] axis; point k's slice is saved by its own checkpointer and its metrics written
    by its own writer. Any other run has one point and no such axis. `state` is the latest
    state as the loop advances.
    """

    mesh: Mesh
    step: TrainStep | FinetuneStep
    data: Any
    step_args: tuple
    state: TrainState
    start: int
    total: int
    points: list[Point]
    vmapped: bool
    speed: Throughput
    progress: Progress
    preemption: PreemptionWatch
    # XLA compilations of the step's program during `run_loop`, as JAX's compile events count
    # them (`compile_events`): 1 if it compiled the program, 0 if the program was compiled before.
    step_compiles: int = 0

    def point_state(self, index: int) -> TrainState:
        """Point `index`'s train state."""
        return unstack_state(self.state, index) if self.vmapped else self.state

    def point_record(self, record: dict[str, Any], index: int) -> dict[str, Any]:
        """Point `index`'s part of a step's record: of a vmapped run's lists of K values, its
        own; the rest (the step and its speed) all points share."""
        if not self.vmapped:
            return record
        return {name: value[index] if isinstance(value, list) else value
                for name, value in record.items()}


@dataclasses.dataclass(frozen=True)
class Every:
    """A hook of `run_loop`: `call(step, state)` after every `steps`-th step and after the
    run's last (fine-tuning's validation, pre-training's held-out loss). The loop reads the
    state only at such steps: between them a step is queued before the previous one's metrics
    are read, so the loop must know them in advance."""

    steps: int
    call: Callable[[int, TrainState], None]

    def due(self, step: int, total: int) -> bool:
        """Whether the hook runs after `step` of a run that ends at step `total`."""
        return step % self.steps == 0 or step == total


class _Records:
    """`run_loop`'s step records, one step behind the device. `queue` holds a just-called
    step's metrics and records the step queued before it; `flush` records the held step.
    Recording a step reads its metrics (waiting for its device work), writes the record to
    every point's writer and the progress, and stops the run on a non-finite loss. A step's
    `step_s` is the wall time since the previous record less the compilations within it: with
    a step queued ahead, the device's time per step."""

    def __init__(self, run: Run):
        self.run, self.records, self.queued = run, [], None
        self.restart_clock()

    def restart_clock(self) -> None:
        """The next step's time starts now (a hook's time is not step time)."""
        self.last, self.compiled_s = time.perf_counter(), self.run.step.program.compile_seconds

    def queue(self, step: int, metrics: dict[str, Any], compile_s: float, compiles: int) -> None:
        """Hold step `step`'s device `metrics`, after recording the step held before it."""
        self.flush()
        self.queued = {"step": step, "metrics": metrics, "compile_s": compile_s,
                       "compiles": compiles}

    def flush(self) -> None:
        """Record the held step, if any."""
        if self.queued is None:
            return
        queued, self.queued, run = self.queued, None, self.run
        metrics = {name: np.asarray(value).tolist()  # a float, or K of them
                   for name, value in jax.device_get(queued.pop("metrics")).items()}
        now, compiled_s = time.perf_counter(), run.step.program.compile_seconds
        step_s = now - self.last - (compiled_s - self.compiled_s)
        self.last, self.compiled_s = now, compiled_s
        record = {"step": queued["step"], **metrics, **run.speed(step_s), **queued}
        for index, point in enumerate(run.points):
            point.writer.write(run.point_record(record, index))
        run.progress.update(record)
        self.records.append(record)
        if not np.all(np.isfinite(record["loss"])):
            raise FloatingPointError(
                f"loss is {record['loss']} at step {record['step']}; stopping without saving "
                f"this state (last checkpoint: step {run.points[0].checkpointer.latest_step()})"
            )


def _save(run: Run, step: int, points: Sequence[int], force: bool = False) -> None:
    """Start saving the state at `step` of the points at indices `points`."""
    for index in points:
        # Slicing a point out of a vmapped state costs a dispatch per array: only when saved.
        run.points[index].checkpointer.maybe_save(step, run.point_state(index), force=force)


def run_loop(run: Run, hook: Every | None = None) -> list[dict[str, Any]]:
    """Steps `run.start` -> `run.total`: `run.step(state, run.data.batch(step), *step_args)`,
    its record to every point's writer and the progress, `hook` when due (e.g. fine-tuning's
    validation), every point's checkpoint when due and at the end. Returns the step records.
    On preemption it saves every point at the step reached and raises `preemption.Preempted`,
    which ends the process with `PREEMPTED_EXIT_STATUS` unless caught.

    The device is kept busy: step N + 1 is queued (JAX dispatches asynchronously) and the next
    batch made before step N's metrics are read and written, so the host's work per step
    overlaps the device's. Where the state itself is needed (a checkpoint, the hook,
    preemption, the last step) the loop first reads the step's metrics, so a non-finite loss
    of any point still stops the loop before that state is saved or used (one further step
    may have been queued, and is dropped).

    A record holds the step's metrics as floats, or as lists of K floats for a vmapped run
    (`Run.point_record` picks one point's). Its `compiles` is the program cache's count since
    the loop started; `run.step_compiles` adds up, from JAX's backend-compile events, the
    compilations of the step's program during the steps' calls (`compile_events`)."""
    with compile_events.compilations() as compiled:
        return _loop(run, hook, compiled)


def _loop(run: Run, hook: Every | None, compiled: list[str]) -> list[dict[str, Any]]:
    """`run_loop`'s steps; `compiled` collects the names of the programs compiled meanwhile."""
    step, train_step = run.start, run.step
    if step >= run.total:
        run.progress.note(f"{', '.join(str(point.workdir) for point in run.points)}: nothing to "
                          f"train: the newest checkpoint is at step {step} and the run ends at "
                          f"step {run.total}")
    else:
        if step > 0:  # without a progress bar nothing else said so
            run.progress.note(f"{', '.join(str(point.workdir) for point in run.points)}: "
                              f"resuming at step {step} of {run.total}, its newest checkpoint")
        if train_step.compiles == 0:  # its program never compiled: the first step waits
            run.progress.note("the first step waits for its program: compiled (minutes for a "
                              "large model), or loaded if an earlier command compiled it")
    compiles_before = train_step.compiles
    records = _Records(run)
    batch = run.data.batch(step) if step < run.total else None
    while step < run.total:
        compile_before = train_step.program.compile_seconds
        seen = len(compiled)
        run.state, metrics = train_step(run.state, batch, *run.step_args)
        run.step_compiles += compile_events.count(compiled[seen:], train_step.function_name)
        step += 1
        compile_s = train_step.program.compile_seconds - compile_before
        if compile_s:
            run.progress.note(f"step {step}: the step program was ready in {compile_s:.1f} s")
        batch = run.data.batch(step) if step < run.total else None  # overlaps the device step
        # The previous step is recorded while this one runs.
        records.queue(step, metrics, compile_s, train_step.compiles - compiles_before)
        if hook is not None and hook.due(step, run.total):
            records.flush()
            hook.call(step, run.state)
            records.restart_clock()
        # Asked every step, on every process alike: on several processes it is a sync point.
        # At the last step the run is done: it saves below and ends as finished (exit 0, not
        # 75, so a scheduler does not requeue it); a sweep's own watch still stops after it.
        if run.preemption.reached(step) and step < run.total:
            records.flush()
            _save(run, step, range(len(run.points)), force=True)
            stop = Preempted(step, [point.workdir for point in run.points],
                             run.preemption.cause)
            if jax.process_index() == 0:
                print(stop, file=sys.stderr, flush=True)
            raise stop  # leaving the run's set-up waits for the saves to finish
        saves = [index for index, point in enumerate(run.points)
                 if point.checkpointer.should_save(step)]
        if saves or step == run.total:  # the state is saved: its step's loss is checked first
            records.flush()
            _save(run, step, saves)
    _save(run, step, range(len(run.points)), force=True)
    return records.records


def logged_record(workdir: Path, step: int) -> dict[str, Any]:
    """`workdir/metrics.jsonl`'s record of `step` if it is the file's last one, else {} (no
    file: another process than 0, or a run that has not logged that step). A resumed run's
    file ends at the step it resumed from (`MetricsWriter`), so only its tail is read."""
    path = workdir / METRICS_FILE
    if not path.exists():
        return {}
    with path.open("rb") as file:
        file.seek(max(0, file.seek(0, os.SEEK_END) - 65536))
        lines = file.read().splitlines()
    record = json.loads(lines[-1]) if lines else {}
    return record if record.get("step") == step else {}


def summarize(records: list[dict[str, Any]], workdir: Path, start: int) -> dict[str, Any]:
    """Final step and loss, medians of the speed metrics over steps that did not compile, and
    the pre-training examples left out of the loss because they did not fit the layout.

    A run that trained no step (it resumed at its end) reports the loss and accuracy its
    state was logged with (`logged_record`), and no speed."""
    steady = [r for r in records if r["compile_s"] == 0.0] or records

    def median(name: str) -> float | None:
        values = [r[name] for r in steady if r[name] is not None]
        return float(np.median(values)) if values else None

    last = records[-1] if records else {}
    final = last or logged_record(workdir, start)
    return {
        "workdir": str(workdir), "start_step": start, "step": last.get("step", start),
        "loss": final.get("loss"), "accuracy": final.get("accuracy"),
        "tokens_per_s": median("tokens_per_s"), "step_s": median("step_s"), "mfu": median("mfu"),
        "compiles": last.get("compiles", 0), "compile_s": sum(r["compile_s"] for r in records),
        "objective_overflow": sum(r.get("objective_overflow", 0) for r in records),
    }


def summaries(run: Run, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`summarize` of each point of `run`, from `run_loop`'s records, with the run's
    `step_compiles` (its points share the one step)."""
    return [{**summarize([run.point_record(record, index) for record in records],
                         point.workdir, run.start), "step_compiles": run.step_compiles}
            for index, point in enumerate(run.points)]
