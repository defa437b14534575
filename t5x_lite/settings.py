"""The config in its typed form: one frozen dataclass per section, validated once.

The ml_collections config (`t5x_lite.config`) stays what users write and override
(`--config.F=V`); `Settings.from_config(config)` converts it where a command starts, before
JAX does anything, so a bad value is reported first. Each section's `from_config(section)`
requires exactly the dataclass's fields (an unknown or a missing field is a `ConfigError`
naming it), turns lists into tuples (so every section is hashable), checks each value (a
one-line `ConfigError` naming the field and what it must be) and then each field's type
against its annotation.

Checks that need more than the config stay where that is: the task registry
(`evaluation.check_task_names`, `grid.require_sweep_splits`), the mesh against the devices
(`partitioning.resolve_mesh_shape`, which also takes mesh sections without rules), the batch
split over processes and devices (`partitioning.validate_batch_split`), an objective's
targets_length and sentinels against the family and vocabulary (`objectives.layout_for`), an
architecture's objectives (`Architecture.require_objective`) and the files a run reads
(`data.pipeline`).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any, ClassVar, Mapping

import ml_collections

from t5x_lite import architectures, objective_registry, partitioning, ul2
from t5x_lite.batch_format import MODE_TOKENS
from t5x_lite.config import (ATTENTION_IMPLS, BUDGETS, DECODE_METHODS, DTYPES, EVAL_SELECTIONS,
                             FUSED_ATTENTION, MIN_INPUTS_LENGTH, MLP_KINDS, NUM_RESERVED_IDS,
                             OPTIMIZER_STATES, OPTIMIZERS, SCHEDULES, UL2_DENOISERS, ConfigError)
from t5x_lite.errors import (OWN_RECORD_HINT, require_choice, require_integer, require_number,
                             require_positive)

# ---------------------------------------------------------------------------------------------
# The checks of one value of the config's own (the generic ones are `t5x_lite.errors`'), shared
# by the sections and by the modules that check their own arguments.


# Seeds seed numpy's generators and JAX's keys; past 2^31 some of their conversions overflow.
MAX_SEED = 2**31 - 1
# Model fields whose None stands for another field's value: the decoder as deep as the encoder,
# as many embedding rows as vocabulary ids.
MODEL_FIELD_DEFAULTS = {"num_decoder_layers": "num_layers", "embedding_rows": "vocab_size"}


def require_seed(field: str, value: Any) -> None:
    """Raise `ConfigError` unless `value` is an integer seed in [0, MAX_SEED]."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEED:
        raise ConfigError(f"{field}={value!r} must be an integer in [0, {MAX_SEED}]")


def require_bool(field: str, value: Any) -> None:
    """Raise `ConfigError` unless `value` is True or False."""
    if not isinstance(value, bool):
        raise ConfigError(f"{field}={value!r} must be True or False")


def require_vocab_room(vocab_size: int, num_sentinels: int) -> None:
    """Raise `ConfigError` unless the vocabulary holds pad, eos, unk, one real token and the
    sentinels."""
    if vocab_size < num_sentinels + NUM_RESERVED_IDS + 1:
        raise ConfigError(
            f"model.vocab_size={vocab_size} is too small for model.num_sentinels="
            f"{num_sentinels}: it must be at least num_sentinels + "
            f"{NUM_RESERVED_IDS + 1} (pad, eos, unk and one real token)"
        )


def require_warmup(section: str, schedule: str, warmup_steps: int, steps: int) -> None:
    """Raise `ConfigError` unless `{section}.warmup_steps` suits `{section}.schedule`."""
    if warmup_steps < (1 if schedule == "rsqrt" else 0):
        raise ConfigError(
            f"{section}.warmup_steps={warmup_steps} must be >= 1 for {section}.schedule='rsqrt' "
            "(it divides by sqrt(max(step, warmup_steps))) and >= 0 otherwise"
        )
    if schedule in SCHEDULES_ENDING_AT_STEPS and warmup_steps > steps:
        raise ConfigError(
            f"{section}.warmup_steps={warmup_steps} must be <= {section}.steps={steps} for "
            f"{section}.schedule={schedule!r}; with fewer steps, set --config.{section}."
            "warmup_steps too"
        )


# The schedules that decay to 0 at train.steps, the only ones that read it
# (`optim.learning_rate_schedule`).
SCHEDULES_ENDING_AT_STEPS = ("linear", "cosine")


def require_trainable(model: Model) -> None:
    """Raise `ConfigError` for a model a run cannot train (pre-training, fine-tuning or a
    benchmark's step), though evaluating, decoding and exporting it work: dropout on the
    attention weights (`attention_dropout` at a `dropout_rate` above 0) with a kernel that
    never forms the weights ('xla', 'cudnn'); only the einsum path can drop them
    (`attention.dot_product_attention`)."""
    if model.attention_weights_dropout_rate > 0 and model.attention_impl in FUSED_ATTENTION:
        raise ConfigError(
            f"model.attention_impl={model.attention_impl!r} never forms the attention weights, "
            f"so it cannot drop them (model.attention_dropout=True, model.dropout_rate="
            f"{model.dropout_rate}): choose 'auto' or 'einsum', or set "
            "--config.model.attention_dropout=False")


def require_run_steps(steps: int, schedule: str, train_steps: int) -> None:
    """Raise `ConfigError` unless a run may train up to `steps` (`train.train`'s `steps`, the
    CLI's --steps): an integer >= 1, and within train.steps on a schedule that decays to 0
    there (past it, steps would train at learning rate 0, silently)."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"steps={steps!r} must be an integer >= 1 (the step to train up to)")
    if schedule in SCHEDULES_ENDING_AT_STEPS and steps > train_steps:
        raise ConfigError(
            f"steps={steps} is past train.steps={train_steps}, where train.schedule="
            f"{schedule!r} has brought the learning rate to 0; to train longer, raise "
            f"train.steps (--config.train.steps={steps}; a checkpoint resumes under the "
            "longer schedule)")


def check_objective(point: Mapping[str, Any]) -> None:
    """Raise `ConfigError` naming the field for an objective config (a section, or a grid
    point's objective dict, where random_token_fraction and ul2_denoisers may be left out)
    that no objective can run: an unknown name, noise_density outside (0, 1),
    mean_noise_span_length < 1, random_token_fraction outside [0, 1], inputs_length <
    MIN_INPUTS_LENGTH or a ul2 mixture that `ul2.check_denoisers` refuses."""
    require_choice("objective.name", point["name"], objective_registry.names(), OWN_RECORD_HINT)
    require_number("objective.noise_density", point["noise_density"], lambda v: 0 < v < 1,
                   "a number in (0, 1)")
    require_number("objective.mean_noise_span_length", point["mean_noise_span_length"],
                   lambda v: v >= 1, "a number >= 1")
    require_number("objective.random_token_fraction", point.get("random_token_fraction", 0.1),
                   lambda v: 0 <= v <= 1, "a number in [0, 1]")
    require_number("objective.inputs_length", point["inputs_length"],
                   lambda v: isinstance(v, int) and v >= MIN_INPUTS_LENGTH,
                   f"an integer >= {MIN_INPUTS_LENGTH} (room for a non-noise token, a sentinel "
                   "and EOS)")
    ul2.check_denoisers(point.get("ul2_denoisers", UL2_DENOISERS))


# ---------------------------------------------------------------------------------------------
# Reading a section


def _frozen(value: Any) -> Any:
    """Lists (e.g. of a config read back from JSON) as tuples, so the settings hash."""
    return tuple(map(_frozen, value)) if isinstance(value, (list, tuple)) else value


def _is_a(value: Any, hint: Any) -> bool:
    """Whether `value` fits the evaluated annotation `hint` (an int is a float; a bool is
    neither)."""
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        return any(_is_a(value, option) for option in typing.get_args(hint))
    if typing.get_origin(hint) is tuple:
        item = typing.get_args(hint)[0]  # every tuple here is tuple[X, ...]
        return isinstance(value, tuple) and all(_is_a(v, item) for v in value)
    if hint in (int, float):
        kinds = int if hint is int else (int, float)
        return isinstance(value, kinds) and not isinstance(value, bool)
    return value is None if hint is type(None) else isinstance(value, hint)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


_S = typing.TypeVar("_S", bound="_Section")


class _Section:
    """What every section shares: reading it from its ConfigDict (`from_config`)."""

    NAME: ClassVar[str]  # the section's path in the config, as the errors name it

    @classmethod
    def from_config(cls: type[_S], section: ml_collections.ConfigDict | Mapping[str, Any]) -> _S:
        """The section's settings; `ConfigError` naming the field for an unknown or missing
        field, a value that cannot work or one that is not of the field's type."""
        if not isinstance(section, Mapping | ml_collections.ConfigDict):
            raise ConfigError(f"{cls.NAME}={section!r} must be a config section")
        names = [field.name for field in dataclasses.fields(cls)]
        for name in section.keys():
            if name not in names:
                raise ConfigError(f"{cls.NAME}.{name} is not a field of the config; the "
                                  f"{cls.NAME} section has {', '.join(names)}")
        for name in names:
            if name not in section:
                raise ConfigError(f"{cls.NAME}.{name} is missing from the config")
        settings = cls(**{name: cls._read(name, section[name]) for name in names})
        for name in names:  # a NaN passes every comparison's check unnoticed; inf, most
            value = getattr(settings, name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{cls.NAME}.{name}={value!r} must be a finite number")
        settings._check()
        for field in dataclasses.fields(cls):
            value = getattr(settings, field.name)
            if not _is_a(value, _hints(cls)[field.name]):
                raise ConfigError(f"{cls.NAME}.{field.name}={value!r} must be of type "
                                  f"{field.type}")
        return settings

    @classmethod
    def _read(cls, name: str, value: Any) -> Any:
        return _frozen(value)

    def _check(self) -> None:
        """Raise `ConfigError` naming the field if a value cannot work (types come after)."""


@dataclasses.dataclass(frozen=True)
class Model(_Section):
    """`config.model`: what builds the network (`models.build_model`), counts its parameters
    and FLOPs (`accounting`) and, with `arch` replaced by its program, keys a compiled step
    (`step_settings.StepSettings.model`)."""

    NAME: ClassVar[str] = "model"

    arch: str
    vocab_size: int
    num_sentinels: int
    d_model: int
    d_ff: int
    num_heads: int
    d_kv: int
    num_layers: int
    num_decoder_layers: int | None  # None: num_layers (MODEL_FIELD_DEFAULTS)
    mlp: str
    tie_embeddings: bool
    relpos_buckets: int
    relpos_max_distance: int
    dropout_rate: float
    attention_dropout: bool
    layer_norm_epsilon: float
    dtype: str
    attention_impl: str
    remat: bool
    scan_layers: bool
    embedding_rows: int | None  # None: vocab_size (MODEL_FIELD_DEFAULTS)

    @property
    def attention_weights_dropout_rate(self) -> float:
        """The rate the attention weights are dropped at in training: `dropout_rate` with
        `attention_dropout` (T5's), else 0."""
        return self.dropout_rate if self.attention_dropout else 0.0

    @property
    def num_embeddings(self) -> int:
        """The rows of the token embedding and of the logits: `embedding_rows`, which may pad
        the vocabulary's `vocab_size` ids, or `vocab_size` itself."""
        return self.vocab_size if self.embedding_rows is None else self.embedding_rows

    def _check_cudnn(self) -> None:
        """What cuDNN's fused attention takes, checked here rather than as JAX's traceback from
        inside the model; the head-dimension bound is Hopper's (128 before it, which JAX still
        reports)."""
        if self.dtype != "bfloat16":
            raise ConfigError(f"model.attention_impl='cudnn' needs model.dtype='bfloat16' (cuDNN's "
                              f"fused attention takes no {self.dtype}); or choose 'auto', 'xla' "
                              "or 'einsum'")
        if self.d_kv % 8 or self.d_kv > 256:
            raise ConfigError(f"model.attention_impl='cudnn' needs model.d_kv a multiple of 8 and "
                              f"at most 256 (cuDNN's fused attention), not {self.d_kv}; or "
                              "choose 'auto', 'xla' or 'einsum'")

    def _check(self) -> None:
        architecture = architectures.get(self.arch)
        require_choice("model.mlp", self.mlp, MLP_KINDS)
        require_choice("model.dtype", self.dtype, DTYPES)
        require_choice("model.attention_impl", self.attention_impl, ATTENTION_IMPLS)
        if self.attention_impl == "cudnn":
            self._check_cudnn()
        for field in ("vocab_size", "d_model", "d_ff", "num_heads", "d_kv", "num_layers",
                      "relpos_buckets", "relpos_max_distance"):
            require_integer(f"model.{field}", getattr(self, field), 1)
        require_integer("model.num_sentinels", self.num_sentinels, 0)
        # T5's buckets: a bidirectional stack gives each direction half, a causal one all; in
        # either, the first half of a direction's buckets are exact distances and the rest are
        # log-spaced up to max_distance, which must lie beyond them (at it, every logit was NaN;
        # below 4 buckets, a division by zero). A stack of no fixed direction (a prefix LM's)
        # may read either.
        causal = any(stack.bidirectional is not True for stack in architecture.stacks)
        exact = self.relpos_buckets // (2 if causal else 4)
        if self.relpos_buckets < 4 or self.relpos_max_distance <= exact:
            raise ConfigError(
                f"model.relpos_buckets={self.relpos_buckets} and model.relpos_max_distance="
                f"{self.relpos_max_distance}: need relpos_buckets >= 4 and relpos_max_distance > "
                f"{exact}, the exact-distance buckets of a {'causal' if causal else 'bidirectional'}"
                " stack (T5: 32 and 128)")
        require_positive("model.layer_norm_epsilon", self.layer_norm_epsilon)
        for field in ("tie_embeddings", "remat", "scan_layers", "attention_dropout"):
            require_bool(f"model.{field}", getattr(self, field))
        if not 0.0 <= self.dropout_rate < 1.0:
            raise ConfigError(f"model.dropout_rate={self.dropout_rate} must be in [0, 1)")
        require_vocab_room(self.vocab_size, self.num_sentinels)
        for field in ("num_decoder_layers", "embedding_rows"):
            if getattr(self, field) is not None:
                require_integer(f"model.{field}", getattr(self, field), 1)
        if self.num_embeddings < self.vocab_size:
            raise ConfigError(
                f"model.embedding_rows={self.embedding_rows} must be None or >= model.vocab_size"
                f"={self.vocab_size} (every id needs an embedding row; more rows pad it)")
        architecture.require_num_layers(self.num_layers, self.num_decoder_layers)


def model_settings(model: Model | ml_collections.ConfigDict) -> Model:
    """`model` as `Model` settings: a `config.model` section is read (and so validated);
    for the functions that take either, such as `models.build_model`."""
    return model if isinstance(model, Model) else Model.from_config(model)


@dataclasses.dataclass(frozen=True)
class Objective(_Section):
    """`config.objective`: the pre-training objective (`objectives.spec_from_config`) and
    lengths (`objectives.layout_for`, which checks targets_length against the family)."""

    NAME: ClassVar[str] = "objective"

    name: str
    noise_density: float
    mean_noise_span_length: float
    random_token_fraction: float
    inputs_length: int
    targets_length: int | None  # None: as long as the objective needs
    ul2_denoisers: tuple[tuple[str | float, ...], ...]  # the ul2 objective's mixture

    def _check(self) -> None:
        check_objective(dataclasses.asdict(self))


@dataclasses.dataclass(frozen=True)
class Train(_Section):
    """`config.train`: pre-training's optimiser, schedule, loss, batch and cadence; the
    step reads a subset (`step_settings.TrainSettings`)."""

    NAME: ClassVar[str] = "train"

    batch_size: int
    steps: int
    optimizer: str
    schedule: str
    learning_rate: float
    warmup_steps: int
    z_loss: float
    label_smoothing: float
    microbatches: int
    seed: int
    weight_decay: float
    loss_normalizing_factor: float | None  # None: the sum of the loss weights
    log_every: int
    eval_every: int  # 0: no held-out evaluation (`t5x_lite.held_out`)
    eval_batches: int

    def _check(self) -> None:
        require_choice("train.optimizer", self.optimizer, OPTIMIZERS)
        require_choice("train.schedule", self.schedule, SCHEDULES)
        require_positive("train.learning_rate", self.learning_rate)
        for field in ("batch_size", "steps", "microbatches", "log_every"):
            require_integer(f"train.{field}", getattr(self, field), 1)
        require_integer("train.warmup_steps", self.warmup_steps, 0)
        require_integer("train.eval_every", self.eval_every, 0)  # 0: no held-out evaluation
        require_integer("train.eval_batches", self.eval_batches, 1)
        require_seed("train.seed", self.seed)
        if self.batch_size % self.microbatches:
            raise ConfigError(f"train.batch_size={self.batch_size} must be a multiple of "
                              f"train.microbatches={self.microbatches}")
        require_warmup("train", self.schedule, self.warmup_steps, self.steps)
        if self.z_loss < 0 or self.weight_decay < 0:
            raise ConfigError(f"train.z_loss={self.z_loss} and train.weight_decay="
                              f"{self.weight_decay} must be >= 0")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(f"train.label_smoothing={self.label_smoothing} must be in [0, 1)")
        factor = self.loss_normalizing_factor
        if factor is not None and (
            isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor <= 0
        ):
            raise ConfigError(
                f"train.loss_normalizing_factor={factor!r} must be None (divide by the number "
                "of target tokens) or a positive number"
            )


@dataclasses.dataclass(frozen=True)
class Mesh(_Section):
    """`config.mesh`: the device mesh (made, and checked against the devices, by
    `partitioning.make_mesh`) and the logical-axis rules, normalised
    (`partitioning.normalize_rules`: every target a tuple of mesh axes)."""

    NAME: ClassVar[str] = "mesh"

    shape: tuple[int, ...]
    axis_names: tuple[str, ...]
    rules: tuple[tuple[str | tuple[str, ...], ...], ...]  # (logical axis, mesh axes) pairs

    @classmethod
    def _read(cls, name: str, value: Any) -> Any:
        if name == "rules":
            return tuple(partitioning.normalize_rules(value).items())
        return _frozen(value)


@dataclasses.dataclass(frozen=True)
class Data(_Section):
    """`config.data`: the pre-training corpus, vocabulary and data folders
    (`data.pipeline`, which checks that they exist)."""

    NAME: ClassVar[str] = "data"

    corpus: str
    data_dir: str
    vocab: str
    tasks: tuple[str, ...]
    data_root: str


@dataclasses.dataclass(frozen=True)
class Checkpoint(_Section):
    """`config.checkpoint`: how often a run saves and how many saves it keeps
    (`checkpointing.Checkpointer`)."""

    NAME: ClassVar[str] = "checkpoint"

    every: int
    keep: int

    def _check(self) -> None:
        require_integer("checkpoint.every", self.every, 1)
        require_integer("checkpoint.keep", self.keep, 1)


@dataclasses.dataclass(frozen=True)
class Decode(_Section):
    """`config.finetune.decode`: how evaluation generates (`decoding.decode`); 'sample' draws
    from the model's distribution at temperature 1 with `train.seed`'s key."""

    NAME: ClassVar[str] = "finetune.decode"

    method: str
    num_beams: int
    alpha: float
    max_length: int | None  # None: finetune.targets_length

    def _check(self) -> None:
        require_choice("finetune.decode.method", self.method, DECODE_METHODS)
        require_integer("finetune.decode.num_beams", self.num_beams, 1)
        if self.max_length is not None:
            require_integer("finetune.decode.max_length", self.max_length, 1)
        if self.alpha < 0:
            raise ConfigError(f"finetune.decode.alpha={self.alpha} must be >= 0")


@dataclasses.dataclass(frozen=True)
class Finetune(_Section):
    """`config.finetune`: fine-tuning and validation (`finetune.finetune`,
    `evaluation.evaluate`). `tasks` may be empty (a pre-training config fine-tunes nothing);
    where tasks are used, `evaluation.check_task_names` requires some, all registered."""

    NAME: ClassVar[str] = "finetune"

    tasks: tuple[str, ...]
    mixing_limit: int
    steps: int
    batch_size: int
    inputs_length: int
    targets_length: int
    task_lengths: bool  # each run: its tasks' own targets lengths (`evaluation.with_task_lengths`)
    pack: bool
    mode_token: str | None  # UL2's paradigm token before every task input (`TaskSplit`)
    optimizer: str
    schedule: str
    learning_rate: float
    warmup_steps: int
    eval_every: int
    decode: Decode
    eval_examples: int | None  # None: all of them
    eval_selection: str
    optimizer_state: str  # 'fresh' | 'continue' (the pre-training's, as T5's code does)

    @classmethod
    def _read(cls, name: str, value: Any) -> Any:
        return Decode.from_config(value) if name == "decode" else _frozen(value)

    def _check(self) -> None:
        require_choice("finetune.optimizer", self.optimizer, OPTIMIZERS)
        require_choice("finetune.schedule", self.schedule, SCHEDULES)
        require_positive("finetune.learning_rate", self.learning_rate)
        for field in ("steps", "batch_size", "eval_every", "mixing_limit"):
            require_integer(f"finetune.{field}", getattr(self, field), 1)
        for field in ("inputs_length", "targets_length"):  # a token and EOS at least: at 1,
            # every example is cut to its EOS alone
            require_integer(f"finetune.{field}", getattr(self, field), 2)
        require_bool("finetune.task_lengths", self.task_lengths)
        require_integer("finetune.warmup_steps", self.warmup_steps, 0)
        if self.eval_examples is not None:
            require_integer("finetune.eval_examples", self.eval_examples, 1)
        require_choice("finetune.eval_selection", self.eval_selection, EVAL_SELECTIONS)
        require_bool("finetune.pack", self.pack)
        if self.mode_token is not None:
            require_choice("finetune.mode_token", self.mode_token, MODE_TOKENS,
                           "or None: no paradigm token")
        require_warmup("finetune", self.schedule, self.warmup_steps, self.steps)
        require_choice("finetune.optimizer_state", self.optimizer_state, OPTIMIZER_STATES)
        if self.optimizer_state == "continue" and self.schedule != "constant":
            # The schedules read the optimiser's update count, which then counts on from the
            # pre-training's: past the end of 'linear' / 'cosine', far down 'rsqrt'.
            raise ConfigError(
                f"finetune.schedule={self.schedule!r} reads the update count, which "
                "finetune.optimizer_state='continue' carries on from the pre-training's: use "
                "finetune.schedule='constant' (the paper's), or finetune.optimizer_state='fresh'")


@dataclasses.dataclass(frozen=True)
class Sweep(_Section):
    """`config.sweep`, which only sweep presets have (`presets.sweep_preset`): the tasks each
    grid point is fine-tuned on (and whether GLUE's are one task), its seeds, progress display,
    compute budget and whether the pre-trained model is scored zero-shot before fine-tuning
    (`t5x_lite.sweep`; `t5x_lite.grid` checks the tasks' splits, budget_reference and label
    options against the grid)."""

    NAME: ClassVar[str] = "sweep"

    tasks: tuple[str, ...]
    seeds: tuple[int, ...]
    progress: bool
    budget: str
    budget_reference: str | None  # None: the grid's first point
    zero_shot: bool  # rank label options with the pre-trained model (`t5x_lite.zero_shot`)
    glue_as_one_task: bool  # fine-tune GLUE's tasks as one run (`grid.finetune_runs`)

    def _check(self) -> None:
        require_choice("sweep.budget", self.budget, BUDGETS)
        require_bool("sweep.zero_shot", self.zero_shot)
        require_bool("sweep.glue_as_one_task", self.glue_as_one_task)
        if isinstance(self.tasks, str) or not self.tasks:
            raise ConfigError(f"sweep.tasks={self.tasks!r} must be a non-empty list of task "
                              "names")
        if isinstance(self.seeds, int) or not self.seeds:
            raise ConfigError(f"sweep.seeds={self.seeds!r} must be a non-empty list of seeds")
        for seed in self.seeds:
            require_seed("sweep.seeds", seed)
        for field, values in (("tasks", self.tasks), ("seeds", self.seeds)):
            if len(set(values)) < len(values):  # a repeat would run and record a run twice
                raise ConfigError(f"sweep.{field}={values!r} repeats an entry; give each once")


@dataclasses.dataclass(frozen=True)
class Settings:
    """A whole config, typed and validated; hashable, and equal for equal configs."""

    model: Model
    objective: Objective
    train: Train
    mesh: Mesh
    data: Data
    checkpoint: Checkpoint
    finetune: Finetune
    sweep: Sweep | None = None  # only sweep presets have the section

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict) -> Settings:
        """Read and validate every section of `config`; `ConfigError` naming the field (or
        the section) for the first one that cannot work."""
        sections = [field.name for field in dataclasses.fields(cls)]
        for name in config.keys():
            if name not in sections:
                raise ConfigError(f"{name} is not a section of the config; it has "
                                  f"{', '.join(sections)}")
        for name in sections[:-1]:  # all but sweep
            if name not in config:
                raise ConfigError(f"the config has no {name} section")
        return cls(
            model=Model.from_config(config.model),
            objective=Objective.from_config(config.objective),
            train=Train.from_config(config.train),
            mesh=Mesh.from_config(config.mesh),
            data=Data.from_config(config.data),
            checkpoint=Checkpoint.from_config(config.checkpoint),
            finetune=Finetune.from_config(config.finetune),
            sweep=Sweep.from_config(config.sweep) if "sweep" in config else None,
        )
