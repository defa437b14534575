"""UL2's mixture of denoisers (Tay et al. 2022, sections 3.1 and 3.2): each example is its drawn
denoiser's own output (span corruption at the denoiser's rate and span for R and X, the
paper's prefix split for S) after its mode token; the draws follow the shares; one compiled
program serves a batch mixing them; the layout holds every denoiser; preview names each
example's denoiser; a bad mixture is a one-line error."""
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from t5x_lite import batch_format, objective_layout, objectives, preview, ul2
from t5x_lite.config import UL2_DENOISERS, ConfigError, default_config
from t5x_lite.objectives import ObjectiveSpec
from t5x_lite.settings import Settings

from compile_events import compilations

VOCAB, SENTINELS, INPUTS = 160, 40, 24
REAL_HIGH = VOCAB - SENTINELS
corrupt_jit = jax.jit(objectives.corrupt_with_details, static_argnums=3)


def ul2_point(denoisers=UL2_DENOISERS, inputs_length=INPUTS):
    return dict(name="ul2", noise_density=0.15, mean_noise_span_length=3.0,
                random_token_fraction=0.1, inputs_length=inputs_length, targets_length=None,
                ul2_denoisers=denoisers)


def layout_of(denoisers=UL2_DENOISERS, family="encoder_decoder"):
    return objectives.layout_for([ul2_point(denoisers)], family, VOCAB, SENTINELS)


def full_rows(seed, batch, layout):
    """Real tokens only, no padding: every example reads its denoiser's whole raw length."""
    return np.random.default_rng(seed).integers(3, REAL_HIGH, (batch, layout.raw_length),
                                                np.int32)


def chosen_of(rng, batch, layout):
    return np.asarray(ul2.choose(objectives.example_draws(rng, batch, layout)[:, 2, 0],
                                 layout.denoisers))


def rows(batch, family):
    return [batch_format.inputs_and_targets(family, {k: np.asarray(v[i]) for k, v in batch.items()})
            for i in range(len(next(iter(batch.values()))))]


def per_example_spec(name, denoisers, chosen):
    picked = [denoisers[i] for i in chosen]
    return ObjectiveSpec(
        objective=jnp.int32(objectives.objective_id(name)),
        noise_density=jnp.asarray([d.noise_density for d in picked], jnp.float32),
        mean_noise_span_length=jnp.asarray([d.mean_noise_span_length for d in picked],
                                           jnp.float32),
        random_token_fraction=jnp.float32(0.1),
        raw_length=jnp.asarray([d.raw_length for d in picked], jnp.int32))


def t5_random_prefix_split(tokens, r, u):
    """Section 3.1.1's S-denoiser (one corrupted span that ends the text, its length uniform),
    as T5's `random_prefix_noise_mask` (t5/data/preprocessors.py) draws it: the number of
    input tokens uniform over [min_input_tokens, length - 1] with min_input_tokens =
    min(length - 1, max(1, round((1 - 2 r) * float32(length - 1)))); the draw taken from u as
    floor(u * count). Returns (inputs, targets) without EOS."""
    max_input_tokens = len(tokens) - 1
    min_input_tokens = min(max_input_tokens, max(
        1, int(np.round(np.float32(1 - 2 * r) * np.float32(max_input_tokens)))))
    count = max_input_tokens + 1 - min_input_tokens
    num_input_tokens = min_input_tokens + math.floor(np.float32(u) * np.float32(count))
    return tokens[:num_input_tokens], tokens[num_input_tokens:]


@pytest.mark.parametrize("family", ["encoder_decoder", "decoder_only"])
def test_each_example_is_its_denoisers_own_output_after_its_mode_token(family):
    layout = layout_of(family=family)
    batch_size, rng = 64, jax.random.key(3)
    tokens = full_rows(0, batch_size, layout)
    spec = objectives.spec_from_config(ul2_point())
    batch, details = jax.device_get(corrupt_jit(tokens, spec, rng, layout))
    chosen = chosen_of(rng, batch_size, layout)
    assert len(set(chosen)) >= 5  # a real mixture
    # The same draws through span corruption, each example at its denoiser's settings.
    reference_layout = dataclasses.replace(layout, objectives=("span_corruption",))
    ref_batch, ref_details = jax.device_get(corrupt_jit(
        tokens, per_example_spec("span_corruption", layout.denoisers, chosen), rng,
        reference_layout))
    draws = np.asarray(objectives.example_draws(rng, batch_size, layout))
    modes = batch_format.mode_token_names(VOCAB, SENTINELS)
    for i, ((inputs, targets), (ref_inputs, ref_targets)) in enumerate(
            zip(rows(batch, family), rows(ref_batch, family))):
        denoiser = layout.denoisers[chosen[i]]
        assert modes[inputs[0]] == ul2.MODE_OF_KIND[denoiser.kind]
        assert not details["overflow"][i]
        if denoiser.kind == "S":
            raw = tokens[i, :denoiser.raw_length].tolist()
            prefix, target = t5_random_prefix_split(raw, denoiser.noise_density,
                                                    draws[i, 0, 0])
            assert (inputs, targets) == (inputs[:1] + prefix + [1], target + [1])
            assert not details["noise_mask"][i].any()
        else:
            assert (inputs, targets) == (inputs[:1] + ref_inputs, ref_targets)
            np.testing.assert_array_equal(details["noise_mask"][i], ref_details["noise_mask"][i])


def test_an_s_denoiser_at_half_density_is_prefix_lm_for_the_same_draws():
    layout = layout_of((("S", 0.5, 1.0, 1.0),))
    rng, tokens = jax.random.key(5), full_rows(1, 32, layout)
    batch = jax.device_get(corrupt_jit(
        tokens, objectives.spec_from_config(ul2_point((("S", 0.5, 1.0, 1.0),))), rng,
        layout)[0])
    prefix_point = dict(ul2_point(), name="prefix_lm")
    ref_layout = dataclasses.replace(layout, objectives=("prefix_lm",))
    ref = jax.device_get(corrupt_jit(tokens, objectives.spec_from_config(prefix_point), rng,
                                     ref_layout)[0])
    mode = batch_format.mode_token("[S2S]", VOCAB, SENTINELS)
    for (inputs, targets), (ref_inputs, ref_targets) in zip(
            rows(batch, layout.family), rows(ref, layout.family)):
        assert (inputs, targets) == ([mode] + ref_inputs, ref_targets)


def test_draw_frequencies_match_the_shares():
    """Each example's denoiser read off its output (mode token, noise and sentinel counts),
    grouped where two denoisers' outputs look alike, against a binomial interval."""
    layout = layout_of()
    batch_size, rng = 4000, jax.random.key(11)
    tokens = full_rows(2, batch_size, layout)
    batch, details = jax.device_get(corrupt_jit(
        tokens, objectives.spec_from_config(ul2_point()), rng, layout))
    chosen = chosen_of(rng, batch_size, layout)
    sentinel_ids = set(range(VOCAB - SENTINELS + 3, VOCAB))

    def signature(denoiser):
        if denoiser.kind == "S":
            return ul2.MODE_OF_KIND["S"], 0, 0
        noise, spans = objectives.noise_counts(denoiser.raw_length, denoiser.noise_density,
                                               denoiser.mean_noise_span_length, np)
        return ul2.MODE_OF_KIND[denoiser.kind], int(noise), int(spans)

    groups = {}
    for index, denoiser in enumerate(layout.denoisers):
        groups.setdefault(signature(denoiser), []).append(index)
    modes = batch_format.mode_token_names(VOCAB, SENTINELS)
    counts = dict.fromkeys(groups, 0)
    for i, (inputs, targets) in enumerate(rows(batch, layout.family)):
        seen = (modes[inputs[0]], int(details["noise_mask"][i].sum()),
                sum(t in sentinel_ids for t in targets))
        assert chosen[i] in groups[seen]  # the output is the drawn denoiser's
        counts[seen] += 1
    alpha = 1e-6 / len(groups)
    for key, members in groups.items():
        share = sum(layout.denoisers[i].share for i in members)
        low, high = stats.binom.interval(1 - alpha, batch_size, share)
        assert low <= counts[key] <= high, (key, counts[key], share * batch_size)


def test_a_batch_mixing_denoisers_compiles_once():
    layout = layout_of()
    spec = objectives.spec_from_config(ul2_point())
    fresh = jax.jit(objectives.corrupt_with_details, static_argnums=3)
    tokens = full_rows(4, 16, layout)
    with compilations() as compiled:
        for seed in (0, 1):
            jax.block_until_ready(fresh(tokens, spec, jax.random.key(seed), layout))
    assert sum("corrupt_with_details" in name for name in compiled) == 1, compiled
    for seed in (0, 1):  # each batch mixes several kinds of denoiser
        kinds = {layout.denoisers[i].kind for i in chosen_of(jax.random.key(seed), 16, layout)}
        assert len(kinds) >= 2


def test_the_layout_holds_every_denoiser_and_the_mode_tokens():
    point = ul2_point()
    layout = layout_of()
    lengths = [objectives.ul2_denoiser_lengths(d, INPUTS) for d in UL2_DENOISERS]
    assert [d.raw_length for d in layout.denoisers] == [raw for raw, _, _ in lengths]
    assert (layout.raw_length, layout.inputs_length, layout.targets_length) == tuple(
        max(column) for column in zip(*lengths))
    assert max(inputs for _, inputs, _ in lengths) <= INPUTS
    # Beside span corruption at a longer inputs length, the grid's layout holds both.
    other = dict(point, name="span_corruption", inputs_length=40)
    grid = objectives.layout_for([point, other], "encoder_decoder", VOCAB, SENTINELS)
    assert grid.objectives == ("span_corruption", "ul2") and grid.denoisers == layout.denoisers
    assert grid.raw_length >= layout.raw_length and grid.targets_length >= layout.targets_length
    # The mode tokens take the last three sentinels: span corruption must leave them alone.
    spans = max(objective_layout._ul2_sentinels(d) for d in layout.denoisers)
    with pytest.raises(ConfigError, match="model.num_sentinels"):
        objectives.layout_for([point], "encoder_decoder", VOCAB, spans - 1)
    assert objectives.layout_for([point], "encoder_decoder", VOCAB, spans).denoisers


@pytest.mark.parametrize("denoisers, message", [
    ((("R", 0.15, 3.0, 0.5), ("X", 0.5, 3.0, 0.4)), "shares sum to 0.9"),
    ((("Q", 0.15, 3.0, 1.0),), r"ul2_denoisers\[0\] kind='Q'"),
    ((("R", 1.0, 3.0, 1.0),), r"ul2_denoisers\[0\] noise_density=1.0"),
    ((("R", 0.15, 0.5, 1.0),), "mean_noise_span_length=0.5"),
    # Above 0.5 the S-denoiser's split range would be clipped at the start: 0.75 acts as 0.5.
    ((("R", 0.15, 3.0, 0.5), ("S", 0.75, 1.0, 0.5)),
     r"ul2_denoisers\[1\] noise_density=0.75 must be a number in \(0, 0.5\]"),
    ((("R", 0.15, 3.0, 0.0), ("S", 0.25, 1.0, 1.0)), r"ul2_denoisers\[0\] share=0.0"),
    ((("R", 0.15, 3.0),), r"ul2_denoisers\[0\]=\('R', 0.15, 3.0\) must be"),
    ((), "must be a non-empty tuple"),
])
def test_a_bad_mixture_is_a_one_line_error_naming_the_field(denoisers, message):
    config = default_config()
    config.objective.name = "ul2"
    config.objective.ul2_denoisers = denoisers
    with pytest.raises(ConfigError, match=message) as error:
        Settings.from_config(config)
    assert "objective.ul2_denoisers" in str(error.value) and "\n" not in str(error.value)


def test_two_mixtures_in_one_grid_and_encoder_only_are_refused():
    other = ul2_point((("R", 0.15, 3.0, 1.0),))
    with pytest.raises(ConfigError, match="one mixture"):
        objectives.layout_for([ul2_point(), other], "encoder_decoder", VOCAB, SENTINELS)
    config = default_config()
    config.objective.name, config.model.arch = "ul2", "encoder_only"
    with pytest.raises(ConfigError, match="objective.name='ul2' is not allowed"):
        objectives.layout_from_config(config)


def test_preview_names_each_examples_denoiser_and_shows_its_mode_token():
    run = preview.previewed_run(None, None, "demo", seed=0, overrides=["objective.name=ul2"])
    examples = preview.corrupted_examples(run, count=8)
    names = batch_format.mode_token_names(run.layout.vocab_size, run.layout.num_sentinels)
    kinds = set()
    for example in examples:
        denoiser = example["denoiser"]
        assert example["objective"] == "ul2"
        assert names[example["inputs"][0]] == denoiser["mode"] == ul2.MODE_OF_KIND[
            denoiser["kind"]]
        assert example["inputs_text"].startswith(denoiser["mode"])
        # The raw tokens shown are the ones its denoiser read.
        match = [d for d in run.layout.denoisers if ul2.describe(d) == denoiser]
        assert len(example["raw"]) <= match[0].raw_length
        kinds.add(denoiser["kind"])
    assert len(kinds) >= 2
    text = preview.format_text(run, examples)
    assert "objective ul2: denoisers R(r=0.15, mu=3, share=0.2) [NLU]" in text
