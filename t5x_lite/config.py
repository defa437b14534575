"""The one configuration tree every command reads, and its `--config.F=V` overrides.

A config is an `ml_collections.ConfigDict` with the sections `model`, `objective`, `train`,
`mesh`, `data`, `checkpoint` and `finetune` (and `sweep` in sweep presets). `default_config()`
returns the whole tree with T5 v1.0 defaults; presets (`t5x_lite.presets`) start from it and
change a few fields.

The ConfigDict is the user interface; `t5x_lite.settings.Settings.from_config` turns it into
typed, validated settings once, where a command starts, with a `ConfigError` that names the
field and the allowed values.
"""
from __future__ import annotations

import ast
import importlib.util
import inspect
import math
import os
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any, Mapping, Sequence

import ml_collections

# Defined in a leaf module so that the architecture registry can raise it too; other modules
# import it from here.
from t5x_lite.errors import ConfigError

MLP_KINDS = ("relu", "gated-gelu")
DTYPES = ("float32", "bfloat16")
ATTENTION_IMPLS = ("auto", "xla", "cudnn", "einsum")
# The kernels that never form the attention weights, so cannot drop them in training
# (`settings.require_trainable`).
FUSED_ATTENTION = ("xla", "cudnn")
OPTIMIZERS = ("adafactor", "adamw")
SCHEDULES = ("rsqrt", "linear", "cosine", "constant")
DECODE_METHODS = ("greedy", "sample", "beam")
EVAL_SELECTIONS = ("sample", "first")
OPTIMIZER_STATES = ("fresh", "continue")
# The ul2 objective's default mixture (`objective.ul2_denoisers`): (kind, noise_density,
# mean_noise_span_length, share) per denoiser, the UL2 paper's seven (section 3.1.2; the S-
# denoiser's mean span is L/4, set by its rate, so its 1.0 is unused), S 20% and the R- and
# X-denoisers 40% each (see `t5x_lite.ul2` for where those shares come from).
UL2_DENOISERS = (
    ("R", 0.15, 3.0, 0.2),
    ("R", 0.15, 8.0, 0.2),
    ("S", 0.25, 1.0, 0.2),
    ("X", 0.5, 3.0, 0.1),
    ("X", 0.5, 8.0, 0.1),
    ("X", 0.15, 64.0, 0.1),
    ("X", 0.5, 64.0, 0.1),
)
# Objective fields only one objective reads, added after runs had been written without them:
# a run of another objective leaves them out of its identity (`grid.config_hash`) and of the
# fields its checkpoints must match (`saved_config.config_differences`).
OBJECTIVE_ONLY_FIELDS = {"ul2_denoisers": "ul2"}


def drop_unread_objective_fields(objective: dict) -> dict:
    """`objective` (a config's objective section as JSON data) less the
    `OBJECTIVE_ONLY_FIELDS` its objective does not read."""
    return {key: value for key, value in objective.items()
            if OBJECTIVE_ONLY_FIELDS.get(key, objective.get("name")) == objective.get("name")}


# Inputs must hold at least one non-noise token, one sentinel and EOS.
MIN_INPUTS_LENGTH = 3
# What `sweep.budget` may match (`t5x_lite.grid`): each point's configured steps, or the
# reference point's pre-training tokens or FLOPs.
BUDGETS = ("steps", "tokens", "flops")
# Token ids shared by the vocabulary, the objectives and the model.
PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
NUM_RESERVED_IDS = 3
# T5's sentinel count: the default of `model.num_sentinels`, of a vocabulary's extra ids and of
# a Hugging Face tokenizer_config.json's `extra_ids`.
DEFAULT_NUM_SENTINELS = 100


def sentinel_id(vocab_size: int, index: Any) -> Any:
    """The id of `<extra_id_index>` in a vocabulary of `vocab_size` ids: the sentinels are its
    top ids, `<extra_id_0>` = vocab_size - 1 counting down (T5's layout; with public T5's
    32000 pieces + 100 sentinels, `<extra_id_0>` = 32099). `index` may be an int or an int
    array (the objectives number their spans on the device)."""
    return vocab_size - 1 - index


def model_config() -> ml_collections.ConfigDict:
    """T5 v1.0 base-sized model settings (the paper's baseline, one stack)."""
    config = ml_collections.ConfigDict(
        dict(
            arch="encoder_decoder",  # a name of t5x_lite.architectures
            vocab_size=32000,  # the vocabulary's ids: SentencePiece pieces + sentinels
            # <extra_id_0> = vocab_size - 1, counting down (`sentinel_id`)
            num_sentinels=DEFAULT_NUM_SENTINELS,
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
            # T5 drops the attention weights too, at dropout_rate, one mask per key shared by
            # every query (the paper's section 2.1; Mesh TF's broadcast over the query length).
            # Training with it needs attention_impl 'auto' or 'einsum' (they form the weights).
            attention_dropout=True,
            layer_norm_epsilon=1e-6,
            dtype="float32",  # compute dtype; parameters are always float32
            # auto: the einsum path off GPU, jax.nn.dot_product_attention's default (its XLA
            # kernel) on GPU; cudnn only when asked for (attention.resolve_implementation)
            attention_impl="auto",
            remat=False,  # recompute each layer's activations in the backward pass (saves memory)
            scan_layers=False,  # run each stack's layers with jax.lax.scan (compile once per stack)
        )
    )
    # None: as deep as the encoder (num_layers); e.g. the t5-efficient checkpoints differ.
    config.num_decoder_layers = ml_collections.config_dict.placeholder(int)
    # None: vocab_size. More rows than ids pad the embedding and the logits, as public T5's
    # 32128 rows for 32000 pieces + 100 sentinels; no id maps to a padding row.
    config.embedding_rows = ml_collections.config_dict.placeholder(int)
    return config


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
            ul2_denoisers=UL2_DENOISERS,  # the ul2 objective's mixture only
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
            weight_decay=0.0,  # AdamW: matrices only; Adafactor: every parameter (T5: 0)
            loss_normalizing_factor=None,  # None: sum of loss weights; a number: that constant
            log_every=10,
            # Held-out pre-training evaluation (`t5x_lite.held_out`): every eval_every steps
            # and at the last, the objective's loss on eval_batches batches of corpus chunks
            # the run never trains on; 0: none. It observes the run and changes no result.
            eval_every=0,
            eval_batches=4,
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
            # True: each run's targets length is the longest of its tasks' own (T5's: 84 for
            # GLUE's, 97 for SQuAD, 512 for CNN/DM's and WMT's), targets_length for a task
            # without one (`evaluation.with_task_lengths`).
            task_lengths=False,
            pack=True,
            # UL2's paradigm token (section 3.2, mode switching), one of
            # batch_format.MODE_TOKENS, put before every task input of fine-tuning, validation,
            # evaluation and zero-shot scoring; None: none (T5's).
            mode_token=None,
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
    # At most N examples of each task's validation split (None: all of them), chosen as
    # eval_selection says: 'sample', one fixed sample of N, the same for every run
    # (`evaluation.select_examples`); 'first', the split's first N (how every run before
    # 2026-12-05 chose them), which for a split sorted by source is not a sample of it (STS-B's
    # first 500 dev pairs are image captions only: two of its six sources, no news or forums).
    config.eval_examples = ml_collections.config_dict.placeholder(int)
    config.eval_selection = "sample"
    config.decode.max_length = ml_collections.config_dict.placeholder(int)  # None: targets_length
    # What the optimiser starts from: 'fresh', a new state and update count (how every run
    # before 2026-12-05 began); 'continue', the pre-training run's state (its optimizer must be
    # the same) and update count carried on, as T5's code does (Mesh TF's `finetune` restores
    # every variable of the pre-trained checkpoint, global step and Adafactor's moments
    # included, and trains `finetune_steps` more; T5X's fine-tuning configs count on from
    # 1,000,000 too), so Adafactor's second-moment decay 1 - t^-0.8 reads the continued count
    # (t = pre-training steps + fine-tuning steps + 1; fresh, it starts at 1: no memory), as
    # would a schedule, hence 'constant' only. The `paper` and `small` presets continue.
    config.optimizer_state = "fresh"
    return config


# ---------------------------------------------------------------------------------------------
# Command-line overrides: `--config.FIELD=VALUE`, parsed the same way by every command

OVERRIDE_PREFIX = "--config."
OVERRIDES_HELP = (
    "--config.FIELD=VALUE sets one field of the config, e.g. --config.train.steps=100; the "
    "value is read as the field's type: int, float, bool (true/false), str as written, a tuple "
    "as a Python literal or comma-separated (--config.mesh.shape='(2, 4)', "
    "--config.finetune.tasks=builtin_reverse,builtin_module; one number is refused: "
    "--config.sweep.seeds='(3,)' is the seed 3, '(0, 1, 2)' three seeds); None sets any field "
    "to None. An unknown field is an error naming it."
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
    node, path = config, []
    for part in field.split("."):
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
            has = (f"; {'.'.join(path) or 'the config'} has {', '.join(node)}"
                   if isinstance(node, ml_collections.ConfigDict) else "")
            raise ConfigError(f"override {field}={value!r}: the config has no field "
                              f"{field!r}{has}")
        parent, node = node, node[part]
        path.append(part)
    return parent, part


def _parse_value(kind: type, value: str) -> Any:
    """`value` (command-line text) as a value of `kind`, the field's current type."""
    if value == "None":
        return None
    if kind is bool:
        if value.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"{value!r} is not a bool (true or false)")
        return value.lower() in ("true", "1")
    if kind is float:
        try:
            return float(value)
        except ValueError:
            raise ValueError(f"{value!r} is not a number") from None
    if kind is int:  # 1e3 is 1000; 3.5 is no integer
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not number.is_integer():
            raise ValueError(f"{value!r} is not an integer")
        return int(number)
    if kind is str:
        return value
    if kind is tuple:
        parsed = _literal(value)
        if isinstance(parsed, str) and "," in value:  # unquoted names: 'a,b' or '(a,b)'
            return tuple(_literal(item.strip()) for item in value.strip("()[] ").split(","))
        if isinstance(parsed, (int, float)) and not isinstance(parsed, bool):
            # sweep.seeds=3 read as the one seed 3 where three seeds were meant
            raise ValueError(f"a list, and one number is ambiguous: write ({parsed!r},) for that "
                             "one value, or every value, e.g. (0, 1, 2)")
        return tuple(parsed) if isinstance(parsed, (tuple, list)) else (parsed,)
    # A None field without a declared type (or another type): a Python literal, else the text.
    return _literal(value)


def _literal(value: str) -> Any:
    """`value` as a Python literal (numbers, tuples, quoted strings), else the text itself."""
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value


def require_override_list(texts: Sequence[str]) -> None:
    """A one-line `ConfigError` unless `texts` is a sequence of strings (one string would be
    read as its characters)."""
    if isinstance(texts, str) or not all(isinstance(text, str) for text in texts):
        raise ConfigError(f"overrides={texts!r} must be a list of 'field=value' strings, e.g. "
                          "['train.steps=100']")


def parse_overrides(config: ml_collections.ConfigDict, texts: Sequence[str]) -> dict[str, Any]:
    """'--config.FIELD=VALUE' (or 'FIELD=VALUE') strings -> {dotted field: value}, each value
    read as the type of that field of `config` (see OVERRIDES_HELP); later ones win.

    Raises `ConfigError` (one line, naming the field) for a missing '=', an unknown field, a
    config section instead of a field, or a value that is not of the field's type.
    """
    require_override_list(texts)
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
        if isinstance(parent[name], ml_collections.ConfigDict):
            raise ConfigError(f"override {field}={value!r}: {field!r} is a config section, not a "
                              f"field (its fields: {', '.join(parent[name])})")
        try:
            parent[name] = value
        except TypeError:  # ml_collections' words: "... cannot be casted to type <class ...>"
            raise ConfigError(f"override {field}={value!r}: the field holds "
                              f"{parent.get_type(name).__name__} values, not "
                              f"{type(value).__name__}") from None


def user_code_error(path: str | os.PathLike, error: BaseException) -> str:
    """'PATH line N: Type: message' for `error` raised while a researcher's file `path` (a
    config or experiment file) ran: the line of its last frame in that file, the place to look
    (a traceback of the library's frames would bury it). A syntax error names its own line."""
    if isinstance(error, SyntaxError):
        return f"{path} line {error.lineno}: {error.msg}"
    mine = [frame for frame in traceback.extract_tb(error.__traceback__)
            if Path(frame.filename).resolve() == Path(path).resolve()]
    where = f"{path} line {mine[-1].lineno}" if mine else str(path)
    return f"{where}: {type(error).__name__}: {error}"


def run_user_file(path: str | os.PathLike, module_name: str, what: str) -> ModuleType:
    """Run a researcher's Python file `path` as the module `module_name`; anything it raises
    is a one-line `ConfigError`, "`what`: `user_code_error`"."""
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module  # before running it: dataclasses look themselves up
    try:
        module_spec.loader.exec_module(module)
    except Exception as error:  # the file's own fault: its line, not a traceback
        del sys.modules[module_name]
        raise ConfigError(f"{what}: {user_code_error(path, error)}") from None
    return module


def call_get_config(path: str | os.PathLike, get_config: Any, *args: Any,
                    what: str) -> ml_collections.ConfigDict:
    """`get_config(*args)`, the config function of the researcher's file `path` (a config or
    an experiment file); anything it raises is a one-line `ConfigError` ("`what`:
    `user_code_error`"; a `ConfigError` of the library's, e.g. an unknown preset it passed on,
    keeps its own words), and so is a result that is not a ConfigDict."""
    try:
        config = get_config(*args)
    except ConfigError as error:
        raise ConfigError(f"{what}: {error}") from None
    except Exception as error:  # the file's own fault: its line, not a traceback
        raise ConfigError(f"{what}: {user_code_error(path, error)}") from None
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigError(f"{what} returned {type(config).__name__}, not an "
                          "ml_collections.ConfigDict")
    return config


def load_config_file(spec: str) -> ml_collections.ConfigDict:
    """The config of an ml_collections config file, `path.py` or `path.py:ARG`: the file's
    `get_config()`, or `get_config(ARG)` (as `config_flags.DEFINE_config_file` reads it).
    Whatever the file gets wrong (a syntax error, an exception as it runs, no get_config, a
    get_config that raises or returns no ConfigDict) is a one-line `ConfigError`."""
    path, _, arg = spec.partition(":")
    if not path.endswith(".py"):
        raise ConfigError(f"--config={spec!r}: {path!r} is not a .py file; give an "
                          "ml_collections config file (e.g. configs/tiny.py) or use --preset")
    if not os.path.isfile(path):
        raise ConfigError(f"--config={spec!r}: {os.path.abspath(path)} does not exist (a "
                          f"relative path is read from {os.getcwd()}; the presets' files are in "
                          "the repository's configs/)")
    module = run_user_file(path, f"t5x_lite_config_{Path(path).stem}", f"--config={spec!r}")
    get_config = getattr(module, "get_config", None)
    if not callable(get_config):
        raise ConfigError(f"--config={spec!r}: {path} defines no get_config()")
    try:  # the call's arguments checked before it runs: a TypeError inside is the file's own
        inspect.signature(get_config).bind(*([arg] if arg else []))
    except TypeError:
        usage = ("takes no argument; drop ':ARG'" if arg else
                 f"needs an argument: --config={path}:ARG")
        raise ConfigError(f"--config={spec!r}: {path}'s get_config {usage}") from None
    return call_get_config(path, get_config, *([arg] if arg else []),
                           what=f"--config={spec!r}: {path}'s get_config")
