"""Objectives: exact T5 counts and lengths, round trips, layouts, compile-once, bad input.

Property tests run one jitted program per layout over many hypothesis-drawn specs; expected
counts come from a plain-Python transcription of T5's arithmetic, not from the module.
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, assume, strategies as st

from t5x_lite import objectives
from t5x_lite.config import ConfigError, default_config
from t5x_lite.objectives import (
    OBJECTIVES, BatchLayout, ObjectiveSpec, corrupt, iid_noise_mask, layout_for, lengths_for,
    random_prefix_split, random_spans_noise_mask, raw_length_for, spec_from_config, validate_vocab,
)
from t5x_lite.presets import get_preset

VOCAB, SENTINELS, RAW, BATCH = 128, 40, 64, 8
REAL_LOW, REAL_HIGH = 3, VOCAB - SENTINELS  # real token ids are [3, 88)
# Room for whatever any objective makes from RAW tokens, so one program serves every spec.
WIDE = {family: BatchLayout(family, RAW, RAW + 1, RAW + 1, VOCAB, SENTINELS)
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
        objective=jnp.int32(OBJECTIVES.index(name)), noise_density=jnp.float32(density),
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


densities = st.floats(0.02, 0.98)
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
    elif name == "drop_corrupted_tokens":
        num_noise, _ = expected_counts(raw, 0.15, 3)
        one_more_inputs = raw + 1 - expected_counts(raw + 1, 0.15, 3)[0] + 1
        assert raw - num_noise + 1 == inputs <= 128 < one_more_inputs
        assert targets == num_noise + 1
    else:
        assert (raw, inputs, targets) == (127, 0 if name == "lm" else 128, 128)


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
def test_mean_noise_span_length_is_within_5_percent(span):
    count, length = 64, 512
    rngs = jax.random.split(jax.random.key(1), count)
    masks = np.asarray(span_masks(length, jnp.full(count, 0.15), jnp.full(count, span), rngs,
                                  jnp.full(count, length)))
    span_lengths = np.concatenate([runs(mask) for mask in masks])
    assert abs(span_lengths.mean() / span - 1) < 0.05
    assert span_lengths.std() > 0, "span lengths must be random, not all equal"


def test_iid_noise_mask_rate_and_valid_length():
    masks = jax.vmap(lambda r: iid_noise_mask(RAW, 0.25, r, 40))(
        jax.random.split(jax.random.key(2), 512))
    masks = np.asarray(masks)
    assert not masks[:, 40:].any()
    assert abs(masks[:, :40].mean() - 0.25) < 0.01


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
def test_span_corruption_and_drop_tokens_round_trip(density, span, raw_length, seed):
    tokens = raw_tokens(seed)
    rng = jax.random.key(seed)
    spans = corrupt_jit(tokens, make_spec("span_corruption", density, span, raw_length), rng,
                        WIDE["encoder_decoder"])
    drop = corrupt_jit(tokens, make_spec("drop_corrupted_tokens", density, span, raw_length), rng,
                       WIDE["encoder_decoder"])
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
        # Drop tokens draws the same mask: its inputs/targets are these without the sentinels.
        assert unpad(drop["encoder_input_tokens"][i]) == [t for t in inputs if t < REAL_HIGH]
        assert unpad(drop["decoder_target_tokens"][i]) == [t for t in targets if t < REAL_HIGH]


@given(name=st.sampled_from(OBJECTIVES), density=densities, span=span_lengths,
       fraction=st.floats(0.0, 1.0), lengths=st.lists(st.integers(2, RAW), min_size=BATCH,
                                                      max_size=BATCH), seed=seeds)
def test_outputs_use_only_real_tokens_eos_and_their_own_special_ids(name, density, span, fraction,
                                                                    lengths, seed):
    tokens = raw_tokens(seed, lengths)  # rows end in padding: each uses its real tokens only
    batch = corrupt_jit(tokens, make_spec(name, density, span, RAW, fraction), jax.random.key(seed),
                        WIDE["encoder_decoder"])
    for i, n in enumerate(lengths):
        original = tokens[i, :n].tolist()
        inputs = unpad(batch["encoder_input_tokens"][i])
        targets = unpad(batch["decoder_target_tokens"][i])
        assert inputs[-1] == targets[-1] == 1 and 1 not in inputs[:-1] + targets[:-1]
        inputs, targets = inputs[:-1], targets[:-1]
        np.testing.assert_array_equal(batch["decoder_loss_weights"][i],
                                      np.asarray(batch["decoder_target_tokens"][i]) != 0)
        np.testing.assert_array_equal(batch["decoder_input_tokens"][i][1:],
                                      batch["decoder_target_tokens"][i][:-1])
        if name in ("span_corruption", "drop_corrupted_tokens"):
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
        else:  # lm: the encoder gets a lone EOS
            assert inputs == [] and targets == original


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


@settings(max_examples=25)
@given(name=st.sampled_from(OBJECTIVES), inputs_length=st.integers(3, 24),
       density=st.floats(0.05, 0.6), span=span_lengths, seed=seeds)
def test_outputs_fit_the_lengths_the_arithmetic_promises(name, inputs_length, density, span, seed):
    raw, inputs_bound, targets_bound = lengths_for(name, inputs_length, density, span)
    assume(raw <= RAW)
    batch = corrupt_jit(raw_tokens(seed), make_spec(name, density, span, raw), jax.random.key(seed),
                        WIDE["encoder_decoder"])
    input_lengths = np.count_nonzero(batch["encoder_input_tokens"], axis=1)
    target_lengths = np.count_nonzero(batch["decoder_target_tokens"], axis=1)
    assert input_lengths.max() <= max(inputs_bound, 1) <= inputs_length
    assert target_lengths.max() <= targets_bound
    if name in ("span_corruption", "drop_corrupted_tokens", "lm"):
        assert target_lengths.min() == targets_bound, "these objectives' lengths are exact"


@given(name=st.sampled_from(OBJECTIVES), density=densities, span=span_lengths,
       raw_length=st.integers(2, RAW), seed=seeds)
def test_decoder_only_row_is_inputs_then_targets(name, density, span, raw_length, seed):
    tokens, rng = raw_tokens(seed), jax.random.key(seed)
    spec = make_spec(name, density, span, raw_length)
    pair = corrupt_jit(tokens, spec, rng, WIDE["encoder_decoder"])
    row = corrupt_jit(tokens, spec, rng, WIDE["decoder_only"])
    assert row["decoder_target_tokens"].shape == (BATCH, 2 * RAW + 2)
    for i in range(BATCH):
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
    step = jax.jit(corrupt, static_argnums=3)
    compiled_before = step._cache_size()  # jit caches are shared per function: count the new ones
    tokens = np.random.default_rng(5).integers(REAL_LOW, REAL_HIGH, (2, layout.raw_length),
                                               np.int32)
    for i, point in enumerate(points):
        batch = step(tokens, spec_from_config(point), jax.random.key(i), layout)
        expected = ({"encoder_input_tokens": layout.inputs_length,
                     "decoder_target_tokens": layout.targets_length} if family == "encoder_decoder"
                    else {"decoder_target_tokens": layout.sequence_length})
        for key, length in expected.items():
            assert batch[key].shape == (2, length)
            for row in np.asarray(batch[key]):
                assert unpad(row)[-1] == 1, f"{point}: EOS cut off {key}"
    assert step._cache_size() == compiled_before + 1


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
    assert dataclasses.astuple(layout) == ("encoder_decoder", 141, 128, 32, 8192, 100)


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
])
def test_bad_objective_config_is_rejected_with_the_field_named(changes, message):
    with pytest.raises(ConfigError, match=message):
        spec_from_config(objective(**changes))
    with pytest.raises(ConfigError, match=message):
        layout_for([objective(), objective(**changes)], "encoder_decoder", VOCAB, SENTINELS)


def test_bad_vocabulary_family_and_points_are_rejected():
    with pytest.raises(ConfigError, match=r"model.num_sentinels=0 .* at least 1"):
        validate_vocab(1000, 0)
    with pytest.raises(ConfigError, match=r"model.vocab_size=103 .* at least num_sentinels \+ 4"):
        validate_vocab(103, 100)
    # 0.5 density and span 1 on 64 inputs makes 31 spans: 30 sentinels are too few.
    with pytest.raises(ConfigError, match=r"model.num_sentinels=30 .* up to 31 spans"):
        layout_for([objective(noise_density=0.5, mean_noise_span_length=1.0)], "encoder_decoder",
                   VOCAB, 30)
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

corrupt_with_details_jit = jax.jit(objectives.corrupt_with_details, static_argnums=3)


@pytest.mark.parametrize("name", OBJECTIVES)
def test_details_noise_mask_is_what_the_objective_corrupted(name):
    tokens = raw_tokens(3)
    batch, details = corrupt_with_details_jit(tokens, make_spec(name, density=0.3),
                                              jax.random.key(5), WIDE["encoder_decoder"])
    noise = np.asarray(details["noise_mask"])
    assert noise.shape == tokens.shape and not np.asarray(details["overflow"]).any()
    if not objectives.HAS_NOISE_MASK[name]:
        assert not noise.any()
        return
    assert noise.any(axis=1).all()
    inputs = np.asarray(batch["encoder_input_tokens"])
    for row, mask, out in zip(tokens, noise, inputs):
        # Every clean token reaches the inputs unchanged and in order; no noise token survives
        # where the objective replaces or drops it.
        clean = row[~mask].tolist()
        if name in ("bert_style", "mass_style"):
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
