"""What a compiled train step reads, as one frozen value: the key of its program cache.

`step_settings(config, data_kind)` extracts a `StepSettings` from the config's typed settings
(`t5x_lite.settings.Settings.from_config`), once; what the functions that build a step or its
state compile (`t5x_lite.train_step`, `t5x_lite.train_state`, `t5x_lite.optim`) is made from
it alone, never from the config, so whatever a program reads is in the settings, and two
configs share a compiled program exactly when their settings (and mesh) are equal. What they
still take from the config they pass to the program as data: the seed, and the prefix
attention flag of the architecture (`model.arch`) among those sharing its program.

Every leaf of the config sections a step reads (`STEP_SECTIONS`) is either copied into the
settings or listed in `NOT_IN_THE_PROGRAM` with the reason; `tests/test_step_settings.py` fails
on a field that is neither, so a new field cannot silently share another point's executable.
The objective is not here: the step takes it as traced data (`objectives.ObjectiveSpec`), and
its static shapes arrive as the data kind (`objectives.BatchLayout`).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from typing import Any

import ml_collections

from t5x_lite import architectures, partitioning, settings


STEP_SECTIONS = ("model", "train", "mesh")
# The leaves of STEP_SECTIONS that no compiled step reads, and why.
NOT_IN_THE_PROGRAM = {
    "train.seed": "the step key is an argument of the step (`train_state.step_key`)",
    "train.log_every": "read by the training loop, not the step",
    "train.eval_every": "read by the held-out evaluation (`t5x_lite.held_out`), not the step",
    "train.eval_batches": "read by the held-out evaluation (`t5x_lite.held_out`), not the step",
    "mesh.shape": "makes the Mesh, which keys the program cache next to the settings",
    "mesh.axis_names": "makes the Mesh, which keys the program cache next to the settings",
}


# `config.model` as the program builds it: the model settings, with `arch` the architecture
# whose program the config's runs (`Architecture.program`: language_model is built as
# prefix_lm, one program for both; the step's traced flag switches prefix attention off).
ModelSettings = settings.Model


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """The `config.train` fields the step reads: optimiser and schedule, loss, batch split."""

    optimizer: str
    schedule: str
    learning_rate: float
    warmup_steps: int
    steps: int | None  # None unless the schedule ends at it
    weight_decay: float
    z_loss: float
    label_smoothing: float
    loss_normalizing_factor: float | None
    microbatches: int
    batch_size: int


@dataclasses.dataclass(frozen=True)
class StepSettings:
    """Everything a compiled train, fine-tuning or eval step reads; hashable (a cache key).

    data_kind: what the program is fed: a pre-training `objectives.BatchLayout`, a fine-tuning
    or eval tag, or None for what reads no data (the initial state, vmap grouping).
    """

    model: ModelSettings
    train: TrainSettings
    mesh_rules: tuple[tuple[str, tuple[str, ...]], ...]  # config.mesh.rules, normalised
    data_kind: Hashable = None

    @property
    def rules(self) -> partitioning.Rules:
        """The rule table, as `t5x_lite.partitioning` takes it."""
        return dict(self.mesh_rules)

    def by_config_path(self) -> dict[str, Any]:
        """{config path, e.g. 'train.z_loss': value} of the settings read from the config."""
        return {**{f"model.{k}": v for k, v in dataclasses.asdict(self.model).items()},
                **{f"train.{k}": v for k, v in dataclasses.asdict(self.train).items()},
                "mesh.rules": self.mesh_rules}


def step_settings(config: ml_collections.ConfigDict, data_kind: Hashable = None) -> StepSettings:
    """The settings of `config`'s step on `data_kind` (see `StepSettings`).

    Raises `ConfigError` naming the field if the config cannot run (`Settings.from_config`)."""
    typed = settings.Settings.from_config(config)
    model = dataclasses.replace(typed.model, arch=architectures.get(typed.model.arch).program)
    train = TrainSettings(**{field.name: getattr(typed.train, field.name)
                             for field in dataclasses.fields(TrainSettings)})
    # Only the schedules that end at train.steps read it: the others leave it out of the
    # settings, so runs of any length share a program.
    if train.schedule not in settings.SCHEDULES_ENDING_AT_STEPS:
        train = dataclasses.replace(train, steps=None)
    return StepSettings(model=model, train=train, mesh_rules=typed.mesh.rules,
                        data_kind=data_kind)
