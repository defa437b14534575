"""A sweep's grid: an experiment's rows expanded into validated `GridPoint`s, a row per seed.

    points = expand("table2", "tiny")                   # validated before anything runs

An experiment is a file `experiments/<name>.py` (or any `path/to/file.py`) defining
  GRID: rows `dict(point=id, row=paper row label, objective=label (Table 2, ul2),
        overrides={dotted config field: value})`, in the paper's order;
  get_config(preset) -> the config every row starts from (`presets.sweep_preset`).
A point's config is: get_config(preset), then the user's overrides, then the row's overrides
(so the grid stays the grid), then `train.seed` = the seed. An override of a field that every
row sets would change no point, so it is refused (`ConfigError`); one of a field that some
rows set reaches only the others, and a warning names the rows that keep their own. Each row runs once per seed in
`sweep.seeds` and is fine-tuned on the tasks of `sweep.tasks` (`finetune_runs`: each task
alone, but GLUE's as one task under `sweep.glue_as_one_task`, as the paper does). Rows that would
compute the same runs (their configs differ only in objective settings their objective does
not read or sees as the same numbers, `identical_rows`) are warned of at expansion.

Compute-matched sweeps: `sweep.budget` (`BUDGETS`) says what every point's pre-training
matches. "steps" (the default): each point runs its configured `train.steps`. "tokens" /
"flops": the budget is what the reference point (`sweep.budget_reference`, a grid row's
point id; None: the grid's first point) spends in its configured `train.steps`, counted in
row positions processed or in training FLOPs (`StepCost`), and every point runs
max(1, round(budget / its cost per step)) steps (`match_budget`, at expansion, so each
point's config and records carry their derived steps). A grid row other than the reference
may not set `train.steps` then. Under a matched budget each point's rows are its own
objective's lengths (below), so what it is charged for is what it needs, not the padding to
another row's lengths: a point's steps do not depend on which other rows the grid has.

Compile sharing: every point gets the one `BatchLayout` of all points with its batch family
and vocabulary (`objectives.layout_for` over their objective configs; under a matched budget,
of those whose objective has its lengths too), so points with the same parameter structure
have equal train-step program keys and share one compiled pre-train step.
A layout holds one ul2 mixture, so the ul2 points of a grid with several mixtures
(experiments/ul2.py) get a layout per mixture, padded to the lengths of the family's others
(`_shared_layouts`): a step compiles per mixture, and every row keeps the same size.

`t5x_lite.sweep` runs the points.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import importlib.util
import json
import os
import re
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any, Mapping, Sequence

import ml_collections

from t5x_lite import (accounting, architectures, objective_registry, objectives, partitioning,
                      presets)
from t5x_lite.config import (BUDGETS, ConfigError, apply_overrides, call_get_config,
                             drop_unread_objective_fields, flat_fields, parse_overrides,
                             require_override_list, run_user_file)
from t5x_lite.errors import require_choice
from t5x_lite.results import Budget
from t5x_lite.saved_config import (ADDED_FIELDS, OBSERVING_FIELDS, acting_added_fields,
                                   config_as_json)
from t5x_lite.settings import (SCHEDULES_ENDING_AT_STEPS, Finetune, Settings, Sweep, Train,
                               require_trainable)


def _experiments_dir() -> Path:
    """`experiments/` of a source checkout, else the copy installed as `t5x_lite.experiments`."""
    checkout = Path(__file__).resolve().parent.parent / "experiments"
    if checkout.is_dir():
        return checkout
    return Path(importlib.util.find_spec("t5x_lite.experiments").submodule_search_locations[0])


EXPERIMENTS_DIR = _experiments_dir()

@dataclasses.dataclass(frozen=True)
class StepCost:
    """What one pre-training step of a point processes, with its layout's rows (under a matched
    budget, its own objective's lengths; see the module docstring).

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
            loss_tokens=batch * objectives.objective_loss_tokens(objective, layout.family))

    def of_budget(self, kind: str) -> float:
        """The cost of one step in the unit of `sweep.budget=kind` ("tokens" or "flops")."""
        return float(self.tokens if kind == "tokens" else self.flops)


@dataclasses.dataclass(frozen=True)
class GridPoint:
    """One run of a sweep: a grid row with one seed, its full config and its layout (shared by
    its family's points, or under a matched budget by those of its objective's lengths).

    point: the row's id ("encoder_decoder/denoising"), unique within the experiment; with
    `seed`, it names the run. row / objective: the paper's row label and (Table 2) objective
    label. index: position in `expand`'s list of `num_points` (rows x seeds); num_rows: the
    grid's rows, each point's record carries it so a report can say which are still to run.
    layout: the batch layout shared
    by every point of its batch family and vocabulary (see the module docstring). budget: the
    budget its steps were derived from, None under `sweep.budget="steps"`.
    """

    experiment: str
    # The experiment as `expand` was given it (a built-in name or a .py path): a worker process
    # loads it (`load_experiment`) before running the point, so that what the file registers
    # exists there too.
    source: str
    preset: str
    point: str
    row: str
    objective: str | None
    config: ml_collections.ConfigDict
    seed: int
    index: int
    num_points: int
    num_rows: int
    layout: objectives.BatchLayout
    budget: Budget | None = None

    @property
    def run_name(self) -> str:
        """'[3/10] encoder_decoder_half/denoising (seed 0)', for progress lines."""
        return f"[{self.index + 1}/{self.num_points}] {self.point} (seed {self.seed})"

    @property
    def pretrain_tokens(self) -> int:
        """The raw corpus tokens its pre-training reads: steps x batch x the raw tokens of its
        objective's examples (`objectives.objective_lengths`; ul2: its longest denoiser's),
        e.g. 568 per example for span corruption at 512 inputs and 511 for the i.i.d.
        objectives (the paper's 2^35 counts 512 input positions per example). An objective
        read within documents (`prefix_lm`, `deshuffling`) reads at most that: a document's
        last segment is shorter (its mean segment is 0.73 of 511 tokens on the English
        Wikipedia sample, 0.96 of 63). Its records keep it, so that one made while its
        objective read another raw length is found (`sweep_workdir.require_current`)."""
        raw = objectives.objective_lengths(self.config.objective)[0]
        return self.config.train.steps * self.config.train.batch_size * raw

    @property
    def objective_revision(self) -> int:
        """The revision of its objective's definition (`objective_registry.Objective.revision`),
        which its records keep, so that one made under an earlier definition is found
        (`sweep_workdir.require_current`)."""
        return objective_registry.get(self.config.objective.name).revision

    def directory(self, workdir: str | os.PathLike) -> Path:
        """The run's folder in the sweep's `workdir` (laid out as `t5x_lite.sweep` says)."""
        return Path(workdir) / "points" / self.point / f"seed{self.seed}"

    def pretrain_directory(self, workdir: str | os.PathLike) -> Path:
        """The run's pre-training workdir (`train.train`'s: checkpoints, metrics)."""
        return self.directory(workdir) / "pretrain"

    def finetune_runs(self) -> tuple[tuple[str, ...], ...]:
        """The fine-tuning runs the point makes (`point_finetune_runs` of its config)."""
        return point_finetune_runs(self.config)

    def finetune_directory(self, workdir: str | os.PathLike, run_tasks: tuple[str, ...]) -> Path:
        """The run's fine-tuning workdir for its fine-tuning run of `run_tasks` (one of
        `finetune_runs`; `finetune.finetune`'s): named by the task, or by the tasks joined with
        '+' for GLUE as one task."""
        if not isinstance(run_tasks, tuple):  # a task name would be joined letter by letter
            raise TypeError(f"finetune_directory takes a tuple of task names, got {run_tasks!r}")
        return self.directory(workdir) / "finetune" / "+".join(run_tasks)

    def record_path(self, workdir: str | os.PathLike, task: str) -> Path:
        """Where the run's finished record of `task` is saved, to be reused on resume."""
        return self.directory(workdir) / "records" / f"{task}.json"


# ---------------------------------------------------------------------------------------------
# Experiments and overrides


def experiment_names() -> list[str]:
    """The experiments in `EXPERIMENTS_DIR` (file stems)."""
    return sorted(path.stem for path in EXPERIMENTS_DIR.glob("*.py"))


# Each experiment file run once per process, as an import is: (resolved path, mtime, size) ->
# its module. A file may register what its grid uses (`architectures.register`), which must
# happen once; an edited file is run again.
_LOADED: dict[tuple[Path, int, int], ModuleType] = {}


def load_experiment(experiment: str) -> ModuleType:
    """The module of an experiment name (`EXPERIMENTS_DIR/<name>.py`) or of a `.py` path, run
    once per process (again only if the file changed; a file that registers an objective
    cannot run again in the process, since the objective is registered: `objective_registry`).

    Raises a one-line `ConfigError` for an unknown name (listing the known ones), for a file
    that fails as it runs (its line, `config.run_user_file`), that defines no non-empty GRID
    or no get_config, or whose GRID rows lack a field or repeat a point id (`_check_rows`).
    """
    path = Path(experiment) if experiment.endswith(".py") else EXPERIMENTS_DIR / f"{experiment}.py"
    if not path.is_file():
        raise ConfigError(
            f"experiment={experiment!r} does not exist; choose one of "
            f"{', '.join(experiment_names())} or give the path of an experiment .py file"
        )
    stat = path.stat()
    key = (path.resolve(), stat.st_mtime_ns, stat.st_size)
    if key in _LOADED:
        return _LOADED[key]
    module = run_user_file(path, f"t5x_lite_experiment_{path.stem}", f"experiment file {path}")
    grid = getattr(module, "GRID", None)
    if not grid or isinstance(grid, (str, Mapping)) or not callable(
        getattr(module, "get_config", None)
    ):
        raise ConfigError(
            f"experiment file {path} defines no grid: it needs GRID, a non-empty sequence of "
            "dict(point=..., row=..., overrides={...}), and get_config(preset)"
        )
    _check_rows(path, grid)
    _LOADED[key] = module
    return module


def experiment_config(experiment: str, preset: str) -> ml_collections.ConfigDict:
    """A fresh copy of the config every row of `experiment` starts from: its file's
    `get_config(preset)`; anything that call gets wrong is a one-line `ConfigError`."""
    module = load_experiment(experiment)
    return call_get_config(module.__file__, module.get_config, preset,
                           what=f"experiment {experiment}'s get_config({preset!r})")


# One part of a point id (a folder name): no empty part, no '.' or '..', nothing a file system
# reads otherwise.
POINT_ID = re.compile(r"(?!\.{1,2}$)[A-Za-z0-9_.\-]+")


# The keys of a GRID row (the module docstring); `objective` may be left out.
ROW_KEYS = ("point", "row", "objective", "overrides")


def _check_rows(path: Path, grid: Sequence[Any]) -> None:
    """Each GRID row a dict with a `point` id (a relative folder path of `POINT_ID` parts,
    unique ignoring case: it names the row's folders and records) and a `row` label (strings;
    unique with the row's `objective`: the report's row), and `overrides`, a dict; no other
    key (a misspelt `objective=` lost the row's label without a word); else a one-line
    `ConfigError`."""
    seen, rows = set(), {}
    for index, row in enumerate(grid):
        where = f"experiment file {path}: GRID[{index}]"
        if not isinstance(row, Mapping):
            raise ConfigError(f"{where} is {type(row).__name__}, not a dict(point=..., row=..., "
                              "overrides={...})")
        unknown = sorted(set(row) - set(ROW_KEYS), key=str)
        if unknown:
            raise ConfigError(f"{where} has {', '.join(map(repr, unknown))}, not a row key; a "
                              f"row has {', '.join(ROW_KEYS)}")
        for field in ("point", "row"):
            if not isinstance(row.get(field), str) or not row[field]:
                raise ConfigError(f"{where} needs {field}=, a non-empty string; it has "
                                  f"{row.get(field)!r}")
        if not isinstance(row.get("overrides"), Mapping):
            raise ConfigError(f"{where} ({row['point']!r}) needs overrides=, a dict of dotted "
                              f"config fields (may be empty); it has {row.get('overrides')!r}")
        if not all(POINT_ID.fullmatch(part) for part in row["point"].split("/")):
            raise ConfigError(f"{where} has point {row['point']!r}: a point id names its folder "
                              "under the workdir's points/, so it must be parts of letters, "
                              "digits, '_', '-' and '.' (not '.' or '..' alone) joined by '/'")
        point = row["point"].casefold()
        if point in seen:
            raise ConfigError(f"{where} repeats point {row['point']!r} (ignoring case): a point "
                              "id names its folders and records, so each row needs its own")
        nested = next((other for other in seen if point.startswith(other + "/")
                       or other.startswith(point + "/")), None)
        if nested is not None:
            raise ConfigError(f"{where} has point {row['point']!r}, whose folder would hold or "
                              f"lie in point {nested!r}'s: give the rows ids of their own")
        seen.add(point)
        label = (row["row"], row.get("objective"))  # what the report makes one row of
        if label in rows:
            raise ConfigError(f"{where} ({row['point']!r}) has the row label and objective of "
                              f"point {rows[label]!r}, {label}: the report would make one row "
                              "of both; give each its own row label")
        rows[label] = row["point"]


def computed_fields(config: ml_collections.ConfigDict | dict[str, Any]) -> dict[str, Any]:
    """What a run computes, as JSON data: the config (or a config as JSON data, e.g. one saved
    with checkpoints) less its `sweep` section (the seeds, tasks and progress setting of the
    whole sweep, which a user may extend and resume), the objective fields its objective does
    not read and the held-out evaluation's fields."""
    plain = (copy.deepcopy(config) if isinstance(config, dict) else config_as_json(config))
    plain.pop("sweep", None)
    # A field added later hashes as before it existed where it acts as things did then (its
    # value in effect is the one its absence means), so that the records of sweeps run before
    # still match.
    acting = acting_added_fields(flat_fields(plain))
    for field in ADDED_FIELDS.keys() - acting.keys():
        section, name = field.split(".")
        plain[section].pop(name, None)
    plain["objective"] = drop_unread_objective_fields(plain["objective"])
    # The held-out evaluation observes a run and changes none of its results
    # (`t5x_lite.held_out`), so switching it on resumes a sweep run without it.
    for name in OBSERVING_FIELDS:
        plain["train"].pop(name.removeprefix("train."), None)
    return plain


def config_hash(config: ml_collections.ConfigDict) -> str:
    """A short stable hash of what a run computes (`computed_fields`), so equal runs have
    equal hashes."""
    plain = computed_fields(config)
    return hashlib.sha256(json.dumps(plain, sort_keys=True).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# Expansion


# The splits a sweep reads of each task: fine-tuning trains on "train" and scores "validation"
# (`finetune.finetune`).
SWEEP_SPLITS = ("train", "validation")


def finetune_runs(task_names: Sequence[str], glue_as_one_task: bool
                  ) -> tuple[tuple[str, ...], ...]:
    """The fine-tuning runs a sweep point makes of `task_names` (`sweep.tasks`), in their
    order: each task alone, except that with `glue_as_one_task` the GLUE tasks
    (`tasks.is_glue`) are one run, at the place of the first. That is the paper's protocol
    (section 2.3): "For simplicity, when fine-tuning we treat all of the tasks in the GLUE
    benchmark [...] as a single task by concatenating all of the constituent data sets": one
    run on their mixture (`finetune.mixing_limit`, 2^19 by default, caps no GLUE task, so the
    mixture is examples-proportional, a concatenation), validated on each task, each task's
    best validation score reported."""
    from t5x_lite.data import tasks

    glue = tuple(name for name in task_names if glue_as_one_task and tasks.is_glue(name))
    runs: list[tuple[str, ...]] = []
    for name in task_names:
        if name not in glue:
            runs.append((name,))
        elif name == glue[0]:
            runs.append(glue)
    return tuple(runs)


def point_finetune_runs(config: ml_collections.ConfigDict) -> tuple[tuple[str, ...], ...]:
    """The fine-tuning runs a grid point of `config` makes (`finetune_runs` of its
    `sweep.tasks`), each without the tasks its architecture cannot fine-tune
    (`evaluation.not_applicable`: they are recorded as such, not run); a run left with none
    goes."""
    from t5x_lite import evaluation
    from t5x_lite.data import tasks

    sweep, arch = config.sweep, config.model.arch
    runs = (tuple(name for name in run if not evaluation.not_applicable(arch, tasks.TASKS[name]))
            for run in finetune_runs(sweep.tasks, sweep.glue_as_one_task))
    return tuple(run for run in runs if run)


def require_sweep_splits(task_names: Sequence[str]) -> None:
    """Raise a one-line `ConfigError` naming the first of `task_names` that is not a
    registered task, or that lacks one of `SWEEP_SPLITS` (e.g. glue_mnli_matched, which holds
    MNLI's validation_matched only), with its splits."""
    from t5x_lite.data import tasks

    for name in task_names:
        splits = tasks.get_task(name, "sweep.tasks").splits
        missing = [split for split in SWEEP_SPLITS if split not in splits]
        if missing:
            raise ConfigError(
                f"sweep.tasks has task {name!r} without the {' and '.join(missing)} split a "
                f"sweep reads (it fine-tunes on train and scores validation); its splits: "
                f"{', '.join(splits)}")


def _validate(config: ml_collections.ConfigDict, where: str) -> None:
    """Every check that can run before training, with `where` (the grid point) in the message: the
    typed settings (`Settings.from_config`: every section, the sweep's included), the batch split
    over processes, the objective against the architecture, each task's splits and, for a local
    task, its data.data_root, that a zero-shot sweep has a task to score zero-shot, that the
    architecture can decode as `finetune.decode` says and that the pre-training corpus exists."""
    from t5x_lite import evaluation, finetune, zero_shot
    from t5x_lite.data import pipeline, tasks

    try:
        settings = Settings.from_config(config)
        require_trainable(settings.model)
        partitioning.validate_process_split(settings.train.batch_size, "train.batch_size")
        partitioning.validate_process_split(settings.finetune.batch_size,
                                            "finetune.batch_size")
        architectures.get(settings.model.arch).require_objective(settings.objective.name)
        require_sweep_splits(settings.sweep.tasks)
        tasks.require_data_root(settings.sweep.tasks, settings.data.data_root, "sweep.tasks")
        if settings.sweep.zero_shot and all(zero_shot.not_applicable(tasks.TASKS[name])
                                            for name in settings.sweep.tasks):
            raise ConfigError(
                f"sweep.zero_shot=True needs a task with label options (a classification task, "
                f"e.g. builtin_module); sweep.tasks={list(settings.sweep.tasks)} has none")
        # Each fine-tuning run the point makes, as it will read its config
        # (finetune.task_lengths: at its tasks' own targets length).
        for run in point_finetune_runs(config):
            run_settings = Finetune.from_config(evaluation.with_task_lengths(
                config, [tasks.TASKS[name] for name in run]).finetune)
            try:
                evaluation.require_slot_decoding(settings.model.arch, run_settings)
            except ConfigError as error:
                raise ConfigError(f"fine-tuning on {' + '.join(run)}: {error}") from None
        # The point fine-tunes from its own pre-training, whose config is this one.
        finetune.require_optimizer_state_source(config, config_as_json(config))
        if settings.data.vocab and not os.path.isfile(settings.data.vocab):
            raise ConfigError(f"data.vocab={settings.data.vocab!r} is not a file; give a "
                              "SentencePiece .model path, or '' to train one on data.corpus")
        # A missing corpus would fail every point when it runs; it stops the sweep here.
        pipeline.describe_corpus(config)
    except ConfigError as error:
        raise ConfigError(f"{where}: {error}") from None


def _layout_group(config: ml_collections.ConfigDict, matched: bool
                  ) -> tuple[str, int, int, tuple, tuple]:
    """What `objectives.layout_for` needs besides the objectives (the first three); under a
    matched budget (`matched`), the objective's own lengths (`objectives.objective_lengths`),
    else (); and a ul2 point's mixture (empty for other objectives): points agreeing on it
    share a layout (and, with equal model and train settings, one compiled step). A layout
    holds one mixture (`BatchLayout.denoisers`), so each mixture of a grid (e.g.
    experiments/ul2.py's R, S and X only) gets a layout of its own."""
    model, objective = config.model, config.objective
    # A row's own objective.targets_length widens its targets beyond its objective's lengths.
    own = ((*objectives.objective_lengths(objective), objective.targets_length) if matched
           else ())
    mixture = tuple(map(tuple, objective.ul2_denoisers)) if objective.name == "ul2" else ()
    family = architectures.get(model.arch).family
    return family, model.vocab_size, model.num_sentinels, own, mixture


def _shared_layouts(groups: Mapping[tuple, Sequence[Any]]) -> dict[tuple, objectives.BatchLayout]:
    """`_layout_group` key -> the layout of its points' objective configs (`layout_for`, which
    validates each). The layouts of one family, vocabulary and (under a matched budget) own
    lengths, several only where ul2 points differ in their mixture, get the longest raw,
    inputs and targets lengths of them all, so those points train on rows of one size."""
    layouts = {key: objectives.layout_for(objs, *key[:3]) for key, objs in groups.items()}
    shared = {}
    for key, layout in layouts.items():
        family = [other for other_key, other in layouts.items() if other_key[:4] == key[:4]]
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
        if kind == "steps":  # it would be ignored without a word
            raise ConfigError(
                f"sweep.budget_reference={reference!r} is read only by a matched budget: set "
                "sweep.budget to 'tokens' or 'flops', or unset it "
                "(--config.sweep.budget_reference=None: each point keeps its train.steps)")
    return kind, reference


def _match_steps(train: ml_collections.ConfigDict, steps: int) -> None:
    """Set `train.steps` to `steps`. The schedules that end at `train.steps` (linear and cosine
    decay to 0 there) get `train.warmup_steps` scaled by the same factor (rounded, at least 1
    when the configured warm-up is, at most the steps), so the warm-up keeps its share of
    training. rsqrt, `lr / sqrt(max(step, warmup_steps))`, keeps its warm-up: scaled, it moved
    the peak rate (the encoder-only point of `families` at `paper` peaked at 0.0069, not 0.01),
    and T5 fixes it ("set to 10^4 in all of our experiments") because its step counts vary;
    constant reads neither. Step cadences that do not change what is computed
    (`train.log_every`, `checkpoint.every`) stay."""
    warmup = train.warmup_steps
    if train.schedule in SCHEDULES_ENDING_AT_STEPS:
        warmup = min(max(round(warmup * steps / train.steps), 1 if warmup > 0 else 0), steps)
    train.update(steps=steps, warmup_steps=warmup)


def _refuse_rows_setting_steps(experiment: str, grid: Sequence[Mapping[str, Any]],
                               reference: str | None) -> None:
    """A matched budget derives every point's steps, so a grid row other than the reference
    that sets `train.steps` (a T5 Table 13 "4x steps" row) would lose its setting without a
    word: a one-line `ConfigError` naming the rows."""
    wanted = reference or grid[0]["point"]
    setting = [row["point"] for row in grid
               if row["point"] != wanted and "train.steps" in row["overrides"]]
    if setting:
        raise ConfigError(
            f"{experiment} rows {', '.join(map(repr, setting))} set train.steps, which a matched "
            f"sweep.budget derives for every point from the reference {wanted!r}: leave it to "
            "the budget, or run the grid with sweep.budget='steps'")


# A matched point's rounding to whole steps is warned of beyond this share of the budget.
BUDGET_TOLERANCE = 0.05


def match_budget(points: Sequence[GridPoint], kind: str,
                 reference: str | None = None) -> list[GridPoint]:
    """`points` with the steps that make each spend the reference point's pre-training budget.

    kind "tokens" or "flops": the budget is the reference's configured `train.steps` times its
    `StepCost` in that unit (the reference: the first point whose id is `reference`, None: the
    first point; its seeds cost alike). Each point gets `train.steps` = max(1, round(budget /
    its cost per step)), so it spends the budget to within half a step of its own, and
    for linear and cosine `train.warmup_steps` scaled with it (`_match_steps`); "steps" returns
    `points` unchanged.
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
        steps = max(1, round(budget.total / per_step))
        spent = steps * per_step / budget.total
        if abs(spent - 1) > BUDGET_TOLERANCE:
            warnings.warn(f"{point.experiment} point {point.point!r} spends "
                          f"{spent:.2f}x the sweep.budget={kind!r} "
                          f"budget in its {steps} steps (each {per_step:.3g}, the budget "
                          f"{budget.total:.3g}): give the reference more train.steps to match "
                          "it closer", stacklevel=2)
        _match_steps(config.train, steps)
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
    base = experiment_config(experiment, preset)
    require_override_list(overrides)
    return [item for text in overrides for item in parse_overrides(base, [text]).items()]


def _check_overrides_of_row_fields(experiment: str, rows: Sequence[Mapping[str, Any]],
                                   user: Mapping[str, Any]) -> None:
    """A row's own overrides win over the user's (the grid stays the grid), so a user
    override of a field that every row sets would be silently dropped: a one-line
    `ConfigError` naming the field and the rows' values. One that only some rows set reaches
    the others only: a warning names the rows that keep their own value."""
    for field, value in user.items():
        setting = [row for row in rows if field in row["overrides"]]
        if not setting:
            continue
        if len(setting) == len(rows):
            values = sorted({repr(row["overrides"][field]) for row in setting})
            raise ConfigError(
                f"{field}={value!r} would change no point of {experiment}: every row sets "
                f"{field} itself ({', '.join(values)}); drop the override, or run an "
                "experiment file whose rows set it (experiments/README.md, 'Writing an "
                "experiment')")
        warnings.warn(
            f"{field}={value!r} applies only to the points of {experiment} that do not set "
            f"{field} themselves; {', '.join(row['point'] for row in setting)} keep their own",
            stacklevel=3)


def expand(experiment: str, preset: str, overrides: Sequence[str] = ()) -> list[GridPoint]:
    """The grid points of `experiment` under `preset`, in the paper's row order, each seed of
    a row after the other; every config is validated (before anything runs: `_validate`, so
    an unknown task, a task without a train or validation split or a missing pre-training
    corpus is a `ConfigError` naming it), and every row of an experiment named after a paper
    table must be one of that table's rows. Under `sweep.budget` "tokens" or "flops" each
    point's `train.steps` (and warm-up) are derived from the reference's budget
    (`match_budget`); a `sweep.budget` or `sweep.budget_reference` that is not allowed is a
    one-line `ConfigError` naming the field and the allowed values, before any point's config
    is validated."""
    from t5x_lite import paper_results

    module = load_experiment(experiment)
    paper_results.check_grid(Path(experiment).stem, module.GRID)
    if preset not in presets.PRESETS:
        raise ConfigError(
            f"preset={preset!r} does not exist; choose one of {', '.join(presets.PRESETS)}")
    user = dict(user_overrides(experiment, preset, overrides))
    if "train.seed" in user:  # each point's seed is one of sweep.seeds, set below
        raise ConfigError(f"train.seed={user['train.seed']!r} would change no point: a sweep "
                          "runs each point once per seed of sweep.seeds; pass "
                          f"--config.sweep.seeds=\"({user['train.seed']!r},)\" instead "
                          "(preview: --seed)")
    _check_overrides_of_row_fields(Path(experiment).stem, module.GRID, user)
    rows, budget = [], None
    for index, row in enumerate(module.GRID):
        config = experiment_config(experiment, preset)
        apply_overrides(config, user)
        try:
            apply_overrides(config, row["overrides"])
        except ConfigError as error:  # which row of which file, among maybe dozens
            raise ConfigError(f"experiment file {module.__file__}: GRID[{index}] "
                              f"({row['point']!r}): {error}") from None
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
    matched = budget[0] != "steps"
    groups: dict[tuple, list] = {}
    for _, config in rows:
        groups.setdefault(_layout_group(config, matched), []).append(config.objective)
    layouts = _shared_layouts(groups)
    name = Path(experiment).stem
    points = [
        GridPoint(experiment=name, source=experiment, preset=preset, point=row["point"],
                  row=row["row"], objective=row.get("objective"), config=config,
                  seed=config.train.seed, index=index, num_points=len(rows),
                  num_rows=len(module.GRID),
                  layout=layouts[_layout_group(config, matched)])
        for index, (row, config) in enumerate(rows)
    ]
    if matched:
        _refuse_rows_setting_steps(name, module.GRID, budget[1])
    points = match_budget(points, *budget)
    for rows_alike in identical_rows(points):
        warnings.warn(_identical_rows_message(name, preset, rows_alike), stacklevel=2)
    return points


def _computation(point: GridPoint) -> str:
    """What a point's runs compute, as JSON: its `computed_fields` (what `config_hash`
    hashes), but the objective fields its objective reads as that objective sees them
    (`Objective.effective`)."""
    plain = computed_fields(point.config)
    objective = plain.pop("objective")
    seen = objective_registry.get(objective["name"]).effective(objective)
    plain["objective"] = {**{field: value for field, value in objective.items()
                             if field not in objective_registry.READABLE_FIELDS}, "seen": seen}
    return json.dumps(plain, sort_keys=True)


def identical_rows(points: Sequence[GridPoint]) -> list[list[GridPoint]]:
    """The groups of a grid's rows (each by its first seed's point) that compute the same
    runs, so their records will be equal seed by seed: their configs differ only in objective
    settings that their objective does not read or sees alike. E.g. table7 at 32 inputs:
    span_corruption makes 5 noise tokens in 2 spans of each 34-token chunk for span lengths 2
    and 3 alike (`objective_layout.span_corruption_effective_settings`)."""
    first_seeds: dict[str, GridPoint] = {}
    for point in points:
        first_seeds.setdefault(point.point, point)
    groups: dict[str, list[GridPoint]] = {}
    for point in first_seeds.values():
        groups.setdefault(_computation(point), []).append(point)
    return [group for group in groups.values() if len(group) > 1]


def _identical_rows_message(experiment: str, preset: str, group: Sequence[GridPoint]) -> str:
    """One line for a group of `identical_rows`: which rows, where they differ, and why that
    changes nothing."""
    objective = group[0].config.objective
    record = objective_registry.get(objective.name)
    differing = [field for field in objective_registry.READABLE_FIELDS
                 if len({point.config.objective[field] for point in group}) > 1]
    values = "; ".join(f"{field} {', '.join(str(p.config.objective[field]) for p in group)}"
                       for field in differing)
    if not differing:
        why = "their configs are the same"
    elif not set(differing) & set(record.reads):
        why = (f"they differ only in {values}, which {objective.name} does not read (its "
               f"record's reads={record.reads!r}: an objective of one's own that reads them "
               "must name them there)")
    else:
        seen = ", ".join(f"{key}={value}" for key, value in record.effective(objective).items())
        why = (f"they differ only in {values}, which {objective.name} sees alike at "
               f"objective.inputs_length={objective.inputs_length}: {seen}")
    named = [f"{point.row!r} ({point.point})" for point in group]
    rows = f"{', '.join(named[:-1])} and {named[-1]}"
    return f"{experiment} --preset {preset}: rows {rows} will give the same records: {why}"
