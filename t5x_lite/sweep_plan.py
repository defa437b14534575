"""What a sweep would run, before it runs: `t5x-lite sweep EXPERIMENT --dry_run`.

    print(render(plan_sweep("table2", "paper", "runs/table2")))

The grid is expanded and checked as `sweep.run_sweep` checks it before its first run (every
point's config, the corpora, the tasks' splits, a compute budget's derived steps, the workdir's
sweep, its records and the folders of the runs left to do), but for the attention kernel's
presence (a dry run sizes a sweep for a machine it need not run on), then each run (grid point x seed) is listed with what it
costs and how far it got: its pre-training steps, parameters, training FLOPs per step and in
all, the compiled pre-training program it shares (points with equal `StepSettings` and layout
compile once), and, in an existing workdir, whether it is done, resumes from a checkpoint or
has not started. Nothing is trained, compiled or written, and no device is touched: it is
how a researcher sizes a sweep at the `paper` preset before asking a pod for it.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

import ml_collections

from t5x_lite import accounting, zero_shot
from t5x_lite.checkpointing import newest_step
from t5x_lite.data import tasks
from t5x_lite.evaluation import with_task_lengths
from t5x_lite.grid import StepCost, expand, finetune_runs
from t5x_lite.results import ResultsFile, latest_records, record_key, results_path, run_key
from t5x_lite.saved_config import CHECKPOINTS_DIR
from t5x_lite.step_settings import step_settings
from t5x_lite.sweep import (budget_line, require_vmap, select_point, unrecorded_tasks,
                            vmap_chunks)
from t5x_lite.sweep_point import LATER_STAGES, base_record
from t5x_lite.sweep_workdir import (check_workdir, require_current, require_current_folders,
                                     sweep_identity)


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """One run of the sweep as planned. index: its position in the grid's list (what
    `--point_index` takes); program: the compiled pre-training step it shares, numbered from 1
    in grid order; checkpoint_step: its pre-training's newest saved step (None: none yet);
    tasks_left: the tasks whose records are not in results.jsonl."""

    index: int
    point: str
    row: str
    objective: str | None
    seed: int
    steps: int
    params: int
    flops_per_step: float
    corpus_tokens: int  # raw corpus tokens read, as the paper counts them
    finetune_flops: float  # its fine-tuning runs', each at its own lengths
    finetune_flops_left: float  # of those with a task left
    program: int
    checkpoint_step: int | None
    tasks_left: int
    finetunes_left: int  # its fine-tuning runs (`GridPoint.finetune_runs`) with a task left
    stages_left: tuple[str, ...]  # what `sweep_point.LATER_STAGES` would add to its records

    @property
    def status(self) -> str:
        """'done', 'to run', 'resumes at step N', 'pre-trained, 2 tasks left', or 'done;
        adds held-out loss' (a later stage that scores its checkpoint, training nothing)."""
        if not self.tasks_left:
            return "; adds ".join(["done", *self.stages_left])
        if self.checkpoint_step is None:
            return "to run"
        if self.checkpoint_step >= self.steps:
            return f"pre-trained, {self.tasks_left} task{'s' * (self.tasks_left > 1)} left"
        return f"resumes at step {self.checkpoint_step}"


@dataclasses.dataclass(frozen=True)
class SweepPlan:
    """A sweep's runs before it runs. workdir_state: `sweep_workdir.check_workdir`'s answer;
    vmap_groups: with vmap > 1, the indices of the runs left that pre-train together."""

    experiment: str
    preset: str
    workdir: str
    workdir_state: str
    budget: str | None  # `sweep.budget_line`: a compute-matched sweep's derived steps
    tasks: tuple[str, ...]
    finetune_runs: tuple[tuple[str, ...], ...]  # `grid.finetune_runs` of the tasks
    finetune_steps: int
    runs: tuple[PlannedRun, ...]
    vmap: int
    vmap_groups: tuple[tuple[int, ...], ...]
    point_index: int | None = None  # a job array's one point
    # `sweep.zero_shot`'s tasks: those of `tasks` with label options, ranked by each pre-trained
    # model before fine-tuning and by each fine-tuned one after the runs (`sweep_point`).
    zero_shot_tasks: tuple[str, ...] = ()

    @property
    def programs(self) -> int:
        return max(run.program for run in self.runs)


def plan_sweep(experiment: str, preset: str, workdir: str, overrides: Sequence[str] = (),
               vmap: int = 1, point_index: int | None = None) -> SweepPlan:
    """The plan of `run_sweep(experiment, preset, workdir, overrides=..., vmap=vmap,
    point_index=point_index)`, with its checks (a `ConfigError` where the sweep would stop
    before running), writing nothing."""
    require_vmap(vmap)
    every_point = expand(experiment, preset, overrides)
    budget = budget_line(every_point)  # the sweep's, as `run_sweep` logs it
    points = select_point(every_point, point_index)
    workdir_path = Path(workdir)
    state = check_workdir(workdir_path, sweep_identity(experiment, points, overrides))
    records = ResultsFile(workdir_path).records() if state != "new" else []
    require_current(records, points, results_path(workdir_path))
    done = {record_key(r) for r in records}
    latest_of_run: dict[tuple[str, int], list[dict]] = {}
    for record in latest_records(records):
        latest_of_run.setdefault(run_key(record), []).append(record)
    sweep = points[0].config.sweep
    finetunes = finetune_runs(sweep.tasks, sweep.glue_as_one_task)
    programs: dict = {}
    runs = []
    for point in points:
        record = base_record(point)
        program = programs.setdefault(step_settings(point.config, point.layout),
                                      len(programs) + 1)
        latest = latest_of_run.get((point.point, point.seed), [])
        left, point_finetunes = set(unrecorded_tasks(point, done)), point.finetune_runs()
        run_flops = [_finetune_flops(point.config, run) for run in point_finetunes]
        runs.append(PlannedRun(
            point.index, point.point, point.row, point.objective, point.seed,
            point.config.train.steps, record["params"],
            StepCost.of(point.config, point.layout).flops, record["pretrain_tokens"],
            sum(run_flops), sum(flops for run, flops in zip(point_finetunes, run_flops)
                                if not left.isdisjoint(run)),
            program,
            newest_step(point.pretrain_directory(workdir_path) / CHECKPOINTS_DIR)
            if state != "new" else None,
            len(left), sum(not left.isdisjoint(run) for run in point_finetunes),
            tuple(stage.what for stage in LATER_STAGES
                  if stage.on(point.config) and any(map(stage.lacks, latest)))))
    todo = [point for point, run in zip(points, runs) if run.tasks_left]
    if state != "new":
        require_current_folders(todo, workdir_path)
    return SweepPlan(
        points[0].experiment, preset, workdir, state, budget,
        tuple(sweep.tasks), finetunes, points[0].config.finetune.steps, tuple(runs), vmap,
        tuple(tuple(point.index for point in chunk)
              for chunk in vmap_chunks(todo, vmap, workdir))
        if vmap > 1 else (), point_index,
        tuple(zero_shot.scorable(sweep.tasks, "sweep.tasks")[0]) if sweep.zero_shot else ())


def _finetune_flops(config: ml_collections.ConfigDict, run_tasks: tuple[str, ...]) -> float:
    """The training FLOPs of one fine-tuning run of `run_tasks` from a point of `config`, at
    the lengths the run reads (`evaluation.with_task_lengths`)."""
    finetune = with_task_lengths(config, [tasks.TASKS[name] for name in run_tasks]).finetune
    return finetune.steps * finetune.batch_size * accounting.train_flops_per_example(
        config.model, finetune.inputs_length, finetune.targets_length)


def _count(number: float) -> str:
    """1.23e+18 -> '1.23e18', 3100000 -> '3.1M': short, and exact enough to size a sweep."""
    if number >= 1e12:
        return f"{number:.3g}".replace("e+", "e")
    for size, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if number >= size:
            return f"{number / size:.3g}{unit}"
    return f"{number:g}"


def _plural(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'s' * (count != 1)}"


def render(plan: SweepPlan) -> str:
    """The plan as text: a header, one aligned line per run, the totals of what is left."""
    from t5x_lite.report_render import aligned

    runs, tasks = plan.runs, plan.tasks
    with_objective = any(run.objective for run in runs)
    grid = [["#", "point", "row", *(["objective"] if with_objective else []), "seed", "steps",
             "params", "FLOPs/step", "pre-training FLOPs", "program", "status"]]
    grid += [[str(run.index), run.point, run.row, *([run.objective or ""] if with_objective
                                                    else []),
              str(run.seed), str(run.steps), _count(run.params), _count(run.flops_per_step),
              _count(run.steps * run.flops_per_step), str(run.program), run.status]
             for run in runs]
    left = [run for run in runs if run.tasks_left]
    # (run, its pre-training steps left) for each run whose pre-training is not finished.
    pretrain_left = [(run, run.steps - (run.checkpoint_step or 0)) for run in left
                     if (run.checkpoint_step or 0) < run.steps]
    finetunes_left = sum(run.finetunes_left for run in left)
    together = [run for run in plan.finetune_runs if len(run) > 1]
    where = {"new": "a new workdir", "same": "resumed",
             "adds zero-shot": "resumed, adding the zero-shot stage"}[plan.workdir_state]
    lines = [
        f"Dry run of sweep {plan.experiment} --preset {plan.preset} --workdir {plan.workdir}"
        + ("" if plan.point_index is None else f" --point_index {plan.point_index}")
        + f" ({where}): nothing is trained, compiled or written.",
        f"{_plural(len(runs), 'run')} (grid points x seeds), each pre-trained, then fine-tuned "
        f"on {_plural(len(tasks), 'task')} ({', '.join(tasks)}) in "
        f"{_plural(len(plan.finetune_runs), 'fine-tuning run')} of {plan.finetune_steps:,} "
        "steps" + "".join(f" ({' + '.join(run)} as one task, as the paper fine-tunes GLUE)"
                          for run in together)
        + f"; {_plural(plan.programs, 'compiled pre-training program')} (runs with the "
        "same program number share one)."
        + (f" Zero-shot (sweep.zero_shot): each pre-trained model ranks the label options of "
           f"{', '.join(plan.zero_shot_tasks)} before fine-tuning, and after the runs each "
           "fine-tuned model of those tasks is loaded again and ranked too."
           if plan.zero_shot_tasks else ""),
        *([plan.budget] if plan.budget else []), "", *aligned(grid), "",
        f"In all: {_count(sum(r.steps * r.flops_per_step for r in runs))} pre-training FLOPs "
        "(3 x forward matmuls, attention and logits included), "
        f"{_count(sum(r.corpus_tokens for r in runs))} corpus tokens read, "
        f"{_count(sum(r.finetune_flops for r in runs))} fine-tuning FLOPs.",
        f"Left to run: {_plural(len(pretrain_left), 'pre-training')} "
        f"({sum(steps for _, steps in pretrain_left):,} steps, "
        f"{_count(sum(run.flops_per_step * steps for run, steps in pretrain_left))} "
        f"FLOPs) and {_plural(finetunes_left, 'fine-tuning')} "
        f"({finetunes_left * plan.finetune_steps:,} steps, "
        f"{_count(sum(r.finetune_flops_left for r in left))} FLOPs); "
        f"{len(runs) - len(left)} of {len(runs)} runs done."]
    for stage in LATER_STAGES:
        amended = sum(stage.what in run.stages_left for run in runs)
        if amended:
            lines.append(f"Then {stage.what} added to the finished records of "
                         f"{_plural(amended, 'run')}, from their checkpoints "
                         "(nothing is trained again).")
    if plan.vmap > 1:
        groups = "; ".join(", ".join(map(str, group)) for group in plan.vmap_groups)
        lines.append(f"--vmap {plan.vmap}: the runs left pre-train in "
                     f"{_plural(len(plan.vmap_groups), 'vmapped group')} (by #): {groups}.")
    # A plan is made where the sweep will not run (a laptop, for a pod): what the sweep checks
    # against its own machine is left to it.
    lines.append("Not checked by a dry run, which uses no device and reads no task data: the "
                 "devices the batch sizes must split over, the attention kernel, and each "
                 "task's data; the sweep checks them where it runs, before its first point.")
    return "\n".join(lines) + "\n"
