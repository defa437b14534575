"""Training runs: multi-host setup, the resumable loop, its metrics, progress and speed.

`train(config, workdir)` pre-trains one config: it builds (or restores) the state, runs the
jitted step of `t5x_lite.train_step` over the pipeline's batches, writes
`workdir/metrics.jsonl` (and TensorBoard events), checkpoints, and stops cleanly on
preemption. `train_vmapped(configs, workdirs, layout=...)` pre-trains K compatible points in
one vmapped step, each with its own workdir, checkpoints and metrics. Fine-tuning
(`t5x_lite.evaluation`) reuses `run_loop`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import time
import types
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import tqdm
from jax.sharding import Mesh

from t5x_lite import accounting, objectives, partitioning
from t5x_lite.checkpointing import Checkpointer
from t5x_lite.config import ConfigError
from t5x_lite.train_step import (
    FinetuneStep,
    TrainState,
    TrainStep,
    abstract_state,
    init_state,
    make_train_step,
    make_vmapped_train_step,
    require_one_group,
    stack_specs,
    stack_states,
    step_key,
    unstack_state,
    validate_config,
)

try:
    from tensorboardX import SummaryWriter
except ImportError:  # an optional extra: metrics.jsonl stays the canonical record without it
    SummaryWriter = None


# ---------------------------------------------------------------------------------------------
# The loop


class MetricsWriter:
    """One JSON object per step appended (and flushed) to `workdir/metrics.jsonl`, mirrored to
    TensorBoard event files when the optional `tensorboardX` is installed. Only process 0
    writes; elsewhere every method is a no-op.

    A run that resumes from step `start_step` first drops the records of later steps (logged
    after the checkpoint it resumes from, or by a run now restarted), so the file always holds
    exactly one record per step of the trajectory that produced the current state.
    """

    def __init__(self, workdir: Path, start_step: int = 0):
        self.enabled = jax.process_index() == 0
        self.path = workdir / "metrics.jsonl"
        if self.enabled and self.path.exists():
            keep_records_up_to(self.path, start_step)
        self._file = self.path.open("a") if self.enabled else None
        self._tensorboard = None
        if self.enabled and SummaryWriter is not None:
            self._tensorboard = SummaryWriter(str(workdir / "tensorboard"))

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tensorboard is not None:
            for name, value in record.items():
                if name != "step" and isinstance(value, (int, float)):
                    self._tensorboard.add_scalar(f"train/{name}", value, record["step"])

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._tensorboard is not None:
            self._tensorboard.close()


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
    partial = path.with_suffix(".jsonl.tmp")
    partial.write_text("".join(line + "\n" for line in kept))
    os.replace(partial, path)


class Progress:
    """A tqdm bar with ETA when stderr is a terminal, else a log line every `every` steps."""

    def __init__(self, start: int, total: int, every: int, enabled: bool):
        self.total, self.every, self.enabled = total, every, enabled and jax.process_index() == 0
        self.start_time, self.start_step = time.perf_counter(), start
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
        elif self.enabled and (step % self.every == 0 or step == self.total):
            elapsed = time.perf_counter() - self.start_time
            eta = elapsed / (step - self.start_step) * (self.total - step)
            print(
                f"step {step}/{self.total} loss {loss:.4f} acc {accuracy:.3f} "
                f"lr {lr:.2e} {record['tokens_per_s']:.0f} tok/s eta {eta:.0f}s",
                file=sys.stderr,
                flush=True,
            )

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
    def of(cls, config: ml_collections.ConfigDict, layout: objectives.BatchLayout, mesh: Mesh,
           peak: float | None = None):
        """`peak`: the FLOP/s MFU is measured against, if already known (`bench` times its own);
        by default `peak_flops_per_second` of the mesh."""
        lengths = (layout.inputs_length, layout.targets_length)
        return cls(
            tokens_per_step=config.train.batch_size * sum(lengths),
            flops_per_step=config.train.batch_size
            * accounting.train_flops_per_example(config.model, *lengths),
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


def train(
    config: ml_collections.ConfigDict,
    workdir: str | os.PathLike,
    *,
    steps: int | None = None,
    progress: bool = True,
    restart: bool = False,
    resume: bool = False,
    layout: objectives.BatchLayout | None = None,
) -> dict[str, Any]:
    """Pre-train `config` in `workdir` up to `steps` updates (default `config.train.steps`).

    `layout` defaults to `objectives.layout_from_config(config)`; a sweep passes the layout of
    its whole grid, so that every run of an architecture family shares one compiled program.

    Resumes from `workdir/checkpoints` when it holds a checkpoint of a compatible config
    (`restart=True` wipes them; `resume=True` makes a missing checkpoint an error). The data
    position is a function of the step, so the checkpoint is all a resume needs. Appends one
    record per step to `workdir/metrics.jsonl`; saves every `config.checkpoint.every` steps, at
    the end, and on SIGTERM / SIGINT. Returns a summary of the run.
    """
    workdir = Path(workdir)
    total = config.train.steps if steps is None else steps
    mesh = partitioning.make_mesh(config.mesh)
    validate_config(config, mesh)
    spec = objectives.spec_from_config(config.objective)
    layout = objectives.layout_from_config(config) if layout is None else layout
    # Imported here: the pipeline pulls in TFDS, which the train step alone does not need.
    from t5x_lite.data.pipeline import describe_corpus, pretrain_data_from_config

    print(f"pre-training corpus: {describe_corpus(config)}", file=sys.stderr, flush=True)
    with Checkpointer(workdir / "checkpoints", every=config.checkpoint.every,
                      keep=config.checkpoint.keep, config=config, restart=restart,
                      require_existing=resume) as checkpointer:
        _, data = pretrain_data_from_config(
            config, layout.raw_length, jax.process_index(), jax.process_count())
        train_step = make_train_step(config, layout, mesh)
        speed = Throughput.of(config, layout, mesh)
        if checkpointer.latest_step() is None:
            state = init_state(config, mesh)
        else:
            state = checkpointer.restore(abstract_state(config, mesh))
        start = int(state.step)
        writer = MetricsWriter(workdir, start)
        bar = Progress(start, total, config.train.log_every, progress)
        try:
            records = run_loop(state, start, total, data, train_step,
                               (spec, step_key(config.train.seed)), checkpointer, writer, bar,
                               speed)
        finally:
            writer.close()
            bar.close()
    return summarize(records, workdir, start)


def point_record(record: dict[str, Any], index: int) -> dict[str, Any]:
    """Point `index`'s record from a vmapped run's record (lists of K values; the rest, e.g.
    the step and its speed, shared by the points)."""
    return {name: value[index] if isinstance(value, list) else value
            for name, value in record.items()}


class _PointWriters:
    """`MetricsWriter`'s interface over one writer per point of a vmapped run."""

    def __init__(self, writers: Sequence[MetricsWriter]):
        self.writers = list(writers)

    def write(self, record: dict[str, Any]) -> None:
        for index, writer in enumerate(self.writers):
            writer.write(point_record(record, index))

    def close(self) -> None:
        for writer in self.writers:
            writer.close()


class _PointCheckpointers:
    """What `run_loop` uses of a `Checkpointer`, over one per point of a vmapped run: each
    point's slice of the stacked state is saved in its own folder, at the same steps."""

    def __init__(self, checkpointers: Sequence[Checkpointer], every: int):
        self.checkpointers, self.every = list(checkpointers), every

    def latest_step(self) -> int | None:
        return self.checkpointers[0].latest_step()

    def reached_preemption(self, step: int) -> bool:
        # A signal reaches only the handler installed last; ask every checkpointer.
        return any([c.reached_preemption(step) for c in self.checkpointers])

    def maybe_save(self, step: int, state: TrainState, force: bool = False) -> bool:
        if not force and step % self.every:  # don't slice the state on steps that don't save
            return False
        return all([checkpointer.maybe_save(step, unstack_state(state, index), force)
                    for index, checkpointer in enumerate(self.checkpointers)])


def _newest_steps_agree(configs: Sequence[ml_collections.ConfigDict],
                        workdirs: Sequence[Path]) -> bool:
    """Whether the points' checkpoint folders hold the same newest step (or all none)."""
    steps = set()
    for config, workdir in zip(configs, workdirs):
        with Checkpointer(workdir / "checkpoints", every=config.checkpoint.every,
                          keep=config.checkpoint.keep, config=config) as checkpointer:
            steps.add(checkpointer.latest_step())
    return len(steps) == 1


def train_vmapped(
    configs: Sequence[ml_collections.ConfigDict],
    workdirs: Sequence[str | os.PathLike],
    *,
    layout: objectives.BatchLayout,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Pre-train K points together: one `jax.vmap`-ed step (`make_vmapped_train_step`) per
    update, over their stacked states, specs and step keys, to `train.steps`.

    configs: K configs that agree under `vmap_group_key`; workdirs: one per point, each laid
    out as `train`'s (checkpoints/, metrics.jsonl), so a point can be fine-tuned from
    (`evaluation.finetune(init_from=...)`) or continued like a run of its own. Point k's
    initial parameters, data and step keys are those of `train(configs[k], ...)`, so its
    results equal that run's to float tolerance. The speed fields of the records (tokens/s,
    MFU, step_s) are the whole step's, all K points together.

    Resume: the points resume from their checkpoints when all hold the same newest step;
    otherwise (a crash between the points' saves, or runs started apart) they all restart
    from step 0 and their checkpoints are deleted. Returns one `train`-style summary per point.
    """
    configs, workdirs = list(configs), [Path(workdir) for workdir in workdirs]
    if len(workdirs) != len(configs):
        raise ConfigError(f"got {len(configs)} configs but {len(workdirs)} workdirs; give "
                          "one workdir per config")
    require_one_group(configs)
    config, count = configs[0], len(configs)
    mesh = partitioning.make_mesh(config.mesh)
    validate_config(config, mesh)
    specs = stack_specs([objectives.spec_from_config(c.objective) for c in configs])
    rngs = jnp.stack([step_key(c.train.seed) for c in configs])
    from t5x_lite.data.pipeline import pretrain_data_from_config  # see `train`

    sources = [pretrain_data_from_config(c, layout.raw_length, jax.process_index(),
                                         jax.process_count())[1] for c in configs]
    data = types.SimpleNamespace(batch=lambda step: np.stack([d.batch(step) for d in sources]))
    restart = not _newest_steps_agree(configs, workdirs)
    if restart:
        warnings.warn(f"the checkpoints of {', '.join(map(str, workdirs))} are at different "
                      "steps; pre-training all of them again from step 0")
    with contextlib.ExitStack() as stack:
        checkpointers = [
            stack.enter_context(Checkpointer(
                workdir / "checkpoints", every=c.checkpoint.every, keep=c.checkpoint.keep,
                config=c, restart=restart))
            for c, workdir in zip(configs, workdirs)]
        train_step = make_vmapped_train_step(configs, layout, mesh)
        one = Throughput.of(config, layout, mesh)
        speed = dataclasses.replace(one, tokens_per_step=count * one.tokens_per_step,
                                    flops_per_step=count * one.flops_per_step)
        if checkpointers[0].latest_step() is None:
            states = [init_state(c, mesh) for c in configs]
        else:
            states = [checkpointer.restore(abstract_state(c, mesh))
                      for c, checkpointer in zip(configs, checkpointers)]
        start = int(states[0].step)
        if any(int(state.step) != start for state in states):  # a damaged newest checkpoint
            raise RuntimeError(
                f"the points restored different steps {[int(s.step) for s in states]}; run "
                "again to pre-train them all from step 0")
        state = stack_states(states, config, mesh)
        writers = _PointWriters([MetricsWriter(workdir, start) for workdir in workdirs])
        stack.callback(writers.close)
        bar = Progress(start, config.train.steps, config.train.log_every, progress)
        stack.callback(bar.close)
        records = run_loop(state, start, config.train.steps, data, train_step, (specs, rngs),
                           _PointCheckpointers(checkpointers, config.checkpoint.every),
                           writers, bar, speed)
    return [summarize([point_record(r, index) for r in records], workdir, start)
            for index, workdir in enumerate(workdirs)]


def run_loop(state: TrainState, step: int, total: int, data: Any,
             train_step: TrainStep | FinetuneStep, step_args: tuple, checkpointer: Checkpointer,
             writer: MetricsWriter, bar: Progress, speed: Throughput,
             on_step: Callable[[int, TrainState], None] | None = None) -> list[dict[str, Any]]:
    """Steps `step` -> `total`: `train_step(state, data.batch(step), *step_args)`, record,
    `on_step(step, state)` (e.g. validation), checkpoint; stops early on preemption.

    A record holds the step's metrics as floats, or as lists of K floats for a vmapped step
    (`point_record` picks one point's); a non-finite loss of any point stops the loop."""
    records = []
    compiles_before = train_step.compiles
    batch = data.batch(step) if step < total else None
    last = time.perf_counter()
    while step < total:
        compile_before = train_step.program.compile_seconds
        state, metrics = train_step(state, batch, *step_args)
        step += 1
        batch = data.batch(step) if step < total else None  # overlaps with the device step
        metrics = {name: np.asarray(value).tolist()  # a float, or K of them
                   for name, value in jax.device_get(metrics).items()}
        now = time.perf_counter()
        compile_s = train_step.program.compile_seconds - compile_before
        step_s, last = now - last - compile_s, now
        record = {"step": step, **metrics, **speed(step_s), "compile_s": compile_s,
                  "compiles": train_step.compiles - compiles_before}
        writer.write(record)
        bar.update(record)
        records.append(record)
        if not np.all(np.isfinite(record["loss"])):
            raise FloatingPointError(
                f"loss is {record['loss']} at step {step}; stopping without saving this state "
                f"(last checkpoint: step {checkpointer.latest_step()})"
            )
        if on_step is not None:
            on_step(step, state)
            last = time.perf_counter()  # validation time is not step time
        if checkpointer.reached_preemption(step):
            checkpointer.maybe_save(step, state, force=True)
            return records
        checkpointer.maybe_save(step, state)
    checkpointer.maybe_save(step, state, force=True)
    return records


def summarize(records: list[dict[str, Any]], workdir: Path, start: int) -> dict[str, Any]:
    """Final step and loss, medians of the speed metrics over steps that did not compile, and
    the pre-training examples left out of the loss because they did not fit the layout."""
    steady = [r for r in records if r["compile_s"] == 0.0] or records

    def median(name: str) -> float | None:
        values = [r[name] for r in steady if r[name] is not None]
        return float(np.median(values)) if values else None

    last = records[-1] if records else {}
    return {
        "workdir": str(workdir), "start_step": start, "step": last.get("step", start),
        "loss": last.get("loss"), "accuracy": last.get("accuracy"),
        "tokens_per_s": median("tokens_per_s"), "step_s": median("step_s"), "mfu": median("mfu"),
        "compiles": last.get("compiles", 0), "compile_s": sum(r["compile_s"] for r in records),
        "objective_overflow": sum(r.get("objective_overflow", 0) for r in records),
    }
