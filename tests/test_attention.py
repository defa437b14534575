"""attention.py: the attention function against a naive reference, the mask builders on
hand-worked examples, and T5's relative position buckets against hand-derived values."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from t5x_lite.attention import (
    cache_mask,
    causal_mask,
    combine_masks,
    cross_attention_mask,
    dot_product_attention,
    padding_mask,
    prefix_lm_mask,
    relative_position_bucket,
    resolve_implementation,
    segment_mask,
)
from t5x_lite.errors import ConfigError
from t5x_lite.layers import Attention, KeysValues

# The two paths that run on CPU: jax.nn.dot_product_attention's XLA kernel and our einsum path.
CPU_IMPLEMENTATIONS = pytest.mark.parametrize("impl", ["xla", "einsum"])

B, LQ, LK, H, D = 2, 3, 4, 2, 5


def _qkv(seed=0):
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    return (jax.random.normal(kq, (B, LQ, H, D)), jax.random.normal(kk, (B, LK, H, D)),
            jax.random.normal(kv, (B, LK, H, D)))


def _reference(q, k, v, mask, bias=None):
    """Textbook attention without scaling: softmax(q.k + bias, masked) . v"""
    logits = np.einsum("bqhd,bkhd->bhqk", q, k)
    if bias is not None:
        logits = logits + bias
    logits = np.where(mask, logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights = weights / weights.sum(-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", weights, v)


KEY_PADDING = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], bool)[:, None, None, :]  # [B, 1, 1, LK]


@CPU_IMPLEMENTATIONS
@pytest.mark.parametrize("with_bias", [False, True])
def test_attention_matches_reference_with_key_padding(with_bias, impl):
    q, k, v = _qkv()
    bias = jax.random.normal(jax.random.key(1), (1, H, LQ, LK)) if with_bias else None
    out = dot_product_attention(q, k, v, jnp.asarray(KEY_PADDING), bias, implementation=impl)
    assert out.shape == (B, LQ, H, D)
    np.testing.assert_allclose(out, _reference(q, k, v, KEY_PADDING, bias), atol=1e-5)


@CPU_IMPLEMENTATIONS
def test_bfloat16_attention_sums_logits_and_bias_in_float32(impl):
    """With bf16 operands both paths form the logits q.k and add the bias in float32 before
    their float32 softmax, as the XLA kernel does: the output is within bf16 rounding of the
    float32 attention of the same (bf16) operands. Rounding the logits (std ~8 at head size
    64) to bf16 first put ~5 % of the largest output into the einsum path's error."""
    kq, kk, kv, kb = jax.random.split(jax.random.key(2), 4)
    shape = (2, 16, 2, 64)
    q, k, v = (jax.random.normal(key, shape).astype(jnp.bfloat16) for key in (kq, kk, kv))
    bias = jax.random.normal(kb, (1, 2, 16, 16)).astype(jnp.bfloat16)
    mask = jnp.asarray(np.arange(16)[None, None, None, :] < np.array([16, 10])[:, None, None, None])
    out = dot_product_attention(q, k, v, mask, bias, implementation=impl)
    assert out.dtype == jnp.bfloat16
    reference = _reference(*(np.asarray(x, np.float32) for x in (q, k, v)), np.asarray(mask),
                           np.asarray(bias, np.float32))
    error = np.abs(np.asarray(out, np.float32) - reference).max() / np.abs(reference).max()
    assert error < 0.01, error


def test_einsum_gradient_of_a_batch_shared_bias_matches_the_xla_kernel():
    """The einsum path broadcasts a `[1, H, Lq, Lk]` bias over the batch its own way; its
    gradient must still be the batch sum that jax.nn.dot_product_attention's gives."""
    q, k, v = _qkv()
    bias = jax.random.normal(jax.random.key(1), (1, H, LQ, LK))
    mask = jnp.asarray(KEY_PADDING)

    def grads(impl):
        def loss(q, k, v, bias):
            out = dot_product_attention(q, k, v, mask, bias, implementation=impl)
            return jnp.sum(jnp.sin(out))
        return jax.grad(loss, argnums=(0, 1, 2, 3))(q, k, v, bias)

    for einsum, xla in zip(grads("einsum"), grads("xla")):
        np.testing.assert_allclose(einsum, xla, rtol=1e-5, atol=1e-6)
    assert np.abs(np.asarray(grads("einsum")[3])).max() > 1e-3


@CPU_IMPLEMENTATIONS
def test_attention_without_mask_and_with_2d_mask(impl):
    q, k, v = _qkv()
    everything = np.ones((B, 1, LQ, LK), bool)
    np.testing.assert_allclose(dot_product_attention(q, k, v, None, implementation=impl),
                               _reference(q, k, v, everything), atol=1e-5)
    two_d = np.tril(np.ones((LQ, LK), bool))  # broadcast over batch and heads
    np.testing.assert_allclose(dot_product_attention(q, k, v, jnp.asarray(two_d), implementation=impl),
                               _reference(q, k, v, two_d), atol=1e-5)


@CPU_IMPLEMENTATIONS
def test_padded_values_do_not_leak(impl):
    q, k, v = _qkv()
    v_changed = v.at[:, 3].set(100.0)  # position 3 is padding in both examples
    mask = jnp.asarray(KEY_PADDING)
    np.testing.assert_allclose(dot_product_attention(q, k, v, mask, implementation=impl),
                               dot_product_attention(q, k, v_changed, mask, implementation=impl),
                               atol=1e-6)


@CPU_IMPLEMENTATIONS
def test_fully_masked_query_rows_are_zero_not_nan(impl):
    q, k, v = _qkv()
    mask = np.ones((B, 1, LQ, LK), bool)
    mask[0, :, 1, :] = False  # query 1 of example 0 may see nothing
    out = dot_product_attention(q, k, v, jnp.asarray(mask), implementation=impl)
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out[0, 1], 0.0)
    np.testing.assert_allclose(out[1:], _reference(q[1:], k[1:], v[1:], mask[1:]), atol=1e-5)


def test_auto_picks_the_einsum_path_off_gpu_and_passes_explicit_choices_through():
    on_gpu = jax.default_backend() == "gpu"
    assert resolve_implementation("auto") == (None if on_gpu else "einsum")
    assert resolve_implementation("xla") == "xla"
    assert resolve_implementation("einsum") == "einsum"
    if on_gpu:
        assert resolve_implementation("cudnn") == "cudnn"
    else:  # cuDNN's kernel exists only on a GPU: a one-line ConfigError, not JAX's traceback
        with pytest.raises(ConfigError, match="model.attention_impl='cudnn' needs an NVIDIA GPU"):
            resolve_implementation("cudnn")


def test_unknown_implementation_is_rejected():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="implementation='flash'.*'xla', 'cudnn', 'einsum'"):
        dot_product_attention(q, k, v, None, implementation="flash")


# ------------------------------------------------------------------ dropout on the weights

def _bare_attention(heads, d_kv, rate, implementation="einsum"):
    """`layers.Attention` whose query and output projections are the identity (d_model =
    heads * d_kv), so `attend(q as [B, Lq, H*K], KeysValues(k, v))` is the attention of q, k, v
    with the layer's dropout on the weights."""
    module = Attention(heads * d_kv, heads, d_kv, dtype=jnp.float32, implementation=implementation,
                       weights_dropout_rate=rate, rngs=nnx.Rngs(0))
    eye = jnp.eye(heads * d_kv)
    module.query.value = eye.reshape(heads * d_kv, heads, d_kv)
    module.out.value = eye.reshape(heads, d_kv, heads * d_kv)
    return module


def _attend(module, q, k, v, mask, bias=None, rng=None):
    b, lq, h, d = q.shape
    out = module.attend(q.reshape(b, lq, h * d), KeysValues(k, v), mask, bias, dropout_rng=rng)
    return out.reshape(b, lq, h, d)


def _kept_keys(module, rate, rng, batch, heads, keys, queries):
    """Which keys the layer's dropout keeps, read off its output alone: with q = 0 every key
    weighs 1/keys, and a value that is key j's one-hot vector puts key j's dropped weight in
    output column j. `bool [batch, heads, queries, keys]`."""
    q = jnp.zeros((batch, queries, heads, keys))
    one_hot = jnp.broadcast_to(jnp.eye(keys)[None, :, None, :], (batch, keys, heads, keys))
    out = np.asarray(_attend(module, q, one_hot, one_hot, None, rng=rng))  # [B, Lq, H, Lk]
    scaled = out * keys * (1 - rate)  # 1 where kept, 0 where dropped
    np.testing.assert_allclose(scaled, np.round(scaled), atol=1e-5)
    return scaled.transpose(0, 2, 1, 3).round().astype(bool)


def test_attention_weight_dropout_is_t5s_one_mask_per_key_shared_by_every_query():
    """The paper (section 2.1): dropout "on the attention weights"; Mesh TensorFlow drops
    `softmax(logits)` with the query length broadcast (`dropout_broadcast_dims=[length]`): per
    (example, head, key) one draw, the same for every query, each kept weight scaled by
    1 / (1 - rate), about `rate` of them dropped."""
    rate, batch, heads, keys, queries = 0.25, 4, 8, 64, 3
    module = _bare_attention(heads, keys, rate)
    kept = _kept_keys(module, rate, jax.random.key(5), batch, heads, keys, queries)
    assert (kept == kept[:, :, :1]).all()  # shared by every query
    dropped = 1 - kept[:, :, 0].mean()
    draws = batch * heads * keys
    assert abs(dropped - rate) < 5 * (rate * (1 - rate) / draws) ** 0.5
    # Drawn per example and per head, and again for another key.
    assert (kept[0, 0] != kept[1, 0]).any() and (kept[0, 0] != kept[0, 1]).any()
    other = _kept_keys(module, rate, jax.random.key(6), batch, heads, keys, queries)
    assert (other != kept).any()


def test_attention_with_dropped_weights_matches_a_transcription_of_t5s():
    """softmax(q.k + bias, masked) * keep / (1 - rate) . v, with `keep` read off the layer by
    `_kept_keys` (a function of the key and the shape only); evaluation (no key) drops nothing."""
    rate, rng = 0.4, jax.random.key(11)
    q, k, v = _qkv()
    bias = jax.random.normal(jax.random.key(1), (1, H, LQ, LK))
    module = _bare_attention(H, D, rate)
    keep = _kept_keys(_bare_attention(H, LK, rate), rate, rng, B, H, LK, LQ)

    logits = np.einsum("bqhd,bkhd->bhqk", q, k) + np.asarray(bias)
    logits = np.where(KEY_PADDING, logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights = weights / weights.sum(-1, keepdims=True) * keep / (1 - rate)
    expected = np.einsum("bhqk,bkhd->bqhd", weights, v)

    mask = jnp.asarray(KEY_PADDING)
    np.testing.assert_allclose(_attend(module, q, k, v, mask, bias, rng), expected, atol=1e-5)
    np.testing.assert_allclose(_attend(module, q, k, v, mask, bias), _reference(
        q, k, v, KEY_PADDING, bias), atol=1e-5)
    # `auto` off a GPU is einsum; its GPU choice (None, XLA's kernel) forms no weights, so
    # dropping them runs the einsum path there too: the same numbers.
    np.testing.assert_allclose(_attend(_bare_attention(H, D, rate, None), q, k, v, mask, bias, rng),
                               expected, atol=1e-5)


def test_kernels_that_form_no_weights_refuse_to_drop_them():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="implementation='xla' never forms the attention weights"):
        dot_product_attention(q, k, v, None, implementation="xla", weights_dropout=lambda w: w)


def test_causal_mask():
    expected = [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    mask = causal_mask(3)
    assert mask.shape == (1, 1, 3, 3) and mask.dtype == bool
    np.testing.assert_array_equal(mask[0, 0], expected)


def test_padding_mask():
    tokens_q = jnp.array([[7, 8, 0]])
    tokens_k = jnp.array([[9, 0]])
    mask = padding_mask(tokens_q > 0, tokens_k > 0)
    assert mask.shape == (1, 1, 3, 2)
    np.testing.assert_array_equal(mask[0, 0], [[1, 0], [1, 0], [0, 0]])


def test_segment_mask():
    segments = jnp.array([[1, 1, 2, 0]])
    expected = [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
    np.testing.assert_array_equal(segment_mask(segments, segments)[0, 0], expected)


def test_prefix_lm_mask():
    # Prefix = positions 0 and 1: both see each other; 2 and 3 see only the past and themselves.
    expected = [[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    mask = prefix_lm_mask(jnp.array([[True, True, False, False]]))
    assert mask.shape == (1, 1, 4, 4)
    np.testing.assert_array_equal(mask[0, 0], expected)
    # No prefix at all is exactly the causal mask.
    np.testing.assert_array_equal(prefix_lm_mask(jnp.zeros((1, 4), bool)), causal_mask(4))


def test_cache_mask_over_slots():
    # Row 0: queries at positions 0-3 over 5 slots with a 2-token prefix (prefill); row 1: one
    # query at position 3 (a decoding step), its prefix long past.
    queries = jnp.array([[0, 1, 2, 3], [3, 3, 3, 3]])
    mask = cache_mask(queries, 5, prefix_length=jnp.array([2, 2]))
    assert mask.shape == (2, 1, 4, 5) and mask.dtype == bool
    np.testing.assert_array_equal(mask[0, 0], [[1, 1, 0, 0, 0], [1, 1, 0, 0, 0],
                                               [1, 1, 1, 0, 0], [1, 1, 1, 1, 0]])
    np.testing.assert_array_equal(mask[1, 0], [[1, 1, 1, 1, 0]] * 4)
    # Square and without a prefix: the causal mask.
    np.testing.assert_array_equal(cache_mask(jnp.arange(4)[None], 4), causal_mask(4))


def test_cross_attention_mask():
    decoder_valid = jnp.array([[True, True, False]])
    encoder_valid = jnp.array([[True, True, True, False]])
    mask = cross_attention_mask(decoder_valid, encoder_valid)
    assert mask.shape == (1, 1, 3, 4)
    np.testing.assert_array_equal(mask[0, 0], [[1, 1, 1, 0], [1, 1, 1, 0], [0, 0, 0, 0]])
    packed = cross_attention_mask(decoder_valid, encoder_valid,
                                  jnp.array([[1, 2, 0]]), jnp.array([[1, 1, 2, 0]]))
    np.testing.assert_array_equal(packed[0, 0], [[1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]])


def test_cross_attention_mask_needs_both_segment_arrays():
    valid = jnp.ones((1, 2), bool)
    with pytest.raises(ValueError, match="decoder_segments and encoder_segments"):
        cross_attention_mask(valid, valid, decoder_segments=jnp.ones((1, 2), jnp.int32))


def test_combine_masks():
    a = jnp.array([[True, False], [True, True]])[None, None]  # [1, 1, 2, 2]
    b = jnp.array([[[[True, True], [False, True]]], [[[True, True], [True, True]]]])  # [2, 1, 2, 2]
    combined = combine_masks(a, None, b)
    assert combined.shape == (2, 1, 2, 2)
    np.testing.assert_array_equal(combined[0, 0], [[1, 0], [0, 1]])
    np.testing.assert_array_equal(combined[1, 0], [[1, 0], [1, 1]])
    assert combine_masks(None, None) is None


# Hand-derived from T5's rule. Bidirectional, 32 buckets, max distance 128: each direction has
# n = 16 buckets, exact for distances < max_exact = 8, then
# 8 + floor(ln(d / 8) / ln(128 / 8) * (16 - 8)); keys after the query add 16.
#   d=3 -> 3;  d=8 -> 8 + floor(0) = 8;  d=20 -> 8 + floor(ln 2.5 / ln 16 * 8 = 2.64) = 10;
#   d=100 -> 8 + floor(ln 12.5 / ln 16 * 8 = 7.29) = 15;  d=500 -> capped at 15.
BIDIRECTIONAL = [(0, 0), (-3, 3), (3, 19), (-8, 8), (-20, 10), (20, 26), (-100, 15),
                 (100, 31), (-500, 15), (500, 31)]
# Causal, 32 buckets, max distance 128: keys after the query -> 0; max_exact = 16, then
# 16 + floor(ln(d / 16) / ln(128 / 16) * 16):
#   d=20 -> 16 + floor(ln 1.25 / ln 8 * 16 = 1.72) = 17;  d=100 -> 16 + floor(14.10) = 30;
#   d=127 -> 16 + floor(15.94) = 31;  d=500 -> capped at 31.
CAUSAL = [(0, 0), (5, 0), (-5, 5), (-15, 15), (-20, 17), (-100, 30), (-127, 31), (-500, 31)]


@pytest.mark.parametrize("bidirectional,cases", [(True, BIDIRECTIONAL), (False, CAUSAL)])
def test_relative_position_bucket(bidirectional, cases):
    relative, expected = zip(*cases)
    buckets = relative_position_bucket(jnp.array(relative), bidirectional=bidirectional,
                                       num_buckets=32, max_distance=128)
    np.testing.assert_array_equal(buckets, expected)


def test_relative_position_bucket_small_table():
    # 8 bidirectional buckets, max distance 16: halves of 4, exact below 2, then
    # 2 + floor(ln(d / 2) / ln 8 * 2): d=3 -> 2 + floor(0.39) = 2, d=7 -> 2 + floor(1.20) = 3.
    buckets = relative_position_bucket(jnp.array([-1, -3, -7, 1, 7]), bidirectional=True,
                                       num_buckets=8, max_distance=16)
    np.testing.assert_array_equal(buckets, [1, 2, 3, 5, 7])


@pytest.mark.parametrize("lq, lk", [(5, 7), (5, 6), (6, 7), (6, 6)])
@pytest.mark.parametrize("masked, biased", [(True, True), (False, True), (True, False)])
def test_attention_at_even_lengths_is_the_same_attention(lq, lk, masked, biased):
    """`at_even_lengths` (cuDNN refuses to train with a bias at an odd length) gives the
    kernel even lengths and returns the unpadded attention: outputs and the gradients of q,
    k, v and the bias, here with XLA's kernel inside, against that kernel unpadded."""
    from t5x_lite.attention import _jax_attention, at_even_lengths

    keys = jax.random.split(jax.random.key(3), 5)
    q = jax.random.normal(keys[0], (2, lq, 2, 8))
    k, v = (jax.random.normal(key, (2, lk, 2, 8)) for key in keys[1:3])
    bias = jax.random.normal(keys[3], (1, 2, lq, lk)) if biased else None
    valid_k = jnp.arange(lk)[None, :] < jnp.array([[lk], [lk - 2]])
    mask = (padding_mask(jnp.ones((2, lq), bool), valid_k) if masked else None)
    cotangent = jax.random.normal(keys[4], q.shape)
    seen = []
    xla = _jax_attention("xla")

    def recording(q, k, v, mask, bias):
        seen.append((q.shape[1], k.shape[1], mask.shape[-2:],
                     None if bias is None else bias.shape[-2:]))
        return xla(q, k, v, mask, bias)

    def loss(attend):
        return lambda q, k, v, bias: jnp.sum(attend(q, k, v, mask, bias) * cotangent)

    arguments = (0, 1, 2, 3) if biased else (0, 1, 2)
    even = jax.value_and_grad(loss(lambda *a: at_even_lengths(recording, *a)),
                              argnums=arguments)(q, k, v, bias)
    plain = jax.value_and_grad(loss(xla), argnums=arguments)(q, k, v, bias)
    for got, want in zip(jax.tree.leaves(even), jax.tree.leaves(plain)):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    lq2, lk2 = lq + lq % 2, lk + lk % 2
    assert set(seen) == {(lq2, lk2, (lq2, lk2), (lq2, lk2) if biased else None)}


@pytest.mark.parametrize("lq, lk, sees", [(5, 7, (6, 8)), (6, 8, (6, 8)), (1, 7, (1, 7))])
@pytest.mark.parametrize("biased", [True, False])
def test_cudnn_gets_even_lengths_except_one_query_at_a_time(monkeypatch, lq, lk, sees, biased):
    """What `dot_product_attention(..., implementation='cudnn')` hands the kernel (XLA's kernel
    stands in for cuDNN off a GPU): even lengths, with or without a bias (cross-attention has
    only a mask, which JAX turns into one), but a decoding step's one query, which trains
    nothing, as it is."""
    from t5x_lite import attention

    seen = []
    xla = attention._jax_attention("xla")

    def stand_in(implementation):
        assert implementation == "cudnn"
        return lambda q, k, v, mask, bias: seen.append((q.shape[1], k.shape[1])) or xla(
            q, k, v, mask, bias)

    monkeypatch.setattr(attention, "_jax_attention", stand_in)
    q = jax.random.normal(jax.random.key(0), (2, lq, 2, 8))
    k = jax.random.normal(jax.random.key(1), (2, lk, 2, 8))
    bias = jax.random.normal(jax.random.key(2), (1, 2, lq, lk)) if biased else None
    out = dot_product_attention(q, k, k, None, bias, implementation="cudnn")
    assert seen == [sees] and out.shape == q.shape
    np.testing.assert_allclose(out, xla(q, k, k, None, bias), rtol=1e-5, atol=1e-5)


def test_the_settings_refuse_exactly_the_bucket_tables_that_break_t5s_rule():
    """Every (buckets, max distance) pair the model settings accept maps each distance of
    either direction to a bucket in range that no nearer distance's bucket exceeds (buckets
    grow with distance); each pair they refuse breaks that in some direction (NaN ids at
    max distance = max exact, a division by zero below 4 buckets, log-spaced buckets falling
    back into the exact ones below it)."""
    from t5x_lite import presets
    from t5x_lite.settings import Model

    distances = np.arange(0, 400)
    for buckets in range(2, 19):
        for max_distance in range(1, 24):
            model = presets.tiny().model
            model.update(relpos_buckets=buckets, relpos_max_distance=max_distance)
            try:
                Model.from_config(model)
                accepted = True
            except ConfigError:
                accepted = False
            sound = True
            for bidirectional in (True, False):
                try:
                    ids = np.asarray(relative_position_bucket(
                        jnp.asarray(-distances), bidirectional=bidirectional,
                        num_buckets=buckets, max_distance=max_distance))
                except ZeroDivisionError:
                    sound = False
                    continue
                half = buckets // 2 if bidirectional else buckets
                sound &= bool((ids >= 0).all() and (ids < half).all()
                              and (np.diff(ids) >= 0).all())
            assert accepted == sound, (buckets, max_distance)
    # A model of bidirectional stacks alone reads only their buckets: 32 and 12 works there.
    model = presets.tiny().model
    model.update(arch="encoder_only", relpos_buckets=32, relpos_max_distance=12)
    Model.from_config(model)
    with pytest.raises(ConfigError, match="relpos_max_distance > 8, the exact-distance buckets "
                                          "of a bidirectional stack"):
        Model.from_config({**model.to_dict(), "relpos_max_distance": 8})
