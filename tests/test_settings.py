"""The typed settings are the whole config: every field typed, every bad value named.

A config field added without a settings field (or the other way round) fails
`test_every_preset_maps_to_the_settings_and_back`; nothing here builds an array.
"""
import dataclasses
import re
import typing

import ml_collections
import pytest

from t5x_lite import partitioning, presets, settings
from t5x_lite.config import ConfigError, default_config
from t5x_lite.settings import Settings


def _configs():
    yield "default", default_config()
    for name in presets.PRESETS:
        yield name, presets.get_preset(name)
        yield f"sweep_preset({name})", presets.sweep_preset(name)
        yield f"finetune_preset({name})", presets.finetune_preset(name)


CONFIGS = dict(_configs())


@pytest.mark.parametrize("name", CONFIGS)
def test_every_preset_maps_to_the_settings_and_back(name):
    config = CONFIGS[name]
    typed = dataclasses.asdict(Settings.from_config(config))
    if typed["sweep"] is None:
        del typed["sweep"]  # only sweep presets have the section
    expected = config.to_dict()
    # The one field the settings normalise: every rule's target a tuple of mesh axes.
    expected["mesh"]["rules"] = tuple(partitioning.normalize_rules(expected["mesh"]["rules"])
                                      .items())
    assert typed == expected


def _sections(cls):
    """(path, section class) of `cls` and of the sections inside it."""
    for field in dataclasses.fields(cls):
        hint = typing.get_type_hints(cls)[field.name]
        hint = next((h for h in typing.get_args(hint) if h is not type(None)), hint)
        if dataclasses.is_dataclass(hint):
            yield hint
            yield from _sections(hint)


def test_every_field_is_annotated_with_a_type_the_checks_know():
    # An annotation `_is_a` cannot read would reject every value, or accept any.
    for section in _sections(Settings):
        for field in dataclasses.fields(section):
            hint = typing.get_type_hints(section)[field.name]
            options = typing.get_args(hint) if typing.get_origin(hint) is not tuple else [hint]
            for option in options or [hint]:
                origin = typing.get_origin(option) or option
                assert origin in (int, float, bool, str, tuple, type(None)) or \
                    dataclasses.is_dataclass(origin), (section.NAME, field.name, hint)


@pytest.mark.parametrize("path, value, message", [
    ("model.arch", "rnn", "model.arch='rnn' is not allowed; choose one of encoder_decoder"),
    ("model.d_model", 0, "model.d_model=0 must be an integer >= 1"),
    ("model.num_sentinels", -1, "model.num_sentinels=-1 must be an integer >= 0"),
    ("model.dropout_rate", 1.0, r"model.dropout_rate=1.0 must be in \[0, 1\)"),
    ("model.scan_layers", None, "model.scan_layers=None must be True or False"),
    ("model.attention_dropout", 1, "model.attention_dropout=1 must be True or False"),
    ("model.attention_impl", "cudnn", r"model.attention_impl='cudnn' needs model.dtype="
                                      r"'bfloat16' \(cuDNN's fused attention takes no float32\)"),
    ("model.vocab_size", 50, "model.vocab_size=50 is too small for model.num_sentinels=100"),
    ("objective.name", "mlm", "objective.name='mlm' is not allowed; choose one of "
                              "span_corruption"),
    ("objective.noise_density", 1.5, r"objective.noise_density=1.5 is not allowed; it must be "
                                     r"a number in \(0, 1\)"),
    ("objective.inputs_length", 2, "objective.inputs_length=2 is not allowed; it must be an "
                                   "integer >= 3"),
    ("objective.targets_length", "long", "objective.targets_length='long' must be of type "
                                         "int | None"),
    ("train.optimizer", "sgd", "train.optimizer='sgd' is not allowed; choose one of adafactor, "
                               "adamw"),
    ("train.learning_rate", 0.0, "train.learning_rate=0.0 must be a positive number"),
    ("train.warmup_steps", 3000, "train.warmup_steps=3000 must be <= train.steps=2000 for "
                                 "train.schedule='cosine'; with fewer steps, set "
                                 "--config.train.warmup_steps too"),
    ("train.label_smoothing", 1.0, r"train.label_smoothing=1.0 must be in \[0, 1\)"),
    ("train.seed", None, r"train.seed=None must be an integer in \[0, 2147483647\]"),
    # numpy's generator refused a negative seed, and 2^64 overflowed, after the run had begun.
    ("train.seed", -1, r"train.seed=-1 must be an integer in \[0, 2147483647\]"),
    ("train.seed", 2**40, r"train.seed=1099511627776 must be an integer in \[0, 2147483647\]"),
    ("train.microbatches", 3, "train.batch_size=16 must be a multiple of train.microbatches=3"),
    ("train.eval_every", -1, "train.eval_every=-1 must be an integer >= 0"),
    ("train.eval_batches", 0, "train.eval_batches=0 must be an integer >= 1"),
    ("mesh.rules", (("batch", "data"), ("nope", None)), "mesh.rules names unknown logical "
                                                        "axis 'nope'"),
    ("mesh.shape", None, "mesh.shape=None must be of type tuple"),
    ("data.tasks", ("a", 1), r"data.tasks=\('a', 1\) must be of type tuple\[str, ...\]"),
    ("data.corpus", None, "data.corpus=None must be of type str"),
    ("checkpoint.every", 0, "checkpoint.every=0 must be an integer >= 1"),
    ("checkpoint.keep", 1.5, r"checkpoint.keep=1.5 must be an integer >= 1"),
    ("finetune.steps", 0, "finetune.steps=0 must be an integer >= 1"),
    # At 1, every example was cut to its EOS alone, with a warning only.
    ("finetune.inputs_length", 1, "finetune.inputs_length=1 must be an integer >= 2"),
    ("finetune.targets_length", 1, "finetune.targets_length=1 must be an integer >= 2"),
    ("finetune.schedule", "rsqrt", "finetune.warmup_steps=0 must be >= 1 for "
                                   "finetune.schedule='rsqrt'"),
    ("finetune.eval_examples", 0, "finetune.eval_examples=0 must be an integer >= 1"),
    ("finetune.pack", None, "finetune.pack=None must be True or False"),
    ("finetune.decode.method", "nucleus", "finetune.decode.method='nucleus' is not allowed; "
                                          "choose one of greedy, sample, beam"),
    ("finetune.decode.alpha", -1.0, "finetune.decode.alpha=-1.0 must be >= 0"),
    ("sweep.budget", "joules", "sweep.budget='joules' is not allowed; choose one of steps, "
                               "tokens, flops"),
    ("sweep.tasks", (), r"sweep.tasks=\(\) must be a non-empty list of task names"),
    ("sweep.seeds", (0, "1"), r"sweep.seeds='1' must be an integer in \[0, 2147483647\]"),
    ("sweep.seeds", (), r"sweep.seeds=\(\) must be a non-empty list of seeds"),
    ("sweep.seeds", (0, -1), r"sweep.seeds=-1 must be an integer in \[0, 2147483647\]"),
    ("sweep.seeds", (0, 0), r"sweep.seeds=\(0, 0\) repeats an entry; give each once"),
    ("sweep.tasks", ("builtin_module", "builtin_module"),
     r"sweep.tasks=\('builtin_module', 'builtin_module'\) repeats an entry"),
    # NaN passes every comparison unnoticed: a run of it trained, then stopped at a NaN loss.
    ("train.learning_rate", float("nan"), "train.learning_rate=nan must be a finite number"),
    ("train.learning_rate", float("inf"), "train.learning_rate=inf must be a finite number"),
    ("train.z_loss", float("nan"), "train.z_loss=nan must be a finite number"),
    ("finetune.decode.alpha", float("inf"), "finetune.decode.alpha=inf must be a finite number"),
    # 32 buckets and max distance 16: the decoder's exact buckets reach 16, every logit NaN.
    ("model.relpos_max_distance", 16, r"model.relpos_buckets=32 and model.relpos_max_distance="
                                      r"16: need relpos_buckets >= 4 and relpos_max_distance > "
                                      r"16, the exact-distance buckets of a causal stack"),
])
def test_a_bad_value_is_a_one_line_error_naming_the_field(path, value, message):
    # Not type-safe: as a config read back from JSON, whose fields take values of any type.
    config = ml_collections.ConfigDict(presets.sweep_preset("tiny").to_dict(), type_safe=False)
    config.update_from_flattened_dict({path: value})
    with pytest.raises(ConfigError, match=f"^{message}") as error:
        Settings.from_config(config)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("d_kv, message", [
    (12, "model.attention_impl='cudnn' needs model.d_kv a multiple of 8 and at most 256 "
         r"\(cuDNN's fused attention\), not 12; or choose 'auto', 'xla' or 'einsum'"),
    (264, "model.attention_impl='cudnn' needs model.d_kv a multiple of 8 and at most 256"),
    (64, None),
])
def test_cudnn_attention_needs_a_head_dimension_its_kernel_takes(d_kv, message):
    config = presets.sweep_preset("tiny")
    config.model.update(attention_impl="cudnn", dtype="bfloat16", d_kv=d_kv)
    if message is None:
        assert Settings.from_config(config).model.d_kv == d_kv
        return
    with pytest.raises(ConfigError, match=f"^{message}") as error:
        Settings.from_config(config)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("impl, attention_dropout, rate, refused", [
    ("xla", True, 0.1, True), ("cudnn", True, 0.1, True),
    ("xla", False, 0.1, False), ("cudnn", True, 0.0, False),
    ("einsum", True, 0.1, False), ("auto", True, 0.1, False),
])
def test_training_refuses_dropped_attention_weights_on_a_kernel_that_forms_none(
        impl, attention_dropout, rate, refused):
    """The fused kernels never form the softmax weights, so T5's dropout on them (on by
    default wherever model.dropout_rate > 0) needs the einsum path; evaluating is fine."""
    config = presets.sweep_preset("tiny")
    config.model.update(attention_impl=impl, dtype="bfloat16", attention_dropout=attention_dropout,
                        dropout_rate=rate)
    model = Settings.from_config(config).model  # typed: an eval config may name any kernel
    if not refused:
        settings.require_trainable(model)
        return
    with pytest.raises(ConfigError, match=(
            f"^model.attention_impl='{impl}' never forms the attention weights, so it cannot "
            r"drop them \(model.attention_dropout=True, model.dropout_rate=0.1\): choose 'auto' "
            "or 'einsum', or set --config.model.attention_dropout=False$")):
        settings.require_trainable(model)


@pytest.mark.parametrize("section", ["model", "objective", "train", "mesh", "data", "checkpoint",
                                     "finetune", "finetune.decode", "sweep"])
def test_an_unknown_or_missing_field_is_an_error_naming_it(section):
    config = presets.sweep_preset("tiny")
    node = config
    for part in section.split("."):
        node = node[part]
    node.surplus = 1
    with pytest.raises(ConfigError, match=rf"^{re.escape(section)}.surplus is not a field of "
                                          rf"the config; the {re.escape(section)} section has "):
        Settings.from_config(config)
    del node["surplus"]
    first = next(iter(node.keys()))
    del node[first]
    with pytest.raises(ConfigError, match=rf"^{re.escape(section)}.{first} is missing from the "
                                          "config$"):
        Settings.from_config(config)


def test_an_unknown_or_missing_section_is_an_error_naming_it():
    config = default_config()
    config.extra = {"x": 1}
    with pytest.raises(ConfigError, match="^extra is not a section of the config"):
        Settings.from_config(config)
    del config["extra"], config["checkpoint"]
    with pytest.raises(ConfigError, match="^the config has no checkpoint section$"):
        Settings.from_config(config)


def test_settings_are_hashable_and_equal_for_equal_configs():
    config = presets.sweep_preset("tiny")
    same = presets.sweep_preset("tiny")
    # Lists, as a config read back from JSON holds them, read as the tuples they were.
    same.mesh.rules = [list(rule) for rule in same.mesh.rules]
    same.data.tasks = []
    assert Settings.from_config(config) == Settings.from_config(same)
    assert hash(Settings.from_config(config)) == hash(Settings.from_config(same))
    same.train.seed = 1
    assert Settings.from_config(config) != Settings.from_config(same)
    distinct = {c.to_json_best_effort(sort_keys=True) for c in CONFIGS.values()}
    assert len({Settings.from_config(c) for c in CONFIGS.values()}) == len(distinct)
    with pytest.raises(dataclasses.FrozenInstanceError):
        Settings.from_config(config).train.seed = 2


def test_a_section_reads_a_plain_mapping_and_the_model_settings_pass_through():
    model = settings.Model.from_config(default_config().model.to_dict())
    assert settings.model_settings(model) is model
    assert settings.model_settings(default_config().model) == model


def test_embedding_rows_may_pad_the_vocabulary_but_not_cut_it():
    config = default_config()
    config.model.embedding_rows = 32128  # public T5: 32000 pieces + 100 sentinels, padded
    model = Settings.from_config(config).model
    assert (model.num_embeddings, model.vocab_size) == (32128, 32000)
    config.model.embedding_rows = 31999
    with pytest.raises(ConfigError, match=r"model.embedding_rows=31999 must be None or >= "
                                          r"model.vocab_size=32000"):
        Settings.from_config(config)
