"""Objectives: exact T5 counts and lengths, round trips, layouts, compile-once, bad input.

Property tests run one jitted program per layout over many hypothesis-drawn specs; expected
counts come from a plain-Python transcription of T5's arithmetic, expected i.i.d. outputs from
a plain-Python transcription of the paper's definition, and expected length distributions
from a closed form and from enumerating every mask, not from the module.
"""
import dataclasses
import itertools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, assume, strategies as st
from scipy import stats
from scipy.special import gammaln

from t5x_lite import glm, noise_lengths, objectives
from t5x_lite.config import UL2_DENOISERS, ConfigError, default_config
from t5x_lite.objectives import (
    BatchLayout, ObjectiveSpec, corrupt, iid_noise_mask, layout_for, lengths_for,
    random_prefix_split, random_spans_noise_mask, raw_length_for, spec_from_config, validate_vocab,
)
from t5x_lite.presets import get_preset

from compile_events import compilations

OBJECTIVES = objectives.names()  # the built-in objectives, in the order of their ids
INFILLING = ("text_infilling", "text_infilling_permutation")  # BART's, inputs of random length

VOCAB, SENTINELS, RAW, BATCH = 128, 40, 64, 8
REAL_LOW, REAL_HIGH = 3, VOCAB - SENTINELS  # real token ids are [3, 88)
EOS = 1
# Room for whatever any objective makes from RAW tokens, so one program serves every spec:
# iid_denoising's targets hold up to RAW + 1 noise tokens and sentinels, the final sentinel and
# EOS; it uses up to RAW / 2 + 1 = 33 sentinels. It runs ul2 with the default mixture at
# inputs_length 24 (whose denoisers read at most 42 raw tokens; see also test_ul2.py).
UL2_AT_24 = objectives.layout_for(
    [dict(name="ul2", noise_density=0.15, mean_noise_span_length=3.0, inputs_length=24)],
    "encoder_decoder", VOCAB, SENTINELS).denoisers
WIDE = {family: BatchLayout(family, RAW, RAW + 1, RAW + 3, VOCAB, SENTINELS,
                            denoisers=UL2_AT_24)
        for family in ("encoder_decoder", "decoder_only")}
corrupt_jit = jax.jit(corrupt, static_argnums=3)


# span_masks(length, densities, spans, rngs, valid_lengths) -> bool[count, length]
span_masks = jax.jit(jax.vmap(random_spans_noise_mask, in_axes=(None, 0, 0, 0, 0)),
                     static_argnums=0)


# ------------------------------------------------------------------------------------------
# Independent references
# ------------------------------------------------------------------------------------------


def t5_random_spans_helper(inputs_length, noise_density, mean_noise_span_length):
    """T5's `random_spans_helper` (t5/data/preprocessors.py), transcribed: Python floats."""
    def lengths(tokens_length):
        num_noise = int(round(tokens_length * noise_density))
        num_spans = int(round(num_noise / mean_noise_span_length))
        return tokens_length - num_noise + num_spans + 1, num_noise + num_spans + 1

    tokens_length = inputs_length - 1
    while lengths(tokens_length + 1)[0] <= inputs_length:
        tokens_length += 1
    inputs, targets = lengths(tokens_length)
    if noise_density == 0.5 and targets > inputs:
        tokens_length -= 1
        targets -= 1
    return tokens_length, targets


def expected_counts(n, density, mean_span):
    """T5 mask counts in float32 as its TensorFlow code computes them; spans as they come out
    (noise spans merge when there are fewer non-noise tokens than spans)."""
    num_noise = int(np.round(np.float32(n) * np.float32(density)))
    num_noise = min(max(num_noise, 1), n - 1)
    num_spans = max(1, int(np.round(np.float32(num_noise) / np.float32(mean_span))))
    return num_noise, min(num_spans, n - num_noise)


def runs(mask):
    """Lengths of the runs of True in a 1-D bool array."""
    padded = np.concatenate([[False], mask, [False]]).astype(int)
    edges = np.flatnonzero(np.diff(padded))
    return edges[1::2] - edges[::2]


def unpad(row):
    """Row tokens before the padding; asserts that padding (0) only occurs at the end."""
    row = np.asarray(row)
    length = int(np.count_nonzero(row))
    assert not row[length:].any() and row[:length].all(), f"padding inside the row: {row}"
    return row[:length].tolist()


def make_spec(name, density=0.15, span=3.0, raw_length=RAW, random_fraction=0.1):
    return ObjectiveSpec(
        objective=jnp.int32(objectives.objective_id(name)), noise_density=jnp.float32(density),
        mean_noise_span_length=jnp.float32(span),
        random_token_fraction=jnp.float32(random_fraction),
        raw_length=jnp.int32(raw_length))


def raw_tokens(seed, lengths=None):
    """int32[BATCH, RAW] real tokens; row i padded with 0 after lengths[i] tokens."""
    tokens = np.random.default_rng(seed).integers(REAL_LOW, REAL_HIGH, (BATCH, RAW), np.int32)
    if lengths is not None:
        tokens[np.arange(RAW)[None, :] >= np.asarray(lengths)[:, None]] = 0
    return tokens


def merge_span_corruption(inputs, targets):
    """Put the targets' spans back in place of the inputs' sentinels (EOS-free lists)."""
    spans, current = {}, None
    for token in targets:
        if token >= REAL_HIGH:
            current = spans.setdefault(token, [])
        else:
            current.append(token)
    merged = []
    for token in inputs:
        merged.extend(spans.pop(token) if token >= REAL_HIGH else [token])
    assert not spans, "a target span has no sentinel in the inputs"
    return merged


def paper_iid_denoising(tokens, noise):
    """The paper's baseline objective (section 3.1.4, Figure 2), transcribed: (inputs, targets)
    incl. EOS from lists of tokens and noise flags. Each maximal run of noise becomes one
    sentinel in the inputs, the i-th <extra_id_i> = VOCAB - 1 - i; the targets are the runs, each
    led by its sentinel, then a final sentinel."""
    inputs, targets, num_runs = [], [], 0
    for position, (token, is_noise) in enumerate(zip(tokens, noise)):
        if is_noise and (position == 0 or not noise[position - 1]):
            sentinel = VOCAB - 1 - num_runs
            num_runs += 1
            inputs.append(sentinel)
            targets.append(sentinel)
        (targets if is_noise else inputs).append(token)
    return inputs + [EOS], targets + [VOCAB - 1 - num_runs, EOS]


def paper_drop_corrupted_tokens(tokens, noise):
    """Table 5's "Drop corrupted tokens": (the clean tokens, the corrupted tokens), each + EOS."""
    return ([t for t, is_noise in zip(tokens, noise) if not is_noise] + [EOS],
            [t for t, is_noise in zip(tokens, noise) if is_noise] + [EOS])


PAPER_OBJECTIVES = {"iid_denoising": paper_iid_denoising,
                    "drop_corrupted_tokens": paper_drop_corrupted_tokens}


def test_paper_iid_denoising_transcription_gives_figure_2():
    words = "Thank you for inviting me to your party last week .".split()
    noise = [word in ("for", "inviting", "last") for word in words]
    inputs, targets = paper_iid_denoising(words, noise)
    x, y, z = VOCAB - 1, VOCAB - 2, VOCAB - 3
    assert inputs == ["Thank", "you", x, "me", "to", "your", "party", y, "week", ".", EOS]
    assert targets == [x, "for", "inviting", y, "last", z, EOS]


# The lengths of the i.i.d. objectives for n tokens of which k are noise, in r runs.
LENGTH_OF = {
    "iid_denoising": dict(inputs=lambda n, k, r: n - k + r + 1, targets=lambda n, k, r: k + r + 2,
                          sentinels=lambda n, k, r: r + 1),
    "drop_corrupted_tokens": dict(inputs=lambda n, k, r: n - k + 1, targets=lambda n, k, r: k + 1,
                                  sentinels=lambda n, k, r: 0 * k),
}


def log_comb(a, b):
    """log C(a, b) elementwise, -inf where b < 0 or b > a."""
    inside = (b >= 0) & (b <= a)
    a, b = np.maximum(a, 0), np.clip(b, 0, np.maximum(a, 0))
    return np.where(inside, gammaln(a + 1) - gammaln(b + 1) - gammaln(a - b + 1), -np.inf)


def reference_pmf(objective, length, n, p):
    """P(length == v), float64[...], for n i.i.d. Bernoulli(p) tokens, in closed form: the masks
    with k noise tokens in r runs number C(k - 1, r - 1) C(n - k + 1, r) (k split into r runs,
    put into r of the n - k + 1 gaps around the clean tokens); the all-clean mask is 1."""
    k, r = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    log_count = log_comb(k - 1, r - 1) + log_comb(n - k + 1, r)
    log_count[0, 0] = 0.0
    joint = np.exp(log_count + k * np.log(p) + (n - k) * np.log1p(-p))
    values = LENGTH_OF[objective][length](n, k, r)
    return np.bincount(values.ravel(), weights=joint.ravel())


def reference_tail(objective, length, n, p, bound):
    """P(length > bound), from `reference_pmf`."""
    return reference_pmf(objective, length, n, p)[bound + 1:].sum()


densities = st.floats(0.02, 0.98)
# The rates of the paper's grids, and any others.
grid_or_any_density = st.one_of(st.sampled_from([0.10, 0.15, 0.25, 0.50]), densities)
span_lengths = st.floats(1.0, 12.0)
seeds = st.integers(0, 2**31 - 1)


# ------------------------------------------------------------------------------------------
# Length arithmetic
# ------------------------------------------------------------------------------------------


def test_raw_length_for_gives_the_papers_lengths():
    assert raw_length_for(512, 0.15, 3) == (568, 114)
    assert raw_length_for(128, 0.15, 3) == (141, 29)


@pytest.mark.parametrize("inputs_length", [64, 100, 128, 256, 512, 1024])
@pytest.mark.parametrize("density", [0.1, 0.15, 0.25])
@pytest.mark.parametrize("span", [1, 2, 3, 5, 10])
def test_raw_length_for_matches_t5_helper(inputs_length, density, span):
    assert raw_length_for(inputs_length, density, span) == t5_random_spans_helper(
        inputs_length, density, span)


@pytest.mark.parametrize("inputs_length", [64, 128, 512])
@pytest.mark.parametrize("span", [1, 3, 10])
def test_raw_length_for_at_half_density_shortens_like_t5_with_exact_targets(inputs_length, span):
    raw, targets = raw_length_for(inputs_length, 0.5, span)
    t5_raw, t5_targets = t5_random_spans_helper(inputs_length, 0.5, span)
    assert raw == t5_raw
    num_noise, num_spans = expected_counts(raw, 0.5, span)
    assert targets == num_noise + num_spans + 1 <= t5_targets


@pytest.mark.parametrize("density, span", [(0.6, 1), (0.8, 1), (0.9, 1), (0.8, 2), (0.7, 1.5)])
def test_span_corruption_lengths_count_the_spans_the_mask_merges(density, span):
    # More spans than clean tokens: the mask merges spans, so the targets hold fewer sentinels
    # than T5's helper counts. The raw length stays the helper's; the targets length, the
    # sentinels and the effective settings are what the mask makes, for every example.
    raw, inputs_bound, targets_bound = lengths_for("span_corruption", 32, density, span)
    assert raw == t5_random_spans_helper(32, density, span)[0] <= RAW
    num_noise, num_spans = expected_counts(raw, density, span)
    assert num_spans < round(num_noise / span), "a case where spans merge"
    assert (inputs_bound, targets_bound) == (raw - num_noise + num_spans + 1,
                                             num_noise + num_spans + 1)
    point = dict(name="span_corruption", inputs_length=32, noise_density=density,
                 mean_noise_span_length=span)
    assert objectives.get("span_corruption").sentinels_needed(point, raw)[0] == num_spans
    assert objectives.get("span_corruption").effective_settings(point) == {
        "raw_length": raw, "noise_tokens": num_noise, "noise_spans": num_spans}
    batch = corrupt_jit(raw_tokens(0), make_spec("span_corruption", density, span, raw),
                        jax.random.key(0), WIDE["encoder_decoder"])
    assert (np.count_nonzero(batch["encoder_input_tokens"], axis=1) == inputs_bound).all()
    assert (np.count_nonzero(batch["decoder_target_tokens"], axis=1) == targets_bound).all()


def test_float32_rounding_ties_follow_the_device_mask_not_t5s_float64_helper():
    # 45 * 0.7 is 31.5 - 4e-15 in float64 (T5's helper: 31 noise) but 31.5 + 1e-6 in float32
    # (T5's mask: 32 noise). The length arithmetic must agree with the mask.
    assert t5_random_spans_helper(25, 0.7, 3) == (45, 42)
    assert raw_length_for(25, 0.7, 3) == (45, 44)
    masks = np.asarray(span_masks(RAW, jnp.full(BATCH, 0.7), jnp.full(BATCH, 3.0),
                                  jax.random.split(jax.random.key(0), BATCH), jnp.full(BATCH, 45)))
    for mask in masks:
        num_noise, num_spans = mask.sum(), len(runs(mask))
        assert (45 - num_noise + num_spans + 1, num_noise + num_spans + 1) == (25, 44)


@pytest.mark.parametrize("name", OBJECTIVES)
def test_lengths_for_follows_each_objectives_rule(name):
    raw, inputs, targets = lengths_for(name, 128, 0.15, 3)
    if name == "span_corruption":
        assert (raw, inputs, targets) == (141, 128, 29)
    elif name in PAPER_OBJECTIVES:  # the bounds of noise_lengths, checked below
        bounds = noise_lengths.iid_lengths(name, 128, 0.15)
        assert (raw, inputs, targets) == (bounds.raw_length, 128, bounds.targets_length)
        assert raw >= 127  # inputs are at most raw + EOS
    elif name == "ul2":  # each denoiser's, for inputs_length - 1 and its mode token
        lengths = [objectives.ul2_denoiser_lengths(d, 128) for d in UL2_DENOISERS]
        assert (raw, inputs, targets) == tuple(max(column) for column in zip(*lengths))
        assert lengths[0] == (140, 128, 29)  # span corruption at 127, then the mode token
    elif name == "token_deletion":  # ceil(127 * 0.15) = 20 tokens deleted, exactly
        assert (raw, inputs, targets) == (127, 127 - 20 + 1, 128)
    else:  # text_infilling too: its 20 masked tokens rarely (~1e-10) come in over 20 spans
        assert (raw, inputs, targets) == (127, 0 if name == "lm" else 128, 128)


@pytest.mark.parametrize("family", ["encoder_decoder", "decoder_only"])
def test_expected_loss_tokens_is_the_mean_loss_weight_of_real_batches(family):
    # 1024 full-length examples of each objective through one compiled program: the mean of
    # the summed loss weights is the closed form, within 4 standard errors (exact where the
    # objective's target count is fixed).
    examples, inputs_length, density = 1024, 24, 0.15
    tokens = np.random.default_rng(0).integers(REAL_LOW, REAL_HIGH, (examples, RAW), np.int32)
    for number, name in enumerate(OBJECTIVES):
        raw = lengths_for(name, inputs_length, density, 3.0)[0]
        batch = corrupt_jit(tokens, make_spec(name, density, 3.0, raw), jax.random.key(number),
                            WIDE[family])
        weights = np.asarray(batch["decoder_loss_weights"]).sum(axis=1)
        expected = objectives.expected_loss_tokens(name, inputs_length, density, 3.0)
        error = 4 * weights.std() / np.sqrt(examples) + 1e-6
        assert abs(weights.mean() - expected) <= error, (name, weights.mean(), expected)


def test_expected_loss_tokens_of_the_in_place_family_are_its_noise_positions():
    # encoder_only weights only the corrupted positions: about noise_density x R per example,
    # not the R + 1 targets an encoder-decoder learns from (the report's loss-token column).
    examples, inputs_length, density = 1024, 24, 0.15
    layout = BatchLayout("encoder_only", RAW, RAW + 1, 0, VOCAB, SENTINELS,
                         objectives=("bert_style", "mass_style"))
    tokens = np.random.default_rng(0).integers(REAL_LOW, REAL_HIGH, (examples, RAW), np.int32)
    for number, name in enumerate(layout.objectives):
        raw = lengths_for(name, inputs_length, density, 3.0)[0]
        batch = corrupt_jit(tokens, make_spec(name, density, 3.0, raw), jax.random.key(number),
                            layout)
        weights = np.asarray(batch["encoder_loss_weights"]).sum(axis=1)
        expected = objectives.expected_loss_tokens(name, inputs_length, density, 3.0,
                                                   family="encoder_only")
        assert expected == pytest.approx(density * raw)
        assert abs(weights.mean() - expected) <= 4 * weights.std() / np.sqrt(examples), name
        assert objectives.expected_loss_tokens(name, inputs_length, density, 3.0) == raw + 1


@pytest.mark.parametrize("objective", sorted(PAPER_OBJECTIVES))
@pytest.mark.parametrize("p", [0.1, 0.5, 0.85])
def test_length_distributions_equal_enumerating_every_mask(objective, p):
    tokens = list(range(10, 22))
    for n in range(13):
        expected = {name: np.zeros(2 * n + 3) for name in ("inputs", "targets", "sentinels")}
        for mask in itertools.product([False, True], repeat=n):
            probability = p ** sum(mask) * (1 - p) ** (n - sum(mask))
            inputs, targets = PAPER_OBJECTIVES[objective](tokens[:n], list(mask))
            expected["inputs"][len(inputs)] += probability
            expected["targets"][len(targets)] += probability
            sentinels = {t for t in inputs + targets if t >= REAL_HIGH}
            expected["sentinels"][len(sentinels)] += probability
        actual = noise_lengths.length_distributions(objective, n, p)
        for name, pmf in expected.items():
            assert len(actual[name]) <= len(pmf), name
            np.testing.assert_allclose(np.pad(actual[name], (0, len(pmf) - len(actual[name]))),
                                       pmf, rtol=1e-12, atol=1e-300, err_msg=f"n={n} {name}")
            # The closed form the bounds test relies on agrees with the enumeration too.
            closed = reference_pmf(objective, name, n, p)
            np.testing.assert_allclose(np.pad(closed, (0, len(pmf) - len(closed))), pmf,
                                       rtol=1e-9, atol=1e-300, err_msg=f"n={n} {name}")


def t5_split_tokens_to_inputs_length(inputs_length: int) -> int:
    """T5's `split_tokens_to_inputs_length` (t5/data/preprocessors.py), which its
    `iid_denoising` cuts the raw text with: pieces of the inputs length less one, for EOS."""
    max_tokens = inputs_length
    max_tokens -= 1  # room for the EOS appended after
    return max_tokens


@pytest.mark.parametrize("objective", sorted(PAPER_OBJECTIVES))
@pytest.mark.parametrize("inputs_length", [32, 128, 512])
@pytest.mark.parametrize("p", [0.10, 0.15, 0.25, 0.50])
def test_chosen_lengths_are_t5s_raw_and_the_tightest_bounds(objective, inputs_length, p):
    limit = noise_lengths.OVERFLOW_PROBABILITY
    bounds = noise_lengths.iid_lengths(objective, inputs_length, p)
    raw = bounds.raw_length
    # Every rate reads T5's raw tokens, and their inputs never overflow.
    assert raw == t5_split_tokens_to_inputs_length(inputs_length)
    assert reference_tail(objective, "inputs", raw, p, inputs_length) == 0.0
    for length, bound in (("targets", bounds.targets_length), ("sentinels", bounds.num_sentinels)):
        assert reference_tail(objective, length, raw, p, bound) <= limit, length
        if bound > 0:
            assert reference_tail(objective, length, raw, p, bound - 1) > limit, length
    assert bounds.inputs_length == inputs_length
    assert lengths_for(objective, inputs_length, p, 3.0) == (raw, inputs_length,
                                                             bounds.targets_length)


def test_the_papers_lengths_under_the_overflow_probability():
    # 512 inputs: 511 raw tokens at every rate; at 15% the targets average 144 tokens, at 50%
    # 384 (256 noise and 128 runs).
    assert noise_lengths.OVERFLOW_PROBABILITY == 1e-6
    assert dataclasses.astuple(noise_lengths.iid_lengths("iid_denoising", 512, 0.15)) == (
        511, 512, 212, 97)
    assert dataclasses.astuple(noise_lengths.iid_lengths("iid_denoising", 512, 0.5)) == (
        511, 512, 441, 156)


# ------------------------------------------------------------------------------------------
# Noise masks
# ------------------------------------------------------------------------------------------


@given(density=densities, span=span_lengths, valid=st.lists(st.integers(2, RAW), min_size=BATCH,
                                                             max_size=BATCH), seed=seeds)
def test_random_spans_noise_mask_has_exact_counts_and_t5_shape(density, span, valid, seed):
    masks = np.asarray(span_masks(RAW, jnp.full(BATCH, density), jnp.full(BATCH, span),
                                  jax.random.split(jax.random.key(seed), BATCH), jnp.array(valid)))
    for mask, n in zip(masks, valid):
        num_noise, num_spans = expected_counts(n, density, span)
        assert mask.sum() == num_noise
        assert len(runs(mask)) == num_spans
        assert not mask[0] and mask[n - 1], "spans must start with non-noise and end with noise"
        assert not mask[n:].any()


@pytest.mark.parametrize("span", [2.0, 3.0, 5.0])
def test_span_lengths_are_uniformly_random_compositions(span):
    """T5's `_random_segmentation` cuts N tokens into S non-empty spans uniformly over the
    C(N - 1, S - 1) compositions, so a mask's first noise span and first clean span have
    P(length = k) = C(N - k - 1, S - 2) / C(N - 1, S - 1). Over 4096 masks of 64 tokens each
    histogram fits that (chi-square, bins of under 5 expected merged; fixed seed)."""
    count, length = 4096, 64
    masks = np.asarray(span_masks(length, jnp.full(count, 0.15), jnp.full(count, span),
                                  jax.random.split(jax.random.key(1), count),
                                  jnp.full(count, length)))
    num_noise, num_spans = expected_counts(length, 0.15, span)
    assert num_spans >= 2  # one span has one composition
    for tokens, total in ((masks, num_noise), (~masks, length - num_noise)):
        first = np.array([runs(mask)[0] for mask in tokens])
        k = np.arange(1, total - num_spans + 2)
        expected = count * np.array([math.comb(total - j - 1, num_spans - 2) for j in k]) / (
            math.comb(total - 1, num_spans - 1))
        observed = np.bincount(first, minlength=k[-1] + 1)[1:]
        keep = np.flatnonzero(np.cumsum(expected[::-1])[::-1] >= 5)[-1]  # the last bin with
        expected = np.append(expected[:keep], expected[keep:].sum())  # >= 5 takes the tail
        observed = np.append(observed[:keep], observed[keep:].sum())
        assert stats.chisquare(observed, expected).pvalue > 1e-4, (total, observed, expected)


def test_iid_noise_mask_rate_and_valid_length():
    masks = jax.vmap(lambda r: iid_noise_mask(RAW, 0.25, r, 40))(
        jax.random.split(jax.random.key(2), 512))
    masks = np.asarray(masks)
    assert not masks[:, 40:].any()
    assert abs(masks[:, :40].mean() - 0.25) < 0.01


corrupt_with_details_jit = jax.jit(objectives.corrupt_with_details, static_argnums=3)


@pytest.mark.parametrize("p", [0.10, 0.15, 0.25, 0.50])
def test_iid_denoising_noise_is_independent_per_token(p):
    spec, layout = make_spec("iid_denoising", p), WIDE["encoder_decoder"]
    masks = np.concatenate([
        np.asarray(corrupt_with_details_jit(raw_tokens(seed), spec, jax.random.key(seed),
                                            layout)[1]["noise_mask"])
        for seed in range(64)])  # 512 examples of RAW tokens
    noise_fraction = masks.mean(axis=1)
    num_runs = np.array([len(runs(mask)) for mask in masks])
    # E[runs] = p (the first token) + (RAW - 1) p (1 - p) (a noise token after a clean one).
    for observed, expected in ((noise_fraction, p), (num_runs, RAW * p * (1 - p) + p)):
        assert abs(observed.mean() - expected) < 5 * observed.std() / np.sqrt(len(observed))
    assert len(set(masks.sum(axis=1))) > 5, "the number of noise tokens must vary"
    assert max(max(runs(mask), default=0) for mask in masks) > 1, "noise tokens can be adjacent"
    if p == 0.5:  # every mask has probability 2^-64: all 512 must differ
        assert len({mask.tobytes() for mask in masks}) == len(masks)


def test_random_prefix_split_is_uniform_over_1_to_n_minus_1():
    splits = np.asarray(jax.vmap(lambda r: random_prefix_split(6, r))(
        jax.random.split(jax.random.key(3), 2000)))
    values, counts = np.unique(splits, return_counts=True)
    assert values.tolist() == [1, 2, 3, 4, 5]
    assert counts.min() > 2000 / 5 * 0.8


# ------------------------------------------------------------------------------------------
# Encoders
# ------------------------------------------------------------------------------------------


@given(density=densities, span=span_lengths, raw_length=st.integers(2, RAW), seed=seeds)
def test_span_corruption_round_trips(density, span, raw_length, seed):
    tokens = raw_tokens(seed)
    spans = corrupt_jit(tokens, make_spec("span_corruption", density, span, raw_length),
                        jax.random.key(seed), WIDE["encoder_decoder"])
    num_noise, num_spans = expected_counts(raw_length, density, span)
    sentinels = list(range(VOCAB - 1, VOCAB - 1 - num_spans, -1))
    for i in range(BATCH):
        inputs = unpad(spans["encoder_input_tokens"][i])
        targets = unpad(spans["decoder_target_tokens"][i])
        assert inputs[-1] == targets[-1] == 1
        assert len(inputs) == raw_length - num_noise + num_spans + 1
        assert len(targets) == num_noise + num_spans + 1
        assert [t for t in inputs if t >= REAL_HIGH] == sentinels
        assert [t for t in targets if t >= REAL_HIGH] == sentinels
        assert targets[0] == VOCAB - 1, "targets start with <extra_id_0>"
        assert merge_span_corruption(inputs[:-1], targets[:-1]) == tokens[i, :raw_length].tolist()


@given(name=st.sampled_from(sorted(PAPER_OBJECTIVES)), density=grid_or_any_density,
       raw_length=st.integers(1, RAW),
       lengths=st.lists(st.integers(0, RAW), min_size=BATCH, max_size=BATCH), seed=seeds)
def test_iid_objectives_follow_the_papers_definition_on_their_noise_mask(name, density,
                                                                         raw_length, lengths, seed):
    tokens = raw_tokens(seed, lengths)
    spec = make_spec(name, density, raw_length=raw_length)
    batch, details = corrupt_with_details_jit(tokens, spec, jax.random.key(seed),
                                              WIDE["encoder_decoder"])
    noise = np.asarray(details["noise_mask"])
    assert not np.asarray(details["overflow"]).any()
    for i, length in enumerate(lengths):
        n = min(length, raw_length)
        assert not noise[i, n:].any(), "only the example's own tokens can be noise"
        inputs, targets = PAPER_OBJECTIVES[name](tokens[i, :n].tolist(), noise[i, :n].tolist())
        assert unpad(batch["encoder_input_tokens"][i]) == inputs
        assert unpad(batch["decoder_target_tokens"][i]) == targets
        np.testing.assert_array_equal(batch["decoder_loss_weights"][i],
                                      np.asarray(batch["decoder_target_tokens"][i]) != 0)
    # Both draw the same mask: with one rng they corrupt the same tokens.
    other = "drop_corrupted_tokens" if name == "iid_denoising" else "iid_denoising"
    _, other_details = corrupt_with_details_jit(tokens, make_spec(other, density,
                                                                  raw_length=raw_length),
                                                jax.random.key(seed), WIDE["encoder_decoder"])
    np.testing.assert_array_equal(other_details["noise_mask"], noise)


def test_iid_denoising_without_noise_keeps_the_text_and_targets_the_final_sentinel():
    tokens = raw_tokens(8)
    batch = corrupt_jit(tokens, make_spec("iid_denoising", density=0.0), jax.random.key(8),
                        WIDE["encoder_decoder"])
    for i in range(BATCH):
        assert unpad(batch["encoder_input_tokens"][i]) == tokens[i].tolist() + [EOS]
        assert unpad(batch["decoder_target_tokens"][i]) == [VOCAB - 1, EOS]


# Every objective, each with its own draws: sampled from all of them, hypothesis left some out.
@pytest.mark.parametrize("name", OBJECTIVES)
@settings(max_examples=4)
@given(density=densities, span=span_lengths,
       fraction=st.floats(0.0, 1.0), lengths=st.lists(st.integers(2, RAW), min_size=BATCH,
                                                      max_size=BATCH), seed=seeds)
def test_outputs_use_only_real_tokens_eos_and_their_own_special_ids(name, density, span, fraction,
                                                                    lengths, seed):
    tokens = raw_tokens(seed, lengths)  # rows end in padding: each uses its real tokens only
    batch, details = corrupt_with_details_jit(tokens, make_spec(name, density, span, RAW, fraction),
                                              jax.random.key(seed), WIDE["encoder_decoder"])
    overflow = np.asarray(details["overflow"])
    # WIDE holds every output but text infilling's with many zero-length spans (flagged).
    assert name in INFILLING or not overflow.any()
    for i, n in enumerate(lengths):
        if overflow[i]:
            continue
        original = tokens[i, :n].tolist()
        inputs = unpad(batch["encoder_input_tokens"][i])
        targets = unpad(batch["decoder_target_tokens"][i])
        # blank_infilling's targets end each span with GLM's [END], <extra_id_1> (t5x_lite.glm).
        last = VOCAB - 2 if name == "blank_infilling" else 1
        assert inputs[-1] == 1 and targets[-1] == last
        assert 1 not in inputs[:-1] and 1 not in targets[:-1]
        inputs, targets = inputs[:-1], targets[:-1]
        np.testing.assert_array_equal(batch["decoder_loss_weights"][i],
                                      np.asarray(batch["decoder_target_tokens"][i]) != 0)
        np.testing.assert_array_equal(batch["decoder_input_tokens"][i][1:],
                                      batch["decoder_target_tokens"][i][:-1])
        if name in ("span_corruption", "drop_corrupted_tokens", "iid_denoising"):
            assert sorted(t for t in inputs + targets if t < REAL_HIGH) == sorted(original)
        elif name in ("bert_style", "mass_style"):
            assert targets == original and len(inputs) == n
            changed = [t for t, o in zip(inputs, original) if t != o]
            assert all(t == VOCAB - 1 or (name == "bert_style" and REAL_LOW <= t < REAL_HIGH)
                       for t in changed)
        elif name == "deshuffling":
            assert targets == original and sorted(inputs) == sorted(original)
        elif name == "prefix_lm":
            assert 1 <= len(inputs) <= n - 1 and inputs + targets == original
        elif name in ("token_masking", *INFILLING):
            assert targets == original
            assert all(REAL_LOW <= t < REAL_HIGH or t == VOCAB - 1 for t in inputs)
            assert len(inputs) == n if name == "token_masking" else VOCAB - 1 in inputs
        elif name == "token_deletion":
            assert targets == original and all(REAL_LOW <= t < REAL_HIGH for t in inputs)
            assert len(inputs) == n - int(np.ceil(np.float32(n) * np.float32(density)))
        elif name == "document_rotation":
            assert targets == original and any(inputs == original[k:] + original[:k]
                                               for k in range(n))
        elif name == "ul2":  # a mode token, then its denoiser's corruption of a first part
            first_mode = VOCAB - SENTINELS
            assert first_mode <= inputs[0] < first_mode + 3
            rest = inputs[1:] + targets
            real = [t for t in rest if t < REAL_HIGH]
            assert sorted(real) == sorted(original[:len(real)])
            assert all(first_mode + 3 <= t < VOCAB for t in rest if t >= REAL_HIGH)
        elif name == "sentence_permutation":
            assert targets == original and sorted(inputs) == sorted(original)
        elif name == "blank_infilling":  # a mask per span in Part A, the spans in Part B
            assert inputs.count(VOCAB - 1) == targets.count(VOCAB - 2) + 1
            assert sorted(t for t in inputs + targets if t < REAL_HIGH) == sorted(original)
        else:  # lm: the encoder gets a lone EOS
            assert inputs == [] and targets == original


def test_deshuffling_inputs_are_a_real_permutation_and_targets_the_original():
    """The property test above would pass if deshuffling left the inputs in order: here each
    row holds distinct tokens, so the permutation can be read off and checked to be one."""
    lengths = [RAW, 40, 16, 8, 5, 3, 2, RAW]
    rng = np.random.default_rng(11)
    tokens = np.stack([rng.permutation(np.arange(REAL_LOW, REAL_HIGH))[:RAW] for _ in range(BATCH)])
    tokens = tokens.astype(np.int32)
    tokens[np.arange(RAW)[None, :] >= np.asarray(lengths)[:, None]] = 0
    orders = []
    for seed in range(3):
        batch = corrupt_jit(tokens, make_spec("deshuffling"), jax.random.key(seed),
                            WIDE["encoder_decoder"])
        perms, fixed, long_positions = [], 0, 0
        for i, n in enumerate(lengths):
            original = tokens[i, :n].tolist()
            inputs = unpad(batch["encoder_input_tokens"][i])
            assert unpad(batch["decoder_target_tokens"][i]) == original + [EOS]  # restores it
            assert inputs[-1] == EOS and sorted(inputs[:-1]) == sorted(original)
            perm = [original.index(t) for t in inputs[:-1]]
            perms.append(perm)
            if n >= 8:
                assert perm != list(range(n)), f"row {i} (seed {seed}) left in order"
            if n >= 16:
                fixed += sum(p == k for k, p in enumerate(perm))
                long_positions += n
        # A uniform shuffle keeps about 1 token in n in place, not most of them.
        assert fixed / long_positions < 0.2, (seed, fixed, long_positions)
        orders.append(perms)
    assert len({tuple(order[0]) for order in orders}) == 3  # another rng, another order


def test_bert_style_random_token_share_and_mass_style_masks_only():
    tokens, rng, layout = raw_tokens(4), jax.random.key(4), WIDE["encoder_decoder"]
    bert, mass = (np.asarray(corrupt_jit(tokens, make_spec(name, 0.5, 1, RAW, 0.3), rng, layout)
                             ["encoder_input_tokens"])[:, :RAW]
                  for name in ("bert_style", "mass_style"))
    masked = mass != tokens
    assert (mass[masked] == VOCAB - 1).all(), "mass_style ignores random_token_fraction"
    assert abs(masked.mean() - 0.5) < 0.1
    # Same rng: the same noise positions, now ~30% random real tokens instead of the mask.
    assert ((bert != tokens) <= masked).all()
    replaced = bert[masked]
    assert 0.2 < (replaced != VOCAB - 1).mean() < 0.4
    assert ((replaced == VOCAB - 1) | ((replaced >= REAL_LOW) & (replaced < REAL_HIGH))).all()


# ------------------------------------------------------------------------------------------
# Layouts and lengths
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", OBJECTIVES)
@settings(max_examples=3)
@given(inputs_length=st.integers(3, 24), density=st.floats(0.05, 0.6), span=span_lengths,
       seed=seeds)
def test_outputs_fit_the_lengths_the_arithmetic_promises(name, inputs_length, density, span, seed):
    if name == "ul2":  # its lengths are its mixture's, which WIDE holds at inputs_length 24
        inputs_length = 24
    raw, inputs_bound, targets_bound = lengths_for(name, inputs_length, density, span)
    assume(raw <= RAW)
    batch = corrupt_jit(raw_tokens(seed), make_spec(name, density, span, raw), jax.random.key(seed),
                        WIDE["encoder_decoder"])
    input_lengths = np.count_nonzero(batch["encoder_input_tokens"], axis=1)
    target_lengths = np.count_nonzero(batch["decoder_target_tokens"], axis=1)
    # The i.i.d. objectives' bounds hold but for a share <= 1e-6 of examples: with hypothesis
    # derandomized, these 3 x 8 examples of each are within them.
    assert input_lengths.max() <= max(inputs_bound, 1) <= inputs_length
    assert target_lengths.max() <= targets_bound
    if name in ("lm", "token_masking", "token_deletion", "document_rotation",
                *INFILLING, "sentence_permutation"):
        assert target_lengths.min() == targets_bound, "these objectives' lengths are exact"
    if name == "span_corruption":  # exact too, but for noise spans that merge (fewer sentinels)
        num_noise, num_spans = expected_counts(raw, density, span)
        assert (target_lengths == num_noise + num_spans + 1).all()


@pytest.mark.parametrize("name", OBJECTIVES)
@settings(max_examples=3)
@given(density=densities, span=span_lengths, raw_length=st.integers(2, RAW), seed=seeds)
def test_decoder_only_row_is_inputs_then_targets(name, density, span, raw_length, seed):
    tokens, rng = raw_tokens(seed), jax.random.key(seed)
    spec = make_spec(name, density, span, raw_length)
    pair, details = corrupt_with_details_jit(tokens, spec, rng, WIDE["encoder_decoder"])
    row = corrupt_jit(tokens, spec, rng, WIDE["decoder_only"])
    assert row["decoder_target_tokens"].shape == (BATCH, 2 * RAW + 4)
    # Only text infilling can overflow WIDE; each family cuts an overflowing example its way.
    assert (name in INFILLING
            or not np.asarray(details["overflow"]).any())
    for i in np.flatnonzero(~np.asarray(details["overflow"])):
        inputs = [] if name == "lm" else unpad(pair["encoder_input_tokens"][i])
        targets = unpad(pair["decoder_target_tokens"][i])
        sequence = np.asarray(row["decoder_target_tokens"][i])
        assert unpad(sequence) == inputs + targets
        position = np.arange(sequence.shape[0])
        is_target = (position >= len(inputs)) & (position < len(inputs) + len(targets))
        np.testing.assert_array_equal(row["decoder_loss_weights"][i], is_target)
        np.testing.assert_array_equal(row["inputs_mask"][i],
                                      (position <= len(inputs)) & bool(inputs))
        np.testing.assert_array_equal(row["decoder_input_tokens"][i], np.r_[0, sequence[:-1]])


@pytest.mark.parametrize("family", ["encoder_decoder", "decoder_only"])
def test_a_grid_shares_one_layout_and_one_compilation(family):
    points = [dict(name=name, noise_density=density, mean_noise_span_length=span, inputs_length=24)
              for name in OBJECTIVES for density in (0.1, 0.15, 0.5) for span in (1.0, 3.0, 10.0)]
    layout = layout_for(points, family, VOCAB, SENTINELS)
    assert layout.raw_length == max(lengths_for(p["name"], 24, p["noise_density"],
                                                p["mean_noise_span_length"])[0] for p in points)
    def grid_step(*args):  # a function of its own: no earlier test can have compiled it
        return corrupt(*args)

    step = jax.jit(grid_step, static_argnums=3)
    tokens = np.random.default_rng(5).integers(REAL_LOW, REAL_HIGH, (2, layout.raw_length),
                                               np.int32)
    batches = []
    with compilations() as compiled:
        for i, point in enumerate(points):
            batches.append(step(tokens, spec_from_config(point), jax.random.key(i), layout))
    assert [name for name in compiled if "grid_step" in name] == ["jit(grid_step)"]
    for point, batch in zip(points, batches):
        expected = ({"encoder_input_tokens": layout.inputs_length,
                     "decoder_target_tokens": layout.targets_length} if family == "encoder_decoder"
                    else {"decoder_target_tokens": layout.inputs_length + layout.targets_length})
        for key, length in expected.items():
            assert batch[key].shape == (2, length)
            # Every row ends with EOS, but a decoder-only blank_infilling row with Part B's
            # last [END] (t5x_lite.glm).
            last = (glm.end_token(layout.vocab_size)
                    if point["name"] == glm.NAME and key == "decoder_target_tokens" else 1)
            for row in np.asarray(batch[key]):
                assert unpad(row)[-1] == last, f"{point}: its last token cut off {key}"


def test_a_layout_compiles_only_its_grids_objectives_and_corrupts_as_the_full_one():
    points = [dict(name=name, noise_density=0.15, mean_noise_span_length=3.0, inputs_length=24)
              for name in ("text_infilling", "span_corruption", "lm")]
    layout = layout_for(points, "encoder_decoder", VOCAB, SENTINELS)
    assert layout.objectives == ("span_corruption", "lm", "text_infilling")  # registry order
    full = dataclasses.replace(layout, objectives=OBJECTIVES)
    tokens = np.random.default_rng(9).integers(REAL_LOW, REAL_HIGH, (3, layout.raw_length),
                                               np.int32)
    for i, point in enumerate(points):
        spec, rng = spec_from_config(point), jax.random.key(i)
        subset, every = corrupt_jit(tokens, spec, rng, layout), corrupt_jit(tokens, spec, rng, full)
        for key in every:
            np.testing.assert_array_equal(subset[key], every[key], err_msg=f"{point['name']} {key}")
    # The lowered program holds one branch per objective of its layout, and no switch for one.
    def branches(layout):
        text = jax.jit(corrupt, static_argnums=3).lower(
            tokens, spec_from_config(points[0]), jax.random.key(0), layout).as_text()
        return text.count("stablehlo.case")
    assert branches(layout) >= 1
    assert branches(layout_for(points[1:2], "encoder_decoder", VOCAB, SENTINELS)) == 0
    with pytest.raises(ConfigError, match=r"objective.name='bert_style' is not in the batch layout"):
        layout.require_objective("bert_style")


def test_per_example_specs_and_a_vmapped_sweep_match_single_specs():
    tokens, rng, layout = raw_tokens(6), jax.random.key(6), WIDE["encoder_decoder"]
    names = [OBJECTIVES[i % len(OBJECTIVES)] for i in range(BATCH)]
    singles = [make_spec(name, 0.1 + 0.05 * i, 1 + i, RAW - i) for i, name in enumerate(names)]
    per_example = jax.tree.map(lambda *fields: jnp.stack(fields), *singles)
    mixed = corrupt_jit(tokens, per_example, rng, layout)
    swept = jax.jit(jax.vmap(corrupt, in_axes=(None, 0, None, None)), static_argnums=3)(
        tokens, per_example, rng, layout)
    for i, spec in enumerate(singles):
        alone = corrupt_jit(tokens, spec, rng, layout)
        for key in alone:
            np.testing.assert_array_equal(mixed[key][i], alone[key][i])
            np.testing.assert_array_equal(swept[key][i], alone[key])


def test_spec_and_layout_from_the_presets():
    spec = spec_from_config(default_config().objective)
    assert (int(spec.objective), int(spec.raw_length)) == (0, 568)
    tiny = get_preset("tiny")
    layout = layout_for([tiny.objective], "encoder_decoder", tiny.model.vocab_size,
                        tiny.model.num_sentinels)
    # The preset's targets_length (32) pads the 29 targets span corruption needs.
    # No sentence classes: span corruption reads no sentences.
    assert dataclasses.astuple(layout) == ("encoder_decoder", 141, 128, 32, 8192, 100,
                                           ("span_corruption",), (), None)


# ------------------------------------------------------------------------------------------
# Bad input
# ------------------------------------------------------------------------------------------


def objective(**changes):
    return dict(dict(name="span_corruption", noise_density=0.15, mean_noise_span_length=3.0,
                     random_token_fraction=0.1, inputs_length=64, targets_length=None), **changes)


@pytest.mark.parametrize("changes, message", [
    (dict(name="t5"), r"objective.name='t5' is not allowed; choose one of span_corruption, "),
    (dict(noise_density=0.0), r"objective.noise_density=0.0 .* in \(0, 1\)"),
    (dict(noise_density=1.0), r"objective.noise_density=1.0 .* in \(0, 1\)"),
    (dict(noise_density="0.15"), r"objective.noise_density='0.15' .* in \(0, 1\)"),
    (dict(mean_noise_span_length=0.5), r"objective.mean_noise_span_length=0.5 .* >= 1"),
    (dict(random_token_fraction=1.5), r"objective.random_token_fraction=1.5 .* in \[0, 1\]"),
    (dict(inputs_length=2), r"objective.inputs_length=2 .* an integer >= 3"),
    (dict(inputs_length=64.0), r"objective.inputs_length=64.0 .* an integer >= 3"),
    (dict(targets_length=12), r"objective.targets_length=12 .* None or an integer >= "
                              rf"{t5_random_spans_helper(64, 0.15, 3)[1]}, .*'span_corruption'"),
    (dict(name="lm", targets_length=32), r"objective.targets_length=32 .* >= 64, .*'lm'"),
    (dict(name="iid_denoising", targets_length=40),
     r"objective.targets_length=40 is not allowed; it must be None or an integer >= "
     rf"{noise_lengths.iid_lengths('iid_denoising', 64, 0.15).targets_length}, the targets "
     r"length of objective.name='iid_denoising' with inputs_length=64, noise_density=0.15$"),
])
def test_bad_objective_config_is_rejected_with_the_field_named(changes, message):
    # targets_length pads a layout's targets: the layout (which knows the family) checks it.
    if "targets_length" not in changes:
        with pytest.raises(ConfigError, match=message):
            spec_from_config(objective(**changes))
    with pytest.raises(ConfigError, match=message):
        layout_for([objective(), objective(**changes)], "encoder_decoder", VOCAB, SENTINELS)


def test_a_family_predicting_in_place_has_no_target_positions_and_ignores_targets_length():
    point = objective(name="bert_style", targets_length=12)  # short of bert_style's 64
    spec_from_config(point)
    layout = layout_for([point], "encoder_only", VOCAB, SENTINELS)
    assert (layout.raw_length, layout.inputs_length, layout.targets_length) == (63, 64, 0)
    with pytest.raises(ConfigError, match=r"objective.targets_length=12 .* >= 64"):
        layout_for([point], "encoder_decoder", VOCAB, SENTINELS)


def test_bad_vocabulary_family_and_points_are_rejected():
    with pytest.raises(ConfigError, match=r"model.num_sentinels=0 .* at least 1"):
        validate_vocab(1000, 0)
    with pytest.raises(ConfigError, match=r"model.vocab_size=103 .* at least num_sentinels \+ 4"):
        validate_vocab(103, 100)
    # 0.5 density and span 1 on 64 inputs makes 31 spans: 30 sentinels are too few.
    with pytest.raises(ConfigError, match=r"model.num_sentinels=30 .* up to 31 spans"):
        layout_for([objective(noise_density=0.5, mean_noise_span_length=1.0)], "encoder_decoder",
                   VOCAB, 30)
    # Runs of noise and the final sentinel: 26 cover all but 1e-6 of 0.5-density examples.
    assert noise_lengths.iid_lengths("iid_denoising", 64, 0.5).num_sentinels == 26
    with pytest.raises(ConfigError) as error:
        layout_for([objective(name="iid_denoising", noise_density=0.5)], "encoder_decoder",
                   VOCAB, 25)
    assert re.fullmatch(r"model.num_sentinels=25 is too small for objective.name='iid_denoising' "
                        r"with inputs_length=64, noise_density=0.5: .* so it needs at least 26 "
                        r"sentinels", str(error.value)), str(error.value)
    assert layout_for([objective(name="iid_denoising", noise_density=0.5)], "encoder_decoder",
                      VOCAB, 26).num_sentinels == 26
    with pytest.raises(ConfigError, match=r"family='causal' is not allowed; choose one of "
                                          r"encoder_decoder, decoder_only"):
        layout_for([objective()], "causal", VOCAB, SENTINELS)
    with pytest.raises(ConfigError, match="points is empty"):
        layout_for([], "encoder_decoder", VOCAB, SENTINELS)
    with pytest.raises(ValueError, match=f"layout.raw_length={RAW}"):
        corrupt(np.ones((2, RAW - 1), np.int32), make_spec("lm"), jax.random.key(0),
                WIDE["encoder_decoder"])


# ------------------------------------------------------------------------------------------
# Details: the noise mask the objective drew, and examples that overflow the layout
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", OBJECTIVES)
def test_details_noise_mask_is_what_the_objective_corrupted(name):
    tokens = raw_tokens(3)
    batch, details = corrupt_with_details_jit(tokens, make_spec(name, density=0.3),
                                              jax.random.key(5), WIDE["encoder_decoder"])
    noise = np.asarray(details["noise_mask"])
    assert noise.shape == tokens.shape and not np.asarray(details["overflow"]).any()
    if not objectives.get(name).has_noise_mask:
        assert not noise.any()
        return
    inputs = np.asarray(batch["encoder_input_tokens"])
    if name == "ul2":  # only its S-denoiser's examples (mode token [S2S]) corrupt nothing
        s2s = inputs[:, 0] == VOCAB - SENTINELS + 2
        assert (noise.any(axis=1) == ~s2s).all()
        for row, mask, out in zip(tokens[~s2s], noise[~s2s], inputs[~s2s]):
            # Its denoiser reads a first part of the row: its clean tokens, in order.
            seen = [t for t in unpad(out) if REAL_LOW <= t < REAL_HIGH]
            assert seen == row[~mask].tolist()[:len(seen)]
        return
    assert noise.any(axis=1).all()
    for row, mask, out in zip(tokens, noise, inputs):
        # Every clean token reaches the inputs unchanged and in order; no noise token survives
        # where the objective replaces or drops it.
        clean = row[~mask].tolist()
        if name in ("bert_style", "mass_style", "token_masking"):
            assert out[:RAW][~mask].tolist() == clean
        else:
            assert [t for t in unpad(out) if REAL_LOW <= t < REAL_HIGH] == clean


def test_overflowing_examples_are_counted_and_left_out_of_the_loss():
    # The lm objective's targets are the whole valid span + EOS; a layout with room for 40
    # target tokens fits rows of <= 39 tokens and must flag (not silently cut) the others.
    lengths = [10, 39, 40, 64, 5, 64, 20, 41]
    layout = BatchLayout("encoder_decoder", RAW, 1, 40, VOCAB, SENTINELS)
    batch, details = corrupt_with_details_jit(raw_tokens(4, lengths), make_spec("lm"),
                                              jax.random.key(0), layout)
    overflow = np.asarray(details["overflow"])
    np.testing.assert_array_equal(overflow, np.asarray(lengths) + 1 > 40)
    weights = np.asarray(batch["decoder_loss_weights"])
    assert not weights[overflow].any()
    np.testing.assert_array_equal(weights[~overflow].sum(axis=1),
                                  np.asarray(lengths)[~overflow] + 1)


def test_sentinel_overflow_is_counted_and_never_emits_a_real_token_id():
    # Three sentinels: an i.i.d. example with three or more runs of noise needs a fourth (its
    # final sentinel). Ids 88..124 are real tokens of this vocabulary that raw_tokens never uses.
    layout = BatchLayout("encoder_decoder", RAW, RAW + 1, RAW + 3, VOCAB, 3)
    tokens = raw_tokens(9, [0, 1, 2, 3, 5, 8, 20, RAW])
    overflowed = []
    for seed in range(8):
        batch, details = corrupt_with_details_jit(tokens, make_spec("iid_denoising", 0.5),
                                                  jax.random.key(seed), layout)
        noise, overflow = np.asarray(details["noise_mask"]), np.asarray(details["overflow"])
        num_runs = np.array([len(runs(mask)) for mask in noise])
        np.testing.assert_array_equal(overflow, num_runs + 1 > 3)
        weights = np.asarray(batch["decoder_loss_weights"])
        assert not weights[overflow].any() and weights[~overflow].any(axis=1).all()
        for i in range(BATCH):
            inputs = unpad(batch["encoder_input_tokens"][i])
            targets = unpad(batch["decoder_target_tokens"][i])
            made = [t for t in inputs + targets if t >= REAL_HIGH]
            assert all(t >= VOCAB - 3 for t in made), f"a real token's id among {made}"
            if not overflow[i]:
                n = int(np.count_nonzero(tokens[i]))
                assert (inputs, targets) == paper_iid_denoising(tokens[i, :n].tolist(),
                                                                noise[i, :n].tolist())
        overflowed.extend(overflow)
    assert 0 < sum(overflowed) < len(overflowed)
