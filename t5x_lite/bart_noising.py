"""BART's noising functions (Lewis et al. 2019, arXiv 1910.13461, section 2.2, Table 1): the
noise they draw, on the device from uniform draws, and the lengths they need, on the host.

`t5x_lite.objectives` builds the inputs and targets from these (its encoders `token_masking`,
`token_deletion`, `text_infilling`, `document_rotation`); here is only what is particular to
BART. Every BART objective's target is the whole original document (plus EOS): "the decoder
reconstructs the document". The mask token is `<extra_id_0>`, as for bert_style. A "document"
here is a pre-training chunk, a window of the stream of documents (`data.pipeline`), where
fairseq's examples are blocks of whole sentences of one document (`sample_break_mode=
"complete_doc"`): a rotated chunk's true start is an arbitrary cut, its first and last
sentences are usually fragments, and a chunk may hold the end of one document (its EOS) and
the start of the next.

The number of corrupted tokens of an n-token document is fairseq's (`DenoisingDataset.
add_whole_word_mask`, subword units): `num_to_mask = ceil(n * noise_density)`, computed in
float32 as fairseq's torch code does (`num_to_mask`). Units are tokens here for every
noising. (fairseq's denoising task masks whole words whenever `mask_length` is not
"subword", so BART's own text infilling, `span-poisson`, counted its budget and spans in
words; fairseq offers no subword span-poisson. Here a span may start or end inside a word.)
Token masking and token deletion corrupt exactly that many tokens, chosen uniformly without
replacement (`exact_count_mask`), like fairseq (and BERT, which also masks a fixed share),
unlike T5's i.i.d. `mass_style`.

Text infilling (`infilling_plan`): span lengths are drawn i.i.d. from Poisson(lambda) until
their sum covers num_to_mask, the last one cut so that the sum is exactly num_to_mask; the
zero-length spans are insertions of a mask token. The K spans (zero-length ones included)
are then laid out among the n - num_to_mask clean tokens uniformly at random, every
interleaving of the K spans and the clean tokens equally likely; each span becomes one mask
token. Its input is n - num_to_mask + K + 1 tokens: usually shorter than the document, but
zero-length spans can make it longer, so its raw length is chosen (`infilling_raw_length`)
so that an example's inputs exceed `inputs_length` with probability at most
`noise_lengths.OVERFLOW_PROBABILITY`.

Sentence permutation: "a document is divided into sentences based on full stops, and these
sentences are shuffled in a random order". The raw chunks are token ids, so a sentence end is
read off the vocabulary (`sentence_classes`, bound to the run's batch layout) and the ids:
a token ends a sentence (`sentence_ends`) if it is EOS (a document's end), or if its piece ends
with a full stop '.' and the next token's piece starts a word ('▁'). That is exactly the rule
"a whitespace-separated word ending in '.' ends a sentence, and so does the document's end",
as SentencePiece pieces never span whitespace and mark the word after it (byte-fallback pieces
count as their byte). Like fairseq's `permute_sentences` (which splits on the full-stop token,
'.' of GPT-2's BPE, or on EOS), '!' and '?' end no sentence and an abbreviation followed by a
word ("e.g. the") splits; unlike it, a full stop inside a word ("os.path", "3.14", the "e." of
"e.g.") ends none, where GPT-2's pre-tokenizer makes that '.' a token of its own and fairseq
splits there; the part after the chunk's last end is a sentence too (fairseq: "pretend it
ends with a full stop").
(Until 2026-12-05 '!' and '?' ended sentences too.) The S
sentences are put in a uniformly random order (`sentence_destinations`; fairseq's ratio 1: all
of them, the identity among the S! orders).
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from scipy import special

from t5x_lite.config import EOS_ID
from t5x_lite.noise_lengths import OVERFLOW_PROBABILITY

TERMINATORS = "."  # a piece ending in one of these may end a sentence: the paper's full stop
# How the sentence split changed since it was first written: the `changes` of the objectives
# that read sentences (`objective_registry.Objective.changes`).
SENTENCE_CHANGES = ("2026-12-05: sentences end at full stops only, as in BART's paper and "
                    "fairseq ('!' and '?' ended them too before)",)
WORD_START = "\u2581"  # SentencePiece's mark of a piece that begins a word
# The bits of a vocabulary id's sentence class (`sentence_classes`).
ENDS_WITH_TERMINATOR, STARTS_WORD = 1, 2


def num_to_mask(length: Any, noise_density: Any, xp: Any = jnp) -> Any:
    """int32 ceil(length * noise_density) with a float32 product, as fairseq's
    `add_whole_word_mask` counts (a float32 tensor sum times the mask ratio). Shared by the
    host length arithmetic (xp=np) and the device masks (xp=jnp) so both round alike."""
    product = xp.asarray(length, xp.float32) * xp.asarray(noise_density, xp.float32)
    return xp.ceil(product).astype(xp.int32)


def _smallest(uniform: jax.Array, eligible: jax.Array, count: jax.Array) -> jax.Array:
    """bool: the `count` eligible positions with the smallest draws, a uniformly random
    count-subset of the eligible ones (one sort and a scatter: the rank of order[j] is j)."""
    order = jnp.argsort(jnp.where(eligible, uniform, 2.0))  # the others rank last
    chosen = jnp.arange(uniform.shape[0]) < count
    return jnp.zeros(uniform.shape[0], bool).at[order].set(chosen) & eligible


def _uniform_index(uniform: jax.Array, count: jax.Array) -> jax.Array:
    """An integer uniform over [0, count) from a uniform draw (clipped: u * count can round up)."""
    return jnp.minimum(jnp.floor(uniform * count).astype(jnp.int32), count - 1)


def exact_count_mask(uniform: jax.Array, noise_density: Any, valid_length: Any) -> jax.Array:
    """bool[R]: exactly `num_to_mask(valid_length, noise_density)` of the first valid_length
    positions, chosen uniformly without replacement, from uniform draws float32[R]."""
    valid = jnp.arange(uniform.shape[0]) < valid_length
    return _smallest(uniform, valid, num_to_mask(valid_length, noise_density))


def rotation_start(uniform: jax.Array, valid_length: Any) -> jax.Array:
    """int32 start uniform over [0, valid_length) (0 for an empty document): document rotation
    begins its input at this token (fairseq's `add_rolling_noise` offset, less its BOS)."""
    return _uniform_index(uniform, jnp.maximum(jnp.asarray(valid_length, jnp.int32), 1))


def poisson_lengths(uniform: jax.Array, poisson_lambda: Any, most: int,
                    at_least: int = 0) -> jax.Array:
    """int32 Poisson(poisson_lambda) draws conditioned on >= `at_least` (GLM's spans: 1), one
    per uniform draw in [0, 1) (inverse CDF), at most `most` (the law's mass beyond it left
    out). Exact for text infilling with most >= its num_to_mask, as a span that long ends the
    drawing and is cut to the budget anyway.

    Drawn against the survival function P(X > k), summed from the tail: a float32 CDF summed
    from 0 stops 6e-7 short of 1, which sent that share of draws to `most` (a GLM span of the
    whole text) where Poisson(3) puts 1e-8 beyond 16."""
    k = jnp.arange(most + 1, dtype=jnp.float32)
    lam = jnp.asarray(poisson_lambda, jnp.float32)
    pmf = jnp.where(k < at_least, 0.0,
                    jnp.exp(k * jnp.log(lam) - lam - jax.scipy.special.gammaln(k + 1)))
    tail = jnp.cumsum(pmf[::-1])[::-1]  # P(X >= k), up to the total mass tail[0]
    # P(X > k), falling from 1 to 0; exactly 1 below at_least (XLA may divide by multiplying
    # with the reciprocal, which leaves tail[0] / tail[0] a rounding short of 1).
    survival = jnp.where(k < at_least, 1.0, (tail - pmf) / tail[0])
    # The value is the number of k with P(X > k) >= 1 - u (1 - u is exact in float32 for
    # u >= 1/2), found by searchsorted on the rising -survival.
    return jnp.searchsorted(-survival, uniform - 1, side="right").astype(jnp.int32)


class InfillingPlan(NamedTuple):
    """Where text infilling puts its spans, for one example: its input is the `slots` in order.

    Arrays of S slots (S = the packed width of the example's outputs); slot s < num_slots holds
    either a clean token (the raw token at raw_start) or a span (raw tokens raw_start up to
    raw_start + span_length, zero of them for an insertion), which the input shows as one
    mask token.
    """

    in_sequence: jax.Array  # bool[S]: the slot is one of the example's num_slots
    is_span: jax.Array  # bool[S]: the slot is a span (a mask token in the input)
    span_length: jax.Array  # int32[S]: the span's raw token count (0: an insertion), 0 if clean
    raw_start: jax.Array  # int32[S]: the first raw position the slot covers
    noise: jax.Array  # bool[R]: the raw tokens inside spans (num_to_mask of them)
    num_spans: jax.Array  # int32 K: the spans drawn, zero-length ones included


def infilling_plan(draws: jax.Array, noise_density: Any, poisson_lambda: Any,
                   valid_length: Any, raw_length: int, num_slots: int) -> InfillingPlan:
    """Text infilling's spans for one example (see the module docstring), from uniform draws
    float32[>= 2 * num_slots + 1]: num_slots for the span lengths, num_slots to lay the spans
    out, one to order them.

    At most num_slots spans are drawn; an example that would need more has more than
    num_slots input tokens, so it is longer than the packed width (which is larger than the
    layout's inputs_length) and overflows anyway: its plan is then incomplete (covers fewer
    than num_to_mask tokens), which nothing trains on.
    """
    slot = jnp.arange(num_slots)
    valid_length = jnp.asarray(valid_length, jnp.int32)
    budget = num_to_mask(valid_length, noise_density)
    lengths = poisson_lengths(draws[:num_slots], poisson_lambda, raw_length)
    covered = jnp.cumsum(lengths)
    reached = covered >= budget
    # K: the draws up to the first whose running sum reaches the budget (none when it is 0).
    num_spans = jnp.where(budget == 0, 0,
                          jnp.where(reached.any(), jnp.argmax(reached) + 1, num_slots))
    # The last span is cut so that the lengths sum to the budget exactly (fairseq's trim).
    lengths = jnp.where(slot == num_spans - 1,
                        jnp.minimum(lengths, budget - (covered - lengths)), lengths)
    lengths = jnp.where(slot < num_spans, lengths, 0)
    # A uniformly random interleaving of the K spans and the clean tokens: K of the slots.
    num_used = valid_length - budget + num_spans
    in_sequence = slot < num_used
    is_span = _smallest(draws[num_slots:2 * num_slots], in_sequence, num_spans)
    # Spans take the draws in a cyclic order from a uniform offset: the draws before the cut
    # one are exchangeable, so this orders all K uniformly at random (the cut one, shorter on
    # average, is not always last).
    count = jnp.maximum(num_spans, 1)
    order = (jnp.cumsum(is_span) - 1 + _uniform_index(draws[2 * num_slots], count)) % count
    span_length = jnp.where(is_span, lengths[order], 0)
    raw_span = jnp.where(is_span, span_length, in_sequence.astype(jnp.int32))
    raw_start = jnp.cumsum(raw_span) - raw_span
    # The noise mask: +1 where a span starts, -1 where it ends (a zero-length span cancels).
    edges = jnp.zeros(raw_length + 1, jnp.int32)
    outside = raw_length + 1  # dropped by the scatters
    edges = edges.at[jnp.where(is_span, raw_start, outside)].add(1, mode="drop")
    edges = edges.at[jnp.where(is_span, raw_start + span_length, outside)].add(-1, mode="drop")
    noise = (jnp.cumsum(edges)[:raw_length] > 0) & (jnp.arange(raw_length) < valid_length)
    return InfillingPlan(in_sequence, is_span, span_length, raw_start, noise,
                         num_spans.astype(jnp.int32))


def sentence_classes(pieces: Sequence[str]) -> bytes:
    """One byte per vocabulary id, from its piece (`Vocabulary.pieces`): ENDS_WITH_TERMINATOR
    if it ends with one of TERMINATORS, plus STARTS_WORD if it begins with '▁'. Hashable, so a
    static batch layout can carry it."""
    return bytes((ENDS_WITH_TERMINATOR if piece[-1:] and piece[-1] in TERMINATORS else 0)
                 | (STARTS_WORD if piece.startswith(WORD_START) else 0) for piece in pieces)


def sentence_ends(tokens: jax.Array, valid_length: Any, classes: jax.Array) -> jax.Array:
    """bool[R]: the tokens of int32[R] that end a sentence (see the module docstring) among the
    first valid_length, whose last token always ends one; classes: uint8[vocab size]
    (`sentence_classes`)."""
    position = jnp.arange(tokens.shape[0])
    kind = classes[tokens]
    terminal = (kind & ENDS_WITH_TERMINATOR) > 0
    before_a_word = jnp.append((kind[1:] & STARTS_WORD) > 0, False)
    ends = (tokens == EOS_ID) | (terminal & before_a_word)
    return (ends & (position < valid_length)) | (position == valid_length - 1)


def sentence_destinations(uniform: jax.Array, ends: jax.Array, valid_length: Any) -> jax.Array:
    """int32[R]: where sentence permutation moves each of R tokens, a permutation of [0, R).

    The first valid_length tokens are sentences, each ending at a True of `ends`
    (`sentence_ends`); sentence k goes to the place of its rank among the uniform draws
    float32[R] of the S sentences (an argsort of i.i.d. draws: each of the S! orders equally
    likely) and keeps its tokens in order; the tokens past valid_length stay where they are.
    """
    position = jnp.arange(ends.shape[0])
    valid = position < valid_length
    sentence = jnp.cumsum(ends) - ends  # each token's sentence: the ends before it
    num_sentences = jnp.sum(ends)
    order = jnp.argsort(jnp.where(position < num_sentences, uniform, 2.0))  # slot j: order[j]
    rank = jnp.zeros_like(order).at[order].set(position)
    length = jnp.zeros_like(order).at[sentence].add(valid.astype(order.dtype), mode="drop")
    start = jnp.cumsum(length) - length  # where sentence k starts in the raw tokens
    slot_length = length[order]
    slot_start = jnp.cumsum(slot_length) - slot_length  # where slot j starts in the output
    moved = slot_start[rank[sentence]] + position - start[sentence]
    return jnp.where(valid, moved, position).astype(jnp.int32)


# ---------------------------------------------------------------------------------------------
# Lengths (host)
# ---------------------------------------------------------------------------------------------


def token_deletion_inputs_length(raw_length: int, noise_density: float) -> int:
    """The longest token-deletion input (incl. EOS) of a document of at most raw_length
    tokens: max over n of n - num_to_mask(n) + 1."""
    n = np.arange(raw_length + 1)
    return int(np.max(n - num_to_mask(n, noise_density, np))) + 1


def infilling_overflow_probability(num_tokens: int, inputs_length: int, noise_density: float,
                                   poisson_lambda: float) -> float:
    """P(a num_tokens document's text-infilling input, incl. EOS, is longer than inputs_length).

    The input is n - m + K + 1 tokens (m = num_to_mask, K spans), so it is too long iff
    K > T = inputs_length - 1 - n + m, iff the first T Poisson draws sum to less than m; a sum
    of T i.i.d. Poisson(lambda) is Poisson(T lambda): the probability is its CDF at m - 1.
    """
    m = int(num_to_mask(num_tokens, noise_density, np))
    most_spans = inputs_length - 1 - num_tokens + m
    if m == 0:
        return 0.0
    if most_spans < 0:
        return 1.0
    return float(special.pdtr(m - 1, most_spans * float(poisson_lambda)))


@functools.lru_cache(maxsize=None)
def infilling_raw_length(inputs_length: int, noise_density: float,
                         poisson_lambda: float) -> int:
    """The raw length of text infilling: the largest n <= inputs_length - 1 such that no
    document of n or fewer tokens overflows the inputs with probability above
    OVERFLOW_PROBABILITY (0 if even one token does). At most inputs_length - 1, as for the
    other objectives whose target is the whole document, so that the targets (raw + EOS) fit
    the inputs_length too: e.g. (512, 0.3, 3) -> 511, but (24, 0.15, 3) -> 19, as a 20-token
    document's 3 masked tokens come in more than 6 spans (inputs over 24 tokens) with
    probability 2.8e-6."""
    raw = 0
    for n in range(1, inputs_length):
        if infilling_overflow_probability(n, inputs_length, noise_density,
                                          poisson_lambda) > OVERFLOW_PROBABILITY:
            break
        raw = n
    return raw
