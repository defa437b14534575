"""`t5x-lite preview`: the examples are the train step's own corruption of the run's first
batch, span corruption keeps the clean tokens in the inputs and moves the noise to the targets,
and bad requests fail in one line. Every in-process preview uses Table 6's grid under the demo
preset, whose points share one layout, so the corruption compiles once."""
import json
import subprocess
import sys
from itertools import permutations
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import t5x_lite
from t5x_lite import (bart_noising, cli, grid, objectives, partitioning, preview, train_state,
                      train_step)
from t5x_lite.config import EOS_ID
from t5x_lite.data.pipeline import vocabulary_from_config
from t5x_lite.step_settings import step_settings
from xla_env import child_env

REPO_ROOT = Path(t5x_lite.__file__).resolve().parents[1]


def _cli(*args: str) -> subprocess.CompletedProcess:
    # One CPU device; this checkout's package, whatever is installed.
    env = child_env(1, PYTHONPATH=str(REPO_ROOT))
    return subprocess.run([sys.executable, "-m", "t5x_lite.cli", "preview", *args], env=env,
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def rate_15():
    run = preview.previewed_run("table6", "rate_15", "demo", seed=0)
    return run, preview.corrupted_examples(run, count=run.config.train.batch_size + 2)


def test_json_lines_from_the_command_line_hold_consistent_examples():
    result = _cli("table6", "--point", "rate_25", "--preset", "demo", "--examples", "2", "--json",
                  "--seed", "4")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    for line in lines:
        example = json.loads(line)
        assert {"raw", "noise_mask", "inputs", "targets", "inputs_text", "targets_text", "point",
                "objective", "seed", "overflow"} <= example.keys()
        assert (example["point"], example["objective"], example["seed"]) == (
            "rate_25", "iid_denoising", 4)
        assert len(example["noise_mask"]) == len(example["raw"]) > 0
        assert set(example["noise_mask"]) == {0, 1}
        assert 0 not in example["inputs"] + example["targets"]  # no padding
        assert example["inputs"][-1] == example["targets"][-1] == EOS_ID
        assert example["targets_text"].startswith("<extra_id_0>")


def test_examples_are_what_the_train_step_corrupts(rate_15):
    """The key the train step hands its batch maker at step n, and the step's corruption with
    it of the run's batch n under the grid's layout, give exactly the examples shown."""
    run, examples = rate_15
    config, layout = run.config, run.layout
    seen = []

    class KeySeen(Exception):
        pass

    def make_batch(data, rng):  # the step's first use of its key: keep it and stop the step
        seen.append(rng)
        raise KeySeen

    step_fn = train_step._step_fn(step_settings(config, layout),
                                  partitioning.make_mesh(config.mesh), make_batch)
    key_data = jax.random.key_data(train_state.step_key(config.train.seed))
    from t5x_lite.data.pipeline import pretrain_data_from_config

    _, data = pretrain_data_from_config(config, layout.raw_length)
    spec = objectives.spec_from_config(config.objective)
    batch_size = config.train.batch_size
    corrupt = jax.jit(objectives.corrupt_with_details, static_argnums=3)
    for step in (0, 1):
        state = train_state.TrainState(step=jnp.int32(step), params=None, opt_state=None)
        with pytest.raises(KeySeen):
            step_fn(state, None, key_data, jnp.bool_(False))
        batch, details = corrupt(data.batch(step), spec, seen[-1], layout)
        for row, example in enumerate(examples[step * batch_size:(step + 1) * batch_size]):
            assert (example["step"], example["batch_row"]) == (step, row)
            raw_length = len(example["raw"])
            np.testing.assert_array_equal(example["raw"], data.batch(step)[row, :raw_length])
            np.testing.assert_array_equal(example["noise_mask"],
                                          details["noise_mask"][row, :raw_length])
            inputs = batch["encoder_input_tokens"][row]
            targets = batch["decoder_target_tokens"][row]
            np.testing.assert_array_equal(example["inputs"], inputs[inputs != 0])
            np.testing.assert_array_equal(example["targets"], targets[targets != 0])
    assert len(examples) == batch_size + 2  # past the batch size: step 1's first rows


def test_iid_denoising_keeps_clean_tokens_in_the_inputs_and_noise_runs_in_the_targets(rate_15):
    run, examples = rate_15
    first_sentinel = run.layout.vocab_size - run.layout.num_sentinels
    assert run.layout == grid.expand("table6", "demo")[0].layout  # the grid's layout
    for example in examples:
        raw, noise = np.array(example["raw"]), np.array(example["noise_mask"], bool)
        inputs, targets = np.array(example["inputs"][:-1]), np.array(example["targets"][:-1])
        assert not example["overflow"]
        np.testing.assert_array_equal(inputs[inputs < first_sentinel], raw[~noise])
        np.testing.assert_array_equal(targets[targets < first_sentinel], raw[noise])
        runs = np.sum(noise & ~np.concatenate([[False], noise[:-1]]))
        # One sentinel per run in the inputs; in the targets one per run plus the final one.
        assert np.sum(inputs >= first_sentinel) == runs
        assert np.sum(targets >= first_sentinel) == runs + 1
        assert example["inputs_text"].count("<extra_id_") == runs


def test_seeds_draw_different_noise_and_the_text_shows_the_run(rate_15):
    run, examples = rate_15
    other = preview.corrupted_examples(preview.previewed_run("table6", "rate_15", "demo", seed=1),
                                       count=3)
    assert [e["noise_mask"] for e in other] != [e["noise_mask"] for e in examples[:3]]
    text = preview.format_text(run, examples[:1])
    assert "table6 point rate_15 ('15%'), preset demo, seed 0" in text
    assert "iid_denoising: noise_density 0.15;" in text  # its span length is not shown: unused
    assert f"raw {len(examples[0]['raw'])} tokens, noise {sum(examples[0]['noise_mask'])}" in text
    assert f"  targets: {examples[0]['targets_text']}" in text


def test_the_header_gives_the_layout_s_lengths_and_says_where_encoder_only_predicts(rate_15):
    run, examples = rate_15
    layout = run.layout
    assert (f"the grid's shared layout: encoder_decoder, raw {layout.raw_length}, inputs "
            f"{layout.inputs_length}, targets {layout.targets_length} tokens") in \
        preview.format_text(run, examples[:1])
    # BERT's masked LM on one bidirectional stack: no target positions, the noise predicted.
    bert = preview.previewed_run("families", "encoder_only/natural", "demo")
    text = preview.format_text(bert, preview.corrupted_examples(bert, count=1))
    assert (f"encoder_only, raw {bert.layout.raw_length}, inputs {bert.layout.inputs_length} "
            "tokens, targets predicted in place") in text


def test_the_50_percent_row_draws_iid_runs_that_differ_by_seed():
    # Random spans of mean length 1 at 50% gave every seed the same alternating mask; the
    # i.i.d. baseline varies the count, merges neighbours into runs, and differs by seed.
    masks = {seed: [e["noise_mask"] for e in preview.corrupted_examples(
        preview.previewed_run("table6", "rate_50", "demo", seed=seed), count=8)]
        for seed in (0, 1)}
    assert masks[0] != masks[1]
    assert len({sum(mask) for mask in masks[0]}) > 1
    assert any(a and b for mask in masks[0] for a, b in zip(mask, mask[1:]))


def test_a_plain_config_uses_its_own_layout_and_seed():
    run = preview.previewed_run(None, None, "demo", seed=5,
                                overrides=["--config.objective.name=prefix_lm"])
    assert (run.config.objective.name, run.seed, run.point) == ("prefix_lm", 5, None)
    assert run.layout == objectives.layout_from_config(run.config)


@pytest.mark.parametrize("args, message", [
    (["table99", "--point", "x"], "experiment='table99' does not exist; choose one of"),
    (["table6", "--point", "rate_50", "--preset", "huge"], "preset='huge' does not exist"),
    (["--preset", "demo", "--config.objective.nam=lm"], "no field 'objective.nam'"),
    (["--preset", "demo", "--examples", "0"], "examples=0 must be an integer >= 1"),
    (["table6"], "an experiment's preview needs --point; choose one of rate_10, rate_15"),
    (["--point", "rate_50"], "point='rate_50' needs the experiment it is a point of: "
                             "t5x-lite preview EXPERIMENT --point rate_50"),
    (["table6", "--point", "rate_50", "--config", "configs/tiny.py"],
     "config='configs/tiny.py' and experiment='table6': give one"),
])
def test_bad_requests_stop_with_one_line_naming_the_field(args, message):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["t5x-lite", "preview", *args])
    assert message in str(exit_info.value.code) and "\n" not in str(exit_info.value.code)


def test_an_unknown_point_lists_the_grid_in_one_line():
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["t5x-lite", "preview", "table2", "--point", "encoder_decoder/iid", "--preset",
                  "demo"])
    message = str(exit_info.value.code)
    assert ("point='encoder_decoder/iid' is not a point of table2; choose one of "
            "encoder_decoder/denoising, encoder_decoder_shared/denoising") in message
    assert "\n" not in message


def sentences(tokens, pieces):
    """The raw tokens' sentences as `bart_noising.sentence_ends` reads them off the pieces."""
    classes = np.frombuffer(bart_noising.sentence_classes(pieces), np.uint8)
    ends = np.asarray(bart_noising.sentence_ends(jnp.asarray(tokens), len(tokens), classes))
    return [part.tolist() for part in np.split(np.asarray(tokens), np.flatnonzero(ends) + 1)
            if len(part)]


@pytest.mark.parametrize("name", ["token_masking", "token_deletion", "text_infilling",
                                  "document_rotation", "sentence_permutation",
                                  "text_infilling_permutation"])
def test_preview_shows_each_bart_objective(name):
    """BART's noising: the targets are the document itself; the inputs are what the objective
    makes of it, shown as text and named in each example's `objective`."""
    run = preview.previewed_run(None, None, "demo", seed=2,
                                overrides=[f"--config.objective.name={name}"])
    examples = preview.corrupted_examples(run, count=8)
    mask = run.layout.vocab_size - 1  # <extra_id_0>
    pieces = vocabulary_from_config(run.config).pieces()
    reordered = 0  # examples whose sentences (two or more) the permutation moved
    for example in examples:
        assert example["objective"] == name and not example["overflow"]
        raw, inputs = np.array(example["raw"]), np.array(example["inputs"][:-1])
        assert example["targets"] == example["raw"] + [EOS_ID]
        if name in ("document_rotation", "sentence_permutation"):
            assert example["noise_mask"] is None
        if name == "document_rotation":
            assert any((np.roll(raw, -k) == inputs).all() for k in range(len(raw)))
            continue
        if name == "sentence_permutation":  # the raw text's sentences, each kept whole
            parts = sentences(example["raw"], pieces)
            assert len(parts) <= 7  # 31 tokens: few enough to try every order
            assert any(sum(order, []) == inputs.tolist() for order in permutations(parts))
            reordered += inputs.tolist() != example["raw"]
            continue
        noise = np.array(example["noise_mask"], bool)
        assert noise.sum() == np.ceil(np.float32(len(raw)) * np.float32(0.15))
        if name == "token_masking":
            np.testing.assert_array_equal(inputs, np.where(noise, mask, raw))
        elif name == "token_deletion":
            np.testing.assert_array_equal(inputs, raw[~noise])
        elif name == "text_infilling":  # the clean tokens in order, a mask for each span
            np.testing.assert_array_equal(inputs[inputs != mask], raw[~noise])
            assert example["inputs_text"].count("<extra_id_0>") == np.sum(inputs == mask) > 0
        else:  # infilling after the permutation: the clean tokens, in another order
            assert sorted(inputs[inputs != mask]) == sorted(raw[~noise])
            assert example["inputs_text"].count("<extra_id_0>") == np.sum(inputs == mask) > 0
    assert name != "sentence_permutation" or reordered > 0
    text = preview.format_text(run, examples)
    if name in ("text_infilling", "text_infilling_permutation"):
        assert "mean_noise_span_length 3.0 (the Poisson lambda of its span lengths)" in text
    assert f"objective {name}" in text and f"  inputs:  {examples[0]['inputs_text']}" in text
