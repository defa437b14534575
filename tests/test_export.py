"""Export to Hugging Face transformers T5 (`t5x_lite.export`, `t5x-lite export`).

Small random models of every exportable architecture (layer-norm scales moved away from 1 so
that their export is tested) are written with `save_hf_t5` and loaded back with
`from_pretrained`: no missing or unexpected weights, the same logits on a padded batch and the
same greedy generations as ours. `from_hf_t5` undoes `to_hf_t5` exactly. The tokenizer files
give our vocabulary's ids. The command exports a checkpoint saved by the trainer's
`Checkpointer`; bad input is refused before any work, leaving nothing behind.
"""
import json
import os
import shutil

import jax.numpy as jnp

import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from t5x_lite import checkpointing, cli, decoding, export, partitioning, train_state
from t5x_lite.config import EOS_ID, UNK_ID, ConfigError
from t5x_lite.convert import from_hf_t5, from_hf_t5_dir
from t5x_lite.data import hf_tokenizer, pipeline
from t5x_lite.data.vocabulary import sentinel_text, train_vocabulary
from t5x_lite.export import save_hf_t5, to_hf_t5
from t5x_lite.models import build_model, scan_layers
from tiny_configs import tiny_train_config

ENCODER_LENGTHS = (13, 9, 4)  # per row; the rest of the row is padding
DECODER_LENGTH, GENERATED = 7, 6
_RNG = np.random.default_rng(0)
_WORDS = ["".join(_RNG.choice(list("abcdefghijklmnop"), _RNG.integers(2, 7))) for _ in range(400)]
CORPUS = [" ".join(_RNG.choice(_WORDS, 12)) for _ in range(600)]
# Plain text, spaces at either end and in runs, sentinels with and without spaces around
# them, and characters outside the corpus (unknown, or bytes with byte fallback).
TEXTS = ["abc def", CORPUS[0], "  ab   cd  ", "ab <extra_id_0> cd", "ab<extra_id_3>cd",
         "<extra_id_1> ab", "x ☃ é½ 😀\nab\tcd", ""]


def _config(arch="encoder_decoder", **model):
    config = tiny_train_config(arch)
    config.model.update(vocab_size=160, num_sentinels=32, **model)
    return config


def _model(config, seed=0):
    """A random model of `config`, drawn in numpy (no program to compile): normal weights of
    the scale of T5's initialisation (d_model**-0.5, so float32 sums stay as accurate as in a
    real model), layer-norm scales from [0.5, 1.5), and the pad id's output row zero: a
    trained model never predicts the pad id (it is never a target), and greedy decoding should
    not meet it, as ours never emits it."""
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: build_model(config.model,
                                                                      nnx.Rngs(0))))
    rng = np.random.default_rng(seed)
    values = {}
    for path, var in nnx.to_flat_state(abstract):
        shape = var.get_value().shape
        values[path] = (rng.uniform(0.5, 1.5, shape) if path[-1] == "scale"
                        else rng.normal(0.0, config.model.d_model**-0.5, shape)).astype(np.float32)
    if config.model.tie_embeddings:
        values[("token_embedder", "embedding")][0] = 0
    else:
        values[("lm_head", "kernel")][:, 0] = 0
    state = nnx.from_flat_state({path: var.replace(jnp.asarray(values[path]))
                                 for path, var in nnx.to_flat_state(abstract)})
    return nnx.merge(graphdef, state)


def _params(model):
    return {path: np.asarray(var.get_value())
            for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))}


@pytest.fixture(scope="module")
def vocab():
    """The 160-id vocabulary of `_config` (128 pieces, 32 sentinels), trained once."""
    return train_vocabulary(CORPUS, 160, 32)


def _padded_inputs(vocab_size):
    encoder = _RNG.integers(3, vocab_size, (len(ENCODER_LENGTHS), max(ENCODER_LENGTHS)))
    encoder[np.arange(encoder.shape[1]) >= np.array(ENCODER_LENGTHS)[:, None]] = 0
    encoder[np.arange(len(encoder)), np.array(ENCODER_LENGTHS) - 1] = EOS_ID
    decoder = _RNG.integers(3, vocab_size, (len(encoder), DECODER_LENGTH))
    decoder[:, 0] = 0
    return encoder.astype(np.int32), decoder.astype(np.int32)


def _hf_logits(hf_model, encoder, decoder):
    with torch.no_grad():
        return hf_model(input_ids=torch.from_numpy(encoder).long(),
                        attention_mask=torch.from_numpy(encoder > 0),
                        decoder_input_ids=torch.from_numpy(decoder).long()).logits.numpy()


def _hf_greedy(hf_model, encoder):
    """transformers' greedy continuation of each row, without the start token, padded."""
    with torch.no_grad():
        out = hf_model.generate(input_ids=torch.from_numpy(encoder).long(),
                                attention_mask=torch.from_numpy(encoder > 0),
                                max_new_tokens=GENERATED, do_sample=False, num_beams=1)
    tokens = out.numpy()[:, 1:]
    return np.pad(tokens, ((0, 0), (0, GENERATED - tokens.shape[1])))


def _load(out):
    hf_model, info = transformers.T5ForConditionalGeneration.from_pretrained(
        out, output_loading_info=True)
    assert info["missing_keys"] == info["unexpected_keys"] == set(), info
    assert not info["mismatched_keys"] and not info["error_msgs"], info
    return hf_model.eval()


@nnx.jit  # one program per model structure, shared by the tests that build it
def _logits(model, batch):
    return model(batch)


def _assert_same_logits(model, hf_model, vocab_size):
    """Our float32 logits on a padded batch are transformers' (<= 1e-4); returns its inputs."""
    encoder, decoder = _padded_inputs(vocab_size)
    ours = np.asarray(_logits(model, dict(encoder_input_tokens=encoder,
                                          decoder_input_tokens=decoder)))
    np.testing.assert_allclose(ours, _hf_logits(hf_model, encoder, decoder), atol=1e-4, rtol=0)
    return encoder


# --- the model -------------------------------------------------------------------------------

# The command's test exports a checkpoint of the "shared" model: one logits program for both.
SHARED_V1_1 = dict(mlp="gated-gelu", tie_embeddings=False, scan_layers=True)
MODELS = {
    "v1.0": ("encoder_decoder", dict(mlp="relu", tie_embeddings=True)),
    # the decoder reuses the encoder's layers (copied into both stacks), scanned
    "shared-v1.1-scanned": ("encoder_decoder_shared", SHARED_V1_1),
    "half": ("encoder_decoder_half", dict(num_layers=4, tie_embeddings=False,
                                          relpos_max_distance=40)),
    "v1.1-scanned": ("encoder_decoder", dict(mlp="gated-gelu", tie_embeddings=False, d_kv=12,
                                             relpos_buckets=16, scan_layers=True)),
}


@pytest.fixture(scope="module")
def exported(vocab, tmp_path_factory):
    """name -> (config, model, the directory `save_hf_t5` wrote, transformers' model of it),
    made on first use."""
    made = {}

    def get(name):
        if name not in made:
            arch, fields = MODELS[name]
            config = _config(arch, **fields)
            model = _model(config)
            out = save_hf_t5(config, model, vocab, tmp_path_factory.mktemp(name) / "hf")
            made[name] = config, model, out, _load(out)
        return made[name]

    return get


@pytest.mark.parametrize("name", ["v1.0", "shared-v1.1-scanned", "half"])
def test_the_exported_directory_computes_our_logits_and_generations(name, exported):
    config, model, out, hf_model = exported(name)
    assert sorted(os.listdir(out)) == ["config.json", "generation_config.json",
                                       "model.safetensors", "spiece.model", "tokenizer.json",
                                       "tokenizer_config.json"]
    depth = config.model.num_layers // (2 if config.model.arch == "encoder_decoder_half" else 1)
    assert (hf_model.config.num_layers, hf_model.config.num_decoder_layers) == (depth, depth)
    # Tied: one embedding for both; untied: a head of its own.
    tied = hf_model.lm_head.weight.data_ptr() == hf_model.shared.weight.data_ptr()
    assert tied is config.model.tie_embeddings
    encoder = _assert_same_logits(model, hf_model, config.model.vocab_size)
    greedy = decoding.decode(model, encoder, max_length=GENERATED, arch=config.model.arch)
    np.testing.assert_array_equal(np.asarray(greedy.tokens), _hf_greedy(hf_model, encoder))


@pytest.mark.parametrize("name", ["v1.0", "v1.1-scanned"])
def test_from_hf_t5_undoes_to_hf_t5(name, exported):
    config, model, _, hf_model = exported(name)
    back_config, back = from_hf_t5(hf_model)
    if config.model.scan_layers:
        scan_layers(back)  # converted models come unscanned
    for field in ("vocab_size", "d_model", "d_ff", "num_heads", "d_kv", "num_layers", "mlp",
                  "tie_embeddings", "relpos_buckets", "relpos_max_distance",
                  "layer_norm_epsilon", "dropout_rate"):
        assert back_config.model[field] == config.model[field], field
    ours, theirs = _params(model), _params(back)
    assert ours.keys() == theirs.keys()
    for path in ours:
        np.testing.assert_array_equal(theirs[path], ours[path], err_msg=str(path))


def test_an_uneven_model_with_padded_rows_exports_and_loads_back_from_disk(vocab, tmp_path):
    """A decoder shallower than the encoder and embedding rows past the vocabulary (as public
    T5's 32128 rows for 32100 ids) export as such, and `from_hf_t5_dir` reads them back."""
    config = _config(num_layers=2, num_decoder_layers=1, embedding_rows=168)
    model = _model(config)
    out = save_hf_t5(config, model, vocab, tmp_path / "hf")
    hf_model = _load(out)
    assert (hf_model.config.num_layers, hf_model.config.num_decoder_layers,
            hf_model.config.vocab_size) == (2, 1, 168)
    _assert_same_logits(model, hf_model, config.model.vocab_size)
    back_config, back = from_hf_t5_dir(out)
    assert (back_config.model.vocab_size, back_config.model.embedding_rows,
            back_config.model.num_decoder_layers) == (160, 168, 1)
    ours, theirs = _params(model), _params(back)
    assert ours.keys() == theirs.keys()
    for path in ours:
        np.testing.assert_array_equal(theirs[path], ours[path], err_msg=str(path))


def test_the_shared_layers_are_written_into_both_stacks(exported):
    _, model, _, hf_model = exported("shared-v1.1-scanned")
    weights = hf_model.state_dict()
    query = np.asarray(model.encoder.layers.self_attention.query[...])  # [layers, D, H, K]
    for i in range(len(query)):
        expected = query[i].reshape(len(query[i]), -1).T  # torch Linear: [out, in]
        for stack in ("encoder", "decoder"):
            np.testing.assert_array_equal(
                weights[f"{stack}.block.{i}.layer.0.SelfAttention.q.weight"].numpy(), expected)


@pytest.mark.parametrize("arch", ["language_model", "prefix_lm", "encoder_only"])
def test_architectures_without_a_transformers_t5_class_are_refused(arch):
    config = _config(arch)
    model = nnx.eval_shape(lambda: build_model(config.model, nnx.Rngs(0)))
    with pytest.raises(ConfigError, match=rf"^model\.arch='{arch}' cannot be exported: .*"
                       "exportable architectures: encoder_decoder, encoder_decoder_shared, "
                       "encoder_decoder_half$"):
        to_hf_t5(config, model)


# --- the tokenizer ---------------------------------------------------------------------------


@pytest.mark.parametrize("size", [160, 1100], ids=["pieces", "byte-fallback"])
def test_the_tokenizer_files_give_our_ids(size, vocab, tmp_path):
    if size > 160:  # enough distinct words for 1000 pieces, 256 of them bytes
        words = ["".join(_RNG.choice(list("abcdefghijklmnopqrstuvwxyzéü"), _RNG.integers(2, 9)))
                 for _ in range(3000)]
        vocab = train_vocabulary([" ".join(_RNG.choice(words, 20)) for _ in range(3000)], size,
                                 100)
    for name, data in hf_tokenizer.tokenizer_files(vocab).items():
        (tmp_path / name).write_bytes(data)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert len(tokenizer) == vocab.vocab_size
    for text in TEXTS:
        ids = vocab.encode(text)
        assert tokenizer(text).input_ids == ids + [EOS_ID], text
        if UNK_ID not in ids:  # SentencePiece writes <unk> as " ⁇ ", transformers as "<unk>"
            assert tokenizer.decode(ids) == vocab.decode(ids), text
    for i in (0, vocab.num_extra_ids - 1):
        assert tokenizer.convert_tokens_to_ids(sentinel_text(i)) == vocab.sentinel_id(i)
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (0, 1, 2)


# --- the command -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run(vocab, tmp_path_factory):
    """(config, workdir) of a run of the scanned, shared v1.1 model with `vocab` as its
    `data.vocab` file: its initial state saved at step 1 by the trainer's `Checkpointer`."""
    root = tmp_path_factory.mktemp("run")
    (root / "spm.model").write_bytes(vocab.model_proto)
    config = _config("encoder_decoder_shared", **SHARED_V1_1)
    config.mesh.shape = (1, 1)
    config.data.vocab = str(root / "spm.model")
    state = train_state.init_state(config, partitioning.make_mesh(config.mesh))
    with checkpointing.Checkpointer(root / "workdir" / "checkpoints", every=1, keep=1,
                                    config=config) as checkpointer:
        checkpointer.maybe_save(1, state, force=True)
    return config, root / "workdir"


def _export(*args):
    """`t5x-lite export ARGS` in this process; its exit message, or None."""
    try:
        cli.main(["t5x-lite", "export", *map(str, args)])
    except SystemExit as exit_info:
        return str(exit_info.code)
    return None


def test_the_command_exports_a_trained_checkpoint(run, tmp_path):
    config, workdir = run
    out = tmp_path / "exported" / "hf"  # its parent is made too
    assert _export("--checkpoint", workdir, "--out", out) is None
    hf_model = _load(out)
    directory = workdir / "checkpoints"
    abstract = train_state.abstract_state(config, partitioning.make_mesh(config.mesh)).params
    model = nnx.merge(train_state.model_graphdef(config),
                      checkpointing.restore_params_only(directory, abstract))
    _assert_same_logits(model, hf_model, config.model.vocab_size)
    vocab = pipeline.vocabulary_from_config(config)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert tokenizer(CORPUS[1]).input_ids == vocab.encode(CORPUS[1]) + [EOS_ID]
    assert [p.name for p in out.parent.iterdir()] == ["hf"]  # no staging folder left
    # Every file has one mode (safetensors made its weights readable by their owner alone).
    assert len({p.stat().st_mode for p in out.iterdir()}) == 1

    # Exporting again into the now full directory is refused, and leaves it as it was.
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    message = _export("--checkpoint", workdir, "--out", out)
    assert message == (f"t5x-lite export: the export directory {out} exists and is not an "
                       "empty folder; give a new path (or an empty folder)")
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before


def test_a_checkpoint_of_an_architecture_a_file_registers_exports_with_that_file(
        run, tmp_path, monkeypatch):
    """A run of `my_t5`, registered by a config file of its own (here the shared
    encoder-decoder under another name): without the file this process cannot build its model
    and says which flag gives it; with `--config FILE` the export is the run's model."""
    from t5x_lite import architectures

    monkeypatch.setattr(architectures, "_REGISTRY", dict(architectures._REGISTRY))  # undone
    config, workdir = run
    mine = tmp_path / "my_run"
    shutil.copytree(workdir, mine)
    saved = json.loads((mine / "checkpoints" / "config.json").read_text())
    saved["model"]["arch"] = "my_t5"
    (mine / "checkpoints" / "config.json").write_text(json.dumps(saved))
    out = tmp_path / "hf"
    message = _export("--checkpoint", mine, "--out", out)
    assert message.startswith(f"t5x-lite export: {mine}/checkpoints/config.json holds "
                              "model.arch='my_t5', which is not registered in this process; "
                              "pass --config=FILE with the file that registers it")
    assert not out.exists()
    registering = tmp_path / "my_t5.py"
    registering.write_text(
        "import dataclasses\n"
        "from t5x_lite import architectures, presets\n"
        "architectures.register(dataclasses.replace(\n"
        "    architectures.get('encoder_decoder_shared'), name='my_t5'))\n"
        "def get_config():\n"
        "    return presets.tiny()\n")
    assert _export("--config", registering, "--checkpoint", mine, "--out", out) is None
    abstract = train_state.abstract_state(config, partitioning.make_mesh(config.mesh)).params
    model = nnx.merge(train_state.model_graphdef(config),
                      checkpointing.restore_params_only(workdir / "checkpoints", abstract))
    _assert_same_logits(model, _load(out), config.model.vocab_size)


def test_bad_checkpoints_are_refused_before_any_work(tmp_path):
    not_a_run = tmp_path / "not_a_run"
    not_a_run.mkdir()
    (not_a_run / "notes.txt").write_text("hello")
    for checkpoint in (tmp_path / "missing", not_a_run):
        message = _export("--checkpoint", checkpoint, "--out", tmp_path / "out")
        assert message == (f"t5x-lite export: {checkpoint} holds no t5x_lite checkpoints (no "
                           "config.json in it or in its checkpoints/ folder)")
    # A decoder-only run: its checkpoint folder as the trainer opens it (config.json).
    lm_run = tmp_path / "lm_run" / "checkpoints"
    with checkpointing.Checkpointer(lm_run, every=1, keep=1, config=_config("prefix_lm")):
        pass
    message = _export("--checkpoint", lm_run.parent, "--out", tmp_path / "out")
    assert message.startswith("t5x-lite export: model.arch='prefix_lm' cannot be exported: ")
    assert "\n" not in message
    # An exportable run that has saved no step yet.
    fresh = tmp_path / "fresh_run" / "checkpoints"
    with checkpointing.Checkpointer(fresh, every=1, keep=1, config=_config()):
        pass
    message = _export("--checkpoint", fresh.parent, "--out", tmp_path / "out")
    assert message == (f"t5x-lite export: {fresh} holds no saved step to restore (its run "
                       "stopped before its first checkpoint)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh_run", "lm_run", "not_a_run"]


def test_a_failed_write_leaves_nothing_behind(exported, vocab, monkeypatch, tmp_path):
    config, model, _, _ = exported("v1.0")

    def disk_full(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(export, "save_file", disk_full)  # the last file written
    with pytest.raises(OSError, match="No space left"):
        save_hf_t5(config, model, vocab, tmp_path / "hf")
    assert list(tmp_path.iterdir()) == []
