"""Parity of `convert.from_hf_t5` with Hugging Face transformers T5 on small random models.

The HF models are built from a `T5Config` (nothing is downloaded), randomly initialised with a
fixed torch seed, with layer-norm scales moved away from 1 so that their conversion is tested.
"""
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from t5x_lite import accounting
from t5x_lite.config import ConfigError
from t5x_lite.convert import from_hf_t5
from t5x_lite.models import scan_layers
from t5x_lite.settings import Settings

V1_0 = dict(  # ReLU, tied and scaled logits, d_kv != d_model / num_heads
    vocab_size=128, d_model=64, d_ff=128, num_heads=4, d_kv=24, num_layers=2,
    feed_forward_proj="relu", relative_attention_num_buckets=32,
    relative_attention_max_distance=128,
)
V1_1 = dict(  # gated-GELU, untied unscaled logits, other buckets; max distance 20 < lengths
    V1_0, feed_forward_proj="gated-gelu", tie_word_embeddings=False,
    relative_attention_num_buckets=16, relative_attention_max_distance=20,
)
ENCODER_LENGTHS = (24, 17, 6)  # per row; the rest of the row is padding
DECODER_LENGTH = 15


def _hf_t5(separate_head: bool = False, **overrides) -> transformers.T5ForConditionalGeneration:
    """A random HF T5 in eval mode; `separate_head` gives lm_head its own random weights."""
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(**overrides)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "layer_norm" in name:
                param.uniform_(0.5, 1.5)
    if separate_head:
        model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.lm_head.weight))
    return model


@nnx.jit  # one XLA compile per model is much faster on CPU than op-by-op dispatch
def _logits(model: nnx.Module, batch: dict[str, np.ndarray]):
    return model(batch)


def _padded_batch(vocab_size: int) -> dict[str, np.ndarray]:
    """Encoder rows of different lengths padded with 0; decoder inputs start with 0."""
    rng = np.random.default_rng(0)
    batch_size, encoder_length = len(ENCODER_LENGTHS), max(ENCODER_LENGTHS)
    encoder = rng.integers(1, vocab_size, (batch_size, encoder_length), dtype=np.int32)
    encoder[np.arange(encoder_length) >= np.array(ENCODER_LENGTHS)[:, None]] = 0
    decoder = rng.integers(1, vocab_size, (batch_size, DECODER_LENGTH), dtype=np.int32)
    decoder[:, 0] = 0
    return dict(encoder_input_tokens=encoder, decoder_input_tokens=decoder)


def _hf_logits(hf_model: transformers.T5ForConditionalGeneration,
               batch: dict[str, np.ndarray]) -> np.ndarray:
    """transformers' logits of `batch` (padding masked out of the encoder)."""
    with torch.no_grad():
        return hf_model(
            input_ids=torch.from_numpy(batch["encoder_input_tokens"]).long(),
            attention_mask=torch.from_numpy(batch["encoder_input_tokens"] > 0),
            decoder_input_ids=torch.from_numpy(batch["decoder_input_tokens"]).long(),
        ).logits.numpy()


@pytest.mark.parametrize(
    "overrides, separate_head, tied",
    [
        (V1_0, False, True),
        (V1_1, True, False),
        # v1.0's scaled logits with a head of its own: stored untied, scale folded in.
        (V1_0, True, False),
    ],
    ids=["v1.0", "v1.1", "v1.0-separate-head"],
)
def test_logits_match_transformers_on_padded_batches(overrides, separate_head, tied):
    hf_model = _hf_t5(separate_head, **overrides)
    config, model = from_hf_t5(hf_model)
    assert config.model.tie_embeddings is tied
    batch = _padded_batch(config.model.vocab_size)
    expected = _hf_logits(hf_model, batch)
    logits = np.asarray(_logits(model, batch))
    assert logits.dtype == np.float32
    assert logits.shape == expected.shape == (len(ENCODER_LENGTHS), DECODER_LENGTH, 128)
    np.testing.assert_allclose(logits, expected, atol=1e-4, rtol=0)


def test_config_mirrors_the_hf_config():
    hf_model = _hf_t5(**dict(V1_1, vocab_size=40, dropout_rate=0.25, layer_norm_epsilon=1e-5))
    config, _ = from_hf_t5(hf_model)
    model = config.model
    assert model.arch == "encoder_decoder"
    assert (model.vocab_size, model.d_model, model.d_ff, model.num_heads, model.d_kv) == (
        40, 64, 128, 4, 24)
    assert (model.num_layers, model.mlp, model.tie_embeddings) == (2, "gated-gelu", False)
    assert (model.relpos_buckets, model.relpos_max_distance) == (16, 20)
    assert (model.dropout_rate, model.layer_norm_epsilon) == (0.25, 1e-5)
    # 40 ids cannot hold the default 100 sentinels: 3 reserved + 1 real token leave 36.
    assert model.num_sentinels == 36
    Settings.from_config(config)  # a whole config tree, and a valid one


def test_heads_times_d_kv_must_match_the_attention_weights():
    hf_model = _hf_t5(**V1_0)
    hf_model.config.d_kv = 8  # weights stay 4 heads * 24
    with pytest.raises(ConfigError, match=r"model\.num_heads \* model\.d_kv"):
        from_hf_t5(hf_model)


@pytest.mark.parametrize("proj", ["gated-silu", "gelu"])
def test_unsupported_feed_forward_proj_is_rejected(proj):
    with pytest.raises(ConfigError, match="feed_forward_proj=.*relu, gated-gelu"):
        from_hf_t5(_hf_t5(**dict(V1_0, feed_forward_proj=proj)))


@pytest.mark.parametrize("decoder_layers", [3, 1])
def test_a_decoder_deeper_or_shallower_than_the_encoder_keeps_the_logits(decoder_layers):
    """t5-efficient's uneven depths: `model.num_decoder_layers` builds, counts and converts
    the decoder's own depth."""
    hf_model = _hf_t5(**dict(V1_1, num_decoder_layers=decoder_layers))
    config, model = from_hf_t5(hf_model)
    assert (config.model.num_layers, config.model.num_decoder_layers) == (2, decoder_layers)
    assert (len(model.encoder.layers), len(model.decoder.layers)) == (2, decoder_layers)
    hf_params = sum(p.numel() for p in hf_model.parameters())  # the head counted once
    assert accounting.param_count(config.model) == hf_params + hf_model.lm_head.weight.numel()
    batch = _padded_batch(config.model.vocab_size)
    np.testing.assert_allclose(np.asarray(_logits(model, batch)), _hf_logits(hf_model, batch),
                               atol=1e-4, rtol=0)


def test_a_parameter_without_an_hf_weight_is_reported(monkeypatch):
    from t5x_lite import convert

    full_map = convert.hf_t5_weights
    monkeypatch.setattr(convert, "hf_t5_weights", lambda *args, **kwargs: (
        entry for entry in full_map(*args, **kwargs)
        if entry[1] != ("decoder", "final_norm", "scale")))
    with pytest.raises(ValueError, match="no HF weight converts to.*'decoder', 'final_norm'"):
        from_hf_t5(_hf_t5(**V1_0))


def test_a_converted_model_scanned_over_its_layers_keeps_the_transformers_logits():
    """The README's route to a scanned run from Hugging Face weights: `models.scan_layers` on
    the converted model stacks its layers (one program layer per stack) and changes nothing."""
    hf_model = _hf_t5(**V1_1)
    config, model = from_hf_t5(hf_model)
    scan_layers(model)
    query = model.encoder.layers.self_attention.query
    assert query.shape[0] == config.model.num_layers  # the stacked layers axis
    batch = _padded_batch(config.model.vocab_size)
    np.testing.assert_allclose(np.asarray(_logits(model, batch)), _hf_logits(hf_model, batch),
                               atol=1e-4, rtol=0)
