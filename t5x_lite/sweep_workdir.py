"""Which sweep a workdir holds: its identity in `sweep.json` (experiment, preset and the
overrides that change what the points compute), and the checks a sweep makes before it runs
anything there: the workdir is this sweep's (`claim_workdir`), its records and the folders of
the points to run were made by the points' current configs (`require_current`,
`require_current_folders`), and every process of a multi-process sweep sees
the same finished points (`require_one_view_of_the_workdir`).
"""
from __future__ import annotations

import contextlib
import copy
import fcntl
import hashlib
import itertools
import json
import sys
from pathlib import Path
from typing import Any, Iterator, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils

from t5x_lite import architectures, objective_registry, objectives, run_folders
from t5x_lite.checkpointing import newest_step
from t5x_lite.config import ConfigError, flat_fields
from t5x_lite.errors import PointBusy
from t5x_lite.grid import (OBSERVING_FIELDS, GridPoint, computed_fields, config_hash,
                           user_overrides)
from t5x_lite.results import is_writer, run_key, write_json
from t5x_lite.run_folders import SWEEP_FILE
from t5x_lite.saved_config import (ADDED_FIELDS, CHECKPOINTS_DIR, PARAMETER_NEUTRAL_FIELDS,
                                   RESUME_FIELDS,
                                   acting_added_fields, config_as_json, config_differences,
                                   read_saved_config, saved_batch_layout_differences)

_NOT_ADDED = object()  # a field not in ADDED_FIELDS (whose values may be None)


def without_sweep_settings(identity: dict[str, Any]) -> dict[str, Any]:
    """`identity` less its `sweep.*` overrides (seeds, tasks, progress): a sweep extended by
    seeds or tasks is the same sweep, whose finished records resume (each record is keyed by
    point, seed and task and checked by its config hash, which leaves out the sweep section).
    `sweep.budget` and `sweep.budget_reference` stay: they change what the points compute
    (`sweep.glue_as_one_task` does too: the identity holds its value, `sweep_identity`);
    so does `sweep.zero_shot=True` (what the records hold; False is the default, the same
    sweep as none). The held-out evaluation's fields (`grid.OBSERVING_FIELDS`) go too: they
    change what a point measures, not what it computes. So does an override that sets a field
    added later to the value its absence means (`saved_config.ADDED_FIELDS`): it says how a
    workdir begun before the field existed was run, which resumes with it or without it (its
    points' config hashes decide). And `train.seed`, which changed no point (each point's seed
    is one of sweep.seeds; refused since 2026-12-05): a workdir begun with it resumes without
    it."""
    def kept(field: str, value: Any) -> bool:
        if field == "train.seed":  # refused since 2026-12-05; before, it changed no point
            return False
        if field == "sweep.zero_shot":
            return value is not False
        if field in OBSERVING_FIELDS or ADDED_FIELDS.get(field, _NOT_ADDED) == value:
            return False
        return not field.startswith("sweep.") or field.startswith("sweep.budget")

    return {**identity, "overrides": [item for item in identity["overrides"] if kept(*item)]}


ZERO_SHOT_ON = ["sweep.zero_shot", True]  # the override, as a workdir's identity holds it
# The identity's key for `sweep.glue_as_one_task`; a sweep.json written before it existed
# fine-tuned every task alone (False).
GLUE_AS_ONE_TASK = "glue_as_one_task"


def sweep_identity(experiment: str, points: Sequence[GridPoint],
                   overrides: Sequence[str]) -> dict[str, Any]:
    """What `sweep.json` holds for `expand(experiment, preset, overrides)`'s `points`: the
    experiment's name, the preset, the user's overrides that reach the points as they act
    (`grid.user_overrides`: the last value given for each field, in the fields' order, so
    that the same sweep given its overrides in another order or repeated resumes; an override
    that sets a field to the value it has is kept: a value tied to another field by the
    config, e.g. the cpu preset's data.corpus to data.data_root, is no longer tied once set)
    and whether GLUE's tasks are fine-tuned as one (`sweep.glue_as_one_task`, the value,
    however it was set: it changes what the points compute, which their config hash leaves
    out with the sweep section), as JSON reads them back, so it compares equal to the saved
    copy."""
    preset = points[0].preset
    return json.loads(json.dumps({
        "experiment": points[0].experiment, "preset": preset,
        "overrides": _in_field_order(user_overrides(experiment, preset, overrides)),
        GLUE_AS_ONE_TASK: points[0].config.sweep.glue_as_one_task}))


def _in_field_order(overrides: Any) -> list[list]:
    """(field, value) overrides as a list of [field, value], the last value of each field, in
    the fields' order."""
    return [[field, value] for field, value in sorted(dict(map(tuple, overrides)).items())]


def check_workdir(workdir: Path, identity: dict[str, Any]) -> str:
    """Whether the workdir can hold this sweep, writing nothing: "new" (no sweep there yet),
    "same" (this sweep, to resume or extend by seeds or tasks) or "adds zero-shot" (a sweep
    without the zero-shot stage, given it now; see `t5x_lite.sweep`). A workdir of a different
    sweep (other experiment, preset or overrides) is a `ConfigError` naming the differences."""
    run_folders.require_kind(workdir, run_folders.SWEEP)
    path = workdir / SWEEP_FILE
    if not path.exists():
        return "new"
    identity = without_sweep_settings(identity)
    saved = {GLUE_AS_ONE_TASK: False, **without_sweep_settings(json.loads(path.read_text()))}
    # A workdir claimed before the overrides were kept as they act holds them as given.
    identity, saved = ({**side, "overrides": _in_field_order(side["overrides"])}
                       for side in (identity, saved))
    without_stage = {**identity, "overrides": [
        item for item in identity["overrides"] if item != ZERO_SHOT_ON]}
    if without_stage != identity and saved == without_stage:
        return "adds zero-shot"
    if saved != identity:
        differences = ", ".join(
            _override_differences(saved.get(key) or [], identity[key]) if key == "overrides"
            else f"{key}: {saved.get(key)!r} there, {identity[key]!r} now"
            for key in identity if saved.get(key) != identity[key])
        how = ("; pass --config.sweep.glue_as_one_task="
               f"{saved[GLUE_AS_ONE_TASK]} to resume it as it began"
               if saved[GLUE_AS_ONE_TASK] != identity[GLUE_AS_ONE_TASK] else "")
        raise ConfigError(
            f"workdir {workdir} holds a different sweep ({differences}); use another "
            f"--workdir, or the same experiment, preset and overrides to resume it{how}")
    return "same"


def _override_differences(there: Sequence[Sequence[Any]], now: Sequence[Sequence[Any]]) -> str:
    """The overrides (field, value) pairs of two sweep identities that differ, field by field:
    'overrides: train.steps 5 there, 6 now; model.mlp unset there, 'gated-gelu' now'."""
    there, now = dict(map(tuple, there)), dict(map(tuple, now))
    unset = object()
    fields = sorted(field for field in there.keys() | now.keys()
                    if there.get(field, unset) != now.get(field, unset))
    return "overrides: " + "; ".join(
        f"{field} {'unset' if field not in there else repr(there[field])} there, "
        f"{'unset' if field not in now else repr(now[field])} now" for field in fields)


def claim_workdir(workdir: Path, identity: dict[str, Any]) -> None:
    """Record which sweep the workdir belongs to (`check_workdir` first): a new workdir, or
    one whose sweep is given the zero-shot stage now, which becomes the zero-shot sweep's."""
    state = check_workdir(workdir, identity)
    if state == "adds zero-shot":
        print(f"{workdir} was swept without the zero-shot stage: its finished points will be "
              "scored zero-shot from their pre-trained checkpoints, and the workdir is a "
              "zero-shot sweep from now on", file=sys.stderr, flush=True)
    if state != "same":
        write_json(workdir / SWEEP_FILE, without_sweep_settings(identity))


def require_current(records: Sequence[dict], points: Sequence[GridPoint], path: Path) -> None:
    """Refuse records of a point whose config has changed since they were written (e.g. a grid
    row moved to another objective) or whose objective now reads other raw tokens per example
    (`GridPoint.pretrain_tokens`) or is defined otherwise (`GridPoint.objective_revision`), and
    fine-tuned records whose fine-tuning run had other tasks than the point's run of that task
    now (a GLUE task added to `sweep.tasks` of a sweep that fine-tunes GLUE's tasks as one):
    skipping them as finished would mix two experiments in one table."""
    by_key = {(p.point, p.seed): p for p in points}
    hashes = {key: config_hash(point.config) for key, point in by_key.items()}
    run_of = {key: {task: run for run in point.finetune_runs() for task in run}
              for key, point in by_key.items()}
    _require_current_hashes(records, by_key, hashes, path)
    for record in records:
        key = run_key(record)
        otherwise = _pretrained_otherwise(record, by_key.get(key))
        if otherwise:
            raise ConfigError(
                f"{path} holds a record of point {record['point']!r} (seed {record['seed']}) "
                f"whose pre-training {otherwise}; use a new --workdir, or delete that point's "
                f"lines and its folder {by_key[key].directory(path.parent)} to run it again")
        run = run_of.get(key, {}).get(record["task"])
        made = tuple(record.get("finetune_tasks", (record["task"],)))
        if record["status"] == "ok" and run is not None and made != run:
            raise ConfigError(
                f"{path} holds a record of {record['task']} for point {record['point']!r} "
                f"(seed {record['seed']}) fine-tuned with {' + '.join(made)}; sweep.tasks now "
                f"fine-tunes it with {' + '.join(run)} (sweep.glue_as_one_task): use a new "
                "--workdir, or delete that point's lines and records of "
                f"{', '.join(run)} to fine-tune them again")


def _require_current_hashes(records: Sequence[dict], by_key: dict[tuple, GridPoint],
                            hashes: dict[tuple, str], path: Path) -> None:
    """`require_current`'s check of the records' config hashes: one refusal naming every run
    (point, seed) whose records another config made, what changed in the first (from its
    pre-training's saved config, when it has one), and how to run them again; or, where the
    first was made before a default was added, the overrides that resume the sweep as it
    began. (It named the first run alone: a change to an experiment's defaults took a round of
    deletions per run.)"""
    stale = {}
    for record in records:
        key = run_key(record)
        expected = hashes.get(key)  # None: a point no longer in the grid
        if expected is not None and record.get("config_hash", expected) != expected:
            stale.setdefault(key, record["config_hash"])
    if not stale:
        return
    (key, made), workdir = next(iter(stale.items())), path.parent
    head = (f"{path} holds records of {len(stale)} of the sweep's {len(by_key)} runs made with "
            f"another config (point {key[0]!r}, seed {key[1]}: config_hash {made}, now "
            f"{hashes[key]})")
    began = as_it_began(by_key[key], made)
    if began:
        raise ConfigError(f"{head}: it was made before a default changed; pass {began} to resume "
                          "the sweep as it began")
    saved = read_saved_config(by_key[key].pretrain_directory(workdir) / CHECKPOINTS_DIR)
    now = computed_fields(by_key[key].config)
    changed = (config_differences(computed_fields(saved), now,  # each section, and the
                                  [*now, *PARAMETER_NEUTRAL_FIELDS])  # fields it would skip
               if saved else [])
    runs = ", ".join(f"{point} (seed {seed})" for point, seed in stale)
    folders = (f"its folder {by_key[key].directory(workdir)}" if len(stale) == 1 else
               f"their folders (points/<point>/seed<k> in {workdir})")
    raise ConfigError(
        f"{head}: the grid or its defaults changed since"
        + (f" ({key[0]}'s pre-training: {_first_of(changed, 3)})" if changed else "")
        + f"; use a new --workdir, or delete the lines of {runs} in {path.name} and {folders} "
        "to run them again")


# In a point's folder: the file its running process holds a lock on.
LOCK_FILE = ".lock"


@contextlib.contextmanager
def point_lock(points: Sequence[GridPoint], workdir: str | Path) -> Iterator[None]:
    """Hold an exclusive lock on each point's folder while it runs, so that two sweeps in one
    workdir (the same command started twice, or twice by a scheduler) cannot both run a point:
    they wrote one checkpoint folder at once, and both appended its records. The second gets
    `PointBusy`, naming the point, and records nothing. Released when the process ends,
    however it ends. SLURM's array tasks, each its own point, do not contend. A multi-process
    run takes none: process 0's refusal would leave the others waiting in its collectives."""
    held = []
    try:
        if jax.process_count() == 1:
            for point in points:
                folder = point.directory(workdir)
                folder.mkdir(parents=True, exist_ok=True)
                handle = open(folder / LOCK_FILE, "a")
                held.append(handle)
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise PointBusy(
                        f"point {point.point!r} (seed {point.seed}) is being run by another "
                        f"process in {workdir} (it holds {folder / LOCK_FILE}); two sweeps in "
                        "one workdir would write one checkpoint folder at once: let the other "
                        "finish, or stop it") from None
        yield
    finally:
        for handle in held:
            handle.close()  # releases the lock


def require_current_folders(points: Sequence[GridPoint], workdir: Path) -> None:
    """Refuse to run a point whose folder holds the work of another config: pre-training
    checkpoints whose `saved_config.RESUME_FIELDS` differ, or whose examples
    (`saved_config.BATCH_LAYOUT_FILE`) differ while steps are left to train, or whose
    objective's revision differs at all, or a finished task's record (`GridPoint.record_path`)
    of another config_hash, raw tokens read (`GridPoint.pretrain_tokens`) or objective
    revision. A point whose results.jsonl lines were deleted, to run it again after its grid
    row changed, is such a point: its pre-training would stop on the checkpoints (the point
    recorded as failed), and a stale task record would pass for a finished task."""
    for point in points:
        why = _stale_work(point, workdir)
        if why:
            raise ConfigError(
                f"{point.directory(workdir)} holds point {point.point!r} (seed {point.seed}) run "
                f"with another config ({why}); delete that folder to run the point again, or "
                "use a new --workdir")


def _pretrained_otherwise(record: dict, point: GridPoint | None) -> str | None:
    """How the pre-training a record of `point` (None: a point no longer in the grid) was
    made differs from the point's now, which its config hash does not see, or None: it read
    other raw text (its objective's raw tokens per example changed: the i.i.d. objectives read
    T5's inputs_length - 1 since 2026-12-05), or its objective's definition changed since
    (`objective_registry.Objective.changes`; a record from before revisions were recorded
    reads as revision 1)."""
    if point is None:
        return None
    made = record.get("pretrain_tokens")
    if made is not None and made != point.pretrain_tokens:
        return (f"read {made} raw tokens and would read {point.pretrain_tokens} now (its "
                "objective's raw tokens per example changed)")
    made = record.get(architectures.DEFINITION_FIELD)
    definition = architectures.get(point.config.model.arch).definition
    if made is not None and made != definition:
        return (f"ran model.arch={point.config.model.arch!r} as it was registered then, "
                f"'{made}', and would run '{definition}' now (its record changed)")
    revision, now = record.get(objective_registry.REVISION_FIELD, 1), point.objective_revision
    if revision == now:
        return None
    objective = objective_registry.get(point.config.objective.name)
    used = f"used revision {revision} of objective {objective.name!r}, which "
    if revision > now:  # a newer t5x_lite made it
        return (used + f"this t5x_lite knows only up to revision {now} (a newer t5x_lite made "
                "it: resume the sweep with that one)")
    return used + f"is at revision {now} now ({'; '.join(objective.changes[revision - 1:])})"


def _first_of(differences: Sequence[str], shown: int = 1) -> str:
    """The first `shown` of some differences, and how many more there are."""
    more = f", and {len(differences) - shown} more" if len(differences) > shown else ""
    return "; ".join(differences[:shown]) + more


def _stale_work(point: GridPoint, workdir: Path) -> str | None:
    """What in the point's folder another config, or another layout of its examples, made, or
    None."""
    checkpoints = point.pretrain_directory(workdir) / CHECKPOINTS_DIR
    saved = read_saved_config(checkpoints)
    if saved is not None:
        differences = config_differences(saved, config_as_json(point.config), RESUME_FIELDS)
        if differences:
            return f"its pre-training's {_first_of(differences)}"
    newest = newest_step(checkpoints)
    # A finished pre-training reads no example more (its later stages fine-tune or score it),
    # so only the definitions of the objective it trained on and of its network still matter.
    finished = newest is not None and newest >= point.config.train.steps
    differences = saved_batch_layout_differences(
        checkpoints, objectives.layout_record(point.layout, point.config.objective,
                                              point.config.model.arch),
        fields=(objective_registry.REVISION_FIELD, architectures.DEFINITION_FIELD)
        if finished else None)
    if differences:
        return f"its pre-training's examples' {_first_of(differences)}"
    expected = config_hash(point.config)
    for task in point.config.sweep.tasks:
        path = point.record_path(workdir, task)
        if path.is_file():
            saved_record = json.loads(path.read_text())
            saved_hash = saved_record.get("config_hash", expected)
            if saved_hash != expected:
                began = as_it_began(point, saved_hash)
                return (f"its {task} record's config_hash {saved_hash}, now {expected}"
                        + (f"; {began} resumes it as it began" if began else ""))
            otherwise = _pretrained_otherwise(saved_record, point)
            if otherwise:
                return f"its {task} record's pre-training {otherwise}"
    return None


def as_it_began(point: GridPoint, made_under: str) -> str:
    """The overrides ('--config.F=V ...') that set some of the fields added since
    (`ADDED_FIELDS`) which act in `point` to the values their absence means, when the point's
    config with them hashes as `made_under` (a record's `config_hash`): its record was made
    before they were added (those that came after it), and the sweep resumes as it began with
    them. The fewest such fields; '' when no choice of them does."""
    acting = list(acting_added_fields(flat_fields(config_as_json(point.config))))
    for count in range(1, len(acting) + 1):
        for fields in itertools.combinations(acting, count):
            config = copy.deepcopy(point.config)
            for field in fields:
                section, name = field.split(".")
                config[section][name] = ADDED_FIELDS[field]
            if config_hash(config) == made_under:
                return " ".join(f"--config.{field}={ADDED_FIELDS[field]}" for field in fields)
    return ""


def save_failures_as_recorded(points: Sequence[GridPoint], latest: dict[tuple, dict],
                              workdir: Path) -> None:
    """Before `points` run: make their saved task records (`GridPoint.record_path`, which a
    point reuses instead of running a task again) say of failures what results.jsonl says
    (`latest`: (point, seed, task) -> its last record). A task results.jsonl records as failed
    gets that record saved, so that a point run again for another task (one added to
    `sweep.tasks`) does not fine-tune it again only for the sweep to drop the result: a
    failure stands until its line is deleted. A failed saved record of a task results.jsonl
    no longer holds (its line deleted, to retry it) is removed, so that the task runs again.
    Only the writer process writes; the others wait for it."""
    if is_writer():
        for point in points:
            for task in point.config.sweep.tasks:
                path = point.record_path(workdir, task)
                record = latest.get((point.point, point.seed, task))
                if record is not None and record["status"] == "failed":
                    if not path.exists():
                        write_json(path, record)
                elif (record is None and path.exists()
                      and json.loads(path.read_text()).get("status") == "failed"):
                    path.unlink()
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("t5x_lite_saved_failures")


def require_one_view_of_the_workdir(todo: Sequence[GridPoint], workdir: Path) -> None:
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
