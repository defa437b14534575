"""Held-out pre-training evaluation (`t5x_lite.held_out`): what it scores, that it changes no
training step, its records, and a run too long for its corpus refused before any step."""
import json
import shutil

import jax
import numpy as np
import pytest

from t5x_lite import (evaluation, grid, held_out, objectives, partitioning, train, train_state,
                      train_step)
from t5x_lite.config import ConfigError
from t5x_lite.data import pipeline
from t5x_lite.held_out import HELD_OUT

from tiny_configs import tiny_train_config, write_letter_corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("held_out")
    return write_letter_corpus(root, "letters", "abcdefgh")


def _config(corpus, **train_fields):
    text, data_dir = corpus
    config = tiny_train_config(mesh=(1, 1), log_every=1, **train_fields)
    config.train.update(steps=6)
    config.data.update(corpus=str(text), data_dir=str(data_dir))
    config.checkpoint.update(every=100, keep=1)
    return config


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_held_out_loss_is_the_final_model_on_the_seed_s_held_out_batches(corpus, tmp_path):
    config = _config(corpus, eval_every=4, eval_batches=2)
    summary = train.train(config, tmp_path / "on", progress=False)
    plain = train.train(_config(corpus), tmp_path / "off", progress=False)

    # Observing changes nothing: the same steps, to the bit.
    losses = [[r["loss"] for r in _records(tmp_path / name / "metrics.jsonl")]
              for name in ("on", "off")]
    assert losses[0] == losses[1] and len(losses[0]) == 6
    assert not (tmp_path / "off" / "eval.jsonl").exists()
    assert plain["held_out_loss"] is None

    # Every eval_every steps and at the last.
    evaluations = _records(tmp_path / "on" / "eval.jsonl")
    assert [(r["step"], r["task"]) for r in evaluations] == [(4, HELD_OUT), (6, HELD_OUT)]
    assert summary["held_out_loss"] == evaluations[-1]["loss"]
    assert summary["held_out_token_accuracy"] == evaluations[-1]["token_accuracy"]
    assert summary["held_out_curve"] == [[r["step"], r["loss"]] for r in evaluations]
    assert summary["held_out_examples"] == evaluations[0]["examples"] == evaluations[1]["examples"]
    assert evaluations[0]["loss"] != evaluations[1]["loss"]

    # Recomputed by hand: the last parameters on the held-out chunks, corrupted with the
    # seed's held-out keys, no dropout; the mean loss over every target token.
    mesh = partitioning.make_mesh(config.mesh)
    params = evaluation.params_of(config, str(tmp_path / "on"), mesh)
    layout = objectives.layout_from_config(config)
    _, data = pipeline.pretrain_data_from_config(config, layout.raw_length)
    spec = objectives.spec_from_config(config.objective)
    loss_sums = train_step.loss_sums_fn(config)
    total = {"cross_entropy": 0.0, "z_loss": 0.0, "correct": 0.0, "weight": 0.0}
    for index in range(2):
        batch = objectives.corrupt(data.held_out_batch(index), spec,
                                   train_state.held_out_key(config.train.seed, index), layout)
        for name, value in jax.device_get(loss_sums(params, batch, None)).items():
            total[name] += float(value)
    expected = (total["cross_entropy"] + total["z_loss"]) / total["weight"]
    np.testing.assert_allclose(evaluations[-1]["loss"], expected, rtol=1e-5)
    np.testing.assert_allclose(evaluations[-1]["token_accuracy"],
                               100 * total["correct"] / total["weight"], rtol=1e-5)
    # None of those chunks was trained on: the run stayed short of them.
    assert 6 <= data.steps_before_held_out

    # The finished run without it, run again with it: no step, its final model scored once.
    trained = (tmp_path / "off" / "metrics.jsonl").read_text()
    later = train.train(config, tmp_path / "off", progress=False)
    assert (tmp_path / "off" / "metrics.jsonl").read_text() == trained
    assert [(r["step"], r["loss"], r["examples"])
            for r in _records(tmp_path / "off" / "eval.jsonl")] == [
        (6, evaluations[-1]["loss"], evaluations[-1]["examples"])]
    assert later["held_out_curve"] == [[6, evaluations[-1]["loss"]]]
    train.train(config, tmp_path / "off", progress=False)  # already scored: nothing added
    assert len(_records(tmp_path / "off" / "eval.jsonl")) == 1


def test_a_run_that_would_train_on_its_held_out_text_is_refused_before_any_step(corpus,
                                                                                tmp_path):
    config = _config(corpus, eval_every=4, eval_batches=2)
    config.train.update(steps=100_000, warmup_steps=1)
    with pytest.raises(ConfigError, match="^train.steps=100000 x train.batch_size=8 chunks and "
                                          "train.eval_batches=2 held-out batches need more") as error:
        train.train(config, tmp_path / "run", progress=False)
    assert "\n" not in str(error.value) and "train.eval_every=0" in str(error.value)
    # Refused before the run writes anything (its metrics, events, checkpoint folder were left).
    assert not (tmp_path / "run").exists()


def test_a_run_reports_only_held_out_losses_of_its_own_trajectory(corpus, tmp_path):
    """Found by a review: a run restarted (or resumed) with the evaluation off reported the
    replaced run's held-out losses; a finished run resumed to fewer steps scored its last
    state under the lower step number; a refused --steps past the held-out text deleted the
    finished run first (--restart) since only train.steps was checked before the set-up."""
    evaluated = _config(corpus, eval_every=3, eval_batches=2)
    first = train.train(evaluated, tmp_path / "run", progress=False)
    assert [step for step, _ in first["held_out_curve"]] == [3, 6]
    # Resumed to fewer steps than it holds: nothing new (its step-6 score stands).
    again = train.train(evaluated, tmp_path / "run", steps=5, progress=False)
    assert again["held_out_curve"] == first["held_out_curve"] and again["step"] == 6
    # Refused before --restart deletes anything.
    with pytest.raises(ConfigError, match=r"^train.steps=100000 x train.batch_size"):
        train.train(evaluated, tmp_path / "run", steps=100_000, restart=True, progress=False)
    assert train.train(evaluated, tmp_path / "run", progress=False)["start_step"] == 6
    # Resumed scoring other held-out examples: its curve would mix two sets, so it says so.
    more = _config(corpus, eval_every=3, eval_batches=1)
    more.train.steps = 9
    with pytest.warns(UserWarning, match=r"its held-out losses of steps 3-6 scored other "
                                         r"examples than it scores now"):
        train.train(more, tmp_path / "run", progress=False)
    # Restarted with the evaluation off: no held-out loss, none of the old run's.
    restarted = train.train(_config(corpus), tmp_path / "run", restart=True, progress=False)
    assert (restarted["held_out_loss"], restarted["held_out_curve"]) == (None, [])
    assert not _records(tmp_path / "run" / "eval.jsonl")


def test_a_finished_run_laid_out_otherwise_is_scored_but_not_trained_on(corpus, tmp_path):
    """A finished sweep point whose grid later gained a row with longer examples: switching
    the held-out evaluation on scores its final model (no example is read to train), where
    training it further is refused (its examples would be cut otherwise), and so is going
    on from an older step that a damaged final one falls back to."""
    config, evaluated = _config(corpus), _config(corpus, eval_every=3, eval_batches=1)
    for run in (config, evaluated):
        run.checkpoint.update(every=2, keep=3)
    train.train(config, tmp_path / "run", progress=False)
    saved = tmp_path / "run" / "checkpoints" / "batch_layout.json"
    before = json.loads(saved.read_text())
    saved.write_text(json.dumps({**before, "raw_length": before["raw_length"] + 5}))
    scored = train.train(evaluated, tmp_path / "run", progress=False)
    assert scored["held_out_loss"] is not None and scored["start_step"] == 6
    with pytest.raises(ConfigError, match="pre-trained on examples laid out otherwise"):
        train.train(config, tmp_path / "run", steps=8, progress=False)
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "6" / "default")
    with pytest.warns(UserWarning, match="step 6 .* is unreadable"), pytest.raises(
            ConfigError, match="pre-trained on examples laid out otherwise"):
        train.train(evaluated, tmp_path / "run", progress=False)


def test_switching_the_evaluation_on_keeps_a_sweep_point_s_identity(corpus):
    config = _config(corpus)
    observed = _config(corpus, eval_every=4, eval_batches=2)
    assert grid.config_hash(observed) == grid.config_hash(config)
    config.train.steps = 7
    assert grid.config_hash(observed) != grid.config_hash(config)


def _fingerprint(config):
    layout = objectives.layout_from_config(config)
    _, data = pipeline.pretrain_data_from_config(config, layout.raw_length)
    mesh = partitioning.make_mesh(config.mesh)
    return held_out.HeldOut(config, layout, data, mesh, steps=1).examples


def _changed(corpus, arch="encoder_decoder", seed=0, **objective_fields):
    config = _config(corpus, eval_every=4, eval_batches=2, seed=seed)
    config.model.arch = arch
    config.objective.update(objective_fields)
    return config


def test_the_fingerprint_names_the_examples_scored_whatever_the_batch_family(corpus):
    """The report compares held-out losses of rows whose fingerprints agree: an encoder-decoder,
    a causal and a prefix LM on one seed and objective score the same examples (their rows
    differ, their (inputs, targets) do not); another seed, objective or rate does not."""
    denoising = _fingerprint(_changed(corpus))
    assert denoising == _fingerprint(_changed(corpus, "prefix_lm"))
    assert denoising == _fingerprint(_changed(corpus, "language_model"))
    shallower = _changed(corpus)
    shallower.model.num_layers = 1
    assert denoising == _fingerprint(shallower)
    others = [_fingerprint(_changed(corpus, seed=1)),
              _fingerprint(_changed(corpus, noise_density=0.5)),
              _fingerprint(_changed(corpus, name="prefix_lm")),
              _fingerprint(_changed(corpus, "prefix_lm", name="prefix_lm"))]
    assert len({denoising, *others}) == 4
    assert others[2] == others[3]
    # BERT-style on an encoder-only model predicts the masked positions only, not the text.
    bert = _fingerprint(_changed(corpus, name="bert_style"))
    assert bert != _fingerprint(_changed(corpus, "encoder_only", name="bert_style"))
