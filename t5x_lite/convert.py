"""Hugging Face transformers T5 -> t5x_lite: config and weights.

`from_hf_t5(hf_model)` reads a `T5ForConditionalGeneration` (PyTorch) and returns our config tree
and an `encoder_decoder` model holding the same weights, so that both compute the same logits.
Layout differences it bridges:

- torch `Linear` weights are [out, in]; ours are [in..., out...] with heads split out:
  q/k/v [embed, heads, kv], o [heads, kv, embed], wi [embed, mlp], wo [mlp, embed].
- HF keeps one relative-position table per stack, in block 0's self-attention; so do we
  (`<stack>.relpos.embedding`, [buckets, heads]).
- Logits: T5 v1.0 ties the head to the embedding and scales the decoder output by
  d_model**-0.5; v1.1 has its own unscaled head. Any other combination is stored as an untied
  head with the scale folded into its kernel, so every HF model converts exactly.

Neither side scales attention scores by 1/sqrt(d_kv), so no weight needs rescaling for that.
transformers is not imported here: the model is read through its `config` and `state_dict()`.

`from_hf_t5_dir(path)` reads the same from a local checkpoint directory instead
(`config.json`; `model.safetensors` or `pytorch_model.bin`, or their sharded index; and
`spiece.model` when present), without transformers; `with_hf_t5(config, path, overrides)`
is what `--init_from_hf` runs: the user's config with the checkpoint's model and vocabulary,
and its parameters. With a SentencePiece model the vocabulary is its pieces plus
`extra_ids` sentinels (tokenizer_config.json, default `config.DEFAULT_NUM_SENTINELS`) and the
embedding may have up to `MAX_EMBEDDING_PADDING - 1` more rows (`model.embedding_rows`): public
T5 has 32128 rows for 32000 + 100 ids, and `<extra_id_0>` is id 32099, as in T5.

`hf_t5_weights` and `HF_CONFIG_FIELDS` describe Hugging Face's T5 layout for both directions:
`export.to_hf_t5` reads them backwards.
"""
from __future__ import annotations

import copy
import json
import pickle
from pathlib import Path as FilePath
from typing import Any, Iterator, Mapping

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from t5x_lite import architectures, run_folders
from t5x_lite.config import (DEFAULT_NUM_SENTINELS, MLP_KINDS, NUM_RESERVED_IDS, ConfigError,
                             default_config)
from t5x_lite.data.hf_tokenizer import SPIECE_FILE, TOKENIZER_CONFIG_FILE
from t5x_lite.data.vocabulary import load_vocabulary
from t5x_lite.models import build_model, scan_layers
from t5x_lite.saved_config import PARAMETER_NEUTRAL_FIELDS
from t5x_lite.settings import MODEL_FIELD_DEFAULTS, Model

# (HF projection name, our projection name) per sub-block kind.
_ATTENTION_PROJECTIONS = (("q", "query"), ("k", "key"), ("v", "value"), ("o", "out"))
_MLP_PROJECTIONS = {
    "relu": (("wi", "wi"), ("wo", "wo")),
    "gated-gelu": (("wi_0", "wi_0"), ("wi_1", "wi_1"), ("wo", "wo")),
}
# The weights outside the stacks: the embedding both HF stacks share, and the LM head.
_HF_EMBEDDING, _HF_LM_HEAD = "shared.weight", "lm_head.weight"
# The T5Config fields that are one of our model fields, as (HF name, our name). The others
# (the vocabulary's size, each stack's depth, the head's tie and scale) need code both ways.
HF_CONFIG_FIELDS = (
    ("d_model", "d_model"),
    ("d_ff", "d_ff"),
    ("num_heads", "num_heads"),
    ("d_kv", "d_kv"),
    ("feed_forward_proj", "mlp"),  # HF's names for our MLPs are ours (config.MLP_KINDS)
    ("relative_attention_num_buckets", "relpos_buckets"),
    ("relative_attention_max_distance", "relpos_max_distance"),
    ("dropout_rate", "dropout_rate"),
    ("layer_norm_epsilon", "layer_norm_epsilon"),
)
# Our logical axis -> the config field that sets its size (for error messages).
_AXIS_FIELDS = {
    "vocab": "model.embedding_rows",
    "embed": "model.d_model",
    "heads": "model.num_heads",
    "kv": "model.d_kv",
    "mlp": "model.d_ff",
    "relpos_buckets": "model.relpos_buckets",
}

Path = tuple[Any, ...]
# The architecture of Hugging Face's T5ForConditionalGeneration: two stacks, nothing shared.
HF_T5_ARCH = "encoder_decoder"
# config.json's model_type of the checkpoints that are T5ForConditionalGeneration's
# architecture (mT5 is T5 v1.1 with another vocabulary).
HF_MODEL_TYPES = ("t5", "mt5")
# transformers' T5Config defaults, for the fields an older config.json leaves out.
_T5_CONFIG_DEFAULTS = dict(
    vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_decoder_layers=None,
    num_heads=8, relative_attention_num_buckets=32, relative_attention_max_distance=128,
    dropout_rate=0.1, layer_norm_epsilon=1e-6, feed_forward_proj="relu",
    tie_word_embeddings=True,
)
HF_CONFIG_FILE = "config.json"
# The weight files a checkpoint directory may hold, in the order they are looked for (export
# writes the first); each may also be sharded, listed by `<name>.index.json`.
WEIGHTS_FILE = "model.safetensors"
WEIGHT_FILES = (WEIGHTS_FILE, "pytorch_model.bin")
# More embedding rows than vocabulary ids count as padding below this many (T5 rounds its
# embedding up to a multiple of 128); a larger gap means another tokenizer.
MAX_EMBEDDING_PADDING = 128


def from_hf_t5(hf_model: Any) -> tuple[ml_collections.ConfigDict, nnx.Module]:
    """Convert a transformers `T5ForConditionalGeneration` to `(config, model)`.

    `config` is `default_config()` with the model section read from `hf_model.config`
    (arch 'encoder_decoder'); `model(batch)` on `encoder_input_tokens` / `decoder_input_tokens`
    returns the same float32 logits [batch, target_len, vocab] as the HF model in eval mode
    (call it without `dropout_rng`). Without a tokenizer every embedding row is a vocabulary
    id; `model.num_sentinels` keeps its default unless the vocabulary is too small for
    it; then it is lowered to the most the vocabulary allows, so the config validates. A
    decoder deeper or shallower than the encoder sets `model.num_decoder_layers`.

    Raises `ConfigError` naming the field if the HF model has no t5x_lite equivalent
    (unsupported `feed_forward_proj`) or a weight's shape disagrees with its config (e.g.
    `num_heads * d_kv` against the attention weights), before any of our arrays is built.
    """
    weights = {
        name: tensor.detach().cpu().float().numpy()
        for name, tensor in hf_model.state_dict().items()
    }
    return _convert_t5(hf_model.config.to_dict(), weights, "the HF model", vocab_size=None)


def _convert_t5(hf_config: Mapping[str, Any], weights: Mapping[str, np.ndarray], source: str,
                vocab_size: int | None, num_sentinels: int | None = None,
                ) -> tuple[ml_collections.ConfigDict, nnx.Module]:
    """`(config, model)` of a T5Config's fields and the state dict's float32 arrays.

    vocab_size: the tokenizer's ids (None: one per embedding row), num_sentinels its
    sentinels (None: the default, lowered to what the vocabulary allows). `source` names
    the weights in the errors.
    """
    # transformers >= 5 records v1.0's d_model**-0.5 logit scaling in `scale_decoder_outputs`
    # (and ties head and embedding even for v1.1 configs); older versions used
    # `tie_word_embeddings` for both. Tied means: scaled, and the same weights (a checkpoint
    # saved tied may leave the head out).
    fields = {**_T5_CONFIG_DEFAULTS, **hf_config}
    scale_logits = fields.get("scale_decoder_outputs", fields["tie_word_embeddings"])
    embedding = _tensor(weights, _HF_EMBEDDING, source, "encoder.embed_tokens.weight")
    head = weights.get(_HF_LM_HEAD, embedding)
    tied = bool(scale_logits) and np.array_equal(head, embedding)
    config = default_config()
    config.model = _model_config(fields, tie_embeddings=tied, vocab_size=vocab_size,
                                 num_sentinels=num_sentinels)

    # The model's structure without allocating it: parameter paths, shapes and logical axes.
    abstract_model = nnx.eval_shape(lambda: build_model(config.model, nnx.Rngs(0)))
    graphdef, abstract_state = nnx.split(abstract_model)
    targets = dict(nnx.to_flat_state(abstract_state))
    depths = {stack.role: stack.num_layers(config.model)
              for stack in architectures.get(HF_T5_ARCH).stacks}
    # The embedding under either name; an untied head with the logit scale folded in.
    weights = {**weights, _HF_EMBEDDING: embedding}
    if not tied:
        weights[_HF_LM_HEAD] = head * (config.model.d_model**-0.5 if scale_logits else 1.0)
    params = {
        path: _convert(_tensor(weights, hf_name, source), hf_name, targets[path], linear_inputs)
        for hf_name, path, linear_inputs in hf_t5_weights(depths, config.model.mlp, tied=tied)
    }
    missing = targets.keys() - params.keys()
    if missing:  # the model grew a parameter this converter does not know
        raise ValueError(f"no HF weight converts to {sorted(map(str, missing))}")
    state = nnx.from_flat_state(
        {path: var.replace(jnp.asarray(params[path])) for path, var in targets.items()}
    )
    return config, nnx.merge(graphdef, state)


def _model_config(fields: Mapping[str, Any], *, tie_embeddings: bool, vocab_size: int | None,
                  num_sentinels: int | None) -> ml_collections.ConfigDict:
    """Our validated model section for the fields of an HF `T5Config` (defaults filled in)."""
    # HF's feed_forward_proj names for our two MLPs are ours (config.MLP_KINDS).
    if fields["feed_forward_proj"] not in MLP_KINDS:
        raise ConfigError(
            f"feed_forward_proj={fields['feed_forward_proj']!r} is not supported; "
            f"choose one of {', '.join(MLP_KINDS)}"
        )
    rows = fields["vocab_size"]
    ids = rows if vocab_size is None else vocab_size
    model = default_config().model
    if num_sentinels is None:
        # Validation wants vocab_size >= num_sentinels + reserved ids + one real token.
        num_sentinels = min(model.num_sentinels, max(ids - NUM_RESERVED_IDS - 1, 0))
    decoder_layers = fields["num_decoder_layers"]
    # float(): JSON may write a float field as an integer (dropout_rate: 0).
    model.update({ours: float(fields[hf]) if isinstance(model[ours], float) else fields[hf]
                  for hf, ours in HF_CONFIG_FIELDS})
    model.update(
        arch=HF_T5_ARCH,
        vocab_size=ids,
        num_sentinels=num_sentinels,
        num_layers=fields["num_layers"],
        # None when equal: the config then reads as one of ours with both stacks alike.
        num_decoder_layers=None if decoder_layers in (None, fields["num_layers"])
        else decoder_layers,
        tie_embeddings=tie_embeddings,
        embedding_rows=None if rows == ids else rows,
    )
    Model.from_config(model)  # a ConfigError naming the field, before any array is built
    return model


def hf_t5_weights(depths: Mapping[str, int], mlp: str, *,
                  tied: bool) -> Iterator[tuple[str, Path, int]]:
    """Hugging Face T5's weight layout: (HF tensor name, our parameter path, linear_inputs) for
    every weight of a T5ForConditionalGeneration with `depths[stack]` layers per stack, the
    `mlp` kind, and (unless `tied`) an LM head of its own.

    linear_inputs is 0 for tensors stored alike on both sides (embedding, norms, relpos
    tables); for a torch Linear weight it is how many leading axes of our kernel are its input
    axes.
    """
    yield _HF_EMBEDDING, ("token_embedder", "embedding"), 0
    for stack in ("encoder", "decoder"):
        relpos = f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
        yield relpos, (stack, "relpos", "embedding"), 0
        yield f"{stack}.final_layer_norm.weight", (stack, "final_norm", "scale"), 0
        # HF numbers a block's sub-layers: self-attention, [cross-attention,] feed-forward.
        sublayers = [("SelfAttention", "self_attention", _ATTENTION_PROJECTIONS)]
        if stack == "decoder":
            sublayers.append(("EncDecAttention", "cross_attention", _ATTENTION_PROJECTIONS))
        sublayers.append(("DenseReluDense", "mlp", _MLP_PROJECTIONS[mlp]))
        for i in range(depths[stack]):
            for j, (hf_block, ours, projections) in enumerate(sublayers):
                hf_prefix, path = f"{stack}.block.{i}.layer.{j}", (stack, "layers", i)
                yield f"{hf_prefix}.layer_norm.weight", (*path, f"{ours}_norm", "scale"), 0
                for hf_proj, our_proj in projections:
                    # Only the attention output projection has two input axes (heads, kv).
                    inputs = 2 if our_proj == "out" else 1
                    hf_name = f"{hf_prefix}.{hf_block}.{hf_proj}.weight"
                    yield hf_name, (*path, ours, our_proj), inputs
    if not tied:
        yield _HF_LM_HEAD, ("lm_head", "kernel"), 1


def _convert(
    weight: np.ndarray, hf_name: str, target: nnx.Variable, linear_inputs: int
) -> np.ndarray:
    """`weight` in the layout of `target` (an abstract parameter), after checking its shape."""
    shape, axes = target.get_value().shape, target.logical_axes
    if linear_inputs:
        # torch Linear: [out, in], with our output and input axes flattened.
        expected = (int(np.prod(shape[linear_inputs:])), int(np.prod(shape[:linear_inputs])))
        fields = (axes[linear_inputs:], axes[:linear_inputs])
    else:
        expected, fields = shape, tuple((axis,) for axis in axes)
    if weight.shape != expected:
        sizes = ", ".join(" * ".join(_AXIS_FIELDS[axis] for axis in group) for group in fields)
        raise ConfigError(
            f"{hf_name} has shape {weight.shape}, but the config gives {expected} = ({sizes}); "
            "the HF config disagrees with its weights"
        )
    return weight.T.reshape(shape) if linear_inputs else weight


def _tensor(weights: Mapping[str, np.ndarray], name: str, source: str,
            alias: str | None = None) -> np.ndarray:
    """`weights[name]` (or `weights[alias]`); a `ConfigError` naming both when it is missing."""
    for key in (name, alias):
        if key in weights:
            return weights[key]
    raise ConfigError(f"{source} has no tensor {name}, which its {HF_CONFIG_FILE} needs; the "
                      "config disagrees with its weights")


# ---------------------------------------------------------------------------------------------
# A Hugging Face checkpoint directory


def _read_json(path: FilePath) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ConfigError(f"{path} is not readable JSON ({error})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a JSON object")
    return data


def _read_hf_config(path: str | FilePath) -> dict[str, Any]:
    """The T5Config fields of the checkpoint directory `path` (its config.json); a
    `ConfigError` unless it is a T5 checkpoint with a weight file, before any weight is read."""
    directory = FilePath(path)
    file = directory / HF_CONFIG_FILE
    if not file.is_file():
        held = run_folders.held_kind(directory)
        reads = ("--init_from, --checkpoint and export read one of its runs' folders"
                 if held and held[0] == run_folders.SWEEP else
                 "--init_from, --checkpoint and export read those")
        run = f" ({directory} holds {run_folders.DESCRIBED[held[0]]}: {reads})" if held else ""
        raise ConfigError(f"{directory} is not a Hugging Face checkpoint directory: it has no "
                          f"{HF_CONFIG_FILE}{run}")
    fields = _read_json(file)
    if fields.get("model_type") not in HF_MODEL_TYPES:
        raise ConfigError(f"{file} has model_type={fields.get('model_type')!r}; "
                          f"only {', '.join(map(repr, HF_MODEL_TYPES))} checkpoints "
                          "(T5ForConditionalGeneration's architecture) convert")
    _weight_files(directory)
    return fields


def _weight_files(directory: FilePath) -> list[FilePath]:
    """The files holding the checkpoint's weights: the first of `WEIGHT_FILES` present, or
    the shards its index lists."""
    for name in WEIGHT_FILES:
        if (directory / name).is_file():
            return [directory / name]
        index = directory / f"{name}.index.json"
        if index.is_file():
            shards = _read_json(index).get("weight_map", {}).values()
            return [directory / shard for shard in sorted(set(shards))]
    raise ConfigError(f"{directory} holds no weights: none of {', '.join(WEIGHT_FILES)} (or "
                      "their .index.json) is there")


def _load_weights(files: list[FilePath]) -> dict[str, np.ndarray]:
    """Every tensor of `files` as float32 numpy, by name; safetensors without torch."""
    weights: dict[str, np.ndarray] = {}
    for file in files:
        if not file.is_file():
            raise ConfigError(f"{file} is missing (its index lists it)")
        if file.name.endswith(".safetensors"):
            from safetensors import SafetensorError, safe_open

            # The flax reader knows bfloat16, which numpy has no dtype for; on the host CPU.
            try:
                with jax.default_device(jax.devices("cpu")[0]), safe_open(file, "flax") as f:
                    weights.update({name: np.asarray(f.get_tensor(name), np.float32)
                                    for name in f.keys()})
            except SafetensorError as error:
                raise ConfigError(f"{file} is not a readable safetensors file: {error}") from None
            continue
        try:
            import torch
        except ImportError:
            raise ConfigError(f"reading {file} needs torch (pip install torch), or save the "
                              f"checkpoint as {WEIGHTS_FILE}") from None
        try:  # weights_only: tensors, never code, from the pickle
            state = torch.load(file, map_location="cpu", weights_only=True)
        except (RuntimeError, EOFError, pickle.UnpicklingError) as error:
            raise ConfigError(f"{file} is not a readable torch state dict: "
                              f"{str(error).splitlines()[0]}") from None
        weights.update({name: tensor.float().numpy() for name, tensor in state.items()})
    return weights


def from_hf_t5_dir(path: str | FilePath, vocab: str | None = None
                   ) -> tuple[ml_collections.ConfigDict, nnx.Module]:
    """`from_hf_t5` of a local checkpoint directory, read without transformers: its
    config.json, its weights (`WEIGHT_FILES`, float16 / bfloat16 read as float32) and, when
    there, its SentencePiece model (`SPIECE_FILE`); else `vocab`'s, when given (a directory
    shipped without `spiece.model`, its model's tokenizer kept elsewhere).

    With a SentencePiece model, `config.data.vocab` is that file, `model.vocab_size` its
    pieces plus `extra_ids` sentinels (`TOKENIZER_CONFIG_FILE`, default `DEFAULT_NUM_SENTINELS`;
    `num_sentinels`), and the embedding's extra rows, fewer than `MAX_EMBEDDING_PADDING`,
    `model.embedding_rows`.
    Without one, every row is an id (as `from_hf_t5`). Raises a one-line `ConfigError` for a
    directory that is not a T5 checkpoint, a tokenizer whose size disagrees with the embedding
    beyond padding (before reading weights) and a tensor whose shape disagrees with config.json
    (naming it and both shapes).
    """
    directory = FilePath(path)
    fields = {**_T5_CONFIG_DEFAULTS, **_read_hf_config(directory)}
    vocab_size = num_sentinels = None
    spiece = directory / SPIECE_FILE
    if not spiece.is_file() and vocab:
        spiece = FilePath(vocab)
        if not spiece.is_file():
            raise ConfigError(f"data.vocab={vocab!r} does not exist ({directory} has no "
                              f"{SPIECE_FILE}, so its tokenizer is read from there)")
    if spiece.is_file():
        tokenizer = directory / TOKENIZER_CONFIG_FILE
        tokenizer_config = _read_json(tokenizer) if tokenizer.is_file() else {}
        num_sentinels = tokenizer_config.get("extra_ids", DEFAULT_NUM_SENTINELS)
        try:
            vocab_size = load_vocabulary(str(spiece), num_sentinels).vocab_size
        except (ValueError, RuntimeError) as error:  # not SentencePiece, or T5's ids differ
            raise ConfigError(f"{spiece} is not a usable SentencePiece model: {error}") from None
        padding = fields["vocab_size"] - vocab_size
        if not 0 <= padding < MAX_EMBEDDING_PADDING:
            raise ConfigError(
                f"{spiece} has {vocab_size - num_sentinels} pieces + {num_sentinels} sentinels = "
                f"{vocab_size} ids, but {HF_CONFIG_FILE} has vocab_size={fields['vocab_size']} "
                f"embedding rows; the rows may pad the ids by 0 to {MAX_EMBEDDING_PADDING - 1}, "
                "so this tokenizer belongs to another model")
    weights = _load_weights(_weight_files(directory))
    config, model = _convert_t5(fields, weights, f"{directory}", vocab_size, num_sentinels)
    if vocab_size is not None:  # absolute: a run's saved config is read from anywhere
        config.data.vocab = str(spiece.resolve())  # (`eval --checkpoint`, `export`)
    return config, model


# Model fields a checkpoint directory does not describe (how to compute or train, not what):
# they stay the user's config's. Not saved_config.PARAMETER_NEUTRAL_FIELDS (what a checkpoint
# restores under any value of), though dtype, attention_impl, attention_dropout and remat are
# both: config.json sets dropout_rate, which is neutral (so the user's override of it wins), and
# no HF checkpoint has scan_layers, which is not (it stacks the parameters).
_COMPUTE_FIELDS = ("model.dtype", "model.attention_impl", "model.attention_dropout",
                   "model.remat", "model.scan_layers")


def with_hf_t5(config: ml_collections.ConfigDict, path: str | FilePath,
               overrides: Mapping[str, Any]) -> tuple[ml_collections.ConfigDict, nnx.State]:
    """`--init_from_hf`: a copy of `config` with the model and vocabulary of the checkpoint
    directory `path` (`from_hf_t5_dir`; a directory without a SentencePiece model reads the
    user's `data.vocab` as its own), and its parameters in that config's layout (stacked
    when `model.scan_layers`).

    The compute settings (`model.dtype`, `attention_impl`, `attention_dropout`, `remat`,
    `scan_layers`) stay `config`'s. `overrides` are the user's ({dotted field: value}, already
    applied to `config`): one of `model.dropout_rate` wins over config.json's; one of another
    model field, or of data.vocab when the checkpoint has a tokenizer, that differs from the
    checkpoint's is a one-line `ConfigError`.
    """
    hf_config, model = from_hf_t5_dir(path, overrides.get("data.vocab"))
    derived = copy.deepcopy(config)
    taken = {f"model.{name}": value for name, value in hf_config.model.items()
             if f"model.{name}" not in _COMPUTE_FIELDS}
    if hf_config.data.vocab:
        taken["data.vocab"] = hf_config.data.vocab
    def resolved(field: str, value: Any) -> Any:
        """A model field's value, its None read as the value it stands for (the taken one);
        a vocabulary's path as an absolute one."""
        if field == "data.vocab":
            return str(FilePath(value).resolve())
        standing_for = MODEL_FIELD_DEFAULTS.get(field.removeprefix("model."))
        return taken[f"model.{standing_for}"] if value is None and standing_for else value

    for field, value in taken.items():
        section, name = field.split(".")
        if field in overrides and field in PARAMETER_NEUTRAL_FIELDS:
            continue  # dropout_rate: the others are compute fields, never taken
        if field in overrides and resolved(field, overrides[field]) != resolved(field, value):
            raise ConfigError(f"--config.{field}={overrides[field]!r} contradicts {path}'s "
                              f"{field}={resolved(field, value)!r}; --init_from_hf takes the "
                              "model and vocabulary from the checkpoint, so drop the override")
        derived[section][name] = value
    if derived.model.scan_layers:
        scan_layers(model)
    return derived, nnx.state(model, nnx.Param)
