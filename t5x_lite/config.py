"""The one configuration tree every command reads, and its validation.

A config is an `ml_collections.ConfigDict` with the sections `model`, `objective`, `train`,
`mesh`, `data`, `checkpoint` and `finetune`. `default_config()` returns the whole tree with T5 v1.0
defaults; presets (`t5x_lite.presets`) start from it and change a few fields.

`validate_model_config` / `validate_config` reject a config that cannot work before any
array is built, with a `ConfigError` that names the field and the allowed values.
"""
from __future__ import annotations

import ast
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

import ml_collections

from t5x_lite import architectures
# Defined in a leaf module so that the architecture registry can raise it too; every other
# module imports them from here.
from t5x_lite.errors import ConfigError, require_choice

MLP_KINDS = ("relu", "gated-gelu")
DTYPES = ("float32", "bfloat16")
ATTENTION_IMPLS = ("auto", "xla", "cudnn", "einsum")
OPTIMIZERS = ("adafactor", "adamw")
SCHEDULES = ("rsqrt", "linear", "cosine", "constant")
DECODE_METHODS = ("greedy", "sample", "beam")
# Token ids shared by the vocabulary, the objectives and the model.
PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
NUM_RESERVED_IDS = 3


def model_config() -> ml_collections.ConfigDict:
    """T5 v1.0 base-sized model settings (the paper's baseline, one stack)."""
    return ml_collections.ConfigDict(
        dict(
            arch="encoder_decoder",  # a name of t5x_lite.architectures
            vocab_size=32000,
            num_sentinels=100,  # <extra_id_0> = vocab_size - 1, counting down
            d_model=768,
            d_ff=3072,
            num_heads=12,
            d_kv=64,
            num_layers=12,  # per stack, or a share of it per stack (architectures.Stack)
            mlp="relu",  # v1.0: relu; v1.1: gated-gelu
            tie_embeddings=True,  # v1.0: tied (logits scaled by d_model**-0.5); v1.1: untied
            relpos_buckets=32,
            relpos_max_distance=128,
            dropout_rate=0.1,
            layer_norm_epsilon=1e-6,
            dtype="float32",  # compute dtype; parameters are always float32
            # auto: the einsum path off GPU, jax.nn.dot_product_attention's default (its XLA
            # kernel) on GPU; cudnn only when asked for (attention.resolve_implementation)
            attention_impl="auto",
            remat=False,  # recompute each layer's activations in the backward pass (saves memory)
            scan_layers=False,  # run each stack's layers with jax.lax.scan (compile once per stack)
        )
    )


def default_config() -> ml_collections.ConfigDict:
    """The full config tree with the paper's baseline model and training settings.

    Its objective is the span corruption T5 released (mean span 3, section 3.3.4's best), which
    the small presets keep; the `paper` preset switches to the section 3.1.4 baseline,
    `iid_denoising`."""
    config = ml_collections.ConfigDict()
    config.model = model_config()
    config.objective = ml_collections.ConfigDict(
        dict(
            name="span_corruption",
            noise_density=0.15,
            mean_noise_span_length=3.0,
            random_token_fraction=0.1,  # BERT-style: share of noise tokens made random
            inputs_length=512,
        )
    )
    # None: as long as the objective needs (114 for span corruption at 512 / 15% / 3). A set
    # value pads every objective's targets to it, and must be at least that need.
    config.objective.targets_length = ml_collections.config_dict.placeholder(int)
    config.train = ml_collections.ConfigDict(
        dict(
            batch_size=128,
            steps=2**19,
            optimizer="adafactor",
            schedule="rsqrt",
            learning_rate=1.0,
            warmup_steps=10_000,
            z_loss=1e-4,
            label_smoothing=0.0,
            microbatches=1,
            seed=0,
            weight_decay=0.0,  # AdamW only; Adafactor (T5) uses none
            loss_normalizing_factor=None,  # None: sum of loss weights; a number: that constant
            log_every=10,
        )
    )
    config.mesh = ml_collections.ConfigDict(
        dict(
            shape=(-1, 1),
            axis_names=("data", "model"),  # or ("data", "fsdp", "model")
            # Logical axis -> mesh axes (t5x-style); axes absent from the mesh are ignored,
            # so the same table serves meshes with and without "fsdp".
            rules=(
                ("batch", ("data", "fsdp")),
                ("vocab", "model"),
                ("heads", "model"),
                ("mlp", "model"),
                ("embed", "fsdp"),
                ("kv", None),
                ("relpos_buckets", None),
                ("length", None),
                ("layers", None),
            ),
        )
    )
    # data_root: a directory laid out like ../shared/data, read by the `local_*` tasks.
    config.data = ml_collections.ConfigDict(
        dict(corpus="python_docs", data_dir="", vocab="", tasks=(), data_root="")
    )
    config.checkpoint = ml_collections.ConfigDict(dict(every=1000, keep=3))
    config.finetune = finetune_config()
    return config


def finetune_config() -> ml_collections.ConfigDict:
    """Fine-tuning and validation settings (the paper's: Adafactor, constant lr 1e-3).

    tasks: task names (`t5x_lite.data.tasks`); several are mixed examples-proportionally with
    each task's share capped at `mixing_limit` examples (the paper's rate limit K, 2**19).
    The train step's other settings (z_loss, label smoothing, micro-batches, seed) come from
    `config.train`; these fields replace its optimiser, schedule, batch size and step count.
    """
    config = ml_collections.ConfigDict(
        dict(
            tasks=(),
            mixing_limit=2**19,
            steps=2**18,  # the paper fine-tunes for 2^18 steps
            batch_size=128,
            inputs_length=512,
            targets_length=128,
            pack=True,
            optimizer="adafactor",
            schedule="constant",
            learning_rate=1e-3,
            warmup_steps=0,
            eval_every=5000,  # the paper saves (and evaluates) a checkpoint every 5000 steps
            decode=ml_collections.ConfigDict(
                dict(method="greedy", num_beams=4, alpha=0.6)
            ),
        )
    )
    config.eval_examples = ml_collections.config_dict.placeholder(int)  # None: all of them
    config.decode.max_length = ml_collections.config_dict.placeholder(int)  # None: targets_length
    return config


def require_positive(field: str, value: Any) -> None:
    """Raise `ConfigError` unless `value` is a positive int or float (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"{field}={value!r} must be a positive number")


def require_vocab_room(vocab_size: int, num_sentinels: int) -> None:
    """Raise `ConfigError` unless the vocabulary holds pad, eos, unk, one real token and the
    sentinels."""
    if vocab_size < num_sentinels + NUM_RESERVED_IDS + 1:
        raise ConfigError(
            f"model.vocab_size={vocab_size} is too small for model.num_sentinels="
            f"{num_sentinels}: it must be at least num_sentinels + "
            f"{NUM_RESERVED_IDS + 1} (pad, eos, unk and one real token)"
        )


def require_integer(field: str, value: Any, minimum: int) -> None:
    """Raise `ConfigError` unless `value` is an int (not a bool) of at least `minimum`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{field}={value!r} must be an integer >= {minimum}")


def require_warmup(section: str, schedule: str, warmup_steps: int, steps: int) -> None:
    """Raise `ConfigError` unless `{section}.warmup_steps` suits `{section}.schedule`."""
    if warmup_steps < (1 if schedule == "rsqrt" else 0):
        raise ConfigError(
            f"{section}.warmup_steps={warmup_steps} must be >= 1 for {section}.schedule='rsqrt' "
            "(it divides by sqrt(max(step, warmup_steps))) and >= 0 otherwise"
        )
    if schedule in ("linear", "cosine") and warmup_steps > steps:
        raise ConfigError(
            f"{section}.warmup_steps={warmup_steps} must be <= {section}.steps={steps}"
        )


def validate_train_config(train: ml_collections.ConfigDict) -> None:
    """Raise `ConfigError` naming the field if `config.train` cannot run."""
    require_choice("train.optimizer", train.optimizer, OPTIMIZERS)
    require_choice("train.schedule", train.schedule, SCHEDULES)
    for field in ("learning_rate", "batch_size", "steps", "microbatches", "log_every"):
        require_positive(f"train.{field}", train[field])
    for field in ("batch_size", "steps", "microbatches", "log_every", "warmup_steps"):
        if isinstance(train[field], bool) or not isinstance(train[field], int):
            raise ConfigError(f"train.{field}={train[field]!r} must be an integer")
    require_warmup("train", train.schedule, train.warmup_steps, train.steps)
    if train.z_loss < 0 or train.weight_decay < 0:
        raise ConfigError(
            f"train.z_loss={train.z_loss} and train.weight_decay={train.weight_decay} must be >= 0"
        )
    if not 0.0 <= train.label_smoothing < 1.0:
        raise ConfigError(f"train.label_smoothing={train.label_smoothing} must be in [0, 1)")
    factor = train.loss_normalizing_factor
    if factor is not None and (
        isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor <= 0
    ):
        raise ConfigError(
            f"train.loss_normalizing_factor={factor!r} must be None (divide by the number of "
            "target tokens) or a positive number"
        )


def validate_finetune_config(finetune: ml_collections.ConfigDict) -> None:
    """Raise `ConfigError` naming the field if `config.finetune` cannot run.

    Task names are checked against the registry where they are used (`t5x_lite.evaluation`),
    since the registry imports the data stack.
    """
    if isinstance(finetune.tasks, str) or not finetune.tasks:
        raise ConfigError(
            f"finetune.tasks={finetune.tasks!r} must be a non-empty list of task names"
        )
    require_choice("finetune.optimizer", finetune.optimizer, OPTIMIZERS)
    require_choice("finetune.schedule", finetune.schedule, SCHEDULES)
    require_choice("finetune.decode.method", finetune.decode.method, DECODE_METHODS)
    require_positive("finetune.learning_rate", finetune.learning_rate)
    for field in ("steps", "batch_size", "inputs_length", "targets_length", "eval_every",
                  "mixing_limit"):
        require_integer(f"finetune.{field}", finetune[field], 1)
    require_integer("finetune.warmup_steps", finetune.warmup_steps, 0)
    require_integer("finetune.decode.num_beams", finetune.decode.num_beams, 1)
    for field, value in (("eval_examples", finetune.eval_examples),
                         ("decode.max_length", finetune.decode.max_length)):
        if value is not None:
            require_integer(f"finetune.{field}", value, 1)
    if finetune.decode.alpha < 0:
        raise ConfigError(f"finetune.decode.alpha={finetune.decode.alpha} must be >= 0")
    require_bool("finetune.pack", finetune.pack)
    require_warmup("finetune", finetune.schedule, finetune.warmup_steps, finetune.steps)


def require_bool(field: str, value: Any) -> None:
    """Raise `ConfigError` unless `value` is True or False."""
    if not isinstance(value, bool):
        raise ConfigError(f"{field}={value!r} must be True or False")


def validate_model_config(model: ml_collections.ConfigDict) -> None:
    """Raise `ConfigError` naming the field if the model settings cannot build a network."""
    architecture = architectures.get(model.arch)
    require_choice("model.mlp", model.mlp, MLP_KINDS)
    require_choice("model.dtype", model.dtype, DTYPES)
    require_choice("model.attention_impl", model.attention_impl, ATTENTION_IMPLS)
    for field in ("vocab_size", "d_model", "d_ff", "num_heads", "d_kv", "num_layers",
                  "relpos_buckets", "relpos_max_distance", "layer_norm_epsilon"):
        require_positive(f"model.{field}", model[field])
    for field in ("vocab_size", "d_model", "d_ff", "num_heads", "d_kv", "num_layers",
                  "relpos_buckets", "relpos_max_distance", "num_sentinels"):
        if not isinstance(model[field], int) or isinstance(model[field], bool):
            raise ConfigError(f"model.{field}={model[field]!r} must be an integer")
    for field in ("tie_embeddings", "remat", "scan_layers"):
        require_bool(f"model.{field}", model[field])
    if model.num_sentinels < 0:
        raise ConfigError(f"model.num_sentinels={model.num_sentinels} must be >= 0")
    if not 0.0 <= model.dropout_rate < 1.0:
        raise ConfigError(f"model.dropout_rate={model.dropout_rate} must be in [0, 1)")
    require_vocab_room(model.vocab_size, model.num_sentinels)
    architecture.require_num_layers(model.num_layers)


# ---------------------------------------------------------------------------------------------
# Command-line overrides: `--config.FIELD=VALUE`, parsed the same way by every command

OVERRIDE_PREFIX = "--config."
OVERRIDES_HELP = (
    "--config.FIELD=VALUE sets one field of the config, e.g. --config.train.steps=100; the "
    "value is read as the field's type: int, float, bool (true/false), str as written, a tuple "
    "as a Python literal or comma-separated (--config.sweep.seeds='(0, 1)', "
    "--config.sweep.tasks=builtin_reverse,builtin_module); None sets any field to None. An "
    "unknown field is an error naming it."
)


def flat_fields(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'section.field': value} of a nested dict (a config's `to_dict()` or its JSON), the
    dotted paths that `--config.F=V` overrides and error messages name."""
    flat: dict[str, Any] = {}
    for name, value in tree.items():
        if isinstance(value, Mapping):
            flat.update(flat_fields(value, f"{prefix}{name}."))
        else:
            flat[f"{prefix}{name}"] = value
    return flat


def split_overrides(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """`args` -> (the `--config.FIELD=VALUE` overrides, everything else), each in order."""
    overrides = [arg for arg in args if arg.startswith(OVERRIDE_PREFIX)]
    return overrides, [arg for arg in args if not arg.startswith(OVERRIDE_PREFIX)]


def _field(config: ml_collections.ConfigDict, field: str, value: Any) -> tuple[Any, str]:
    """The section holding dotted `field` and the field's last name; `ConfigError` naming the
    field when the config has no such field."""
    node = config
    for part in field.split("."):
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
            raise ConfigError(f"override {field}={value!r}: the config has no field {field!r}")
        parent, node = node, node[part]
    return parent, part


def _parse_value(kind: type, value: str) -> Any:
    """`value` (command-line text) as a value of `kind`, the field's current type."""
    if value == "None":
        return None
    if kind is bool:
        if value.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"{value!r} is not a bool (true or false)")
        return value.lower() in ("true", "1")
    if kind in (int, float):
        return kind(value)
    if kind is str:
        return value
    if kind is tuple:
        parsed = _literal(value)
        if isinstance(parsed, str) and "," in value:  # unquoted names: 'a,b' -> ('a', 'b')
            return tuple(_literal(item.strip()) for item in value.split(","))
        return tuple(parsed) if isinstance(parsed, (tuple, list)) else (parsed,)
    # A None field without a declared type (or another type): a Python literal, else the text.
    return _literal(value)


def _literal(value: str) -> Any:
    """`value` as a Python literal (numbers, tuples, quoted strings), else the text itself."""
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value


def parse_overrides(config: ml_collections.ConfigDict, texts: Sequence[str]) -> dict[str, Any]:
    """'--config.FIELD=VALUE' (or 'FIELD=VALUE') strings -> {dotted field: value}, each value
    read as the type of that field of `config` (see OVERRIDES_HELP); later ones win.

    Raises `ConfigError` (one line, naming the field) for a missing '=', an unknown field, a
    config section instead of a field, or a value that is not of the field's type.
    """
    parsed = {}
    for text in texts:
        field, sep, value = text.removeprefix(OVERRIDE_PREFIX).partition("=")
        if not sep or not field:
            raise ConfigError(f"override {text!r} must look like --config.field.name=value")
        parent, name = _field(config, field, value)
        if isinstance(parent[name], ml_collections.ConfigDict):
            raise ConfigError(f"override {text!r}: {field!r} is a config section, not a field "
                              f"(its fields: {', '.join(parent[name])})")
        try:
            parsed[field] = _parse_value(parent.get_type(name), value)
        except ValueError as error:
            raise ConfigError(f"override {field}={value!r}: {error}") from None
    return parsed


def apply_overrides(config: ml_collections.ConfigDict, overrides: Mapping[str, Any]) -> None:
    """Set dotted fields to Python values in place (a grid row's overrides, or what
    `parse_overrides` read); an unknown field or a value of the wrong type is a `ConfigError`
    naming the field."""
    for field, value in overrides.items():
        parent, name = _field(config, field, value)
        try:
            parent[name] = value
        except TypeError as error:
            raise ConfigError(f"override {field}={value!r}: {error}") from None


def load_config_file(spec: str) -> ml_collections.ConfigDict:
    """The config of an ml_collections config file, `path.py` or `path.py:ARG`: the file's
    `get_config()`, or `get_config(ARG)` (as `config_flags.DEFINE_config_file` reads it)."""
    path, _, arg = spec.partition(":")
    if not os.path.isfile(path):
        raise ConfigError(f"--config={spec!r}: {path!r} is not a file; give an ml_collections "
                          "config file (e.g. configs/tiny.py) or use --preset")
    module_spec = importlib.util.spec_from_file_location(
        f"t5x_lite_config_{Path(path).stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_spec.name] = module  # before running it: dataclasses look themselves up
    module_spec.loader.exec_module(module)
    if not callable(getattr(module, "get_config", None)):
        raise ConfigError(f"--config={spec!r}: {path} defines no get_config()")
    return module.get_config(arg) if arg else module.get_config()
