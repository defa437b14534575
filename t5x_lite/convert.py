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
"""
from __future__ import annotations

from typing import Any, Iterator

import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from t5x_lite.config import MLP_KINDS, NUM_RESERVED_IDS, ConfigError, default_config
from t5x_lite.models import build_model
from t5x_lite.settings import Model

# (HF projection name, our projection name) per sub-block kind.
ATTENTION_PROJECTIONS = (("q", "query"), ("k", "key"), ("v", "value"), ("o", "out"))
MLP_PROJECTIONS = {
    "relu": (("wi", "wi"), ("wo", "wo")),
    "gated-gelu": (("wi_0", "wi_0"), ("wi_1", "wi_1"), ("wo", "wo")),
}
# Our logical axis -> the config field that sets its size (for error messages).
_AXIS_FIELDS = {
    "vocab": "model.vocab_size",
    "embed": "model.d_model",
    "heads": "model.num_heads",
    "kv": "model.d_kv",
    "mlp": "model.d_ff",
    "relpos_buckets": "model.relpos_buckets",
}

Path = tuple[Any, ...]
# The architecture of Hugging Face's T5ForConditionalGeneration: L + L layers, nothing shared.
HF_T5_ARCH = "encoder_decoder"


def from_hf_t5(hf_model: Any) -> tuple[ml_collections.ConfigDict, nnx.Module]:
    """Convert a transformers `T5ForConditionalGeneration` to `(config, model)`.

    `config` is `default_config()` with the model section read from `hf_model.config`
    (arch 'encoder_decoder'); `model(batch)` on `encoder_input_tokens` / `decoder_input_tokens`
    returns the same float32 logits [batch, target_len, vocab] as the HF model in eval mode
    (call it without `dropout_rng`). `model.num_sentinels` keeps its default (100) unless the
    vocabulary is too small for it; then it is lowered to the most the vocabulary allows, so the
    config validates.

    Raises `ConfigError` naming the field if the HF model has no t5x_lite equivalent
    (unsupported `feed_forward_proj`, `num_decoder_layers` != `num_layers`) or a weight's shape
    disagrees with its config (e.g. `num_heads * d_kv` against the attention weights), before any
    of our arrays is built.
    """
    weights = {
        name: tensor.detach().cpu().float().numpy()
        for name, tensor in hf_model.state_dict().items()
    }
    # transformers >= 5 records v1.0's d_model**-0.5 logit scaling in `scale_decoder_outputs`
    # (and ties head and embedding even for v1.1 configs); older versions used
    # `tie_word_embeddings` for both. Tied means: scaled, and the same weights.
    hf_config = hf_model.config
    scale_logits = getattr(hf_config, "scale_decoder_outputs", hf_config.tie_word_embeddings)
    head = weights["lm_head.weight"]
    tied = bool(scale_logits) and np.array_equal(head, weights["shared.weight"])
    config = default_config()
    config.model = _model_config(hf_config, tie_embeddings=tied)

    # The model's structure without allocating it: parameter paths, shapes and logical axes.
    abstract_model = nnx.eval_shape(lambda: build_model(config.model, nnx.Rngs(0)))
    graphdef, abstract_state = nnx.split(abstract_model)
    targets = dict(nnx.to_flat_state(abstract_state))
    params = {
        path: _convert(weights[hf_name], hf_name, targets[path], linear_inputs)
        for hf_name, path, linear_inputs in _weight_map(config.model.num_layers, config.model.mlp)
    }
    if not tied:
        head = head * (config.model.d_model**-0.5 if scale_logits else 1.0)
        head_path = ("lm_head", "kernel")
        params[head_path] = _convert(head, "lm_head.weight", targets[head_path], 1)
    missing = targets.keys() - params.keys()
    if missing:  # the model grew a parameter this converter does not know
        raise ValueError(f"no HF weight converts to {sorted(map(str, missing))}")
    state = nnx.from_flat_state(
        {path: var.replace(jnp.asarray(params[path])) for path, var in targets.items()}
    )
    return config, nnx.merge(graphdef, state)


def _model_config(hf_config: Any, *, tie_embeddings: bool) -> ml_collections.ConfigDict:
    """Our validated model section for an HF `T5Config`."""
    # HF's feed_forward_proj names for our two MLPs are ours (config.MLP_KINDS).
    if hf_config.feed_forward_proj not in MLP_KINDS:
        raise ConfigError(
            f"feed_forward_proj={hf_config.feed_forward_proj!r} is not supported; "
            f"choose one of {', '.join(MLP_KINDS)}"
        )
    if hf_config.num_decoder_layers != hf_config.num_layers:
        raise ConfigError(
            f"num_decoder_layers={hf_config.num_decoder_layers} must equal num_layers="
            f"{hf_config.num_layers}: t5x_lite's encoder_decoder has as many decoder as "
            "encoder layers"
        )
    model = default_config().model
    model.update(
        arch=HF_T5_ARCH,
        vocab_size=hf_config.vocab_size,
        # Validation wants vocab_size >= num_sentinels + reserved ids + one real token.
        num_sentinels=min(
            model.num_sentinels, max(hf_config.vocab_size - NUM_RESERVED_IDS - 1, 0)
        ),
        d_model=hf_config.d_model,
        d_ff=hf_config.d_ff,
        num_heads=hf_config.num_heads,
        d_kv=hf_config.d_kv,
        num_layers=hf_config.num_layers,
        mlp=hf_config.feed_forward_proj,
        tie_embeddings=tie_embeddings,
        relpos_buckets=hf_config.relative_attention_num_buckets,
        relpos_max_distance=hf_config.relative_attention_max_distance,
        dropout_rate=float(hf_config.dropout_rate),
        layer_norm_epsilon=float(hf_config.layer_norm_epsilon),
    )
    Model.from_config(model)  # a ConfigError naming the field, before any array is built
    return model


def _weight_map(num_layers: int, mlp: str) -> Iterator[tuple[str, Path, int]]:
    """(HF tensor name, our parameter path, linear_inputs) for every weight but the LM head.

    linear_inputs is 0 for tensors stored alike on both sides (embeddings, norms, relpos tables);
    for a torch Linear weight it is how many leading axes of our kernel are its input axes.
    """
    yield "shared.weight", ("token_embedder", "embedding"), 0
    for stack in ("encoder", "decoder"):
        relpos = f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
        yield relpos, (stack, "relpos", "embedding"), 0
        yield f"{stack}.final_layer_norm.weight", (stack, "final_norm", "scale"), 0
        # HF numbers a block's sub-layers: self-attention, [cross-attention,] feed-forward.
        sublayers = [("SelfAttention", "self_attention", ATTENTION_PROJECTIONS)]
        if stack == "decoder":
            sublayers.append(("EncDecAttention", "cross_attention", ATTENTION_PROJECTIONS))
        sublayers.append(("DenseReluDense", "mlp", MLP_PROJECTIONS[mlp]))
        for i in range(num_layers):
            for j, (hf_block, ours, projections) in enumerate(sublayers):
                hf_prefix, path = f"{stack}.block.{i}.layer.{j}", (stack, "layers", i)
                yield f"{hf_prefix}.layer_norm.weight", (*path, f"{ours}_norm", "scale"), 0
                for hf_proj, our_proj in projections:
                    # Only the attention output projection has two input axes (heads, kv).
                    inputs = 2 if our_proj == "out" else 1
                    hf_name = f"{hf_prefix}.{hf_block}.{hf_proj}.weight"
                    yield hf_name, (*path, ours, our_proj), inputs


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
