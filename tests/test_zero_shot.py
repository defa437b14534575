"""Zero-shot scoring: the ranking rule against a per-option loop over `decoding.score` for every
batch family, one compile for all batches, the sweep stage (records, report, resume) and bad
input.

A made-up classification task, `test_letters` ("pick: c a f" -> one of three label options),
is registered for the module; its targets are whatever a model ranks first, found here by
scoring each (example, option) row on its own.
"""
import json

import jax
import numpy as np
import pytest
from flax import nnx

from t5x_lite import (architectures, batch_format, decoding, models, partitioning, report,
                      sweep, zero_shot)
from t5x_lite.config import ConfigError, EOS_ID
from t5x_lite.data import pipeline, tasks
from t5x_lite.evaluation import TaskSplit
from t5x_lite.settings import Sweep
from tiny_configs import tiny_finetune_config

OPTIONS = ("a", "b", "e f")
INPUTS = ["pick: a b", "pick: c", "pick: f f e", "pick: d a c", "pick: e", "pick: b b b"]


def letters_task(name, targets):
    """A classification task over OPTIONS whose validation examples are INPUTS -> `targets`."""
    return tasks.Task(name, lambda split, data_dir, data_root: [
        {"inputs": x, "target": y} for x, y in zip(INPUTS, targets)],
        lambda r: tasks.Example(r["inputs"], r["target"], (r["target"],)), ("accuracy",),
        {"validation": "validation"},
        postprocess=lambda text: tasks.label_to_class_id(text, OPTIONS), label_options=OPTIONS)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """(corpus glob, data dir): made-up words, and letter lines that make each letter a piece."""
    root = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(0)
    words = ["".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), rng.integers(2, 7)))
             for _ in range(300)]
    lines = [" ".join(rng.choice(words, 8)) for _ in range(300)]
    lines += ["pick: " + " ".join(rng.choice(list("abcdef"), 6)) for _ in range(1000)]
    (root / "corpus.txt").write_text("\n".join(lines) + "\n")
    return root / "corpus.txt", root / "cache"


def random_model(config):
    """A model of `config` with large random weights: its rankings depend on the inputs."""
    model = models.build_model(config.model, nnx.Rngs(0))
    rng = np.random.default_rng(0)
    nnx.update(model, jax.tree_util.tree_map_with_path(
        lambda path, x: (rng.uniform(0.5, 1.5, x.shape) if "norm" in jax.tree_util.keystr(path)
                         else rng.normal(0.0, 1.0, x.shape)).astype(x.dtype),
        nnx.state(model, nnx.Param)))
    return model


def option_by_option(config, model):
    """float `[examples, options]`: each (example, option) row scored alone by
    `decoding.score`, the direct transcription of 'every option's summed log-likelihood'."""
    vocab = pipeline.vocabulary_from_config(config)
    ft = config.finetune
    family = architectures.get(config.model.arch).family
    table = np.zeros((len(INPUTS), len(OPTIONS)))
    for i, text in enumerate(INPUTS):
        for k, option in enumerate(OPTIONS):
            pair = (vocab.encode(text) + [EOS_ID], vocab.encode(option) + [EOS_ID])
            batch, = pipeline.pad_examples([pair], 1, ft.inputs_length, ft.targets_length,
                                           family=family, mask_token=batch_format.mask_token(config.model.vocab_size))
            table[i, k] = decoding.score(model, batch)[0]
    return table


@pytest.mark.parametrize("arch", ["encoder_decoder", "language_model", "prefix_lm",
                                  "encoder_only"])
def test_the_best_ranked_option_is_the_prediction_for_every_family(arch, data):
    config = tiny_finetune_config(arch, *data)
    config.finetune.update(batch_size=4, eval_examples=None)  # 18 rows: 5 batches, one padded
    model = random_model(config)
    expected = option_by_option(config, model)
    best = [OPTIONS[k] for k in expected.argmax(1)]
    assert len(set(best)) > 1  # the ranking depends on the inputs
    changed = list(best)
    changed[2] = next(option for option in OPTIONS if option != best[2])
    names = ["test_letters", "test_letters_one_changed"]
    for name, targets in zip(names, (best, changed)):
        tasks.TASKS[name] = letters_task(name, targets)
    try:
        vocab = pipeline.vocabulary_from_config(config)
        splits = [TaskSplit(tasks.TASKS[name], "validation", config, vocab)
                  for name in names]
        scorer = zero_shot.ZeroShotScorer(config, splits, vocab,
                                          partitioning.make_mesh(config.mesh))
        params = nnx.state(model, nnx.Param)
        compiled_before = decoding._score_program._cache_size()
        likelihoods = scorer.log_likelihoods(params)
        assert decoding._score_program._cache_size() == compiled_before + 1  # 10 batches
        for table in likelihoods:
            np.testing.assert_allclose(table, expected, rtol=1e-4, atol=1e-4)
        assert zero_shot.evaluate(config, model, names) == {
            names[0]: {"accuracy": 100.0}, names[1]: {"accuracy": pytest.approx(100.0 * 5 / 6)}}
    finally:
        for name in names:
            del tasks.TASKS[name]


def test_bad_input_is_one_line_naming_the_field(data):
    config = tiny_finetune_config("encoder_decoder", *data)
    with pytest.raises(ConfigError, match=r"^tasks: task 'builtin_reverse' has no label "
                                          r"options[^\n]*$"):
        zero_shot.evaluate(config, random_model(config), ["builtin_reverse"])
    config.finetune.targets_length = 2
    tasks.TASKS["test_letters"] = letters_task("test_letters", ["a"] * len(INPUTS))
    try:
        with pytest.raises(ConfigError, match=r"finetune.targets_length=2 is too short for task "
                                              r"'test_letters'.*at least \d+$"):
            zero_shot.evaluate(config, random_model(config), ["test_letters"])
    finally:
        del tasks.TASKS["test_letters"]
    section = dict(tasks=("builtin_module",), seeds=(0,), progress=False, budget="steps",
                   budget_reference=None, zero_shot="yes")
    with pytest.raises(ConfigError, match=r"^sweep.zero_shot='yes' must be True or False$"):
        Sweep.from_config(section)


def test_glue_and_builtin_classification_tasks_carry_their_label_words():
    assert tasks.TASKS["glue_mnli"].label_options == ("entailment", "neutral", "contradiction")
    assert tasks.TASKS["local_glue_wnli"].label_options == ("not_entailment", "entailment")
    assert tasks.TASKS["builtin_module"].label_options == ("asyncio", "email", "logging", "xml")
    for name in ("glue_stsb", "builtin_reverse", "squad", "wmt_ende"):
        assert zero_shot.not_applicable(tasks.TASKS[name])
