"""BART's noising functions (Lewis et al. 2019, section 2.2): each objective's output equals a
plain-Python transcription of the paper's definition applied to the objective's own random
draws (its noise mask from `corrupt_with_details`, text infilling's spans and the sentences'
order re-derived from the same uniform draws, the rotation read off distinct tokens); the
counts are fairseq's; the random choices have the distributions the paper names; sentence
ends read off the real vocabulary are the real text's; one compiled program serves a batch
mixing every objective."""
import functools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, strategies as st
from scipy import stats

from t5x_lite import bart_noising, objectives, presets
from t5x_lite.config import ConfigError
from t5x_lite.data import builders, pipeline
from t5x_lite.noise_lengths import OVERFLOW_PROBABILITY
from t5x_lite.objectives import BatchLayout, ObjectiveSpec

from compile_events import compilations

VOCAB, SENTINELS, RAW, BATCH = 128, 40, 32, 8
REAL_LOW, REAL_HIGH = 3, VOCAB - SENTINELS
EOS, MASK = 1, VOCAB - 1  # the mask token is <extra_id_0>
# A vocabulary's pieces, for the sentence objectives: real token t is a full stop "." when
# t % 5 == 0, a word that ends a sentence "▁so." when t % 5 == 1, a word "▁w" when t % 5 is 2,
# a word ending in '!' (no full stop: it ends none) "▁no!" when t % 5 is 3, and a word's inner
# part "x" when t % 5 == 4 (reserved ids and sentinels by name).
PIECES = (["<pad>", "</s>", "<unk>"]
          + [(".", "\u2581so.", "\u2581w", "\u2581no!", "x")[t % 5]
             for t in range(REAL_LOW, REAL_HIGH)]
          + [f"<extra_id_{i}>" for i in reversed(range(SENTINELS))])


class Pieces:
    """A vocabulary as `BatchLayout.with_sentences` reads it: its size and its pieces."""
    vocab_size = VOCAB

    @staticmethod
    def pieces():
        return PIECES


LAYOUT = BatchLayout("encoder_decoder", RAW, RAW + 1, RAW + 3, VOCAB, SENTINELS).with_sentences(
    Pieces)
WIDTH = objectives.packed_width(LAYOUT)
corrupt_jit = jax.jit(objectives.corrupt_with_details, static_argnums=3)


@functools.cache
def plans_for(layout):
    """plans(draws [B, D], densities [B], lambdas [B], valid lengths [B]) for layout's
    examples: text infilling's spans as `corrupt` draws them."""
    width = objectives.packed_width(layout)
    return jax.jit(jax.vmap(lambda draws, p, lam, n: bart_noising.infilling_plan(
        draws, p, lam, n, layout.raw_length, width)))


plans = plans_for(LAYOUT)


def drawn_plans(rng, batch, layout, density, lam, valid):
    """The text-infilling plans of a batch corrupted with rng, from the same uniform draws."""
    draws = objectives.example_draws(rng, batch, layout)[:, 3:].reshape(batch, -1)
    return jax.device_get(plans_for(layout)(draws, jnp.full(batch, density),
                                            jnp.full(batch, lam), jnp.asarray(valid)))


def make_spec(name, density=0.3, span=3.0, raw_length=RAW):
    return ObjectiveSpec(
        objective=jnp.int32(objectives.objective_id(name)), noise_density=jnp.float32(density),
        mean_noise_span_length=jnp.float32(span), random_token_fraction=jnp.float32(0.1),
        raw_length=jnp.int32(raw_length))


def raw_tokens(seed, lengths=None, batch=BATCH, raw=RAW):
    """int32[batch, raw] real tokens; row i padded with 0 after lengths[i] tokens."""
    tokens = np.random.default_rng(seed).integers(REAL_LOW, REAL_HIGH, (batch, raw), np.int32)
    if lengths is not None:
        tokens[np.arange(raw)[None, :] >= np.asarray(lengths)[:, None]] = 0
    return tokens


def unpad(row):
    row = np.asarray(row)
    length = int(np.count_nonzero(row))
    assert not row[length:].any() and row[:length].all(), f"padding inside the row: {row}"
    return row[:length].tolist()


# ------------------------------------------------------------------------------------------
# The paper's definitions, transcribed (lists of ints; the draws come from the objective)
# ------------------------------------------------------------------------------------------


def fairseq_num_to_mask(n, density):
    """fairseq's `add_whole_word_mask`: int(math.ceil(is_word_start.float().sum() * p)), a
    float32 tensor times the ratio (subword units: every token is a word start)."""
    return int(math.ceil(np.float32(n) * np.float32(density)))


def paper_token_masking(tokens, noise):
    """"random tokens are sampled and replaced with [MASK] elements"; target: the document."""
    return [MASK if z else t for t, z in zip(tokens, noise)] + [EOS], tokens + [EOS]


def paper_token_deletion(tokens, noise):
    """"random tokens are deleted from the input"; target: the document."""
    return [t for t, z in zip(tokens, noise) if not z] + [EOS], tokens + [EOS]


def paper_text_infilling(tokens, slots):
    """"each span is replaced with a single [MASK] token; 0-length spans correspond to the
    insertion of [MASK] tokens": `slots` lists, in order, None for a clean token or a span's
    length. Returns (inputs, targets, noise flags per token)."""
    inputs, noise, position = [], [], 0
    for span in slots:
        if span is None:
            inputs.append(tokens[position])
            noise.append(False)
            position += 1
        else:
            inputs.append(MASK)
            noise.extend([True] * span)
            position += span
    assert position == len(tokens), "the slots must cover the document exactly"
    return inputs + [EOS], tokens + [EOS], noise


def paper_document_rotation(tokens, start):
    """"the document is rotated so that it begins with that token"."""
    return tokens[start:] + tokens[:start] + [EOS], tokens + [EOS]


def paper_sentences(tokens, pieces=PIECES):
    """"A document is divided into sentences based on full stops": a sentence ends with an EOS
    (a document's end) or with a piece ending in '.' that a word follows; the tokens after the
    last end are a sentence too."""
    sentences, current = [], []
    for i, token in enumerate(tokens):
        current.append(token)
        follows = pieces[tokens[i + 1]] if i + 1 < len(tokens) else ""
        if token == EOS or (pieces[token][-1:] == "." and follows.startswith("\u2581")):
            sentences.append(current)
            current = []
    return sentences + [current] if current else sentences


def paper_sentence_permutation(tokens, draws):
    """"these sentences are shuffled in a random order": the order of their draws (sentence k
    has draws[k]). Returns (inputs, targets, the order)."""
    sentences = paper_sentences(tokens)
    order = sorted(range(len(sentences)), key=lambda k: draws[k])
    return [t for k in order for t in sentences[k]] + [EOS], tokens + [EOS], order


def slots_of(plan, i):
    """Example i's slots from its plan (`paper_text_infilling`'s format)."""
    return [int(plan.span_length[i, s]) if plan.is_span[i, s] else None
            for s in range(int(np.sum(plan.in_sequence[i])))]


def test_transcriptions_on_a_hand_example():
    tokens = [10, 11, 12, 13, 14, 15]
    assert paper_token_masking(tokens, [0, 1, 0, 0, 1, 0])[0] == [10, MASK, 12, 13, MASK, 15, EOS]
    assert paper_token_deletion(tokens, [0, 1, 0, 0, 1, 0])[0] == [10, 12, 13, 15, EOS]
    # A 2-token span, an insertion before 14, a 1-token span at the end.
    inputs, _, noise = paper_text_infilling(tokens, [None, 2, None, 0, None, 1])
    assert inputs == [10, MASK, 13, MASK, 14, MASK, EOS]
    assert noise == [False, True, True, False, False, True]
    assert paper_document_rotation(tokens, 4)[0] == [14, 15, 10, 11, 12, 13, EOS]
    # float32: 20 * 0.15000000596 = 3 + half an ulp, rounded to 3.0 (float64 gives 3 + 4e-16,
    # whose ceiling is 4): the count follows torch's float32 product.
    assert fairseq_num_to_mask(20, 0.15) == 3
    assert fairseq_num_to_mask(20, 0.16) == 4


# ------------------------------------------------------------------------------------------
# Token masking and token deletion
# ------------------------------------------------------------------------------------------


densities = st.floats(0.02, 0.98)
seeds = st.integers(0, 2**31 - 1)
document_lengths = st.lists(st.integers(0, RAW), min_size=BATCH, max_size=BATCH)


@given(density=densities, raw_length=st.integers(1, RAW), lengths=document_lengths, seed=seeds)
def test_token_masking_and_deletion_follow_the_paper_on_their_noise_mask(density, raw_length,
                                                                         lengths, seed):
    tokens, rng = raw_tokens(seed, lengths), jax.random.key(seed)
    masked, masked_details = corrupt_jit(tokens, make_spec("token_masking", density,
                                                           raw_length=raw_length), rng, LAYOUT)
    deleted, deleted_details = corrupt_jit(tokens, make_spec("token_deletion", density,
                                                             raw_length=raw_length), rng, LAYOUT)
    noise = np.asarray(masked_details["noise_mask"])
    # One draw: with one rng both objectives corrupt the same tokens.
    np.testing.assert_array_equal(deleted_details["noise_mask"], noise)
    assert not np.asarray(masked_details["overflow"]).any()
    assert not np.asarray(deleted_details["overflow"]).any()
    for i, length in enumerate(lengths):
        n = min(length, raw_length)
        original, flags = tokens[i, :n].tolist(), noise[i, :n].tolist()
        assert not noise[i, n:].any(), "only the document's own tokens can be noise"
        assert sum(flags) == fairseq_num_to_mask(n, density), "fairseq's exact count"
        for batch, transcription in ((masked, paper_token_masking),
                                     (deleted, paper_token_deletion)):
            inputs, targets = transcription(original, flags)
            assert unpad(batch["encoder_input_tokens"][i]) == inputs
            assert unpad(batch["decoder_target_tokens"][i]) == targets
            np.testing.assert_array_equal(batch["decoder_loss_weights"][i],
                                          np.asarray(batch["decoder_target_tokens"][i]) != 0)


def test_masked_positions_are_uniform_without_replacement():
    # 10 tokens at 30%: exactly 3 masked, each position with probability 3 / 10. Over 4096
    # examples a position's frequency has standard error sqrt(0.3 * 0.7 / 4096) = 0.0072; 5 of
    # them (0.036) bound all 10 positions with probability > 0.9999.
    examples = 4096
    layout = BatchLayout("encoder_decoder", 10, 11, 11, VOCAB, SENTINELS)
    tokens = raw_tokens(0, batch=examples, raw=10)
    _, details = corrupt_jit(tokens, make_spec("token_masking", 0.3, raw_length=10),
                             jax.random.key(1), layout)
    noise = np.asarray(details["noise_mask"])
    assert (noise.sum(axis=1) == 3).all()
    assert np.abs(noise.mean(axis=0) - 0.3).max() < 5 * math.sqrt(0.3 * 0.7 / examples)
    # Every one of the C(10, 3) = 120 subsets is drawn (each ~34 times on average).
    assert len({row.tobytes() for row in noise}) == 120


# ------------------------------------------------------------------------------------------
# Text infilling
# ------------------------------------------------------------------------------------------


@given(density=densities, span=st.floats(1.0, 8.0), raw_length=st.integers(1, RAW),
       lengths=document_lengths, seed=seeds)
def test_text_infilling_follows_the_paper_on_its_spans(density, span, raw_length, lengths, seed):
    tokens, rng = raw_tokens(seed, lengths), jax.random.key(seed)
    batch, details = corrupt_jit(tokens, make_spec("text_infilling", density, span, raw_length),
                                 rng, LAYOUT)
    # The spans, re-derived from the uniform draws corrupt gave each example.
    valid = np.minimum(lengths, raw_length)
    draws = objectives.example_draws(rng, BATCH, LAYOUT)[:, 3:].reshape(BATCH, -1)
    plan = jax.device_get(plans(draws, jnp.full(BATCH, density), jnp.full(BATCH, span),
                                jnp.asarray(valid)))
    noise, overflow = np.asarray(details["noise_mask"]), np.asarray(details["overflow"])
    for i, n in enumerate(valid):
        original, slots = tokens[i, :n].tolist(), slots_of(plan, i)
        spans = [length for length in slots if length is not None]
        budget = fairseq_num_to_mask(n, density)
        if len(slots) + 1 > LAYOUT.inputs_length:  # longer than the layout: left out, flagged
            assert overflow[i] and not np.asarray(batch["decoder_loss_weights"][i]).any()
            continue
        assert not overflow[i]
        assert sum(spans) == budget, "the span lengths cover fairseq's count exactly"
        inputs, targets, flags = paper_text_infilling(original, slots)
        assert unpad(batch["encoder_input_tokens"][i]) == inputs
        assert unpad(batch["decoder_target_tokens"][i]) == targets
        assert noise[i, :n].tolist() == flags and not noise[i, n:].any()
        assert len(spans) == plan.num_spans[i] and inputs.count(MASK) == len(spans)


def least_insertions(original, inputs):
    """Insertions the output alone proves (distinct tokens): a run of r masks between clean
    tokens that are d apart in the document replaces d - 1 tokens, each non-empty span at
    least one, so at least r - (d - 1) of its masks replace none."""
    proven, previous, run = 0, -1, 0
    for token in inputs[:-1] + [None]:  # None: the end of the document, after its last token
        if token == MASK:
            run += 1
            continue
        position = len(original) if token is None else original.index(token)
        proven += max(0, run - (position - previous - 1))
        previous, run = position, 0
    return proven


def test_zero_length_spans_insert_masks():
    # lambda = 1: a span is empty with probability e^-1, so among 64 examples' ~200 spans many
    # are; a mask that replaces no token shows in the output itself (distinct tokens).
    rng_tokens = np.random.default_rng(4)
    proven = 0
    for seed in range(8):
        tokens = np.stack([rng_tokens.permutation(np.arange(REAL_LOW, REAL_HIGH))[:RAW]
                           for _ in range(BATCH)]).astype(np.int32)
        rng = jax.random.key(seed)
        batch, details = corrupt_jit(tokens, make_spec("text_infilling", 0.2, 1.0), rng, LAYOUT)
        draws = objectives.example_draws(rng, BATCH, LAYOUT)[:, 3:].reshape(BATCH, -1)
        plan = jax.device_get(plans(draws, jnp.full(BATCH, 0.2), jnp.full(BATCH, 1.0),
                                    jnp.full(BATCH, RAW)))
        for i in range(BATCH):
            if details["overflow"][i]:
                continue
            inputs = unpad(batch["encoder_input_tokens"][i])
            empty = sum(1 for span in slots_of(plan, i) if span == 0)
            least = least_insertions(tokens[i].tolist(), inputs)
            assert least <= empty, "the output shows more insertions than were drawn"
            proven += least
    assert proven > 0, "no output shows a zero-length span's inserted mask"


def test_span_lengths_are_poisson_with_mean_lambda():
    # The draws: 20000 of them from Poisson(3). The mean's standard error is sqrt(3 / 20000)
    # = 0.012, so 4 of them (0.049) fail a correct sampler with probability 6e-5; each value's
    # frequency is within 4 of its standard errors of the Poisson pmf.
    count, lam = 20000, 3.0
    uniform = jax.random.uniform(jax.random.key(0), (count,))
    draws = np.asarray(bart_noising.poisson_lengths(uniform, lam, 64))
    assert abs(draws.mean() - lam) < 4 * math.sqrt(lam / count)
    for k in range(10):
        pmf = stats.poisson.pmf(k, lam)
        assert abs(np.mean(draws == k) - pmf) < 4 * math.sqrt(pmf * (1 - pmf) / count), k


@pytest.mark.parametrize("at_least", [0, 1])
def test_span_lengths_are_the_inverse_cdf_into_the_far_tail(at_least):
    """Each draw is the law's quantile of its uniform (scipy's, in float64), the float32
    uniforms closest to 1 included: a CDF summed from 0 in float32 stops 6e-7 short of 1 and
    sent those to the cap (a GLM span of the whole text, where Poisson(3) puts 1e-8 past 16)."""
    lam, most = 3.0, 511
    top = 1 - np.arange(1, 200, dtype=np.float64) * 2.0 ** -24  # the largest float32 below 1
    uniform = np.concatenate([np.linspace(0, 0.999, 5000), top]).astype(np.float32)
    drawn = np.asarray(bart_noising.poisson_lengths(jnp.asarray(uniform), lam, most, at_least))
    u = uniform.astype(np.float64)
    if at_least:  # the law given X >= 1: u maps to the unconditioned P(X = 0) + u P(X >= 1)
        u = stats.poisson.cdf(0, lam) + u * stats.poisson.sf(0, lam)
    cdf = stats.poisson.cdf(np.arange(most + 1), lam)
    quantile = np.searchsorted(cdf, u, side="right")  # min {k : P(X <= k) > u}
    # Where u sits within float32 rounding of a CDF step, either side is the quantile.
    near_step = np.abs(cdf[np.maximum(quantile - 1, 0)] - u) < 1e-6
    assert ((drawn == quantile) | near_step).all()
    assert drawn.min() == at_least and drawn.max() <= stats.poisson.isf(2.0 ** -24, lam) + 1


def test_spans_are_drawn_until_they_cover_the_budget():
    # 512 documents of 128 tokens at 30%: a budget of ceil(38.4) = 39 tokens. The number K of
    # Poisson(3) spans drawn until their lengths cover it has E[K] = sum_t P(K > t) =
    # sum_t P(Poisson(3 t) <= 38) (the first t draws sum to Poisson(3 t)); the sample mean is
    # within 4 standard errors of it. The mean span length, budget / K, is near lambda = 3:
    # E[K] = 13.5 = (39 + 1.5) / 3, as the last span is cut to the budget (by 1.5 tokens on
    # average), so it is 3.7% below lambda, and 4 standard errors of mean K (4 * 2.1 /
    # sqrt(512) = 0.37 of 13.5) add 2.8%: 8% fails only a wrong mean.
    examples, raw, lam = 512, 128, 3.0
    layout = BatchLayout("encoder_decoder", raw, raw + 1, raw + 1, VOCAB, SENTINELS)
    batch, details = corrupt_jit(raw_tokens(2, batch=examples, raw=raw),
                                 make_spec("text_infilling", 0.3, lam, raw), jax.random.key(2),
                                 layout)
    assert not np.asarray(details["overflow"]).any()
    budget = fairseq_num_to_mask(raw, 0.3)
    assert (np.asarray(details["noise_mask"]).sum(axis=1) == budget).all()
    num_spans = (np.asarray(batch["encoder_input_tokens"]) == MASK).sum(axis=1)
    expected = sum(stats.poisson.cdf(budget - 1, lam * t) for t in range(budget + 1))
    assert abs(num_spans.mean() - expected) < 4 * num_spans.std() / math.sqrt(examples)
    assert abs(budget / num_spans.mean() / lam - 1) < 0.08
    assert num_spans.std() > 0, "the number of spans must be random"


def test_spans_lie_uniformly_among_the_clean_tokens_in_a_uniform_order():
    # A uniformly random interleaving of spans in a uniformly random order reads the same
    # reversed: a document's first half holds as much noise as its second on average, and its
    # first span is as long as its last (not the one cut to the budget, 1.5 tokens shorter on
    # average). 512 documents of 128 tokens at 30%; 4 standard errors of each difference.
    examples, raw, lam = 512, 128, 3.0
    layout = BatchLayout("encoder_decoder", raw, raw + 1, raw + 1, VOCAB, SENTINELS)
    rng = jax.random.key(5)
    _, details = corrupt_jit(raw_tokens(5, batch=examples, raw=raw),
                             make_spec("text_infilling", 0.3, lam, raw), rng, layout)
    noise = np.asarray(details["noise_mask"]).astype(float)
    halves = noise[:, :raw // 2].sum(axis=1) - noise[:, raw // 2:].sum(axis=1)
    assert abs(halves.mean()) < 4 * halves.std() / math.sqrt(examples)
    plan = drawn_plans(rng, examples, layout, 0.3, lam, np.full(examples, raw))
    np.testing.assert_array_equal(plan.noise, details["noise_mask"])
    first_and_last = np.array([[spans[0], spans[-1]] for spans in (
        [s for s in slots_of(plan, i) if s is not None] for i in range(examples))])
    difference = first_and_last[:, 0] - first_and_last[:, 1]
    assert abs(difference.mean()) < 4 * difference.std() / math.sqrt(examples)


# ------------------------------------------------------------------------------------------
# Document rotation
# ------------------------------------------------------------------------------------------


def test_document_rotation_begins_at_a_uniformly_chosen_token():
    # Distinct tokens per row, so the start can be read off the inputs. 5-token documents:
    # each start has probability 1/5; over 2048 examples its frequency has standard error
    # sqrt(0.2 * 0.8 / 2048) = 0.0088, and 5 of them bound all 5 starts.
    examples, n = 2048, 5
    layout = BatchLayout("encoder_decoder", 8, 9, 9, VOCAB, SENTINELS)
    rng = np.random.default_rng(3)
    tokens = np.stack([rng.permutation(np.arange(REAL_LOW, REAL_HIGH))[:8]
                       for _ in range(examples)]).astype(np.int32)
    tokens[:, n:] = 0
    batch, details = corrupt_jit(tokens, make_spec("document_rotation", raw_length=8),
                                 jax.random.key(3), layout)
    assert not np.asarray(details["noise_mask"]).any(), "rotation corrupts no token"
    starts = []
    for i in range(examples):
        original = tokens[i, :n].tolist()
        inputs = unpad(batch["encoder_input_tokens"][i])
        start = original.index(inputs[0])
        assert (inputs, unpad(batch["decoder_target_tokens"][i])) == paper_document_rotation(
            original, start)
        starts.append(start)
    frequency = np.bincount(starts, minlength=n) / examples
    assert np.abs(frequency - 1 / n).max() < 5 * math.sqrt(0.2 * 0.8 / examples)


# ------------------------------------------------------------------------------------------
# Lengths, and one program for every objective
# ------------------------------------------------------------------------------------------


def overflow_by_convolution(n, inputs_length, density, lam):
    """P(text infilling overflows) for an n-token document, by summing Poisson draws directly:
    it overflows iff the first T = inputs_length - 1 - n + m draws sum to less than m."""
    m = fairseq_num_to_mask(n, density)
    pmf = stats.poisson.pmf(np.arange(m), lam)  # only sums below m matter
    below = np.zeros(m)
    below[0] = 1.0
    for _ in range(inputs_length - 1 - n + m):
        below = np.convolve(below, pmf)[:m]
    return below.sum()


def test_the_lengths_of_the_bart_objectives():
    for name in ("token_masking", "document_rotation", "sentence_permutation"):
        assert objectives.lengths_for(name, 64, 0.3, 3.0) == (63, 64, 64)
    assert (objectives.lengths_for("text_infilling_permutation", 24, 0.15, 3.0)
            == objectives.lengths_for("text_infilling", 24, 0.15, 3.0))
    # Deletion: 63 - ceil(18.9) = 44 tokens and EOS.
    assert objectives.lengths_for("token_deletion", 64, 0.3, 3.0) == (63, 45, 64)
    # Infilling: the largest raw length whose overflow probability is within the bound.
    assert objectives.lengths_for("text_infilling", 512, 0.3, 3.0) == (511, 512, 512)
    raw = objectives.lengths_for("text_infilling", 24, 0.15, 3.0)[0]
    assert raw == 19
    assert all(overflow_by_convolution(n, 24, 0.15, 3.0) <= OVERFLOW_PROBABILITY
               for n in range(1, raw + 1))
    assert overflow_by_convolution(raw + 1, 24, 0.15, 3.0) > OVERFLOW_PROBABILITY
    for name in ("token_masking", "token_deletion", "text_infilling", "document_rotation",
                 "sentence_permutation", "text_infilling_permutation"):
        raw = objectives.lengths_for(name, 24, 0.15, 3.0)[0]
        assert objectives.expected_loss_tokens(name, 24, 0.15, 3.0) == raw + 1
    noise_masks = dict(token_masking=True, token_deletion=True, text_infilling=True,
                       document_rotation=False, sentence_permutation=False,
                       text_infilling_permutation=True)
    assert {name: objectives.get(name).has_noise_mask for name in noise_masks} == noise_masks
    for name in ("text_infilling", "text_infilling_permutation"):
        assert objectives.get(name).reads == ("noise_density", "mean_noise_span_length")
        assert objectives.get(name).poisson_spans


def test_one_program_serves_a_batch_mixing_every_objective():
    """Each example its own objective (every one), in two orders, through one compiled
    program; each row is what its objective makes of it alone with the same rng."""
    names = list(objectives.names()) + ["text_infilling"] * (16 - len(objectives.names()))
    tokens, rng = raw_tokens(7, batch=len(names)), jax.random.key(7)

    def mixed_corrupt(*args):  # a function of its own: no earlier test can have compiled it
        return objectives.corrupt_with_details(*args)

    mixed_jit = jax.jit(mixed_corrupt, static_argnums=3)
    with compilations() as compiled:
        for order in (names, names[::-1]):
            singles = [make_spec(name, 0.2, 3.0) for name in order]
            spec = jax.tree.map(lambda *fields: jnp.stack(fields), *singles)
            mixed, details = mixed_jit(tokens, spec, rng, LAYOUT)
            for i, single in enumerate(singles):
                alone, alone_details = corrupt_jit(tokens, single, rng, LAYOUT)
                for key in alone:
                    np.testing.assert_array_equal(mixed[key][i], alone[key][i], err_msg=key)
                np.testing.assert_array_equal(details["noise_mask"][i],
                                              alone_details["noise_mask"][i])
    assert [name for name in compiled if "mixed_corrupt" in name] == ["jit(mixed_corrupt)"]


@pytest.mark.parametrize("changes", [dict(inputs_length=3), dict(inputs_length=4)])
def test_an_inputs_length_too_short_for_text_infilling_names_the_field(changes):
    point = dict(name="text_infilling", noise_density=0.15, mean_noise_span_length=3.0,
                 random_token_fraction=0.1, targets_length=None, **changes)
    with pytest.raises(ConfigError, match=r"objective.inputs_length=\d is too small "
                                                     r"for objective.name='text_infilling'"):
        objectives.spec_from_config(point)


# ------------------------------------------------------------------------------------------
# Sentence permutation, and text infilling + sentence permutation
# ------------------------------------------------------------------------------------------


def sentence_draws(rng, batch, layout=LAYOUT):
    """Each example's draws for the order of its sentences (`corrupt`'s first row)."""
    return np.asarray(objectives.example_draws(rng, batch, layout)[:, 0])


@given(raw_length=st.integers(1, RAW), lengths=document_lengths, seed=seeds)
def test_sentence_permutation_follows_the_paper_on_its_draws(raw_length, lengths, seed):
    tokens, rng = raw_tokens(seed, lengths), jax.random.key(seed)
    tokens[(tokens % 7 == 0) & (tokens > 0)] = EOS  # documents end inside the chunk too
    batch, details = corrupt_jit(tokens, make_spec("sentence_permutation", raw_length=raw_length),
                                 rng, LAYOUT)
    assert not np.asarray(details["noise_mask"]).any() and not details["overflow"].any()
    draws = sentence_draws(rng, BATCH)
    for i, length in enumerate(lengths):
        n = min(length, raw_length)
        inputs, targets, _ = paper_sentence_permutation(tokens[i, :n].tolist(), draws[i])
        assert unpad(batch["encoder_input_tokens"][i]) == inputs
        assert unpad(batch["decoder_target_tokens"][i]) == targets


def test_the_sentences_order_is_uniform():
    # A chunk of 3 sentences ("▁w ." "▁no! ▁so." "▁w x"): each of the 3! orders has probability
    # 1/6; over 6144 examples a frequency's standard error is sqrt(1/6 * 5/6 / 6144) = 0.0048,
    # and 5 of them bound all six with probability > 0.9999.
    examples, chunk = 6144, [7, 5, 8, 6, 12, 9]
    layout = BatchLayout("encoder_decoder", 6, 7, 7, VOCAB, SENTINELS,
                         ("sentence_permutation",)).with_sentences(Pieces)  # one branch
    assert paper_sentences(chunk) == [[7, 5], [8, 6], [12, 9]]
    batch, _ = corrupt_jit(np.tile(np.int32(chunk), (examples, 1)),
                           make_spec("sentence_permutation", raw_length=6), jax.random.key(6),
                           layout)
    inputs = np.asarray(batch["encoder_input_tokens"])[:, :6]
    orders = [tuple(chunk.index(t) // 2 for t in row[::2]) for row in inputs]
    frequency = {order: orders.count(order) / examples for order in set(orders)}
    assert len(frequency) == 6
    assert max(abs(f - 1 / 6) for f in frequency.values()) < 5 * math.sqrt(5 / 36 / examples)


def test_a_chunk_without_a_sentence_end_is_left_as_it_is():
    # Words and inner parts only: no full stop, no EOS (one sentence); and a full stop ending
    # the chunk's last word ends its only sentence.
    tokens = raw_tokens(9)
    tokens[tokens % 5 <= 1] += 2
    tokens[:, -1] = 10  # "." at the chunk's end
    for seed in range(4):
        batch, _ = corrupt_jit(tokens, make_spec("sentence_permutation"), jax.random.key(seed),
                               LAYOUT)
        for i in range(BATCH):
            assert unpad(batch["encoder_input_tokens"][i]) == tokens[i].tolist() + [EOS]


@given(density=densities, span=st.floats(1.0, 8.0), lengths=document_lengths, seed=seeds)
def test_infilling_and_permutation_is_the_permuted_text_infilled(density, span, lengths, seed):
    """fairseq's order: the sentences permuted (as sentence_permutation does with the same
    rng), then text infilling of the permuted tokens (as text_infilling does with that rng)."""
    rng_tokens = np.random.default_rng(seed)
    tokens = np.stack([rng_tokens.permutation(np.arange(REAL_LOW, REAL_HIGH))[:RAW]
                       for _ in range(BATCH)]).astype(np.int32)  # distinct: noise by value
    tokens[np.arange(RAW)[None, :] >= np.asarray(lengths)[:, None]] = 0
    rng = jax.random.key(seed)
    both, both_details = corrupt_jit(tokens, make_spec("text_infilling_permutation", density,
                                                       span), rng, LAYOUT)
    permuted = corrupt_jit(tokens, make_spec("sentence_permutation"), rng, LAYOUT)[0]
    permuted = np.asarray(permuted["encoder_input_tokens"])[:, :RAW]
    permuted = np.where(permuted == EOS, 0, permuted)  # the tokens without their EOS
    infilled, infilled_details = corrupt_jit(permuted, make_spec("text_infilling", density, span),
                                             rng, LAYOUT)
    np.testing.assert_array_equal(both["encoder_input_tokens"], infilled["encoder_input_tokens"])
    np.testing.assert_array_equal(both_details["overflow"], infilled_details["overflow"])
    noise, permuted_noise = (np.asarray(d["noise_mask"]) for d in (both_details,
                                                                    infilled_details))
    for i, n in enumerate(lengths):
        assert unpad(both["decoder_target_tokens"][i]) == tokens[i, :n].tolist() + [EOS]
        # The noise mask at the raw positions: the same tokens as infilling's of the permuted.
        assert set(tokens[i][noise[i]]) == set(permuted[i][permuted_noise[i]])
        assert noise[i].sum() == permuted_noise[i].sum() and not noise[i, n:].any()


def test_sentence_ends_read_off_the_real_vocabulary_are_the_texts(shared_data):
    """The demo preset's vocabulary on its corpus: the sentences `sentence_ends` reads off the
    token stream are those of the text's own rule, applied to the text (as SentencePiece
    normalises it): a word ending in a full stop before whitespace ends one, and so does the
    document's end; '!' and '?' end none."""
    shared_data("pretrain")
    config = presets.get_preset("demo")
    vocab = pipeline.vocabulary_from_config(config)
    records = builders.load_split(config.data.corpus, "train", config.data.data_dir or None)
    texts = [vocab.decode(vocab.encode(records[i]["text"])) for i in range(40)]
    stream = pipeline.tokenize_stream(vocab, texts)
    classes = np.frombuffer(bart_noising.sentence_classes(vocab.pieces()), np.uint8)
    ends = np.asarray(jax.jit(bart_noising.sentence_ends)(stream, len(stream), classes))
    read = [vocab.decode(sentence) for sentence in np.split(stream, np.flatnonzero(ends) + 1)
            if len(sentence)]
    expected = [sentence for text in texts if text
                for sentence in re.split(r"(?<=\.)\s+", text)]
    assert read == expected
    assert len(expected) > 100 and any(re.search(r"[!?]\s", s) for s in expected)


def test_a_run_binds_its_vocabulary_and_an_unbound_layout_is_refused():
    unbound = BatchLayout("encoder_decoder", RAW, RAW + 1, RAW + 3, VOCAB, SENTINELS,
                          ("sentence_permutation",))
    with pytest.raises(ValueError, match="runs a sentence objective but has no sentence classes"):
        unbound.require_sentences()
    other = BatchLayout("encoder_decoder", RAW, RAW + 1, RAW + 3, VOCAB, SENTINELS,
                        ("text_infilling",))
    assert other.with_sentences(Pieces) is other  # the other objectives' programs stay as they are
    config = presets.get_preset("demo")
    config.objective.name = "text_infilling_permutation"
    bound = pipeline.layout_with_vocabulary(objectives.layout_from_config(config), config)
    bound.require_sentences()
    assert bound.sentence_classes == bart_noising.sentence_classes(
        pipeline.vocabulary_from_config(config).pieces())
