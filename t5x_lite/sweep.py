"""Sweeps: expand an experiment's grid, run every grid point (pre-train -> [zero-shot] ->
fine-tune on each task -> evaluate) and append one record per (grid point, seed, task) to
`workdir/results.jsonl`.

    points = expand("table2", "tiny")                   # validated before anything runs
    records = run_sweep("table2", "tiny", "runs/table2", overrides=["train.steps=100"])

An experiment is a file `experiments/<name>.py` (or any `path/to/file.py`) defining
  GRID: rows `dict(point=id, row=paper row label, objective=label (Table 2, ul2),
        overrides={dotted config field: value})`, in the paper's order;
  get_config(preset) -> the config every row starts from (`presets.sweep_preset`).
A point's config is: get_config(preset), then the user's overrides, then the row's overrides
(so the grid stays the grid), then `train.seed` = the seed. Each row runs once per seed in
`sweep.seeds` and is fine-tuned on each task of `sweep.tasks` separately.

Zero-shot: with `sweep.zero_shot=True` the pre-trained model of each point is also scored,
before fine-tuning, on every task of `sweep.tasks` with label options (`t5x_lite.zero_shot`:
the best-ranked option's task metrics); each record of the point gets `zero_shot`:
{"status": "ok" | "not_applicable" (a task without label options) | "failed", "metrics",
"error"} beside its fine-tuned `metrics`. It is part of what a workdir's sweep is: a workdir
swept without it is not resumed with it (its finished records have no zero-shot scores).

Compute-matched sweeps: `sweep.budget` (`BUDGETS`) says what every point's pre-training
matches. "steps" (the default): each point runs its configured `train.steps`. "tokens" /
"flops": the budget is what the reference point (`sweep.budget_reference`, a grid row's
point id; None: the grid's first point) spends in its configured `train.steps`, counted in
row positions processed or in training FLOPs (`StepCost`), and every point runs
max(1, round(budget / its cost per step)) steps (`match_budget`, at expansion, so each
point's config and records carry their derived steps).

Compile sharing: every point gets the one `BatchLayout` of all points with its batch family
and vocabulary (`objectives.layout_for` over their objective configs), so points with the same
parameter structure have equal train-step program keys and share one compiled pre-train step.
A layout holds one ul2 mixture, so the ul2 points of a grid with several mixtures
(experiments/ul2.py) get a layout per mixture, padded to the lengths of the family's others
(`_shared_layouts`): a step compiles per mixture, and every row keeps the same size. With
`run_sweep(..., vmap=K)` up to K points sharing a layout (differing only in objective and
seed) pre-train together in one `jax.vmap`-ed step (`vmap_chunks`, `run_chunk`).

The workdir:
  sweep.json                                  experiment, preset and overrides it belongs to
  results.jsonl                               the records (`t5x_lite.results`); the sweep
                                              process is the one writer (process 0 of a
                                              multi-process run)
  points/<point>/seed<k>/pretrain/            train.train's workdir (checkpoints, metrics.jsonl)
  points/<point>/seed<k>/zero_shot.json       the zero-shot stage's {task: entry}, reused on
                                              resume (only missing tasks are scored)
  points/<point>/seed<k>/finetune/<task>/     finetune.finetune's workdir
  points/<point>/seed<k>/records/<task>.json  a finished task's record, reused on resume
Re-running skips points whose records are all in results.jsonl (failed ones included: delete
their lines to retry them) and resumes the others from their checkpoints. A point preempted
(SIGTERM / SIGINT) is not failed: it saves, records nothing, and the sweep stops with
`preemption.Preempted`'s exit status, so that a scheduler re-runs it to resume.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import importlib.util
import json
import os
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any, Mapping, Sequence

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from t5x_lite import (accounting, architectures, batch_format, launchers, objectives,
                      partitioning, presets)
from t5x_lite.checkpointing import ADDED_MODEL_FIELDS
from t5x_lite.config import (BUDGETS, ConfigError, apply_overrides, drop_unread_objective_fields,
                             parse_overrides)
from t5x_lite.errors import require_choice
from t5x_lite.results import ResultsFile, is_writer
from t5x_lite.settings import Settings, Sweep, Train


def _experiments_dir() -> Path:
    """`experiments/` of a source checkout, else the copy installed as `t5x_lite.experiments`."""
    checkout = Path(__file__).resolve().parent.parent / "experiments"
    if checkout.is_dir():
        return checkout
    return Path(importlib.util.find_spec("t5x_lite.experiments").submodule_search_locations[0])


EXPERIMENTS_DIR = _experiments_dir()

SWEEP_FILE = "sweep.json"
# Record fields that measure time or depend on how often a run was interrupted, not on what it
# computed (a resumed point compiles once per process).
TIMING_FIELDS = ("wall_s", "compile_s", "compiles", "train_step_compiles", "finetune_compile_s",
                 "finetune_compiles")


@dataclasses.dataclass(frozen=True)
class StepCost:
    """What one pre-training step of a point processes, with its shared layout's rows.

    flops: `train.batch_size` x `accounting.train_flops_per_example` at the layout's inputs
    and targets lengths (attention and logits included, padding too: the step computes it);
    tokens: row positions, `train.batch_size` x (inputs + targets lengths), what the train loop
    counts as tokens/s; loss_tokens: the expected target tokens with a loss weight,
    `train.batch_size` x `objectives.expected_loss_tokens` (the signal the step learns from).
    """

    flops: float
    tokens: int
    loss_tokens: float

    @classmethod
    def of(cls, config: ml_collections.ConfigDict, layout: objectives.BatchLayout) -> StepCost:
        batch, objective = config.train.batch_size, config.objective
        lengths = (layout.inputs_length, layout.targets_length)
        return cls(
            flops=batch * accounting.train_flops_per_example(config.model, *lengths),
            tokens=batch * sum(lengths),
            loss_tokens=batch * objectives.expected_loss_tokens(
                objective.name, objective.inputs_length, objective.noise_density,
                objective.mean_noise_span_length, objective.ul2_denoisers))

    def of_budget(self, kind: str) -> float:
        """The cost of one step in the unit of `sweep.budget=kind` ("tokens" or "flops")."""
        return float(self.tokens if kind == "tokens" else self.flops)


@dataclasses.dataclass(frozen=True)
class Budget:
    """A compute-matched sweep's budget: `kind` ("tokens" or "flops") of `reference`'s
    pre-training in its `reference_steps` configured steps, `total` in that unit."""

    kind: str
    reference: str
    reference_steps: int
    total: float


@dataclasses.dataclass(frozen=True)
class GridPoint:
    """One run of a sweep: a grid row with one seed, its full config and its shared layout.

    point: the row's id ("encoder_decoder/denoising"), unique within the experiment; with
    `seed`, it names the run. row / objective: the paper's row label and (Table 2) objective
    label. index: position in `expand`'s list of `num_points`. layout: the batch layout shared
    by every point of its batch family and vocabulary (see the module docstring). budget: the
    budget its steps were derived from, None under `sweep.budget="steps"`.
    """

    experiment: str
    preset: str
    point: str
    row: str
    objective: str | None
    config: ml_collections.ConfigDict
    seed: int
    index: int
    num_points: int
    layout: objectives.BatchLayout
    budget: Budget | None = None

    @property
    def run_name(self) -> str:
        """'[3/10] encoder_decoder_half/denoising (seed 0)', for progress lines."""
        return f"[{self.index + 1}/{self.num_points}] {self.point} (seed {self.seed})"

    def directory(self, workdir: str | os.PathLike) -> Path:
        return Path(workdir) / "points" / self.point / f"seed{self.seed}"


# ---------------------------------------------------------------------------------------------
# Experiments and overrides


def experiment_names() -> list[str]:
    """The experiments in `EXPERIMENTS_DIR` (file stems)."""
    return sorted(path.stem for path in EXPERIMENTS_DIR.glob("*.py"))


def load_experiment(experiment: str) -> ModuleType:
    """The module of an experiment name (`EXPERIMENTS_DIR/<name>.py`) or of a `.py` path.

    Raises `ConfigError` for an unknown name (listing the known ones) and for a file that
    defines no non-empty GRID or no get_config.
    """
    path = Path(experiment) if experiment.endswith(".py") else EXPERIMENTS_DIR / f"{experiment}.py"
    if not path.is_file():
        raise ConfigError(
            f"experiment={experiment!r} does not exist; choose one of "
            f"{', '.join(experiment_names())} or give the path of an experiment .py file"
        )
    spec = importlib.util.spec_from_file_location(f"t5x_lite_experiment_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    grid = getattr(module, "GRID", None)
    if not grid or isinstance(grid, (str, Mapping)) or not callable(
        getattr(module, "get_config", None)
    ):
        raise ConfigError(
            f"experiment file {path} defines no grid: it needs GRID, a non-empty sequence of "
            "dict(point=..., row=..., overrides={...}), and get_config(preset)"
        )
    return module


def config_hash(config: ml_collections.ConfigDict) -> str:
    """A short stable hash of what a run computes: the config less its `sweep` section (the
    seeds, tasks and progress setting of the whole sweep, which a user may extend and resume),
    so equal runs have equal hashes."""
    plain = json.loads(config.to_json_best_effort(sort_keys=True))
    plain.pop("sweep", None)
    # A model field added later hashes at None as before it existed, so that the records of
    # sweeps run before still match.
    for name in (field.removeprefix("model.") for field in ADDED_MODEL_FIELDS):
        if name in plain["model"] and plain["model"][name] is None:
            del plain["model"][name]
    plain["objective"] = drop_unread_objective_fields(plain["objective"])
    return hashlib.sha256(json.dumps(plain, sort_keys=True).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# Expansion


# The splits a sweep reads of each task: fine-tuning trains on "train" and scores "validation"
# (`finetune.finetune`).
SWEEP_SPLITS = ("train", "validation")


def require_sweep_splits(task_names: Sequence[str]) -> None:
    """Raise a one-line `ConfigError` naming the first of `task_names` that is not a
    registered task, or that lacks one of `SWEEP_SPLITS` (e.g. glue_mnli_matched, which holds
    MNLI's validation_matched only), with its splits."""
    from t5x_lite.data import tasks

    for name in task_names:
        if name not in tasks.TASKS:
            raise ConfigError(f"sweep.tasks has unknown task {name!r}; known tasks: "
                              f"{', '.join(sorted(tasks.TASKS))}")
        splits = tasks.TASKS[name].splits
        missing = [split for split in SWEEP_SPLITS if split not in splits]
        if missing:
            raise ConfigError(
                f"sweep.tasks has task {name!r} without the {' and '.join(missing)} split a "
                f"sweep reads (it fine-tunes on train and scores validation); its splits: "
                f"{', '.join(splits)}")


def _validate(config: ml_collections.ConfigDict, where: str) -> None:
    """Every check that can run before training, with `where` (the grid point) in the message:
    the typed settings (`Settings.from_config`: every section, the sweep's included), the
    batch split over processes, the objective against the architecture, each task's splits,
    that a zero-shot sweep has a task to score zero-shot and that the pre-training corpus
    exists."""
    from t5x_lite import zero_shot
    from t5x_lite.data import pipeline, tasks

    try:
        settings = Settings.from_config(config)
        partitioning.validate_process_split(settings.train.batch_size, "train.batch_size")
        partitioning.validate_process_split(settings.finetune.batch_size,
                                            "finetune.batch_size")
        architectures.get(settings.model.arch).require_objective(settings.objective.name)
        require_sweep_splits(settings.sweep.tasks)
        if settings.sweep.zero_shot and all(zero_shot.not_applicable(tasks.TASKS[name])
                                            for name in settings.sweep.tasks):
            raise ConfigError(
                f"sweep.zero_shot=True needs a task with label options (a classification task, "
                f"e.g. builtin_module); sweep.tasks={list(settings.sweep.tasks)} has none")
        # A missing corpus would fail every point when it runs; it stops the sweep here.
        pipeline.describe_corpus(config)
    except ConfigError as error:
        raise ConfigError(f"{where}: {error}") from None


def _layout_group(config: ml_collections.ConfigDict) -> tuple[str, int, int, tuple]:
    """What `objectives.layout_for` needs besides the objectives (the first three), and a ul2
    point's mixture (empty for other objectives): points agreeing on it share a layout (and,
    with equal model and train settings, one compiled step). A layout holds one mixture
    (`BatchLayout.denoisers`), so each mixture of a grid (e.g. experiments/ul2.py's R, S and
    X only) gets a layout of its own."""
    model, objective = config.model, config.objective
    mixture = tuple(map(tuple, objective.ul2_denoisers)) if objective.name == "ul2" else ()
    return architectures.get(model.arch).family, model.vocab_size, model.num_sentinels, mixture


def _shared_layouts(groups: Mapping[tuple, Sequence[Any]]) -> dict[tuple, objectives.BatchLayout]:
    """`_layout_group` key -> the layout of its points' objective configs (`layout_for`, which
    validates each). The layouts of one family and vocabulary (several only where ul2 points
    differ in their mixture) get the longest raw, inputs and targets lengths of them all, so
    every point of a family trains on rows of the same size."""
    layouts = {key: objectives.layout_for(objs, *key[:3]) for key, objs in groups.items()}
    shared = {}
    for key, layout in layouts.items():
        family = [other for other_key, other in layouts.items() if other_key[:3] == key[:3]]
        shared[key] = dataclasses.replace(
            layout, **{field: max(getattr(other, field) for other in family)
                       for field in ("raw_length", "inputs_length", "targets_length")})
    return shared


def _budget_settings(config: ml_collections.ConfigDict,
                     grid: Sequence[Mapping[str, Any]]) -> tuple[str, str | None]:
    """(sweep.budget, sweep.budget_reference) of a point's config, checked (the section by
    `settings.Sweep`, the reference against the grid): a one-line `ConfigError` naming the
    field and the allowed values otherwise."""
    sweep_section = Sweep.from_config(config.sweep)
    kind, reference = sweep_section.budget, sweep_section.budget_reference
    if reference is not None:
        require_choice("sweep.budget_reference", reference, [row["point"] for row in grid])
    return kind, reference


def _match_steps(train: ml_collections.ConfigDict, steps: int) -> None:
    """Set `train.steps` to `steps` and scale `train.warmup_steps` by the same factor (rounded;
    at least 1 when the configured warm-up is, at most the steps for linear and cosine), so the
    warm-up keeps its share of training. The schedules read no other step count: linear and
    cosine decay to 0 at `train.steps`, rsqrt is `lr / sqrt(max(step, warmup_steps))` (its
    constant phase scales with the rest), constant reads neither. Step cadences that do not
    change what is computed (`train.log_every`, `checkpoint.every`) stay."""
    warmup = round(train.warmup_steps * steps / train.steps)
    if train.warmup_steps > 0:
        warmup = max(warmup, 1)
    if train.schedule in ("linear", "cosine"):
        warmup = min(warmup, steps)
    train.update(steps=steps, warmup_steps=warmup)


def match_budget(points: Sequence[GridPoint], kind: str,
                 reference: str | None = None) -> list[GridPoint]:
    """`points` with the steps that make each spend the reference point's pre-training budget.

    kind "tokens" or "flops": the budget is the reference's configured `train.steps` times its
    `StepCost` in that unit (the reference: the first point whose id is `reference`, None: the
    first point; its seeds cost alike). Each point gets `train.steps` = max(1, round(budget /
    its cost per step)), so it spends the budget to within half a step of its own, and
    `train.warmup_steps` scaled with it (`_match_steps`); "steps" returns `points` unchanged.
    A function of the configs and layouts alone, so a resumed sweep derives the same steps.
    """
    require_choice("sweep.budget", kind, BUDGETS)
    if kind == "steps":
        return list(points)
    wanted = reference or points[0].point
    anchor = next((p for p in points if p.point == wanted), None)
    if anchor is None:
        raise ConfigError(f"sweep.budget_reference={reference!r} is not a point of the grid; "
                          f"choose one of {', '.join(dict.fromkeys(p.point for p in points))}")
    reference_steps = anchor.config.train.steps
    budget = Budget(kind, anchor.point, reference_steps,
                    reference_steps * StepCost.of(anchor.config, anchor.layout).of_budget(kind))
    matched = []
    for point in points:
        config = copy.deepcopy(point.config)
        per_step = StepCost.of(config, point.layout).of_budget(kind)
        _match_steps(config.train, max(1, round(budget.total / per_step)))
        try:
            Train.from_config(config.train)
        except ConfigError as error:
            raise ConfigError(f"{point.experiment} point {point.point!r} under sweep.budget="
                              f"{kind!r}: {error}") from None
        matched.append(dataclasses.replace(point, config=config, budget=budget))
    return matched


def user_overrides(experiment: str, preset: str,
                   overrides: Sequence[str]) -> list[tuple[str, Any]]:
    """The user's '--config.F=V' (or 'F=V') overrides as (field, value) pairs in the order
    given, each value read as the type of its field in the experiment's config
    (`config.parse_overrides`, as every command reads them)."""
    base = load_experiment(experiment).get_config(preset)
    return [item for text in overrides for item in parse_overrides(base, [text]).items()]


def expand(experiment: str, preset: str, overrides: Sequence[str] = ()) -> list[GridPoint]:
    """The grid points of `experiment` under `preset`, in the paper's row order, each seed of
    a row after the other; every config is validated (before anything runs: `_validate`, so
    an unknown task, a task without a train or validation split or a missing pre-training
    corpus is a `ConfigError` naming it), and every row of an experiment named after a paper
    table must be one of that table's rows. Under `sweep.budget` "tokens" or "flops" each
    point's `train.steps` (and warm-up) are derived from the reference's budget
    (`match_budget`); a `sweep.budget` or `sweep.budget_reference` that is not allowed is a
    one-line `ConfigError` naming the field and the allowed values, before any other check."""
    from t5x_lite import paper_results

    module = load_experiment(experiment)
    paper_results.check_grid(Path(experiment).stem, module.GRID)
    if preset not in presets.PRESETS:
        raise ConfigError(
            f"preset={preset!r} does not exist; choose one of {', '.join(presets.PRESETS)}")
    user = dict(user_overrides(experiment, preset, overrides))
    rows, budget = [], None
    for row in module.GRID:
        config = module.get_config(preset)
        apply_overrides(config, user)
        apply_overrides(config, row["overrides"])
        settings = _budget_settings(config, module.GRID)  # checked before anything else
        if budget not in (None, settings):
            raise ConfigError(f"{experiment} point {row['point']!r} sets sweep.budget / "
                              f"sweep.budget_reference={settings}, the grid's first point "
                              f"{budget}: a sweep has one budget")
        budget = settings
        for seed in config.sweep.seeds:
            seeded = copy.deepcopy(config)
            seeded.train.seed = seed
            _validate(seeded, f"{experiment} point {row['point']!r}")
            rows.append((row, seeded))
    groups: dict[tuple, list] = {}
    for _, config in rows:
        groups.setdefault(_layout_group(config), []).append(config.objective)
    layouts = _shared_layouts(groups)
    name = Path(experiment).stem
    points = [
        GridPoint(experiment=name, preset=preset, point=row["point"], row=row["row"],
                  objective=row.get("objective"), config=config, seed=config.train.seed,
                  index=index, num_points=len(rows), layout=layouts[_layout_group(config)])
        for index, (row, config) in enumerate(rows)
    ]
    return match_budget(points, *budget)


# ---------------------------------------------------------------------------------------------
# One grid point


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


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


def _base_record(point: GridPoint) -> dict[str, Any]:
    """The fields every record of `point` shares, known before anything runs."""
    config, objective = point.config, point.config.objective
    raw, inputs, targets = objectives.lengths_for(
        objective.name, objective.inputs_length, objective.noise_density,
        objective.mean_noise_span_length, objective.ul2_denoisers)
    # The lm objective has no inputs, but an encoder still reads one EOS (as `layout_for` pads).
    inputs = max(inputs, batch_format.min_inputs_length(point.layout.family))
    columns = accounting.table2_columns(config.model, inputs, targets)
    return {
        "experiment": point.experiment, "preset": point.preset, "point": point.point,
        "row": point.row, "objective": point.objective, "config_hash": config_hash(config),
        "seed": point.seed, "params": columns.params, "params_label": columns.params_label,
        "cost_label": columns.cost_label, "params_ratio": columns.params_ratio,
        "flops_ratio": columns.flops_ratio, "corpus": config.data.corpus,
        "pretrain_steps": config.train.steps,
        # Raw corpus tokens read, as the paper counts them (2^19 steps x 128 x 512 = 2^35).
        "pretrain_tokens": config.train.steps * config.train.batch_size * raw,
        "finetune_steps": config.finetune.steps, "pretrain_loss": None, "pretrain_curve": [],
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


def _failed(base: dict[str, Any], task: str, error: Exception) -> dict[str, Any]:
    _log(f"  {base['point']} (seed {base['seed']}) {task}: FAILED: "
         + "".join(traceback.format_exception(error)))
    return {"wall_s": None, "compile_s": None, "compiles": None, **base, "task": task,
            "metrics": {}, "status": "failed", "error": f"{type(error).__name__}: {error}"}


def _write_json(path: Path, data: Any) -> None:
    """Write to a temporary file and rename, so a crash never leaves half a file (process 0
    only, see `results.is_writer`: every process of a multi-process run runs the sweep)."""
    if not is_writer():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.tmp")
    partial.write_text(json.dumps(data))
    os.replace(partial, path)


def _pretraining_failed(point: GridPoint, error: Exception) -> list[dict]:
    return [_failed(_base_record(point), task, error) for task in point.config.sweep.tasks]


def run_point(point: GridPoint, workdir: str) -> list[dict]:
    """Pre-train the point, fine-tune and evaluate on each task; one record per task.

    Never raises for a failing or diverging run: its records get status 'failed' and the
    error. A preempted run raises `preemption.Preempted` (a `SystemExit`, which the failure
    handling lets through) and records nothing. Resumes from the checkpoints under
    `point.directory(workdir)`; a task whose record was already written there is not run
    again.
    """
    from t5x_lite import train

    config, started = point.config, time.perf_counter()
    _log(f"{point.experiment} {point.run_name}: pre-training {config.train.steps} steps "
         f"({config.model.arch}, {config.objective.name}) on {config.data.corpus}")
    try:
        summary = train.train(config, point.directory(workdir) / "pretrain",
                              progress=config.sweep.progress, layout=point.layout)
    except Exception as error:  # recorded as failed; the sweep goes on
        return _pretraining_failed(point, error)
    return _finetune_tasks(point, workdir, started, summary["step_compiles"])


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
    _log(f"{points[0].experiment}: pre-training {len(points)} points together "
         f"({config.train.steps} steps, one vmapped step): "
         + "; ".join(f"{p.run_name} {p.config.objective.name}" for p in points))
    try:
        summaries = train.train_vmapped([p.config for p in points],
                                        [p.directory(workdir) / "pretrain" for p in points],
                                        layout=points[0].layout, progress=config.sweep.progress)
    except Exception as error:  # recorded as failed for every point; the sweep goes on
        return [record for p in points for record in _pretraining_failed(p, error)]
    return [record for p, summary in zip(points, summaries)
            for record in _finetune_tasks(p, workdir, started, summary["step_compiles"])]


ZERO_SHOT_FILE = "zero_shot.json"


def _zero_shot_stage(point: GridPoint, rundir: Path, task_names: Sequence[str]) -> dict[str, dict]:
    """The zero-shot entries {task: {"status", "metrics", "error"}} of the point's pre-trained
    checkpoint on `task_names` (`zero_shot.evaluate`; a task without label options is
    "not_applicable"). Entries saved in `rundir/ZERO_SHOT_FILE` are reused, so a resumed point
    scores only the tasks it has not scored; a failure fails the entries of the tasks it was
    scoring (not saved: a re-run tries again) and the fine-tuning goes on."""
    from t5x_lite import zero_shot
    from t5x_lite.data import tasks

    path = rundir / ZERO_SHOT_FILE
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
            results = zero_shot.evaluate(point.config, str(rundir / "pretrain"), scored)
        except Exception as error:  # recorded as failed; fine-tuning still runs
            _log(f"  {point.point} (seed {point.seed}) zero-shot: FAILED: "
                 + "".join(traceback.format_exception(error)))
            failed = {"status": "failed", "metrics": {},
                      "error": f"{type(error).__name__}: {error}"}
            return {**entries, **dict.fromkeys(scored, failed)}
        entries.update({task: {"status": "ok", "metrics": results[task], "error": None}
                        for task in scored})
    if missing:
        _write_json(path, entries)
    return entries


def _finetune_tasks(point: GridPoint, workdir: str, started: float,
                    train_step_compiles: int) -> list[dict]:
    """After the point's pre-training: the zero-shot stage (`sweep.zero_shot`) on the tasks
    not recorded yet, then fine-tune and evaluate on each task, one record per task (a task's
    saved record is reused; a failing task is recorded as failed).

    train_step_compiles: the pre-training step's XLA compilations in this process, as JAX's
    compile events count them (`train.train`'s `step_compiles`), recorded as such: 1 for a
    point whose pre-training compiled its program, whatever its batches mix (a UL2 run's
    denoisers included), 0 for one that reused a program compiled before (or found its
    pre-training finished, resumed)."""
    from t5x_lite import evaluation, finetune
    from t5x_lite.data import tasks

    config, rundir = point.config, point.directory(workdir)
    base = _base_record(point)
    if jax.process_count() > 1:  # process 0 has closed the metrics.jsonl read below
        multihost_utils.sync_global_devices("t5x_lite_pretrained")
    try:
        history = _pretrain_history(rundir / "pretrain" / "metrics.jsonl",
                                    config.train.log_every)
    except Exception as error:  # recorded as failed; the sweep goes on
        return _pretraining_failed(point, error)
    pretrain_wall_s = history.pop("pretrain_wall_s")
    pending = [task for task in config.sweep.tasks
               if not (rundir / "records" / f"{task}.json").exists()]
    zero_shot = (_zero_shot_stage(point, rundir, pending)  # {task: entry}
                 if config.sweep.zero_shot else {})
    records = []
    for task in config.sweep.tasks:
        saved = rundir / "records" / f"{task}.json"
        if task not in pending:
            records.append(json.loads(saved.read_text()))
            continue
        stages = {**base, **history, "train_step_compiles": train_step_compiles,
                  **({"zero_shot": zero_shot[task]} if zero_shot else {})}
        reason = evaluation.not_applicable(config.model.arch, tasks.TASKS[task])
        if reason:  # e.g. a generation task for encoder_only: recorded, not run, not failed
            record = {"wall_s": None, "compile_s": None, "compiles": None, **stages,
                      "task": task, "metrics": {}, "status": "not_applicable", "error": reason}
            _write_json(saved, record)
            records.append(record)
            continue
        _log(f"{point.experiment} {point.run_name}: fine-tuning on {task} "
             f"({config.finetune.steps} steps; {time.perf_counter() - started:.0f} s so far)")
        task_config = copy.deepcopy(config)
        task_config.finetune.tasks = (task,)
        try:
            result = finetune.finetune(task_config, str(rundir / "finetune" / task),
                                       init_from=str(rundir / "pretrain"),
                                       progress=config.sweep.progress)
        except Exception as error:  # recorded as failed; the other tasks still run
            records.append(_failed(stages, task, error))
            continue
        record = {
            **stages, "task": task,
            "wall_s": pretrain_wall_s + result["wall_s"],
            "finetune_compile_s": result["compile_s"], "finetune_compiles": result["compiles"],
            "metrics": result["scores"][task], "status": "ok", "error": None,
        }
        _write_json(saved, record)
        records.append(record)
    return records


# ---------------------------------------------------------------------------------------------
# The sweep


def _without_sweep_settings(identity: dict[str, Any]) -> dict[str, Any]:
    """`identity` less its `sweep.*` overrides (seeds, tasks, progress): a sweep extended by
    seeds or tasks is the same sweep, whose finished records resume (each record is keyed by
    point, seed and task and checked by its config hash, which leaves out the sweep section).
    `sweep.budget` and `sweep.budget_reference` stay: they change what the points compute;
    so does `sweep.zero_shot=True` (what the records hold; False is the default, the same
    sweep as none)."""
    def kept(field: str, value: Any) -> bool:
        if field == "sweep.zero_shot":
            return value is not False
        return not field.startswith("sweep.") or field.startswith("sweep.budget")

    return {**identity, "overrides": [item for item in identity["overrides"] if kept(*item)]}


def _claim_workdir(workdir: Path, identity: dict[str, Any]) -> None:
    """Record which sweep the workdir belongs to; refuse a workdir of a different sweep (other
    experiment, preset or overrides; more seeds or tasks are the same sweep)."""
    path = workdir / SWEEP_FILE
    identity = _without_sweep_settings(identity)
    if path.exists():
        saved = _without_sweep_settings(json.loads(path.read_text()))
        if saved != identity:
            differences = ", ".join(f"{key}: {saved.get(key)!r} there, {identity[key]!r} now"
                                    for key in identity if saved.get(key) != identity[key])
            raise ConfigError(
                f"workdir {workdir} holds a different sweep ({differences}); use another "
                "--workdir, or the same experiment, preset and overrides to resume it")
        return
    _write_json(path, identity)


def _require_current(records: Sequence[dict], points: Sequence[GridPoint], path: Path) -> None:
    """Refuse records of a point whose config has changed since they were written (e.g. a grid
    row moved to another objective): skipping that point as finished would mix two experiments
    in one table."""
    hashes = {(p.point, p.seed): config_hash(p.config) for p in points}
    for record in records:
        expected = hashes.get((record["point"], record["seed"]))
        if expected is not None and record.get("config_hash", expected) != expected:
            raise ConfigError(
                f"{path} holds a record of point {record['point']!r} (seed {record['seed']}) made "
                f"with another config (config_hash {record['config_hash']}, now {expected}): the "
                "grid or its defaults changed since; use a new --workdir, or delete that "
                "point's lines to run it again")


def _require_one_view_of_the_workdir(todo: Sequence[GridPoint], workdir: Path) -> None:
    """Refuse a multi-process sweep whose processes see different finished points: they would
    run different points and wait forever in each other's collectives. It happens when each
    host has its own workdir (a host-local `runs/table2`) where one shared by every host (NFS,
    a mounted bucket) is needed, since only process 0 writes the records."""
    if jax.process_count() == 1:
        return
    todo_keys = json.dumps([[p.point, p.seed] for p in todo]).encode()
    mine = np.frombuffer(hashlib.sha256(todo_keys).digest()[:8], np.int32)
    every_process = multihost_utils.process_allgather(mine)  # [processes, 2]
    if not (every_process == mine).all():
        raise ConfigError(
            f"the {jax.process_count()} processes see different finished points in "
            f"--workdir={workdir} (process {jax.process_index()}: {len(todo)} runs to do): a "
            "multi-process sweep needs one workdir that every host shares (NFS, a mounted "
            "bucket), not a directory on each host")


def _log_budget(points: Sequence[GridPoint]) -> None:
    """Under a compute-matched budget, one line with the steps derived for each point."""
    budget = points[0].budget
    if budget is not None:
        steps = {p.point: p.config.train.steps for p in points}
        _log(f"sweep.budget={budget.kind}: every point spends what {budget.reference} spends in "
             f"{budget.reference_steps} steps ({budget.total:.4g}); pre-training steps: "
             + ", ".join(f"{point} {count}" for point, count in steps.items()))


def vmap_chunks(points: Sequence[GridPoint], size: int) -> list[tuple[GridPoint, ...]]:
    """`points` in chunks of at most `size` that can pre-train in one vmapped step: points
    with the same layout and `train_step.vmap_group_key` (they differ only in objective, seed and
    language_model vs prefix_lm), in grid order within each group."""
    from t5x_lite import train_step

    groups: dict[tuple, list[GridPoint]] = {}
    for point in points:
        groups.setdefault((point.layout, train_step.vmap_group_key(point.config)), []).append(point)
    return [tuple(group[start:start + size])
            for group in groups.values() for start in range(0, len(group), size)]


def _steps_of(point: GridPoint) -> int:
    """The optimiser steps a run takes: its pre-training and each task's fine-tuning."""
    return point.config.train.steps + point.config.finetune.steps * len(point.config.sweep.tasks)


def _clock(seconds: float) -> str:
    """'1h 02m', '3m 05s', '42s'."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def progress_line(finished_steps: Sequence[int], left_steps: Sequence[int],
                  elapsed: float) -> str:
    """The sweep's progress after a run finishes, from the steps (`_steps_of`) of the runs
    finished in this invocation and of those left: runs done and left, the time so far and the
    time left, estimated as the steps left at the rate measured so far (steps differ between
    the points of a compute-matched sweep; a parallel launcher's rate includes its
    parallelism)."""
    done, left = len(finished_steps), len(left_steps)
    text = f"sweep: {done} of {done + left} runs done, {left} left; {_clock(elapsed)} elapsed"
    if left and sum(finished_steps):
        text += f", about {_clock(elapsed / sum(finished_steps) * sum(left_steps))} left"
    return text


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
    if isinstance(vmap, bool) or not isinstance(vmap, int) or vmap < 1:
        raise ConfigError(f"vmap={vmap!r} must be an integer >= 1 (the most points pre-trained "
                          "together in one vmapped step; 1 runs them one by one)")
    if vmap > 1 and isinstance(launcher, launchers.RayLauncher):
        raise ConfigError(f"vmap={vmap} needs the local or parallel launcher; the ray "
                          "launcher sizes its tasks per point")
    points = expand(experiment, preset, overrides)
    _log_budget(points)
    if point_index is not None:
        if not 0 <= point_index < len(points):
            raise ConfigError(f"point_index={point_index} must be in [0, {len(points)})")
        points = [points[point_index]]
    workdir_path = Path(workdir)
    workdir_path.mkdir(parents=True, exist_ok=True)
    # As JSON sees it, so that it compares equal to the saved copy.
    identity = json.loads(json.dumps({
        "experiment": points[0].experiment, "preset": preset,
        "overrides": [list(item) for item in user_overrides(experiment, preset, overrides)]}))
    _claim_workdir(workdir_path, identity)
    results = ResultsFile(workdir_path)
    results.finish_last_line()
    finished_records = results.records()
    _require_current(finished_records, points, results.path)
    done = {(r["point"], r["seed"], r["task"]) for r in finished_records}
    todo = [p for p in points
            if any((p.point, p.seed, task) not in done for task in p.config.sweep.tasks)]
    _require_one_view_of_the_workdir(todo, workdir_path)
    _log(f"sweep {points[0].experiment} --preset {preset}: {len(points)} runs x "
         f"{len(points[0].config.sweep.tasks)} tasks; {len(points) - len(todo)} done, "
         f"{len(todo)} to run; records in {results.path}")
    started, finished = time.perf_counter(), set()
    launcher = launcher if launcher is not None else launchers.LocalLauncher()
    work = (launcher.map(run_chunk, vmap_chunks(todo, vmap), str(workdir_path)) if vmap > 1
            else launcher.map(run_point, todo, str(workdir_path)))
    for records in work:
        runs: dict[tuple, list[str]] = {}
        for record in records:
            if (record["point"], record["seed"], record["task"]) not in done:
                results.append(record)
            runs.setdefault((record["point"], record["seed"]), []).append(
                f"{record['task']} {record['status']}")
        for (point, seed), statuses in runs.items():
            finished.add((point, seed))
            steps = {key: [_steps_of(p) for p in todo if ((p.point, p.seed) in finished) == key]
                     for key in (True, False)}
            _log(f"done {point} (seed {seed}): {', '.join(statuses)}")
            _log(progress_line(steps[True], steps[False], time.perf_counter() - started))
    wanted = {(p.point, p.seed) for p in points}
    return [r for r in results.records() if (r["point"], r["seed"]) in wanted]


def run_demo(workdir: str, overrides: Sequence[str] = ()) -> str:
    """`t5x-lite demo`: Table 2 under the `demo` preset (plus `overrides`, 'field=value'
    strings), then the comparison table (returned)."""
    from t5x_lite import report

    config = presets.sweep_preset("demo")
    apply_overrides(config, parse_overrides(config, overrides))
    model = config.model
    _log(f"t5x-lite demo: the T5 paper's Table 2 (5 architectures x 2 objectives) with a small "
         f"model (d_model {model.d_model}, {model.num_layers} layers per stack, vocabulary "
         f"{model.vocab_size}), {config.train.steps} pre-training and {config.finetune.steps} "
         f"fine-tuning steps per task on the built-in tasks {', '.join(config.sweep.tasks)}. "
         "This is a smaller model and fewer steps than the `tiny` preset, so that it finishes "
         f"in minutes on a laptop CPU. Re-running resumes from {workdir}.")
    run_sweep("table2", "demo", workdir, overrides=overrides)
    return report.report(workdir).text
