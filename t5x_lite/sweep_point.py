"""One grid point of a sweep (`t5x_lite.sweep`): its run, pre-train -> [zero-shot] -> fine-tune
and evaluate each task, and its records, one per task (`base_record` holds what every record of
the point shares); the stages a finished point's records are given after the runs, from its
checkpoints (`LATER_STAGES`: zero-shot scores and the fine-tuned models' ranked scores of a
zero-shot sweep, the held-out loss).

`run_point(point, workdir)` runs one point in `workdir/points/<point>/seed<k>/` and returns its
records; `run_chunk` pre-trains up to K points in one vmapped step, then fine-tunes each as
`run_point` does. Both are what a launcher maps over the points (`t5x_lite.launchers`): a
point's failure is its records' `status: "failed"`, a machine's fault (`errors.MachineFault`)
and a preemption stop the sweep instead. The sweep appends what they return to results.jsonl.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, NoReturn, Sequence

import jax
from jax.experimental import multihost_utils

from t5x_lite import (accounting, architectures, batch_format, held_out, objective_registry,
                      objectives)
from t5x_lite.checkpointing import newest_step
from t5x_lite.errors import MachineFault, is_machine_fault
from t5x_lite.grid import GridPoint, StepCost, config_hash, load_experiment
from t5x_lite.loop import METRICS_FILE, PreemptionWatch
from t5x_lite.preemption import Preempted
from t5x_lite.results import ResultsFile, write_json
from t5x_lite.saved_config import CHECKPOINTS_DIR
from t5x_lite.sweep_workdir import point_lock


# Record fields that measure time or depend on how often a run was interrupted, not on what it
# computed (a resumed point compiles once per process).
TIMING_FIELDS = ("wall_s", "compile_s", "compiles", "train_step_compiles", "finetune_compile_s",
                 "finetune_compiles")


# ---------------------------------------------------------------------------------------------
# One grid point


def log(message: str) -> None:
    """One line of the sweep's progress on stderr."""
    print(message, file=sys.stderr, flush=True)


def stop(preempted: Preempted) -> NoReturn:
    """Say why the sweep stops (the message says how to resume), then stop it."""
    log(str(preempted))
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
        "grid_rows": point.num_rows,  # the report says when rows have no record yet
        "row": point.row, "objective": point.objective, "config_hash": config_hash(config),
        "seed": point.seed, "params": columns.params, "params_label": columns.params_label,
        "cost_label": columns.cost_label, "params_ratio": columns.params_ratio,
        "flops_ratio": columns.flops_ratio, "corpus": config.data.corpus,
        "pretrain_steps": config.train.steps,
        "sweep_seeds": list(config.sweep.seeds),  # asked for: the report marks seeds not run
        "pretrain_tokens": point.pretrain_tokens,
        objective_registry.REVISION_FIELD: point.objective_revision,
        architectures.DEFINITION_FIELD: architectures.get(config.model.arch).definition,
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
    log(f"  {stage}: FAILED: " + "".join(traceback.format_exception(error)))
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
    log(f"{point.experiment} {point.run_name}: pre-training {config.train.steps} steps "
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
    log(f"{points[0].experiment}: pre-training {len(points)} points together "
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
    """The zero-shot entries {task: {"status", "metrics", "error", ...}} of the point's
    pre-trained checkpoint on `task_names` (`zero_shot.rank`; a task without label options is
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
        log(f"{point.experiment} {point.run_name}: zero-shot scoring of the pre-trained model "
             f"on {', '.join(scored)}")
        try:
            results = zero_shot.rank(point.config, str(point.pretrain_directory(workdir)),
                                     scored)
        except Exception as error:  # recorded as failed; fine-tuning still runs
            failed = {"status": "failed", "metrics": {},
                      "error": _failure(f"{point.point} (seed {point.seed}) zero-shot", error)}
            return {**entries, **dict.fromkeys(scored, failed)}
        entries.update({task: {"status": "ok", **results[task].entry(), "error": None}
                        for task in scored})
    if missing:
        write_json(path, entries)
    return entries


def _stop_if_signalled(watch: PreemptionWatch, point: GridPoint, workdir: str) -> None:
    """Stop the sweep (`stop`: the line saying why, then `Preempted`) if SIGTERM / SIGINT came
    since the point started, outside a run's loop (which stops on its own) or as a run ended:
    before the point's next stage."""
    if watch.signal is not None:
        stop(Preempted(point.config.train.steps, [str(point.directory(workdir))], watch.cause))


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
        log(f"{point.experiment} {point.run_name}: fine-tuning on {' + '.join(run_tasks)}"
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


def _lacks_ranked_finetuning(record: dict) -> bool:
    """A record of a task with label options whose fine-tuning finished, made without its
    fine-tuned model's ranking (`_ranked_finetuning_fields`), or whose ranking failed."""
    from t5x_lite import zero_shot
    from t5x_lite.data import tasks

    task = tasks.TASKS.get(record["task"])
    return (record["status"] == "ok" and task is not None and not zero_shot.not_applicable(task)
            and record.get("finetuned_ranked", {}).get("status", "failed") == "failed")


def _ranked_finetuning_fields(point: GridPoint, workdir: str, records: Sequence[dict]
                              ) -> dict[str, dict[str, Any]]:
    """{task: {"finetuned_ranked": entry}} for `records` of a finished `point`: the final
    model of each of its fine-tuning runs ranking the label options of its tasks, as the
    zero-shot stage ranks the pre-trained model's (`zero_shot.rank`). Wang et al. score both
    regimes so; a fine-tuned model's decoded score (its record's metrics) must also spell a
    label exactly, so the two regimes' decoded and ranked scores differ in more than the
    regime (an encoder-only model: 0.00 decoded, 52 ranked). A failure fails the entries of
    the run's tasks (a re-run of the sweep tries again)."""
    from t5x_lite import zero_shot

    by_run: dict[tuple[str, ...], list[str]] = {}
    for record in records:
        # Records made before GLUE could be fine-tuned as one task name none: their own task.
        by_run.setdefault(tuple(record.get("finetune_tasks", (record["task"],))), []).append(
            record["task"])
    fields = {}
    for run_tasks, task_names in by_run.items():
        run_config = copy.deepcopy(point.config)
        run_config.finetune.tasks = run_tasks
        checkpoint = str(point.finetune_directory(workdir, run_tasks))
        try:
            rankings = zero_shot.rank(run_config, checkpoint, task_names)
            entries = {task: {"status": "ok", **rankings[task].entry(), "error": None}
                       for task in task_names}
        except Exception as error:  # recorded as failed; the other runs are still ranked
            entries = dict.fromkeys(task_names, {
                "status": "failed", "metrics": {},
                "error": _failure(f"{point.point} (seed {point.seed}) "
                                  f"{' + '.join(run_tasks)} ranked", error)})
        fields.update({task: {"finetuned_ranked": entry} for task, entry in entries.items()})
    return fields


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
    checkpoints (`add_to_finished`): `what` it adds, whether the config switches
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
    LaterStage("ranked fine-tuned scores", lambda config: bool(config.sweep.zero_shot),
               _lacks_ranked_finetuning, _ranked_finetuning_fields,
               lambda fields: fields["finetuned_ranked"]["status"]),
    LaterStage("held-out loss", lambda config: bool(config.train.eval_every), _lacks_held_out,
               _held_out_fields, lambda fields: f"{fields['held_out_loss']:.4f}"),
)


def add_to_finished(points: Sequence[GridPoint], latest: dict[tuple, dict], workdir: Path,
                     results: ResultsFile, stage: LaterStage, watch: PreemptionWatch) -> None:
    """Give the points whose records were made without `stage.what` (a workdir swept without
    it, or a point's tasks recorded before it was switched on) its fields, from the point's
    checkpoints. Each amended record is appended to results.jsonl (the last record of a key
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
            stop(Preempted(None, [str(workdir)], watch.cause))
        fields = stage.fields_of(point, str(workdir), [latest[key] for key in keys])
        for key in keys:
            record = latest[key] = {**latest[key], **fields[key[2]]}
            saved = point.record_path(workdir, record["task"])
            if saved.exists():
                write_json(saved, record)
            results.append(record)
        log(f"{stage.what} added to {point.point} (seed {point.seed}): "
             + ", ".join(f"{task} {stage.shown(value)}" for task, value in fields.items()))
