"""GLM's autoregressive blank infilling (Du et al. 2021, arXiv 2103.10360): the spans it blanks
and the rows and positions it makes of them, on the device; its expected target count, on the
host.

`t5x_lite.objectives` runs it as the objective `blank_infilling` (its encoder
`_blank_infilling`); here is only what is particular to GLM.

The paper's definition (paraphrased: its own text was not at hand here; this is section 2.1
and 2.2 as a review of the paper quotes it; the reference code below implements it).
Section 2.1, autoregressive blank infilling: of a text x = [x_1, ..., x_n], spans
{s_1, ..., s_m} are sampled, each a run of consecutive tokens of x; each span is replaced by a
single [MASK] token, giving the corrupted text x_corrupt; the model predicts the spans' tokens
autoregressively from x_corrupt and the spans predicted before, in a random permutation of the
spans' order. The input is Part A, x_corrupt, then Part B, the spans in that order; Part A
tokens attend to each other but to no token of B, Part B tokens to Part A and to the tokens
of B before them; each span is led by [START] in the input and ended by [END] in the output.
2D positions: the first id is the position in x_corrupt, for a span's tokens that of its
[MASK]; the second is the intra-span position, 0 in Part A and 1 to the span's length (+1,
with [START]) in Part B. Section 2.2, the blank-infilling objective: span lengths are drawn
from Poisson(lambda = 3), spans being sampled until at least 15% of the original tokens are
masked.

What the paper leaves open, taken from its reference code (THUDM/GLM, `blocklm_utils.py`,
`ConstructBlockStrategy`): span lengths are Poisson(lambda) conditioned on >= 1 (its length
distribution starts at 1; it also stops at 39, which a Poisson(3) draw passes with probability
about 1e-30: not here); lengths are drawn while their sum is below the threshold, the last
one is not cut (so the count is "at least" the threshold); the spans are laid out in the text
in a random order of their lengths, separated by at least one clean token: with S = their
total, K their count, K places are drawn uniformly from [0, n - S - K + 1] and sorted, span k
starting at place_k + sum over earlier spans of (length + 1) (`sample_spans`), within one
document (`sample_span_in_document`); when the spans do not all fit (S + K - 1 > n), GLM drops
the example from its batch (`generate_blank_data` returns None). Here a batch row is never
dropped: the spans that fit, in drawing order, are kept, so a text too short for its spans
masks fewer than the threshold's tokens (only short texts: at n = 6 and r = 0.6, about a third
of them); one [MASK] id for every span; Part B's [START] tokens sit at their [MASK]'s
position. GLM never masks its leading [CLS] or a sample's last token; here any token may be.

What runs here, for an n-token example, at noise_density r (the paper's 15%) and
mean_noise_span_length lambda (the paper's 3; `objective.mean_noise_span_length`):
- threshold m = ceil(n r) in float32 ("at least 15%": the reference code's int(r n) floors
  instead); lengths i.i.d. Poisson(lambda) conditioned on >= 1, each cut to n, drawn until
  their sum reaches m; the spans that fit kept (the first always does, being at most n); laid
  out as above (`plan`);
- Part A, the inputs: x with each span replaced by one [MASK] = `<extra_id_0>` (the mask token
  of every objective, `batch_format.mask_token`), then EOS;
- Part B, the targets: the spans in a uniformly random order, each followed by [END] =
  `<extra_id_1>` (`end_token`), an id no text holds. The decoder-only row feeds each position
  the previous token (`batch_format`): a span's first position is fed the token before it, so
  [START] is Part A's closing EOS for the first span and the previous span's [END] for the
  others (GLM only feeds [START] and only predicts [END], so one id may play both). [END] is
  not EOS because a span may cover a document's closing EOS: a pre-training chunk packs
  documents, each ended by EOS, and the spans are laid out over the whole chunk (GLM samples
  them within a document), so an EOS inside a span is a text token to predict, which an EOS
  [END] would make indistinguishable from the span's end;
- the mask: a prefix LM's (`architectures` prefix_lm): Part A bidirectional, Part B causal
  over A and itself; the loss on Part B's tokens only (the targets). As for every decoder-only
  row (seqio's convention) the prefix also covers the position fed Part A's EOS, the first
  span's [START]: Part A sees that one token of B, which shows the first span's position, none
  of its tokens;
- positions: the model has one T5 relative position bias per stack, read off one position per
  token (`models._positions`, `decoder_positions`), so the 2D position (p, j), p the span's
  [MASK] position in Part A, j = 1..l + 1 its intra-span position, is mapped to p + j - 1:
  [START] sits at its [MASK]'s position and the span's i-th token (i = 1..l) at p + i, one
  position after where it stood in the text (the [MASK] held the first one's place); the clean
  tokens after the span sit at x_corrupt's positions, so the positions do not reveal a span's
  length, which GLM's first position id hides too. Part A's tokens have their row positions
  (x_corrupt's, GLM's first id with the second 0).
Positions count the row's: position q is fed the sequence's token q - 1 (position 0 the start
token), so span k's [MASK], input number a_k, sits at a_k + 1, and so does its [START].
Lengths: A has n - S + K + 1 <= n + 1 tokens and B has S + K <= n + 1 (the spans fit), so the
prefix LM's lengths (raw = inputs_length - 1, inputs = targets = raw + 1) always hold them.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from t5x_lite.bart_noising import num_to_mask, poisson_lengths
from t5x_lite.config import sentinel_id

NAME = "blank_infilling"
# Rows of R uniform draws an example needs: span lengths, their order in the text, their
# places, their order in Part B.
UNIFORM_ROWS = 4
# A target slot without an explicit position (`batch_format.POSITIONS_KEY`: then its row's).
NO_POSITION = -1  # a target slot whose position is its row position


class BlankPlan(NamedTuple):
    """One example's blank infilling: the spans (in text order k = 0..K-1; entries past K are
    0) and what the row is made of."""

    num_spans: jax.Array  # int32 K
    start: jax.Array  # int32[R]: span k's first raw position
    length: jax.Array  # int32[R]: span k's token count (>= 1)
    part_b_rank: jax.Array  # int32[R]: span k's place in Part B's order
    noise: jax.Array  # bool[R]: the raw tokens inside spans
    part_a: jax.Array  # int32[R]: the tokens, each span's first one its [MASK]
    keep: jax.Array  # bool[R]: the tokens of Part A (`objectives` packs them, EOS after)
    targets: jax.Array  # int32[W]: Part B, each span followed by [END], then 0
    target_positions: jax.Array  # int32[W]: the position fed at each target slot, or -1


def _ranks(uniform: jax.Array, count: jax.Array) -> jax.Array:
    """int32[R]: a uniformly random permutation of [0, count) on the first `count` entries (the
    rank of each one's draw among theirs), the others count, count + 1, ..."""
    index = jnp.arange(uniform.shape[0])
    order = jnp.argsort(jnp.where(index < count, uniform, 2.0))
    return jnp.zeros_like(index).at[order].set(index).astype(jnp.int32)


def span_lengths(uniform: jax.Array, noise_density: Any, poisson_lambda: Any,
                 valid_length: Any) -> tuple[jax.Array, jax.Array]:
    """(lengths int32[R], K): the kept spans' lengths in drawing order (0 past K), from uniform
    draws float32[R]: Poisson(lambda) conditioned on >= 1 (inverse CDF of the truncated law),
    each cut to n = valid_length, drawn until their sum reaches ceil(n * noise_density), then
    the longest prefix that fits the text with a clean token between spans (sum + count - 1 <=
    n)."""
    n = jnp.asarray(valid_length, jnp.int32)
    drawn = poisson_lengths(uniform, poisson_lambda, uniform.shape[0], at_least=1)
    drawn = jnp.minimum(drawn, jnp.maximum(n, 1))
    total = jnp.cumsum(drawn)
    count = jnp.arange(1, uniform.shape[0] + 1)
    budget = num_to_mask(n, noise_density)
    # Drawn: up to the first whose running sum reaches the budget (none for an empty text).
    reached = total >= budget
    drawn_count = jnp.where(budget > 0, jnp.argmax(reached) + 1, 0)
    kept = (count <= drawn_count) & (total + count - 1 <= n)
    return jnp.where(kept, drawn, 0), jnp.sum(kept).astype(jnp.int32)


def end_token(vocab_size: int) -> int:
    """GLM's [END] (and so the [START] of every span but the first): `<extra_id_1>`, the
    sentinel after the [MASK] (`batch_format.mask_token`, `<extra_id_0>`)."""
    return sentinel_id(vocab_size, 1)


def plan(tokens: jax.Array, valid_length: Any, noise_density: Any, poisson_lambda: Any,
         uniform: jax.Array, mask_token: Any, end: Any, width: int) -> BlankPlan:
    """Blank infilling of one example (see the module docstring): tokens int32[R] of which the
    first valid_length are the text, uniform draws float32[UNIFORM_ROWS, R], the [MASK] and
    [END] ids, targets packed to `width` (> R + 1)."""
    raw_length = tokens.shape[0]
    index = jnp.arange(raw_length)
    n = jnp.asarray(valid_length, jnp.int32)
    drawn, num_spans = span_lengths(uniform[0], noise_density, poisson_lambda, n)
    is_span = index < num_spans
    # Text order: a random order of the drawn lengths (the last drawn, which ended the drawing,
    # is longer on average; GLM's code shuffles them too).
    length = jnp.zeros_like(index).at[_ranks(uniform[1], num_spans)].set(drawn)
    slack = n - jnp.sum(length) - num_spans + 1  # >= 0: the spans fit
    place = jnp.minimum(jnp.floor(uniform[2] * (slack + 1)).astype(jnp.int32), slack)
    place = jnp.sort(jnp.where(is_span, place, raw_length + 1))
    before = jnp.cumsum(length + 1) - (length + 1)  # earlier spans' tokens and gaps
    start = jnp.where(is_span, place + before, raw_length)
    # Each raw token's span (the starts at or before it) and its offset in it.
    starts = jnp.zeros(raw_length + 1, jnp.int32).at[start].add(1)[:raw_length]
    span_of = jnp.maximum(jnp.cumsum(starts) - 1, 0)
    offset = index - start[span_of]
    noise = (jnp.cumsum(starts) > 0) & (offset < length[span_of]) & (index < n)
    # Part A: the span's first token becomes the [MASK], its others go.
    is_first = noise & (offset == 0)
    keep = (index < n) & (~noise | is_first)
    part_a = jnp.where(is_first, mask_token, tokens)
    # Span k's [MASK] is input number start - (tokens of earlier spans) + k, at that + 1.
    mask_position = start - (jnp.cumsum(length) - length) + index + 1
    # Part B: span k at slot b_start[k], its tokens, then [END].
    part_b_rank = _ranks(uniform[3], num_spans)
    slot_length = jnp.zeros_like(index).at[part_b_rank].set(length + 1) * (index < num_spans)
    b_start = (jnp.cumsum(slot_length) - slot_length)[part_b_rank]
    slot = jnp.where(noise, b_start[span_of] + offset, width)  # dropped: not a span's token
    end_slot = jnp.where(is_span, b_start + length, width)  # span k's [END]
    targets = (jnp.zeros(width, jnp.int32).at[slot].set(tokens, mode="drop")
               .at[end_slot].set(end, mode="drop"))
    # The slot predicting token j + 1 (or [END]) of span k is fed token j: position p_k + j.
    target_positions = (jnp.full(width, NO_POSITION, jnp.int32)
                        .at[slot].set(mask_position[span_of] + offset, mode="drop")
                        .at[end_slot].set(mask_position + length, mode="drop"))
    return BlankPlan(num_spans, jnp.where(is_span, start, 0), length,
                     jnp.where(is_span, part_b_rank, 0), noise, part_a, keep, targets,
                     target_positions)


def no_positions(width: int) -> jax.Array:
    """int32[width] target positions of an objective without explicit ones: every slot at its
    row position."""
    return jnp.full(width, NO_POSITION, jnp.int32)


# ---------------------------------------------------------------------------------------------
# Host: the expected number of targets
# ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def expected_targets(raw_length: int, noise_density: float, poisson_lambda: float) -> float:
    """E[S + K], the targets (span tokens and one [END] each) of an n = raw_length token text, by
    dynamic programming over (running sum, count) of the span draws of `span_lengths` (in
    float64; the device draws in float32)."""
    n = int(raw_length)
    budget = int(num_to_mask(n, noise_density, np))
    if budget == 0:
        return 0.0
    from scipy import stats  # here, not at the top: importing it adds ~1 s to every process

    lam = float(poisson_lambda)
    lengths = np.arange(1, n + 1)
    pmf = stats.poisson.pmf(lengths, lam)
    pmf[-1] = stats.poisson.sf(n - 1, lam)  # cut to n
    pmf /= stats.poisson.sf(0, lam)  # conditioned on >= 1
    # alive[t, k]: probability that k spans, all fitting, sum to t < budget.
    alive = np.zeros((budget, budget + 1))
    alive[0, 0] = 1.0
    expected = 0.0
    count = np.arange(budget + 1)
    for total in range(budget):
        here = alive[total]
        if not here.any():
            continue
        new_total = total + lengths  # [n]
        # Span k + 1 fits iff new_total + k <= n; it ends the drawing if new_total >= budget.
        fits = new_total[:, None] + count[None, :] <= n  # [n, k]
        chance = pmf[:, None] * here[None, :]
        expected += np.sum(chance * ~fits * (total + count)[None, :])
        ends = fits & (new_total >= budget)[:, None]
        expected += np.sum(chance * ends * (new_total[:, None] + count[None, :] + 1))
        going = fits & (new_total < budget)[:, None]
        rows = np.flatnonzero(going.any(axis=1))  # distinct new totals: no repeated index
        alive[new_total[rows], 1:] += (chance[rows] * going[rows])[:, :-1]
    return float(expected)
