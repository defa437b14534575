"""What a workdir holds, so that each command keeps to folders of its own kind.

`train`, `finetune` and `sweep` each write a folder of one kind:
- a pre-training run: `checkpoints/` (its `config.json`, its `batch_layout.json`), metrics.jsonl;
- a fine-tuning run: the same but `batch_layout.json`, and `init_from.json`, where its
  parameters came from;
- a sweep: `sweep.json` (which sweep it is) and `results.jsonl`, its runs under `points/`.
A command given a folder of another kind would mix the two: pre-training resumed from
fine-tuned parameters, a fine-tuning whose `--restart` deletes the pre-training it was pointed
at (its refusal to resume suggested just that), a run's checkpoints among a sweep's points. So
`require_kind` refuses it in one line, before any work, `--restart` or not.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from t5x_lite.config import ConfigError
from t5x_lite.results import RESULTS_FILE
from t5x_lite.saved_config import (BATCH_LAYOUT_FILE, CHECKPOINTS_DIR, CONFIG_FILE,
                                   FINETUNE_SOURCE_FILE, read_saved_config)

SWEEP_FILE = "sweep.json"  # a sweep's identity (`sweep_workdir`)
# The `train` fields a fine-tuning run sets from its `finetune` section
# (`finetune.finetune_train_config`): in a fine-tuning run's saved config the two agree.
TRAIN_FIELDS_FROM_FINETUNE = ("optimizer", "schedule", "learning_rate", "warmup_steps",
                              "steps", "batch_size")
# What each command writes; `held_kind`'s values, and how the messages name them.
PRE_TRAINING, FINE_TUNING, SWEEP = "pre-training", "fine-tuning", "sweep"
DESCRIBED = {PRE_TRAINING: "a pre-training run", FINE_TUNING: "a fine-tuning run",
             SWEEP: "a sweep"}


def held_kind(workdir: str | os.PathLike) -> tuple[str, str] | None:
    """(kind, the file that says so) of the run `workdir` holds, or None for a folder with
    none (missing, empty, or only another tool's files). A run saved before its kind's own file
    was written (a pre-training before 2026-12-05, a fine-tuning from random or Hugging Face
    parameters before then) is told apart by its saved config: a fine-tuning's trains with its
    own `finetune` settings (`TRAIN_FIELDS_FROM_FINETUNE`)."""
    workdir = Path(workdir)
    for name in (SWEEP_FILE, RESULTS_FILE):
        if (workdir / name).exists():
            return SWEEP, name
    if (workdir / FINETUNE_SOURCE_FILE).is_file():
        return FINE_TUNING, FINETUNE_SOURCE_FILE
    checkpoints = workdir / CHECKPOINTS_DIR
    if (checkpoints / BATCH_LAYOUT_FILE).is_file():
        return PRE_TRAINING, f"{CHECKPOINTS_DIR}/{BATCH_LAYOUT_FILE}"
    try:
        saved = read_saved_config(checkpoints)
    except ConfigError:  # damaged: nothing tells its kind; resuming names the file, --restart
        return None      # deletes it, as before kinds were checked
    if saved is None:
        return None
    kind = FINE_TUNING if _trains_as_it_fine_tunes(saved) else PRE_TRAINING
    return kind, f"{CHECKPOINTS_DIR}/{CONFIG_FILE}"


def _trains_as_it_fine_tunes(saved: dict[str, Any]) -> bool:
    """Whether a saved config's `train` fields are its `finetune` ones, as a fine-tuning run's
    are."""
    train, finetune = saved.get("train", {}), saved.get("finetune", {})
    return all(field in finetune and train.get(field) == finetune[field]
               for field in TRAIN_FIELDS_FROM_FINETUNE)


def require_kind(workdir: str | os.PathLike, kind: str, *, restart: bool = False,
                 flag: str = "--workdir") -> None:
    """Refuse, in one line naming what `workdir` holds, to write a `kind` run into a folder
    that holds a run of another kind (`held_kind`), and to `restart` (delete) a run whose kind
    only its saved config suggests: a fine-tuning's always trains with its `finetune`
    settings, but a pre-training whose settings coincide with them would read as one too."""
    held = held_kind(workdir)
    if restart and held == (FINE_TUNING, f"{CHECKPOINTS_DIR}/{CONFIG_FILE}"):
        raise ConfigError(f"{workdir} holds checkpoints saved before a fine-tuning recorded its "
                          f"start ({FINETUNE_SOURCE_FILE}): they may be a pre-training's, which "
                          "--restart would delete; delete the folder yourself to start over "
                          f"there, or give another {flag}")
    if held is None or held[0] == kind:
        return
    hint = (f" (--init_from {workdir} fine-tunes from it)"
            if (held[0], kind) == (PRE_TRAINING, FINE_TUNING) else "")
    raise ConfigError(f"{workdir} holds {DESCRIBED[held[0]]} ({held[1]}); {DESCRIBED[kind]} "
                      f"there would overwrite or mix with it{hint}: give another {flag}")
