"""The T5 paper's pre-training objectives as one jittable function of (raw tokens, spec, rng).

Corruption runs on the device inside the jitted train step. The objective, the corruption
rate and the span length live in an `ObjectiveSpec` of traced arrays, so changing them
changes data, not the compiled program; only the `BatchLayout` (static shapes, and the
objectives of its grid, the only ones the program compiles) is baked in.

    layout = layout_for(points, "encoder_decoder", vocab_size, num_sentinels)  # host, once
    spec = spec_from_config(config.objective)                                 # host, per point
    batch = corrupt(raw_tokens, spec, rng, layout)                            # device, jitted

This module is the objectives' definitions and their device code, and it registers each one's
record (`t5x_lite.objective_registry`: its encoder and what the rest of the library reads about
it) at its end, in the order of their ids; the host side (the spec, the layout, T5's length
arithmetic, the checks against a config) is `t5x_lite.objective_layout`, re-exported here. A
researcher's own objective is a record registered from a file of theirs, its encoder built from
`pack_with_eos`, `packed_width` and `no_noise` (README, "Adding an architecture or an
objective").

Objectives (Raffel et al. 2020, Tables 4 to 7), for raw tokens x_1..x_n:
- iid_denoising, the paper's baseline (section 3.1.4, Figure 2): each token is noise
  independently with probability noise_density (`iid_noise_mask`); the i-th maximal run of noise
  becomes the sentinel <extra_id_i> in the inputs; targets are, for each run in order, its
  sentinel and its tokens, then the final sentinel <extra_id_k> (k runs). Inputs
  "Thank you <X> me to your party <Y> week." give targets "<X> for inviting <Y> last <Z>".
  T5's code numbers the target sentinels by the clean runs instead, which misaligns inputs and
  targets whenever a sequence starts with noise; we follow the paper. mean_noise_span_length
  is ignored.
- span_corruption: noise spans (`random_spans_noise_mask`: exactly round(n * noise_density)
  noise tokens in spans of the given mean length) become one unique sentinel each in the
  inputs; targets are the dropped spans, each led by its sentinel (T5's code, no final
  sentinel). Mean span length 1 is NOT the i.i.d. objective: it makes every noise token its
  own span, never two adjacent (while the clean tokens can keep them apart: with more spans
  than clean tokens, e.g. density 0.8, the mask merges some, where T5's fails).
- drop_corrupted_tokens: i.i.d. noise as in iid_denoising; noise tokens are removed from the
  inputs; targets are the noise tokens in order.
- bert_style: i.i.d. noise; each noise token becomes the mask token, or with
  probability `random_token_fraction` (paper: 0.1) a random real token (never a sentinel, which
  T5's `noise_token_to_random_token` may draw); targets = original.
- mass_style: bert_style without random tokens (every noise token becomes the mask token).
- deshuffling: inputs are the tokens in random order; targets = original.
- prefix_lm: a random split point; inputs = prefix, targets = continuation.
  These two read one document's segment per example (`within_document`; T5's prefix_lm.gin
  and all_permute.gin do not concatenate documents), the others windows of the stream.
- lm: no inputs (an encoder-decoder's encoder gets a lone EOS); targets = the whole span.

BART's noising functions (Lewis et al. 2019, arXiv 1910.13461, section 2.2 and Table 1;
`t5x_lite.bart_noising`); "the decoder reconstructs the document": each one's targets are the
original x_1..x_n + EOS. m = ceil(n * noise_density) tokens are corrupted, counted as fairseq's
`DenoisingDataset` counts them (float32; fairseq's `mask` ratio is noise_density):
- token_masking: "following BERT, random tokens are sampled and replaced with [MASK]
  elements": exactly m positions, uniformly without replacement, become the mask token
  (mass_style with fairseq's exact count instead of T5's i.i.d. noise; random_token_fraction
  is ignored, as the paper's words mask only; the fairseq command its maintainers give for
  BART-large, fairseq#1899, sets `--mask-random 0.1` and `--poisson-lambda 3.5`).
- token_deletion: "random tokens are deleted from the input; ... the model must decide which
  positions are missing inputs": the same m positions (the same draw: one rng masks and deletes
  the same tokens) are removed.
- text_infilling: "a number of text spans are sampled, with span lengths drawn from a Poisson
  distribution (lambda = 3); each span is replaced with a single [MASK] token; 0-length spans
  correspond to the insertion of [MASK] tokens". lambda = mean_noise_span_length (3, the
  paper's, by default). Span lengths are drawn until they cover m tokens, the last cut to the
  budget (fairseq's `add_whole_word_mask` with `replace_length=1`); the spans and the clean
  tokens are interleaved uniformly at random, so spans never overlap and exactly m tokens are
  noise (fairseq draws distinct span starts and lets spans that overlap merge and spans that
  reach the document's end stop there, so it masks fewer: 26.9 % of the tokens on average at
  n = 511, noise_density 0.3 and lambda 3, by a transcription of its code, against 30 % here).
- document_rotation: "a token is chosen uniformly at random, and the document is rotated so
  that it begins with that token" (any of the n with probability 1/n, the first included: the
  paper's words; fairseq's `add_rolling_noise` draws its offset from n + 1 values of which two
  leave the document as it is, so it stays unrotated with probability 2/(n + 1)); no noise
  mask, noise_density is ignored.
- sentence_permutation: "a document is divided into sentences based on full stops, and these
  sentences are shuffled in a random order": the chunk's sentences (read off the vocabulary's
  pieces, `bart_noising.sentence_ends`; the layout carries them: `BatchLayout.with_sentences`)
  in a uniformly random order; no noise mask, noise_density is ignored.
- text_infilling_permutation (Table 1's "text infilling + sentence permutation"): the sentences
  permuted as by sentence_permutation (the same draw), then text infilling of the permuted
  tokens (its spans as text_infilling draws them with the same rng): fairseq's order
  (`DenoisingDataset.__getitem__` permutes, then masks). The noise mask is given at the raw
  tokens' own positions.

UL2's mixture of denoisers (Tay et al. 2022, arXiv 2205.05131, sections 3.1 and 3.2;
`t5x_lite.ul2`): `ul2` draws one denoiser per example from `objective.ul2_denoisers`, a list
of (kind, noise_density, mean_noise_span_length, share): R- and X-denoisers are span_corruption
at their own rate and mean span, the S-denoiser a prefix LM whose target (the one span that
ends the text) has a length uniform over [1, n - k_min], k_min as T5's
`random_prefix_noise_mask` keeps (mean about r n; at r = 0.5 exactly prefix_lm); the inputs start with the denoiser's mode token ([NLU], [NLG],
[S2S]: the last three sentinels, `batch_format.mode_token`, which span corruption then leaves
alone). objective.noise_density and mean_noise_span_length are ignored. The mixture is part of
the layout (`BatchLayout.denoisers`): the grid's ul2 points share one.

GLM's autoregressive blank infilling (Du et al. 2021, arXiv 2103.10360, sections 2.1 and 2.2;
`t5x_lite.glm`), for prefix_lm only (`Objective.needs_prefix_attention`): `blank_infilling`
draws spans of Poisson(lambda = mean_noise_span_length) lengths (>= 1) until at least
ceil(n * noise_density) tokens are masked; the inputs (Part A) are the text with each span
replaced by one mask token, the targets (Part B) the spans in a random order, each followed by
GLM's [END], `<extra_id_1>` (not EOS: a span may cover a document's closing EOS; its [START] is
the token a span's first position is fed, Part A's EOS or the previous [END]). Its rows carry
explicit positions, `decoder_positions` (Part B's tokens at their span's mask position plus
their offset in it: `batch_format.POSITIONS_KEY`), in every example of a decoder-only layout that runs
it; the loss is on Part B only.

The masked language models, and the two definitions of them:
- BERT (Devlin et al. 2018, arXiv 1810.04805, section 3.1 "Masked LM"): 15% of the token
  positions are chosen at random; a chosen token is replaced by [MASK] 80% of the time, by a
  random token 10% and left unchanged 10%; the loss is the cross entropy of predicting the
  original token at the chosen positions only.
- T5 (Raffel et al. 2020, section 3.3.1): 15% of the tokens are corrupted; BERT-style
  replaces 90% of them by the mask token and 10% by a random token (no "unchanged" share),
  and the target is the whole original sequence; MASS-style replaces all of them by the mask
  token. An encoder-decoder therefore learns to reproduce every token.
What runs here is T5's corruption (`bert_style`, `mass_style` above, `noise_density` 0.15
and `random_token_fraction` 0.1 by default) for every family. The `encoder_only` family
(`batch_format`), which predicts in place, takes BERT's loss: only at the corrupted (noise
mask) positions, including those replaced by a random token, not at the tokens left alone;
the encoder-decoder and decoder-only families keep T5's targets. `encoder_only` can train on
these two objectives only (`Architecture.objectives`): the others' targets are not the
inputs' own tokens.
Inputs and targets end with EOS (blank_infilling's targets with GLM's [END], `glm.end_token`).
The mask token is `<extra_id_0>` = vocab_size - 1,
sentinel i is vocab_size - 1 - i (`config.sentinel_id`), real tokens lie in [3, the lowest
sentinel).
The i.i.d. objectives' lengths are random: `t5x_lite.noise_lengths` bounds them; text
infilling's inputs too: `bart_noising.infilling_raw_length` bounds them.
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from t5x_lite import bart_noising, batch_format, glm, ul2
# The host side: each built-in objective's length arithmetic, which its record names.
from t5x_lite import objective_layout as host
from t5x_lite.config import EOS_ID, NUM_RESERVED_IDS, PAD_ID, ConfigError, sentinel_id

# The host side (`t5x_lite.objective_layout`), re-exported: callers build specs and layouts
# through this module.
from t5x_lite.objective_layout import (  # noqa: F401
    BatchLayout, ObjectiveSpec, expected_loss_tokens, layout_for, layout_from_config,
    layout_record, lengths_for, noise_counts, objective_lengths, objective_loss_tokens,
    raw_length_for, spec_from_config, ul2_denoiser_lengths, validate_vocab)
# The registry of objectives (`t5x_lite.objective_registry`), filled below, re-exported: a
# researcher registers an objective of their own as `objectives.register(objectives.Objective(
# ...))`.
from t5x_lite.objective_registry import Objective, get, names, objective_id, register  # noqa: F401


# ---------------------------------------------------------------------------------------------
# Noise masks (device; one example, fixed size, traced counts)
# ---------------------------------------------------------------------------------------------


def _valid_length(length: int, valid_length: Any) -> jax.Array:
    return jnp.asarray(length if valid_length is None else valid_length, jnp.int32)


# The masks below take their randomness as uniform draws in [0, 1): `corrupt` makes ONE draw
# per example for all of them, because every separate PRNG call adds its own threefry
# computation to compile. The public functions are the same masks drawing from an rng.


def _random_segmentation(num_items: jax.Array, num_segments: jax.Array,
                         uniform: jax.Array) -> jax.Array:
    """Lengths int32[size] of a uniformly random split of num_items into num_segments parts
    (each >= 1; entries past the last segment are 0), like T5's `_random_segmentation`.

    `uniform` is float32[size]. The cut after item j (j < num_items - 1) is chosen when its draw
    ranks among the num_segments - 1 smallest: a uniformly random set of cuts, with a static
    array size. With fewer items than segments every item is its own segment (as in T5).
    """
    size = uniform.shape[0]
    slot = jnp.arange(size - 1)
    is_slot = slot < num_items - 1
    draw = jnp.where(is_slot, uniform[:-1], 2.0)  # non-slots rank last
    rank = jnp.argsort(jnp.argsort(draw))
    cut = is_slot & (rank < num_segments - 1)
    segment = jnp.cumsum(jnp.concatenate([jnp.zeros(1, jnp.int32), cut.astype(jnp.int32)]))
    is_item = jnp.arange(size) < num_items
    return jnp.zeros(size, jnp.int32).at[segment].add(is_item.astype(jnp.int32))


def _spans_mask(uniform: jax.Array, noise_density: Any, mean_noise_span_length: Any,
                valid_length: jax.Array) -> jax.Array:
    """`random_spans_noise_mask` from uniform draws float32[2, length]."""
    length = uniform.shape[1]
    num_noise, num_spans = noise_counts(valid_length, noise_density, mean_noise_span_length)
    noise_lengths = _random_segmentation(num_noise, num_spans, uniform[0])
    nonnoise_lengths = _random_segmentation(valid_length - num_noise, num_spans, uniform[1])
    # Spans in order: non-noise 0, noise 0, non-noise 1, ...; mark where spans 1, 2, ... start.
    span_starts = jnp.cumsum(jnp.stack([nonnoise_lengths, noise_lengths], axis=1).ravel())[:-1]
    start_count = jnp.zeros(length, jnp.int32).at[span_starts].add(1, mode="drop")
    span_index = jnp.cumsum(start_count)  # empty spans add 2 starts at once: parity unchanged
    return (span_index % 2 == 1) & (jnp.arange(length) < valid_length)


def random_spans_noise_mask(length: int, noise_density: Any, mean_noise_span_length: Any,
                            rng: jax.Array, valid_length: Any = None) -> jax.Array:
    """bool[length] noise mask of T5's `random_spans_noise_mask` over the first valid_length
    positions (default: all); positions >= valid_length are False.

    num_noise = round(valid_length * noise_density) clamped to [1, valid_length - 1];
    num_spans = max(1, round(num_noise / mean_noise_span_length)). The sequence alternates
    non-noise and noise spans, starting with non-noise and ending with noise, with span lengths
    drawn as uniformly random compositions. If num_spans exceeds the non-noise token count,
    noise spans merge, leaving min(num_spans, non-noise tokens) spans (T5's mask fails there:
    its non-noise and noise span lists differ in length and cannot be interleaved).
    """
    return _spans_mask(jax.random.uniform(rng, (2, length)), noise_density,
                       mean_noise_span_length, _valid_length(length, valid_length))


def _iid_mask(uniform: jax.Array, noise_density: Any, valid_length: jax.Array) -> jax.Array:
    return (jnp.arange(uniform.shape[0]) < valid_length) & (uniform < noise_density)


def iid_noise_mask(length: int, noise_density: Any, rng: jax.Array,
                   valid_length: Any = None) -> jax.Array:
    """bool[length]: each of the first valid_length positions is noise with prob noise_density."""
    return _iid_mask(jax.random.uniform(rng, (length,)), noise_density,
                     _valid_length(length, valid_length))


def _uniform_int(uniform: jax.Array, low: Any, high: Any) -> jax.Array:
    """Integers uniform over [low, high) from uniform draws (clipped: u * n can round up to n)."""
    return jnp.minimum(low + jnp.floor(uniform * (high - low)).astype(jnp.int32), high - 1)


def _prefix_split(uniform: jax.Array, valid_length: jax.Array) -> jax.Array:
    return _uniform_int(uniform, 1, jnp.maximum(valid_length, 2))


def random_prefix_split(valid_length: Any, rng: jax.Array) -> jax.Array:
    """int32 split point uniform over [1, valid_length - 1] (1 when valid_length < 2)."""
    return _prefix_split(jax.random.uniform(rng), jnp.asarray(valid_length, jnp.int32))


# ---------------------------------------------------------------------------------------------
# Encoders (device; one example; `Objective.encode`). Each takes tokens int32[R], the valid
# length n, the spec, uniform draws float32[_uniform_rows(layout), R] (`_example_draws`) and
# the layout; it returns (inputs, targets, noise, sentinels): inputs and targets
# int32[packed_width], the tokens packed at the front, EOS after them, then zero padding; noise
# bool[R], the tokens it corrupted (all False for an objective without a noise mask:
# deshuffling, prefix_lm, lm, document_rotation, sentence_permutation); sentinels int32, how
# many sentinel ids (<extra_id_0> up) it needs, which the layout must hold.
# ---------------------------------------------------------------------------------------------


def packed_width(layout: BatchLayout) -> int:
    """max(R + 3, inputs_length + 1) for R = layout.raw_length. R + 3 is the longest output of
    the T5 objectives, iid_denoising's targets (noise + runs <= R + 1, as every run but the
    last is followed by a clean token, plus the final sentinel and EOS); text infilling's
    inputs are unbounded (zero-length spans insert masks), and a width past inputs_length
    makes any that do not fit count as overflow (`_fits`) instead of being cut silently. One
    width for all, as `lax.switch` needs equal shapes."""
    return max(layout.raw_length + 3, layout.inputs_length + 1)


def _uniform_rows(layout: BatchLayout) -> int:
    """Rows of R uniform draws per example: 3 (the T5 objectives'), or more where an objective
    of the layout reads more (`Objective.uniform_rows`: text infilling's 2 * width + 1 draws,
    `bart_noising.infilling_plan`; blank infilling's `glm.UNIFORM_ROWS`)."""
    return max([3, *(get(name).uniform_rows(layout) for name in layout.objectives)])


def _infilling_rows(layout: BatchLayout) -> int:
    """Text infilling's rows: the T5 objectives' 3, then room for its 2 * width + 1 draws."""
    return 3 + -(-(2 * packed_width(layout) + 1) // max(layout.raw_length, 1))


def _example_draws(rng: jax.Array, layout: BatchLayout) -> jax.Array:
    """float32[_uniform_rows(layout), R]: one example's uniform draws. The first 3 rows are
    one draw from `rng` as before text infilling existed (the T5 objectives' corruption keeps
    its values for a given rng); text infilling's rows come from a key folded off it."""
    length = layout.raw_length
    first = jax.random.uniform(rng, (3, length))
    more = jax.random.uniform(jax.random.fold_in(rng, 1), (_uniform_rows(layout) - 3, length))
    return jnp.concatenate([first, more])


def example_draws(rng: jax.Array, batch_size: int, layout: BatchLayout) -> jax.Array:
    """float32[batch_size, rows, R]: the uniform draws `corrupt_with_details` gives each
    example of a batch corrupted with `rng` (for tests that re-derive an objective's noise)."""
    return jax.vmap(functools.partial(_example_draws, layout=layout))(
        jax.random.split(rng, batch_size))


def pack_with_eos(values: jax.Array, keep: jax.Array, width: int) -> jax.Array:
    """The kept values moved to the front, in order, followed by EOS and zeros: int32[width]
    (kept values past the width are dropped)."""
    values = jnp.append(values, EOS_ID)
    keep = jnp.append(keep, True)
    destination = jnp.where(keep, jnp.cumsum(keep) - 1, width)  # dropped: out of range
    return jnp.zeros(width, jnp.int32).at[destination].set(values, mode="drop")


def _run_starts(mask: jax.Array) -> jax.Array:
    """bool: the positions where a maximal run of True in `mask` starts."""
    return mask & ~jnp.concatenate([jnp.zeros(1, bool), mask[:-1]])


def _sentinel(index: jax.Array, layout: BatchLayout) -> jax.Array:
    """The id of <extra_id_index> (`config.sentinel_id`). An index past the vocabulary's
    sentinels gets the last sentinel instead of a real token's id; its example needs more
    sentinels than the layout holds and is left out of the loss (`_fits`)."""
    return sentinel_id(layout.vocab_size, jnp.minimum(index, layout.num_sentinels - 1))


def _spans_to_sentinels(tokens: jax.Array, spans: jax.Array, valid: jax.Array,
                        layout: BatchLayout):
    """(values, keep) for `pack_with_eos`: the valid tokens with each run of `spans` replaced
    by one sentinel, the i-th run by <extra_id_i> (T5's `noise_span_to_unique_sentinel`)."""
    starts = _run_starts(spans)
    values = jnp.where(starts, _sentinel(jnp.cumsum(starts) - 1, layout), tokens)
    return values, valid & ~(spans & ~starts)


def no_noise(tokens: jax.Array) -> jax.Array:
    """The noise mask of an objective that corrupts no chosen tokens: bool[R], all False."""
    return jnp.zeros(tokens.shape, bool)


def _span_corruption(tokens, n, spec, uniform, layout):
    valid, width = jnp.arange(tokens.shape[0]) < n, packed_width(layout)
    noise = _spans_mask(uniform[:2], spec.noise_density, spec.mean_noise_span_length, n)
    inputs = pack_with_eos(*_spans_to_sentinels(tokens, noise, valid, layout), width)
    targets = pack_with_eos(*_spans_to_sentinels(tokens, valid & ~noise, valid, layout), width)
    return inputs, targets, noise, jnp.sum(_run_starts(noise))


def _iid_denoising(tokens, n, spec, uniform, layout):
    valid, width = jnp.arange(tokens.shape[0]) < n, packed_width(layout)
    noise = _iid_mask(uniform[0], spec.noise_density, n)
    inputs = pack_with_eos(*_spans_to_sentinels(tokens, noise, valid, layout), width)
    # Targets: each noise token, led by its run's sentinel where a run starts (a pair of slots
    # per position keeps this one O(R) pack), then the final sentinel <extra_id_k>.
    starts = _run_starts(noise)
    num_runs = jnp.sum(starts)
    pairs = jnp.stack([_sentinel(jnp.cumsum(starts) - 1, layout), tokens], axis=1).ravel()
    keep_pairs = jnp.stack([starts, noise], axis=1).ravel()
    targets = pack_with_eos(jnp.append(pairs, _sentinel(num_runs, layout)),
                            jnp.append(keep_pairs, True), width)
    return inputs, targets, noise, num_runs + 1


def _drop_corrupted_tokens(tokens, n, spec, uniform, layout):
    valid, width = jnp.arange(tokens.shape[0]) < n, packed_width(layout)
    # The same draw as iid_denoising: with one rng both objectives corrupt the same tokens.
    noise = _iid_mask(uniform[0], spec.noise_density, n)
    return (pack_with_eos(tokens, valid & ~noise, width), pack_with_eos(tokens, noise, width),
            noise, jnp.int32(0))


def _mask_or_random_tokens(tokens, n, noise_density, random_token_fraction, uniform, layout):
    """Shared by bert_style and mass_style: i.i.d. noise tokens -> mask token or random token."""
    valid, width = jnp.arange(tokens.shape[0]) < n, packed_width(layout)
    noise = _iid_mask(uniform[0], noise_density, n)
    use_random = uniform[1] < random_token_fraction
    lowest_sentinel = sentinel_id(layout.vocab_size, layout.num_sentinels - 1)
    random_tokens = _uniform_int(uniform[2], NUM_RESERVED_IDS, lowest_sentinel)
    mask_token = batch_format.mask_token(layout.vocab_size)
    corrupted = jnp.where(noise, jnp.where(use_random, random_tokens, mask_token), tokens)
    return (pack_with_eos(corrupted, valid, width), pack_with_eos(tokens, valid, width), noise,
            jnp.int32(1))


def _bert_style(tokens, n, spec, uniform, layout):
    return _mask_or_random_tokens(tokens, n, spec.noise_density, spec.random_token_fraction,
                                  uniform, layout)


def _mass_style(tokens, n, spec, uniform, layout):
    return _mask_or_random_tokens(tokens, n, spec.noise_density, 0.0, uniform, layout)


def _deshuffling(tokens, n, spec, uniform, layout):
    valid, width = jnp.arange(tokens.shape[0]) < n, packed_width(layout)
    order = jnp.argsort(jnp.where(valid, uniform[0], 2.0))  # a random order of the valid tokens
    return (pack_with_eos(tokens[order], valid, width), pack_with_eos(tokens, valid, width),
            no_noise(tokens), jnp.int32(0))


def _prefix_lm(tokens, n, spec, uniform, layout):
    position, width = jnp.arange(tokens.shape[0]), packed_width(layout)
    split = _prefix_split(uniform[0, 0], n)
    return (pack_with_eos(tokens, position < split, width),
            pack_with_eos(tokens, (position >= split) & (position < n), width), no_noise(tokens),
            jnp.int32(0))


def _lm(tokens, n, spec, uniform, layout):
    valid, width = jnp.arange(tokens.shape[0]) < n, packed_width(layout)
    # No inputs; a family whose rows need an input token (an encoder's) gets a lone EOS.
    if batch_format.min_inputs_length(layout.family):
        inputs = pack_with_eos(tokens, no_noise(tokens), width)
    else:
        inputs = jnp.zeros(width, jnp.int32)
    return inputs, pack_with_eos(tokens, valid, width), no_noise(tokens), jnp.int32(0)


# BART's noising (`t5x_lite.bart_noising`): every target is the original document + EOS.


def _token_masking(tokens, n, spec, uniform, layout):
    valid, width = jnp.arange(tokens.shape[0]) < n, packed_width(layout)
    noise = bart_noising.exact_count_mask(uniform[0], spec.noise_density, n)
    masked = jnp.where(noise, batch_format.mask_token(layout.vocab_size), tokens)
    return (pack_with_eos(masked, valid, width), pack_with_eos(tokens, valid, width), noise,
            jnp.int32(1))


def _token_deletion(tokens, n, spec, uniform, layout):
    valid, width = jnp.arange(tokens.shape[0]) < n, packed_width(layout)
    # The same draw as token_masking: with one rng both corrupt the same tokens.
    noise = bart_noising.exact_count_mask(uniform[0], spec.noise_density, n)
    return (pack_with_eos(tokens, valid & ~noise, width), pack_with_eos(tokens, valid, width),
            noise, jnp.int32(0))


def _text_infilling(tokens, n, spec, uniform, layout):
    valid, width = jnp.arange(tokens.shape[0]) < n, packed_width(layout)
    plan = bart_noising.infilling_plan(uniform[3:].ravel(), spec.noise_density,
                                       spec.mean_noise_span_length, n, tokens.shape[0], width)
    clean = tokens[jnp.clip(plan.raw_start, 0, max(tokens.shape[0] - 1, 0))]
    slots = jnp.where(plan.is_span, batch_format.mask_token(layout.vocab_size), clean)  # a span
    return (pack_with_eos(slots, plan.in_sequence, width), pack_with_eos(tokens, valid, width),
            plan.noise, jnp.int32(1))


def _permuted_sentences(tokens, n, uniform, layout):
    """(the tokens with their sentences in a random order, where each raw token went)."""
    classes = (np.zeros(layout.vocab_size, np.uint8) if layout.sentence_classes is None
               else np.frombuffer(layout.sentence_classes, np.uint8))
    ends = bart_noising.sentence_ends(tokens, n, jnp.asarray(classes))
    destination = bart_noising.sentence_destinations(uniform[0], ends, n)
    return jnp.zeros_like(tokens).at[destination].set(tokens), destination


def _sentence_permutation(tokens, n, spec, uniform, layout):
    valid, width = jnp.arange(tokens.shape[0]) < n, packed_width(layout)
    permuted, _ = _permuted_sentences(tokens, n, uniform, layout)
    return (pack_with_eos(permuted, valid, width), pack_with_eos(tokens, valid, width),
            no_noise(tokens), jnp.int32(0))


def _text_infilling_permutation(tokens, n, spec, uniform, layout):
    # fairseq's order: permute the sentences, then infill the permuted tokens.
    permuted, destination = _permuted_sentences(tokens, n, uniform, layout)
    inputs, _, noise, sentinels = _text_infilling(permuted, n, spec, uniform, layout)
    valid, width = jnp.arange(tokens.shape[0]) < n, packed_width(layout)
    # The noise mask at the raw positions: raw token i is permuted token destination[i].
    return inputs, pack_with_eos(tokens, valid, width), noise[destination], sentinels


def _document_rotation(tokens, n, spec, uniform, layout):
    valid, width = jnp.arange(tokens.shape[0]) < n, packed_width(layout)
    start = bart_noising.rotation_start(uniform[0, 0], n)
    rotated = tokens[(start + jnp.arange(tokens.shape[0])) % jnp.maximum(n, 1)]
    return (pack_with_eos(rotated, valid, width), pack_with_eos(tokens, valid, width),
            no_noise(tokens), jnp.int32(0))


# UL2's mixture of denoisers (`t5x_lite.ul2`): one span corruption at the drawn denoiser's rate
# and span, and one S-denoiser split, per example; the drawn denoiser's kind picks one.


def _ul2(tokens, n, spec, uniform, layout):
    denoisers = layout.denoisers
    # uniform[2, 0] is read by neither span corruption (rows 0 and 1) nor the split ([0, 0]).
    chosen = ul2.choose(uniform[2, 0], denoisers)

    def pick(values, dtype):
        return jnp.asarray(values, dtype)[chosen]

    n = jnp.minimum(n, pick([d.raw_length for d in denoisers], jnp.int32))
    density = pick([d.noise_density for d in denoisers], jnp.float32)
    spans = _span_corruption(tokens, n, spec.replace(
        noise_density=density,
        mean_noise_span_length=pick([d.mean_noise_span_length for d in denoisers], jnp.float32)),
        uniform, layout)
    position, width = jnp.arange(tokens.shape[0]), packed_width(layout)
    split = ul2.s_split(uniform[0, 0], density, n)
    prefix = (pack_with_eos(tokens, position < split, width),
              pack_with_eos(tokens, (position >= split) & (position < n), width),
              no_noise(tokens), jnp.int32(0))
    is_s = pick([d.kind == "S" for d in denoisers], bool)
    inputs, targets, noise, sentinels = jax.tree.map(
        lambda s_value, span_value: jnp.where(is_s, s_value, span_value), prefix, spans)
    mode = pick(ul2.mode_tokens(denoisers, layout.vocab_size, layout.num_sentinels), jnp.int32)
    inputs = jnp.concatenate([mode[None], inputs])[:width]
    # The mode tokens are the last sentinels: an example needing them as spans' overflows.
    return inputs, targets, noise, sentinels + len(batch_format.MODE_TOKENS)


# GLM's blank infilling (`t5x_lite.glm`): one more output, the position fed at each target slot
# (`corrupt_with_details` gives the other branches none when a layout runs it).


def _blank_infilling(tokens, n, spec, uniform, layout):
    width = packed_width(layout)
    plan = glm.plan(tokens, n, spec.noise_density, spec.mean_noise_span_length, uniform,
                    batch_format.mask_token(layout.vocab_size), glm.end_token(layout.vocab_size),
                    width)
    # Two sentinels: <extra_id_0> the [MASK], <extra_id_1> the [END].
    return (pack_with_eos(plan.part_a, plan.keep, width), plan.targets, plan.noise,
            jnp.int32(2), plan.target_positions)


# The built-in objectives' records, in the order of their ids: an objective's id is its position
# in the registry, so a new one is appended.
_SPANS = ("noise_density", "mean_noise_span_length")
_RATE = ("noise_density",)
register(Objective("span_corruption", _span_corruption, has_noise_mask=True, reads=_SPANS,
                   lengths=host.span_corruption_lengths,
                   expected_loss_tokens=host.span_corruption_loss_tokens,
                   sentinels_needed=host.span_corruption_sentinels,
                   effective_settings=host.span_corruption_effective_settings))
register(Objective("drop_corrupted_tokens", _drop_corrupted_tokens, has_noise_mask=True,
                   reads=_RATE, lengths=host.iid_corruption_lengths,
                   expected_loss_tokens=host.drop_corrupted_loss_tokens))
register(Objective("bert_style", _bert_style, has_noise_mask=True, in_place=True,
                   reads=("noise_density", "random_token_fraction")))
register(Objective("mass_style", _mass_style, has_noise_mask=True, in_place=True, reads=_RATE))
# T5's gin files for these two leave out `reduce_concat_tokens`: one document per example.
WITHIN_DOCUMENT_CHANGES = (
    "2026-12-05: each example is a segment of one document (its start or the previous "
    "segment's end, its last segment shorter), as T5's prefix_lm.gin and all_permute.gin make "
    "them; before, a window of the documents' stream, which crossed a document's end in 59 % "
    "of 511-token chunks of the English Wikipedia sample",)
register(Objective("deshuffling", _deshuffling, has_noise_mask=False, within_document=True,
                   changes=WITHIN_DOCUMENT_CHANGES))
register(Objective("prefix_lm", _prefix_lm, has_noise_mask=False, within_document=True,
                   expected_loss_tokens=host.prefix_lm_loss_tokens,
                   changes=WITHIN_DOCUMENT_CHANGES))
register(Objective("lm", _lm, has_noise_mask=False, lengths=host.lm_lengths))
register(Objective("iid_denoising", _iid_denoising, has_noise_mask=True, reads=_RATE,
                   lengths=host.iid_corruption_lengths,
                   expected_loss_tokens=host.iid_denoising_loss_tokens,
                   sentinels_needed=host.iid_denoising_sentinels))
# BART's noising functions (Lewis et al. 2019, section 2.2).
register(Objective("token_masking", _token_masking, has_noise_mask=True, reads=_RATE))
register(Objective("token_deletion", _token_deletion, has_noise_mask=True, reads=_RATE,
                   lengths=host.token_deletion_lengths))
register(Objective("text_infilling", _text_infilling, has_noise_mask=True, reads=_SPANS,
                   poisson_spans=True, uniform_rows=_infilling_rows,
                   lengths=host.infilling_lengths))
register(Objective("document_rotation", _document_rotation, has_noise_mask=False))
register(Objective("sentence_permutation", _sentence_permutation, has_noise_mask=False,
                   reads_sentences=True, changes=bart_noising.SENTENCE_CHANGES))
register(Objective("text_infilling_permutation", _text_infilling_permutation,
                   has_noise_mask=True, reads=_SPANS, poisson_spans=True, reads_sentences=True,
                   uniform_rows=_infilling_rows, lengths=host.infilling_lengths,
                   changes=bart_noising.SENTENCE_CHANGES))
# UL2's mixture of denoisers (Tay et al. 2022): its rates and spans are its denoisers'
# (`objective.ul2_denoisers`), a mixture the layout holds (`BatchLayout.denoisers`).
register(Objective("ul2", _ul2, has_noise_mask=True, lengths=host.ul2_lengths,
                   expected_loss_tokens=host.ul2_loss_tokens,
                   sentinels_needed=host.ul2_sentinels,
                   changes=("2026-12-05: the S-denoiser splits as T5's random_prefix_noise_mask "
                            "(its targets were 1-2 tokens shorter for rates below 0.5)",)))
# GLM's autoregressive blank infilling (Du et al. 2021).
register(Objective(glm.NAME, _blank_infilling, has_noise_mask=True, reads=_SPANS,
                   poisson_spans=True, needs_prefix_attention=True, explicit_positions=True,
                   uniform_rows=lambda layout: glm.UNIFORM_ROWS,
                   expected_loss_tokens=host.blank_infilling_loss_tokens,
                   sentinels_needed=host.blank_infilling_sentinels))


# ---------------------------------------------------------------------------------------------
# The public entry point
# ---------------------------------------------------------------------------------------------


def _typed(value: Any) -> str:
    """A value's dtype and shape as the contract below writes them: int32[19], bool[], ..."""
    return f"{jnp.result_type(value).name}{list(jnp.shape(value))}"


def _checked_outputs(name: str, outputs: Any, layout: BatchLayout) -> tuple:
    """Objective `name`'s encoder outputs for one example, once checked against the contract
    (`objective_registry`: inputs and targets int32[packed_width], noise bool[raw_length],
    sentinels int32[], and target positions int32[packed_width] for an objective with
    explicit positions); a one-line `ConfigError` naming the objective and both forms
    otherwise, rather than `lax.switch`'s complaint about unequal branches. It runs while the
    step is traced, so it costs the compiled program nothing."""
    width, raw = packed_width(layout), layout.raw_length
    expected = [("inputs", f"int32[{width}]"), ("targets", f"int32[{width}]"),
                ("noise", f"bool[{raw}]"), ("sentinels", "int32[]")]
    if get(name).explicit_positions:
        expected.append(("target positions", f"int32[{width}]"))
    returned = ([_typed(value) for value in outputs] if isinstance(outputs, (tuple, list))
                else [type(outputs).__name__])
    if returned != [form for _, form in expected]:
        contract = ", ".join(f"{what} {form}" for what, form in expected)
        raise ConfigError(f"objective {name!r}: encode must return ({contract}) for this "
                          f"layout (packed_width {width}, raw_length {raw}); it returned "
                          f"({', '.join(returned)})")
    return tuple(outputs)


def _fits(inputs: jax.Array, targets: jax.Array, sentinels: jax.Array,
          layout: BatchLayout) -> jax.Array:
    """bool: whether an example's inputs and targets (incl. EOS) fit the layout's lengths, and
    the sentinels it needs the layout's vocabulary (targets predicted in place: the inputs')."""
    targets_room = (layout.inputs_length if batch_format.in_place(layout.family)
                    else layout.targets_length)
    return ((jnp.sum(inputs != PAD_ID) <= layout.inputs_length)
            & (jnp.sum(targets != PAD_ID) <= targets_room)
            & (sentinels <= layout.num_sentinels))


def corrupt_with_details(raw_tokens: jax.Array, spec: ObjectiveSpec, rng: jax.Array,
                         layout: BatchLayout) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
    """`corrupt`, and what it did: (batch, details).

    details: `noise_mask` bool [B, layout.raw_length], the raw tokens the objective corrupted
    (all False for objectives without a noise mask, see `Objective.has_noise_mask`);
    `overflow` bool [B], the examples whose inputs or targets did not fit the layout or that
    needed more sentinels than layout.num_sentinels (possible for the i.i.d. objectives, whose
    lengths and runs of noise are random; `noise_lengths` makes it rare). An overflowing
    example is cut to the layout (sentinels past the last become the last) and gets zero loss
    weights, so it never trains on a cut sequence; the train step reports how many there were
    (`objective_overflow`).
    """
    if raw_tokens.shape[-1] != layout.raw_length:
        raise ValueError(f"raw_tokens has length {raw_tokens.shape[-1]}; the layout needs "
                         f"layout.raw_length={layout.raw_length}")

    def one_example(tokens, example_spec, example_rng):
        in_range = jnp.arange(tokens.shape[0]) < example_spec.raw_length
        n = jnp.sum(in_range & (tokens != PAD_ID)).astype(jnp.int32)
        uniform = _example_draws(example_rng, layout)
        outputs = jax.lax.switch(
            branch_of[example_spec.objective], branches, tokens, n, example_spec, uniform)
        inputs, targets, noise, sentinels = outputs[:4]
        fits = _fits(inputs, targets, sentinels, layout)
        # The noise mask, for a family that predicts in place: the loss is on exactly the
        # corrupted positions (inputs[i] is raw token i for the objectives that allow it).
        example = batch_format.example_rows(layout.family, jnp, inputs, targets,
                                            layout.inputs_length, layout.targets_length,
                                            noise=noise,
                                            target_positions=outputs[4] if explicit else None)
        weights = batch_format.loss_keys(layout.family)[1]
        example[weights] = example[weights] * fits
        return example, {"noise_mask": noise, "overflow": ~fits}

    # Only the layout's objectives are compiled; branch_of maps an objective id to its branch
    # (an objective outside the layout, which the host refuses, would run branch 0).
    ids = [objective_id(name) for name in layout.runs()]
    # A layout running an objective with explicit target positions (blank infilling) gives
    # every branch a fifth output, target positions (none for the others: their rows keep
    # their own); the other layouts' programs are as they were.
    explicit = any(get(name).explicit_positions for name in layout.runs())

    def branch(name):
        def encoder(*args):
            return _checked_outputs(name, get(name).encode(*args, layout=layout), layout)

        if not explicit or get(name).explicit_positions:
            return encoder
        return lambda *args: (*encoder(*args), glm.no_positions(packed_width(layout)))

    branches = [branch(name) for name in layout.runs()]
    branch_of = jnp.zeros(len(names()), jnp.int32).at[jnp.asarray(ids)].set(
        jnp.arange(len(ids), dtype=jnp.int32))
    rngs = jax.random.split(rng, raw_tokens.shape[0])
    # Scalar spec fields stay unbatched so the objective switch is a real branch, not a select.
    spec_axes = jax.tree.map(lambda field: 0 if jnp.ndim(field) else None, spec)
    batch_fn = jax.vmap(one_example, in_axes=(0, spec_axes, 0))
    return batch_fn(raw_tokens.astype(jnp.int32), spec, rngs)


# `corrupt_with_details` compiled on its own, outside a train step (`t5x_lite.preview`, the
# held-out batches of `t5x_lite.held_out`): the layout is static (shapes), so one compilation
# per layout serves every objective, rate and key.
jitted_corrupt_with_details = jax.jit(corrupt_with_details, static_argnums=3)


def corrupt(raw_tokens: jax.Array, spec: ObjectiveSpec, rng: jax.Array,
            layout: BatchLayout) -> dict[str, jax.Array]:
    """Turn raw tokens int32[B, layout.raw_length] into a training batch of fixed shapes.

    Jittable with `layout` static; `spec` fields are scalars or [B] arrays. Each example uses
    its first min(spec.raw_length, non-pad tokens) tokens (raw padding must be at the end) and
    its own rng. Keys: the rows of `layout.family`'s batch format (`t5x_lite.batch_format`):
    encoder_decoder: encoder_input_tokens [B, inputs_length] and decoder_input_tokens /
    decoder_target_tokens / decoder_loss_weights [B, targets_length]; decoder_only: those three
    decoder keys [B, inputs_length + targets_length] (inputs incl. EOS, then targets incl. EOS,
    then padding) plus the bool inputs_mask, and int32 decoder_positions when the layout runs
    blank_infilling (`batch_format.POSITIONS_KEY`); encoder_only (a layout without target positions):
    encoder_input_tokens (the corrupted inputs), encoder_target_tokens (the original tokens
    at the noise mask, 0 elsewhere) and encoder_loss_weights (the noise mask) [B,
    inputs_length]. An example longer than the layout is cut and gets
    zero loss weights (see `corrupt_with_details`, which also counts them).
    """
    return corrupt_with_details(raw_tokens, spec, rng, layout)[0]
