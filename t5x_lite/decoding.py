"""From a trained model to target tokens: cached decoding (greedy, sampling, beam search), and
teacher-forced scoring of given targets.

Every architecture decodes the same way: each step feeds one token per row at its position,
writes its keys / values into the cache slot of that position, and chooses the next token
from the logits there. The first step feeds the *prompt*'s last token. For encoder-decoders
the prompt is the start token 0 (the inputs are encoded once and the encoder's keys / values
cached for cross-attention). For decoder-only models it is `[0, inputs...]`, the very prefix
of the rows training sees (`batch_format.decoder_only_prompt`), run through the decoder
once beforehand (prefill: bidirectionally with prefix attention, as `prefix_lm`, causally
without, as `language_model`) so that prefix positions see each other; rows' prompts end at
different positions (`end [B]`).
So every row's cache holds the sequence training saw, at the same positions (hence the same
relative position bias).

`encoder_only` models have no decoder and generate nothing token by token: `decode` builds
the rows fine-tuning trains on (the inputs, then `max_length` mask slots,
`batch_format.example_rows`), runs the model once and takes the argmax at every slot (never
the pad id), cut after the first EOS; its score is the sum of those tokens' log-probs. Give
`max_length` the fine-tuning `targets_length`, the slot count the model was trained with.
Only 'greedy' is allowed there.

One `decode` call is one jitted program around a `lax.while_loop` that stops as soon as every
row has finished (EOS). The model goes in as `nnx.split` state, with its graphdef and the
decoding settings static, so jax's compilation cache reuses the program across the calls of a
sweep (same architecture, shapes and settings).
"""
from __future__ import annotations

import dataclasses
import functools
import math

import flax
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils

from t5x_lite import architectures, attention, batch_format
from t5x_lite.config import EOS_ID, PAD_ID
from t5x_lite.errors import require_integer
from t5x_lite.layers import Cache, cache_slots, select_cache_rows
from t5x_lite.models import decoding_mask, make_masks

METHODS = ("greedy", "sample", "beam")


def methods_for(family: str) -> tuple[str, ...]:
    """The methods a family decodes with: greedy only for one that fills its mask slots in one
    forward pass (`batch_format.in_place`: encoder_only), any of METHODS otherwise."""
    return ("greedy",) if batch_format.in_place(family) else METHODS


@flax.struct.dataclass
class DecodeResult:
    """What `decode` returns, one row per input row."""

    tokens: jax.Array  # int32 [B, max_length]: target ids, EOS included, 0 after EOS
    # float32 [B]: sum of the tokens' log-probs (beam: / length penalty, but the raw sum for a
    # row that finished no sequence)
    scores: jax.Array


@dataclasses.dataclass(frozen=True)
class _Settings:
    """Everything static about one decoding program (hashable: part of the jit cache key)."""

    arch: str
    method: str
    max_length: int
    num_beams: int
    alpha: float
    temperature: float
    top_k: int
    top_p: float


@flax.struct.dataclass
class _Prompt:
    """The decoder state before the first step, one row per sequence being decoded."""

    cache: Cache  # slots [N, prompt length + max_length - 1, H, K] per layer
    token: jax.Array  # int32 [N]: the prompt's last token, which the first step feeds
    end: jax.Array  # int32 [N]: its position
    cross_mask: jax.Array | None  # bool [N, 1, 1, Le]: real encoder tokens (encoder-decoders)


def decode(
    model: nnx.Module,
    inputs: jax.Array | np.ndarray,
    *,
    max_length: int,
    arch: str | None = None,
    method: str = "greedy",
    num_beams: int = 4,
    alpha: float = 0.6,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    rng: jax.Array | None = None,
) -> DecodeResult:
    """Decode up to `max_length` target tokens for each row of `inputs`.

    `inputs` is int `[B, Li]`, each row the encoded inputs ending in EOS, right-padded with 0
    (`pad_examples(...)["encoder_input_tokens"]`). `arch` (default `model.arch`) picks the
    prompt attention of decoder-only models: the train step builds an architecture as the one
    whose program it shares (`language_model` as 'prefix_lm').
    `method`: 'greedy'; 'sample' from the model's distribution divided by `temperature`
    (0 = greedy), cut to the `top_k` most likely tokens (0 = all) and to the smallest set
    holding probability `top_p` (nucleus), with the key `rng`; or 'beam' search over
    `num_beams` beams as T5X's beam search (`_beam_search`): finished sequences ranked by
    log-prob / ((5 + length) / 6) ** alpha, T5X's length penalty, whose length counts a
    decoder-only model's prompt. Scores are log-probs under the model itself (temperature 1).
    The pad id 0 is never generated: in the outputs it means "no token", and training never
    has it as a target.
    """
    settings = _check_settings(model, arch, method, max_length, num_beams, alpha, temperature,
                               top_k, top_p)
    if method == "sample" and rng is None:
        raise ValueError("method='sample' needs rng (a jax.random key)")
    if not isinstance(inputs, jax.Array):  # host rows: checked here, where it costs no transfer
        inputs = np.asarray(inputs)
        _check_host_inputs(inputs, model.vocab_size)
    inputs = jnp.asarray(inputs)
    if inputs.ndim != 2 or not jnp.issubdtype(inputs.dtype, jnp.integer):
        raise ValueError(f"inputs must be an integer array [batch, length]; got "
                         f"{inputs.dtype} {inputs.shape}")
    rng = jax.random.key(0) if rng is None else rng  # unused unless sampling
    graphdef, state = nnx.split(model)
    return _decode_program(graphdef, state, inputs.astype(jnp.int32), rng, settings)


def score(model: nnx.Module, batch: dict[str, np.ndarray], *,
          arch: str | None = None) -> np.ndarray:
    """float32 `[B]`: each row's sum of log p(target token) over the positions where the loss
    weights (`decoder_loss_weights`; `encoder_loss_weights` for `encoder_only`) are non-zero
    (weighted by them), teacher-forced in one forward pass.

    `batch` is laid out as `data.pipeline.pad_examples` makes it (the batch format of the
    architecture's family); ranking label words by this score classifies (`t5x_lite.zero_shot`).
    Its arrays may be global arrays whose rows are spread over several processes; every
    process then gets all `B` scores. `arch` (default `model.arch`) as `decode` takes it: a
    `language_model` run's model is built as 'prefix_lm' and is scored causally only when told
    arch='language_model'.
    """
    arch = _check_arch(model, arch)
    required = batch_format.row_keys(architectures.get(arch).family)
    missing = [key for key in required if key not in batch]
    if missing:
        raise ValueError(f"score() needs batch keys {', '.join(required)} for arch={arch!r}; "
                         f"missing {', '.join(missing)}")
    batch = {key: value if isinstance(value, jax.Array) else jnp.asarray(value)
             for key, value in batch.items()}
    graphdef, state = nnx.split(model)
    scores = _score_program(graphdef, state, batch, arch)
    if not scores.is_fully_addressable:  # rows on other processes: gather them all
        scores = multihost_utils.process_allgather(scores, tiled=True)
    return np.asarray(scores)


@functools.partial(jax.jit, static_argnames=("graphdef", "arch"))
def _score_program(graphdef: nnx.GraphDef, state: nnx.State, batch: dict[str, jax.Array],
                   arch: str) -> jax.Array:
    model = nnx.merge(graphdef, state)
    log_probs = jax.nn.log_softmax(model(batch, make_masks(batch, arch)))
    targets_key, weights_key = batch_format.loss_keys(architectures.get(arch).family)
    targets = batch[targets_key][..., None]
    target_log_probs = jnp.take_along_axis(log_probs, targets, axis=-1)[..., 0]
    return jnp.sum(target_log_probs * batch[weights_key], axis=-1)


# ------------------------------------------------------------------------------- checks


def _check_arch(model: nnx.Module, arch: str | None) -> str:
    """`arch` (default `model.arch`), checked against the model's family of architectures."""
    arch = model.arch if arch is None else arch
    family = architectures.names(family=model.architecture.family)
    if arch not in family:
        raise ValueError(f"arch={arch!r} is not allowed for this {type(model).__name__}; "
                         f"choose one of {', '.join(family)}")
    return arch


def _check_host_inputs(inputs: np.ndarray, vocab_size: int) -> None:
    """Ids outside the vocabulary gave NaN scores, and a row padded at its front decoded from
    the wrong prompt (the prompt ends at its count of real tokens)."""
    if inputs.ndim != 2 or not np.issubdtype(inputs.dtype, np.integer):
        return  # said below, for every kind of array
    if inputs.size and not 0 <= inputs.min() <= inputs.max() < vocab_size:
        raise ValueError(f"inputs hold ids from {inputs.min()} to {inputs.max()}; the model's "
                         f"are 0 to {vocab_size - 1}")
    real = inputs != PAD_ID
    padded_in_front = (real[:, 1:] & ~real[:, :-1]).any(axis=1)
    if padded_in_front.any():
        row = int(np.flatnonzero(padded_in_front)[0])
        raise ValueError(f"inputs row {row} has padding (0) before a token; rows must be the "
                         "encoded inputs first, right-padded with 0")


def _check_settings(model: nnx.Module, arch: str | None, method: str, max_length: int,
                    num_beams: int, alpha: float, temperature: float, top_k: int,
                    top_p: float) -> _Settings:
    """Validate `decode`'s arguments, each error naming the argument and what is allowed.
    NumPy integers (a length read off an array) count as the integers they hold."""
    max_length, num_beams, top_k = (int(v) if isinstance(v, np.integer) else v
                                    for v in (max_length, num_beams, top_k))
    if method not in METHODS:
        raise ValueError(f"method={method!r} is not allowed; choose one of "
                         f"{', '.join(map(repr, METHODS))}")
    if method not in methods_for(model.architecture.family):
        raise ValueError(f"method={method!r} is not allowed for arch={model.arch!r}: it fills "
                         "its mask slots in one forward pass; choose 'greedy'")
    require_integer("max_length", max_length, 1)
    require_integer("num_beams", num_beams, 1)
    require_integer("top_k", top_k, 0)
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p={top_p!r} must be in (0, 1]")
    if not 0.0 <= temperature < math.inf:
        raise ValueError(f"temperature={temperature!r} must be finite and >= 0 (0 = greedy)")
    if not 0.0 <= alpha < math.inf:
        raise ValueError(f"alpha={alpha!r} must be finite and >= 0 (0 = no length penalty)")
    return _Settings(_check_arch(model, arch), method, max_length, num_beams, float(alpha),
                     float(temperature), top_k, float(top_p))


# ------------------------------------------------------------------------- the program


@functools.partial(jax.jit, static_argnames=("graphdef", "settings"))
def _decode_program(graphdef: nnx.GraphDef, state: nnx.State, inputs: jax.Array,
                    rng: jax.Array, settings: _Settings) -> DecodeResult:
    model = nnx.merge(graphdef, state)
    if batch_format.in_place(architectures.get(settings.arch).family):
        return _fill_slots(model, inputs, settings)
    prompt = _prefill(model, inputs, settings)
    if settings.method == "beam":
        return _beam_search(model, prompt, settings)
    return _sample(model, prompt, settings, rng)


def _fill_slots(model: nnx.Module, inputs: jax.Array, settings: _Settings) -> DecodeResult:
    """`encoder_only`: the argmax at each of `max_length` mask slots after the inputs, in one
    forward pass (see the module docstring)."""
    family = architectures.get(settings.arch).family
    no_targets = jnp.zeros((inputs.shape[0], 0), inputs.dtype)
    slot_token = batch_format.mask_token(model.vocab_size)
    row = batch_format.example_rows(family, jnp, inputs, no_targets, inputs.shape[1],
                                    settings.max_length, mask_token=slot_token)
    batch = {"encoder_input_tokens": row["encoder_input_tokens"]}
    log_probs = _log_probs(model(batch, make_masks(batch, settings.arch)), model.vocab_size)
    # The slots start after each row's inputs.
    slots = jnp.sum(inputs > 0, axis=1, keepdims=True) + jnp.arange(settings.max_length)
    slot_log_probs = jnp.take_along_axis(log_probs, slots[..., None], axis=1)
    tokens = jnp.argmax(slot_log_probs, axis=-1).astype(jnp.int32)
    token_log_probs = jnp.max(slot_log_probs, axis=-1)
    # Cut after the first EOS: zeros after it, and its score is that of the tokens up to it.
    ended_before = jnp.cumsum(tokens == EOS_ID, axis=1) - (tokens == EOS_ID) > 0
    tokens = jnp.where(ended_before, PAD_ID, tokens)
    return DecodeResult(tokens, jnp.sum(jnp.where(ended_before, 0.0, token_log_probs), axis=1))


def _prefill(model: nnx.Module, inputs: jax.Array, settings: _Settings) -> _Prompt:
    """The cache and the first token to feed: the encoder's keys / values for
    encoder-decoders, the whole prompt's for decoder-only models."""
    batch_size = inputs.shape[0]
    start = jnp.zeros(batch_size, jnp.int32)
    architecture = architectures.get(settings.arch)
    if architecture.family == "encoder_decoder":
        encoder_valid = inputs > 0
        encoder_mask = attention.padding_mask(encoder_valid, encoder_valid)
        encoded = model.encode({"encoder_input_tokens": inputs}, {"encoder_mask": encoder_mask})
        cache = model.init_cache(batch_size, settings.max_length, encoded)
        return _Prompt(cache, start, start, encoder_valid[:, None, None, :])
    # The row up to the position predicting the first target: the inputs shifted right.
    prompt = batch_format.decoder_only_prompt(inputs, room=1)
    tokens = prompt["decoder_input_tokens"]
    end = jnp.sum(inputs > 0, axis=1, dtype=jnp.int32)  # the input's EOS sits here
    cache = model.init_cache(batch_size, tokens.shape[1] + settings.max_length - 1)
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    mask = decoding_mask(settings.arch, positions, cache_slots(cache),
                         jnp.sum(prompt["inputs_mask"], axis=1, dtype=jnp.int32))
    # Slots past a row's prompt get padding's keys here; each is overwritten by the step that
    # first makes it visible. The first step recomputes slot `end` (the same keys / values:
    # that position sees the same slots either way) and gives the first target's logits.
    _, cache = model.extend(tokens, positions, mask, cache, arch=settings.arch)
    return _Prompt(cache, tokens[jnp.arange(batch_size), end], end, None)


def _step(model: nnx.Module, prompt: _Prompt, cache: Cache, tokens: jax.Array,
          positions: jax.Array, arch: str) -> tuple[jax.Array, Cache]:
    """Feed `tokens [N]` at `positions [N]`: logits `[N, vocab]` for the next ones, new cache
    (positions read as `arch` reads them)."""
    mask = decoding_mask(arch, positions[:, None], cache_slots(cache))
    logits, cache = model.extend(tokens[:, None], positions[:, None], mask, cache,
                                 prompt.cross_mask, arch=arch)
    return logits[:, 0], cache


def _sample(model: nnx.Module, prompt: _Prompt, settings: _Settings,
            rng: jax.Array) -> DecodeResult:
    """Greedy decoding or sampling: one token per row and step until EOS or max_length."""
    batch_size = prompt.end.shape[0]

    def unfinished(carry):
        t, _, _, _, done, _ = carry
        return (t < settings.max_length) & ~jnp.all(done)

    def step(carry):
        t, tokens, last, cache, done, scores = carry
        logits, cache = _step(model, prompt, cache, last, prompt.end + t, settings.arch)
        log_probs = _log_probs(logits, model.vocab_size)
        token = jnp.where(done, PAD_ID, _choose(log_probs, settings, jax.random.fold_in(rng, t)))
        token_log_prob = jnp.take_along_axis(log_probs, token[:, None], axis=1)[:, 0]
        scores = scores + jnp.where(done, 0.0, token_log_prob)
        tokens = tokens.at[:, t].set(token)
        done = done | (token == EOS_ID)
        return t + 1, tokens, token, cache, done, scores

    carry = (jnp.int32(0), jnp.zeros((batch_size, settings.max_length), jnp.int32), prompt.token,
             prompt.cache, jnp.zeros(batch_size, bool), jnp.zeros(batch_size, jnp.float32))
    _, tokens, _, _, _, scores = jax.lax.while_loop(unfinished, step, carry)
    return DecodeResult(tokens, scores)


def _log_probs(logits: jax.Array, vocab_size: int) -> jax.Array:
    """Logits `[..., rows]` -> the model's log-probs, with -inf (never chosen) for the pad id
    and for the rows past the vocabulary's `vocab_size` ids (a padded embedding's), which no
    text has."""
    ids = jnp.arange(logits.shape[-1])
    never = (ids == PAD_ID) | (ids >= vocab_size)
    return jnp.where(never, -jnp.inf, jax.nn.log_softmax(logits))


def _choose(log_probs: jax.Array, settings: _Settings, key: jax.Array) -> jax.Array:
    """int32 `[N]`: the next token of each row from the model's `log_probs [N, vocab]`."""
    if settings.method == "greedy" or settings.temperature == 0.0:
        return jnp.argmax(log_probs, axis=-1).astype(jnp.int32)
    logits = log_probs / settings.temperature
    if settings.top_k:
        kth_best = jax.lax.top_k(logits, min(settings.top_k, logits.shape[-1]))[0][:, -1:]
        logits = jnp.where(logits >= kth_best, logits, -jnp.inf)
    if settings.top_p < 1.0:
        # Keep the most likely tokens while the probability before them is below top_p (the
        # most likely one always stays).
        descending = -jnp.sort(-logits, axis=-1)
        probs = jax.nn.softmax(descending, axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        cutoff = jnp.min(jnp.where(mass_before < settings.top_p, descending, jnp.inf), axis=-1,
                         keepdims=True)
        logits = jnp.where(logits >= cutoff, logits, -jnp.inf)
    return jax.random.categorical(key, logits).astype(jnp.int32)


def _beam_search(model: nnx.Module, prompt: _Prompt, settings: _Settings) -> DecodeResult:
    """Beam search as T5X's `decoding.beam_search`: `num_beams` live beams and the `num_beams`
    best finished sequences.

    Each step extends every live beam by every token and keeps the 2k most likely candidates.
    Every one of the 2k that ends in EOS joins the finished set, scored by its log-probability
    over the length penalty ((5 + length) / 6) ** alpha, where for a decoder-only model the
    length counts its prompt too (T5X's `initial_index`); the k most likely that do not end
    stay live. A row is done when no live beam can still beat its worst finished score
    (log-probs only fall, and the length penalty is at most that of max_length). A row with no
    finished sequence after max_length steps returns its most likely live one and that raw
    log-probability, as T5X does.
    """
    k, max_length = settings.num_beams, settings.max_length
    batch_size = prompt.end.shape[0]
    copies = jnp.repeat(jnp.arange(batch_size), k)  # row b * k + beam
    beams = jax.tree.map(lambda x: x[copies], prompt.replace(cache=None)).replace(
        cache=select_cache_rows(prompt.cache, copies))
    # Tokens before the first generated one: 0 for an encoder-decoder's decoder.
    prompt_length = prompt.end.astype(jnp.float32)[:, None]

    def length_penalty(length):
        return ((5.0 + prompt_length + length) / 6.0) ** settings.alpha

    def unfinished(carry):
        t, _, live_log_probs, _, finished_scores, _, _ = carry
        best_reachable = live_log_probs[:, :1] / length_penalty(max_length)  # [B, 1]
        return (t < max_length) & jnp.any(best_reachable > finished_scores[:, -1:])

    def step(carry):
        t, live_tokens, live_log_probs, finished_tokens, finished_scores, last, cache = carry
        logits, cache = _step(model, beams, cache, last, beams.end + t, settings.arch)
        vocab = logits.shape[-1]
        log_probs = live_log_probs[..., None] + _log_probs(logits, model.vocab_size).reshape(
            batch_size, k, vocab)
        top_log_probs, top_index = jax.lax.top_k(log_probs.reshape(batch_size, k * vocab), 2 * k)
        parent, token = top_index // vocab, top_index % vocab
        top_tokens = _take_rows(live_tokens, parent).at[:, :, t].set(token)

        ends = token == EOS_ID
        ended_scores = jnp.where(ends, top_log_probs / length_penalty(t + 1), -jnp.inf)
        finished_scores, (finished_tokens,) = _keep_best(
            jnp.concatenate([finished_scores, ended_scores], axis=1), k,
            jnp.concatenate([finished_tokens, top_tokens], axis=1))

        continuing = jnp.where(ends, -jnp.inf, top_log_probs)
        live_log_probs, (live_tokens, parent, token) = _keep_best(
            continuing, k, top_tokens, parent, token)
        rows = (jnp.arange(batch_size)[:, None] * k + parent).reshape(-1)
        cache = select_cache_rows(cache, rows, cross_attention=False)
        return (t + 1, live_tokens, live_log_probs, finished_tokens, finished_scores,
                token.reshape(-1), cache)

    no_tokens = jnp.zeros((batch_size, k, max_length), jnp.int32)
    # Beams start as k copies of the prompt; only the first is live, so step 0's candidates
    # are distinct.
    live_log_probs = jnp.full((batch_size, k), -jnp.inf).at[:, 0].set(0.0)
    no_scores = jnp.full((batch_size, k), -jnp.inf)
    carry = (jnp.int32(0), no_tokens, live_log_probs, no_tokens, no_scores, beams.token,
             beams.cache)
    _, live_tokens, live_log_probs, finished_tokens, finished_scores, _, _ = jax.lax.while_loop(
        unfinished, step, carry)
    any_finished = finished_scores[:, 0] > -jnp.inf
    return DecodeResult(jnp.where(any_finished[:, None], finished_tokens[:, 0], live_tokens[:, 0]),
                        jnp.where(any_finished, finished_scores[:, 0], live_log_probs[:, 0]))


def _take_rows(x: jax.Array, index: jax.Array) -> jax.Array:
    """`x [B, n, ...]` at `index [B, m]` along axis 1 -> `[B, m, ...]`."""
    return jax.vmap(lambda rows, i: rows[i])(x, index)


def _keep_best(scores: jax.Array, k: int, *arrays: jax.Array) -> tuple[jax.Array, tuple]:
    """The `k` best of `scores [B, n]` (best first) and the matching entries of each
    `arrays[i] [B, n, ...]`."""
    best, index = jax.lax.top_k(scores, k)
    return best, tuple(_take_rows(x, index) for x in arrays)
