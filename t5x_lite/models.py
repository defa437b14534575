"""The networks of the architectures in `t5x_lite.architectures`, chosen by `config.model.arch`.

Each architecture's record says which stacks to build (depth, cross-attention, shared layers)
and which family of network runs them: `EncoderDecoder` (`encoder_decoder`, `_shared`, `_half`
of Table 2) or `OneStack`, the LM head on a single stack: a decoder (`language_model`,
`prefix_lm`: the same parameters; only the mask from `make_masks` differs) or an encoder
(`encoder_only`).

`make_masks(batch, arch)` is the only place where the architecture decides what a position
may see (`decoding_mask`, beside it, gives its decoder's rule over a decoding cache); a model
called without masks calls it. (The train step builds an architecture as the
one whose program it shares, `language_model` as `prefix_lm`, and ANDs `inputs_mask` with a
traced flag, so they share one compilation; with the flag off, the prefix mask is the causal
mask.) `model(batch)` returns float32 logits `[B, target_len, vocab]` for encoder-decoders and
`[B, inputs_len + target_len, vocab]` for decoder-only and encoder-only models.

Incremental decoding (`t5x_lite.decoding`) uses two more methods every architecture with a
decoder shares (not `encoder_only`, whose mask slots `decoding` fills in one forward pass):
`init_cache` (empty self-attention slots, plus the encoder's cross-attention keys / values)
and `extend` (run the decoder on the next tokens against the cache).
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from t5x_lite import architectures, attention
from t5x_lite.layers import (
    Cache,
    Embed,
    LayerCache,
    LMHead,
    RMSNorm,
    RelativePositionBias,
    TransformerLayer,
    cache_slots,
    dropout,
    fold_rng,
)
from t5x_lite.settings import Model, model_settings

Batch = dict[str, jax.Array]


def make_masks(batch: Batch, arch: str,
               prefix_attention: jax.Array | None = None) -> dict[str, jax.Array]:
    """The attention masks (bool `[B, 1, Lq, Lk]`) the architecture `arch` uses on `batch`.

    One `{role}_mask` per stack of the record: an encoder's is bidirectional (padding,
    segments), a decoder's causal or, with prefix attention, bidirectional over
    `inputs_mask` (and padding, segments); a stack that cross-attends also gets
    `cross_mask`. So the encoder-decoders get `encoder_mask`, `decoder_mask` and
    `cross_mask`, the decoder-only models `decoder_mask`, `encoder_only` `encoder_mask`. A
    decoder position is padding iff `decoder_target_tokens` is present and 0 there (Hugging
    Face T5 has no decoder padding mask, so without targets every decoder position is valid);
    an encoder position iff its input token is 0.

    A stack whose relative-position buckets follow prefix attention (`Stack.bidirectional`
    None: the decoder-only models) also gets `{role}_bidirectional_positions`, its bucket rule.
    `prefix_attention`: a traced bool scalar for an architecture with prefix attention whose
    program another runs without it (language_model runs prefix_lm's): False switches off
    both the prefix mask (the causal mask remains) and the bidirectional buckets.
    """
    architecture = architectures.get(arch)
    prefix = architecture.prefix_attention
    if prefix and prefix_attention is not None:
        prefix = prefix_attention
    valid, segments, masks = {}, {}, {}
    for stack in architecture.stacks:
        role = stack.role
        tokens = batch[f"{role}_input_tokens"]
        if role == "encoder":
            valid[role] = tokens > 0
            visibility = None
        else:
            targets = batch.get("decoder_target_tokens")
            valid[role] = jnp.ones(tokens.shape, bool) if targets is None else targets > 0
            visibility = (attention.prefix_lm_mask(batch["inputs_mask"] & prefix)
                          if architecture.prefix_attention
                          else attention.causal_mask(tokens.shape[1]))
        if stack.bidirectional is None:  # its bucket rule follows this call's prefix flag
            masks[f"{role}_bidirectional_positions"] = architecture.bidirectional_positions(
                stack, prefix)
        segments[role] = batch.get(f"{role}_segment_ids")
        masks[f"{role}_mask"] = attention.combine_masks(
            visibility, _padding_and_segments(valid[role], segments[role]))
        if stack.cross_attention:
            masks["cross_mask"] = attention.cross_attention_mask(
                valid[role], valid["encoder"], segments[role], segments["encoder"])
    return masks


def decoding_mask(arch: str, query_positions: jax.Array, cache_length: int,
                  prefix_length: jax.Array | None = None) -> jax.Array:
    """`bool [B, 1, Lq, cache_length]`: `make_masks`' decoder rule over the slots of a decoding
    cache (slot j holds position j) for queries at `query_positions [B, Lq]`: causal, and for
    an architecture with prefix attention, the prompt's `prefix_length [B]` positions seen
    whole by the queries inside it (None: queries past every prefix, a decoding step)."""
    prefix = prefix_length if architectures.get(arch).prefix_attention else None
    return attention.cache_mask(query_positions, cache_length, prefix)


def _padding_and_segments(valid: jax.Array, segments: jax.Array | None) -> jax.Array:
    """Self-attention mask `[B, 1, L, L]`: real tokens see the real tokens of their segment."""
    packing = None if segments is None else attention.segment_mask(segments, segments)
    return attention.combine_masks(attention.padding_mask(valid, valid), packing)


def _positions(batch: Batch, stack: str, tokens_key: str) -> jax.Array:
    """Token positions for the relative position bias: `{stack}_positions [B, L]` when the
    batch has them (packed rows; blank infilling's explicit `decoder_positions`), else
    `arange(L)`."""
    positions = batch.get(f"{stack}_positions")
    return jnp.arange(batch[tokens_key].shape[1]) if positions is None else positions


def _run_layer(layer: TransformerLayer, x: jax.Array, mask: jax.Array | None,
               bias: jax.Array | None, encoded: jax.Array | None, cross_mask: jax.Array | None,
               dropout_rng: jax.Array | None, cache: LayerCache | None,
               cache_start: jax.Array | None) -> tuple[jax.Array, LayerCache | None]:
    return layer(x, mask, bias, encoded=encoded, cross_mask=cross_mask, dropout_rng=dropout_rng,
                 cache=cache, cache_start=cache_start)


# `model.remat`: keep only each layer's input for the backward pass and recompute the rest,
# trading about one extra forward pass for activation memory that no longer grows with depth.
_run_layer_remat = nnx.remat(_run_layer)


class _DrawCounter:
    """Stands in for `nnx.Rngs` while a layer is built abstractly: counts the parameter draws
    (`rngs.params()` calls; every random parameter is one, see `layers.normal_param`)."""

    def __init__(self) -> None:
        self.draws = 0

    def params(self) -> jax.Array:
        self.draws += 1
        return jax.random.key(0)


def _layers_drawn_in_a_loop(
    make_layer: Callable[[nnx.Rngs], TransformerLayer], num_layers: int, rngs: nnx.Rngs
) -> TransformerLayer:
    """`_stacked([make_layer(rngs) for _ in range(num_layers)])` made by one `jax.lax.map`
    over the layers, whose body draws one layer: the same values, bit for bit, and the same
    `rngs` state afterwards.

    Layer i's j-th draw takes the key `fold_in(key, count + i * draws + j)` of the `params`
    stream (`key`, `count` its state on entry, `draws` a layer's number of draws), as the
    Python loop would, and the body computes each draw as the loop does, on the same shapes.

    Why: XLA compiles every random draw of a program apart, at a cost that grows faster than
    their number; the Python loop put one per parameter of each layer in the init program
    (196 at T5-base, compiled in 16-20 s on a CPU), the loop of the program one per
    parameter of a layer (19: 2-4 s). It also holds one layer's random bits at a time.
    """
    counter = _DrawCounter()  # stands in for rngs in an abstract build: the layers' structure
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: make_layer(counter)))
    stream = rngs.params
    key, start = stream.key[...], stream.count[...]

    def build(count: jax.Array) -> nnx.State:
        layer_rngs = nnx.Rngs(params=key)
        layer_rngs.params.count[...] = count
        return nnx.state(make_layer(layer_rngs))

    per_layer = jnp.uint32(counter.draws)
    states = jax.lax.map(build, start + per_layer * jnp.arange(num_layers, dtype=jnp.uint32))
    stream.count[...] = start + per_layer * num_layers
    return _with_layers_axis(nnx.merge(graphdef, states), True)


def _with_layers_axis(layer: TransformerLayer, stacked: bool) -> TransformerLayer:
    """`layer` with the logical axis name `layers` put in front of each parameter's axes
    (`stacked`: its parameters gained a leading layer axis) or taken off (they lost it)."""
    for _, variable in nnx.iter_graph(layer):
        if isinstance(variable, nnx.Param):
            axes = variable.get_metadata()["logical_axes"]
            variable.set_metadata(logical_axes=("layers", *axes) if stacked else axes[1:])
    return layer


def _stacked(layers: list[TransformerLayer]) -> TransformerLayer:
    """One layer whose parameters hold `layers`' parameters stacked on a new leading axis,
    with the logical axis name `layers` in front of their others."""
    states = [nnx.state(layer) for layer in layers]
    states = jax.tree.map(lambda *xs: jnp.stack(xs), *states)
    return _with_layers_axis(nnx.merge(nnx.graphdef(layers[0]), states), True)


def _unstacked(layer: TransformerLayer, num_layers: int) -> list[TransformerLayer]:
    """The inverse of `_stacked`: layer i holds slice i of `layer`'s stacked parameters."""
    graphdef, states = nnx.split(layer)
    return [_with_layers_axis(nnx.merge(graphdef, jax.tree.map(lambda x, i=i: x[i], states)),
                              False) for i in range(num_layers)]


class TransformerStack(nnx.Module):
    """Embedded tokens -> dropout -> layers -> final norm -> dropout.

    One relative position bias per stack, computed once per forward and shared by all its
    layers; `bidirectional` picks the bucket rule (not visibility: that is the mask).
    `share_with` makes layer i reuse `share_with.layers[i]`'s self-attention and MLP.

    Scanned (`model.scan_layers`), `layers` is one layer of stacked parameters that the
    forward runs with `jax.lax.scan`: the same computation, compiled once instead of once per
    layer. `scan()` stacks a list of layers (a model built unscanned) that way.
    """

    def __init__(
        self,
        cfg: Model,
        num_layers: int,
        *,
        bidirectional: bool,
        cross_attention: bool,
        share_with: TransformerStack | None = None,
        rngs: nnx.Rngs,
    ):
        dtype = jnp.dtype(cfg.dtype)
        self.relpos = RelativePositionBias(cfg.relpos_buckets, cfg.relpos_max_distance,
                                           cfg.num_heads, cfg.d_model, dtype=dtype, rngs=rngs)
        layers = _layers_drawn_in_a_loop(
            lambda layer_rngs: TransformerLayer(cfg, cross_attention=cross_attention,
                                                shared=share_with is not None, rngs=layer_rngs),
            num_layers, rngs)
        # Scanned, the stacked parameters are the layers; unscanned, each layer gets its slice.
        self.layers = layers if cfg.scan_layers else nnx.List(_unstacked(layers, num_layers))
        if share_with is not None:
            self._share(share_with)
        self.final_norm = RMSNorm(cfg.d_model, epsilon=cfg.layer_norm_epsilon)
        self.bidirectional = bidirectional
        self.dropout_rate = cfg.dropout_rate
        self.remat = cfg.remat

    def scan(self, share_with: TransformerStack | None = None) -> None:
        """Stack this stack's layers for `jax.lax.scan` (same values, same computation).

        `share_with`: the already scanned stack whose self-attention and MLP these layers reuse
        (`encoder_decoder_shared`); the sharing survives as one stacked parameter set.
        """
        if self.scanned:
            raise ValueError("this stack's layers are already scanned")
        self.layers = _stacked(list(self.layers))
        if share_with is not None:
            self._share(share_with)

    def _share(self, other: TransformerStack) -> None:
        """Make layer i reuse the self-attention and MLP of `other`'s layer i; scanned (and
        `other` too), the stacked layer reuses `other`'s stacked one."""
        if self.scanned:
            self.layers.share(other.layers)
        else:
            for layer, its in zip(self.layers, other.layers):
                layer.share(its)

    @property
    def scanned(self) -> bool:
        """Whether `layers` is one layer of stacked parameters (`scan`) rather than a list."""
        return isinstance(self.layers, TransformerLayer)

    @property
    def num_layers(self) -> int:
        if self.scanned:
            return self.layers.self_attention.query.shape[0]
        return len(self.layers)

    def __call__(
        self,
        x: jax.Array,
        positions: jax.Array,
        mask: jax.Array | None,
        *,
        encoded: jax.Array | None = None,
        cross_mask: jax.Array | None = None,
        dropout_rng: jax.Array | None = None,
        cache: Cache | None = None,
        bidirectional: bool | jax.Array | None = None,
    ) -> tuple[jax.Array, Cache | None]:
        """`x [B, L, D]` embedded tokens, `positions [B, L]` or `[L]` -> (`[B, L, D]`, cache).

        With `cache` (from `init_cache`), `positions [B, L]` are also the cache slots the
        tokens' keys / values go to, keys sit at positions `arange(Lc)`, and `mask` is
        `[B, 1, L, Lc]`; the updated cache is returned (None without one). `bidirectional`:
        the bucket rule of this call (`make_masks`' `{role}_bidirectional_positions`), else
        the one the stack was built with.
        """
        rule = self.bidirectional if bidirectional is None else bidirectional
        if cache is None:
            bias = self.relpos(positions, positions, rule)
            cache_start = None
        else:
            bias = self.relpos(positions, jnp.arange(cache_slots(cache)), rule)
            cache_start = positions[:, 0]
        # Dropout sites: 0 the embedded input, 1 the final norm's output, 2 + i layer i.
        x = dropout(x, self.dropout_rate, fold_rng(dropout_rng, 0))
        run_layer = _run_layer_remat if self.remat else _run_layer
        if self.scanned:
            graphdef, params = nnx.split(self.layers)
            layer_rngs = None if dropout_rng is None else jax.vmap(fold_rng, (None, 0))(
                dropout_rng, jnp.arange(self.num_layers) + 2)

            def body(x, per_layer):
                layer_params, layer_rng, layer_cache = per_layer
                return run_layer(nnx.merge(graphdef, layer_params), x, mask, bias, encoded,
                                 cross_mask, layer_rng, layer_cache, cache_start)

            x, cache = jax.lax.scan(body, x, (params, layer_rngs, cache))
        else:
            layer_caches = [None] * self.num_layers if cache is None else list(cache)
            for i, layer in enumerate(self.layers):
                x, layer_caches[i] = run_layer(layer, x, mask, bias, encoded, cross_mask,
                                               fold_rng(dropout_rng, i + 2), layer_caches[i],
                                               cache_start)
            cache = None if cache is None else layer_caches
        x = dropout(self.final_norm(x), self.dropout_rate, fold_rng(dropout_rng, 1))
        return x, cache

    def init_cache(self, batch_size: int, length: int,
                   encoded: jax.Array | None = None) -> Cache:
        """An empty cache of `length` slots per layer; with `encoded [B, Le, D]` (a decoder
        with cross-attention) each layer's encoder keys / values, computed once here."""
        def layer_cache(layer: TransformerLayer) -> LayerCache:
            return LayerCache(
                layer.self_attention.empty_cache(batch_size, length),
                None if encoded is None else layer.cross_attention.keys_values(encoded),
            )

        if self.scanned:
            graphdef, params = nnx.split(self.layers)
            return jax.vmap(lambda p: layer_cache(nnx.merge(graphdef, p)))(params)
        return [layer_cache(layer) for layer in self.layers]


class _T5Model(nnx.Module):
    """What every architecture has: the token embedding, the output projection, and the
    stacks its record lists, each an attribute named by its role (`encoder`, `decoder`)."""

    def __init__(self, cfg: Model, rngs: nnx.Rngs):
        dtype = jnp.dtype(cfg.dtype)
        self.arch = cfg.arch
        self.d_model = cfg.d_model
        # The ids past the vocabulary's (padding rows) are never inputs; decoding never picks
        # them (`decoding`), though the logits, like transformers', cover every row.
        self.vocab_size = cfg.vocab_size
        self.token_embedder = Embed(cfg.num_embeddings, cfg.d_model, dtype=dtype, rngs=rngs)
        self.lm_head = (None if cfg.tie_embeddings
                        else LMHead(cfg.d_model, cfg.num_embeddings, dtype=dtype, rngs=rngs))
        # In the record's order, which is the order their parameters are drawn in.
        for stack in self.architecture.stacks:
            setattr(self, stack.role, TransformerStack(
                cfg, stack.num_layers(cfg),
                bidirectional=self.architecture.bidirectional_positions(stack),
                cross_attention=stack.cross_attention,
                share_with=_shared_stack(self, stack), rngs=rngs))

    @property
    def architecture(self) -> architectures.Architecture:
        """The record of the architecture this network was built as."""
        return architectures.get(self.arch)

    def logits(self, x: jax.Array) -> jax.Array:
        """Final hidden states `[B, L, D]` -> float32 logits `[B, L, vocab]` (with bf16
        activations, accumulated in float32 and never rounded to bf16, as T5X's: rounded,
        two tokens' logits often tie, which lifts the token accuracy and leaves greedy
        decoding's choice to the token index)."""
        if self.lm_head is None:
            # Tied embeddings: T5 rescales so the logits do not grow with d_model.
            return self.token_embedder.attend(x * self.d_model**-0.5)
        return self.lm_head(x)

    def run_stack(self, role: str, batch: Batch, masks: dict[str, jax.Array],
                  dropout_rng: jax.Array | None = None, **context: jax.Array) -> jax.Array:
        """`batch[f"{role}_input_tokens"] [B, L]` embedded and run through the `role` stack
        under `masks[f"{role}_mask"]` -> its final hidden states `[B, L, D]`. context: the
        decoder's `encoded` and `cross_mask`. Each stack's dropout key folds in its role's
        index in `architectures.ROLES` (encoder 0, decoder 1)."""
        tokens_key = f"{role}_input_tokens"
        site = architectures.ROLES.index(role)
        x, _ = getattr(self, role)(
            self.token_embedder(batch[tokens_key]), _positions(batch, role, tokens_key),
            masks[f"{role}_mask"], dropout_rng=fold_rng(dropout_rng, site),
            bidirectional=masks.get(f"{role}_bidirectional_positions"), **context)
        return x

    def init_cache(self, batch_size: int, length: int,
                   encoded: jax.Array | None = None) -> Cache:
        """The decoder's empty decoding cache of `length` positions (see
        `TransformerStack.init_cache`); encoder-decoders pass the encoder output `encoded`."""
        return self.decoder.init_cache(batch_size, length, encoded)

    def extend(
        self,
        tokens: jax.Array,
        positions: jax.Array,
        mask: jax.Array,
        cache: Cache,
        cross_mask: jax.Array | None = None,
        arch: str | None = None,
    ) -> tuple[jax.Array, Cache]:
        """Run the decoder on the next `tokens [B, L]` at `positions [B, L]` (also their cache
        slots), attending over the cache with `mask [B, 1, L, Lc]` (and over the cached encoder
        output with `cross_mask [B, 1, L, Le]`), reading positions as `arch` (default the
        model's own: language_model runs prefix_lm's network) does. Returns float32 logits
        `[B, L, vocab]` and the updated cache."""
        architecture = self.architecture if arch is None else architectures.get(arch)
        x, cache = self.decoder(
            self.token_embedder(tokens), positions, mask, cross_mask=cross_mask, cache=cache,
            bidirectional=architecture.bidirectional_positions(architecture.stacks[-1]))
        return self.logits(x), cache


def _shared_stack(model: _T5Model, stack: architectures.Stack) -> TransformerStack | None:
    """The stack of `model` whose layers `stack` reuses, if any."""
    return None if stack.shares_layers_of is None else getattr(model, stack.shares_layers_of)


class EncoderDecoder(_T5Model):
    """The `encoder_decoder` family: an encoder stack and a cross-attending decoder stack.

    Where the decoder shares the encoder's layers (`encoder_decoder_shared`), the split state
    lists each shared block once, under whichever of the two paths NNX reaches first
    (`decoder/layers/i/...`, alphabetical order).
    """

    def encode(
        self, batch: Batch, masks: dict[str, jax.Array], dropout_rng: jax.Array | None = None
    ) -> jax.Array:
        """`batch['encoder_input_tokens'] [B, Le]` -> encoder output `[B, Le, D]`."""
        return self.run_stack("encoder", batch, masks, dropout_rng)

    def decode(
        self,
        encoded: jax.Array,
        batch: Batch,
        masks: dict[str, jax.Array],
        dropout_rng: jax.Array | None = None,
    ) -> jax.Array:
        """Encoder output `[B, Le, D]` and `batch['decoder_input_tokens'] [B, Ld]` ->
        float32 logits `[B, Ld, vocab]`."""
        return self.logits(self.run_stack("decoder", batch, masks, dropout_rng, encoded=encoded,
                                          cross_mask=masks["cross_mask"]))

    def __call__(
        self,
        batch: Batch,
        masks: dict[str, jax.Array] | None = None,
        *,
        dropout_rng: jax.Array | None = None,
    ) -> jax.Array:
        """Float32 logits `[B, Ld, vocab]`; `masks` default to `make_masks(batch, arch)`."""
        masks = make_masks(batch, self.arch) if masks is None else masks
        return self.decode(self.encode(batch, masks, dropout_rng), batch, masks, dropout_rng)


class OneStack(_T5Model):
    """The families of one stack, read out at every position of its own input (the mask
    decides what each position sees): `decoder_only`, a decoder without cross-attention
    attending causally or, over `inputs_mask`, bidirectionally; `encoder_only` (BERT-style),
    an encoder attending bidirectionally over the real tokens, which has nothing to decode
    incrementally (`decoding.decode` predicts its mask slots in one forward pass)."""

    def __call__(
        self,
        batch: Batch,
        masks: dict[str, jax.Array] | None = None,
        *,
        dropout_rng: jax.Array | None = None,
    ) -> jax.Array:
        """Float32 logits `[B, L, vocab]` for the stack's `{role}_input_tokens [B, L]`."""
        masks = make_masks(batch, self.arch) if masks is None else masks
        role = self.architecture.stacks[0].role
        return self.logits(self.run_stack(role, batch, masks, dropout_rng))


def network_class(architecture: architectures.Architecture) -> type[_T5Model]:
    """The network an architecture's stacks make: an encoder and a cross-attending decoder are
    an `EncoderDecoder`, a single stack (whatever its role) is a `OneStack`."""
    if len(architecture.stacks) == 1:
        return OneStack
    if [stack.role for stack in architecture.stacks] == ["encoder", "decoder"] and (
            architecture.stacks[1].cross_attention):
        return EncoderDecoder
    raise ValueError(f"architecture {architecture.name!r}: no network has the stacks "
                     f"{[stack.role for stack in architecture.stacks]}")


def build_model(model: Model | ml_collections.ConfigDict, rngs: nnx.Rngs) -> nnx.Module:
    """Build the network of the model settings `model` (a `config.model` section is read and
    validated first: a `ConfigError` before any array exists)."""
    cfg = model_settings(model)
    # Scanned or not, each stack draws its layers in one loop (`_layers_drawn_in_a_loop`), so
    # a seed gives the same parameters either way.
    return network_class(architectures.get(cfg.arch))(cfg, rngs)


def scan_layers(model: nnx.Module) -> nnx.Module:
    """Stack the layers of `model`, built unscanned (e.g. by `convert.from_hf_t5`), for
    `jax.lax.scan` in place and return it: the layout `build_model` gives a config with
    `model.scan_layers`, which its checkpoints use.

    Same parameter values and outputs; the compiled program holds one layer per stack instead
    of `num_layers`, so compile time stops growing with depth.
    """
    for stack in model.architecture.stacks:  # a shared stack after the one it reuses
        getattr(model, stack.role).scan(share_with=_shared_stack(model, stack))
    return model
