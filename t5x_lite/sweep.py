"""Sweeps: run every grid point of an experiment (its grid: `t5x_lite.grid`): pre-train ->
[zero-shot] -> fine-tune (each task alone, or GLUE's as one: `grid.finetune_runs`) ->
evaluate, and append one record per (grid point, seed, task) to `workdir/results.jsonl`.

    records = run_sweep("table2", "tiny", "runs/table2", overrides=["train.steps=100"])

Zero-shot: with `sweep.zero_shot=True` the pre-trained model of each point is also scored,
before fine-tuning, on every task of `sweep.tasks` with label options (`t5x_lite.zero_shot`:
the best-ranked option's task metrics); each record of the point gets `zero_shot`:
{"status": "ok" | "not_applicable" (a task without label options) | "failed", "metrics",
"error", "most_predicted_share", "constant_metrics"} beside its fine-tuned `metrics`, and
after the runs the same ranking of its final fine-tuned model, `finetuned_ranked`
(`sweep_point.LATER_STAGES`). A workdir swept without it can be given it later:
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
together in one `jax.vmap`-ed step (`vmap_chunks`, `sweep_point.run_chunk`). This module decides
which points run, where and in what order; one point's run and records are
`t5x_lite.sweep_point`'s.

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
import itertools
import json
import operator
import time
from pathlib import Path
from typing import Any, Sequence

import jax

from t5x_lite import attention, held_out, launchers, partitioning, presets
from t5x_lite.checkpointing import newest_step
from t5x_lite.config import ConfigError, apply_overrides, parse_overrides
from t5x_lite.grid import SWEEP_SPLITS, GridPoint, expand
from t5x_lite.loop import PreemptionWatch
from t5x_lite.preemption import Preempted
from t5x_lite.results import ResultsFile, latest_records, record_key, run_key
from t5x_lite.saved_config import CHECKPOINTS_DIR
from t5x_lite.sweep_point import (LATER_STAGES, add_to_finished, base_record, log, run_chunk,
                                  run_point, stop)
from t5x_lite.sweep_workdir import (check_workdir, claim_workdir, require_current,
                                    require_current_folders, require_one_view_of_the_workdir,
                                    save_failures_as_recorded, sweep_identity)


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
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def progress_line(finished_steps: Sequence[int], left_steps: Sequence[int],
                  elapsed: float, earlier: int = 0) -> str:
    """The sweep's progress after a run finishes, from the steps (`_steps_of`, less those a
    resumed pre-training had saved) of the runs finished in this invocation and of those left,
    and the runs `earlier` invocations finished:
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
    each is fine-tuned alone; records are as with vmap=1 but for rounding (the same random
    streams; the vmapped program's other reduction order differs in the last bits, which
    training amplifies: about 1e-5 relative in loss over tens of steps at `tiny`, so a
    decoded answer may flip). Resuming a
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
            log(budget)
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
        log(f"sweep {points[0].experiment} --preset {preset}: {len(points)} runs x "
             f"{len(points[0].config.sweep.tasks)} tasks; {len(points) - len(todo)} done, "
             f"{len(todo)} to run; records in {results.path}")
    if starting.signal is not None:
        stop(Preempted(None, [str(workdir)], starting.cause))
    started, finished = time.perf_counter(), set()
    # The steps each run still has to take (a resumed pre-training's saved ones are not this
    # invocation's: counted as done now, they made "about 15m left" of 2h30m).
    to_take = {(p.point, p.seed): _steps_of(p) - min(
        newest_step(p.pretrain_directory(workdir_path) / CHECKPOINTS_DIR) or 0,
        p.config.train.steps) for p in todo}
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
            finished.update(runs)  # a vmapped chunk's runs all at once: one line after them
            for (point, seed), statuses in runs.items():
                log(f"done {point} (seed {seed}): {', '.join(statuses)}")
            steps = {key: [to_take[(p.point, p.seed)] for p in todo
                           if ((p.point, p.seed) in finished) == key] for key in (True, False)}
            log(progress_line(steps[True], steps[False], time.perf_counter() - started,
                               earlier=len(points) - len(todo)))
            if local and between_points.signal is not None and len(finished) < len(todo):
                last = [p for p in todo if (p.point, p.seed) in runs]
                stop(Preempted(last[-1].config.train.steps,
                                [str(p.directory(workdir_path)) for p in last],
                                between_points.cause))
    # The later stages run in this process whatever the launcher: a signal stops them between
    # points too.
    with PreemptionWatch() as later:
        for stage in LATER_STAGES:
            if stage.on(points[0].config):
                add_to_finished(points, latest, workdir_path, results, stage, later)
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
    log(f"t5x-lite demo: the T5 paper's Table 2 (5 architectures x 2 objectives) with a small "
         f"model (d_model {model.d_model}, {model.num_layers} layers per stack, vocabulary "
         f"{model.vocab_size}), {config.train.steps} pre-training and {config.finetune.steps} "
         f"fine-tuning steps per task on the built-in tasks {', '.join(config.sweep.tasks)}. "
         "This is a smaller model and fewer steps than the `tiny` preset, so that it finishes "
         f"in minutes on a laptop CPU. Re-running resumes from {workdir}.")
    run_sweep("table2", "demo", workdir, overrides=overrides)
    return report.report(workdir).text
