"""GLM's autoregressive blank infilling (Du et al. 2021, sections 2.1 and 2.2): each example is
a plain-Python transcription of the paper's Part A / Part B construction, with its 2D
positions, applied to the spans the objective drew (re-derived from its own uniform draws),
then mapped to the row as `t5x_lite.glm` documents; the spans' lengths and count follow
section 2.2; encoder-decoders and the causal LM refuse it before any work; a prefix LM trains
on it, its model reading the positions; preview shows it."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings, strategies as st
from scipy import stats

from t5x_lite import (batch_format, glm, models, objectives, partitioning, preview, train,
                      train_state, train_step)
from t5x_lite.config import ConfigError
from t5x_lite.objectives import ObjectiveSpec

from tiny_configs import tiny_train_config

VOCAB, SENTINELS, INPUTS, BATCH = 128, 8, 24, 8
REAL_LOW, REAL_HIGH = 3, VOCAB - SENTINELS
# EOS (a document's end, and Part A's, which the first span's [START] is fed), [MASK] =
# <extra_id_0>, [END] = <extra_id_1> (and the [START] of every later span: see t5x_lite.glm).
EOS, MASK, END = 1, VOCAB - 1, VOCAB - 2
LAYOUT = objectives.layout_for(
    [dict(name="blank_infilling", noise_density=0.15, mean_noise_span_length=3.0,
          inputs_length=INPUTS)], "decoder_only", VOCAB, SENTINELS)
RAW = LAYOUT.raw_length
corrupt_jit = jax.jit(objectives.corrupt_with_details, static_argnums=3)


@jax.jit
def plans(tokens, n, density, lam, draws):
    """The spans `corrupt` draws for LAYOUT's examples, from their uniform draws."""
    return jax.vmap(lambda t, m, p, mu, u: glm.plan(t, m, p, mu, u, MASK, END,
                                                    objectives.packed_width(LAYOUT)),
                    in_axes=(0, 0, None, 0, 0))(tokens, n, density, lam, draws)


def make_spec(density, lam=3.0, raw_length=RAW):
    return ObjectiveSpec(objective=jnp.int32(objectives.objective_id("blank_infilling")),
                         noise_density=jnp.float32(density),
                         mean_noise_span_length=jnp.float32(lam),
                         random_token_fraction=jnp.float32(0.1),
                         raw_length=jnp.int32(raw_length))


def paper_glm(text, spans, order):
    """Section 2.1, transcribed: spans (start, length) in text order, `order` the permuted
    order of their indices. Returns Part A (x_corrupt), Part B's inputs ([START] + span) and
    outputs (span + [END]), and the 2D positions (position 1, position 2) of A then B."""
    part_a, mask_at, last = [], [], 0
    for start, length in spans:
        part_a += text[last:start]
        mask_at.append(len(part_a))  # the span's [MASK] position in x_corrupt
        part_a.append("[MASK]")
        last = start + length
    part_a += text[last:]
    b_in, b_out = [], []
    positions = [(i, 0) for i in range(len(part_a))]
    for k in order:
        start, length = spans[k]
        b_in += ["[START]"] + text[start:start + length]
        b_out += text[start:start + length] + ["[END]"]
        positions += [(mask_at[k], j) for j in range(1, length + 2)]
    return part_a, b_in, b_out, positions


def paper_span_lengths(uniform, n, density, lam):
    """Section 2.2 with the reference code's details (`t5x_lite.glm`), transcribed in float64:
    lengths Poisson(lam) given >= 1 (cut to n) from the inverse CDF of each uniform draw, drawn
    until they mask at least ceil(n * density) tokens (the product in float32, as everywhere),
    then those that fit with a clean token between spans. Sorted."""
    budget = int(np.ceil(np.float32(n) * np.float32(density)))
    zero = stats.poisson.pmf(0, lam)
    lengths = []
    for u in map(float, uniform):
        if sum(lengths) >= budget:
            break
        lengths.append(min(int(stats.poisson.ppf(zero + u * (1 - zero), lam)), n))
    kept = [l for k, l in enumerate(lengths) if sum(lengths[:k + 1]) + k <= n]
    return sorted(kept)


def glm_row(part_a, b_in, b_out, positions):
    """The row `t5x_lite.glm` says GLM's example becomes: tokens as ids ([MASK] the mask token,
    [END] <extra_id_1>, the first [START] Part A's closing EOS and the others [END]), Part A +
    EOS, then Part B's outputs; positions row-shifted by the start token: 1 + position 1 +
    (position 2 - 1 in Part B)."""
    ids = {"[MASK]": MASK, "[END]": END}
    sequence = [ids.get(t, t) for t in part_a + [EOS] + b_out]
    starts = iter([EOS] + [END] * len(b_in))
    fed = [0] + [ids.get(t, t) for t in part_a] + [
        next(starts) if t == "[START]" else t for t in b_in]
    # The start token at 0, Part A at 1.., Part B's first [START] (fed Part A's EOS) on.
    row_positions = [0] + [1 + p1 + max(p2 - 1, 0) for p1, p2 in positions]
    return sequence, fed, row_positions, len(part_a) + 1


@settings(max_examples=12)
@given(density=st.sampled_from([0.15, 0.3, 0.6]), lam=st.sampled_from([1.0, 3.0, 6.0]),
       lengths=st.lists(st.integers(1, RAW), min_size=BATCH, max_size=BATCH),
       seed=st.integers(0, 2**16))
def test_blank_infilling_is_the_papers_parts_a_and_b_on_its_own_spans(density, lam, lengths,
                                                                      seed):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(REAL_LOW, REAL_HIGH, (BATCH, RAW)).astype(np.int32)
    # A chunk packs documents, each ended by EOS, and spans may cover one: it is a span token
    # like any other, which the [END] (not EOS) keeps apart from the span's end.
    tokens[rng.random((BATCH, RAW)) < 0.15] = EOS
    tokens[np.arange(RAW)[None] >= np.asarray(lengths)[:, None]] = 0
    key = jax.random.key(seed)
    batch, details = jax.device_get(corrupt_jit(tokens, make_spec(density, lam), key, LAYOUT))
    draws = objectives.example_draws(key, BATCH, LAYOUT)[:, :glm.UNIFORM_ROWS]
    plan = jax.device_get(plans(tokens, jnp.asarray(lengths), density, jnp.full(BATCH, lam),
                                draws))
    assert not details["overflow"].any()  # the prefix LM's lengths always hold it
    for i, n in enumerate(lengths):
        text, count = tokens[i, :n].tolist(), int(plan.num_spans[i])
        spans = [(int(s), int(l)) for s, l in zip(plan.start[i][:count], plan.length[i][:count])]
        order = [int(k) for k in np.argsort(plan.part_b_rank[i][:count])]
        assert sorted(order) == list(range(count)) and count >= 1
        # Spans lie in the text in order, a clean token between two.
        ends = [s + l for s, l in spans]
        assert all(l >= 1 for _, l in spans) and spans[0][0] >= 0 and ends[-1] <= n
        assert all(e < s for e, (s, _) in zip(ends, spans[1:]))
        # Section 2.2 on the example's own draws: the lengths it drew and kept.
        assert sorted(l for _, l in spans) == paper_span_lengths(draws[i, 0], n, density, lam)
        masked = sum(l for _, l in spans)
        part_a, b_in, b_out, positions = paper_glm(text, spans, order)
        sequence, fed, row_positions, num_inputs = glm_row(part_a, b_in, b_out, positions)
        width = len(sequence)
        np.testing.assert_array_equal(batch["decoder_target_tokens"][i][:width], sequence)
        assert not batch["decoder_target_tokens"][i][width:].any()
        np.testing.assert_array_equal(batch["decoder_input_tokens"][i][:width], fed)
        np.testing.assert_array_equal(batch["decoder_positions"][i][:width], row_positions)
        # The loss on exactly Part B's outputs; Part A (and the first [START]) attended
        # bidirectionally.
        weights = batch["decoder_loss_weights"][i]
        assert weights[num_inputs:width].all() and not np.delete(
            weights, np.s_[num_inputs:width]).any()
        np.testing.assert_array_equal(batch["inputs_mask"][i],
                                      np.arange(weights.shape[0]) <= num_inputs)
        # The masked tokens are Part B's span contents; A with the spans put back is the text.
        noise = details["noise_mask"][i]
        span_tokens = [t for t in b_out if t != "[END]"]
        assert sorted(span_tokens) == sorted(tokens[i][noise].tolist())
        assert noise.sum() == masked and not noise[n:].any()
        restored, pieces = [], iter(text[s:s + l] for s, l in spans)
        for t in part_a:
            restored += next(pieces) if t == "[MASK]" else [t]
        assert restored == text


def test_spans_draw_zero_truncated_poisson_lengths_until_the_threshold():
    n, density, lam, count = 200, 0.15, 3.0, 4000
    uniform = jax.random.uniform(jax.random.key(0), (count, n))
    lengths, spans = jax.device_get(jax.jit(jax.vmap(
        lambda u: glm.span_lengths(u, density, lam, n)))(uniform))
    budget = int(np.ceil(np.float32(n) * np.float32(density)))  # 30
    totals = np.cumsum(lengths, axis=1)
    for row, k in zip(range(count), spans):
        assert (lengths[row, :k] >= 1).all() and not lengths[row, k:].any()
        assert totals[row, k - 1] >= budget and (k == 1 or totals[row, k - 2] < budget)
    # Pooled over every draw (the count is a stopping time, so by Wald's identity each value
    # is drawn E[K] times its probability), the lengths are Poisson(3) given >= 1.
    drawn = np.concatenate([lengths[row, :k] for row, k in enumerate(spans)])
    support = np.arange(1, 11)  # and a last bin for >= 11
    expected = stats.poisson.pmf(support, lam) / stats.poisson.sf(0, lam)
    expected = np.append(expected, 1 - expected.sum()) * len(drawn)
    observed = np.array([(drawn == v).sum() for v in support] + [(drawn > 10).sum()])
    chi2 = np.sum((observed - expected) ** 2 / expected)
    assert chi2 < stats.chi2.ppf(1 - 1e-4, len(support)), (observed, expected)


def glm_reference_spans(rng, n, density, lam):
    """GLM's own span layout for one document of n tokens (THUDM/GLM `blocklm_utils.py`,
    `ConstructBlockStrategy`), transcribed: Poisson(lam) lengths given >= 1 drawn while their
    sum is below ceil(n density), shuffled, then K places drawn uniformly from
    [0, n - S - K + 1] and sorted, span k at place_k plus the earlier spans' lengths + 1
    (`sample_spans`). (start, length) pairs in text order; None when they cannot fit (GLM
    drops such an example)."""
    budget = int(np.ceil(np.float32(n) * np.float32(density)))
    support = np.arange(1, 40)
    weights = stats.poisson.pmf(support, lam)
    lengths = []
    while sum(lengths) < budget:
        lengths.append(int(rng.choice(support, p=weights / weights.sum())))
    rng.shuffle(lengths)
    slack = n - sum(lengths) - len(lengths) + 1
    if slack < 0:
        return None
    places = np.sort(rng.integers(0, slack + 1, len(lengths)))
    spans, offset = [], 0
    for place, length in zip(places, lengths):
        spans.append((offset + int(place), length))
        offset += length + 1
    return spans


def test_span_layout_matches_glms_own_code():
    """Where the spans fall, against `glm_reference_spans` (20000 documents each): the share
    of documents masking each position, the span count, and the length of the text's last span
    (which, without GLM's shuffle, would be the one that ended the drawing: longer on average).
    Each statistic is within 4.5 standard errors of the reference's."""
    n, density, lam, count = 20, 0.2, 3.0, 20000
    rng = np.random.default_rng(0)
    reference = [glm_reference_spans(rng, n, density, lam) for _ in range(count)]
    assert sum(r is None for r in reference) == 0  # at n = 20, 4 tokens' spans always fit
    tokens = np.tile(np.arange(REAL_LOW, REAL_LOW + RAW, dtype=np.int32), (count, 1))
    draws = jax.random.uniform(jax.random.key(2), (count, glm.UNIFORM_ROWS, RAW))
    plan = jax.device_get(plans(tokens, jnp.full(count, n), density, jnp.full(count, lam),
                                draws))
    ours = [list(zip(plan.start[i][:k].tolist(), plan.length[i][:k].tolist()))
            for i, k in enumerate(plan.num_spans)]

    def masked_share(layouts):
        masked = np.zeros((len(layouts), n))
        for row, spans in enumerate(layouts):
            for start, length in spans:
                masked[row, start:start + length] = 1
        return masked.mean(axis=0)

    def within(a, b, variance_a, variance_b):
        return np.abs(a - b) <= 4.5 * np.sqrt((variance_a + variance_b) / count)

    theirs_share, our_share = masked_share(reference), masked_share(ours)
    assert within(our_share, theirs_share, our_share * (1 - our_share),
                  theirs_share * (1 - theirs_share)).all(), (our_share, theirs_share)
    for statistic in (len, lambda spans: spans[-1][1]):  # span count, the last span's length
        a = np.array([statistic(spans) for spans in ours], dtype=float)
        b = np.array([statistic(spans) for spans in reference], dtype=float)
        assert within(a.mean(), b.mean(), a.var(), b.var()), (a.mean(), b.mean())


def test_part_b_order_is_uniform_over_the_spans():
    # Two-span examples (n = 11 at 40% needs 5 tokens): each of the 2 orders about half the time.
    n, count = 11, 2000
    tokens = np.tile(np.arange(REAL_LOW, REAL_LOW + RAW, dtype=np.int32), (count, 1))
    draws = jax.random.uniform(jax.random.key(1), (count, glm.UNIFORM_ROWS, RAW))
    plan = jax.device_get(plans(tokens, jnp.full(count, n), 0.4, jnp.full(count, 3.0), draws))
    two = plan.num_spans == 2
    swapped = plan.part_b_rank[two, 0] == 1
    assert two.sum() > 200 and abs(swapped.mean() - 0.5) < 4 * 0.5 / np.sqrt(two.sum())


def test_expected_targets_are_the_mean_of_real_batches():
    tokens = np.random.default_rng(3).integers(REAL_LOW, REAL_HIGH, (1024, RAW), np.int32)
    batch = corrupt_jit(tokens, make_spec(0.3), jax.random.key(3), LAYOUT)[0]
    weights = np.asarray(batch["decoder_loss_weights"]).sum(axis=1)
    expected = objectives.expected_loss_tokens("blank_infilling", INPUTS, 0.3, 3.0)
    assert abs(weights.mean() - expected) <= 4 * weights.std() / np.sqrt(len(weights))


@pytest.mark.parametrize("arch", ["encoder_decoder", "encoder_decoder_shared",
                                  "encoder_decoder_half", "language_model"])
def test_archs_without_a_bidirectional_prefix_refuse_it_before_any_work(arch, tmp_path):
    config = tiny_train_config(arch)
    config.objective.name = "blank_infilling"
    with pytest.raises(ConfigError) as error:
        train.train(config, tmp_path / "run", progress=False)
    assert str(error.value).startswith(
        f"objective.name='blank_infilling' is not allowed for model.arch={arch!r}; ")
    assert str(error.value).endswith("or a model.arch that trains it: 'prefix_lm'")
    assert not (tmp_path / "run").exists()


def test_a_vocabulary_without_a_sentinel_for_its_end_is_refused_by_name():
    config = tiny_train_config("prefix_lm")
    config.objective.name = "blank_infilling"
    config.model.num_sentinels = 1  # <extra_id_0> only: the [MASK], no [END]
    with pytest.raises(ConfigError, match="model.num_sentinels=1 is too small for .*its "
                                          r"\[END\] <extra_id_1>, so it needs at least 2"):
        objectives.layout_from_config(config)


def test_a_prefix_lm_trains_on_it_and_its_model_reads_the_positions():
    config = tiny_train_config("prefix_lm")
    config.objective.name = "blank_infilling"
    layout = objectives.layout_from_config(config)
    mesh = partitioning.make_mesh(config.mesh, jax.devices()[:1])
    spec = objectives.spec_from_config(config.objective)
    raw = np.random.default_rng(0).integers(3, 128, (8, layout.raw_length), np.int32)
    batch = jax.device_get(corrupt_jit(raw, spec, jax.random.key(0), layout)[0])
    # The positions reach the relative position bias: without them the logits differ.
    model, forward = models.build_model(config.model, nnx.Rngs(0)), nnx.jit(lambda m, b: m(b))
    own = forward(model, {k: v for k, v in batch.items() if k != batch_format.POSITIONS_KEY})
    assert not np.allclose(forward(model, batch), own)
    state = train_state.init_state(config, mesh)
    step = train_step.make_train_step(config, layout, mesh)
    for seed in range(2):
        state, metrics = step(state, raw, spec, jax.random.key(seed))
        assert np.isfinite(float(metrics["loss"])) and int(metrics["objective_overflow"]) == 0


def test_preview_shows_it_and_names_it_in_json():
    run = preview.previewed_run(None, None, "demo", overrides=[
        "--config.objective.name=blank_infilling", "--config.model.arch=prefix_lm"])
    examples = preview.corrupted_examples(run, count=3)
    mask = run.layout.vocab_size - 1  # <extra_id_0>
    for example in examples:
        example = json.loads(json.dumps(example))  # what `t5x-lite preview --json` prints
        assert example["objective"] == "blank_infilling" and not example["overflow"]
        spans = example["inputs"].count(mask)
        assert spans >= 1 and example["inputs_text"].count("<extra_id_0>") == spans
        # Part B: each span's tokens then [END] (<extra_id_1>); the inputs (Part A) end with EOS.
        end = glm.end_token(run.layout.vocab_size)
        assert example["targets"].count(end) == spans == example["targets_text"].count(
            "<extra_id_1>")
        assert sum(example["noise_mask"]) == len(example["targets"]) - spans
    text = preview.format_text(run, examples)
    assert ("objective blank_infilling: noise_density 0.15, mean_noise_span_length 3.0 (the "
            "Poisson lambda of its span lengths); model.arch prefix_lm") in text


def test_only_a_layout_running_it_carries_positions():
    # Traced, not compiled: the keys of each layout's batch (the span corruption program is
    # the one it was before blank_infilling existed: no fifth output, no positions).
    def keys(names, family="decoder_only"):
        points = [dict(name=name, noise_density=0.15, mean_noise_span_length=3.0,
                       inputs_length=INPUTS) for name in names]
        layout = objectives.layout_for(points, family, VOCAB, SENTINELS)
        raw = jax.ShapeDtypeStruct((2, layout.raw_length), jnp.int32)
        return set(jax.eval_shape(lambda r: objectives.corrupt(
            r, objectives.spec_from_config(points[0]), jax.random.key(0), layout), raw))
    assert keys(["span_corruption"]) == set(batch_format.row_keys("decoder_only"))
    assert keys(["span_corruption", "blank_infilling"]) == keys(["span_corruption"]) | {
        batch_format.POSITIONS_KEY}
    assert batch_format.POSITIONS_KEY not in keys(["blank_infilling"], "encoder_decoder")
