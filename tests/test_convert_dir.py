"""`convert.from_hf_t5_dir` and `--init_from_hf`: Hugging Face T5 checkpoint directories on
disk, read without transformers, against transformers' logits on padded batches.

The directories are written here from small random models (`test_convert._hf_t5`): the
config.json transformers writes, or the older form of the public v1.1 checkpoints
(`tie_word_embeddings: false`, an `lm_head.weight` of their own), with the weights in
model.safetensors or pytorch_model.bin, and a tiny SentencePiece model as spiece.model.
"""
import json

import jax
import numpy as np
import pytest
import safetensors.torch
import torch

from t5x_lite import cli, convert, decoding, partitioning, presets, saved_config, train_state
from t5x_lite.config import ConfigError, sentinel_id
from t5x_lite.data.vocabulary import load_vocabulary, train_vocabulary
from test_convert import V1_0, V1_1, _hf_logits, _hf_t5, _logits, _padded_batch

# 40 pieces + 10 sentinels = 50 ids under 64 embedding rows: 14 padding rows.
PIECES, SENTINELS, ROWS = 40, 10, 64
_TEXT = ["the quick brown fox jumps over the lazy dog", "a stitch in time saves nine",
         "reverse these words please", "numbers one two three four five six seven"] * 20


def _write(hf_model, directory, *, weights="model.safetensors", hub_v1_1=False,
           spiece=None, dtype=torch.float32):
    """`hf_model` as a checkpoint directory: transformers' config.json (or, `hub_v1_1`, the
    public v1.1 form with its own lm_head.weight), the state dict in `weights` as `dtype` and,
    given, `spiece` (a Vocabulary) as spiece.model with its sentinel count in
    tokenizer_config.json."""
    directory.mkdir()
    hf_model.config.save_pretrained(directory)
    state = {name: tensor.detach().to(dtype).clone()
             for name, tensor in hf_model.state_dict().items()}
    if hub_v1_1:
        fields = json.loads((directory / "config.json").read_text())
        fields.pop("scale_decoder_outputs", None)
        fields["tie_word_embeddings"] = False
        (directory / "config.json").write_text(json.dumps(fields))
    else:
        state.pop("lm_head.weight")  # what a tied save leaves out
    if weights == "model.safetensors":
        safetensors.torch.save_file(state, directory / weights)
    else:
        torch.save(state, directory / weights)
    if spiece is not None:
        (directory / "spiece.model").write_bytes(spiece.model_proto)
        (directory / "tokenizer_config.json").write_text(
            json.dumps({"extra_ids": spiece.num_extra_ids}))
    return directory


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    return train_vocabulary(_TEXT, PIECES + SENTINELS, SENTINELS,
                            str(tmp_path_factory.mktemp("spm")))


@pytest.mark.parametrize("overrides, separate_head, weights, hub_v1_1, dtype", [
    (V1_0, False, "model.safetensors", False, torch.float32),
    (V1_1, True, "pytorch_model.bin", True, torch.float32),  # untied, buckets 16 / distance 20
    (dict(V1_0, relative_attention_num_buckets=7, relative_attention_max_distance=9,
          num_decoder_layers=3), False, "model.safetensors", False, torch.bfloat16),
], ids=["v1.0-safetensors", "v1.1-untied-bin", "odd-buckets-uneven-depth-bfloat16"])
def test_a_checkpoint_directory_keeps_the_transformers_logits(overrides, separate_head, weights,
                                                              hub_v1_1, dtype, tmp_path):
    hf_model = _hf_t5(separate_head, **overrides)
    # Weights stored in bfloat16 are read as float32: compare with the rounded model.
    hf_model = hf_model.to(dtype).float()
    directory = _write(hf_model, tmp_path / "hf", weights=weights, hub_v1_1=hub_v1_1,
                       dtype=dtype)
    config, model = convert.from_hf_t5_dir(directory)
    assert config.model.tie_embeddings is not separate_head
    assert config.model.embedding_rows is None and config.data.vocab == ""
    batch = _padded_batch(config.model.vocab_size)
    np.testing.assert_allclose(np.asarray(_logits(model, batch)), _hf_logits(hf_model, batch),
                               atol=1e-4, rtol=0)


def test_a_relative_directory_s_vocabulary_is_saved_as_an_absolute_path(vocab, tmp_path,
                                                                         monkeypatch):
    """A run started with `--init_from_hf hf` saved data.vocab as 'hf/spiece.model', which
    `eval --checkpoint` and `export` from another folder could not find."""
    _write(_hf_t5(**dict(V1_1, vocab_size=ROWS)), tmp_path / "hf", spiece=vocab)
    monkeypatch.chdir(tmp_path)
    config, _ = convert.from_hf_t5_dir("hf")
    assert config.data.vocab == str((tmp_path / "hf" / "spiece.model").resolve())


def test_padded_embedding_rows_load_with_the_sentinels_where_t5_puts_them(vocab, tmp_path):
    """Public T5's layout in small: more rows than SentencePiece pieces + sentinels; the
    logits cover every row as transformers' do, and <extra_id_0> is pieces + sentinels - 1."""
    hf_model = _hf_t5(**dict(V1_1, vocab_size=ROWS))
    directory = _write(hf_model, tmp_path / "hf", spiece=vocab)
    config, model = convert.from_hf_t5_dir(directory)
    assert (config.model.vocab_size, config.model.embedding_rows) == (PIECES + SENTINELS, ROWS)
    assert config.model.num_sentinels == SENTINELS
    assert config.data.vocab == str(directory / "spiece.model")
    loaded = load_vocabulary(config.data.vocab, config.model.num_sentinels)
    assert loaded.sentinel_id(0) == sentinel_id(config.model.vocab_size, 0) == PIECES + 9
    assert loaded.decode([PIECES + 9]) == "<extra_id_0>"
    batch = _padded_batch(config.model.vocab_size)
    logits = np.asarray(_logits(model, batch))
    assert logits.shape[-1] == ROWS
    np.testing.assert_allclose(logits, _hf_logits(hf_model, batch), atol=1e-4, rtol=0)
    # Decoding never picks a padding row, even where one has the largest logit.
    head = model.lm_head.kernel
    head.set_value(head.get_value().at[:, -1].set(100.0))
    assert (np.asarray(_logits(model, batch)).argmax(-1) == ROWS - 1).any()
    decoded = decoding.decode(model, batch["encoder_input_tokens"], max_length=4)
    assert np.asarray(decoded.tokens).max() < config.model.vocab_size


def test_what_is_not_a_t5_checkpoint_is_one_line_naming_the_directory(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match=f"{empty} is not a Hugging Face checkpoint directory"):
        convert.from_hf_t5_dir(empty)
    bart = tmp_path / "bart"
    bart.mkdir()
    (bart / "config.json").write_text(json.dumps({"model_type": "bart"}))
    with pytest.raises(ConfigError, match="model_type='bart'; only 't5', 'mt5'"):
        convert.from_hf_t5_dir(bart)
    (bart / "config.json").write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(ConfigError, match=f"{bart} holds no weights: none of model.safetensors"):
        convert.from_hf_t5_dir(bart)
    (bart / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ConfigError, match="model.safetensors is not a readable safetensors file"):
        convert.from_hf_t5_dir(bart)


def test_weights_that_disagree_with_config_json_name_the_tensor_and_both_shapes(tmp_path):
    directory = _write(_hf_t5(**V1_0), tmp_path / "hf")
    fields = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**fields, "d_ff": 96}))
    with pytest.raises(ConfigError) as error:
        convert.from_hf_t5_dir(directory)
    assert str(error.value).startswith(
        "encoder.block.0.layer.1.DenseReluDense.wi.weight has shape (128, 64), but the config "
        "gives (96, 64) = (model.d_ff, model.d_model)")
    (directory / "config.json").write_text(json.dumps({**fields, "num_layers": 3}))
    with pytest.raises(ConfigError, match="has no tensor encoder.block.2.layer.0.layer_norm"):
        convert.from_hf_t5_dir(directory)


def test_a_tokenizer_larger_than_the_embedding_or_far_smaller_is_refused(vocab, tmp_path):
    for rows, name in ((PIECES + SENTINELS - 1, "small"), (PIECES + SENTINELS + 128, "large")):
        directory = _write(_hf_t5(**dict(V1_0, vocab_size=rows)), tmp_path / name, spiece=vocab)
        with pytest.raises(ConfigError, match=rf"= 50 ids, but config.json has vocab_size="
                                              rf"{rows} embedding rows; the rows may pad"):
            convert.from_hf_t5_dir(directory)


def test_eval_scores_a_checkpoint_directory_from_the_command_line(vocab, tmp_path, capsys):
    """`t5x-lite eval --init_from_hf DIR` (in this process, 8 CPU devices): the directory's
    model and vocabulary replace the preset's; a contradicting model override is one line."""
    directory = _write(_hf_t5(**dict(V1_1, vocab_size=ROWS)), tmp_path / "hf", spiece=vocab)
    args = ["t5x-lite", "eval", "--preset", "tiny", f"--init_from_hf={directory}",
            "--tasks=builtin_reverse", "--config.finetune.eval_examples=8",
            "--config.finetune.batch_size=8", "--config.finetune.inputs_length=16",
            "--config.finetune.targets_length=8"]
    cli.main(args)
    scores = json.loads(capsys.readouterr().out)
    assert list(scores) == ["builtin_reverse"] and scores["builtin_reverse"]
    with pytest.raises(SystemExit, match="invalid config: --config.model.d_model=32 "
                                         "contradicts"):
        cli.main([*args, "--config.model.d_model=32"])


def test_a_run_started_from_a_checkpoint_directory_fine_tunes_under_the_preset(vocab, tmp_path,
                                                                             capsys):
    """`train --init_from_hf DIR` then `finetune --init_from RUN` under the same preset: the
    preset's model is not RUN's (DIR's), which finetune refused, naming every differing field;
    it now reads RUN's model and vocabulary, as `eval --checkpoint` does, and keeps the
    preset's compute and dropout settings (RUN pre-trained in bfloat16, the preset fine-tunes
    in float32)."""
    directory = _write(_hf_t5(**dict(V1_1, vocab_size=ROWS)), tmp_path / "hf", spiece=vocab)
    run, tuned = tmp_path / "run", tmp_path / "tuned"
    cli.main(["t5x-lite", "train", "--preset", "tiny", f"--init_from_hf={directory}",
              f"--workdir={run}", "--config.train.steps=1", "--config.train.warmup_steps=1",
              "--config.train.batch_size=8", "--config.objective.inputs_length=32",
              "--config.model.dtype=bfloat16"])
    capsys.readouterr()
    cli.main(["t5x-lite", "finetune", "--preset", "tiny", f"--init_from={run}",
              f"--workdir={tuned}", "--tasks=builtin_reverse", "--config.finetune.steps=1",
              "--config.finetune.eval_examples=8", "--config.finetune.batch_size=8",
              "--config.finetune.inputs_length=16", "--config.finetune.targets_length=8"])
    assert json.loads(capsys.readouterr().out)["steps"] == 1
    source, saved = (json.loads((path / "checkpoints" / "config.json").read_text())
                     for path in (run, tuned))
    neutral = {field.removeprefix("model.") for field in saved_config.PARAMETER_NEUTRAL_FIELDS}
    assert {k: v for k, v in saved["model"].items() if k not in neutral} == {
        k: v for k, v in source["model"].items() if k not in neutral}
    assert saved["data"]["vocab"] == str(directory / "spiece.model")
    assert saved["model"]["d_model"] != presets.tiny().model.d_model
    assert (source["model"]["dtype"], saved["model"]["dtype"]) == ("bfloat16", "float32")


def test_init_from_hf_gives_the_run_its_model_and_parameters_in_the_run_layout(vocab, tmp_path):
    """What `train` / `finetune --init_from_hf` start from: the preset's compute settings
    (scanned layers, bfloat16, no dropout on the attention weights, which config.json does
    not describe), the directory's model and vocabulary, an overridden dropout rate, and
    parameters that become a step-0 train state of that config."""
    directory = _write(_hf_t5(**dict(V1_1, vocab_size=ROWS)), tmp_path / "hf", spiece=vocab)
    config = presets.tiny()
    config.model.update(scan_layers=True, dtype="bfloat16", dropout_rate=0.0,
                        attention_dropout=False)
    derived, params = convert.with_hf_t5(config, directory, {"model.dropout_rate": 0.0})
    model = derived.model
    assert (model.d_model, model.num_layers, model.embedding_rows) == (64, 2, ROWS)
    assert (model.scan_layers, model.dtype, model.dropout_rate, model.attention_dropout) == (
        True, "bfloat16", 0.0, False)
    assert derived.data.vocab == str(directory / "spiece.model")
    mesh = partitioning.make_mesh(derived.mesh)
    state = train_state.state_from_params(derived, mesh, params)
    expected = train_state.abstract_state(derived, mesh).params
    assert jax.tree.map(lambda a: a.shape, state.params) == jax.tree.map(lambda a: a.shape,
                                                                         expected)
    assert int(state.step) == 0
    np.testing.assert_array_equal(
        np.asarray(state.params["token_embedder"]["embedding"][...]),
        np.asarray(params["token_embedder"]["embedding"][...]))
    # An override restating what a None stands for in the directory's config (the decoder as
    # deep as the encoder) agrees with it; one that differs is named with the depth it has.
    config.model.num_decoder_layers = 2
    convert.with_hf_t5(config, directory, {"model.num_decoder_layers": 2})
    with pytest.raises(ConfigError, match=r"^--config.model.num_decoder_layers=3 contradicts "
                       r".*'s model.num_decoder_layers=2; "):
        convert.with_hf_t5(config, directory, {"model.num_decoder_layers": 3})


def test_a_directory_without_its_tokenizer_takes_the_one_data_vocab_names(vocab, tmp_path,
                                                                          monkeypatch):
    """A directory of config.json and weights alone (common for fine-tuned models) got
    vocab_size = its embedding rows, so the model's own spiece.model given as data.vocab was
    always refused (50 ids against 64), and no override could say otherwise."""
    directory = _write(_hf_t5(**dict(V1_1, vocab_size=ROWS)), tmp_path / "hf")
    (directory / "tokenizer_config.json").write_text(json.dumps({"extra_ids": SENTINELS}))
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "spiece.model").write_bytes(vocab.model_proto)
    monkeypatch.chdir(tmp_path)
    derived, _ = convert.with_hf_t5(presets.tiny(), directory,
                                    {"data.vocab": "elsewhere/spiece.model"})
    assert derived.data.vocab == str((tmp_path / "elsewhere" / "spiece.model").resolve())
    assert (derived.model.vocab_size, derived.model.embedding_rows) == (PIECES + SENTINELS, ROWS)
    assert derived.model.num_sentinels == SENTINELS
    with pytest.raises(ConfigError, match=r"^data.vocab='nowhere.model' does not exist \("):
        convert.with_hf_t5(presets.tiny(), directory, {"data.vocab": "nowhere.model"})
