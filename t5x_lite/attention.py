"""Attention as a pure function, the mask builders that decide visibility, and T5's buckets.

Which positions a token may see is always an argument: a boolean mask broadcastable to
`[batch, heads, q_len, kv_len]` (True = may attend). The mask builders below are pure
functions of token / segment arrays and return `bool [batch or 1, 1, q_len, kv_len]`; the
network only ever receives their (combined) result, never an `is_causal` flag.
"""
from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp

from t5x_lite.errors import ConfigError

IMPLEMENTATIONS = (None, "xla", "cudnn", "einsum")


def float32_result(dtype: jnp.dtype) -> jax.lax.DotAlgorithmPreset | None:
    """The `precision` of a matmul of `dtype` operands whose result is float32
    (`preferred_element_type=jnp.float32`): for bfloat16, bf16 operands accumulated in float32
    (BF16_BF16_F32), which also keeps the matmuls of its gradient on bf16 operands where
    without it the float32 cotangent would make them float32 matmuls; None (the default)
    for float32. Used where a rounded result would change what follows: the attention logits
    before their float32 softmax (as `jax.nn.dot_product_attention`'s XLA kernel) and the
    output logits, which T5X computes in float32 "for stability" (bf16 rounding makes two
    tokens' logits tie)."""
    return jax.lax.DotAlgorithmPreset.BF16_BF16_F32 if dtype == jnp.bfloat16 else None


def resolve_implementation(attention_impl: str) -> str | None:
    """`config.model.attention_impl` -> the `implementation` argument below. 'auto' is None
    on GPUs: `jax.nn.dot_product_attention`'s default, which in the JAX this runs on (0.10) is
    always its XLA kernel (it never picks cuDNN; 'cudnn' asks for that kernel). On every other
    backend (CPU, TPU) 'auto' is the einsum path, chosen for CPU, where it is faster (see
    `_einsum_attention`); on TPU it has not been timed against the XLA kernel."""
    require_available(attention_impl)
    if attention_impl == "auto":
        return None if jax.default_backend() == "gpu" else "einsum"
    return attention_impl


def require_available(attention_impl: str) -> None:
    """`ConfigError` for `config.model.attention_impl` 'cudnn' anywhere but on a GPU (cuDNN's
    kernel exists only there), in one line, instead of JAX's traceback from inside the model;
    a run calls it before it makes any folder (`run_setup.set_up`)."""
    backend = jax.default_backend()
    if attention_impl == "cudnn" and backend != "gpu":
        raise ConfigError(f"model.attention_impl='cudnn' needs an NVIDIA GPU, and this process "
                          f"runs on {backend!r}: choose 'auto', 'xla' or 'einsum' here")


def dot_product_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: jax.Array | None,
    bias: jax.Array | None = None,
    *,
    implementation: str | None = None,
    weights_dropout: Callable[[jax.Array], jax.Array] | None = None,
) -> jax.Array:
    """Softmax attention of queries `[B, Lq, H, D]` over keys / values `[B, Lk, H, D]`.

    `mask` is bool broadcastable to `[B, H, Lq, Lk]` (True = may attend), `bias` an additive
    float term broadcastable to the same shape (the relative position bias). No 1/sqrt(D)
    scaling: T5 folds it into the query initialiser. `implementation` None, 'xla' or 'cudnn' is
    passed to `jax.nn.dot_product_attention` (None is its default: the XLA kernel); 'einsum' is the
    plain einsum-softmax-einsum of `_einsum_attention`; 'cudnn' at an odd length runs at even
    ones (`at_even_lengths`). A query row whose mask is all False (e.g. a padding position)
    returns zeros, whatever the kernel would do with it.

    `weights_dropout` (training only) maps the softmax weights `[B, H, Lq, Lk]` to the weights
    that multiply the values: T5's dropout on the attention weights, `softmax(logits)` dropped
    then applied to `v` (the paper's section 2.1; `layers.Attention` passes T5's mask, one per
    key shared by every query). Only the einsum path forms the weights, so with it None runs
    that path and 'xla' / 'cudnn' are refused (`settings.require_trainable` says so first).
    Returns `[B, Lq, H, D]`.
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation={implementation!r} is not allowed; choose one of "
                         f"{', '.join(map(repr, IMPLEMENTATIONS))}")
    if weights_dropout is not None:
        if implementation not in (None, "einsum"):
            raise ValueError(f"implementation={implementation!r} never forms the attention "
                             "weights, so it cannot drop them; use None or 'einsum'")
        implementation = "einsum"
    if bias is not None:
        bias = _expand_to_logits(bias, q, k).astype(q.dtype)
    if mask is not None:
        mask = _expand_to_logits(mask, q, k)
    if implementation == "einsum":
        out = _einsum_attention(q, k, v, mask, bias, weights_dropout)
    elif implementation == "cudnn" and q.shape[1] > 1 and (q.shape[1] % 2 or k.shape[1] % 2):
        out = at_even_lengths(_jax_attention("cudnn"), q, k, v, mask, bias)
    else:
        out = _jax_attention(implementation)(q, k, v, mask, bias)
    if mask is None:
        return out
    # Kernels disagree on rows that may see nothing (XLA averages every value, others may give
    # NaN); pin them to zero. [B, H, Lq] -> [B, Lq, H, 1].
    any_visible = jnp.any(mask, axis=-1).transpose(0, 2, 1)[..., None]
    return jnp.where(any_visible, out, jnp.zeros_like(out))


def _jax_attention(implementation: str | None):
    """`jax.nn.dot_product_attention` with `implementation`, as (q, k, v, mask, bias) -> out."""
    def attend(q, k, v, mask, bias):
        return jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask, scale=1.0,
                                            implementation=implementation)
    return attend


def at_even_lengths(attend, q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array | None,
                    bias: jax.Array | None) -> jax.Array:
    """`attend(q, k, v, mask, bias)` (4-d mask and bias, as `dot_product_attention` passes
    them) computed at even query and key lengths: cuDNN's kernel refuses to train at an odd
    length with a bias (JAX's `check_is_flash_attention`; JAX turns a mask into a bias, and
    in JAX 0.10 its training rule counts an absent bias as present too), and T5's targets can
    have any length. An odd axis gets one more position: a zero key that the mask hides from
    every query, or a zero query that sees every real key (so its softmax stays finite) and
    whose output row is dropped. The real rows' outputs and all gradients are those of the
    unpadded attention. (Cached decoding, one query at a time, trains nothing and is left as
    it is.)"""
    lq, lk = q.shape[1], k.shape[1]
    pad_q, pad_k = lq % 2, lk % 2
    if mask is None:
        mask = jnp.ones((1, 1, lq, lk), bool)
    # Zero rows / columns of the bias and False key columns for the new key; the new query
    # row sees every real key.
    q = jnp.pad(q, ((0, 0), (0, pad_q), (0, 0), (0, 0)))
    k, v = (jnp.pad(x, ((0, 0), (0, pad_k), (0, 0), (0, 0))) for x in (k, v))
    if bias is not None:
        bias = jnp.pad(bias, ((0, 0), (0, 0), (0, pad_q), (0, pad_k)))
    mask = jnp.pad(mask, ((0, 0), (0, 0), (0, pad_q), (0, 0)), constant_values=True)
    mask = jnp.pad(mask, ((0, 0), (0, 0), (0, 0), (0, pad_k)), constant_values=False)
    return attend(q, k, v, mask, bias)[:, :lq]


def _einsum_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array | None,
                      bias: jax.Array | None,
                      weights_dropout: Callable[[jax.Array], jax.Array] | None = None
                      ) -> jax.Array:
    """Attention as two einsums around a float32 softmax, `weights_dropout` (if given) applied
    to the softmax weights between them. The logits and the bias are summed in float32 (with
    bf16 operands, a float32 result: `float32_result`), as in `jax.nn.dot_product_attention`'s
    XLA kernel; rounded to bf16 first, they put 6-13x its error into the output. On CPU this
    path was measured about 7% faster per train step than that kernel (`t5x-lite bench`,
    interleaved timing, commit 887478c), whose grouped-query reshapes add copies and a slow
    bias-gradient reduction."""
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32,
                        precision=float32_result(q.dtype))
    if bias is not None:
        logits = logits + _broadcast_batch(bias, logits.shape[0]).astype(jnp.float32)
    if mask is not None:
        logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
    if weights_dropout is not None:
        weights = weights_dropout(weights)
    return jnp.einsum("bhqk,bkhd->bqhd", weights, v)


def _broadcast_batch(x: jax.Array, batch_size: int) -> jax.Array:
    """`x [1 or batch_size, ...]` -> `[batch_size, ...]`.

    A size-1 batch axis (the relative position bias shared by every example) is broadcast as a
    product with ones so that its gradient, a sum over the batch, is a matrix product: XLA:CPU
    reduces over a leading axis of `[B, H, Lq, Lk]` about 7x slower, and the tiny preset's
    train step runs about 3% faster for it (6% less CPU time).
    """
    if x.shape[0] == batch_size:
        return x
    return jnp.einsum("b,o...->b...", jnp.ones(batch_size, x.dtype), x)


def _expand_to_logits(x: jax.Array, q: jax.Array, k: jax.Array) -> jax.Array:
    """Broadcast a mask or bias to `[B or 1, H or 1, Lq, Lk]`.

    The kernels want 4-d operands with full query / key lengths; a size-1 batch or head axis
    stays 1 so nothing is copied per example or per head.
    """
    x = x.reshape((1,) * (4 - x.ndim) + x.shape)
    return jnp.broadcast_to(x, x.shape[:2] + (q.shape[1], k.shape[1]))


def relative_position_bucket(
    relative_position: jax.Array, *, bidirectional: bool, num_buckets: int, max_distance: int
) -> jax.Array:
    """Map `relative_position = key_pos - query_pos` to T5's bucket ids in `[0, num_buckets)`.

    Bidirectional: half the buckets for keys at or before the query, half (offset by
    num_buckets/2) for keys after it. Causal: keys after the query all share bucket 0. Within
    a half of `n` buckets, distances below n/2 get one bucket each; larger distances are
    log-spaced up to `max_distance`, beyond which they share the last bucket.
    """
    relative_position = jnp.asarray(relative_position, jnp.int32)
    if bidirectional:
        num_buckets //= 2
        offset = jnp.where(relative_position > 0, num_buckets, 0)
        distance = jnp.abs(relative_position)
    else:
        offset = 0
        distance = jnp.maximum(-relative_position, 0)
    max_exact = num_buckets // 2
    # Same float32 operation order as the reference implementations, so boundary distances
    # land in the same bucket. The maximum() only keeps log() finite where the exact branch wins.
    log_ratio = jnp.log(jnp.maximum(distance, max_exact).astype(jnp.float32) / max_exact)
    log_bucket = max_exact + (
        log_ratio / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    ).astype(jnp.int32)
    log_bucket = jnp.minimum(log_bucket, num_buckets - 1)
    return offset + jnp.where(distance < max_exact, distance, log_bucket)


def causal_mask(length: int) -> jax.Array:
    """`bool [1, 1, length, length]`: position q may see keys at positions <= q."""
    index = jnp.arange(length)
    return (index[None, :] <= index[:, None])[None, None]


def cache_mask(query_positions: jax.Array, cache_length: int,
               prefix_length: jax.Array | None = None) -> jax.Array:
    """`bool [B, 1, Lq, cache_length]` for queries at `query_positions [B, Lq]` over the slots
    of a decoding cache, where slot j holds position j: causal (a query sees slots up to its
    own position). With `prefix_length [B]` (a prefix LM), queries inside a row's prefix
    (positions < prefix_length) also see the whole prefix, as `prefix_lm_mask` does.
    """
    query = query_positions[:, None, :, None]
    slot = jnp.arange(cache_length)[None, None, None, :]
    visible = slot <= query
    if prefix_length is None:
        return visible
    prefix_length = prefix_length[:, None, None, None]
    return visible | ((query < prefix_length) & (slot < prefix_length))


def padding_mask(query_valid: jax.Array, key_valid: jax.Array) -> jax.Array:
    """`bool [B, 1, Lq, Lk]` from `query_valid [B, Lq]`, `key_valid [B, Lk]` (e.g. tokens > 0).

    A pair is visible only if both the query and the key are real tokens.
    """
    return _pairwise(jnp.logical_and, query_valid, key_valid)


def segment_mask(query_segments: jax.Array, key_segments: jax.Array) -> jax.Array:
    """`bool [B, 1, Lq, Lk]`: packed examples (segment ids `[B, L]`) never see each other."""
    return _pairwise(jnp.equal, query_segments, key_segments)


def prefix_lm_mask(inputs_mask: jax.Array) -> jax.Array:
    """`bool [B, 1, L, L]` for a prefix LM: `inputs_mask [B, L]` marks the prefix.

    Positions inside the prefix see the whole prefix (bidirectional); every position also sees
    all earlier positions (causal), so nothing ever sees a later target.
    """
    inputs_mask = inputs_mask.astype(bool)
    both_in_prefix = _pairwise(jnp.logical_and, inputs_mask, inputs_mask)
    return jnp.logical_or(causal_mask(inputs_mask.shape[-1]), both_in_prefix)


def cross_attention_mask(
    decoder_valid: jax.Array,
    encoder_valid: jax.Array,
    decoder_segments: jax.Array | None = None,
    encoder_segments: jax.Array | None = None,
) -> jax.Array:
    """`bool [B, 1, Ld, Le]`: a real decoder token sees the real encoder tokens of its example.

    `*_valid` are bool `[B, L]` (e.g. tokens > 0); segment ids `[B, L]` are given when packed.
    """
    segments = None
    if decoder_segments is not None or encoder_segments is not None:
        if decoder_segments is None or encoder_segments is None:
            raise ValueError("cross_attention_mask needs both decoder_segments and "
                             "encoder_segments, or neither")
        segments = segment_mask(decoder_segments, encoder_segments)
    return combine_masks(padding_mask(decoder_valid, encoder_valid), segments)


def combine_masks(*masks: jax.Array | None) -> jax.Array | None:
    """Logical AND of the given masks (broadcasting); None entries are ignored.

    Returns None if every entry is None (no restriction).
    """
    present = [m for m in masks if m is not None]
    if not present:
        return None
    combined = present[0].astype(bool)
    for mask in present[1:]:
        combined = jnp.logical_and(combined, mask)
    return combined


def _pairwise(op, query_values: jax.Array, key_values: jax.Array) -> jax.Array:
    """`op(query[b, q], key[b, k])` as `[B, 1, Lq, Lk]` from two `[B, L]` arrays."""
    return op(query_values[:, None, :, None], key_values[:, None, None, :])
