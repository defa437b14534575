"""Zero-shot scoring: the ranking rule against a per-option loop over `decoding.score` for every
batch family, one compile for all batches, the sweep stage (records, report, resume) and bad
input.

A made-up classification task, `test_letters` ("pick: c a f" -> one of three label options),
is registered for the module; its targets are whatever a model ranks first, found here by
scoring each (example, option) row on its own.
"""
import json
import shutil

import jax
import numpy as np
import pytest
from flax import nnx

from t5x_lite import (architectures, batch_format, cli, decoding, distributed, finetune, grid,
                      models, partitioning, report, report_render, results, sweep, sweep_plan,
                      sweep_point, sweep_workdir, train, train_state, zero_shot)
from t5x_lite.config import ConfigError, EOS_ID
from t5x_lite.data import pipeline, tasks
from t5x_lite.evaluation import TaskSplit, params_of
from t5x_lite.settings import Sweep
from tiny_configs import random_model, tiny_finetune_config, write_letter_corpus

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
    return write_letter_corpus(tmp_path_factory.mktemp("data"), "pick", "abcdef",
                               per_line=6)


def option_by_option(config, model):
    """float `[examples, options]`: each (example, option) row scored alone, the direct
    transcription of 'every option's summed log-likelihood': the model's forward pass under
    the architecture's masks, log-softmax, summed over the option's tokens (EOS included), not
    divided by their number."""
    vocab = pipeline.vocabulary_from_config(config)
    ft, arch = config.finetune, config.model.arch
    family = architectures.get(arch).family
    targets_key, weights_key = batch_format.loss_keys(family)
    mask_token = batch_format.mask_token(config.model.vocab_size)
    table = np.zeros((len(INPUTS), len(OPTIONS)))
    for i, text in enumerate(INPUTS):
        for k, option in enumerate(OPTIONS):
            pair = (vocab.encode(text) + [EOS_ID], vocab.encode(option) + [EOS_ID])
            batch, = pipeline.pad_examples([pair], 1, ft.inputs_length, ft.targets_length,
                                           family=family, mask_token=mask_token)
            log_probs = np.asarray(jax.nn.log_softmax(model(batch, models.make_masks(batch, arch))))
            at_targets = np.take_along_axis(log_probs[0], batch[targets_key][0][:, None], -1)
            weights = batch[weights_key][0]
            assert weights.sum() == len(vocab.encode(option)) + 1  # the option and its EOS
            table[i, k] = float((at_targets[:, 0] * weights).sum())
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
        # The option predicted most often, and the best constant prediction: here the
        # targets of the first task are the predictions, so the two coincide.
        ranking = zero_shot.rank(config, model, names[:1])[names[0]]
        most = max(best.count(option) for option in OPTIONS) / len(best)
        assert ranking.most_predicted_share == pytest.approx(most)
        assert ranking.constant_metrics == {"accuracy": pytest.approx(100.0 * most)}
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
                   budget_reference=None, zero_shot="yes", glue_as_one_task=True)
    with pytest.raises(ConfigError, match=r"^sweep.zero_shot='yes' must be True or False$"):
        Sweep.from_config(section)


def test_glue_and_builtin_classification_tasks_carry_their_label_words():
    assert tasks.TASKS["glue_mnli"].label_options == ("entailment", "neutral", "contradiction")
    assert tasks.TASKS["local_glue_wnli"].label_options == ("not_entailment", "entailment")
    assert tasks.TASKS["builtin_module"].label_options == ("asyncio", "email", "logging", "xml")
    for name in ("glue_stsb", "builtin_reverse", "squad", "wmt_ende"):
        assert zero_shot.not_applicable(tasks.TASKS[name])


# --- the eval command ---------------------------------------------------------------------------


def test_the_eval_command_scores_a_checkpoint_zero_shot_and_skips_tasks_without_options(
        data, tmp_path, monkeypatch, capsys):
    """`t5x-lite eval --zero_shot --checkpoint RUN` ranks the options with RUN's model: on tasks
    whose targets are that model's own best options (found row by row) it scores 100%, and 5/6
    with one target changed; a generation task among them is skipped with a note."""
    config = tiny_finetune_config("encoder_decoder", *data)
    run = tmp_path / "pretrain"
    train.train(config, run, progress=False)
    model = nnx.merge(train_state.model_graphdef(config),
                      params_of(config, str(run), partitioning.make_mesh(config.mesh)))
    best = [OPTIONS[k] for k in option_by_option(config, model).argmax(1)]
    changed = list(best)
    changed[2] = next(option for option in OPTIONS if option != best[2])
    names = ["test_letters", "test_letters_one_changed"]
    for name, targets in zip(names, (best, changed)):
        tasks.TASKS[name] = letters_task(name, targets)
    monkeypatch.setattr(distributed, "initialize_distributed", lambda: None)
    ft = config.finetune
    try:
        cli.main(["t5x-lite", "eval", "--zero_shot", "--preset", "tiny", f"--checkpoint={run}",
                  f"--tasks={names[0]},builtin_reverse,{names[1]}",
                  f"--config.data.data_dir={data[1]}",
                  *(f"--config.finetune.{field}={getattr(ft, field)}"
                    for field in ("batch_size", "inputs_length", "targets_length"))])
    finally:
        for name in names:
            del tasks.TASKS[name]
    printed = capsys.readouterr()
    assert json.loads(printed.out) == {names[0]: {"accuracy": 100.0},
                                       names[1]: {"accuracy": pytest.approx(100.0 * 5 / 6)}}
    assert "eval --zero_shot: skipped, task 'builtin_reverse' has no label options" in printed.err


def test_eval_zero_shot_without_label_options_stops_before_reading_the_model(tmp_path,
                                                                             monkeypatch):
    monkeypatch.setattr(distributed, "initialize_distributed", lambda: None)
    with pytest.raises(SystemExit) as exit_info:  # the checkpoint does not exist either
        cli.main(["t5x-lite", "eval", "--zero_shot", "--preset", "demo",
                  f"--checkpoint={tmp_path / 'no_run'}", "--tasks=builtin_reverse"])
    assert str(exit_info.value.code) == (
        "t5x-lite eval: invalid config: --tasks=['builtin_reverse'] has no task with label "
        "options (Task.label_options) to rank zero-shot: task 'builtin_reverse' has no label "
        "options to rank (its targets are free text or numbers); zero-shot scoring needs a "
        "classification task")


# --- the sweep stage ---------------------------------------------------------------------------

# One decoder-only point (Wang et al.'s zero-shot winner), a classification and a generation
# task.
SWEEP_EXPERIMENT = '''
from tiny_configs import tiny_sweep_config

GRID = (dict(point="lm", row="Language model", objective="LM",
             overrides={"model.arch": "language_model", "objective.name": "lm"}),)


def get_config(preset):
    return tiny_sweep_config(preset)
'''
ZERO_SHOT_SWEEP = ["sweep.tasks=builtin_module,builtin_reverse", "sweep.zero_shot=True",
                   "train.steps=2", "finetune.steps=1", "finetune.eval_every=1",
                   "finetune.eval_examples=4"]


@pytest.fixture(scope="module")
def zero_shot_sweep(tmp_path_factory):
    """(experiment path, workdir, records) of the one-point sweep with the zero-shot stage."""
    root = tmp_path_factory.mktemp("zero_shot_sweep")
    (root / "zs_grid.py").write_text(SWEEP_EXPERIMENT)
    experiment, workdir = str(root / "zs_grid.py"), root / "sweep"
    return experiment, workdir, sweep.run_sweep(experiment, "demo", str(workdir),
                                                overrides=ZERO_SHOT_SWEEP)


@pytest.mark.slow  # the sweep fixture: a pre-training and two fine-tunings to compile
def test_a_zero_shot_sweep_records_the_pretrained_models_scores_beside_the_finetuned(
        zero_shot_sweep):
    experiment, workdir, records = zero_shot_sweep
    by_task = {r["task"]: r for r in records}
    assert [r["status"] for r in records] == ["ok", "ok"]
    module, reverse = by_task["builtin_module"], by_task["builtin_reverse"]
    assert module["zero_shot"]["status"] == "ok" and module["zero_shot"]["error"] is None
    assert set(module["zero_shot"]["metrics"]) == {"accuracy"}
    assert reverse["zero_shot"]["status"] == "not_applicable"
    assert "no label options" in reverse["zero_shot"]["error"]
    # The stage scored the pre-training checkpoint, not the fine-tuned model.
    point, = grid.expand(experiment, "demo", ZERO_SHOT_SWEEP)
    pretrain = point.directory(workdir) / "pretrain"
    assert zero_shot.evaluate(point.config, str(pretrain), ["builtin_module"]) == {
        "builtin_module": module["zero_shot"]["metrics"]}
    # The fine-tuned model ranked by the same rule, from its own checkpoint; a generation
    # task has no ranking.
    assert module["finetuned_ranked"]["status"] == "ok"
    finetuned = point.finetune_directory(workdir, ("builtin_module",))
    assert zero_shot.evaluate(point.config, str(finetuned), ["builtin_module"]) == {
        "builtin_module": module["finetuned_ranked"]["metrics"]}
    assert "finetuned_ranked" not in reverse
    # Four label options, four examples: a constant prediction is right at least once.
    assert module["zero_shot"]["constant_metrics"]["accuracy"] >= 25.0
    assert module["zero_shot"]["most_predicted_share"] in (0.25, 0.5, 0.75, 1.0)
    text = report.report(str(workdir)).text
    zero_part = text[text.index(report_render.ZERO_SHOT_TITLE):]
    row = next(line for line in zero_part.splitlines() if line.startswith("Language model"))
    assert f"{module['zero_shot']['metrics']['accuracy']:.2f}" in row
    assert "builtin_module: best zero-shot Language model (LM)" in zero_part
    assert "builtin_reverse zero-shot" not in zero_part  # a generation task has no column
    assert (workdir / "report" / "zero_shot.csv").read_text().count("\n") == 4  # header, 3


def test_a_dry_run_says_what_the_zero_shot_stages_will_rank(zero_shot_sweep, tmp_path):
    experiment, _, _ = zero_shot_sweep
    plan = sweep_plan.render(sweep_plan.plan_sweep(experiment, "demo", str(tmp_path / "new"),
                                                   overrides=ZERO_SHOT_SWEEP))
    assert ("Zero-shot (sweep.zero_shot): each pre-trained model ranks the label options of "
            "builtin_module before fine-tuning, and after the runs each fine-tuned model of "
            "those tasks is loaded again and ranked too.") in plan
    without = [o for o in ZERO_SHOT_SWEEP if not o.startswith("sweep.zero_shot")]
    assert "Zero-shot" not in sweep_plan.render(sweep_plan.plan_sweep(
        experiment, "demo", str(tmp_path / "other"), overrides=without))


def test_the_ranked_stage_ranks_each_fine_tuning_run_s_own_checkpoint(zero_shot_sweep,
                                                                       monkeypatch):
    """Each record's fine-tuned model is the checkpoint of the run that fine-tuned it: GLUE's
    tasks fine-tuned as one run share one ranking of that run's checkpoint, and a record made
    before runs were recorded (no `finetune_tasks`) is its own task's run; a failure fails
    only that run's entries."""
    experiment, workdir, _ = zero_shot_sweep
    point, = grid.expand(experiment, "demo", ZERO_SHOT_SWEEP)
    ranked = []

    def rank(config, checkpoint, task_names):
        ranked.append((checkpoint, tuple(config.finetune.tasks), tuple(task_names)))
        if "broken" in task_names:
            raise RuntimeError("no checkpoint")
        return {task: zero_shot.Ranking({"accuracy": 50.0}, 0.5, {"accuracy": 25.0})
                for task in task_names}

    monkeypatch.setattr(zero_shot, "rank", rank)
    glue = ("glue_cola", "glue_sst2")
    records = [{"task": "glue_cola", "finetune_tasks": list(glue)},
               {"task": "glue_sst2", "finetune_tasks": list(glue)},
               {"task": "builtin_module"},  # made before records named their run
               {"task": "broken"}]
    fields = sweep_point._ranked_finetuning_fields(point, str(workdir), records)
    assert ranked == [
        (str(point.finetune_directory(workdir, glue)), glue, glue),
        (str(point.finetune_directory(workdir, ("builtin_module",))), ("builtin_module",),
         ("builtin_module",)),
        (str(point.finetune_directory(workdir, ("broken",))), ("broken",), ("broken",))]
    assert fields["glue_sst2"]["finetuned_ranked"] == {
        "status": "ok", "metrics": {"accuracy": 50.0}, "most_predicted_share": 0.5,
        "constant_metrics": {"accuracy": 25.0}, "error": None}
    assert fields["broken"]["finetuned_ranked"]["status"] == "failed"
    assert "no checkpoint" in fields["broken"]["finetuned_ranked"]["error"]
    assert fields["builtin_module"]["finetuned_ranked"]["status"] == "ok"


@pytest.mark.slow
def test_a_resumed_zero_shot_sweep_does_not_score_again(zero_shot_sweep, tmp_path,
                                                       monkeypatch):
    experiment, workdir, records = zero_shot_sweep
    copy = tmp_path / "sweep"
    shutil.copytree(workdir, copy)
    # As if killed after the zero-shot stage: no task recorded, zero_shot.json written.
    (copy / "results.jsonl").unlink()
    shutil.rmtree(copy / "points" / "lm" / "seed0" / "records")

    def scored_again(self, params):
        raise AssertionError("the zero-shot stage ran again")

    monkeypatch.setattr(zero_shot.ZeroShotScorer, "__call__", scored_again)
    resumed = sweep.run_sweep(experiment, "demo", str(copy), overrides=ZERO_SHOT_SWEEP)
    assert [r["zero_shot"] for r in resumed] == [r["zero_shot"] for r in records]
    # A workdir swept with zero-shot scores is not resumed without them, nor the other way.
    with pytest.raises(ConfigError, match="holds a different sweep.*sweep.zero_shot"):
        sweep.run_sweep(experiment, "demo", str(copy),
                        overrides=[o for o in ZERO_SHOT_SWEEP if "zero_shot" not in o])


@pytest.mark.slow
def test_a_sweep_made_without_the_stage_gets_it_later_without_training_again(
        zero_shot_sweep, tmp_path, monkeypatch):
    experiment, workdir, records = zero_shot_sweep
    copy = tmp_path / "sweep"
    shutil.copytree(workdir, copy)
    # The workdir as the same sweep without the stage leaves it: the same pre-training and
    # fine-tuning (sweep.zero_shot is not in a point's config hash), records without
    # `zero_shot`, no zero_shot.json, sweep.json without the switch.
    without = [o for o in ZERO_SHOT_SWEEP if "zero_shot" not in o]
    rundir = copy / "points" / "lm" / "seed0"
    (rundir / sweep_point.ZERO_SHOT_FILE).unlink()
    for path in [*(rundir / "records").glob("*.json")]:
        path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items()
                                    if k != "zero_shot"}))
    (copy / "results.jsonl").write_text("".join(
        json.dumps({k: v for k, v in r.items() if k != "zero_shot"}) + "\n" for r in records))
    identity = json.loads((copy / sweep_workdir.SWEEP_FILE).read_text())
    identity["overrides"].remove(sweep_workdir.ZERO_SHOT_ON)
    (copy / sweep_workdir.SWEEP_FILE).write_text(json.dumps(identity))
    assert [r["task"] for r in sweep.run_sweep(experiment, "demo", str(copy),
                                               overrides=without)] == [r["task"] for r in records]

    def trained_again(*args, **kwargs):
        raise AssertionError("a finished point was trained again")

    monkeypatch.setattr(train, "train", trained_again)
    monkeypatch.setattr(finetune, "finetune", trained_again)
    # Refused for a stale record: the workdir stays the sweep without the stage (its
    # sweep.json was rewritten first, so the command that made it was then refused).
    kept, claimed = ((copy / name).read_text() for name in ("results.jsonl",
                                                            sweep_workdir.SWEEP_FILE))
    (copy / "results.jsonl").write_text(json.dumps({**records[0], "config_hash": "0" * 16})
                                        + "\n" + kept.split("\n", 1)[1])
    with pytest.raises(ConfigError, match="made with another config"):
        sweep.run_sweep(experiment, "demo", str(copy), overrides=ZERO_SHOT_SWEEP)
    assert (copy / sweep_workdir.SWEEP_FILE).read_text() == claimed
    (copy / "results.jsonl").write_text(kept)
    given = sweep.run_sweep(experiment, "demo", str(copy), overrides=ZERO_SHOT_SWEEP)
    # Its records are those of the sweep that had the stage from the start, appended again.
    assert given == records
    assert len(results.read_records(copy / "results.jsonl")) == 2 * len(records)
    assert [json.loads((rundir / "records" / f"{r['task']}.json").read_text())
            for r in records] == records
    # From then on it is a zero-shot sweep: resumed with the stage (nothing to do), not without.
    assert sweep.run_sweep(experiment, "demo", str(copy), overrides=ZERO_SHOT_SWEEP) == records
    with pytest.raises(ConfigError, match="holds a different sweep.*sweep.zero_shot"):
        sweep.run_sweep(experiment, "demo", str(copy), overrides=without)


@pytest.mark.slow
def test_a_failed_zero_shot_scoring_is_tried_again_by_the_next_run(zero_shot_sweep, tmp_path,
                                                                   monkeypatch):
    """A transient failure of the stage (recorded as failed, not saved in zero_shot.json) was
    never retried: the task was done, and a record that had a `zero_shot` entry lacked none."""
    experiment, workdir, records = zero_shot_sweep
    copy = tmp_path / "sweep"
    shutil.copytree(workdir, copy)
    rundir = copy / "points" / "lm" / "seed0"
    (rundir / sweep_point.ZERO_SHOT_FILE).unlink()
    failed = {"status": "failed", "metrics": {}, "error": "lm (seed 0) zero-shot: OSError: flaky"}
    broken = [{**r, "zero_shot": failed if r["task"] == "builtin_module" else r["zero_shot"]}
              for r in records]
    (copy / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in broken))
    for record in broken:
        (rundir / "records" / f"{record['task']}.json").write_text(json.dumps(record))

    def trained_again(*args, **kwargs):
        raise AssertionError("a finished point was trained again")

    monkeypatch.setattr(train, "train", trained_again)
    monkeypatch.setattr(finetune, "finetune", trained_again)
    again = sweep.run_sweep(experiment, "demo", str(copy), overrides=ZERO_SHOT_SWEEP)
    assert again == records  # scored again, as the sweep that never failed scored it


HELD_OUT_FIELDS = {"held_out_loss": None, "held_out_token_accuracy": None,
                   "held_out_examples": None, "held_out_curve": []}


@pytest.mark.slow
def test_both_later_stages_given_at_once_keep_each_other_s_fields(zero_shot_sweep, tmp_path):
    # The workdir as a sweep with neither the zero-shot stage nor the held-out loss leaves it;
    # re-run with both, each finished record gets both, in results.jsonl's last record and in
    # the saved one (the second stage amends what the first appended, not the older record).
    experiment, workdir, records = zero_shot_sweep
    copy = tmp_path / "sweep"
    shutil.copytree(workdir, copy)
    rundir = copy / "points" / "lm" / "seed0"
    (rundir / sweep_point.ZERO_SHOT_FILE).unlink()
    (rundir / "pretrain" / "eval.jsonl").unlink()

    def stripped(record):
        return {**{k: v for k, v in record.items() if k != "zero_shot"}, **HELD_OUT_FIELDS}

    for path in [*(rundir / "records").glob("*.json")]:
        path.write_text(json.dumps(stripped(json.loads(path.read_text()))))
    (copy / "results.jsonl").write_text("".join(json.dumps(stripped(r)) + "\n" for r in records))
    identity = json.loads((copy / sweep_workdir.SWEEP_FILE).read_text())
    identity["overrides"].remove(sweep_workdir.ZERO_SHOT_ON)
    (copy / sweep_workdir.SWEEP_FILE).write_text(json.dumps(identity))
    given = sweep.run_sweep(experiment, "demo", str(copy), overrides=ZERO_SHOT_SWEEP)
    assert given == records
    assert [json.loads((rundir / "records" / f"{r['task']}.json").read_text())
            for r in records] == records


def test_a_zero_shot_sweep_needs_a_task_with_label_options(zero_shot_sweep):
    experiment, _, _ = zero_shot_sweep
    with pytest.raises(ConfigError, match=r"point 'lm': sweep.zero_shot=True needs a task with "
                                          r"label options.*has none$"):
        grid.expand(experiment, "demo", ["sweep.zero_shot=True", "sweep.tasks=builtin_reverse"])
    assert grid.expand(experiment, "demo")[0].config.sweep.zero_shot is False  # the default
    with pytest.raises(ConfigError, match=r"sweep.zero_shot[^\n]*$"):
        grid.expand(experiment, "demo", ["sweep.zero_shot=3"])
