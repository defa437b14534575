"""Sweeps: run every grid point of an experiment (its grid: `t5x_lite.grid`): pre-train ->
[zero-shot] -> fine-tune (each task alone, or GLUE's as one: `grid.finetune_runs`) ->
evaluate, and append one record per (grid point, seed, task) to `workdir/results.jsonl`.

    records = run_sweep("table2", "tiny", "runs/table2", overrides=["train.steps=100"])

Zero-shot: with `sweep.zero_shot=True` the pre-trained model of each point is also scored,
before fine-tuning, on every task of `sweep.tasks` with label options (`t5x_lite.zero_shot`:
the best-ranked option's task metrics); each record of the point gets `zero_shot`:
{"status": "ok" | "not_applicable" (a task without label options) | "failed", "metrics",
"error"} beside its fine-tuned `metrics`. A workdir swept without it can be given it later:
re-run the sweep with `sweep.zero_shot=True`, and every finished point whose pre-training
finished is scored from its checkpoint (nothing is trained again) and its records are appended
again with `zero_shot` (the last record of a key counts, `results.latest_records`); from then
on the workdir is a zero-shot sweep, which is not resumed without the stage.

Held-out loss: with `train.eval_every` > 0 each point's records carry its pre-training
held-out loss (`t5x_lite.held_out`). It observes and changes nothing a point computes, so
switching it on keeps the workdir's sweep; a re-run with it scores every finished point that
lacks it from its final checkpoint (nothing is trained again) and appends its records again
with it.

Points sharing a layout (`t5x_lite.grid`) share one compiled pre-training step; with
`run_sweep(..., vmap=K)` up to K of them (differing only in objective and seed) pre-train
together in one `jax.vmap`-ed step (`vmap_chunks`, `run_chunk`).

The workdir:
  sweep.json                                  experiment, preset and overrides it belongs to
                                              (`t5x_lite.sweep_workdir`)
  results.jsonl                               the records (`t5x_lite.results`); the sweep
                                              process is the one writer (process 0 of a
                                              multi-process run)
  points/<point>/seed<k>/pretrain/            train.train's workdir (checkpoints, metrics.jsonl)
  points/<point>/seed<k>/zero_shot.json       the zero-shot stage's {task: entry}, reused on
                                              resume (only missing tasks are scored)
  points/<point>/seed<k>/finetune/<task>/     finetune.finetune's workdir (`<task1>+<task2>...`
                                              for GLUE's tasks fine-tuned as one)
  points/<point>/seed<k>/records/<task>.json  a finished task's record, reused on resume
Re-running skips points whose records are all in results.jsonl (failed ones included: delete
their lines to retry them) and resumes the others from their checkpoints. A point preempted
(SIGTERM / SIGINT) is not failed: it saves, records nothing, and the sweep stops with
`preemption.Preempted`'s exit status, so that a scheduler re-runs it to resume.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import itertools
import json
import operator
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, NoReturn, Sequence

import jax
from jax.experimental import multihost_utils

from t5x_lite import (accounting, attention, batch_format, held_out, launchers,
                      objective_registry, objectives, partitioning, presets)
from t5x_lite.checkpointing import CHECKPOINTS_DIR, newest_step
from t5x_lite.config import ConfigError, apply_overrides, parse_overrides
from t5x_lite.errors import MachineFault, is_machine_fault
from t5x_lite.grid import (SWEEP_SPLITS, GridPoint, StepCost, config_hash, expand,
                           load_experiment)
from t5x_lite.loop import METRICS_FILE, PreemptionWatch
from t5x_lite.preemption import Preempted
from t5x_lite.results import ResultsFile, latest_records, record_key, run_key, write_json
from t5x_lite.sweep_workdir import (check_workdir, claim_workdir, point_lock, require_current,
                                    require_current_folders, require_one_view_of_the_workdir,
                                    save_failures_as_recorded, sweep_identity)


# Record fields that measure time or depend on how often a run was interrupted, not on what it
# computed (a resumed point compiles once per process).
TIMING_FIELDS = ("wall_s", "compile_s", "compiles", "train_step_compiles", "finetune_compile_s",
                 "finetune_compiles")


# ---------------------------------------------------------------------------------------------
# One grid point


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _stop(preempted: Preempted) -> NoReturn:
    """Say why the sweep stops (the message says how to resume), then stop it."""
    _log(str(preempted))
    raise preempted


def _pretrain_history(metrics_path: Path, log_every: int) -> dict[str, Any]:
    """Loss curve, final loss, step time, compiles and the examples that overflowed the layout
    (`objectives.corrupt_with_details`) from train.train's metrics.jsonl, which holds exactly
    one record per step of the trajectory (resumed segments included); `compiles`: the steps
    that compiled the pre-training program (the program cache's misses)."""
    steps = [json.loads(line) for line in metrics_path.read_text().splitlines() if line]
    return {
        "pretrain_loss": steps[-1]["loss"],
        "pretrain_curve": [[r["step"], r["loss"]] for r in steps
                           if r["step"] % log_every == 0 or r is steps[-1]],
        # step_s excludes the compile; a step that compiled has compile_s > 0.
        "pretrain_wall_s": sum(r["step_s"] + r["compile_s"] for r in steps),
        "compile_s": sum(r["compile_s"] for r in steps),
        "compiles": sum(r["compile_s"] > 0 for r in steps),
        "pretrain_overflow": sum(r.get("objective_overflow", 0) for r in steps),
    }


def base_record(point: GridPoint) -> dict[str, Any]:
    """The fields every record of `point` shares, known before anything runs."""
    config = point.config
    _, inputs, targets = objectives.objective_lengths(config.objective)
    # The lm objective has no inputs, but an encoder still reads one EOS (as `layout_for` pads).
    inputs = max(inputs, batch_format.min_inputs_length(point.layout.family))
    columns = accounting.table2_columns(config.model, inputs, targets)
    return {
        "experiment": point.experiment, "preset": point.preset, "point": point.point,
        "grid_index": point.index,  # its place in the grid: the report's row order
        "row": point.row, "objective": point.objective, "config_hash": config_hash(config),
        "seed": point.seed, "params": columns.params, "params_label": columns.params_label,
        "cost_label": columns.cost_label, "params_ratio": columns.params_ratio,
        "flops_ratio": columns.flops_ratio, "corpus": config.data.corpus,
        "pretrain_steps": config.train.steps,
        "sweep_seeds": list(config.sweep.seeds),  # asked for: the report marks seeds not run
        "pretrain_tokens": point.pretrain_tokens,
        objective_registry.REVISION_FIELD: point.objective_revision,
        "finetune_steps": config.finetune.steps, "pretrain_loss": None, "pretrain_curve": [],
        **held_out.scores_of(()),  # the held-out fields, none yet
        **_budget_fields(point),
    }


def _budget_fields(point: GridPoint) -> dict[str, Any]:
    """A compute-matched point's budget and its `StepCost` (none under sweep.budget="steps",
    whose records stay as they were): pretrain_flops = pretrain_steps x flops_per_step."""
    if point.budget is None:
        return {}
    cost = StepCost.of(point.config, point.layout)
    return {
        "budget": point.budget.kind, "budget_reference": point.budget.reference,
        "budget_reference_steps": point.budget.reference_steps,
        "budget_total": point.budget.total, "flops_per_step": cost.flops,
        "tokens_per_step": cost.tokens, "loss_tokens_per_step": cost.loss_tokens,
        "pretrain_flops": point.config.train.steps * cost.flops,
    }


def _failure(stage: str, error: Exception) -> str:
    """Log the traceback of `error`, which failed `stage` ('encoder_decoder/denoising (seed 0)
    glue_cola'), and return the error as a record gives it. A machine fault (a full disk) is
    no result of the point's: it stops the sweep (`MachineFault`) and is not recorded, so the
    re-run retries the point."""
    if is_machine_fault(error):
        first_line = str(error).splitlines()[0] if str(error) else ""
        raise MachineFault(
            f"{stage} stopped: {type(error).__name__}: {first_line}; the machine's fault, not "
            "the point's, so it is not recorded and the sweep stops (finished points are); "
            "fix it and re-run the same command") from error
    _log(f"  {stage}: FAILED: " + "".join(traceback.format_exception(error)))
    return f"{type(error).__name__}: {error}"


def _unscored_record(base: dict[str, Any], task: str, error_text: str,
                     status: str = "failed") -> dict[str, Any]:
    """`task`'s record without scores: of a point whose stage failed with `error_text`
    (`_failure`'s), or of a task the architecture cannot be scored on (status
    "not_applicable", `error_text` its reason)."""
    return {"wall_s": None, "compile_s": None, "compiles": None, **base, "task": task,
            "metrics": {}, "status": status, "error": error_text}


def _pretraining_failed(point: GridPoint, error: Exception) -> list[dict]:
    error_text = _failure(f"{point.point} (seed {point.seed})", error)
    return [_unscored_record(base_record(point), task, error_text)
            for task in point.config.sweep.tasks]


def _resume_note(point: GridPoint, workdir: str) -> str:
    """", resuming at step N" where the point's pre-training holds a checkpoint, else "": its
    first log line says so (without a progress bar nothing else did)."""
    saved = newest_step(point.pretrain_directory(workdir) / CHECKPOINTS_DIR)
    return "" if saved is None else f", resuming at step {saved}"


def run_point(point: GridPoint, workdir: str) -> list[dict]:
    """Pre-train the point, fine-tune and evaluate on each task; one record per task.

    Never raises for a failing or diverging run: its records get status 'failed' and the
    error. A preempted run raises `preemption.Preempted` (a `SystemExit`, which the failure
    handling lets through) and records nothing. Resumes from the checkpoints under
    `point.directory(workdir)`; a task whose record was already written there
    (`point.record_path`) is not run again.
    """
    from t5x_lite import train

    config, started = point.config, time.perf_counter()
    _log(f"{point.experiment} {point.run_name}: pre-training {config.train.steps} steps "
         f"({config.model.arch}, {config.objective.name}) on {config.data.corpus}"
         f"{_resume_note(point, workdir)}")
    # One process at a point; a signal between its runs stops it at the next stage.
    with point_lock([point], workdir), PreemptionWatch() as watch:
        try:
            load_experiment(point.source)  # in a worker process: what the file registers
            summary = train.train(config, point.pretrain_directory(workdir),
                                  progress=config.sweep.progress, layout=point.layout)
        except Exception as error:  # recorded as failed; the sweep goes on
            return _pretraining_failed(point, error)
        return _finetune_tasks(point, workdir, started, summary["step_compiles"], watch)


def run_chunk(points: Sequence[GridPoint], workdir: str) -> list[dict]:
    """Pre-train `points` together in one vmapped step (`train.train_vmapped`; they come
    from `vmap_chunks`), then fine-tune and evaluate each as `run_point` does.

    Each point keeps its own pretrain/ folder, so its records, checkpoints and fine-tuning
    are those of a run of its own. A failure in the shared pre-training (e.g. one point
    diverging) fails every point of the chunk. A chunk of one point is `run_point`.
    """
    from t5x_lite import train

    if len(points) == 1:
        return run_point(points[0], workdir)
    config, started = points[0].config, time.perf_counter()
    # The points of a chunk hold one newest step (`vmap_chunks`).
    _log(f"{points[0].experiment}: pre-training {len(points)} points together "
         f"({config.train.steps} steps, one vmapped step{_resume_note(points[0], workdir)}): "
         + "; ".join(f"{p.run_name} {p.config.objective.name}" for p in points))
    # One process at a point; a signal between its runs stops it at the next stage.
    with point_lock(points, workdir), PreemptionWatch() as watch:
        try:
            load_experiment(points[0].source)  # in a worker process: what the file registers
            summaries = train.train_vmapped([p.config for p in points],
                                            [p.pretrain_directory(workdir) for p in points],
                                            layout=points[0].layout,
                                            progress=config.sweep.progress)
        except Exception as error:  # recorded as failed for every point; the sweep goes on
            return [record for p in points for record in _pretraining_failed(p, error)]
        return [record for p, summary in zip(points, summaries)
                for record in _finetune_tasks(p, workdir, started, summary["step_compiles"],
                                              watch)]


ZERO_SHOT_FILE = "zero_shot.json"


def _zero_shot_stage(point: GridPoint, workdir: str, task_names: Sequence[str]
                     ) -> dict[str, dict]:
    """The zero-shot entries {task: {"status", "metrics", "error"}} of the point's pre-trained
    checkpoint on `task_names` (`zero_shot.evaluate`; a task without label options is
    "not_applicable"). Entries saved in the point's directory (`ZERO_SHOT_FILE`) are reused, so
    a resumed point scores only the tasks it has not scored; a failure fails the entries of the
    tasks it was scoring (not saved: a re-run tries again) and the fine-tuning goes on."""
    from t5x_lite import zero_shot
    from t5x_lite.data import tasks

    path = point.directory(workdir) / ZERO_SHOT_FILE
    entries = json.loads(path.read_text()) if path.exists() else {}
    missing = [task for task in task_names if task not in entries]
    scored = []
    for task in missing:
        reason = zero_shot.not_applicable(tasks.TASKS[task])
        if reason:
            entries[task] = {"status": "not_applicable", "metrics": {}, "error": reason}
        else:
            scored.append(task)
    if scored:
        _log(f"{point.experiment} {point.run_name}: zero-shot scoring of the pre-trained model "
             f"on {', '.join(scored)}")
        try:
            results = zero_shot.evaluate(point.config, str(point.pretrain_directory(workdir)),
                                         scored)
        except Exception as error:  # recorded as failed; fine-tuning still runs
            failed = {"status": "failed", "metrics": {},
                      "error": _failure(f"{point.point} (seed {point.seed}) zero-shot", error)}
            return {**entries, **dict.fromkeys(scored, failed)}
        entries.update({task: {"status": "ok", "metrics": results[task], "error": None}
                        for task in scored})
    if missing:
        write_json(path, entries)
    return entries


def _stop_if_signalled(watch: PreemptionWatch, point: GridPoint, workdir: str) -> None:
    """Stop the sweep (`_stop`: the line saying why, then `Preempted`) if SIGTERM / SIGINT came
    since the point started, outside a run's loop (which stops on its own) or as a run ended:
    before the point's next stage."""
    if watch.signal is not None:
        _stop(Preempted(point.config.train.steps, [str(point.directory(workdir))], watch.cause))


def _finetune_tasks(point: GridPoint, workdir: str, started: float,
                    train_step_compiles: int, watch: PreemptionWatch) -> list[dict]:
    """After the point's pre-training: the zero-shot stage (`sweep.zero_shot`) on the tasks
    not recorded yet, then fine-tune and evaluate in each of `grid.finetune_runs` (each task
    alone, or GLUE's as one task), one record per task, naming its run's tasks
    (`finetune_tasks`); a task's saved record is reused, the tasks of a failing run are
    recorded as failed. A signal `watch` received stops it (`Preempted`) before each stage.

    train_step_compiles: the pre-training step's XLA compilations in this process, as JAX's
    compile events count them (`train.train`'s `step_compiles`), recorded as such: 1 for a
    point whose pre-training compiled its program, whatever its batches mix (a UL2 run's
    denoisers included), 0 for one that reused a program compiled before (or found its
    pre-training finished, resumed)."""
    from t5x_lite import evaluation, finetune
    from t5x_lite.data import tasks

    config, pretrain = point.config, point.pretrain_directory(workdir)
    base = base_record(point)
    if jax.process_count() > 1:  # process 0 has closed the metrics.jsonl read below
        multihost_utils.sync_global_devices("t5x_lite_pretrained")
    try:
        history = {**_pretrain_history(pretrain / METRICS_FILE, config.train.log_every),
                   **held_out.last_scores(pretrain)}
    except Exception as error:  # recorded as failed; the sweep goes on
        return _pretraining_failed(point, error)
    pretrain_wall_s = history.pop("pretrain_wall_s")
    pending = [task for task in config.sweep.tasks
               if not point.record_path(workdir, task).exists()]
    _stop_if_signalled(watch, point, workdir)
    zero_shot = (_zero_shot_stage(point, workdir, pending)  # {task: entry}
                 if config.sweep.zero_shot else {})
    records = {task: json.loads(point.record_path(workdir, task).read_text())
               for task in config.sweep.tasks if task not in pending}
    stages = {task: {**base, **history, "train_step_compiles": train_step_compiles,
                     **({"zero_shot": zero_shot[task]} if zero_shot else {})}
              for task in pending}
    for task in pending:
        reason = evaluation.not_applicable(config.model.arch, tasks.TASKS[task])
        if reason:  # e.g. a generation task for encoder_only: recorded, not run, not failed
            records[task] = _unscored_record(stages.pop(task), task, reason, "not_applicable")
            write_json(point.record_path(workdir, task), records[task])
    # A run trains on all its tasks, recorded ones too, so that a resumed run's mixture is the
    # one it began with (`sweep_workdir.require_current` refuses records of another mixture).
    for run_tasks in point.finetune_runs():
        run_stages = {task: stages[task] for task in run_tasks if task in stages}
        if not run_stages:  # every task of the run recorded
            continue
        _stop_if_signalled(watch, point, workdir)
        _log(f"{point.experiment} {point.run_name}: fine-tuning on {' + '.join(run_tasks)}"
             + (" as one task (the paper's GLUE)" if len(run_tasks) > 1 else "")
             + f" ({config.finetune.steps} steps; {time.perf_counter() - started:.0f} s so far)")
        run_config = copy.deepcopy(config)
        run_config.finetune.tasks = run_tasks
        try:
            result = finetune.finetune(run_config,
                                       str(point.finetune_directory(workdir, run_tasks)),
                                       init_from=str(pretrain),
                                       progress=config.sweep.progress)
        except Exception as error:  # recorded as failed; the other runs still run
            error_text = _failure(f"{point.point} (seed {point.seed}) {' + '.join(run_tasks)}",
                                  error)
            records.update({task: _unscored_record(task_stages, task, error_text)
                            for task, task_stages in run_stages.items()})
            continue
        for task, task_stages in run_stages.items():
            records[task] = {
                **task_stages, "task": task, "finetune_tasks": list(run_tasks),
                "wall_s": pretrain_wall_s + result["wall_s"],
                "finetune_compile_s": result["compile_s"],
                "finetune_compiles": result["compiles"],
                "metrics": result["scores"][task], "status": "ok", "error": None,
            }
            write_json(point.record_path(workdir, task), records[task])
    return [records[task] for task in config.sweep.tasks]


def _lacks_zero_shot(record: dict) -> bool:
    """A record of a point whose pre-training finished (so it has a checkpoint to score) made
    without the zero-shot stage, or whose zero-shot scoring failed (a failure is not saved in
    the point's zero_shot.json, so a re-run of the sweep scores it again)."""
    return (record.get("zero_shot", {}).get("status", "failed") == "failed"
            and record.get("pretrain_loss") is not None)


def _zero_shot_fields(point: GridPoint, workdir: str, records: Sequence[dict]
                      ) -> dict[str, dict[str, Any]]:
    """{task: {"zero_shot": entry}} for `records` of a finished `point` (`_zero_shot_stage`
    on its pre-trained checkpoint; entries saved before are reused)."""
    entries = _zero_shot_stage(point, workdir, [r["task"] for r in records])
    return {task: {"zero_shot": entry} for task, entry in entries.items()}


def _lacks_held_out(record: dict) -> bool:
    """A record of a point whose pre-training finished made without its held-out loss."""
    return record.get("held_out_loss") is None and record.get("pretrain_loss") is not None


def _held_out_fields(point: GridPoint, workdir: str, records: Sequence[dict]
                     ) -> dict[str, dict[str, Any]]:
    """{task: the held-out fields} for `records` of a finished `point`: `train.train` on its
    finished pre-training runs no step and evaluates the final model on the held-out text
    (`held_out.validation`), then `held_out.last_scores` reads it back."""
    from t5x_lite import train

    pretrain = point.pretrain_directory(workdir)
    train.train(point.config, pretrain, progress=False, layout=point.layout)
    scores = held_out.last_scores(pretrain)
    return {record["task"]: scores for record in records}


@dataclasses.dataclass(frozen=True)
class LaterStage:
    """A stage that a sweep gives finished points' records after its runs, from their
    pre-trained checkpoints (`_add_to_finished`): `what` it adds, whether the config switches
    it `on`, which records `lacks` it, `fields_of(point, workdir, records)` -> {task: the
    fields it adds}, and a few words of them for the log (`shown`)."""

    what: str
    on: Callable[[Any], bool]
    lacks: Callable[[dict], bool]
    fields_of: Callable[[GridPoint, str, Sequence[dict]], dict[str, dict[str, Any]]]
    shown: Callable[[dict[str, Any]], str]


# In the order they run: a later one amends the records the one before amended.
LATER_STAGES = (
    LaterStage("zero-shot scores", lambda config: bool(config.sweep.zero_shot), _lacks_zero_shot,
               _zero_shot_fields, lambda fields: fields["zero_shot"]["status"]),
    LaterStage("held-out loss", lambda config: bool(config.train.eval_every), _lacks_held_out,
               _held_out_fields, lambda fields: f"{fields['held_out_loss']:.4f}"),
)


def _add_to_finished(points: Sequence[GridPoint], latest: dict[tuple, dict], workdir: Path,
                     results: ResultsFile, stage: LaterStage, watch: PreemptionWatch) -> None:
    """Give the points whose records were made without `stage.what` (a workdir swept without
    it, or a point's tasks recorded before it was switched on) its fields, from the pre-trained
    checkpoint. Each amended record is appended to results.jsonl (the last record of a key
    counts), rewrites the point's saved record and replaces its entry in `latest`, so that a
    stage after this one amends it and keeps these fields; nothing is trained or fine-tuned.
    A signal `watch` received stops it (`Preempted`) before the next point (it used to go on
    to the last point and exit 0, or die with 143)."""
    for point in points:
        keys = [key for key, record in latest.items()
                if key[:2] == (point.point, point.seed) and stage.lacks(record)]
        if not keys:
            continue
        if watch.signal is not None:
            _stop(Preempted(None, [str(workdir)], watch.cause))
        fields = stage.fields_of(point, str(workdir), [latest[key] for key in keys])
        for key in keys:
            record = latest[key] = {**latest[key], **fields[key[2]]}
            saved = point.record_path(workdir, record["task"])
            if saved.exists():
                write_json(saved, record)
            results.append(record)
        _log(f"{stage.what} added to {point.point} (seed {point.seed}): "
             + ", ".join(f"{task} {stage.shown(value)}" for task, value in fields.items()))


# ---------------------------------------------------------------------------------------------
# The sweep


def budget_line(points: Sequence[GridPoint]) -> str | None:
    """Under a compute-matched budget, one line with the steps derived for each point."""
    budget = points[0].budget
    if budget is None:
        return None
    steps = {p.point: p.config.train.steps for p in points}
    return (f"sweep.budget={budget.kind}: every point spends what {budget.reference} spends in "
            f"{budget.reference_steps} steps ({budget.total:.4g}); pre-training steps: "
            + ", ".join(f"{point} {count}" for point, count in steps.items()))


def vmap_chunks(points: Sequence[GridPoint], size: int,
                workdir: str | Path | None = None) -> list[tuple[GridPoint, ...]]:
    """`points` in chunks of at most `size` that can pre-train in one vmapped step: points
    with the same layout and `train_step.vmap_group_key` (they differ only in objective, seed and
    language_model vs prefix_lm), in grid order within each group. With the sweep's `workdir`,
    only points whose pre-training there stands at the same newest checkpoint (or has none)
    share a chunk: a chunk of points at different steps pre-trains them all again from step 0
    (`run_setup.set_up`), which threw away a finished pre-training when a re-run with another
    `--vmap`, or more seeds, grouped it with fresh points."""
    from t5x_lite import train_step

    groups: dict[tuple, list[GridPoint]] = {}
    for point in points:
        resumed_at = None if workdir is None else newest_step(
            point.pretrain_directory(workdir) / CHECKPOINTS_DIR)
        key = (point.layout, train_step.vmap_group_key(point.config), resumed_at)
        groups.setdefault(key, []).append(point)
    return [tuple(group[start:start + size])
            for group in groups.values() for start in range(0, len(group), size)]


def _steps_of(point: GridPoint) -> int:
    """The optimiser steps a run takes: its pre-training and each of its fine-tuning runs."""
    return point.config.train.steps + point.config.finetune.steps * len(point.finetune_runs())


def _clock(seconds: float) -> str:
    """'1h 02m', '3m 05s', '42s'."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def progress_line(finished_steps: Sequence[int], left_steps: Sequence[int],
                  elapsed: float, earlier: int = 0) -> str:
    """The sweep's progress after a run finishes, from the steps (`_steps_of`) of the runs
    finished in this invocation and of those left, and the runs `earlier` invocations finished:
    runs done (and of them earlier) and left, this invocation's time so far and the time left,
    estimated as the steps left at the rate measured so far (steps differ between the points
    of a compute-matched sweep; a parallel launcher's rate includes its parallelism)."""
    done, left = len(finished_steps) + earlier, len(left_steps)
    before = f" ({earlier} before this run)" if earlier else ""
    text = (f"sweep: {done} of {done + left} runs done{before}, {left} left; "
            f"{_clock(elapsed)} elapsed")
    if left and sum(finished_steps):
        text += f", about {_clock(elapsed / sum(finished_steps) * sum(left_steps))} left"
    return text


def unrecorded_tasks(point: GridPoint, recorded: set[tuple[str, int, str]]) -> list[str]:
    """The tasks of `point` without a record among `recorded` ({(point, seed, task)}); a point
    with none left is finished, failed records included (delete their lines to retry them)."""
    return [task for task in point.config.sweep.tasks
            if (point.point, point.seed, task) not in recorded]


def require_vmap(vmap: int, launcher: launchers.Launcher | None = None) -> None:
    """Refuse a `vmap` that is not a count of points, or one the launcher cannot honour."""
    if isinstance(vmap, bool) or not isinstance(vmap, int) or vmap < 1:
        raise ConfigError(f"vmap={vmap!r} must be an integer >= 1 (the most points pre-trained "
                          "together in one vmapped step; 1 runs them one by one)")
    if vmap > 1 and isinstance(launcher, launchers.RayLauncher):
        raise ConfigError(f"vmap={vmap} needs the local or parallel launcher; the ray "
                          "launcher sizes its tasks per point")


def require_launcher_for_processes(launcher: launchers.Launcher | None) -> None:
    """Refuse a launcher of its own processes in a sweep of several processes (a TPU pod's
    hosts, a SLURM task's srun processes: one jax.distributed run, each point in all of them),
    whose workers would each run the points alone and write the same workdir."""
    if jax.process_count() > 1 and not isinstance(launcher, (launchers.LocalLauncher,
                                                             type(None))):
        raise ConfigError(f"this sweep runs in {jax.process_count()} processes (one "
                          "jax.distributed run, each point in all of them); the "
                          f"{type(launcher).__name__} would start processes of its own: use "
                          "--launcher local")


def _require_local_inputs(points: Sequence[GridPoint],
                         launcher: launchers.Launcher) -> None:
    """What the points need of this machine: their attention kernel, the data of every task
    split the sweep reads (loaded once here, as fine-tuning would load it; a TFDS dataset not
    in data.data_dir is a one-line `FileNotFoundError` naming the task), and the mesh of the
    process that runs them, this one's (`partitioning.make_mesh`) or a parallel worker's
    (each of `LocalParallelLauncher.device_counts`), with whole examples of their pre-training
    and fine-tuning batches on every device (`partitioning.validate_batch_split`)."""
    from t5x_lite.data import tasks

    for attention_impl in {point.config.model.attention_impl for point in points}:
        attention.require_available(attention_impl)
    splits = {(tuple(c.mesh.shape), c.train.batch_size, c.train.microbatches,
               c.finetune.batch_size if c.sweep.tasks else None): c
              for c in (point.config for point in points)}
    for config in splits.values():
        batches = [(config.train.batch_size, "train.batch_size")]
        if config.sweep.tasks:
            batches.append((config.finetune.batch_size, "finetune.batch_size"))
        if isinstance(launcher, launchers.LocalParallelLauncher):
            for devices, (batch_size, field) in itertools.product(launcher.device_counts,
                                                                  batches):
                partitioning.validate_batch_split_on(config.mesh, devices, batch_size,
                                                     config.train.microbatches, field)
        else:
            mesh = partitioning.make_mesh(config.mesh)
            rules = partitioning.normalize_rules(config.mesh.rules)
            for batch_size, field in batches:
                partitioning.validate_batch_split(batch_size, config.train.microbatches, mesh,
                                                  rules, field)
    sources = {(point.config.data.data_dir or None, point.config.data.data_root or None,
                tuple(point.config.sweep.tasks)) for point in points}
    for data_dir, data_root, task_names in sources:
        for name in task_names:
            task = tasks.get_task(name, "sweep.tasks")
            for split in SWEEP_SPLITS:
                try:
                    task.load(task.splits[split], data_dir, data_root)
                except FileNotFoundError as error:
                    raise FileNotFoundError(f"sweep.tasks has {name!r}: {error}") from None


def _require_pretraining_data(points: Sequence[GridPoint]) -> None:
    """Each point's corpus and vocabulary load on this machine, and its pre-training stays
    short of its held-out text (`held_out.require_room`), checked before the sweep claims the
    workdir: a corpus without text, a vocabulary file SentencePiece cannot read, or more
    steps than the corpus holds apart from the held-out text (a compute-matched point given
    more steps) failed each point as it started, after the points before it had run, and the
    failed records kept those points from ever running again. The corpus's vocabulary and
    tokens are cached on disk; the first point reads them anyway."""
    from t5x_lite.data.pipeline import pretrain_data_from_config, segment_length

    sources: dict[str, Any] = {}
    for point in points:
        config = point.config
        key = json.dumps([config.data.to_dict(), config.model.vocab_size,
                          config.model.num_sentinels, point.layout.raw_length,
                          segment_length(config), config.train.batch_size,
                          config.train.eval_batches, config.train.eval_every > 0],
                         sort_keys=True)
        try:
            if key not in sources:
                sources[key] = pretrain_data_from_config(config, point.layout.raw_length)[1]
            if config.train.eval_every:
                held_out.require_room(config, point.layout, sources[key], config.train.steps)
        except ConfigError as error:
            raise ConfigError(f"{point.experiment} point {point.point!r}: {error}") from None


def select_point(points: Sequence[GridPoint], point_index: int | None) -> list[GridPoint]:
    """`points`, or with `point_index` (one job of a job array) only that one of them."""
    if point_index is None:
        return list(points)
    # An int or a numpy integer (`__index__`); not a bool, not '0'.
    index = (None if isinstance(point_index, bool) or not hasattr(point_index, "__index__")
             else operator.index(point_index))
    if index is None or not 0 <= index < len(points):
        raise ConfigError(f"point_index={point_index!r} must be in [0, {len(points)})")
    return [points[index]]


def run_sweep(experiment: str, preset: str, workdir: str, *,
              launcher: launchers.Launcher | None = None,
              overrides: Sequence[str] = (), point_index: int | None = None,
              vmap: int = 1) -> list[dict]:
    """Run every unfinished point of the sweep and return all of its records.

    `launcher` (default: `launchers.LocalLauncher`, in this process) maps `run_point` over the
    points; this process appends each point's records to results.jsonl as they come back.
    Overrides are '--config.field=value' strings (see `user_overrides`). `point_index`
    runs only that point of `expand`'s list (one job of a job array); appends of concurrent
    jobs are single O_APPEND writes of whole lines.

    vmap=K > 1: the unfinished points are grouped by `vmap_chunks` and the launcher maps
    `run_chunk` over the chunks: up to K points pre-train together in one vmapped step, then
    each is fine-tuned alone; records are as with vmap=1 (to float tolerance). Resuming a
    chunk: its points continue from their checkpoints when all hold the same newest step,
    else the chunk pre-trains again from step 0 (see `train.train_vmapped`). Ray sizes its
    tasks per point, so vmap needs the local or parallel launcher.
    """
    require_vmap(vmap, launcher)
    require_launcher_for_processes(launcher)
    # Watched from here: a signal during the start-up (loading every point's data may take
    # minutes on a first run) stops the sweep before its first run as preempted (status 75,
    # which the SLURM script requeues), not killed with 143.
    with PreemptionWatch() as starting:
        points = expand(experiment, preset, overrides)
        budget = budget_line(points)
        if budget:
            _log(budget)
        points = select_point(points, point_index)
        launcher = launcher if launcher is not None else launchers.LocalLauncher()
        if isinstance(launcher, (launchers.LocalLauncher, launchers.LocalParallelLauncher)):
            # The points run on this machine: what it lacks stops the sweep before it claims
            # the workdir, not each point with a failed record after its pre-training. (Ray's
            # workers may have what the driver lacks.)
            _require_local_inputs(points, launcher)
            _require_pretraining_data(points)
        workdir_path = Path(workdir)
        workdir_path.mkdir(parents=True, exist_ok=True)
        identity = sweep_identity(experiment, points, overrides)
        check_workdir(workdir_path, identity)
        results = ResultsFile(workdir_path)
        results.finish_last_line()
        finished_records = results.records()
        require_current(finished_records, points, results.path)
        done = {record_key(r) for r in finished_records}
        todo = [p for p in points if unrecorded_tasks(p, done)]
        require_current_folders(todo, workdir_path)
        require_one_view_of_the_workdir(todo, workdir_path)
        # Claimed once every check passed: a refused sweep leaves the workdir's sweep.json as
        # it was (one given the zero-shot stage would have become a zero-shot sweep's).
        claim_workdir(workdir_path, identity)
        # What each point's records hold, before anything runs: a fault in that arithmetic
        # stops the sweep here, not after hours of finished runs.
        for point in todo:
            base_record(point)
        # Every process's view of the records (process 0 may not have appended the last ones).
        latest = {record_key(r): r for r in finished_records}
        save_failures_as_recorded(todo, latest, workdir_path)
        _log(f"sweep {points[0].experiment} --preset {preset}: {len(points)} runs x "
             f"{len(points[0].config.sweep.tasks)} tasks; {len(points) - len(todo)} done, "
             f"{len(todo)} to run; records in {results.path}")
    if starting.signal is not None:
        _stop(Preempted(None, [str(workdir)], starting.cause))
    started, finished = time.perf_counter(), set()
    work = (launcher.map(run_chunk, vmap_chunks(todo, vmap, workdir_path), str(workdir_path))
            if vmap > 1
            else launcher.map(run_point, todo, str(workdir_path)))
    # The local launcher runs the points in this process, each under its own watch; this one
    # takes a signal that comes between them (as a point's records are appended), so that it
    # stops the sweep before the next point as preempted (exit status 75, which the SLURM
    # script requeues) instead of killing it with 143. (A parallel launcher's map forwards
    # signals to its workers itself; Ray's workers are its own.)
    local = isinstance(launcher, launchers.LocalLauncher)
    with PreemptionWatch() if local else contextlib.nullcontext() as between_points:
        for records in work:
            runs: dict[tuple, list[str]] = {}
            for record in records:
                if record_key(record) not in done:
                    results.append(record)
                    latest[record_key(record)] = record
                runs.setdefault(run_key(record), []).append(
                    f"{record['task']} {record['status']}")
            for (point, seed), statuses in runs.items():
                finished.add((point, seed))
                steps = {key: [_steps_of(p) for p in todo
                               if ((p.point, p.seed) in finished) == key] for key in (True, False)}
                _log(f"done {point} (seed {seed}): {', '.join(statuses)}")
                _log(progress_line(steps[True], steps[False], time.perf_counter() - started,
                                   earlier=len(points) - len(todo)))
            if local and between_points.signal is not None and len(finished) < len(todo):
                last = [p for p in todo if (p.point, p.seed) in runs]
                _stop(Preempted(last[-1].config.train.steps,
                                [str(p.directory(workdir_path)) for p in last],
                                between_points.cause))
    # The later stages run in this process whatever the launcher: a signal stops them between
    # points too.
    with PreemptionWatch() as later:
        for stage in LATER_STAGES:
            if stage.on(points[0].config):
                _add_to_finished(points, latest, workdir_path, results, stage, later)
    wanted = {(p.point, p.seed) for p in points}
    return [r for r in latest_records(results.records()) if run_key(r) in wanted]


def run_demo(workdir: str, overrides: Sequence[str] = ()) -> str:
    """`t5x-lite demo`: Table 2 under the `demo` preset (plus `overrides`, 'field=value'
    strings), then the comparison table (returned)."""
    from t5x_lite import report

    config = presets.sweep_preset("demo")
    apply_overrides(config, parse_overrides(config, overrides))
    # A bad override, or a workdir holding something else, stops it here, before the header
    # that says a re-run resumes from the workdir.
    check_workdir(Path(workdir), sweep_identity("table2", expand("table2", "demo", overrides),
                                                overrides))
    model = config.model
    _log(f"t5x-lite demo: the T5 paper's Table 2 (5 architectures x 2 objectives) with a small "
         f"model (d_model {model.d_model}, {model.num_layers} layers per stack, vocabulary "
         f"{model.vocab_size}), {config.train.steps} pre-training and {config.finetune.steps} "
         f"fine-tuning steps per task on the built-in tasks {', '.join(config.sweep.tasks)}. "
         "This is a smaller model and fewer steps than the `tiny` preset, so that it finishes "
         f"in minutes on a laptop CPU. Re-running resumes from {workdir}.")
    run_sweep("table2", "demo", workdir, overrides=overrides)
    return report.report(workdir).text
