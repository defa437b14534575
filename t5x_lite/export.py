"""t5x_lite -> Hugging Face transformers T5: config, weights, and an exported directory.

`to_hf_t5(config, model)` is the inverse of `convert.from_hf_t5`: it returns the `config.json`
contents of a `T5ForConditionalGeneration` and its weights, {HF name: float32 numpy array},
computing the same logits as `model`. `save_hf_t5(config, model, vocab, out)` writes them with
the vocabulary as a directory that `T5ForConditionalGeneration.from_pretrained(out)` and
`AutoTokenizer.from_pretrained(out)` load; `export_checkpoint(checkpoint, out)` (the `t5x-lite
export` command) does so for a t5x_lite checkpoint:

    config.json, generation_config.json   the model (below) and its decoding ids
    model.safetensors                     the weights
    spiece.model, tokenizer.json,         the run's vocabulary (`data.hf_tokenizer`), giving
    tokenizer_config.json                 the ids our pipeline gives

Layouts, convert's read backwards (`convert.hf_t5_weights`, `convert.HF_CONFIG_FIELDS`): our
kernels [in..., out...] become torch Linear [out, in]; scanned stacks (`model.scan_layers`)
are unstacked into HF's numbered blocks; the layers
`encoder_decoder_shared`'s decoder reuses are written into both stacks (HF T5 shares nothing);
each stack's depth is read from the model, so the encoder and decoder may differ
(`encoder_decoder_half` is a T5 of half depth). Logits: our tied head (scaled by d_model**-0.5)
is HF's `tie_word_embeddings=True` (no `lm_head.weight` written: transformers ties it), our
untied unscaled head is `tie_word_embeddings=False` with `lm_head.weight`; both also set
`scale_decoder_outputs`, the field transformers >= 5 reads for the scale.

T5Config fields t5x_lite has no field for: `pad_token_id` 0 and `eos_token_id` 1 (our reserved
ids), `decoder_start_token_id` 0 (our decoders start from the pad id), `num_decoder_layers`
(the decoder's depth), `is_encoder_decoder` True, `initializer_factor` 1.0 (initialisation
only; ours follows T5's), `dtype` float32 (our parameters are always float32; `model.dtype` is a
compute dtype). Ours without an HF field: `num_sentinels` (the tokenizer's sentinel pieces),
`dtype`, `attention_impl`, `remat`, `scan_layers` (how we compute, not what).
"""
from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import ml_collections
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from t5x_lite import architectures, evaluation, partitioning, saved_config, train_state
from t5x_lite.config import EOS_ID, PAD_ID, ConfigError, default_config
from t5x_lite.convert import HF_CONFIG_FIELDS, HF_CONFIG_FILE, WEIGHTS_FILE, hf_t5_weights
from t5x_lite.data import hf_tokenizer, pipeline
from t5x_lite.data.vocabulary import Vocabulary
from t5x_lite.settings import Model

GENERATION_CONFIG_FILE = "generation_config.json"


def _is_hf_t5(architecture: architectures.Architecture) -> bool:
    """Whether `architecture` is what T5ForConditionalGeneration computes: a bidirectional
    encoder and a causal-bucket decoder that cross-attends to it (shared layers are copied)."""
    encoder, decoder = architecture.stack("encoder"), architecture.stack("decoder")
    return (len(architecture.stacks) == 2 and encoder is not None and decoder is not None
            and encoder.bidirectional and not encoder.cross_attention
            and not decoder.bidirectional and decoder.cross_attention)


def require_exportable(arch: str) -> None:
    """Raise a one-line `ConfigError` unless `model.arch=arch` has a transformers T5 class."""
    if not _is_hf_t5(architectures.get(arch)):
        exportable = [name for name in architectures.names()
                      if _is_hf_t5(architectures.get(name))]
        raise ConfigError(
            f"model.arch={arch!r} cannot be exported: Hugging Face T5 "
            f"(T5ForConditionalGeneration) is an encoder-decoder; exportable architectures: "
            f"{', '.join(exportable)}")


def hf_t5_config(cfg: Model, depths: dict[str, int]) -> dict[str, Any]:
    """The HF `config.json` contents (`transformers.T5Config` keyword arguments) of a model of
    `cfg` whose stacks have `depths` {"encoder": layers, "decoder": layers}."""
    return {
        "architectures": ["T5ForConditionalGeneration"],
        "model_type": "t5",
        "vocab_size": cfg.num_embeddings,  # the rows; padding past the tokenizer's ids included
        **{hf: getattr(cfg, ours) for hf, ours in HF_CONFIG_FIELDS},
        "num_layers": depths["encoder"],
        "num_decoder_layers": depths["decoder"],
        # transformers < 5 reads both the tie and the scale from tie_word_embeddings.
        "tie_word_embeddings": cfg.tie_embeddings,
        "scale_decoder_outputs": cfg.tie_embeddings,
        "is_encoder_decoder": True,
        "pad_token_id": PAD_ID,
        "eos_token_id": EOS_ID,
        "decoder_start_token_id": PAD_ID,
        "initializer_factor": 1.0,
        "dtype": "float32",
    }


def to_hf_t5(config: ml_collections.ConfigDict,
             model: nnx.Module) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(HF `config.json` contents, {HF weight name: float32 array}) of `model`, a network of
    `config.model` (as `models.build_model`, `convert.from_hf_t5` or a checkpoint give it).

    `T5ForConditionalGeneration(T5Config(**hf_config))` holding these weights returns the
    logits `model` returns. A `ConfigError` naming `model.arch` refuses the architectures
    transformers has no T5 class for (decoder-only, encoder-only), before any array is read.
    """
    cfg = Model.from_config(config.model)
    require_exportable(cfg.arch)
    depths = {role: getattr(model, role).num_layers for role in ("encoder", "decoder")}
    hf_config = hf_t5_config(cfg, depths)
    weights: dict[str, np.ndarray] = {}
    stacked: dict[tuple[Any, ...], np.ndarray] = {}
    for hf_name, path, linear_inputs in hf_t5_weights(depths, cfg.mlp, tied=cfg.tie_embeddings):
        value = _parameter(model, path, stacked)
        weights[hf_name] = _torch_linear(value, linear_inputs) if linear_inputs else value
    return hf_config, {name: np.ascontiguousarray(w) for name, w in weights.items()}


def _value(module: Any, *names: str | int) -> np.ndarray:
    """The float32 value of the parameter at `names` under `module` (attribute names, and
    indices into a stack's unscanned layers), on the host."""
    for name in names:
        module = module[name] if isinstance(name, int) else getattr(module, name)
    return np.asarray(module[...], np.float32)


def _parameter(model: nnx.Module, path: tuple[Any, ...],
               stacked: dict[tuple[Any, ...], np.ndarray]) -> np.ndarray:
    """`_value(model, *path)` for a parameter path of an unscanned model (as
    `convert.hf_t5_weights` gives it), also when the stack holding it is scanned: then layer
    i's parameter is row i of the stacked one [layers, ...], read once into `stacked`."""
    role, *rest = path
    if rest[0] == "layers" and getattr(model, role).scanned:
        layer, *names = rest[1:]
        key = (role, "layers", *names)
        if key not in stacked:
            stacked[key] = _value(model, *key)
        return stacked[key][layer]
    return _value(model, *path)


def _torch_linear(kernel: np.ndarray, inputs: int) -> np.ndarray:
    """Our kernel [in..., out...] with `inputs` input axes as a torch Linear weight [out, in]."""
    return kernel.reshape(int(np.prod(kernel.shape[:inputs])), -1).T


# ---------------------------------------------------------------------------------------------
# A checkpoint as a Hugging Face directory


def export_checkpoint(checkpoint: str | Path, out: str | Path) -> Path:
    """Write the newest checkpoint of `checkpoint` (a train / finetune workdir or its
    `checkpoints/`) as the Hugging Face T5 directory `out` (`save_hf_t5`); returns `out`.

    The model and vocabulary are the run's, from its saved config (the vocabulary as the run
    found it: its `data.vocab` file, or the one trained on its corpus, cached under its
    `data.data_dir`). Before any work, a one-line `ConfigError` refuses an `out` that exists
    and is not empty, a `checkpoint` that holds no t5x_lite checkpoint, and an architecture
    transformers has no class for; a checkpoint folder without a saved step raises
    `FileNotFoundError` before anything is written.
    """
    _require_free(Path(out))
    directory = evaluation.checkpoint_dir(checkpoint)
    config = _saved_config(directory)
    require_exportable(config.model.arch)
    # FileNotFoundError if the folder holds a config but no saved step, before the
    # vocabulary (which may be trained from the corpus) is made.
    model = _restore(config, directory)
    return save_hf_t5(config, model, pipeline.vocabulary_from_config(config), out)


def save_hf_t5(config: ml_collections.ConfigDict, model: nnx.Module, vocab: Vocabulary,
               out: str | Path) -> Path:
    """Write `model` (a network of `config.model`) and `vocab` as the Hugging Face T5
    directory `out` (the files in the module docstring); returns `out`.

    `out` must not exist, or be empty (`ConfigError`). The files are written into a folder
    beside `out` that is renamed to `out` at the end, so a failed export leaves no partial
    `out` behind.
    """
    out = Path(out)
    _require_free(out)
    hf_config, weights = to_hf_t5(config, model)
    generation = {"decoder_start_token_id": PAD_ID, "eos_token_id": EOS_ID,
                  "pad_token_id": PAD_ID}
    files = {name: json.dumps(data, indent=2).encode() for name, data in (
        (HF_CONFIG_FILE, hf_config), (GENERATION_CONFIG_FILE, generation))}
    files.update(hf_tokenizer.tokenizer_files(vocab))
    parent = out.absolute().parent
    parent.mkdir(parents=True, exist_ok=True)
    staging = parent / f".{out.name}.export-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        for name, data in files.items():
            (staging / name).write_bytes(data)
        # transformers reads only safetensors files whose metadata names their framework.
        save_file(weights, staging / WEIGHTS_FILE, metadata={"format": "pt"})
        # safetensors writes its file readable by its owner alone, whatever the umask: give it
        # the mode the other files got, so an export into a shared folder is readable there.
        (staging / WEIGHTS_FILE).chmod((staging / HF_CONFIG_FILE).stat().st_mode & 0o777)
        staging.rename(out)  # also replaces an empty `out`
    except BaseException:  # nothing half-written stays behind; re-raised
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def _require_free(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"the export directory {out} exists and is not an empty folder; give "
                          "a new path (or an empty folder)")


def _saved_config(directory: Path) -> ml_collections.ConfigDict:
    """`default_config()` with the model and data sections of the config saved in the
    checkpoint folder `directory`."""
    config = evaluation.config_from_checkpoint(default_config(), directory, {})
    saved = saved_config.read_saved_config(directory)["data"]
    # Where the run found (or cached) its vocabulary and the data its corpus names.
    config.data.update(data_dir=saved["data_dir"], data_root=saved["data_root"])
    return config


def _restore(config: ml_collections.ConfigDict, directory: Path) -> nnx.Module:
    """The model of `config` holding the parameters of the newest checkpoint in `directory`."""
    params = evaluation.params_of(config, directory, partitioning.make_mesh(config.mesh))
    return nnx.merge(train_state.model_graphdef(config), params)
