"""What a run's folder says of the config that made it: the saved `config.json` and
`batch_layout.json` beside its checkpoints, and how a config compares with a saved one.

A resume (`checkpointing.Checkpointer`), a fine-tuning's source check (`finetune`), a sweep's
judgement of its workdir (`sweep_workdir`), `eval`'s model settings (`evaluation`) and the
config hash of a grid point (`grid.config_hash`) all read these facts: which fields a resume
must share (`RESUME_FIELDS`), which only observe (`OBSERVING_FIELDS`) or leave the parameters
unchanged (`PARAMETER_NEUTRAL_FIELDS`), which were added after configs had been saved without
them (`ADDED_FIELDS`, read through `in_effect`), and the differences between two configs
(`config_differences`). No JAX or orbax here: the checkpoints themselves are
`t5x_lite.checkpointing`'s.
"""
from __future__ import annotations

import json
import os
from typing import Any, Sequence

import ml_collections
from etils import epath

from t5x_lite.config import ConfigError, drop_unread_objective_fields, flat_fields
from t5x_lite.objective_registry import REVISION_FIELD
from t5x_lite.optim import has_decay_stage

# The folder of a run's workdir that holds its checkpoints and CONFIG_FILE (`run_setup` opens
# it there; `checkpointing` writes it).
CHECKPOINTS_DIR = "checkpoints"
CONFIG_FILE = "config.json"
# In a fine-tuning workdir: the pre-training checkpoints it started from, {"path", "step",
# "save_began_ns", "restored_step"}: the source's newest step when it began and
# `save_began_ns` of it (absent in older records), which a resume compares with the source's
# now, and the step its parameters came from (older where the newest was unreadable; absent in
# older records); from parameters given (`--init_from_hf`) or random ones, {"path": null,
# "parameters": "given" | "random"}. Pre-training refuses a workdir holding one (`train`).
FINETUNE_SOURCE_FILE = "init_from.json"
# Beside CONFIG_FILE in a pre-training run's folder: `objective_layout.layout_record`.
BATCH_LAYOUT_FILE = "batch_layout.json"

# Config fields a resumed run must share with the run that wrote the checkpoints: they fix the
# shapes of the saved state (model, optimizer), the meaning of the token ids (vocabulary,
# corpus) and which examples the step-indexed input pipeline feeds (objective, lengths, batch
# size, seed). Anything else (steps, schedule, learning rate, mesh, logging) may change.
RESUME_FIELDS = (
    "model", "objective", "train.optimizer", "train.batch_size", "train.seed",
    "data.corpus", "data.vocab",
    # Parameter-neutral, but a run that began without dropping the attention weights (all runs
    # before 2026-12-05) resumes only as it began (`in_effect`: not where it drops nothing).
    "model.attention_dropout",
)
# Fields that change what a run measures, not what it computes: left out of `grid.config_hash`
# and of the settings a resume says it changed.
OBSERVING_FIELDS = ("train.eval_every", "train.eval_batches")
# Fields inside `model` that leave the parameters unchanged: the saved float32 parameters
# restore under any compute dtype, attention kernel or dropout.
PARAMETER_NEUTRAL_FIELDS = ("model.dtype", "model.attention_impl", "model.dropout_rate",
                            "model.attention_dropout", "model.remat")
_ABSENT = "<absent>"
# Fields added after checkpoints and sweep records had been written without them, each with the
# value that means the behaviour they were made with: a saved config lacking one has that value
# (`config_differences`), and a config with that value hashes as before the field existed
# (`grid.config_hash`). Both read a field through `in_effect` first.
ADDED_FIELDS = {
    "model.num_decoder_layers": None, "model.embedding_rows": None,
    "model.attention_dropout": False,  # 2026-12-05: the attention weights were never dropped
    "finetune.eval_selection": "first",  # 2026-12-05: eval_examples kept a split's first N
    "finetune.optimizer_state": "fresh",  # 2026-12-05: fine-tuning began a new optimiser state
    "finetune.task_lengths": False,  # 2026-12-05: every task was cut to finetune.targets_length
    "finetune.mode_token": None,  # 2026-12-06: no task input began with UL2's paradigm token
}


def in_effect(flat: dict[str, Any], by: dict[str, Any] | None = None) -> dict[str, Any]:
    """A flat config (`flat_fields`) with each added field as it acts in the config `by` (flat
    by default): dropout on the attention weights is off without dropout (`model.dropout_rate`
    0), and no selection is made of a split kept whole (`finetune.eval_examples` None); a field
    with no effect reads as the value its absence means, so that it changes no hash. A saved
    config is read as its fields act in the current one (`config_differences`): a resume may
    change the dropout rate, which switches the attention dropout on or off with it."""
    flat, by = dict(flat), flat if by is None else by
    if "model.attention_dropout" in flat and not by.get("model.dropout_rate"):
        flat["model.attention_dropout"] = False
    if "finetune.eval_selection" in flat and by.get("finetune.eval_examples") is None:
        flat["finetune.eval_selection"] = ADDED_FIELDS["finetune.eval_selection"]
    return flat


def acting_added_fields(flat: dict[str, Any]) -> dict[str, Any]:
    """{field: its value in effect} of the `ADDED_FIELDS` that the flat config `flat` has and
    that act otherwise than their absence did: what a config hashes by beyond the fields a
    record made before them had (`grid.config_hash`, `sweep_workdir.as_it_began`)."""
    effect = in_effect(flat)
    return {field: effect[field] for field, absent in ADDED_FIELDS.items()
            if field in effect and effect[field] != absent}


def config_as_json(config: ml_collections.ConfigDict) -> dict[str, Any]:
    """The config as plain JSON data (tuples become lists), as it is stored on disk and
    compared with a saved one (`config_differences`)."""
    return json.loads(config.to_json_best_effort(sort_keys=True))


def config_differences(
    saved: dict[str, Any], current: dict[str, Any], fields: Sequence[str]
) -> list[str]:
    """One line 'field: saved ... != now ...' per differing field under one of `fields`.

    `saved` and `current` are configs as JSON data; `fields` are dotted names of sections
    ("model") or single fields ("train.seed"). Parameter-neutral model fields are ignored unless
    named themselves (`RESUME_FIELDS` names `model.attention_dropout`); one of `ADDED_FIELDS`
    that `saved` lacks has the value its absence means there, and both are read `in_effect` as
    they act in `current`.
    """
    saved, current = _as_compared(saved, current)
    differences = _difference_lines(saved, current, sorted(
        key for key in saved.keys() | current.keys() if _compared(key, fields)))
    if _compared("train.optimizer", fields) and _decay_stage(saved) != _decay_stage(current):
        differences.append(
            f"train.weight_decay: saved {saved.get('train.weight_decay')!r} != now "
            f"{current.get('train.weight_decay')!r} (Adafactor's state holds a weight-decay "
            "stage only when it is non-zero: a resume may change it, not switch it on or off)")
    return differences


def _difference_lines(saved: dict[str, Any], current: dict[str, Any],
                      keys: Sequence[str]) -> list[str]:
    """One line 'key: saved ... != now ...' per key of `keys` whose values differ (one side may
    lack it)."""
    return [f"{key}: saved {saved.get(key, _ABSENT)!r} != now {current.get(key, _ABSENT)!r}"
            for key in keys if saved.get(key, _ABSENT) != current.get(key, _ABSENT)]


def _compared(key: str, fields: Sequence[str]) -> bool:
    """Whether `config_differences` over `fields` compares the flat field `key`."""
    under = any(key == field or key.startswith(field + ".") for field in fields)
    return under and (key not in PARAMETER_NEUTRAL_FIELDS or key in fields)


def _as_compared(saved: dict[str, Any], current: dict[str, Any]) -> tuple[dict, dict]:
    """Two configs (JSON data) as `config_differences` compares them: flat fields, less the
    objective's unread ones, an added field `saved` lacks at the value its absence means, and
    both read `in_effect` as they act in `current`."""
    saved, current = (flat_fields({**config, "objective": drop_unread_objective_fields(
        config.get("objective", {}))}) for config in (saved, current))
    for key, absent in ADDED_FIELDS.items():
        if key in current:
            saved.setdefault(key, absent)
    return in_effect(saved, by=current), in_effect(current)


def overrides_as_begun(saved: dict[str, Any], current: dict[str, Any],
                       fields: Sequence[str]) -> list[str]:
    """'--config.F=V' for each added field (`ADDED_FIELDS`) that `config_differences` over
    `fields` compares and that acts in `current` otherwise than in `saved`, where it has the
    value its absence means: a run saved before the field existed resumes as it began with
    them (`Checkpointer`'s refusal names them)."""
    saved, current = _as_compared(saved, current)
    return [f"--config.{key}={absent}" for key, absent in ADDED_FIELDS.items()
            if _compared(key, fields) and key in current
            and saved.get(key) == absent != current[key]]


def _decay_stage(flat: dict[str, Any]) -> bool:
    """Whether a config (flat fields) has a weight-decay stage in its optimizer state."""
    return has_decay_stage(flat.get("train.optimizer"), flat.get("train.weight_decay"))


def read_saved_config(directory: str | os.PathLike) -> dict[str, Any] | None:
    """The config saved with the checkpoints in `directory` (its `CONFIG_FILE`, as JSON), or
    None when it has none; a damaged file, or one without a model and a data section, is a
    one-line `ConfigError` naming it."""
    path = epath.Path(directory) / CONFIG_FILE
    if not path.exists():
        return None
    try:
        saved = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path} is damaged ({error}); it is not the config a t5x_lite run "
                          "saved") from None
    missing = [section for section in ("model", "data")
               if not isinstance(saved, dict) or not isinstance(saved.get(section), dict)]
    if missing:
        raise ConfigError(f"{path} has no {' or '.join(missing)} section; it is not the config "
                          "a t5x_lite run saved")
    return saved


def saved_batch_layout_differences(directory: str | os.PathLike, batch_layout: dict[str, Any],
                                   fields: Sequence[str] | None = None) -> list[str]:
    """One line 'field: saved ... != now ...' per field in which the batch layout record saved
    with the pre-training checkpoints in `directory` (its BATCH_LAYOUT_FILE) differs from
    `batch_layout` (`objective_layout.layout_record`), among `fields` (None: all); [] when it
    has none (checkpoints saved before 2026-12-05, or of a fine-tuning run). A field the saved
    record lacks is not compared (it was saved before that field was recorded), but for the
    objective's revision, recorded since 70cd6ec: a record without it reads as revision 1, as a
    sweep's records do (so a prefix_lm pre-training made before its revision 2's document
    segments is refused, not resumed on them; a ul2 or sentence one made between their
    revision 2 and 70cd6ec is refused too, though it read the current definition). A damaged
    file is a one-line `ConfigError` naming it."""
    path = epath.Path(directory) / BATCH_LAYOUT_FILE
    if not path.exists():
        return []
    try:
        saved = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path} is damaged ({error}); delete it to resume without checking "
                          "what the checkpoints' examples read") from None
    if REVISION_FIELD in batch_layout:
        saved.setdefault(REVISION_FIELD, 1)
    return _difference_lines(saved, batch_layout, sorted(
        key for key in saved if fields is None or key in fields))
