"""The T5 building blocks as Flax NNX modules: norm, attention, MLP, position bias, one layer.

Conventions shared by every module here:
- Parameters are float32 `nnx.Param`s carrying `logical_axes` (names from the sharding rules);
  they are cast to the compute `dtype` right before each matmul. Norms run in float32.
- Modules hold parameters only. Dropout is a pure function of an explicit key
  (`dropout_rng`, folded per site), and masks / biases arrive as arguments: no layer decides
  which positions are visible.
- Initialisers follow T5 (Mesh TF / Hugging Face `_init_weights` with factor 1).
- Shapes: B batch, L length, D d_model, H heads, K d_kv, F d_ff, Lc cache slots.
- Incremental decoding passes an explicit cache (`LayerCache` per layer) in and gets the
  updated one back; without a cache (training) nothing about the computation changes.
"""
from __future__ import annotations

import functools
import math

import flax
import jax
import jax.numpy as jnp
from flax import nnx

from t5x_lite.attention import (
    dot_product_attention,
    float32_result,
    relative_position_bucket,
    resolve_implementation,
)
from t5x_lite.settings import Model


def normal_param(
    rngs: nnx.Rngs, shape: tuple[int, ...], stddev: float, logical_axes: tuple[str, ...]
) -> nnx.Param:
    """A float32 parameter drawn from normal(0, stddev), tagged with its logical axes."""
    value = jax.random.normal(rngs.params(), shape, jnp.float32) * stddev
    return nnx.Param(value, logical_axes=logical_axes)


def fold_rng(rng: jax.Array | None, site: int) -> jax.Array | None:
    """A distinct key for dropout site `site` below `rng`; None stays None (no dropout)."""
    return None if rng is None else jax.random.fold_in(rng, site)


def dropout(x: jax.Array, rate: float, rng: jax.Array | None) -> jax.Array:
    """Inverted dropout as T5 applies it to `x [..., length, features]`: each feature of an
    example is zeroed with probability `rate` at every position or at none (one mask per
    example and feature, shared along the sequence axis -2: Mesh TensorFlow's noise shape
    without the length dimension, T5X's `broadcast_dims=(-2,)`), the rest scaled up.

    Identity when `rng` is None (evaluation) or `rate` is 0. The mask is a pure function of
    `rng` and `x.shape` (`random_bits`), so it does not depend on the sharding.
    """
    if rng is None or rate == 0.0:
        return x
    # Dropped iff bits < threshold: probability threshold / 2^32, `rate` to within 2^-32.
    threshold = jnp.uint32(min(round(rate * 2.0**32), 2**32 - 1))
    mask_shape = (*x.shape[:-2], 1, x.shape[-1])
    return keep_and_scale(x, random_bits(rng, mask_shape) >= threshold, rate)


def keep_and_scale(x: jax.Array, keep: jax.Array, rate: float) -> jax.Array:
    """Inverted dropout's rule given its mask: `x / (1 - rate)` where `keep`, 0 elsewhere, in
    the dtype of `x`."""
    return jnp.where(keep, x / (1.0 - rate), 0.0).astype(x.dtype)


# Threefry-2x32 with 20 rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
# SC 2011): the rotation constants of its 8-round cycle and the key-schedule parity constant.
_THREEFRY_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_THREEFRY_PARITY = 0x1BD11BDA


def threefry_2x32(key: tuple[jax.Array, jax.Array],
                  counter: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """Threefry-2x32-20 of uint32 `counter` words (any shape) under uint32 `key` words.

    The same function as `jax.extend.random.threefry_2x32`, written out in jnp so that XLA
    fuses all 20 rounds into one pass: on CPU JAX lowers its own to a rolled loop, one pass
    over memory per 4 rounds, which made the random bits of dropout about 9x slower.
    """
    keys = (key[0], key[1], key[0] ^ key[1] ^ jnp.uint32(_THREEFRY_PARITY))
    x0, x1 = counter[0] + keys[0], counter[1] + keys[1]
    for block in range(5):  # 5 blocks of 4 rounds, a key injection after each
        for rotation in _THREEFRY_ROTATIONS[block % 2]:
            x0 = x0 + x1
            x1 = ((x1 << rotation) | (x1 >> (32 - rotation))) ^ x0
        x0 = x0 + keys[(block + 1) % 3]
        x1 = x1 + keys[(block + 2) % 3] + jnp.uint32(block + 1)
    return x0, x1


def random_bits(rng: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Uniform uint32 bits of `shape` from the key `rng`: the first word of Threefry-2x32 of
    each element's flat index, so every element's bits depend only on (rng, its index), not
    on how the array is sharded. Fewer than 2^32 elements."""
    if math.prod(shape) >= 2**32:
        raise ValueError(f"random_bits draws fewer than 2^32 values; shape {shape} has "
                         f"{math.prod(shape)}")
    key = jax.random.bits(rng, (2,), jnp.uint32)  # works for any key implementation
    # The flat index as a sum of per-axis iotas: elementwise, so it partitions like `x`.
    index = jnp.zeros(shape, jnp.uint32)
    for axis in range(len(shape)):
        stride = math.prod(shape[axis + 1:])
        index = index + jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(stride)
    return threefry_2x32((key[0], key[1]), (jnp.zeros_like(index), index))[0]


def dense(x: jax.Array, kernel: jax.Array, contract: int = 1, *,
          float32_out: bool = False) -> jax.Array:
    """`x [..., *in] @ kernel [*in, *out] -> [..., *out]`, computed as one 2-D matmul.

    `contract` is how many leading kernel dims (= trailing dims of `x`) are summed over.
    `float32_out`: the result in float32, accumulated from the operands' dtype without
    rounding to it (`attention.float32_result`); else in the operands' dtype.
    Why 2-D: for an einsum with several batch-like dims (`bld,dhk->blhk`), JAX's gradient
    rule and XLA:CPU's layouts add a transpose of the large activation gradient before the
    weight-gradient matmul; flattened to `[B*L, in] @ [in, out]`, forward and backward are
    plain matmuls (37 fewer copies in the tiny train step, which runs 1-4 % faster).
    """
    in_dims, out_dims = kernel.shape[:contract], kernel.shape[contract:]
    lead = x.shape[: x.ndim - contract]
    x2d, kernel2d = x.reshape(-1, math.prod(in_dims)), kernel.reshape(math.prod(in_dims), -1)
    if float32_out:
        y = jnp.matmul(x2d, kernel2d, preferred_element_type=jnp.float32,
                       precision=float32_result(x.dtype))
    else:
        y = x2d @ kernel2d
    return y.reshape(*lead, *out_dims)


def _rms_norm_forward(x: jax.Array, scale: jax.Array, epsilon: float
                      ) -> tuple[jax.Array, jax.Array]:
    """(y, r): `y = scale * x * r` in the dtype of `x`, `r = rsqrt(mean(x^2) + eps)` `[..., 1]`;
    both computed in float32."""
    x32 = x.astype(jnp.float32)
    r = jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + epsilon)
    return (scale * (x32 * r)).astype(x.dtype), r


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def rms_norm(x: jax.Array, scale: jax.Array, epsilon: float) -> jax.Array:
    """T5's layer norm of `x [..., D]` with `scale [D]`: `scale * x / sqrt(mean(x^2) + eps)`
    over the last axis, computed in float32, returned in the dtype of `x`.

    Its gradient is written out so that the backward pass keeps only `x` (in its own dtype)
    and `r = rsqrt(mean(x^2) + eps)` `[..., 1]`. JAX's own would keep three float32 copies of
    `[..., D]` (x, 2x and x * r): on a bf16 T5-base step on an H200 those, stacked over the
    scanned layers, were the largest arrays the step wrote and read. With n = x r and
    gn = g * scale: dx = r (gn - n mean(gn n)), dscale = sum(g n) over the leading axes."""
    return _rms_norm_forward(x, scale, epsilon)[0]


def _rms_norm_fwd(x, scale, epsilon):
    y, r = _rms_norm_forward(x, scale, epsilon)
    return y, (x, scale, r)


def _rms_norm_bwd(epsilon, saved, g):
    x, scale, r = saved
    normed = x.astype(jnp.float32) * r
    g32 = g.astype(jnp.float32)
    d_scale = jnp.sum(g32 * normed, axis=tuple(range(g.ndim - 1)))
    g_normed = g32 * scale
    d_x = r * (g_normed - normed * jnp.mean(g_normed * normed, axis=-1, keepdims=True))
    return d_x.astype(x.dtype), d_scale.astype(scale.dtype)


rms_norm.defvjp(_rms_norm_fwd, _rms_norm_bwd)


class RMSNorm(nnx.Module):
    """T5's layer norm (`rms_norm`): scale only, no mean subtraction, no bias; float32 inside."""

    def __init__(self, dim: int, *, epsilon: float):
        self.scale = nnx.Param(jnp.ones((dim,), jnp.float32), logical_axes=("embed",))
        self.epsilon = epsilon

    def __call__(self, x: jax.Array) -> jax.Array:
        """`[..., D]` -> `[..., D]` in the dtype of `x`."""
        return rms_norm(x, self.scale[...], self.epsilon)


class Embed(nnx.Module):
    """The token embedding table `[vocab, D]`, also usable as the tied output projection."""

    def __init__(self, vocab_size: int, d_model: int, *, dtype: jnp.dtype, rngs: nnx.Rngs):
        self.embedding = normal_param(rngs, (vocab_size, d_model), 1.0, ("vocab", "embed"))
        self.dtype = dtype

    def __call__(self, tokens: jax.Array) -> jax.Array:
        """int `[B, L]` -> `[B, L, D]` in the compute dtype."""
        return jnp.take(self.embedding[...], tokens, axis=0).astype(self.dtype)

    def attend(self, x: jax.Array) -> jax.Array:
        """`[B, L, D]` -> unscaled float32 logits `[B, L, vocab]` against the embedding
        table."""
        return dense(x, self.embedding[...].astype(self.dtype).T, float32_out=True)


class LMHead(nnx.Module):
    """The untied output projection `kernel [D, vocab]` (T5 v1.1)."""

    def __init__(self, d_model: int, vocab_size: int, *, dtype: jnp.dtype, rngs: nnx.Rngs):
        self.kernel = normal_param(rngs, (d_model, vocab_size), d_model**-0.5, ("embed", "vocab"))
        self.dtype = dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        """`[B, L, D]` -> float32 logits `[B, L, vocab]`."""
        return dense(x, self.kernel[...].astype(self.dtype), float32_out=True)


@flax.struct.dataclass
class KeysValues:
    """One attention's projected keys and values, each `[B, L, H, K]`: the whole sequence in
    training, the slots of a decoding cache (slot j = position j) when decoding."""

    key: jax.Array
    value: jax.Array

    def write(self, new: KeysValues, start: jax.Array) -> KeysValues:
        """These slots with `new` (`[B, Ln, H, K]`) written at slots `start[b] .. start[b] + Ln`
        of row b (`start` int `[B]`: rows of a batch may be at different positions)."""
        def write_rows(slots: jax.Array, update: jax.Array) -> jax.Array:
            return jax.vmap(jax.lax.dynamic_update_slice_in_dim, in_axes=(0, 0, 0, None))(
                slots, update.astype(slots.dtype), start, 0)

        return KeysValues(write_rows(self.key, new.key), write_rows(self.value, new.value))


@flax.struct.dataclass
class LayerCache:
    """What one layer keeps between decoding steps: its self-attention's keys / values of every
    position so far (`[B, Lc, H, K]`), and, in an encoder-decoder's decoder, the
    cross-attention's keys / values of the encoder output, computed once (`[B, Le, H, K]`)."""

    self_attention: KeysValues
    cross_attention: KeysValues | None


# A stack's decoding cache: one `LayerCache` per layer, or, when the stack scans over stacked
# layers (`model.scan_layers`), one `LayerCache` whose arrays carry a leading layer axis. Either
# way every key / value array ends in `[B, L, H, K]`, so the helpers below index from the end.
Cache = list[LayerCache] | LayerCache


def cache_slots(cache: Cache) -> int:
    """How many self-attention slots (positions) `cache` holds."""
    first = cache if isinstance(cache, LayerCache) else cache[0]
    return first.self_attention.key.shape[-3]


def select_cache_rows(cache: Cache, rows: jax.Array, *, cross_attention: bool = True) -> Cache:
    """`cache` with batch rows `rows` (int `[N]`) taken from every key / value array, e.g. to
    copy a prompt's cache per beam or to reorder beams. `cross_attention=False` leaves the
    encoder's keys / values as they are (beams of one example share them)."""
    def take(kv: KeysValues | None) -> KeysValues | None:
        return jax.tree.map(lambda x: jnp.take(x, rows, axis=-4), kv)

    def select(layer: LayerCache) -> LayerCache:
        return LayerCache(take(layer.self_attention),
                          take(layer.cross_attention) if cross_attention else layer.cross_attention)

    return select(cache) if isinstance(cache, LayerCache) else [select(layer) for layer in cache]


class Attention(nnx.Module):
    """Multi-head attention with query / key / value / out projections and no biases.

    The same module serves self-attention (`inputs_kv` is `inputs_q`) and cross-attention.
    `weights_dropout_rate` is T5's dropout on the attention weights `[B, H, Lq, Lk]`, applied
    where `attend` is given a key: one mask per (example, head, key), shared by every query,
    as Mesh TensorFlow's attention broadcasts it over the query length (`dropout`'s rule on
    axis -2). HF T5 draws it per element; evaluation and decoding (no key) drop nothing.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_kv: int,
        *,
        dtype: jnp.dtype,
        implementation: str | None,
        weights_dropout_rate: float = 0.0,
        rngs: nnx.Rngs,
    ):
        # T5 has no 1/sqrt(d_kv) in the logits: the query initialiser absorbs it.
        self.query = normal_param(
            rngs, (d_model, num_heads, d_kv), (d_model * d_kv) ** -0.5, ("embed", "heads", "kv")
        )
        self.key = normal_param(rngs, (d_model, num_heads, d_kv), d_model**-0.5,
                                ("embed", "heads", "kv"))
        self.value = normal_param(rngs, (d_model, num_heads, d_kv), d_model**-0.5,
                                  ("embed", "heads", "kv"))
        self.out = normal_param(rngs, (num_heads, d_kv, d_model), (num_heads * d_kv) ** -0.5,
                                ("heads", "kv", "embed"))
        self.dtype = dtype
        self.implementation = implementation
        self.weights_dropout_rate = weights_dropout_rate

    def __call__(
        self,
        inputs_q: jax.Array,
        inputs_kv: jax.Array,
        mask: jax.Array | None,
        bias: jax.Array | None = None,
    ) -> jax.Array:
        """Queries from `inputs_q [B, Lq, D]` attend over `inputs_kv [B, Lk, D]`.

        `mask` bool / `bias` float broadcastable to `[B, H, Lq, Lk]`. Returns `[B, Lq, D]`.
        """
        return self.attend(inputs_q, self.keys_values(inputs_kv), mask, bias)

    def keys_values(self, inputs_kv: jax.Array) -> KeysValues:
        """`inputs_kv [B, Lk, D]` -> its keys and values `[B, Lk, H, K]`."""
        return KeysValues(self._project(inputs_kv, self.key), self._project(inputs_kv, self.value))

    def attend(
        self,
        inputs_q: jax.Array,
        kv: KeysValues,
        mask: jax.Array | None,
        bias: jax.Array | None = None,
        *,
        dropout_rng: jax.Array | None = None,
    ) -> jax.Array:
        """Queries from `inputs_q [B, Lq, D]` attend over projected `kv` (`[B, Lk, H, K]`,
        e.g. a decoding cache); `dropout_rng` drops the attention weights (training).
        Returns `[B, Lq, D]`."""
        q = self._project(inputs_q, self.query)
        weights_dropout = None
        if dropout_rng is not None and self.weights_dropout_rate > 0:
            weights_dropout = functools.partial(dropout, rate=self.weights_dropout_rate,
                                                rng=dropout_rng)
        heads = dot_product_attention(q, kv.key, kv.value, mask, bias,
                                      implementation=self.implementation,
                                      weights_dropout=weights_dropout)
        return dense(heads, self.out[...].astype(self.dtype), contract=2)

    def empty_cache(self, batch_size: int, length: int) -> KeysValues:
        """Zero keys / values `[batch_size, length, H, K]` in the compute dtype."""
        _, num_heads, d_kv = self.key.shape
        zeros = jnp.zeros((batch_size, length, num_heads, d_kv), self.dtype)
        return KeysValues(zeros, zeros)

    def _project(self, x: jax.Array, kernel: nnx.Param) -> jax.Array:
        """`[B, L, D]` -> `[B, L, H, K]` with a `[D, H, K]` kernel."""
        return dense(x, kernel[...].astype(self.dtype))


class MLP(nnx.Module):
    """T5's feed-forward block: `wo(act(x wi))` (ReLU, v1.0) or
    `wo(gelu_tanh(x wi_0) * (x wi_1))` (gated-GELU, v1.1), dropout after the activation."""

    def __init__(
        self, d_model: int, d_ff: int, *, kind: str, dropout_rate: float, dtype: jnp.dtype,
        rngs: nnx.Rngs,
    ):
        axes = ("embed", "mlp")
        if kind == "gated-gelu":
            self.wi_0 = normal_param(rngs, (d_model, d_ff), d_model**-0.5, axes)
            self.wi_1 = normal_param(rngs, (d_model, d_ff), d_model**-0.5, axes)
        else:
            self.wi = normal_param(rngs, (d_model, d_ff), d_model**-0.5, axes)
        self.wo = normal_param(rngs, (d_ff, d_model), d_ff**-0.5, ("mlp", "embed"))
        self.kind = kind
        self.dropout_rate = dropout_rate
        self.dtype = dtype

    def __call__(self, x: jax.Array, *, dropout_rng: jax.Array | None = None) -> jax.Array:
        """`[B, L, D]` -> `[B, L, D]`."""
        def up(kernel: nnx.Param) -> jax.Array:
            return dense(x, kernel[...].astype(self.dtype))

        if self.kind == "gated-gelu":
            hidden = jax.nn.gelu(up(self.wi_0), approximate=True) * up(self.wi_1)
        else:
            hidden = jax.nn.relu(up(self.wi))
        hidden = dropout(hidden, self.dropout_rate, dropout_rng)
        return dense(hidden, self.wo[...].astype(self.dtype))


class RelativePositionBias(nnx.Module):
    """T5's learned relative position bias: one scalar per (bucket, head), `[buckets, H]`."""

    def __init__(
        self, num_buckets: int, max_distance: int, num_heads: int, d_model: int, *,
        dtype: jnp.dtype, rngs: nnx.Rngs,
    ):
        self.embedding = normal_param(
            rngs, (num_buckets, num_heads), d_model**-0.5, ("relpos_buckets", "heads")
        )
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.dtype = dtype

    def __call__(
        self, query_positions: jax.Array, key_positions: jax.Array,
        bidirectional: bool | jax.Array,
    ) -> jax.Array:
        """Bias `[B or 1, H, Lq, Lk]` from int positions `[B, L]` or `[L]`.

        `bidirectional` picks T5's bucket rule: True for encoders and prefix LMs, False (keys
        after the query share one bucket) for the encoder-decoder's decoder and language
        models; a traced bool scalar (a program two architectures share) picks per call.
        """
        query_positions = jnp.atleast_2d(query_positions)
        key_positions = jnp.atleast_2d(key_positions)
        relative = key_positions[:, None, :] - query_positions[:, :, None]  # [B, Lq, Lk]

        def buckets_of(rule: bool) -> jax.Array:
            return relative_position_bucket(relative, bidirectional=rule,
                                            num_buckets=self.num_buckets,
                                            max_distance=self.max_distance)

        buckets = (buckets_of(bidirectional) if isinstance(bidirectional, bool)
                   else jnp.where(bidirectional, buckets_of(True), buckets_of(False)))
        bias = jnp.take(self.embedding[...], buckets, axis=0)  # [B, Lq, Lk, H]
        return bias.transpose(0, 3, 1, 2).astype(self.dtype)


class TransformerLayer(nnx.Module):
    """One pre-norm T5 layer: self-attention, optional cross-attention, MLP, each residual.

    Dropout sits where T5 puts it: on each sub-block's output before the residual add, inside
    the MLP after the activation and on the attention weights (`model.attention_dropout`). A
    `shared` layer reuses another layer's self-attention, MLP and their norms (the same
    objects, so one parameter set; `share` hands them over): that is the
    `encoder_decoder_shared` architecture. Its cross-attention and norm are always its own, and
    until `share` is called they are all it has.
    """

    def __init__(
        self,
        cfg: Model,
        *,
        cross_attention: bool,
        shared: bool = False,
        rngs: nnx.Rngs,
    ):
        dtype = jnp.dtype(cfg.dtype)
        implementation = resolve_implementation(cfg.attention_impl)

        def norm() -> RMSNorm:
            return RMSNorm(cfg.d_model, epsilon=cfg.layer_norm_epsilon)

        def attention() -> Attention:
            return Attention(cfg.d_model, cfg.num_heads, cfg.d_kv, dtype=dtype,
                             implementation=implementation,
                             weights_dropout_rate=cfg.attention_weights_dropout_rate, rngs=rngs)

        if not shared:
            self.self_attention_norm = norm()
            self.self_attention = attention()
            self.mlp_norm = norm()
            self.mlp = MLP(cfg.d_model, cfg.d_ff, kind=cfg.mlp, dropout_rate=cfg.dropout_rate,
                           dtype=dtype, rngs=rngs)
        self.cross_attention_norm = norm() if cross_attention else None
        self.cross_attention = attention() if cross_attention else None
        self.dropout_rate = cfg.dropout_rate

    # The sub-modules `share` makes one object for two layers.
    SHARED = ("self_attention_norm", "self_attention", "mlp_norm", "mlp")

    def share(self, other: TransformerLayer) -> None:
        """Use `other`'s self-attention, MLP and their norms (the same objects) from now on."""
        for name in self.SHARED:
            setattr(self, name, getattr(other, name))

    def __call__(
        self,
        x: jax.Array,
        mask: jax.Array | None,
        bias: jax.Array | None,
        *,
        encoded: jax.Array | None = None,
        cross_mask: jax.Array | None = None,
        dropout_rng: jax.Array | None = None,
        cache: LayerCache | None = None,
        cache_start: jax.Array | None = None,
    ) -> tuple[jax.Array, LayerCache | None]:
        """`x [B, L, D]` -> (`[B, L, D]`, the updated cache or None).

        `mask` / `bias` are for self-attention; `encoded [B, Le, D]` and `cross_mask`
        (broadcastable to `[B, 1, L, Le]`) give cross-attention its keys (T5 uses no position
        bias there). With `cache`, `x` holds the tokens for slots `cache_start[b] ..` of row b:
        their keys / values are written there and the queries attend over every slot (`mask`,
        `bias` `[.., L, Lc]`), and cross-attention uses the cached encoder keys / values.
        """
        has_encoder_kv = encoded is not None or (cache is not None
                                                 and cache.cross_attention is not None)
        if (self.cross_attention is None) == has_encoder_kv:
            raise ValueError("encoded (or a cache holding its keys / values) must be given if "
                             "and only if the layer has cross-attention")
        h = self.self_attention_norm(x)
        self_kv = self.self_attention.keys_values(h)
        if cache is not None:
            self_kv = cache.self_attention.write(self_kv, cache_start)
        # Dropout sites: 0-3 the sub-blocks' outputs, 4-5 the attention weights.
        x = x + dropout(self.self_attention.attend(h, self_kv, mask, bias,
                                                   dropout_rng=fold_rng(dropout_rng, 4)),
                        self.dropout_rate, fold_rng(dropout_rng, 0))
        if self.cross_attention is not None:
            h = self.cross_attention_norm(x)
            encoder_kv = (self.cross_attention.keys_values(encoded) if cache is None
                          else cache.cross_attention)
            x = x + dropout(self.cross_attention.attend(h, encoder_kv, cross_mask,
                                                        dropout_rng=fold_rng(dropout_rng, 5)),
                            self.dropout_rate, fold_rng(dropout_rng, 1))
        h = self.mlp(self.mlp_norm(x), dropout_rng=fold_rng(dropout_rng, 2))
        x = x + dropout(h, self.dropout_rate, fold_rng(dropout_rng, 3))
        return x, None if cache is None else cache.replace(self_attention=self_kv)
