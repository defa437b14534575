"""The `encoder_only` family (BERT-style): its rows, its masked-LM pre-training, its fine-tuning
by mask slots, the tasks it cannot do, and one attention function for every family.

(a) rows: task rows are the inputs then `targets_length` mask slots, the targets at the slots,
    the same on the host and the device; pre-training rows (through `objectives.corrupt`) put
    the loss on exactly the noise mask, against a direct transcription of the objective.
(b) a tiny encoder_only model's MLM loss falls on the built-in corpus.
(c) a tiny fine-tune on a built-in classification task runs end to end and scores; its
    predictions are the argmax at the slots.
(d) a generation task is refused for a single run and recorded as n/a by a sweep.
(e) every family calls the same `dot_product_attention`, differing only in the mask.
(f) an objective encoder_only cannot train on is a one-line error before any work.
"""
import copy
import functools
import json
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from t5x_lite import (batch_format, decoding, evaluation, finetune, grid, layers, loop, objectives,
                      partitioning, preview, report_render, report_table, sweep_point, train,
                      train_state)
from t5x_lite.config import EOS_ID, PAD_ID, ConfigError, model_config
from t5x_lite.data import pipeline, tasks
from t5x_lite.data.pipeline import pack_examples, pad_examples
from t5x_lite.models import build_model, make_masks
from tiny_configs import tiny_train_config

FAMILY = "encoder_only"
VOCAB, SENTINELS = 64, 8
MASK = VOCAB - 1  # <extra_id_0>
INPUTS_LENGTH, TARGETS_LENGTH = 7, 4


def random_example(rng, max_inputs=INPUTS_LENGTH, max_targets=TARGETS_LENGTH):
    """(inputs, targets): real-token ids ending in EOS."""
    def ids(length):
        return [int(t) for t in rng.integers(3, VOCAB - SENTINELS, rng.integers(0, length))] + [
            EOS_ID]
    return ids(max_inputs), ids(max_targets)


# --- (a) rows ---------------------------------------------------------------------------------


def test_task_rows_are_the_inputs_then_mask_slots_with_the_targets_at_the_slots():
    rng = np.random.default_rng(0)
    pairs = [random_example(rng) for _ in range(20)]
    [host] = pad_examples(pairs, len(pairs), INPUTS_LENGTH, TARGETS_LENGTH, family=FAMILY,
                          mask_token=MASK)
    width = INPUTS_LENGTH + TARGETS_LENGTH
    padded = lambda ids, n: np.pad(np.asarray(ids, np.int32), (0, n - len(ids)))  # noqa: E731
    device = jax.jit(jax.vmap(functools.partial(
        batch_format.example_rows, FAMILY, jnp, inputs_length=INPUTS_LENGTH,
        targets_length=TARGETS_LENGTH, mask_token=MASK)))(
        np.stack([padded(x, INPUTS_LENGTH) for x, _ in pairs]),
        np.stack([padded(y, TARGETS_LENGTH) for _, y in pairs]))
    assert set(host) == set(device) == set(batch_format.row_keys(FAMILY))
    for r, (x, y) in enumerate(pairs):
        # A direct transcription: the inputs, TARGETS_LENGTH slots whatever len(y), padding.
        tokens = padded(x + [MASK] * TARGETS_LENGTH, width)
        targets = padded([0] * len(x) + y, width)
        np.testing.assert_array_equal(host["encoder_input_tokens"][r], tokens)
        np.testing.assert_array_equal(host["encoder_target_tokens"][r], targets)
        np.testing.assert_array_equal(host["encoder_loss_weights"][r], targets > 0)
        for key in host:
            np.testing.assert_array_equal(np.asarray(device[key][r]), host[key][r], err_msg=key)
        row = {key: value[r] for key, value in host.items()}
        assert batch_format.inputs_and_targets(FAMILY, row) == (x, y)
    assert host["encoder_loss_weights"].dtype == np.float32
    # The slot count never tells the target's length: every row has TARGETS_LENGTH of them.
    assert set((host["encoder_input_tokens"] == MASK).sum(1)) == {TARGETS_LENGTH}
    # Not packable: "packing" gives the padded rows, one example each, no segment ids.
    [packed] = pack_examples(pairs, len(pairs), INPUTS_LENGTH, TARGETS_LENGTH, family=FAMILY,
                             mask_token=MASK)
    assert packed.keys() == host.keys()
    for key in host:
        np.testing.assert_array_equal(packed[key], host[key])
    with pytest.raises(ValueError, match="need mask_token"):
        pad_examples(pairs, len(pairs), INPUTS_LENGTH, TARGETS_LENGTH, family=FAMILY)


@pytest.mark.parametrize("name", ["bert_style", "mass_style"])
def test_pretraining_puts_the_loss_on_exactly_the_noise_mask(name):
    """For random batches of `objectives.corrupt`: the loss-weighted positions are the noise
    mask (random-token replacements included), the targets there the original tokens, the
    inputs elsewhere the original tokens, and the row is the inputs alone."""
    point = dict(name=name, noise_density=0.3, mean_noise_span_length=3.0,
                 random_token_fraction=0.5, inputs_length=24, targets_length=None)
    layout = objectives.layout_for([point], FAMILY, VOCAB, SENTINELS)
    assert layout.targets_length == 0  # no target positions of its own
    spec = objectives.spec_from_config(point)
    corrupt = jax.jit(functools.partial(objectives.corrupt_with_details, layout=layout))
    random_replacements = 0
    for seed in range(4):
        rng = np.random.default_rng(seed)
        raw = rng.integers(3, VOCAB - SENTINELS, (8, layout.raw_length)).astype(np.int32)
        raw[0, 10:] = PAD_ID  # a short document
        raw[1, 7] = EOS_ID  # a document end inside the chunk, as the pipeline puts them
        batch, details = jax.device_get(corrupt(raw, spec, jax.random.key(seed)))
        assert batch["encoder_input_tokens"].shape == (8, layout.inputs_length)
        noise = details["noise_mask"]
        assert noise.any() and not details["overflow"].any()
        for r in range(len(raw)):
            n = int(np.sum(raw[r] != PAD_ID))
            inputs, targets = batch["encoder_input_tokens"][r], batch["encoder_target_tokens"][r]
            weights = batch["encoder_loss_weights"][r]
            chosen = np.zeros(layout.inputs_length, bool)
            chosen[:layout.raw_length] = noise[r]
            np.testing.assert_array_equal(weights > 0, chosen)
            np.testing.assert_array_equal(targets[chosen], raw[r][:layout.raw_length][noise[r]])
            np.testing.assert_array_equal(targets[~chosen], 0)
            clean = ~chosen & (np.arange(layout.inputs_length) < n)
            np.testing.assert_array_equal(inputs[clean], np.pad(raw[r], (0, 1))[clean])
            assert inputs[n] == EOS_ID and not inputs[n + 1:].any()
            masked = inputs[chosen] == MASK
            if name == "mass_style":
                assert masked.all()
            random_replacements += int(np.sum(~masked))
            split = batch_format.inputs_and_targets(FAMILY, {k: v[r] for k, v in batch.items()})
            assert split[1] == [int(t) for t in raw[r][:layout.raw_length][noise[r]]]
            # The whole inputs, past a document's EOS inside them (preview and the held-out
            # fingerprint read this split; it stopped at the first EOS).
            assert split[0] == [int(t) for t in inputs[:n + 1]]
    if name == "bert_style":  # replaced by a random token, still in the loss
        assert random_replacements > 0


# --- models: what a position sees, and one attention function for all families --------------


def tiny_model(arch, seed=0, **fields):
    cfg = model_config()
    cfg.update(arch=arch, vocab_size=VOCAB, num_sentinels=SENTINELS, d_model=32, d_ff=64,
               num_heads=4, d_kv=8, num_layers=2, relpos_buckets=8, relpos_max_distance=16,
               dropout_rate=0.0, **fields)
    return build_model(cfg, nnx.Rngs(seed))


def test_every_encoder_only_output_sees_every_real_token_and_no_padding():
    model = tiny_model("encoder_only")
    assert not hasattr(model, "decoder") and hasattr(model, "encoder")
    base = jnp.array([[5, 9, 17, 23, 1, 0, 0]], jnp.int32)
    logits = model({"encoder_input_tokens": base})
    assert logits.shape == (1, 7, VOCAB)
    for j in range(5):
        changed = model({"encoder_input_tokens": base.at[0, j].set(30)})
        assert (jnp.abs(changed - logits)[0, :5].max(-1) > 1e-5).all(), j  # bidirectional
    shifted = model({"encoder_input_tokens": jnp.array([[0, 0, 5, 9, 17, 23, 1]], jnp.int32)})
    np.testing.assert_allclose(shifted[0, 2:], logits[0, :5], atol=1e-5)


def test_all_families_call_one_attention_function_and_differ_only_in_the_mask(monkeypatch):
    """Spy on the one `dot_product_attention` every layer calls: every family's attention goes
    through it, with the same arguments but the mask, whose pattern is bidirectional for
    encoder_only and encoders, causal for language_model, prefix + causal for prefix_lm."""
    calls = []
    original = layers.dot_product_attention

    def spy(q, k, v, mask, bias=None, **kwargs):
        calls.append({"mask": np.asarray(mask), "q": q.shape, "k": k.shape,
                      "bias": None if bias is None else bias.shape, **kwargs})
        return original(q, k, v, mask, bias, **kwargs)

    monkeypatch.setattr(layers, "dot_product_attention", spy)
    length, prefix = 6, 3
    tokens = jnp.array([[5, 9, 17, 23, 30, 1]], jnp.int32)
    causal = np.tril(np.ones((length, length), bool))
    prefix_block = np.zeros((length, length), bool)
    prefix_block[:prefix, :prefix] = True
    full = np.ones((length, length), bool)
    batches = {
        "encoder_only": {"encoder_input_tokens": tokens},
        "language_model": {"decoder_input_tokens": tokens, "decoder_target_tokens": tokens,
                           "inputs_mask": jnp.arange(length)[None] < prefix},
        "prefix_lm": {"decoder_input_tokens": tokens, "decoder_target_tokens": tokens,
                      "inputs_mask": jnp.arange(length)[None] < prefix},
        "encoder_decoder": {"encoder_input_tokens": tokens, "decoder_input_tokens": tokens,
                            "decoder_target_tokens": tokens},
    }
    # Per architecture, the mask of each attention call in order: self-attention per layer
    # (2 layers), and for the encoder-decoder the decoder's self- then cross-attention.
    expected = {
        "encoder_only": [full, full],
        "language_model": [causal, causal],
        "prefix_lm": [causal | prefix_block] * 2,
        "encoder_decoder": [full, full, causal, full, causal, full],
    }
    seen = {}
    for arch, batch in batches.items():
        calls.clear()
        tiny_model(arch)(batch)
        masks = [call.pop("mask") for call in calls]
        assert len(masks) == len(expected[arch]), arch
        for got, want in zip(masks, expected[arch]):
            np.testing.assert_array_equal(got[0, 0], want, err_msg=arch)
        seen[arch] = calls[0]
    # Everything but the mask is the same call: shapes, the relative position bias, kwargs.
    assert all(call == seen["encoder_only"] for call in seen.values()), seen
    # And it is the mask that makes the difference: one bidirectional stack's parameters run
    # with a causal mask give other outputs.
    model = tiny_model("encoder_only")
    batch = batches["encoder_only"]
    bidirectional = model(batch, make_masks(batch, "encoder_only"))
    causal_run = model(batch, {"encoder_mask": jnp.asarray(causal)[None, None]})
    assert not np.allclose(bidirectional, causal_run, atol=1e-4)


# --- decoding: one forward pass, the argmax at the slots ---------------------------------------


def test_decode_is_the_argmax_at_the_slots_cut_at_eos():
    model = tiny_model("encoder_only", seed=3, tie_embeddings=False, mlp="gated-gelu")
    inputs = np.array([[7, 12, 30, 9, 1], [21, 5, 1, 0, 0], [0, 0, 0, 0, 0]], np.int32)
    max_length = 6
    result = decoding.decode(model, inputs, max_length=max_length)
    # Transcription: the pad_examples task rows of these inputs, the model once, the argmax at
    # each slot (never the pad id), zeros after the first EOS.
    pairs = [([int(t) for t in row if t], [EOS_ID]) for row in inputs]
    [batch] = pad_examples(pairs, len(pairs), inputs.shape[1], max_length, family=FAMILY,
                           mask_token=MASK)
    logits = np.asarray(model({"encoder_input_tokens": jnp.asarray(batch["encoder_input_tokens"])}))
    log_probs = np.asarray(jax.nn.log_softmax(logits))
    for r, row in enumerate(inputs):
        start = int(np.sum(row > 0))
        slots = log_probs[r, start:start + max_length, 1:]
        want = list(1 + slots.argmax(-1))
        score = float(np.sum(slots.max(-1)[:want.index(EOS_ID) + 1 if EOS_ID in want else None]))
        if EOS_ID in want:
            want = want[:want.index(EOS_ID) + 1]
        want += [0] * (max_length - len(want))
        np.testing.assert_array_equal(np.asarray(result.tokens[r]), want)
        np.testing.assert_allclose(float(result.scores[r]), score, rtol=1e-5)
    with pytest.raises(ValueError, match="method='beam' is not allowed for arch='encoder_only'"):
        decoding.decode(model, inputs, max_length=max_length, method="beam")


# --- (b), (c), (d): pre-train, fine-tune, n/a --------------------------------------------------


def eo_config(data_dir, **train_fields):
    """A 2-layer, d_model 32 encoder_only model on the built-in corpus, bert_style, 32-token
    inputs, vocabulary 256 (cached under data_dir)."""
    config = tiny_train_config("encoder_only", mesh=(1, 1), log_every=1)
    config.train.update(**train_fields)
    config.model.update(vocab_size=256, num_sentinels=16)
    config.data.update(corpus="python_docs", data_dir=str(data_dir))
    config.train.update(learning_rate=3e-3, optimizer="adamw", schedule="constant",
                        warmup_steps=5)
    config.finetune.update(tasks=("builtin_module",), steps=30, batch_size=16,
                           inputs_length=48, targets_length=4, eval_every=30, eval_examples=32,
                           learning_rate=3e-3, optimizer="adamw")
    config.checkpoint.update(every=1000, keep=1)
    return config


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("cache")
    config = eo_config(data_dir, steps=40)
    assert config.objective.name == "bert_style"
    workdir = tmp_path_factory.mktemp("pretrain")
    train.train(config, workdir, progress=False)
    return config, workdir


def test_the_masked_lm_loss_falls_on_the_builtin_corpus(pretrained):
    _, workdir = pretrained
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    losses = np.array([r["loss"] for r in records])
    assert len(losses) == 40 and np.isfinite(losses).all()
    # The corruption is drawn afresh each step, so the loss is noisy: compare means.
    assert losses[-10:].mean() < losses[:5].mean() - 0.4, losses


def test_a_classification_finetune_runs_end_to_end_and_scores_from_the_slots(pretrained,
                                                                               tmp_path):
    config, workdir = pretrained
    result = finetune.finetune(config, tmp_path, init_from=str(workdir), progress=False)
    accuracy = result["scores"]["builtin_module"]["accuracy"]
    assert 0.0 <= accuracy <= 100.0 and result["steps"] == 30
    losses = [json.loads(line)["loss"] for line in (tmp_path / "metrics.jsonl").read_text()
              .splitlines()]
    assert np.mean(losses[-5:]) < np.mean(losses[:5]), losses
    # The scores are those of the slot predictions: the Evaluator's texts are decode()'s
    # argmax at the slots of the fine-tuned model, scored by the task itself.
    mesh = partitioning.make_mesh(config.mesh)
    vocab = pipeline.vocabulary_from_config(config)
    split = evaluation.TaskSplit(tasks.TASKS["builtin_module"], "validation", config, vocab,
                                 config.finetune.eval_examples)
    params = evaluation.params_of(config, str(tmp_path), mesh)
    model = nnx.merge(train_state.model_graphdef(config), params)
    inputs = np.stack([np.pad(x, (0, config.finetune.inputs_length - len(x)))
                       for x, _ in split.encoded])
    tokens = np.asarray(decoding.decode(model, inputs,
                                        max_length=config.finetune.targets_length).tokens)
    texts = [vocab.decode(row) for row in tokens]
    assert split.task.score(split.examples, texts) == evaluation.evaluate(
        config, str(tmp_path), ["builtin_module"])["builtin_module"]
    # (30 steps teach the slots too little to spell the 3-piece label words; what is checked
    # is that the score is the task's own metric of the slot predictions.)


def test_a_generation_task_is_refused_for_a_run_and_na_in_a_sweep(pretrained, tmp_path):
    config, workdir = pretrained
    generation = copy.deepcopy(config)
    generation.finetune.tasks = ("wmt_ende",)
    message = (r"^task 'wmt_ende' is not applicable to model.arch='encoder_only': its targets "
               r"are free text \(metric bleu\)")
    with pytest.raises(ConfigError, match=message):
        finetune.finetune(generation, tmp_path / "run", init_from=str(workdir))
    with pytest.raises(ConfigError, match=message):
        evaluation.evaluate(generation, str(workdir), ["wmt_ende"])
    assert not (tmp_path / "run").exists()
    assert evaluation.not_applicable("encoder_decoder", tasks.TASKS["wmt_ende"]) is None
    assert evaluation.not_applicable("encoder_only", tasks.TASKS["builtin_module"]) is None
    for name in ("squad", "cnn_dailymail"):
        assert evaluation.not_applicable("encoder_only", tasks.TASKS[name])

    # A sweep point fine-tuned on it records "not applicable" (not "failed") without running.
    generation.sweep = ml_collections.ConfigDict(dict(tasks=("wmt_ende",), seeds=(0,),
                                                      progress=False, zero_shot=False,
                                                      glue_as_one_task=True))
    point = grid.GridPoint(experiment="x", source="x.py", preset="tiny",
                           point="encoder_only/bert", row="EO", objective="BERT-style",
                           config=generation, seed=0, index=0, num_points=1, num_rows=1,
                           layout=objectives.layout_from_config(generation))
    (point.directory(tmp_path) / "pretrain").mkdir(parents=True)
    (point.directory(tmp_path) / "pretrain" / "metrics.jsonl").write_text(
        (workdir / "metrics.jsonl").read_text())
    [record] = sweep_point._finetune_tasks(point, str(tmp_path), time.perf_counter(), 1,
                                     loop.PreemptionWatch())
    assert (record["status"], record["metrics"], record["task"]) == (
        "not_applicable", {}, "wmt_ende")
    assert "not applicable" in record["error"]
    assert not (point.directory(tmp_path) / "finetune").exists()
    assert report_table._problem(record) is None
    cell = report_table._cell("BLEU", ("wmt_ende",), [record], None)
    assert cell.status == "n/a" and cell.mean is None
    assert report_render._cell_text(cell, str) == "n/a"


def test_decoding_settings_it_cannot_validate_with_are_one_line_before_any_work(pretrained,
                                                                               tmp_path):
    """Its validation fills the finetune.targets_length slots it trains on, greedily: beam or
    sampling stopped a run at its first validation, after training; another max_length scored
    slots it never trained on, silently."""
    config, workdir = pretrained
    for field, value, expected in (
            ("method", "beam", r"finetune.decode.method='beam' is not allowed for "
                               r"model.arch='encoder_only': it fills its mask slots in one "
                               r"forward pass; use 'greedy'"),
            ("max_length", 2, r"finetune.decode.max_length=2 is not allowed for "
                              r"model.arch='encoder_only': it predicts the "
                              r"finetune.targets_length=4 mask slots it trains on; leave it unset")):
        changed = copy.deepcopy(config)
        changed.finetune.decode[field] = value
        with pytest.raises(ConfigError, match=f"^{expected}$"):
            finetune.finetune(changed, tmp_path / "run", init_from=str(workdir))
        with pytest.raises(ConfigError, match=f"^{expected}$"):
            evaluation.evaluate(changed, str(workdir), ["builtin_module"])
        assert not (tmp_path / "run").exists()
    same = copy.deepcopy(config)
    same.finetune.decode.max_length = same.finetune.targets_length  # what it does anyway
    evaluation.check_finetune_settings(same, ["builtin_module"])
    beam = copy.deepcopy(config)
    beam.model.arch, beam.objective.name = "encoder_decoder", "span_corruption"
    beam.finetune.decode.method = "beam"  # an architecture with a decoder may search
    evaluation.check_finetune_settings(beam, ["builtin_module"])
    # A sweep stops at expansion, naming the point, not at each point's first validation.
    with pytest.raises(ConfigError, match=r"^families point 'encoder_only/natural': fine-tuning "
                                          r"on builtin_reverse: finetune.decode.method='beam' "
                                          r"is not allowed"):
        grid.expand("families", "demo", ["finetune.decode.method=beam"])
    # ...judging each fine-tuning run at the length it reads: under the paper preset's
    # finetune.task_lengths, GLUE's tasks' own 84 (it compared with the preset's 128).
    glue = "sweep.tasks=glue_cola,glue_rte"
    grid.expand("families", "paper", ["finetune.decode.max_length=84", glue])
    with pytest.raises(ConfigError, match=r"fine-tuning on glue_cola \+ glue_rte: "
                       r"finetune.decode.max_length=100 is not allowed for "
                       r"model.arch='encoder_only': it predicts the finetune.targets_length=84 "):
        grid.expand("families", "paper", ["finetune.decode.max_length=100", glue])
    # A run of tasks it cannot fine-tune (free text: recorded as not applicable) is not judged.
    grid.expand("families", "paper", ["finetune.decode.max_length=84",
                                      "sweep.tasks=glue_cola,squad"])


# --- (f) bad objective; preview ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["span_corruption", "prefix_lm", "lm", "deshuffling"])
def test_an_objective_encoder_only_cannot_train_on_is_one_line_before_any_work(name, tmp_path):
    config = eo_config(tmp_path / "cache")
    config.objective.name = name
    expected = (f"objective.name={name!r} is not allowed for model.arch='encoder_only'; "
                "choose one of 'bert_style', 'mass_style'")
    with pytest.raises(ConfigError) as error:
        train.train(config, tmp_path / "run", progress=False)
    assert str(error.value) == expected
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()
    with pytest.raises(ConfigError, match=f"^{expected}$"):
        preview.previewed_run(None, None, "tiny", overrides=[
            "model.arch=encoder_only", f"objective.name={name}"])


def test_preview_shows_encoder_only_rows(pretrained):
    config, _ = pretrained
    run = preview.previewed_run(None, None, "tiny", overrides=[
        "model.arch=encoder_only", "objective.name=bert_style", "model.vocab_size=256",
        "model.num_sentinels=16", f"data.data_dir={config.data.data_dir}"])
    assert run.layout.family == FAMILY and run.layout.targets_length == 0
    examples = preview.corrupted_examples(run, count=2)
    text = preview.format_text(run, examples)
    for example in examples:
        noise = np.array(example["noise_mask"], bool)
        assert sum(noise) == len(example["targets"]) > 0
        # The targets are the raw tokens at the noise mask; the inputs hold the mask token.
        assert example["targets"] == [t for t, m in zip(example["raw"], noise) if m]
        assert 255 in example["inputs"]  # <extra_id_0> of the 256-id vocabulary
        assert len(example["inputs"]) == len(example["raw"]) + 1
    assert "model.arch encoder_only" in text and "<extra_id_0>" in text
