"""The step settings are the whole description of a compiled step: no field can be forgotten.

Every leaf of the config sections the step reads either changes `step_settings` (and so the
program its configs share) or is listed in `NOT_IN_THE_PROGRAM`; a field added to the config
fails `test_every_field_of_the_step_sections_is_in_the_settings_or_listed_as_not` until it is
classified one way or the other (and, before that, `Settings.from_config` until it is typed).
Nothing here compiles.
"""
import dataclasses

import pytest

from t5x_lite import architectures, objectives, partitioning, settings, train_step
from t5x_lite.config import (
    ATTENTION_IMPLS,
    DTYPES,
    MLP_KINDS,
    OPTIMIZERS,
    SCHEDULES,
    ConfigError,
    flat_fields,
)
from t5x_lite.step_settings import NOT_IN_THE_PROGRAM, STEP_SECTIONS, step_settings
from tiny_configs import tiny_train_config

_CHOICES = {"model.arch": architectures.names(), "model.mlp": MLP_KINDS, "model.dtype": DTYPES,
            "model.attention_impl": ATTENTION_IMPLS, "train.optimizer": OPTIMIZERS,
            "train.schedule": SCHEDULES}


# Integer fields that default to None, and a valid value for the base config instead.
_INSTEAD_OF_NONE = {"model.num_decoder_layers": 3, "model.embedding_rows": 192}


def _base():
    # A schedule that ends at train.steps, so that every train field is read.
    return tiny_train_config(mesh=(1, 1), schedule="linear")


def _other_value(path, value):
    """A valid value of the field at `path` other than `value`."""
    if path in _CHOICES:
        return next(choice for choice in _CHOICES[path] if choice != value)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value / 2 + 0.01
    if value is None:
        return _INSTEAD_OF_NONE.get(path, 2.0)
    if isinstance(value, (tuple, list)):
        return tuple(value)[:-1]
    return f"{value}_other"


def _with(config, path, value):
    config = config.copy_and_resolve_references()
    *sections, name = path.split(".")
    section = config
    for part in sections:
        section = section[part]
    section[name] = value
    return config


def _misclassified(config):
    """The leaves of the step's sections whose change alters the settings although they are
    listed as not in the program, or leaves them alone although they are not listed."""
    before = step_settings(config)
    wrong = []
    for section in STEP_SECTIONS:
        for path, value in flat_fields(config[section].to_dict(), f"{section}.").items():
            changed = step_settings(_with(config, path, _other_value(path, value))) != before
            if changed == (path in NOT_IN_THE_PROGRAM):
                wrong.append(path)
    return wrong


def test_every_field_of_the_step_sections_is_in_the_settings_or_listed_as_not():
    assert _misclassified(_base()) == []


def test_a_new_field_fails_until_it_is_typed_and_classified(monkeypatch):
    config = _base()
    config.train.gradient_clipping = 1.0  # read by a step, say
    with pytest.raises(ConfigError, match="train.gradient_clipping is not a field"):
        step_settings(config)  # not typed yet: `settings.Train` has no such field
    typed = dataclasses.make_dataclass("Train", [("gradient_clipping", float)],
                                       bases=(settings.Train,), frozen=True)
    monkeypatch.setattr(settings, "Train", typed)
    # Typed, but not copied into the step settings nor listed as not in the program.
    assert _misclassified(config) == ["train.gradient_clipping"]


def test_programs_are_shared_exactly_when_the_settings_are_equal():
    config = _base()
    layout = objectives.layout_from_config(config)
    mesh = partitioning.make_mesh(config.mesh)
    program = train_step.make_train_step(config, layout, mesh).program
    elsewhere = _with(_with(config, "train.seed", 7), "train.log_every", 3)
    assert train_step.make_train_step(elsewhere, layout, mesh).program is program
    for path, value in (("train.z_loss", 0.0), ("model.dropout_rate", 0.1)):
        other = _with(config, path, value)
        assert train_step.make_train_step(other, layout, mesh).program is not program, path


def test_one_program_for_the_decoder_only_archs_and_for_any_rsqrt_run_length():
    lm, prefix = tiny_train_config("language_model"), tiny_train_config("prefix_lm")
    assert step_settings(lm) == step_settings(prefix)
    assert step_settings(lm).model.arch == "prefix_lm"  # the program's model; the flag is traced
    assert step_settings(_with(lm, "train.steps", 7)) == step_settings(lm)  # rsqrt: no end
    linear = _with(lm, "train.schedule", "linear")
    assert step_settings(_with(linear, "train.steps", 7)) != step_settings(linear)


def test_settings_are_hashable_whatever_form_the_rules_take():
    config = _base()
    as_lists = _with(config, "mesh.rules", [list(rule) for rule in config.mesh.rules])
    assert hash(step_settings(as_lists)) == hash(step_settings(config))
    assert step_settings(as_lists) == step_settings(config)


def test_vmap_groups_need_equal_settings_and_an_equal_loop_and_pipeline():
    config = _base()
    points = [config, _with(_with(config, "objective.name", "prefix_lm"), "train.seed", 3)]
    train_step.require_one_group(points)  # objective and seed are the step's per-point data
    assert len({train_step.vmap_group_key(c) for c in points}) == 1
    rsqrt = _with(config, "train.schedule", "rsqrt")
    # train.steps is in no rsqrt program, but the points share one loop; data: one pipeline.
    for path, value in (("train.steps", 7), ("data.corpus", "elsewhere"), ("model.d_ff", 128)):
        with pytest.raises(ConfigError, match=rf"configs\[1\] differs from configs\[0\] in "
                                              rf"{path}; points"):
            train_step.require_one_group([rsqrt, _with(rsqrt, path, value)])


def test_bad_rules_are_rejected_naming_the_field():
    config = _with(_base(), "mesh.rules", (("batch", "data"), ("no_such_axis", None)))
    with pytest.raises(ConfigError, match="mesh.rules names unknown logical axis"):
        step_settings(config)
