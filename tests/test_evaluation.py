"""Fine-tuning and evaluation: pre-train -> fine-tune -> decode -> metrics for every
architecture, learning a trivial task end to end and generalising it to inputs held out of
training, evaluation scoring models whose predictions are known, parameters-only restore,
resumable best scores, and bad input rejected before any expensive work.

A made-up task, `test_reverse` ("reverse: c a f" -> "f a c" over six letters), is registered
for the module; the vocabulary is trained once on a small corpus of such letters.
"""
import copy
import dataclasses
import itertools
import json
import re
import shutil

import jax
import numpy as np
import pytest
from flax import nnx

from t5x_lite import (batch_format, checkpointing, cli, decoding, distributed, evaluation,
                      finetune, models, optim, presets, run_folders, saved_config, train,
                      train_state)
from t5x_lite.architectures import names as architecture_names
from t5x_lite.config import ConfigError, apply_overrides, parse_overrides
from t5x_lite.data import pipeline, tasks
from tiny_configs import random_model, tiny_finetune_config, write_letter_corpus

LETTERS = "abcdef"
# Every sequence of 2 to 4 of the letters (36 + 216 + 1296 = 1548), in one fixed shuffled
# order: the first VALIDATION_SIZE are the validation split, held out of training; the
# training split draws TRAIN_SIZE records from the others (repeats allowed).
SEQUENCES = [" ".join(letters) for length in (2, 3, 4)
             for letters in itertools.product(LETTERS, repeat=length)]
VALIDATION_SIZE, TRAIN_SIZE = 64, 2000


def reverse_records(split, data_dir, data_root):
    """Validation: 64 letter sequences; train: 2,000 draws from the sequences not among them."""
    order = np.random.default_rng(0).permutation(len(SEQUENCES))
    held_out, seen = order[:VALIDATION_SIZE], order[VALIDATION_SIZE:]
    picks = (held_out if split == "validation"
             else seen[np.random.default_rng(0).integers(0, len(seen), TRAIN_SIZE)])
    return [{"letters": SEQUENCES[i]} for i in picks]


def format_reverse(record):
    target = " ".join(reversed(record["letters"].split()))
    return tasks.Example(f"reverse: {record['letters']}", target, (target,))


@pytest.fixture(scope="module", autouse=True)
def reverse_task():
    task = tasks.Task("test_reverse", reverse_records, format_reverse, ("accuracy",),
                      {"train": "train", "validation": "validation"})
    tasks.TASKS[task.name] = task
    yield task
    del tasks.TASKS[task.name]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """(corpus glob, data dir): made-up words, and letter lines that make each letter a piece."""
    return write_letter_corpus(tmp_path_factory.mktemp("data"), "reverse", LETTERS)


def config_for(data, arch="encoder_decoder", **settings):
    config = tiny_finetune_config(arch, *data)
    config.finetune.update(**settings)
    return config


@pytest.fixture(scope="module")
def pretrained(data, tmp_path_factory):
    """arch -> the workdir of a 2-step pre-training run (made on first use)."""
    runs = {}

    def get(arch):
        if arch not in runs:
            runs[arch] = tmp_path_factory.mktemp(f"pretrain_{arch}")
            train.train(config_for(data, arch), runs[arch], progress=False)
        return runs[arch]

    return get


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_eval_examples_keep_one_fixed_sample_of_a_split_sorted_by_source():
    """`finetune.eval_examples` kept the split's first N: STS-B's first 500 dev pairs are image
    captions (its file lists 625 of them, then 375 forum and 500 news pairs). 'sample' (the
    default) keeps N drawn without replacement, in the split's order, the same every time;
    'first' the first N, as runs before did; all when N covers the split."""
    split = [("captions", i) for i in range(625)] + [("forums", i) for i in range(375)] + [
        ("news", i) for i in range(500)]
    kept = evaluation.select_examples(split, 500, "sample")
    assert len(kept) == len(set(kept)) == 500 and set(kept) <= set(split)
    assert kept == sorted(kept, key=split.index)  # the split's order
    assert kept == evaluation.select_examples(list(split), 500, "sample")
    for source, size in (("captions", 625), ("forums", 375), ("news", 500)):
        share = sum(example[0] == source for example in kept) / 500
        # The hypergeometric standard deviation of the share is under 0.02 here.
        assert abs(share - size / len(split)) < 0.08, (source, share)
    assert evaluation.select_examples(split, 500, "first") == split[:500]
    for selection in ("sample", "first"):
        assert evaluation.select_examples(split, None, selection) == split
        assert evaluation.select_examples(split, len(split) + 1, selection) == split


def test_a_task_split_scores_the_selection_its_config_asks_for(data):
    config = config_for(data)
    vocab = pipeline.vocabulary_from_config(config)
    task = tasks.TASKS["test_reverse"]
    every = evaluation.TaskSplit(task, "validation", config, vocab)
    sampled = evaluation.TaskSplit(task, "validation", config, vocab, limit=10)
    assert len(every.examples) == VALIDATION_SIZE
    assert sampled.examples == evaluation.select_examples(every.examples, 10, "sample")
    assert sampled.examples != every.examples[:10]
    config.finetune.eval_selection = "first"
    first = evaluation.TaskSplit(task, "validation", config, vocab, limit=10)
    assert first.examples == every.examples[:10]


def test_ul2_s_paradigm_token_goes_before_every_task_input_when_asked(data):
    """UL2's mode switching (section 3.2): a UL2 model saw every pre-training input begin
    with its denoiser's paradigm token; `finetune.mode_token` puts one before every task input
    that fine-tuning, validation, evaluation and zero-shot scoring read (all read a
    `TaskSplit`), cut to the same `inputs_length`, EOS kept."""
    config = config_for(data)
    vocab = pipeline.vocabulary_from_config(config)
    task = tasks.TASKS["test_reverse"]
    plain = evaluation.TaskSplit(task, "validation", config, vocab, limit=10)
    config.finetune.mode_token = "[S2S]"
    marked = evaluation.TaskSplit(task, "validation", config, vocab, limit=10)
    token = batch_format.mode_token("[S2S]", config.model.vocab_size, config.model.num_sentinels)
    assert token == config.model.vocab_size - config.model.num_sentinels + 2  # <extra_id_29>
    for (inputs, targets), (marked_inputs, marked_targets) in zip(plain.encoded, marked.encoded):
        assert marked_targets == targets
        assert marked_inputs == ([token, *inputs] if len(inputs) < 16 else
                                 [token, *inputs[:14], inputs[-1]])
    # [S2S] is the third sentinel from the end: with two its id lay past the vocabulary, and
    # fine-tuning stopped at its first step with a NaN loss.
    config.model.num_sentinels = 2
    with pytest.raises(ConfigError, match=r"^finetune.mode_token='\[S2S\]' is the sentinel 3 "
                                          r"from the end: model.num_sentinels=2 must be at "
                                          r"least 3$"):
        evaluation.TaskSplit(task, "validation", config, vocab, limit=10)


# --- end to end ------------------------------------------------------------------------------


@pytest.mark.slow  # five pre-training and fine-tuning programs to compile
@pytest.mark.parametrize("arch", architecture_names())
def test_pretrain_then_finetune_decodes_and_scores_every_architecture(arch, data, pretrained,
                                                                       tmp_path):
    config = config_for(data, arch, targets_length=3)
    vocab = pipeline.vocabulary_from_config(config)
    examples = tasks.TASKS["test_reverse"].examples("train")
    expected_cut = sum(len(vocab.encode(ex.targets)) + 1 > 3 for ex in examples)
    assert 0 < expected_cut < len(examples)  # 3 letters and EOS do not fit in 3 tokens

    with pytest.warns(UserWarning, match=f"truncated {expected_cut} of {len(examples)} examples"):
        result = finetune.finetune(config, tmp_path, init_from=str(pretrained(arch)),
                                     progress=False)

    assert result["truncated"] == {"test_reverse": expected_cut}
    # <= 1: the decoder-only archs share one program, so the second of them compiles nothing.
    assert result["steps"] == 2 and np.isfinite(result["loss"]) and result["compiles"] <= 1
    records = read_jsonl(tmp_path / "eval.jsonl")
    assert [(r["step"], r["task"]) for r in records] == [(2, "test_reverse")]  # the end
    assert np.isfinite(records[0]["loss"]) and 0 <= records[0]["token_accuracy"] <= 100
    assert set(records[0]["metrics"]) == {"accuracy"}
    assert result["scores"] == {"test_reverse": records[0]["metrics"]}
    assert result["best_step"] == {"test_reverse": 2}
    # The fine-tuned checkpoint scores the same through evaluate().
    scores = evaluation.evaluate(config, str(tmp_path), ["test_reverse"])
    assert scores == result["scores"]


# The architectures that must learn the task below, and the exact match (%) each must reach on
# the held-out inputs; each of the others is checked on a model whose predictions are known
# (`test_evaluate_scores_a_model_of_every_other_architecture_as_it_predicts`).
# Measured with the test's settings at train.seed 0, 1, 2 (the seed changes the pre-trained
# start and the order of the fine-tuning data), exact match at step 800 on the 64 held-out
# inputs: encoder_decoder 100 / 100 / 98.4, language_model 100 / 100 / 100, prefix_lm
# 98.4 / 100 / 84.4. The test runs seed 0; each threshold sits below the worst seed with a
# margin. Only the encoder-decoder, the paper's baseline, runs it in the suite: each run is
# 70-90 s of one CI core, and with all three the suite passed its 20-minute budget on the
# 2-core machine (20:47 on 2026-12-03). The decoder-only models are checked on known
# predictions with the others; their learning is what the demo's and the sweeps' fine-tuned
# scores measure (experiments/README.md). Shortening the run instead does not hold: at 500
# steps, or 800 with batch 16, language_model's seed 1 reached only 70 and 72.
LEARNERS = {"encoder_decoder": 95.0}


def test_validation_inputs_are_held_out_of_training():
    task = tasks.TASKS["test_reverse"]
    validation = {ex.inputs for ex in task.examples("validation")}
    training = {ex.inputs for ex in task.examples("train")}
    assert len(validation) == VALIDATION_SIZE  # distinct sequences
    assert not validation & training
    assert len(training) > 1000  # most of the 1,484 others: reversing is learned, not listed


@pytest.mark.slow  # 800 steps each
@pytest.mark.parametrize("arch", LEARNERS)
def test_a_tiny_model_learns_to_reverse_letter_sequences_it_never_saw(arch, data, pretrained,
                                                                      tmp_path):
    """Generalisation, not memorisation: the 64 validation sequences never occur in training
    (asserted here), so every exact match reverses a sequence the model has not seen.
    With 2-3 letters only (188 training sequences, as before) the encoder-decoder reached 67 on
    held-out inputs after 300 steps; with 2-4 letters but 400 steps, the language model reached
    55 and 95 (seeds 1, 2): hence 2-4 letters and 800 steps."""
    task = tasks.TASKS["test_reverse"]
    validation = [ex.inputs for ex in task.examples("validation")]
    assert not set(validation) & {ex.inputs for ex in task.examples("train")}
    # A linear decay settles the last steps.
    config = config_for(data, arch, steps=800, batch_size=32, learning_rate=3e-3,
                        optimizer="adamw", schedule="linear", warmup_steps=20, eval_every=800,
                        eval_examples=len(validation))
    result = finetune.finetune(config, tmp_path, init_from=str(pretrained(arch)),
                               progress=False)
    records = read_jsonl(tmp_path / "eval.jsonl")
    assert [r["step"] for r in records] == [800]  # one validation, of the final model
    assert result["scores"]["test_reverse"]["accuracy"] >= LEARNERS[arch], result


def test_a_two_task_mixture_trains_on_each_task_at_its_capped_rate(data, pretrained, tmp_path,
                                                                  monkeypatch):
    """The paper's examples-proportional mixing with rate limit K, end to end: task t fills
    min(len(train_t), K) of every sum-over-tasks slots. With 2,000 reverse examples, 40 copy
    examples and K = 56, 12 steps of 8 rows are one mixture epoch: 56 reverse rows and each
    copy example exactly once (without the limit copy would get 40 / 2,040 of the rows)."""
    copies = [" ".join(letters) for letters in itertools.permutations(LETTERS, 3)][:40]
    task = tasks.Task("test_copy", lambda split, data_dir, data_root: [
        {"letters": x} for x in (copies if split == "train" else copies[:4])],
        lambda r: tasks.Example(f"copy: {r['letters']}", r["letters"], (r["letters"],)),
        ("accuracy",), {"train": "train", "validation": "validation"})
    monkeypatch.setitem(tasks.TASKS, task.name, task)
    config = config_for(data, tasks=("test_reverse", "test_copy"), mixing_limit=56, steps=12,
                        pack=False, eval_every=12)
    fed = []  # the real batches the run trains on, recorded on their way to the step
    real_batch = finetune._TaskData.batch
    monkeypatch.setattr(finetune._TaskData, "batch",
                        lambda self, step: fed.append(real_batch(self, step)) or fed[-1])
    result = finetune.finetune(config, tmp_path, init_from=str(pretrained("encoder_decoder")),
                               progress=False)

    vocab = pipeline.vocabulary_from_config(config)
    inputs = [vocab.decode(row[row > 1]) for batch in fed for row in batch["encoder_input_tokens"]]
    assert len(fed) == 12 and len(inputs) == 96
    copied = sorted(text for text in inputs if text.startswith("copy:"))
    assert sorted(f"copy: {x}" for x in copies) == copied
    assert sum(text.startswith("reverse:") for text in inputs) == 56
    assert set(result["scores"]) == {"test_reverse", "test_copy"}
    assert {(r["step"], r["task"]) for r in read_jsonl(tmp_path / "eval.jsonl")} == {
        (12, "test_reverse"), (12, "test_copy")}


def register_known_targets(name, inputs, targets):
    """Register a made-up task `name` whose validation split pairs `inputs` with `targets`."""
    task = tasks.Task(name, lambda split, data_dir, data_root: [
        {"inputs": x, "target": y} for x, y in zip(inputs, targets)],
        lambda r: tasks.Example(r["inputs"], r["target"], (r["target"],)), ("accuracy",),
        {"validation": "validation"})
    tasks.TASKS[name] = task
    return name


@pytest.mark.parametrize("arch", [a for a in architecture_names() if a not in LEARNERS])
def test_evaluate_scores_a_model_of_every_other_architecture_as_it_predicts(arch, data):
    """A randomly initialised model of `arch`. Its greedy outputs, decoded directly with
    `decoding.decode` from input ids encoded and padded here, are the targets of one made-up
    task, which evaluate() must score exactly 100; a task with one of the 8 targets changed
    must score exactly 7/8 of that, so the score really compares predictions with targets."""
    if arch == "encoder_only":  # it predicts its finetune.targets_length slots, no other length
        config = config_for(data, arch, eval_examples=8, targets_length=4)
    else:
        config = config_for(data, arch, eval_examples=8, decode={"max_length": 4})
    # Seed 1: with seed 0, the language model's attention saturates on a position every input
    # shares, and it decodes one answer for all eight (the assertion below says so if a seed does).
    model = random_model(config, seed=1)
    vocab = pipeline.vocabulary_from_config(config)
    inputs = [ex.inputs for ex in tasks.TASKS["test_reverse"].examples("validation")[:8]]
    ids = np.zeros((8, config.finetune.inputs_length), np.int32)
    for row, text in zip(ids, inputs):
        encoded = vocab.encode(text) + [1]  # EOS
        row[:len(encoded)] = encoded
    tokens = decoding.decode(model, ids, max_length=4).tokens
    predicted = [vocab.decode(row) for row in np.asarray(tokens)]
    assert len(set(predicted)) > 1 and all(predicted)  # not one answer for every input
    changed = list(predicted)
    changed[3] += " a"
    names = [register_known_targets(f"test_known_{arch}", inputs, predicted),
             register_known_targets(f"test_known_{arch}_one_changed", inputs, changed)]
    try:
        assert evaluation.evaluate(config, model, names) == {
            names[0]: {"accuracy": 100.0}, names[1]: {"accuracy": 100.0 * 7 / 8}}
    finally:
        for name in names:
            del tasks.TASKS[name]


def test_sampled_validation_runs_and_draws_the_same_predictions_each_time(data, capsys):
    """decode.method='sample' passed the config's checks, then failed at the first validation:
    no key reached the sampler. Scoring says what it scores, and then how long it took (it was
    silent for minutes at larger sizes)."""
    config = config_for(data, "encoder_decoder", eval_examples=8,
                        decode={"max_length": 4, "method": "sample"})
    model = models.build_model(config.model, nnx.Rngs(0))
    first = evaluation.evaluate(config, model, ["test_reverse"])
    assert re.search(r"(^|\r)scoring 8 examples of test_reverse \(decoding at most 4 tokens "
                     r"each\)\nscored in \d+\.\d s\n$", capsys.readouterr().err)
    assert first == evaluation.evaluate(config, model, ["test_reverse"])
    assert set(first["test_reverse"]) == {"accuracy"}


# --- restoring, resuming -----------------------------------------------------------------------


def saved_finetune_state(config, workdir):
    """(the train state the fine-tuning run of `config` saved in `workdir`, on one device; the
    abstract state it was read into)."""
    ft_config = finetune.finetune_train_config(config)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model"))
    abstract = train_state.abstract_state(ft_config, mesh)
    with checkpointing.Checkpointer(workdir / "checkpoints", every=1, keep=1,
                                    config=ft_config) as checkpointer:
        return checkpointer.restore(abstract), abstract


def test_finetuning_restores_only_the_parameters_and_starts_a_fresh_optimizer(data, pretrained,
                                                                              tmp_path):
    # A learning rate so small that one update leaves the parameters as they were restored.
    config = config_for(data, steps=1, learning_rate=1e-9)
    config.checkpoint.every = 1
    source = pretrained("encoder_decoder")
    finetune.finetune(config, tmp_path, init_from=str(source), progress=False)

    state, abstract = saved_finetune_state(config, tmp_path)
    pretrained_params = checkpointing.restore_params_only(source / "checkpoints",
                                                          abstract.params)
    # Pre-training ran 2 Adafactor steps; a restored optimizer would now count 3, not 1.
    counts = [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(state.opt_state)
              if "count" in jax.tree_util.keystr(path)]
    assert counts and all(int(count) == 1 for count in counts)
    assert int(state.step) == 1
    for fine, pre in zip(jax.tree.leaves(state.params), jax.tree.leaves(pretrained_params)):
        np.testing.assert_allclose(fine, pre, atol=1e-6)


@pytest.mark.parametrize("scan_layers", [False, True])
def test_continuing_carries_the_pre_training_s_adafactor_moments_and_update_count_on(
        scan_layers, data, pretrained, tmp_path):
    """finetune.optimizer_state='continue', as Mesh TF restores every variable of the
    pre-trained checkpoint (global step and Adafactor's slots) and trains on: after one
    fine-tuning step the update count is 2 + 1, and each second-moment statistic follows
    Adafactor's rule v <- b v + (1 - b) g^2 with b = 1 - t^-0.8 at t = 3 from the
    pre-training's v. A fresh run on the same batch has b = 0 (t = 1), so its v is the g^2
    term itself: the same parameters and batch give both runs the same gradient. With the
    layers stacked (`model.scan_layers`), each layer's slice has a count of its own."""
    source = pretrained("encoder_decoder")
    if scan_layers:
        pretraining = config_for(data)
        pretraining.model.scan_layers = True
        source = tmp_path / "pretrain"
        train.train(pretraining, source, progress=False)
    states = {}
    for optimizer_state in ("fresh", "continue"):
        config = config_for(data, steps=1, optimizer_state=optimizer_state)
        config.model.scan_layers = scan_layers
        config.checkpoint.every = 1
        finetune.finetune(config, tmp_path / optimizer_state, init_from=str(source),
                          progress=False)
        states[optimizer_state], abstract = saved_finetune_state(config,
                                                                 tmp_path / optimizer_state)
    pre = checkpointing.restore_parts(source / "checkpoints",
                                      {"opt_state": abstract.opt_state})[0]["opt_state"]
    decay = 1 - 3.0 ** -0.8
    checked = 0
    for (path, before), fresh, continued in zip(
            jax.tree_util.tree_leaves_with_path(pre),
            jax.tree.leaves(states["fresh"].opt_state),
            jax.tree.leaves(states["continue"].opt_state)):
        if "count" in jax.tree_util.keystr(path):
            assert [set(np.asarray(count).ravel().tolist())
                    for count in (before, fresh, continued)] == [{2}, {1}, {3}]
            continue
        before, fresh, continued = map(np.asarray, (before, fresh, continued))
        np.testing.assert_allclose(continued, decay * before + (1 - decay) * fresh,
                                   rtol=1e-5, atol=1e-12)
        checked += bool(np.any(continued != fresh))
    assert checked > 20  # every matrix's and vector's statistics, not placeholders only
    assert int(states["continue"].step) == 1  # the run's own steps count from 0


def test_an_optimiser_state_of_another_layout_is_refused_before_any_work(data, pretrained,
                                                                        tmp_path, monkeypatch):
    """A pre-training checkpoint written before Adafactor's attention moments changed layout
    (2026-12-05) holds them as optax laid them out on the kernels' stored shapes; continuing
    it would not restore (every step "unreadable", after the workdir was made). Here the
    layout differs the other way round: this process's program lays them out the old way."""
    source = pretrained("encoder_decoder")  # made (if this test runs first) before the patch
    train_state._shapes.cache_clear()
    monkeypatch.setattr(optim, "_attention_kernels_as_matrices", lambda tx: tx)
    try:
        with pytest.raises(ConfigError, match=(
                r"^finetune.optimizer_state='continue': the optimiser state saved in .* is laid "
                r"out otherwise than this version's \(\d+ arrays, e.g. opt_state/.*: saved "
                r"\(64, 64\) != now \(64, 4, 16\); as in an Adafactor run saved before its "
                r"attention moments changed shape on 2026-12-05\), so it cannot carry on: "
                r"fine-tune with finetune.optimizer_state=fresh$")):
            finetune.finetune(config_for(data, optimizer_state="continue"), tmp_path / "run",
                              init_from=str(source))
    finally:
        train_state._shapes.cache_clear()  # the shapes of the patched program
    assert not (tmp_path / "run").exists()


def test_a_source_whose_newest_step_is_unreadable_is_recorded_with_the_step_it_gave(data,
                                                                                   tmp_path):
    """The parameters (and the optimiser state carried on) come from the newest step that
    reads back; init_from.json names it beside the source's newest step, which a resume
    compares with the source's then: the same damaged source resumes, it has not changed."""
    config = config_for(data)
    config.checkpoint.update(every=1, keep=2)
    source = tmp_path / "pre"
    train.train(config, source, progress=False)
    for path in (source / "checkpoints" / "2" / "default").rglob("d/*"):  # step 2's arrays
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    run = config_for(data, steps=1, optimizer_state="continue")
    run.checkpoint.every = 1
    with pytest.warns(UserWarning, match="checkpoint at step 2 .* is unreadable"):
        finetune.finetune(run, tmp_path / "ft", init_from=str(source), progress=False)
    record = json.loads((tmp_path / "ft" / saved_config.FINETUNE_SOURCE_FILE).read_text())
    assert (record["step"], record["restored_step"]) == (2, 1)
    assert record["save_began_ns"] == checkpointing.save_began_ns(source / "checkpoints", 2)
    run.finetune.steps = 2  # resumed from its own step 1
    assert finetune.finetune(run, tmp_path / "ft", init_from=str(source),
                             progress=False)["steps"] == 2
    # Pre-training pointed at the fine-tuning workdir (a mistyped --workdir) would go on from
    # its fine-tuned parameters and overwrite its checkpoints: refused before anything runs.
    saved = sorted(p.name for p in (tmp_path / "ft" / "checkpoints").iterdir())
    with pytest.raises(ConfigError, match=rf"^{tmp_path / 'ft'} holds a fine-tuning run "
                                          r"\(init_from.json\); .* give another --workdir$"):
        train.train(config, tmp_path / "ft", progress=False)
    assert sorted(p.name for p in (tmp_path / "ft" / "checkpoints").iterdir()) == saved


def test_a_fine_tuning_from_given_or_random_parameters_is_marked_and_kept_from_train(data,
                                                                                    tmp_path):
    """Only a fine-tuning from a pre-training run wrote init_from.json, so one from random
    parameters (or --init_from_hf's) was taken over by a `train` pointed at it; now each
    records its start, and resuming it from a checkpoint instead is refused."""
    config = config_for(data, steps=1)
    finetune.finetune(config, tmp_path / "ft", init_from=None, progress=False)
    record = json.loads((tmp_path / "ft" / saved_config.FINETUNE_SOURCE_FILE).read_text())
    assert (record["path"], record["parameters"]) == (None, "random")
    with pytest.raises(ConfigError, match="holds a fine-tuning run"):
        train.train(config, tmp_path / "ft", progress=False)
    train.train(config, tmp_path / "pre", progress=False)
    with pytest.raises(ConfigError, match=r"was fine-tuned from random parameters, not a "
                                          r"pre-training run: pass --restart"):
        finetune.finetune(config, tmp_path / "ft", init_from=str(tmp_path / "pre"),
                          progress=False)


def test_a_fine_tuning_pointed_at_a_pre_training_run_is_refused_and_leaves_it(data, pretrained,
                                                                             tmp_path):
    """`finetune --workdir` a pre-training run (a slip for --init_from) was refused as a
    resume of other settings, whose advice, --restart, deleted the pre-training: now it is
    named for what it holds, --restart or not, before anything is written. A run saved
    before its kind's own file was written is told by its saved config."""
    source = tmp_path / "pre"
    shutil.copytree(pretrained("encoder_decoder"), source)
    kept = sorted(str(path.relative_to(source)) for path in source.rglob("*"))
    config = config_for(data)
    for restart in (False, True):
        with pytest.raises(ConfigError, match=(
                rf"^{source} holds a pre-training run \(checkpoints/batch_layout.json\); a "
                rf"fine-tuning run there would overwrite or mix with it \(--init_from {source} "
                r"fine-tunes from it\): give another --workdir$")):
            finetune.finetune(config, source, init_from=None, restart=restart, progress=False)
    assert sorted(str(path.relative_to(source)) for path in source.rglob("*")) == kept
    (source / "checkpoints" / saved_config.BATCH_LAYOUT_FILE).unlink()  # as before 2026-12-05
    assert run_folders.held_kind(source) == ("pre-training", "checkpoints/config.json")
    finetune.finetune(config, tmp_path / "ft", init_from=str(source), progress=False)
    assert run_folders.held_kind(tmp_path / "ft") == ("fine-tuning", "init_from.json")
    (tmp_path / "ft" / saved_config.FINETUNE_SOURCE_FILE).unlink()
    assert run_folders.held_kind(tmp_path / "ft") == ("fine-tuning", "checkpoints/config.json")
    # Its kind only suggested (a pre-training could share its settings): not deleted.
    saved = sorted(path.name for path in (tmp_path / "ft" / "checkpoints").iterdir())
    with pytest.raises(ConfigError, match=rf"^{tmp_path / 'ft'} holds checkpoints saved before "
                       r"a fine-tuning recorded its start \(init_from.json\): they may be a "
                       r"pre-training's, which --restart would delete"):
        finetune.finetune(config, tmp_path / "ft", init_from=str(source), restart=True,
                          progress=False)
    assert sorted(path.name for path in (tmp_path / "ft" / "checkpoints").iterdir()) == saved
    assert run_folders.held_kind(tmp_path / "nothing") is None
    (source / "checkpoints" / saved_config.CONFIG_FILE).write_text("{")  # damaged: unknown
    assert run_folders.held_kind(source) is None


def test_a_resumed_run_keeps_its_validation_history_and_best_scores(data, pretrained, tmp_path):
    config = config_for(data, steps=2, eval_every=1)
    config.checkpoint.every = 1
    init_from = str(pretrained("encoder_decoder"))
    finetune.finetune(config, tmp_path, init_from=init_from, progress=False)
    # A record of a step after the last checkpoint (as a crash would leave) must not count.
    log = tmp_path / "eval.jsonl"
    ghost = {"step": 9, "task": "test_reverse", "loss": 0.0, "token_accuracy": 100.0,
             "metrics": {"accuracy": 100.0}}
    log.write_text(log.read_text() + json.dumps(ghost) + "\n")

    config.finetune.steps = 3
    result = finetune.finetune(config, tmp_path, init_from=init_from, progress=False)
    records = read_jsonl(log)
    assert [r["step"] for r in records] == [1, 2, 3]
    # Best = highest accuracy, the earliest among equals; run 1's records take part.
    best = max(records, key=lambda r: (r["metrics"]["accuracy"], -r["step"]))
    assert result["best_step"] == {"test_reverse": best["step"]}
    assert result["scores"] == {"test_reverse": best["metrics"]}
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 3]
    assert result["steps"] == 3 and result["compiles"] == 0  # the program was reused
    # Validation on other examples or with other decoding would rank its scores beside these
    # (a review found a resume with them changed picking the best across both): refused.
    for field, value in (("eval_examples", 2), ("decode.method", "beam")):
        changed = copy.deepcopy(config)
        changed.finetune.steps = 4
        apply_overrides(changed, parse_overrides(changed, [f"finetune.{field}={value}"]))
        with pytest.raises(ConfigError, match=rf"(?s)incompatible .*finetune.{field}: saved "):
            finetune.finetune(changed, tmp_path, init_from=init_from, progress=False)
    assert [r["step"] for r in read_jsonl(log)] == [1, 2, 3]


# --- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize("field, value, message", [
    ("tasks", ("test_reverse", "nope"),
     r"finetune.tasks has unknown task 'nope'; known tasks: .*builtin_reverse"),
    ("tasks", ("nope", "test_reverse", "glue_colaa"),
     r"finetune.tasks has unknown tasks 'nope', 'glue_colaa'; known tasks: .*builtin_reverse"),
    ("tasks", (), r"finetune.tasks=\(\) must be a non-empty list of task names"),
    ("decode.max_length", 0, r"finetune.decode.max_length=0 must be an integer >= 1"),
    ("decode.method", "nucleus", "finetune.decode.method='nucleus' is not allowed; choose one "
     "of greedy, sample, beam"),
    ("optimizer", "sgd", "finetune.optimizer='sgd' is not allowed; choose one of adafactor"),
    ("schedule", "rsqrt", r"finetune.warmup_steps=0 must be >= 1 for finetune.schedule='rsqrt'"),
    ("steps", 0, "finetune.steps=0 must be an integer >= 1"),
    ("batch_size", -8, "finetune.batch_size=-8 must be an integer >= 1"),
    ("learning_rate", 0.0, "finetune.learning_rate=0.0 must be a positive number"),
    ("eval_every", 0, "finetune.eval_every=0 must be an integer >= 1"),
    ("eval_examples", 0, "finetune.eval_examples=0 must be an integer >= 1"),
    ("mixing_limit", 0, "finetune.mixing_limit=0 must be an integer >= 1"),
    ("optimizer_state", "later", "finetune.optimizer_state='later' is not allowed; choose one "
     "of fresh, continue"),
])
def test_bad_finetune_settings_are_rejected_before_any_work(field, value, message, data,
                                                           tmp_path):
    config = config_for(data)
    config.data.data_dir = str(tmp_path / "cache")
    config.finetune.update_from_flattened_dict({field: value})
    with pytest.raises(ConfigError, match=message):
        finetune.finetune(config, tmp_path / "run", init_from=None)
    assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()


@pytest.mark.parametrize("settings, source, message", [
    (dict(schedule="linear"), "run", r"finetune.schedule='linear' reads the update count, "
     r"which finetune.optimizer_state='continue' carries on from the pre-training's: use "
     r"finetune.schedule='constant' \(the paper's\), or finetune.optimizer_state='fresh'$"),
    ({}, None, r"finetune.optimizer_state='continue' carries on the optimiser state of the "
     r"pre-training run that --init_from names; a start from --init_from_hf or from random "
     r"parameters has none: set --config.finetune.optimizer_state=fresh$"),
    (dict(optimizer="adamw"), "run", r"finetune.optimizer_state='continue' carries on the "
     r"pre-training's optimiser state, which the fine-tuning's \(finetune.optimizer\) cannot: "
     r"train.optimizer: saved 'adafactor' != now 'adamw'; fine-tune with the pre-training's "
     r"optimiser settings, or with finetune.optimizer_state=fresh$"),
])
def test_continuing_an_optimiser_state_there_is_none_of_is_refused_before_any_work(
        settings, source, message, data, pretrained, tmp_path):
    config = config_for(data, optimizer_state="continue", **settings)
    init_from = None if source is None else str(pretrained("encoder_decoder"))
    with pytest.raises(ConfigError, match=message):
        finetune.finetune(config, tmp_path / "run", init_from=init_from)
    assert not (tmp_path / "run").exists()


def test_task_lengths_give_each_run_its_tasks_own_targets_length(data, pretrained, tmp_path,
                                                                 monkeypatch):
    """finetune.task_lengths (the paper preset's) reads each task's own targets length, as T5
    fine-tunes CNN/DM and WMT at 512 target tokens and GLUE at 84: a run takes the longest of
    its tasks', finetune.targets_length for a task without one."""
    short = dataclasses.replace(tasks.TASKS["test_reverse"], targets_length=9)
    long = dataclasses.replace(short, name="test_reverse_long", targets_length=14)
    monkeypatch.setitem(tasks.TASKS, short.name, short)
    monkeypatch.setitem(tasks.TASKS, long.name, long)
    config = config_for(data, task_lengths=True, steps=2, eval_every=2, eval_examples=8)
    assert config.finetune.targets_length == 16
    assert evaluation.with_task_lengths(config, [short]).finetune.targets_length == 9
    assert evaluation.with_task_lengths(config, [short, long]).finetune.targets_length == 14
    builtin = tasks.TASKS["builtin_module"]  # none of its own: the config's 16
    assert evaluation.with_task_lengths(config, [short, builtin]).finetune.targets_length == 16
    assert config.finetune.targets_length == 16  # the caller's config is left as it was
    config.finetune.task_lengths = False
    assert evaluation.with_task_lengths(config, [short]) is config
    config.finetune.update(task_lengths=True, tasks=(short.name,))
    finetune.finetune(config, tmp_path / "run", init_from=str(pretrained("encoder_decoder")))
    saved = saved_config.read_saved_config(tmp_path / "run" / saved_config.CHECKPOINTS_DIR)
    assert saved["finetune"]["targets_length"] == 9
    # The same config resumes it (its saved length is what task_lengths reads).
    config.finetune.steps = 4
    finetune.finetune(config, tmp_path / "run", init_from=str(pretrained("encoder_decoder")))
    # A run saved before the field existed (cut to targets_length) resumes only without it,
    # which its refusal names.
    saved_file = tmp_path / "run" / saved_config.CHECKPOINTS_DIR / saved_config.CONFIG_FILE
    old = json.loads(saved_file.read_text())
    old["finetune"].pop("task_lengths")
    old["finetune"]["targets_length"] = 16
    saved_file.write_text(json.dumps(old))
    config.finetune.steps = 5
    with pytest.raises(ConfigError, match=r"(?s)finetune.targets_length: saved 16 != now 9\n.*"
                       r"resume with the saved settings \(--config.finetune.task_lengths=False\)"):
        finetune.finetune(config, tmp_path / "run", init_from=str(pretrained("encoder_decoder")))
    config.finetune.task_lengths = False
    finetune.finetune(config, tmp_path / "run", init_from=str(pretrained("encoder_decoder")))
    # The paper's tasks carry T5's lengths (its sequence_lengths gin files).
    assert {name: tasks.TASKS[name].targets_length for name in presets.PAPER_TASKS} == {
        **{name: 84 for name in presets.PAPER_TASKS if name.startswith("glue_")},
        "squad": 97, "cnn_dailymail": 512, "wmt_ende": 512, "wmt_enfr": 512, "wmt_enro": 512}


def test_evaluate_rejects_unknown_tasks_and_a_zero_decode_length(data):
    config = config_for(data)
    with pytest.raises(ConfigError, match=r"tasks has unknown task 'nope'; known tasks"):
        evaluation.evaluate(config, "unused", ["nope"])
    config.finetune.decode.max_length = -1
    with pytest.raises(ConfigError, match="finetune.decode.max_length=-1 must be an integer"):
        evaluation.evaluate(config, "unused", ["test_reverse"])


@pytest.mark.parametrize("change, message", [
    ({"model.arch": "encoder_decoder_shared"},
     "model.arch: saved 'encoder_decoder' != now 'encoder_decoder_shared'"),
    ({"model.vocab_size": 200}, "model.vocab_size: saved 160 != now 200"),
    ({"data.vocab": "other.model"}, "data.vocab: saved '' != now 'other.model'"),
])
def test_a_checkpoint_of_another_model_or_vocabulary_is_rejected_before_training(
        change, message, data, pretrained, tmp_path):
    config = config_for(data)
    config.update_from_flattened_dict(change)
    with pytest.raises(ConfigError, match=f"hold another model or vocabulary:\n  {message}"):
        finetune.finetune(config, tmp_path, init_from=str(pretrained("encoder_decoder")))
    assert not (tmp_path / "checkpoints").exists()
    with pytest.raises(ConfigError, match="holds no t5x_lite checkpoints"):
        finetune.finetune(config_for(data), tmp_path, init_from=str(tmp_path))


def test_resuming_a_fine_tuning_whose_pre_training_moved_on_is_refused(data, pretrained,
                                                                       tmp_path):
    """The pre-training was continued after a fine-tuning finished: running the fine-tuning
    again said "nothing to train" and returned the old model's scores as the new one's."""
    source = tmp_path / "pretrain"
    shutil.copytree(pretrained("encoder_decoder"), source)
    config, workdir = config_for(data), tmp_path / "finetune"
    finetune.finetune(config, workdir, init_from=str(source), progress=False)
    first = json.loads((workdir / saved_config.FINETUNE_SOURCE_FILE).read_text())
    assert first == {"path": str(source / "checkpoints"), "step": config.train.steps,
                     "save_began_ns": first["save_began_ns"],
                     "restored_step": config.train.steps}
    assert isinstance(first["save_began_ns"], int)
    longer = config_for(data)
    longer.train.steps += 2
    train.train(longer, source, progress=False)
    with pytest.raises(ConfigError, match=(
            rf"^{workdir} was fine-tuned from {source}/checkpoints at step {first['step']}; "
            rf"--init_from now gives {source}/checkpoints at step {longer.train.steps}: pass "
            r"--restart to fine-tune again from it")):
        finetune.finetune(config, workdir, init_from=str(source), progress=False)
    finetune.finetune(config, workdir, init_from=str(source), progress=False, restart=True)
    assert json.loads((workdir / saved_config.FINETUNE_SOURCE_FILE).read_text())["step"] == longer.train.steps


def test_resuming_a_fine_tuning_whose_pre_training_ran_again_is_refused(data, pretrained,
                                                                        tmp_path):
    """The pre-training was made again to the same step (--restart, say with other code):
    the step alone did not tell the fine-tuning that its source had changed. A copy of the
    source, which keeps its saves, is still the same source."""
    config, source, workdir = config_for(data), tmp_path / "pretrain", tmp_path / "finetune"
    shutil.copytree(pretrained("encoder_decoder"), source)
    finetune.finetune(config, workdir, init_from=str(source), progress=False)
    copied = tmp_path / "copied"
    shutil.copytree(source, copied)
    finetune.finetune(config, workdir, init_from=str(copied), progress=False)  # resumes: done
    train.train(config, source, progress=False, restart=True)
    with pytest.raises(ConfigError, match=(
            rf"^{workdir} was fine-tuned from {source}/checkpoints at step "
            rf"{config.train.steps}, saved at \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d UTC; "
            rf"--init_from now gives {source}/checkpoints at that step saved anew at "
            r".* UTC \(its pre-training ran again, or --init_from names another run\): pass "
            r"--restart")):
        finetune.finetune(config, workdir, init_from=str(source), progress=False)


def test_a_checkpoint_of_an_architecture_not_registered_here_says_so(pretrained, tmp_path):
    """A run of an architecture that a file registered in its own process: scoring it in a
    process that never loaded that file said only "model.arch='mine' is not allowed"."""
    saved = json.loads((pretrained("encoder_decoder") / "checkpoints" / "config.json").read_text())
    saved["model"]["arch"] = "mine"
    (tmp_path / "config.json").write_text(json.dumps(saved))
    with pytest.raises(ConfigError, match=(
            rf"^{tmp_path}/config.json holds model.arch='mine', which is not registered in "
            r"this process; pass --config=FILE with the file that registers it \(registered "
            r"here: encoder_decoder, ")):
        evaluation.config_from_checkpoint(presets.finetune_preset("tiny"), tmp_path, {})


def test_fine_tuning_into_the_pre_training_s_own_workdir_is_refused(data, pretrained, tmp_path):
    """Its checkpoints would be the pre-training's: the resume check then suggested
    --restart, which deleted the pre-training."""
    run = pretrained("encoder_decoder")
    before = sorted(path.name for path in (run / "checkpoints").iterdir())
    for source in (run, run / "checkpoints"):  # refused as a pre-training's folder
        with pytest.raises(ConfigError, match=rf"^{run} holds a pre-training run .*\(--init_from "
                                              rf"{run} fine-tunes from it\)"):
            finetune.finetune(config_for(data), run, init_from=str(source), restart=True)
    assert sorted(path.name for path in (run / "checkpoints").iterdir()) == before
    # A fine-tuning run fine-tuned on from itself: its own workdir.
    finetune.finetune(config_for(data), tmp_path / "ft", init_from=str(run), progress=False)
    with pytest.raises(ConfigError, match=rf"^--init_from {tmp_path / 'ft'} is this run's own "
                                          rf"workdir {tmp_path / 'ft'}: fine-tune into a workdir"):
        finetune.finetune(config_for(data), tmp_path / "ft", init_from=str(tmp_path / "ft"),
                          restart=True)


def test_eval_command_reads_the_model_and_vocabulary_from_the_checkpoint(
        data, pretrained, monkeypatch, capsys):
    """`t5x-lite eval --preset tiny --checkpoint RUN` scores RUN's model (d_model 64, vocabulary
    160, not the tiny preset's) as `evaluate` with RUN's own config does; the rest (lengths,
    examples) comes from the preset and the overrides."""
    run = pretrained("encoder_decoder")
    lengths = dict(batch_size=16, inputs_length=16, targets_length=16, eval_examples=16)
    monkeypatch.setattr(distributed, "initialize_distributed", lambda: None)
    cli.main(["t5x-lite", "eval", "--preset", "tiny", f"--checkpoint={run}",
              "--tasks=test_reverse", f"--config.data.data_dir={data[1]}",
              *(f"--config.finetune.{field}={value}" for field, value in lengths.items())])
    printed = json.loads(capsys.readouterr().out)
    assert printed == evaluation.evaluate(config_for(data, **lengths), str(run), ["test_reverse"])

    # An override that agrees with the checkpoint is fine; a parameter-neutral one wins.
    preset, overrides = presets.finetune_preset("tiny"), {"model.d_model": 64,
                                                          "model.dtype": "bfloat16"}
    apply_overrides(preset, overrides)  # as the command does before reading the checkpoint
    derived = evaluation.config_from_checkpoint(preset, run, overrides)
    saved = json.loads((run / "checkpoints" / saved_config.CONFIG_FILE).read_text())
    assert {**derived.model.to_dict(), "dtype": "float32"} == saved["model"]
    assert derived.model.dtype == "bfloat16"  # parameter-neutral: the override wins
    assert (derived.data.corpus, derived.data.vocab) == (str(data[0]), "")
    assert derived.finetune.to_dict() == preset.finetune.to_dict()
    assert preset.model.vocab_size == 8192  # the config passed in is left alone

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["t5x-lite", "eval", "--preset", "tiny", f"--checkpoint={run}",
                  "--config.model.d_model=128"])
    assert str(exit_info.value.code) == (
        "t5x-lite eval: invalid config: --config.model.d_model=128 contradicts the "
        f"checkpoint's model.d_model=64 (in {run}/checkpoints/config.json); the model and "
        "vocabulary are read from the checkpoint, so drop the override")


# --- public weights ------------------------------------------------------------------------------


def test_evaluate_scores_a_model_converted_from_hugging_face_as_it_predicts(data):
    """The targets of a made-up task are a random HF T5's own greedy outputs, so evaluate()
    on the converted model scores 100% exactly when it predicts what transformers does."""
    from conftest import require_module

    torch, transformers = require_module("torch"), require_module("transformers")
    from t5x_lite.convert import from_hf_t5

    torch.manual_seed(0)
    hf = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=160, d_model=32, d_ff=64, num_heads=4, d_kv=8, num_layers=2,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)).eval()
    with torch.no_grad():  # large random weights: clear argmax margins, no near-ties
        for name, param in hf.named_parameters():
            param.uniform_(0.5, 1.5) if "layer_norm" in name else param.normal_(0.0, 1.0)
    hf_config, model = from_hf_t5(hf)
    config = config_for(data, eval_examples=8, decode={"max_length": 4})
    config.model = hf_config.model
    config.model.num_sentinels = 32  # our vocabulary's; the weights do not depend on it
    vocab = pipeline.vocabulary_from_config(config)
    inputs = [ex.inputs for ex in tasks.TASKS["test_reverse"].examples("validation")[:8]]
    encoded = pipeline.pad_examples([(vocab.encode(x) + [1], [1]) for x in inputs], 8, 16, 4)
    tokens = torch.tensor(encoded[0]["encoder_input_tokens"])
    with torch.no_grad():  # t5x_lite never predicts the pad id 0 (it marks "finished")
        generated = hf.generate(tokens, attention_mask=tokens > 0, max_new_tokens=4,
                                do_sample=False, num_beams=1, suppress_tokens=[0])
    hf_texts = [vocab.decode(row[1:]) for row in generated.numpy()]  # row[0] is the start 0
    # Texts that tell predictions apart: not all empty (EOS first), not all the same.
    assert all(hf_texts) and len(set(hf_texts)) > 1, hf_texts

    echo = tasks.Task("test_hf_echo", lambda split, data_dir, data_root: [
        {"inputs": x, "target": y} for x, y in zip(inputs, hf_texts)],
        lambda r: tasks.Example(r["inputs"], r["target"], (r["target"],)), ("accuracy",),
        {"validation": "validation"})
    tasks.TASKS[echo.name] = echo
    try:
        assert evaluation.evaluate(config, model, [echo.name]) == {echo.name: {"accuracy": 100.0}}
    finally:
        del tasks.TASKS[echo.name]


@pytest.mark.parametrize("score", ["evaluate", "zero_shot"])
def test_an_unlabeled_split_is_one_line_before_the_checkpoint_is_read(score, data, tmp_path,
                                                                      monkeypatch):
    """GLUE's test splits hide their labels: `eval --split test` read the checkpoint, then died
    in SentencePiece with a TypeError on the missing targets."""
    from t5x_lite import zero_shot

    def unlabeled(record):
        return tasks.Example(f"reverse: {record['letters']}", None, ())

    task = tasks.Task("test_unlabeled", reverse_records, unlabeled, ("accuracy",),
                      {"train": "train", "validation": "validation", "test": "validation"},
                      label_options=("a", "b"))
    monkeypatch.setitem(tasks.TASKS, task.name, task)
    run = evaluation.evaluate if score == "evaluate" else zero_shot.evaluate
    with pytest.raises(ConfigError, match=r"^the test split of task 'test_unlabeled' is "
                       r"unlabeled \(16 of 16 examples have no targets\); score a labeled "
                       r"split, e\.g\. --split validation$"):
        run(config_for(data), str(tmp_path / "no_checkpoint_here"), [task.name], "test")
