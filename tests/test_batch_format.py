"""batch_format.py: one row format per family, the same function of an example on the device
and on the host.

A pre-training row (`objectives.corrupt`, jax.numpy on the device) and a fine-tuning row
(`data.pipeline`, numpy on the host) built from the same (inputs, targets) agree, for both
families; a packed row holds its examples' own rows one after the other; `inputs_and_targets`
gives back the example; decoding's prompt is the start of the training row.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, strategies as st

from t5x_lite import batch_format, glm, objectives
from t5x_lite.config import EOS_ID, ConfigError
from t5x_lite.data.pipeline import pack_examples, pad_examples

FAMILIES = ("encoder_decoder", "decoder_only")
INPUTS_LENGTH, TARGETS_LENGTH, WIDTH = 7, 5, 9  # WIDTH: the objectives' arrays are wider
VOCAB, SENTINELS, RAW, BATCH = 64, 12, 16, 4


def token_lists(max_length):
    """Real-token ids ending in EOS, at most `max_length` of them."""
    return st.lists(st.integers(3, VOCAB - SENTINELS - 1), max_size=max_length - 1).map(
        lambda ids: ids + [EOS_ID])


examples = st.tuples(token_lists(INPUTS_LENGTH), token_lists(TARGETS_LENGTH))


def padded(ids, width=WIDTH):
    return np.pad(np.asarray(ids, np.int32), (0, width - len(ids)))


@functools.cache
def device_rows(family):
    """The rows `objectives.corrupt` builds from (inputs, targets) arrays [B, WIDTH]: the
    builder run per example under vmap, jitted."""
    build = functools.partial(batch_format.example_rows, family, jnp,
                              inputs_length=INPUTS_LENGTH, targets_length=TARGETS_LENGTH)
    return jax.jit(jax.vmap(build))


def assert_rows_equal(family, host, device):
    assert set(host) == set(device) == set(batch_format.row_keys(family))
    for key in host:
        assert np.asarray(device[key]).dtype == host[key].dtype, key
        np.testing.assert_array_equal(np.asarray(device[key]), host[key], err_msg=key)


@pytest.mark.parametrize("family", FAMILIES)
@given(example=examples)
def test_a_pretraining_and_a_finetuning_row_of_one_example_agree(family, example):
    x, y = example
    [host] = pad_examples([example], 1, INPUTS_LENGTH, TARGETS_LENGTH, family=family)
    device = device_rows(family)(padded(x)[None], padded(y)[None])
    assert_rows_equal(family, host, device)
    row = {key: value[0] for key, value in host.items()}
    assert batch_format.inputs_and_targets(family, row) == (x, y)


@functools.cache
def corrupt(family):
    layout = objectives.BatchLayout(family, RAW, RAW + 1, RAW + 3, VOCAB, SENTINELS)
    return layout, jax.jit(functools.partial(objectives.corrupt_with_details, layout=layout))


@pytest.mark.parametrize("family", FAMILIES)
@given(name=st.sampled_from(objectives.names()), density=st.floats(0.05, 0.5),
       seed=st.integers(0, 2**16))
def test_corrupted_rows_are_the_finetuning_rows_of_their_examples(family, name, density, seed):
    """Through the real pre-training path: every row `corrupt` makes (an empty input for lm,
    a lone EOS in an encoder's) is the fine-tuning row of the example it holds."""
    layout, corrupt_fn = corrupt(family)
    rng = np.random.default_rng(seed)
    tokens = rng.integers(3, VOCAB - SENTINELS, (BATCH, RAW)).astype(np.int32)
    spec = objectives.ObjectiveSpec(
        objective=jnp.int32(objectives.objective_id(name)),
        noise_density=jnp.float32(density), mean_noise_span_length=jnp.float32(3.0),
        random_token_fraction=jnp.float32(0.1), raw_length=jnp.int32(RAW))
    batch, details = jax.device_get(corrupt_fn(tokens, spec, jax.random.key(seed)))
    for i in np.flatnonzero(~details["overflow"]):
        row = {key: value[i:i + 1] for key, value in batch.items()}
        # blank_infilling's explicit positions (tests/test_glm.py), which no fine-tuning row
        # has; every other objective's are the row's own.
        positions = row.pop(batch_format.POSITIONS_KEY, None)
        if positions is not None and name != glm.NAME:
            np.testing.assert_array_equal(positions[0], np.arange(positions.shape[1]))
        example = batch_format.inputs_and_targets(family, {k: v[0] for k, v in row.items()})
        [host] = pad_examples([example], 1, layout.inputs_length, layout.targets_length,
                              family=family)
        assert_rows_equal(family, host, row)


@pytest.mark.parametrize("family", FAMILIES)
@given(batch=st.lists(examples, min_size=1, max_size=6))
def test_a_packed_row_is_its_examples_rows_one_after_the_other(family, batch):
    packed = pack_examples(batch, len(batch), INPUTS_LENGTH, TARGETS_LENGTH, family=family)
    sizes = [batch_format.row_lengths(family, len(x), len(y)) for x, y in batch]
    placed = 0
    for rows in packed:
        for r in range(len(rows["decoder_target_tokens"])):
            segments = rows["decoder_segment_ids"][r]
            for segment in range(1, segments.max() + 1):
                x, y = batch[placed]
                own = batch_format.example_rows(family, np, padded(x), padded(y), len(x), len(y))
                for key, value in own.items():
                    stack = batch_format.stack_of(key)
                    where = rows[f"{stack}_segment_ids"][r] == segment
                    np.testing.assert_array_equal(rows[key][r][where], value, err_msg=key)
                    np.testing.assert_array_equal(rows[f"{stack}_positions"][r][where],
                                                  np.arange(sizes[placed][stack]))
                placed += 1
    assert placed == len(batch)


def test_a_decoder_only_row_splits_where_its_targets_start():
    def split(weights, prefix):
        row = {"decoder_target_tokens": np.arange(1, 7), "decoder_loss_weights": weights,
               "inputs_mask": prefix}
        return batch_format.inputs_and_targets("decoder_only", row)

    weights = np.array([0, 0, 0, 1, 1, 0], np.float32)
    prefix = np.array([1, 1, 1, 1, 0, 0], bool)
    assert split(weights, prefix) == ([1, 2, 3], [4, 5, 6])
    # An overflowing row has no loss weights; its prefix mask still tells.
    assert split(np.zeros(6), prefix) == ([1, 2, 3], [4, 5, 6])
    assert split(np.zeros(6), np.ones(6, bool)) == ([1, 2, 3, 4, 5, 6], [])
    assert split(np.zeros(6), np.zeros(6, bool)) == ([], [1, 2, 3, 4, 5, 6])  # lm: no inputs


def test_decoding_prompts_are_the_start_of_the_training_rows():
    pairs = [([7, 12, EOS_ID], [5, EOS_ID]), ([21, EOS_ID], [8, 9, EOS_ID])]
    [row] = pad_examples(pairs, 2, 4, 3, family="decoder_only")
    [inputs] = pad_examples(pairs, 2, 4, 3)  # what decoding reads: the encoder layout
    prompt = batch_format.decoder_only_prompt(jnp.asarray(inputs["encoder_input_tokens"]),
                                              room=1)
    np.testing.assert_array_equal(prompt["inputs_mask"], row["inputs_mask"][:, :5])
    for r, (x, _) in enumerate(pairs):  # up to the position that predicts the first target
        np.testing.assert_array_equal(prompt["decoder_input_tokens"][r, :len(x) + 1],
                                      row["decoder_input_tokens"][r, :len(x) + 1])


def test_an_unknown_family_is_named_with_the_choices():
    with pytest.raises(ConfigError, match=r"^family='causal' is not allowed; choose one of "
                                          r"encoder_decoder, decoder_only, encoder_only$"):
        batch_format.row_lengths("causal", 4, 4)
