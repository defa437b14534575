"""The objective registry: a researcher's own objective, registered from a file of theirs, runs
like a built-in one (validated, laid out, corrupted in the jitted step, previewed, swept).

The objective used throughout, `reversal`, is the README's example: the inputs are the text,
the targets the text in reverse order (x_n..x_1), each then EOS. It corrupts no chosen tokens and
reads no rate."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x_lite import architectures, objective_registry, objectives, preview
from t5x_lite.config import EOS_ID, PAD_ID, ConfigError
from t5x_lite.settings import check_objective
from conftest import readme_python_block
from xla_env import child_env

REPO = Path(__file__).resolve().parents[1]
VOCAB, SENTINELS, INPUTS_LENGTH = 128, 8, 16


def readme_objective() -> str:
    """The README's example of a researcher's objective ("Adding an architecture or an
    objective"): the code block that registers `reversal`, which these tests run as written; a
    whole config file (`train --config`, `preview --config`), which trains on it."""
    return readme_python_block('objectives.Objective("reversal"')


REVERSAL = readme_objective()


def cli(*args: str) -> subprocess.CompletedProcess:
    """`t5x-lite ARGS` in a child process on one CPU device, this checkout's package."""
    return subprocess.run([sys.executable, "-m", "t5x_lite.cli", *args], cwd=REPO,
                          env=child_env(1, PYTHONPATH=str(REPO)), capture_output=True,
                          text=True, timeout=600)


def transcription(text: list[int]) -> tuple[list[int], list[int]]:
    """The definition (the module docstring), written out: (inputs, targets) of one text."""
    return text + [EOS_ID], text[::-1] + [EOS_ID]




@pytest.fixture
def own_registry(monkeypatch):
    """A registry of this test's own, the built-in objectives in it: what the test registers
    leaves with it."""
    monkeypatch.setattr(objective_registry, "_REGISTRY", dict(objective_registry._REGISTRY))


@pytest.fixture
def registered(own_registry):
    """`reversal`, registered for this test only."""
    exec(REVERSAL, {})  # as a user's file runs
    return objective_registry.get("reversal")


def point(name: str, **fields) -> dict:
    return {"name": name, "noise_density": 0.15, "mean_noise_span_length": 3.0,
            "inputs_length": INPUTS_LENGTH, **fields}


def test_registering_refuses_a_record_that_cannot_work(registered):
    record = objective_registry.get("span_corruption")
    for bad, message in [
        (dict(name="reversal"), "objective 'reversal' is already registered"),
        (dict(name="my objective"), "objective name 'my objective' must be an identifier"),
        (dict(name="mine", reads=("noise_rate",)), "objective 'mine' reads ['noise_rate']; its "
         "reads must be among noise_density, mean_noise_span_length, random_token_fraction"),
        (dict(name="mine", in_place=True, has_noise_mask=False),
         "objective 'mine' predicts in place but has no noise mask"),
    ]:
        with pytest.raises(ValueError, match="^" + message.replace("[", r"\[")
                           .replace("]", r"\]")):
            objective_registry.register(
                objective_registry.Objective(**{**vars(record), **bad}))
    assert "mine" not in objective_registry.names()


def test_an_encoder_that_breaks_the_contract_is_named_with_what_it_returned(registered):
    """An encoder whose outputs have other shapes or types than the contract's gets a
    one-line ConfigError (the commands print it as such, not as a traceback) naming the
    objective, the contract for the layout and what it returned, when the step is traced
    (before anything compiles), not lax.switch's complaint about branches."""
    def noise_as_int(tokens, n, spec, uniform, layout):  # a noise mask of int32, and no EOS room
        inputs, targets, noise, sentinels = registered.encode(tokens, n, spec, uniform, layout)
        return inputs[:-1], targets, noise.astype(jnp.int32), sentinels

    objective_registry.register(objective_registry.Objective(
        "broken", noise_as_int, has_noise_mask=False))
    layout = objectives.layout_for([point("span_corruption"), point("broken")],
                                   "encoder_decoder", VOCAB, SENTINELS)
    width, raw = objectives.packed_width(layout), layout.raw_length
    tokens = np.full((2, raw), 5, np.int32)
    # JAX may add lines of its own after the message.
    with pytest.raises(ConfigError, match="^" + re.escape(
            f"objective 'broken': encode must return (inputs int32[{width}], targets "
            f"int32[{width}], noise bool[{raw}], sentinels int32[]) for this layout "
            f"(packed_width {width}, raw_length {raw}); it returned (int32[{width - 1}], "
            f"int32[{width}], int32[{raw}], int32[])") + r"(\n|$)"):
        jax.jit(objectives.corrupt, static_argnums=3).lower(
            tokens, objectives.spec_from_config(point("broken")), jax.random.key(0), layout)


def test_a_registered_objective_is_validated_laid_out_and_given_the_next_id(registered):
    builtin = objective_registry.names()[:-1]
    assert objective_registry.names() == (*builtin, "reversal")
    assert objectives.objective_id("reversal") == len(builtin)
    check_objective(point("reversal"))  # the settings accept the name
    with pytest.raises(ConfigError, match=r"^objective.name='reversed' is not allowed; choose "
                       r"one of span_corruption, .*, reversal \(one of your own is registered "
                       r"by the file that defines it: pass --config=FILE, or the experiment "
                       r"file to sweep and preview\)$"):
        check_objective(point("reversed"))
    # Its lengths are the default: raw = inputs_length - 1, inputs and targets raw + EOS.
    assert objectives.lengths_for("reversal", INPUTS_LENGTH, 0.15, 3.0) == (15, 16, 16)
    assert objectives.expected_loss_tokens("reversal", INPUTS_LENGTH, 0.15, 3.0) == 16.0
    layout = objectives.layout_for([point("span_corruption"), point("reversal")],
                                   "encoder_decoder", VOCAB, SENTINELS)
    assert layout.objectives == ("span_corruption", "reversal")
    # Which architectures train it follows from its record: not one that predicts in place.
    assert "reversal" in architectures.get("encoder_decoder").objectives
    assert "reversal" in architectures.get("language_model").objectives
    with pytest.raises(ConfigError, match=r"^objective.name='reversal' is not allowed for "
                       r"model.arch='encoder_only'; choose one of 'bert_style', 'mass_style'$"):
        architectures.get("encoder_only").require_objective("reversal")


def test_an_objective_s_revision_counts_its_changes_and_travels_with_its_examples(registered):
    """A registered objective starts at revision 1; each change to its definition adds one,
    and the batch layout record saved with its checkpoints carries it. The built-in
    objectives whose definitions changed where no config field shows it name their changes."""
    assert objective_registry.get("reversal").revision == 1
    assert objectives.layout_record(
        objectives.layout_for([point("reversal")], "encoder_decoder", VOCAB, SENTINELS),
        point("reversal"), "encoder_decoder")[objective_registry.REVISION_FIELD] == 1
    changed = {name: objective_registry.get(name).changes for name in objective_registry.names()
               if objective_registry.get(name).changes}
    assert sorted(changed) == ["deshuffling", "prefix_lm", "sentence_permutation",
                               "text_infilling_permutation", "ul2"]
    assert "random_prefix_noise_mask" in changed["ul2"][0]
    assert all("full stops only" in changed[name][0]
               for name in ("sentence_permutation", "text_infilling_permutation"))
    assert all("a segment of one document" in changed[name][0]
               for name in ("deshuffling", "prefix_lm"))
    assert objective_registry.get("ul2").revision == 2


def test_a_registered_objective_s_arithmetic_reads_every_field_of_its_config(own_registry,
                                                                             tmp_path):
    """Its `lengths` and `expected_loss_tokens` get the objective config itself wherever the
    library asks (the layout, a sweep's records, the step cost), so one that reads
    random_token_fraction (a field its record may read) works in a sweep as in training."""
    from t5x_lite import grid, sweep_point

    experiment = tmp_path / "share_experiment.py"
    experiment.write_text(REVERSAL + '''
from t5x_lite import objective_registry, presets


def share_lengths(point):
    """Reads one raw token fewer per tenth of random_token_fraction."""
    raw = point["inputs_length"] - 1 - round(10 * point["random_token_fraction"])
    return raw, raw + 1, raw + 1


objectives.register(objectives.Objective("reversal_share", reversal, has_noise_mask=False,
                                         reads=("random_token_fraction",),
                                         lengths=share_lengths))
GRID = ({"point": "share", "row": "Share", "overrides": {
    "objective.name": "reversal_share", "objective.random_token_fraction": 0.2}},)
get_config = presets.sweep_preset
''')
    point, = grid.expand(str(experiment), "demo", [])
    raw = point.config.objective.inputs_length - 3
    assert point.layout.raw_length == raw
    train = point.config.train
    assert sweep_point.base_record(point)["pretrain_tokens"] == train.steps * train.batch_size * raw
    assert grid.StepCost.of(point.config, point.layout).loss_tokens == (
        point.config.train.batch_size * (raw + 1))


def test_a_registered_objective_corrupts_as_its_definition_says_in_a_mixed_program(registered):
    """One compiled program serves span corruption and the new objective, example by example
    (a [B] spec); each of its examples is the transcription of the definition, its lengths
    random, and the span-corruption examples are what that objective makes alone."""
    layout = objectives.layout_for([point("span_corruption"), point("reversal")],
                                   "encoder_decoder", VOCAB, SENTINELS)
    rng = np.random.default_rng(0)
    batch = 8
    tokens = rng.integers(3, VOCAB - SENTINELS, (batch, layout.raw_length)).astype(np.int32)
    lengths = rng.integers(1, 16, batch)
    tokens[np.arange(layout.raw_length) >= lengths[:, None]] = PAD_ID
    specs = [objectives.spec_from_config(point(name)) for name in ("span_corruption", "reversal")]
    chosen = np.arange(batch) % 2  # even rows span corruption, odd rows reversal
    spec = jax.tree.map(lambda *fields: jnp.stack(fields)[chosen], *specs)
    key = jax.random.key(1)
    mixed = jax.device_get(objectives.corrupt(tokens, spec, key, layout))
    alone = jax.device_get(objectives.corrupt(tokens, specs[0], key, layout))
    for row in range(batch):
        inputs = [int(t) for t in mixed["encoder_input_tokens"][row] if t != PAD_ID]
        targets = [int(t) for t in mixed["decoder_target_tokens"][row] if t != PAD_ID]
        if chosen[row]:
            text = [int(t) for t in tokens[row, :min(lengths[row], 15)]]
            assert (inputs, targets) == transcription(text), row
            assert mixed["decoder_loss_weights"][row].sum() == len(text) + 1
        else:
            for key_name in mixed:
                np.testing.assert_array_equal(mixed[key_name][row], alone[key_name][row])


def test_a_config_file_s_objective_previews_as_train_would_run_it(own_registry, tmp_path):
    """`t5x-lite preview --config FILE`, the file that `train --config FILE` reads: it
    registers the objective (here in a registry of the test's own) and sets it; the preview
    names the file and shows the definition at work on the corpus."""
    config_file = tmp_path / "reversal_config.py"
    config_file.write_text(REVERSAL)
    run = preview.previewed_run(None, None, config_file=str(config_file))
    assert (run.preset, run.config_file, run.config.objective.name) == (
        None, str(config_file), "reversal")
    examples = preview.corrupted_examples(run, 2)
    for example in examples:
        assert (example["inputs"], example["targets"]) == transcription(example["raw"])
        assert example["config_file"] == str(config_file) and example["noise_mask"] is None
    assert preview.format_text(run, examples).startswith(f"config file {config_file}, seed 0\n"
                                                         "objective reversal; model.arch")


@pytest.mark.slow
def test_train_runs_a_config_file_s_objective_and_resumes_it(tmp_path):
    """`t5x-lite train --config FILE` in a child process: the file registers the objective and
    trains on it; a second command with the same file resumes from the checkpoint."""
    config_file = tmp_path / "reversal_config.py"
    config_file.write_text(REVERSAL)
    tiny = ["--config.model.d_model=32", "--config.model.d_ff=64", "--config.model.num_heads=2",
            "--config.model.d_kv=16", "--config.train.warmup_steps=1",
            "--config.train.log_every=2", "--config.checkpoint.every=2",
            "--config.train.eval_every=2"]
    workdir = tmp_path / "run"
    first = cli("train", "--config", str(config_file), "--workdir", str(workdir), "--steps", "2",
                *tiny)
    assert first.returncode == 0, first.stderr[-3000:]
    summary = json.loads(first.stdout[first.stdout.index("{"):])
    assert (summary["step"], summary["objective_overflow"]) == (2, 0)
    assert summary["loss"] > 1.0
    second = cli("train", "--config", str(config_file), "--workdir", str(workdir), "--steps", "4",
                 *tiny)
    assert second.returncode == 0, second.stderr[-3000:]
    assert json.loads(second.stdout[second.stdout.index("{"):])["start_step"] == 2


@pytest.mark.slow
def test_an_experiment_file_s_objective_previews_and_sweeps_in_one_vmapped_step(tmp_path):
    """The user's path: an experiment file registers the objective and puts it in a grid
    beside span corruption. `t5x-lite preview` shows it (targets = the raw text reversed), and
    `t5x-lite sweep --vmap 2` pre-trains both points in one vmapped step (one program holding
    both objectives), fine-tunes and records them."""
    experiment = tmp_path / "reversal_experiment.py"
    experiment.write_text(REVERSAL + '''
from t5x_lite import presets

GRID = ({"point": "span_corruption", "row": "Span corruption",
         "overrides": {"objective.name": "span_corruption"}},
        {"point": "reversal", "row": "Reversal", "overrides": {"objective.name": "reversal"}})
get_config = presets.sweep_preset
''')
    preview = cli("preview", str(experiment), "--point", "reversal", "--preset", "demo",
                  "--examples", "2", "--json")
    assert preview.returncode == 0, preview.stderr
    examples = [json.loads(line) for line in preview.stdout.splitlines()]
    assert len(examples) == 2
    for example in examples:
        assert example["objective"] == "reversal" and example["noise_mask"] is None
        assert (example["inputs"], example["targets"]) == transcription(example["raw"])

    tiny = ["--config.model.d_model=32", "--config.model.d_ff=64", "--config.model.num_heads=2",
            "--config.model.d_kv=16", "--config.model.num_layers=2",
            "--config.train.steps=4", "--config.train.warmup_steps=1",
            "--config.checkpoint.every=4", "--config.finetune.steps=4",
            "--config.finetune.eval_every=4", "--config.finetune.eval_examples=8",
            "--config.sweep.tasks=('builtin_reverse',)", "--config.sweep.progress=False"]
    workdir = tmp_path / "sweep"
    sweep = cli("sweep", str(experiment), "--preset", "demo", "--workdir", str(workdir),
                "--vmap", "2", *tiny)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    records = [json.loads(line) for line in (workdir / "results.jsonl").open()]
    assert sorted((r["point"], r["status"]) for r in records) == [
        ("reversal", "ok"), ("span_corruption", "ok")]
    # The two pre-trained together, each on its own objective.
    assert ("pre-training 2 points together (4 steps, one vmapped step): [1/2] span_corruption "
            "(seed 0) span_corruption; [2/2] reversal (seed 0) reversal") in sweep.stderr
