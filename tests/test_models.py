"""models.py / layers.py through the whole network: what each architecture can see, padding and
packing, parameter structure and sharing, dropout, dtypes, split/merge under jit, bad configs."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from t5x_lite import architectures, models, train_state
from t5x_lite.config import ConfigError, default_config, model_config
from t5x_lite.models import build_model, make_masks

ARCHS = architectures.names()
ENCODER_DECODER_ARCHS = architectures.names(family="encoder_decoder")
# The probe below feeds decoder rows; encoder_only's visibility is tested in test_encoder_only.
WITH_DECODER = tuple(a for a in ARCHS if architectures.get(a).stack("decoder"))

VOCAB = 64
LOGICAL_AXES = {"batch", "length", "embed", "vocab", "heads", "kv", "mlp", "relpos_buckets",
                "layers"}
V11 = dict(tie_embeddings=False, mlp="gated-gelu")  # T5 v1.1: the other branch of each option


def tiny_config(arch, **overrides):
    cfg = model_config()
    cfg.update(arch=arch, vocab_size=VOCAB, num_sentinels=4, d_model=32, d_ff=64, num_heads=4,
               d_kv=8, num_layers=2, relpos_buckets=8, relpos_max_distance=16, dropout_rate=0.0)
    cfg.update(**overrides)
    return cfg


@functools.cache
def tiny_model(arch, **overrides):
    """One model per (arch, overrides), built once per test session (seed 0)."""
    return build_model(tiny_config(arch, **overrides), nnx.Rngs(0))


@nnx.jit
def forward(model, batch, masks=None, dropout_rng=None):
    """`model(batch, masks, dropout_rng=...)`, compiled once per model structure and shapes."""
    return model(batch, masks, dropout_rng=dropout_rng)


def tokens(seed, shape):
    """Random real (non-pad, non-special) token ids."""
    return jax.random.randint(jax.random.key(seed), shape, 3, VOCAB - 4, dtype=jnp.int32)


def perturb(row, position):
    """`row` with a different real token at `position`."""
    return row.at[position].set(3 + (row[position] - 2) % (VOCAB - 7))


# ---------------------------------------------------------------- what each position can see
#
# One probe batch per architecture (one compile for all structural tests), every row LENGTH
# long: row 0 is the base example; then one row per decoder position with that token changed;
# for encoder-decoders one row per real encoder position with that token changed; last, the
# same REAL tokens padded at the end and padded at the front (relative positions, hence the
# outputs of the real tokens, are the same in both unless padding leaks).

LENGTH, REAL, PREFIX = 6, 4, 3


@functools.cache
def probe(arch):
    """float32 logits [rows, LENGTH, vocab] of the probe batch described above."""
    encoder_row = jnp.pad(tokens(1, (REAL,)), (0, LENGTH - REAL))
    decoder_row, targets = tokens(2, (LENGTH,)), tokens(3, (LENGTH,))
    prefix_row = jnp.arange(LENGTH) < PREFIX
    rows = [(encoder_row, decoder_row, targets, prefix_row)]
    rows += [(encoder_row, perturb(decoder_row, t), targets, prefix_row) for t in range(LENGTH)]
    if arch in ENCODER_DECODER_ARCHS:
        rows += [(perturb(encoder_row, j), decoder_row, targets, prefix_row) for j in range(REAL)]
    junk = tokens(4, (LENGTH - REAL,))  # decoder inputs at padded targets must not matter
    zeros = jnp.zeros(LENGTH - REAL, jnp.int32)
    real = (encoder_row[:REAL], decoder_row[:REAL], targets[:REAL], prefix_row[:REAL])
    pads = (zeros, junk, zeros, zeros)
    rows.append(tuple(jnp.concatenate([r, p]) for r, p in zip(real, pads)))  # padded at the end
    rows.append(tuple(jnp.concatenate([p, r]) for r, p in zip(real, pads)))  # ... at the front
    encoder, decoder, target, prefix = (jnp.stack(column) for column in zip(*rows))
    batch = {"decoder_input_tokens": decoder, "decoder_target_tokens": target}
    if arch in ENCODER_DECODER_ARCHS:
        batch["encoder_input_tokens"] = encoder
    else:
        batch["inputs_mask"] = prefix.astype(bool)
    return np.asarray(forward(tiny_model(arch), batch))


def changed(logits, row):
    """Per position: do the logits of `row` differ from the base row 0?"""
    return np.abs(logits[row] - logits[0]).max(-1) > 1e-5


@pytest.mark.parametrize("arch", WITH_DECODER)
def test_no_output_depends_on_a_later_target(arch):
    logits = probe(arch)
    positions = np.arange(LENGTH)
    for t in range(LENGTH):
        if arch == "prefix_lm" and t < PREFIX:  # a prefix token is seen by the whole prefix
            expected = np.ones(LENGTH, bool)
        else:  # otherwise only by itself and later positions
            expected = positions >= t
        np.testing.assert_array_equal(changed(logits, 1 + t), expected, err_msg=f"token {t}")


@pytest.mark.parametrize("arch", ENCODER_DECODER_ARCHS)
def test_encoder_sees_every_real_input_token(arch):
    logits = probe(arch)
    for j in range(REAL):
        assert changed(logits, 1 + LENGTH + j).all(), f"outputs ignore encoder token {j}"


def unpadded(arch):
    """float32 logits [REAL, vocab] of the probe's padded example with no padding at all."""
    decoder_row, targets = tokens(2, (LENGTH,))[:REAL], tokens(3, (LENGTH,))[:REAL]
    batch = {"decoder_input_tokens": decoder_row[None], "decoder_target_tokens": targets[None]}
    if arch in ENCODER_DECODER_ARCHS:
        batch["encoder_input_tokens"] = tokens(1, (REAL,))[None]
    else:
        batch["inputs_mask"] = (jnp.arange(REAL) < PREFIX)[None]
    return np.asarray(forward(tiny_model(arch), batch))[0]


@pytest.mark.parametrize("arch", WITH_DECODER)
def test_padding_never_changes_real_outputs(arch):
    """Padded at the end, at the front, or not at all: the real tokens' outputs agree. (Front
    against end alone would miss a decoder that attends to the encoder's padding: the pads'
    encoder states are the same wherever they sit.)"""
    padded_at_end, padded_at_front = probe(arch)[-2], probe(arch)[-1]
    np.testing.assert_allclose(padded_at_end[:REAL], padded_at_front[LENGTH - REAL:], atol=1e-5)
    np.testing.assert_allclose(padded_at_end[:REAL], unpadded(arch), atol=1e-5)


@pytest.mark.parametrize("arch", ["encoder_decoder", "prefix_lm"])
def test_packed_examples_equal_separate_examples(arch):
    """Two examples packed into one row (segment ids + positions) give their separate logits."""
    # Equal lengths so both separate examples share one compile; positions restart per example.
    enc_a, enc_b, dec_a, dec_b = (tokens(seed, (3,)) for seed in (10, 11, 12, 13))
    prefix_a, prefix_b = jnp.array([True, False, False]), jnp.array([True, True, False])

    def example(enc, dec, prefix):
        batch = {"decoder_input_tokens": dec[None], "decoder_target_tokens": dec[None]}
        if arch in ENCODER_DECODER_ARCHS:
            batch["encoder_input_tokens"] = enc[None]
        else:
            batch["inputs_mask"] = prefix[None]
        return batch

    def segments(a, b):
        return jnp.concatenate([jnp.ones(len(a), jnp.int32), jnp.full(len(b), 2, jnp.int32)])[None]

    def positions(a, b):
        return jnp.concatenate([jnp.arange(len(a)), jnp.arange(len(b))])[None]

    packed = {"decoder_input_tokens": jnp.concatenate([dec_a, dec_b])[None],
              "decoder_target_tokens": jnp.concatenate([dec_a, dec_b])[None],
              "decoder_segment_ids": segments(dec_a, dec_b),
              "decoder_positions": positions(dec_a, dec_b)}
    if arch in ENCODER_DECODER_ARCHS:
        packed.update(encoder_input_tokens=jnp.concatenate([enc_a, enc_b])[None],
                      encoder_segment_ids=segments(enc_a, enc_b),
                      encoder_positions=positions(enc_a, enc_b))
    else:
        packed["inputs_mask"] = jnp.concatenate([prefix_a, prefix_b])[None]
    model = tiny_model(arch)
    separate = jnp.concatenate([forward(model, example(enc_a, dec_a, prefix_a)),
                                forward(model, example(enc_b, dec_b, prefix_b))], axis=1)
    np.testing.assert_allclose(forward(model, packed), separate, atol=1e-5)


def test_language_model_and_prefix_lm_differ_only_in_the_mask_and_the_bucket_rule():
    """One network, as Mesh TensorFlow's Unitransformer: a prefix LM (input_full_attention)
    attends its prefix bidirectionally and reads relative positions with bidirectional
    buckets; a language model (fully autoregressive) causally, with causal buckets
    (`bidirectional = not fully_autoregressive`). The shared program's flag switches both."""
    lm, prefix = tiny_model("language_model"), tiny_model("prefix_lm")
    assert type(lm) is type(prefix)
    lm_params = nnx.to_pure_dict(nnx.state(lm, nnx.Param))
    prefix_params = nnx.to_pure_dict(nnx.state(prefix, nnx.Param))
    assert jax.tree.structure(lm_params) == jax.tree.structure(prefix_params)
    jax.tree.map(np.testing.assert_array_equal, lm_params, prefix_params)

    batch = {"decoder_input_tokens": tokens(14, (2, LENGTH)),
             "inputs_mask": jnp.arange(LENGTH)[None].repeat(2, 0) < PREFIX}
    assert make_masks(batch, "language_model")["decoder_bidirectional_positions"] is False
    assert make_masks(batch, "prefix_lm")["decoder_bidirectional_positions"] is True
    # The prefix LM's network with the flag off is the language model, and either network
    # under the other's masks is the other.
    flag_off = make_masks(batch, "prefix_lm", jnp.bool_(False))
    np.testing.assert_allclose(forward(prefix, batch, flag_off), forward(lm, batch), atol=1e-6)
    with_prefix_masks = forward(lm, batch, make_masks(batch, "prefix_lm"))
    np.testing.assert_allclose(with_prefix_masks, forward(prefix, batch), atol=1e-6)
    assert np.abs(np.asarray(with_prefix_masks - forward(lm, batch))).max() > 1e-4
    # Without a prefix the masks are equal; the bucket rule alone still changes the outputs.
    batch["inputs_mask"] = jnp.zeros((2, LENGTH), bool)
    assert np.abs(np.asarray(forward(prefix, batch) - forward(lm, batch))).max() > 1e-4


def test_a_language_model_s_parameters_merged_from_its_config_make_a_language_model():
    """Evaluation, zero-shot and export merge a run's parameters into
    `train_state.model_graphdef(config)`. It gave the language model's program's network, a
    prefix LM, so `model(batch)` and `decode` / `score` without `arch=` masked and read
    positions as a prefix LM (logits off by up to 2)."""
    config = default_config()
    config.model = tiny_config("language_model")
    lm = tiny_model("language_model")
    merged = nnx.merge(train_state.model_graphdef(config), nnx.state(lm, nnx.Param))
    assert merged.arch == "language_model"
    batch = {"decoder_input_tokens": tokens(15, (2, LENGTH)),
             "inputs_mask": jnp.arange(LENGTH)[None].repeat(2, 0) < PREFIX}
    np.testing.assert_array_equal(forward(merged, batch), forward(lm, batch))


def test_a_language_model_reads_positions_with_t5_s_causal_buckets():
    """The bias of its stack is the causal rule's (keys after the query share bucket 0; all
    buckets for the past), transcribed here: exact distances below num_buckets / 2, then
    log-spaced to max_distance."""
    import math

    lm = tiny_model("language_model")
    relpos = lm.decoder.relpos
    n, max_distance = relpos.num_buckets, relpos.max_distance
    positions = jnp.arange(40)

    def causal_bucket(relative):  # key - query
        distance = max(-relative, 0)
        if distance < n // 2:
            return distance
        log_bucket = n // 2 + int(math.log(distance / (n // 2)) / math.log(max_distance / (n // 2))
                                 * (n - n // 2))
        return min(log_bucket, n - 1)

    expected = np.array([[causal_bucket(k - q) for k in range(40)] for q in range(40)])
    table = np.asarray(relpos.embedding[...])
    bias = np.asarray(relpos(positions, positions, False))[0]  # [H, Lq, Lk]
    np.testing.assert_allclose(bias, table[expected].transpose(2, 0, 1), rtol=1e-6)
    masks = make_masks({"decoder_input_tokens": tokens(3, (1, 40))}, "language_model")
    assert masks["decoder_bidirectional_positions"] is False


def test_cross_attention_layers_need_encoder_keys_and_others_refuse_them():
    model, x = tiny_model("encoder_decoder"), jnp.zeros((1, 2, 32))
    message = r"encoded \(or a cache holding its keys / values\) must be given if and only if"
    with pytest.raises(ValueError, match=message):
        model.decoder.layers[0](x, None, None)
    with pytest.raises(ValueError, match=message):
        model.encoder.layers[0](x, None, None, encoded=x)


def test_make_masks_rejects_an_unknown_arch():
    with pytest.raises(ConfigError, match="arch='rnn'.*encoder_decoder.*prefix_lm"):
        make_masks({"decoder_input_tokens": tokens(0, (1, 2))}, "rnn")


# ------------------------------------------------------------------ parameters and structure

def abstract_params(arch, **overrides):
    """Flat {path: Param} of a model built under eval_shape (no arrays allocated)."""
    model = nnx.eval_shape(lambda: build_model(tiny_config(arch, **overrides), nnx.Rngs(0)))
    return dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))


def count(params):
    return sum(int(np.prod(p.shape)) for p in params.values())


def test_every_parameter_has_logical_axes_of_its_rank():
    for arch in ARCHS:
        for tie, mlp in [(True, "relu"), (False, "gated-gelu")]:
            for path, param in abstract_params(arch, tie_embeddings=tie, mlp=mlp).items():
                axes = param.get_metadata()["logical_axes"]
                assert len(axes) == len(param.shape), path
                assert set(axes) <= LOGICAL_AXES, path
                assert param.dtype == jnp.float32, path


def test_parameter_tree_names():
    names = {"/".join(map(str, path)) for path in abstract_params("encoder_decoder", **V11)}
    for name in ["token_embedder/embedding", "encoder/relpos/embedding",
                 "encoder/layers/1/self_attention/query", "encoder/layers/0/mlp/wi_0",
                 "decoder/layers/1/cross_attention/out", "decoder/final_norm/scale",
                 "decoder/layers/0/cross_attention_norm/scale", "lm_head/kernel"]:
        assert name in names
    assert not any(path[0] == "lm_head" for path in abstract_params("encoder_decoder"))
    assert not any(path[0] == "encoder" for path in abstract_params("language_model"))


def test_half_has_half_the_layers():
    half = tiny_model("encoder_decoder_half", num_layers=4)
    assert len(half.encoder.layers) == len(half.decoder.layers) == 2
    assert count(abstract_params("encoder_decoder_half", num_layers=4)) == count(
        abstract_params("encoder_decoder", num_layers=2))


def test_shared_stacks_hold_one_copy_of_the_shared_parameters():
    full, shared = abstract_params("encoder_decoder"), abstract_params("encoder_decoder_shared")
    shared_parts = ("self_attention", "self_attention_norm", "mlp", "mlp_norm")
    decoder_own = {path: p for path, p in full.items()
                   if path[0] == "decoder" and path[1] == "layers" and path[3] in shared_parts}
    assert count(shared) == count(full) - count(decoder_own)
    # Each shared block is listed under one path only.
    assert sum(path[-2:] == ("mlp", "wo") for path in shared) == 2  # one per layer index
    assert sum(path[-2:] == ("mlp", "wo") for path in full) == 4


def test_shared_parameters_are_one_object_through_split_and_merge():
    model = build_model(tiny_config("encoder_decoder_shared"), nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    merged = nnx.merge(graphdef, state)
    merged.encoder.layers[0].mlp.wo[...] = jnp.zeros_like(merged.encoder.layers[0].mlp.wo[...])
    assert merged.decoder.layers[0].mlp is merged.encoder.layers[0].mlp
    np.testing.assert_array_equal(merged.decoder.layers[0].mlp.wo[...], 0.0)
    assert merged.decoder.layers[0].cross_attention is not None
    assert merged.decoder.final_norm is not merged.encoder.final_norm


def layers_drawn_one_by_one(make_layer, num_layers, rngs):
    """What `models._layers_drawn_in_a_loop` must equal: layer after layer from the stream,
    in Python."""
    return models._stacked([make_layer(rngs) for _ in range(num_layers)])


def init_params(cfg):
    """The parameters of `cfg`'s model from seed 3, built under jit as the train state's are
    (a new function each call, so no trace is reused)."""
    return jax.jit(lambda key: nnx.state(build_model(cfg, nnx.Rngs(key)), nnx.Param))(
        jax.random.key(3))


@pytest.mark.parametrize("scanned", [False, True])
@pytest.mark.parametrize("arch", ["encoder_decoder", "encoder_decoder_shared", "encoder_only"])
def test_layers_drawn_in_the_program_s_loop_equal_layers_drawn_one_by_one(arch, scanned,
                                                                         monkeypatch):
    """Bit for bit: two stacks, shared layers, one stack; gated MLPs and untied heads. The
    decoder's relative position bias is drawn after the encoder's layers: its equality shows
    the stream moved on as far."""
    cfg = tiny_config(arch, num_layers=2, scan_layers=scanned, **V11)  # 4: 1.7x the time
    in_a_loop = init_params(cfg)
    monkeypatch.setattr(models, "_layers_drawn_in_a_loop", layers_drawn_one_by_one)
    one_by_one = init_params(cfg)
    assert jax.tree.structure(in_a_loop) == jax.tree.structure(one_by_one)
    for (path, value), expected in zip(jax.tree_util.tree_leaves_with_path(in_a_loop),
                                       jax.tree.leaves(one_by_one)):
        np.testing.assert_array_equal(value, expected, err_msg=jax.tree_util.keystr(path))


def test_the_init_program_draws_do_not_grow_with_depth():
    """A layer's draws appear once per stack, in its loop (XLA compiles every draw apart:
    a draw per parameter of each layer made the T5-base init compile take 16 s on a CPU)."""
    def fold_ins(num_layers):
        cfg = tiny_config("encoder_decoder", num_layers=num_layers)
        jaxpr = jax.make_jaxpr(lambda key: nnx.state(build_model(cfg, nnx.Rngs(key))))(
            jax.random.key(0))
        return str(jaxpr).count("random_fold_in")

    assert fold_ins(2) == fold_ins(6) > 0


def test_initialisers_follow_t5():
    """Standard deviations from T5's rule (factor 1); norm scales start at one."""
    cfg = tiny_config("encoder_decoder", **V11)
    model = tiny_model("encoder_decoder", **V11)
    layer = model.decoder.layers[0]
    d, heads, kv, ff = cfg.d_model, cfg.num_heads, cfg.d_kv, cfg.d_ff
    expected_std = {
        "embedding": (model.token_embedder.embedding, 1.0),
        "query": (layer.self_attention.query, (d * kv) ** -0.5),
        "key": (layer.cross_attention.key, d**-0.5),
        "value": (layer.self_attention.value, d**-0.5),
        "out": (layer.cross_attention.out, (heads * kv) ** -0.5),
        "wi_0": (layer.mlp.wi_0, d**-0.5),
        "wo": (layer.mlp.wo, ff**-0.5),
        "lm_head": (model.lm_head.kernel, d**-0.5),
    }
    for name, (param, std) in expected_std.items():
        values = np.asarray(param[...])
        assert abs(values.mean()) < 0.15 * std, name
        assert abs(values.std() / std - 1) < 0.1, name  # >= 1024 samples: ~2% standard error
    np.testing.assert_array_equal(layer.mlp_norm.scale[...], 1.0)


def test_paper_sized_parameter_ratios():
    """Table 2's Params column: encoder_decoder ~2P, shared and half ~P (no arrays built)."""
    def paper_count(arch):
        cfg = model_config()
        cfg.arch = arch
        model = nnx.eval_shape(lambda: build_model(cfg, nnx.Rngs(0)))
        return sum(p.size for p in jax.tree.leaves(nnx.state(model, nnx.Param)))

    full, shared, half = (paper_count(a) for a in ("encoder_decoder", "encoder_decoder_shared",
                                                    "encoder_decoder_half"))
    assert 1.5 < full / shared < 2.0
    assert 1.5 < full / half < 2.0
    assert 0.9 < shared / half < 1.25


# ------------------------------------------------------------------ dropout, dtype, jit

def ed_batch():
    return {"encoder_input_tokens": tokens(20, (2, 5)), "decoder_input_tokens": tokens(21, (2, 4))}


def test_dropout_is_a_function_of_the_key():
    # Decoder-only: the dropout code is the stacks' and layers', and it compiles fastest.
    model = tiny_model("language_model", dropout_rate=0.3, **V11)
    no_dropout = tiny_model("language_model", **V11)  # same seed, same parameters, rate 0
    batch, key = {"decoder_input_tokens": tokens(22, (2, 4))}, jax.random.key(7)
    first, again = forward(model, batch, None, key), forward(model, batch, None, key)
    np.testing.assert_array_equal(first, again)
    assert np.abs(np.asarray(first - forward(model, batch))).max() > 1e-3
    other_key = forward(model, batch, None, jax.random.key(8))
    assert np.abs(np.asarray(first - other_key)).max() > 1e-3
    np.testing.assert_array_equal(forward(model, batch), forward(no_dropout, batch))


def test_attention_weights_are_dropped_in_training_only_and_by_their_own_key():
    """`model.attention_dropout` (T5's dropout on the attention weights, on by default) changes
    training's outputs and nothing in evaluation; off, the other sites draw what they drew."""
    batch, key = ed_batch(), jax.random.key(7)
    weights_too = tiny_model("encoder_decoder", dropout_rate=0.3)
    others_only = tiny_model("encoder_decoder", dropout_rate=0.3, attention_dropout=False)
    np.testing.assert_array_equal(forward(weights_too, batch), forward(others_only, batch))
    trained = forward(weights_too, batch, None, key)
    assert np.all(np.isfinite(trained))
    assert np.abs(np.asarray(trained - forward(others_only, batch, None, key))).max() > 1e-3


def test_remat_recomputes_layers_without_changing_gradients():
    """`model.remat` trades compute for memory; the gradients (dropout included) stay the same."""
    batch, key = ed_batch(), jax.random.key(3)
    grads = []
    for remat in (False, True):
        graphdef, params = nnx.split(
            build_model(tiny_config("encoder_decoder_shared", dropout_rate=0.2, remat=remat),
                        nnx.Rngs(0)), nnx.Param)

        def loss(params):
            return jnp.sum(nnx.merge(graphdef, params)(batch, dropout_rng=key) ** 2)

        grads.append(jax.jit(jax.grad(loss))(params))
        # jax.checkpoint appears in the traced program (as a remat primitive) only when asked.
        assert ("remat" in str(jax.make_jaxpr(loss)(params))) == remat
    for with_remat, without in zip(jax.tree.leaves(grads[1]), jax.tree.leaves(grads[0])):
        np.testing.assert_allclose(with_remat, without, rtol=1e-5, atol=1e-5)


def test_split_state_under_jax_jit_and_encode_decode():
    """The train step's pattern: plain jax.jit over the split state; encode + decode == call."""
    model = tiny_model("encoder_decoder", **V11)
    graphdef, state = nnx.split(model)

    @jax.jit
    def encode_then_decode(state, batch):
        merged = nnx.merge(graphdef, state)
        masks = make_masks(batch, "encoder_decoder")
        return merged.decode(merged.encode(batch, masks), batch, masks)

    batch = ed_batch()
    np.testing.assert_allclose(encode_then_decode(state, batch), forward(model, batch),
                               atol=1e-5)


def test_bfloat16_compute_keeps_float32_params_and_logits():
    model = tiny_model("encoder_decoder", dtype="bfloat16", **V11)
    reference = tiny_model("encoder_decoder", **V11)  # same seed, float32 compute
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(nnx.state(model, nnx.Param)))
    logits = forward(model, ed_batch())
    assert logits.dtype == jnp.float32
    expected = forward(reference, ed_batch())
    assert np.abs(np.asarray(logits - expected)).max() < 0.05 * np.abs(np.asarray(expected)).max()


@pytest.mark.parametrize("tied", [True, False])
def test_bfloat16_logits_are_accumulated_in_float32_not_rounded_to_bfloat16(tied):
    """T5X computes the output logits in float32 "for stability"; rounded to bf16 (8
    significant bits) two tokens' logits often tie, which lifts the token accuracy
    (`label >= max`) and leaves greedy decoding's pick to the token index. The bf16 model's
    logits must be the float32 product of its bf16 operands (the final states, the scaled
    states when tied, and the kernel rounded to bf16)."""
    overrides = {} if tied else V11
    model = tiny_model("encoder_decoder", dtype="bfloat16", **overrides)
    states = (4.0 * jax.random.normal(jax.random.key(5), (2, 7, model.d_model))).astype(
        jnp.bfloat16)
    if tied:
        operand = (states * model.d_model**-0.5).astype(jnp.float32)
        kernel = model.token_embedder.embedding[...].astype(jnp.bfloat16).T
    else:
        operand, kernel = states.astype(jnp.float32), model.lm_head.kernel[...].astype(jnp.bfloat16)
    expected = np.asarray(operand) @ np.asarray(kernel.astype(jnp.float32))
    logits = model.logits(states)
    assert logits.dtype == jnp.float32
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


# ------------------------------------------------------------------ bad configs

@pytest.mark.parametrize("overrides,field", [
    (dict(arch="rnn"), "model.arch.*encoder_decoder_half"),
    (dict(arch="encoder_decoder_half", num_layers=3), "model.num_layers=3 must be a multiple of 2"),
    (dict(vocab_size=50, num_sentinels=100), "model.vocab_size"),
    (dict(d_model=0), "model.d_model"),
    (dict(num_heads=-2), "model.num_heads"),
    (dict(d_ff=0), "model.d_ff"),
    (dict(mlp="swish"), "model.mlp.*gated-gelu"),
])
def test_build_model_rejects_bad_configs(overrides, field):
    cfg = tiny_config("encoder_decoder")
    cfg.update(**overrides)
    with pytest.raises(ConfigError, match=field):
        build_model(cfg, nnx.Rngs(0))


def test_decoder_only_archs_have_no_encoder():
    for arch in architectures.names(family="decoder_only"):
        assert not hasattr(tiny_model(arch), "encoder")


@pytest.mark.parametrize("x_shape, kernel_shape, contract, spec", [
    ((2, 5, 8), (8, 3, 4), 1, "bld,dhk->blhk"),   # query / key / value projections
    ((2, 5, 3, 4), (3, 4, 8), 2, "blhk,hkd->bld"),  # attention output projection
    ((2, 5, 8), (8, 16), 1, "bld,df->blf"),        # MLP and untied logits
])
def test_dense_is_the_einsum_it_flattens(x_shape, kernel_shape, contract, spec):
    """`layers.dense` runs each projection as one 2-D matmul; values and both gradients must
    be those of the einsum it replaces."""
    from t5x_lite.layers import dense

    kx, kk, kg = jax.random.split(jax.random.key(0), 3)
    x, kernel = jax.random.normal(kx, x_shape), jax.random.normal(kk, kernel_shape)
    cotangent = jax.random.normal(kg, jnp.einsum(spec, x, kernel).shape)

    def loss(f):
        return lambda x, kernel: jnp.sum(f(x, kernel) * cotangent)

    flat = jax.value_and_grad(loss(lambda x, k: dense(x, k, contract)), argnums=(0, 1))(x, kernel)
    ref = jax.value_and_grad(loss(lambda x, k: jnp.einsum(spec, x, k)), argnums=(0, 1))(x, kernel)
    for got, want in zip(jax.tree.leaves(flat), jax.tree.leaves(ref)):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_rms_norm_gradient_is_autodiff_s_and_keeps_only_x_and_its_scale(dtype):
    """`layers.rms_norm` writes its gradient out so that the backward keeps `x` in its own
    dtype and one float32 value per row; its value and both gradients must be those of autodiff
    through a direct transcription of T5's norm (float32 inside), and what it keeps for the
    backward must be under one float32 copy of `x` (autodiff keeps three)."""
    from t5x_lite.layers import rms_norm

    kx, ks, kg = jax.random.split(jax.random.key(0), 3)
    x = (3.0 * jax.random.normal(kx, (4, 6, 32))).astype(dtype)
    scale = 1.0 + 0.1 * jax.random.normal(ks, (32,))
    cotangent = jax.random.normal(kg, x.shape).astype(dtype)

    def transcription(x, scale, epsilon=1e-6):
        x32 = x.astype(jnp.float32)
        variance = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
        return (scale * (x32 * jax.lax.rsqrt(variance + epsilon))).astype(x.dtype)

    def loss(norm):
        return lambda x, scale: jnp.sum((norm(x, scale) * cotangent).astype(jnp.float32))

    got = jax.value_and_grad(loss(lambda x, s: rms_norm(x, s, 1e-6)), argnums=(0, 1))(x, scale)
    want = jax.value_and_grad(loss(transcription), argnums=(0, 1))(x, scale)
    # float32: rounding only; bf16: one rounding of each gradient (2^-8) on both sides.
    tolerance = 1e-5 if dtype == jnp.float32 else 2e-2
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32),
                                   rtol=tolerance, atol=tolerance * float(jnp.abs(w).max()))

    def kept_bytes(norm):
        _, backward = jax.vjp(norm, x, scale)  # a pytree holding what the backward keeps
        return sum(leaf.nbytes for leaf in jax.tree.leaves(backward))

    rows = x.size // x.shape[-1]
    assert kept_bytes(lambda x, s: rms_norm(x, s, 1e-6)) <= x.nbytes + 4 * rows + scale.nbytes
    assert kept_bytes(transcription) >= 3 * 4 * x.size  # what the custom gradient avoids
