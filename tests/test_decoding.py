"""decoding.py: cached decoding equals re-computation for every architecture, prompts mean what
they meant in training, beam search and sampling keep their promises, score() is teacher
forcing, and bad arguments are refused by name.

Compiles dominate the runtime, so the tests share shapes: every batch has INPUTS' 4 rows and
its inputs length, and MAX_LENGTH targets, and one jitted forward per architecture serves the
reference loop and every teacher-forced check.
"""
import functools

import jax
import numpy as np
import pytest
from flax import nnx

from t5x_lite import architectures, batch_format
from t5x_lite.config import EOS_ID, model_config
from t5x_lite.data.pipeline import pad_examples
from t5x_lite.decoding import decode, score
from t5x_lite.models import build_model, make_masks

from compile_events import compilations

# The architectures that decode token by token (encoder_only fills mask slots in one pass:
# tests/test_encoder_only.py).
ARCHS = tuple(name for name in architectures.names()
              if not batch_format.in_place(architectures.get(name).family))
VOCAB, MAX_LENGTH = 48, 8
# Rows of different lengths, each ending in EOS, right-padded; the last row is all padding
# (pad_examples fills a last batch with such rows).
INPUTS = np.array([[7, 12, 30, 9, 1], [21, 5, 1, 0, 0], [40, 33, 17, 1, 0], [0, 0, 0, 0, 0]],
                  np.int32)
MODEL_INPUTS = ("encoder_input_tokens", "decoder_input_tokens", "inputs_mask")


@functools.cache
def tiny_model(arch, seed=4, **settings):
    """A random 2-layer model with T5 v1.1's untied head; its greedy outputs are long and
    varied, unlike a tied random model's, which mostly repeat one token. `settings`: other
    model settings (dtype, attention_impl); the parameters depend on the seed alone."""
    cfg = model_config()
    cfg.update(arch=arch, vocab_size=VOCAB, num_sentinels=4, d_model=32, d_ff=64, num_heads=4,
               d_kv=8, num_layers=2, relpos_buckets=8, relpos_max_distance=16, dropout_rate=0.0,
               tie_embeddings=False, mlp="gated-gelu", **settings)
    return build_model(cfg, nnx.Rngs(seed))


@functools.cache
def _jitted_forward(arch, **settings):
    graphdef, state = nnx.split(tiny_model(arch, **settings))
    apply = jax.jit(lambda state, batch: nnx.merge(graphdef, state)(batch, make_masks(batch, arch)))
    return functools.partial(apply, state)


def forward(arch, batch, **settings):
    """float32 logits of `tiny_model(arch, **settings)` on `batch`, every decoder position
    treated as real. Positions after a row's real ones are then junk, but causal (and prefix)
    attention keeps them from the real ones, so those are exactly what training computes."""
    return np.asarray(_jitted_forward(arch, **settings)(
        {k: v for k, v in batch.items() if k in MODEL_INPUTS}))


def prompt_length(row):
    return int(np.sum(row > 0))


def teacher_forced(arch, targets, inputs=INPUTS, **settings):
    """The `pad_examples` batch of `inputs` -> `targets` rows (up to and with their EOS) and the
    logits of `tiny_model(arch, **settings)` on it."""
    pairs = []
    for x, y in zip(inputs, np.asarray(targets)):
        ends = np.flatnonzero(y == EOS_ID)
        pairs.append((x[:prompt_length(x)], y[:ends[0] + 1 if ends.size else len(y)]))
    [batch] = pad_examples(pairs, len(pairs), INPUTS.shape[1], MAX_LENGTH,
                           family=architectures.get(arch).family,
                           mask_token=batch_format.mask_token(VOCAB))
    return batch, forward(arch, batch, **settings)


def log_likelihood(batch, logits):
    """Per row: the sum of log-softmax at the targets, over the loss-weighted positions."""
    log_probs = jax.nn.log_softmax(logits)
    at_targets = np.take_along_axis(log_probs, batch["decoder_target_tokens"][..., None], -1)
    return (at_targets[..., 0] * batch["decoder_loss_weights"]).sum(-1)


def next_logits(arch, rows, inputs=INPUTS):
    """Logits `[len(rows), vocab]` of the token after each of `rows` (the targets so far, one
    list per row of `inputs`), the whole model run on the sequence so far."""
    if architectures.get(arch).family == "encoder_decoder":
        sequences = [[0, *row] for row in rows]
        length = MAX_LENGTH
        batch = {"encoder_input_tokens": inputs}
    else:  # [0, inputs..., targets...] with inputs_mask as pad_examples lays out training
        sequences = [[0, *x[:prompt_length(x)], *row] for x, row in zip(inputs, rows)]
        length = inputs.shape[1] + MAX_LENGTH
        batch = {"inputs_mask": np.array([np.arange(length) <= prompt_length(x)
                                          for x in inputs])}
    batch["decoder_input_tokens"] = np.array([s + [0] * (length - len(s)) for s in sequences])
    logits = forward(arch, batch)
    return np.array([row_logits[len(s) - 1] for s, row_logits in zip(sequences, logits)])


def greedy_by_recomputation(arch):
    """Reference: run the whole model on the growing sequence, take the argmax (never the pad
    id, which decode() does not generate), repeat until EOS."""
    rows = [[] for _ in INPUTS]
    for _ in range(MAX_LENGTH):
        for row, logits in zip(rows, next_logits(arch, rows)):
            if EOS_ID not in row:
                row.append(1 + int(np.argmax(logits[1:])))
    return np.array([row + [0] * (MAX_LENGTH - len(row)) for row in rows])


def t5x_beam_search(arch, num_beams, alpha):
    """T5X's `decoding.beam_search` (google-research/t5x), transcribed on whole-model runs, one
    input row at a time: each step extends the live beams by every token and takes the 2k most
    likely; every one of the 2k ending in EOS joins the finished set, scored log-prob /
    ((5 + length) / 6) ** alpha with a decoder-only model's prompt counted in the length, and
    the k best finished are kept; the k most likely others stay live; a row stops once its
    best live log-prob over the penalty at max_length cannot beat its k-th finished score.
    With nothing finished, the best live sequence and its raw log-prob. The pad id is never a
    token (decode()'s rule). Returns (tokens [rows, MAX_LENGTH], scores [rows])."""
    decoder_only = architectures.get(arch).family == "decoder_only"
    results = []
    for x in INPUTS:
        offset = prompt_length(x) if decoder_only else 0

        def penalty(length):
            return ((5.0 + offset + length) / 6.0) ** alpha

        live, finished = [((), 0.0)], []
        for t in range(MAX_LENGTH):
            logits = next_logits(arch, [list(seq) for seq, _ in live],
                                 np.repeat(x[None], len(live), axis=0))
            log_probs = np.array(jax.nn.log_softmax(logits))
            log_probs[:, 0] = -np.inf
            candidates = sorted(((seq + (token,), score + log_probs[beam, token])
                                 for beam, (seq, score) in enumerate(live)
                                 for token in range(1, VOCAB)), key=lambda c: -c[1])
            top = candidates[:2 * num_beams]
            finished = sorted(finished + [(seq, score / penalty(t + 1)) for seq, score in top
                                          if seq[-1] == EOS_ID], key=lambda c: -c[1])[:num_beams]
            live = [(seq, score) for seq, score in top if seq[-1] != EOS_ID][:num_beams]
            if (len(finished) == num_beams
                    and live[0][1] / penalty(MAX_LENGTH) <= finished[-1][1]):
                break
        seq, score = finished[0] if finished else live[0]
        results.append((list(seq) + [0] * (MAX_LENGTH - len(seq)), score))
    return np.array([r[0] for r in results]), np.array([r[1] for r in results])


def decode_greedy(arch):
    """Greedy decoding as `arch`. A language model is decoded as the train step builds it: a
    'prefix_lm' model (the same class and weights) told arch='language_model'."""
    model = tiny_model("prefix_lm" if arch == "language_model" else arch)
    return decode(model, INPUTS, max_length=MAX_LENGTH, arch=arch)


@pytest.mark.parametrize("arch", ARCHS)
def test_cached_greedy_equals_recomputation_and_the_training_layout(arch):
    result = decode_greedy(arch)
    np.testing.assert_array_equal(result.tokens, greedy_by_recomputation(arch))
    # Teacher-forced on the pad_examples batch of these very targets (for decoder-only models
    # the training prompt; its last prefix position gives the first token), every target is
    # the argmax given the ones before it, and the score is their log-likelihood.
    batch, logits = teacher_forced(arch, result.tokens)
    weighted = batch["decoder_loss_weights"] > 0
    np.testing.assert_array_equal(1 + logits[..., 1:].argmax(-1)[weighted],
                                  batch["decoder_target_tokens"][weighted])
    np.testing.assert_allclose(result.scores, log_likelihood(batch, logits), rtol=1e-5)
    if architectures.get(arch).family == "decoder_only":
        assert len(set(batch["inputs_mask"].sum(1))) > 1  # prompts of different lengths


def test_greedy_outputs_are_varied_and_some_rows_stop_at_eos():
    """Guards the test above: across the architectures it sees long and varied outputs, and
    rows that stop at EOS mid-way (zeros after it)."""
    rows = [list(row) for arch in ARCHS for row in np.asarray(decode_greedy(arch).tokens)]
    stopped = [row for row in rows if EOS_ID in row[:-1]]
    assert len(stopped) >= 2 and all(not any(row[row.index(EOS_ID) + 1:]) for row in stopped)
    assert len({row.index(EOS_ID) for row in stopped}) > 1
    assert sum(EOS_ID not in row for row in rows) >= len(rows) // 2
    assert len(np.unique(rows)) > 20


def test_another_model_of_the_same_config_reuses_the_compiled_program():
    decode_greedy("encoder_decoder")
    model = tiny_model("encoder_decoder", seed=5)
    with compilations() as compiled:
        other = decode(model, INPUTS, max_length=MAX_LENGTH)
    assert compiled == []
    assert not np.array_equal(other.tokens, decode_greedy("encoder_decoder").tokens)


def test_prefix_lm_and_language_model_decode_the_same_weights_differently():
    assert not np.array_equal(decode_greedy("prefix_lm").tokens,
                              decode_greedy("language_model").tokens)


# ----------------------------------------------------------------------------- beam search


def length_penalty(tokens, alpha=0.6):
    lengths = [list(row).index(EOS_ID) + 1 if EOS_ID in row else len(row) for row in tokens]
    return ((5.0 + np.array(lengths)) / 6.0) ** alpha


@pytest.mark.parametrize("arch, num_beams, alpha", [
    ("encoder_decoder", 4, 0.6), ("encoder_decoder", 2, 0.0), ("encoder_decoder", 1, 0.6),
    ("prefix_lm", 3, 0.6)])
def test_beam_search_is_t5x_s(arch, num_beams, alpha):
    """Against `t5x_beam_search`. It kept an EOS candidate only among the k best of the 2k,
    and let a sequence cut off at max_length win over finished ones (a reviewer's head-to-head
    with T5X's own code: 98 of 128 rows differed)."""
    beam = decode(tiny_model(arch), INPUTS, max_length=MAX_LENGTH, method="beam",
                  num_beams=num_beams, alpha=alpha)
    tokens, scores = t5x_beam_search(arch, num_beams, alpha)
    np.testing.assert_array_equal(beam.tokens, tokens)
    np.testing.assert_allclose(beam.scores, scores, rtol=1e-5)


def test_four_beams_score_what_they_return():
    """The score of a finished row is its log-likelihood over the length penalty; a row that
    finished nothing in MAX_LENGTH tokens gets the raw log-likelihood (T5X's convention)."""
    beam = decode(tiny_model("encoder_decoder"), INPUTS, max_length=MAX_LENGTH, method="beam",
                  num_beams=4)
    tokens = np.asarray(beam.tokens)
    finished = (tokens == EOS_ID).any(axis=1)
    assert finished.any() and not finished.all()  # both kinds of rows are checked
    log_likelihoods = log_likelihood(*teacher_forced("encoder_decoder", tokens))
    np.testing.assert_allclose(
        beam.scores, np.where(finished, log_likelihoods / length_penalty(tokens),
                              log_likelihoods), rtol=1e-5)


# -------------------------------------------------------------------------------- sampling


def test_sampling_with_top_k_1_is_greedy():
    model = tiny_model("prefix_lm")
    sampled = decode(model, INPUTS, max_length=MAX_LENGTH, method="sample", top_k=1,
                     rng=jax.random.key(3))
    greedy = decode_greedy("prefix_lm")
    np.testing.assert_array_equal(sampled.tokens, greedy.tokens)
    np.testing.assert_allclose(sampled.scores, greedy.scores, rtol=1e-5)


def test_sampling_near_temperature_zero_is_greedy():
    """The temperature divides the logits: near 0 the whole vocabulary's sampling picks the
    most likely token (a sampler that ignored it samples at 1 and leaves greedy's path)."""
    model = tiny_model("encoder_decoder")
    cold = decode(model, INPUTS, max_length=MAX_LENGTH, method="sample", temperature=1e-4,
                  rng=jax.random.key(3))
    warm = decode(model, INPUTS, max_length=MAX_LENGTH, method="sample", temperature=1.0,
                  rng=jax.random.key(3))
    greedy = decode_greedy("encoder_decoder")
    np.testing.assert_array_equal(cold.tokens, greedy.tokens)
    assert not np.array_equal(warm.tokens, greedy.tokens)


def test_sampling_is_reproducible_per_key_and_stays_in_the_top_k_and_the_nucleus():
    model, top_k, top_p, temperature = tiny_model("encoder_decoder"), 6, 0.6, 1.5

    def sample(seed):
        return decode(model, INPUTS, max_length=MAX_LENGTH, method="sample", top_k=top_k,
                      top_p=top_p, temperature=temperature, rng=jax.random.key(seed))

    first, again, other = sample(0), sample(0), sample(1)
    np.testing.assert_array_equal(first.tokens, again.tokens)
    assert not np.array_equal(first.tokens, other.tokens)
    assert not np.array_equal(first.tokens, decode_greedy("encoder_decoder").tokens)
    # Given what came before it, every sampled token is among the top_k most likely (pad
    # aside), and the more likely ones among those hold less than top_p of the probability
    # (at the temperature, renormalised over the top_k).
    batch, logits = teacher_forced("encoder_decoder", first.tokens)
    weighted = batch["decoder_loss_weights"] > 0
    picked = batch["decoder_target_tokens"][weighted]
    real_logits = logits[weighted][:, 1:] / temperature
    order = np.argsort(-real_logits, axis=-1)[:, :top_k] + 1  # token ids, most likely first
    rank = np.argmax(order == picked[:, None], axis=-1)
    assert np.all(order[np.arange(len(picked)), rank] == picked)  # within the top_k
    top_probs = np.asarray(jax.nn.softmax(np.sort(real_logits, axis=-1)[:, ::-1][:, :top_k]))
    mass_before = np.cumsum(top_probs, axis=-1) - top_probs
    assert np.all(mass_before[np.arange(len(picked)), rank] < top_p)
    assert np.any(rank > 0)  # not greedy every time
    np.testing.assert_allclose(first.scores, log_likelihood(batch, logits), rtol=1e-5)


# --------------------------------------------------------------------------------- scoring


@pytest.mark.parametrize("arch", ["encoder_decoder", "prefix_lm", "language_model",
                                  "encoder_only"])
def test_score_is_the_target_log_likelihood(arch):
    """Summed over the target tokens (EOS included), not divided by their number, for every
    family: encoder_only's targets sit in its mask slots (`encoder_*` keys)."""
    batch, logits = teacher_forced(arch, np.array([[5, 9, 1], [11, 1, 0], [6, 6, 1], [1, 0, 0]]))
    targets_key, weights_key = batch_format.loss_keys(architectures.get(arch).family)
    assert batch[weights_key].sum(-1).tolist() == [3, 2, 3, 1]
    expected = [sum(jax.nn.log_softmax(logits[i, pos])[batch[targets_key][i, pos]]
                    for pos in np.flatnonzero(batch[weights_key][i]))
                for i in range(len(INPUTS))]
    np.testing.assert_allclose(score(tiny_model(arch), batch), expected, rtol=1e-5)


def test_ranking_label_words_by_score_picks_the_most_likely_label():
    # One-token labels: the greedy first tokens of two inputs, so each input has its own
    # most likely label.
    model = tiny_model("encoder_decoder")
    labels = np.asarray(decode_greedy("encoder_decoder").tokens)[:2, :1]
    assert labels[0] != labels[1]
    inputs = np.repeat(INPUTS[:2], len(labels), axis=0)  # each of 2 inputs with each label
    batch, logits = teacher_forced("encoder_decoder", np.tile(labels, (2, 1)), inputs)
    scores = score(model, batch).reshape(2, len(labels))
    likelihood = np.exp(jax.nn.log_softmax(logits[:, 0]))[np.arange(4), batch[
        "decoder_target_tokens"][:, 0]].reshape(2, len(labels))
    np.testing.assert_array_equal(scores.argmax(1), likelihood.argmax(1))
    np.testing.assert_array_equal(scores.argmax(1), [0, 1])


# ------------------------------------------------------------------------------ bad input


def test_numpy_integers_are_integers():
    """A length read off an array (np.int64) decodes as the int it holds, not as bad input."""
    model = tiny_model("encoder_decoder")
    as_numpy = decode(model, INPUTS, max_length=np.int64(MAX_LENGTH), method="beam",
                      num_beams=np.int32(2))
    as_int = decode(model, INPUTS, max_length=MAX_LENGTH, method="beam", num_beams=2)
    np.testing.assert_array_equal(as_numpy.tokens, as_int.tokens)


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_length=0), "max_length=0 must be an integer >= 1"),
    (dict(max_length=-3), "max_length=-3 must be an integer >= 1"),
    (dict(method="nucleus"), "method='nucleus' is not allowed; choose one of 'greedy', "
                             "'sample', 'beam'"),
    (dict(method="beam", num_beams=0), "num_beams=0 must be an integer >= 1"),
    (dict(method="sample", top_p=0.0), r"top_p=0.0 must be in \(0, 1\]"),
    (dict(method="sample", top_p=1.5), r"top_p=1.5 must be in \(0, 1\]"),
    (dict(method="sample", temperature=-1.0), "temperature=-1.0 must be finite and >= 0"),
    # Infinite: every logit -inf/inf, so pad ids with -inf scores came back.
    (dict(method="sample", temperature=float("inf")), "temperature=inf must be finite"),
    (dict(method="beam", alpha=float("nan")), "alpha=nan must be finite and >= 0"),
    (dict(method="sample"), "method='sample' needs rng"),
    (dict(arch="prefix_lm"), "arch='prefix_lm' is not allowed for this EncoderDecoder; "
                             "choose one of encoder_decoder, encoder_decoder_shared"),
])
def test_bad_arguments_name_what_is_wrong(kwargs, message):
    kwargs = {"max_length": MAX_LENGTH, **kwargs}
    with pytest.raises(ValueError, match=message):
        decode(tiny_model("encoder_decoder"), INPUTS, **kwargs)


@pytest.mark.parametrize("inputs, message", [
    # An id past the vocabulary gave a NaN score.
    ([[7, VOCAB, 1]], f"inputs hold ids from 1 to {VOCAB}; the model's are 0 to {VOCAB - 1}"),
    ([[7, -2, 1]], "inputs hold ids from -2 to 7"),
    # Left padding decoded from the wrong prompt (it ends at the count of real tokens).
    ([[7, 9, 1], [0, 5, 1]], "inputs row 1 has padding \\(0\\) before a token; rows must be "
                             "the encoded inputs first, right-padded with 0"),
])
def test_host_inputs_outside_the_vocabulary_or_padded_in_front_are_refused(inputs, message):
    for given in (np.array(inputs, np.int32), inputs):  # a NumPy array, Python lists
        with pytest.raises(ValueError, match=message):
            decode(tiny_model("prefix_lm"), given, max_length=MAX_LENGTH)


def test_score_names_missing_batch_keys():
    batch, _ = teacher_forced("prefix_lm", np.ones((len(INPUTS), 1), np.int32))
    del batch["inputs_mask"]
    with pytest.raises(ValueError, match="missing inputs_mask"):
        score(tiny_model("prefix_lm"), batch)


# ------------------------------------------------------------------- the attention kernel

# The kernel whose cached decoding is checked: cuDNN's where it runs (an NVIDIA GPU; whether
# attention_impl='auto' may pick it there waits on this test, which
# benchmarks/accelerator_check.py runs on one), else JAX's XLA kernel.
KERNEL = "cudnn" if jax.default_backend() == "gpu" else "xla"
BF16 = (("dtype", "bfloat16"),)  # cuDNN's kernels take bfloat16 or float16


@pytest.mark.parametrize("arch", ARCHS)
def test_cached_decoding_with_the_fused_kernel_picks_what_the_einsum_forward_ranks_first(arch):
    """Decoding attends with one query over a cache of slots, which training never does. In
    bfloat16, each token greedy decoding picks with KERNEL is one the einsum path's
    teacher-forced forward of the same parameters ranks first up to bfloat16 rounding, and its
    scores are that forward's log-likelihoods."""
    kernel = dict(BF16, attention_impl=KERNEL)
    reference = dict(BF16, attention_impl="einsum")
    model = tiny_model("prefix_lm" if arch == "language_model" else arch, **kernel)
    result = decode(model, INPUTS, max_length=MAX_LENGTH, arch=arch)
    batch, logits = teacher_forced(arch, result.tokens, **reference)
    weighted = batch["decoder_loss_weights"] > 0
    real = logits[..., 1:][weighted]  # the pad id is never generated
    chosen = np.take_along_axis(real, batch["decoder_target_tokens"][weighted][:, None] - 1, -1)
    # bfloat16 keeps 8 bits: two kernels' logits differ by a few roundings of their scale.
    tolerance = 0.05 * np.abs(real).max()
    assert np.all(chosen[:, 0] >= real.max(-1) - tolerance)
    np.testing.assert_allclose(result.scores, log_likelihood(batch, logits),
                               atol=0.05 * weighted.sum(-1).max())
