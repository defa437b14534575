"""`model.scan_layers`: stacked layer parameters run by `jax.lax.scan` give the same model.

For every architecture a scanned model built from a seed holds the unscanned model's
parameters stacked on a leading `layers` axis, computes the same logits (dropout included),
gradients and decoded tokens, trains to the same losses on a sharded mesh, and its traced
program holds each stack's layer once instead of `num_layers` times.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from t5x_lite import batch_format, decoding, objectives, partitioning, train_state, train_step
from t5x_lite import architectures
from t5x_lite.config import ConfigError, model_config
from t5x_lite.models import build_model, make_masks, scan_layers
from tiny_configs import assert_params_follow_default_rules, tiny_train_config

NUM_LAYERS = 4


def tiny_model_config(arch, scanned, **fields):
    cfg = model_config()
    cfg.update(arch=arch, vocab_size=64, num_sentinels=4, d_model=16, d_ff=32, num_heads=2,
               d_kv=8, num_layers=NUM_LAYERS, relpos_buckets=8, relpos_max_distance=16,
               dropout_rate=0.1, scan_layers=scanned)
    cfg.update(fields)
    return cfg


def batch(arch, rows=2, length=6):
    tokens = np.random.default_rng(0).integers(3, 60, (rows, length)).astype(np.int32)
    tokens[1, -2:] = 0  # a padded row
    batch = {"decoder_input_tokens": tokens, "decoder_target_tokens": tokens,
             "decoder_loss_weights": (tokens > 0).astype(np.float32),
             "encoder_input_tokens": tokens, "encoder_target_tokens": tokens,
             "encoder_loss_weights": (tokens > 0).astype(np.float32)}  # what each family reads
    if architectures.get(arch).family == "decoder_only":
        batch["inputs_mask"] = np.arange(length)[None] < 3
    return batch


def is_param(x):
    return isinstance(x, nnx.Variable)


def params_by_path(params):
    """{path: value} of a model's parameters or of an `nnx.State` of them (or of gradients)."""
    params = nnx.state(params, nnx.Param) if isinstance(params, nnx.Module) else params
    flat = jax.tree_util.tree_flatten_with_path(params, is_leaf=is_param)[0]
    return {tuple(getattr(k, "key", getattr(k, "idx", k)) for k in path): np.asarray(v.get_value())
            for path, v in flat}


def restacked(unscanned_params):
    """The unscanned model's parameters with each stack's per-layer entries stacked, keyed like
    the scanned model's (`(stack, 'layers', i, *rest)` -> `(stack, 'layers', *rest)`)."""
    grouped = {}
    for path, value in unscanned_params.items():
        if len(path) > 2 and path[1] == "layers":
            grouped.setdefault((path[0], "layers", *path[3:]), {})[path[2]] = value
        else:
            grouped[path] = value
    return {path: np.stack([v[i] for i in sorted(v)]) if isinstance(v, dict) else v
            for path, v in grouped.items()}


def loss(model, arch, rng):
    b = batch(arch)
    logits = model(b, make_masks(b, arch), dropout_rng=rng)
    weights = b[batch_format.loss_keys(architectures.get(arch).family)[1]]
    return -jnp.sum(jax.nn.log_softmax(logits)[..., 7] * weights)


@pytest.mark.parametrize("arch", architectures.names())
def test_scanned_model_has_the_same_parameters_logits_and_gradients(arch):
    plain = build_model(tiny_model_config(arch, False), nnx.Rngs(3))
    scanned = build_model(tiny_model_config(arch, True), nnx.Rngs(3))
    expected = restacked(params_by_path(plain))
    actual = params_by_path(scanned)
    assert actual.keys() == expected.keys()
    for path, value in actual.items():
        np.testing.assert_array_equal(value, expected[path], err_msg=str(path))

    rng = jax.random.key(5)  # dropout on: every layer must get its unscanned dropout key
    plain_loss, plain_grads = nnx.value_and_grad(loss)(plain, arch, rng)
    scanned_loss, scanned_grads = nnx.value_and_grad(loss)(scanned, arch, rng)
    np.testing.assert_allclose(scanned_loss, plain_loss, rtol=1e-5)
    expected_grads = restacked(params_by_path(plain_grads))
    for path, grad in params_by_path(scanned_grads).items():
        # Gradients are O(1): atol covers float32 cancellation in near-zero entries.
        np.testing.assert_allclose(grad, expected_grads[path], rtol=1e-4, atol=1e-5,
                                   err_msg=str(path))


def test_stacked_parameters_carry_the_layers_axis_and_shared_blocks_stay_shared():
    model = build_model(tiny_model_config("encoder_decoder_shared", True), nnx.Rngs(0))
    query = model.encoder.layers.self_attention.query
    assert query.shape == (NUM_LAYERS, 16, 2, 8)
    assert query.get_metadata()["logical_axes"] == ("layers", "embed", "heads", "kv")
    assert model.decoder.layers.self_attention is model.encoder.layers.self_attention
    assert model.decoder.layers.cross_attention.query.shape[0] == NUM_LAYERS
    with pytest.raises(ValueError, match="already scanned"):
        scan_layers(model)


@pytest.mark.parametrize("arch", ["encoder_decoder", "language_model"])
def test_the_traced_program_holds_each_layer_once(arch):
    def dot_count(scanned):
        model = build_model(tiny_model_config(arch, scanned), nnx.Rngs(0))
        graphdef, state = nnx.split(model)
        jaxpr = jax.make_jaxpr(
            lambda s: loss(nnx.merge(graphdef, s), arch, jax.random.key(0)))(state)
        return str(jaxpr).count("dot_general"), str(jaxpr).count(f"length={NUM_LAYERS}")

    plain_dots, _ = dot_count(False)
    scanned_dots, scans = dot_count(True)
    stacks = len(architectures.get(arch).stacks)
    assert scans == stacks
    # Unscanned, every layer's projections appear once per layer; scanned, once per stack.
    assert scanned_dots < plain_dots
    assert plain_dots - scanned_dots >= (NUM_LAYERS - 1) * 6 * stacks


@pytest.mark.parametrize("arch,method", [("encoder_decoder", "beam"), ("prefix_lm", "greedy")])
def test_scanned_models_decode_the_same_tokens(arch, method):
    def decoded(scanned):
        model = build_model(tiny_model_config(arch, scanned, dropout_rate=0.0,
                                              tie_embeddings=False), nnx.Rngs(1))
        inputs = np.array([[5, 9, 14, 1], [22, 1, 0, 0]], np.int32)
        return decoding.decode(model, inputs, max_length=5, method=method, num_beams=2)

    plain, scanned = decoded(False), decoded(True)
    np.testing.assert_array_equal(scanned.tokens, plain.tokens)
    np.testing.assert_allclose(scanned.scores, plain.scores, rtol=1e-5)


def factored_moments(state):
    """{parameter path: (v_row shape, v_col shape, v shape)} of Adafactor's second moments."""
    moments = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(state.opt_state)[0]:
        key = jax.tree_util.keystr(path)
        for name in ("v_row", "v_col", "v"):
            marker = f".{name}"
            if marker + "[" in key or key.endswith(marker):
                moments.setdefault(key.replace(marker, "", 1), {})[name] = tuple(leaf.shape)
    return moments


def train_steps(config, mesh, steps):
    """(losses, state) after `steps` train steps of `config` from its initial state on `mesh`,
    each on the same 8 rows of random text in a span-corruption layout (inputs 160 /
    targets 32)."""
    layout = objectives.layout_for([config.objective], "encoder_decoder", 160, 32)
    raw = np.random.default_rng(0).integers(3, 128, (8, layout.raw_length), dtype=np.int32)
    spec = objectives.spec_from_config(config.objective)
    state, step, losses = train_state.init_state(config, mesh), train_step.make_train_step(
        config, layout, mesh), []
    for _ in range(steps):
        state, metrics = step(state, raw, spec, jax.random.key(0))
        losses.append(float(metrics["loss"]))
    return losses, state


def test_scanned_training_on_a_sharded_mesh_matches_unscanned_on_one_device():
    # d_model 128, d_ff 256: Adafactor factors a moment only when two dims are >= 128
    # (min_dim_size_to_factor), so at the tiny 32 x 64 nothing was factored and the scanned
    # [layers, d_model, d_ff] kernels' factoring (which must not pick the layers axis) went
    # untested.
    wide = dict(num_layers=NUM_LAYERS, d_model=128, d_ff=256)
    plain_config = tiny_train_config(mesh=(1, 1))
    plain_config.model.update(**wide)
    plain_losses, plain_state = train_steps(
        plain_config, partitioning.make_mesh(plain_config.mesh, jax.devices()[:1]), 3)
    config = tiny_train_config(mesh=(2, 4))
    config.model.update(scan_layers=True, **wide)
    mesh = partitioning.make_mesh(config.mesh)
    losses, state = train_steps(config, mesh, 3)
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-5)

    expected = restacked(params_by_path(plain_state.params))
    actual = params_by_path(state.params)
    assert actual.keys() == expected.keys()
    for path, value in actual.items():
        # Typical elements, not every one: sharded sums over d_model 128 reassociate, and
        # Adafactor's first steps scale each element's update to about a full step whatever
        # its gradient's size, so a gradient near 0, whose sign rounding decides, can move a
        # parameter by up to a step (jax 0.10.2: one of 16384 by 1.8e-2, medians 1e-7 to 2e-5;
        # earlier versions stayed within 1.2e-5 everywhere). A wrong computation (layers
        # restacked out of order, a moment factored over the layers axis) moves typical
        # elements by about a step (learning rate 0.1 x parameters of ~0.1).
        difference = np.abs(np.asarray(value) - np.asarray(expected[path]))
        median, p99 = np.median(difference), np.quantile(difference, 0.99)
        assert median < 5e-5 and p99 < 1e-3, (path, median, p99)

    assert_params_follow_default_rules(state.params, mesh)
    # The factored moments really ran: each scanned MLP kernel [layers, 128, 256] keeps a
    # row and a column factor per layer (factored over d_model x d_ff, never the layers axis)
    # and only a placeholder for the full moment, as each of the one-device run's kernels does.
    def mlp_moments(state):
        return [shapes for path, shapes in factored_moments(state).items()
                if "['mlp']['w" in path]

    assert mlp_moments(plain_state) == [{"v_row": (128,), "v_col": (256,), "v": (1,)}] * (
        4 * NUM_LAYERS)  # wi, wo of each encoder and decoder layer
    assert mlp_moments(state) == [{"v_row": (NUM_LAYERS, 128), "v_col": (NUM_LAYERS, 256),
                                   "v": (NUM_LAYERS, 1)}] * 4
    row_factors = [leaf for path, leaf in jax.tree_util.tree_flatten_with_path(state.opt_state)[0]
                   if "['mlp']['w" in jax.tree_util.keystr(path)
                   and ".v_row" in jax.tree_util.keystr(path)]
    assert len(row_factors) == 4 and all(np.all(np.asarray(v) > 0) for v in row_factors)


def test_scan_layers_must_be_a_bool():
    with pytest.raises(ConfigError, match=r"model.scan_layers=None must be True or False"):
        build_model(tiny_model_config("encoder_decoder", None), nnx.Rngs(0))


def test_a_scanned_decoder_of_another_depth_trains_as_unscanned():
    """The optimiser updates stacked layers one at a time by vmap, which takes one layer-axis
    size: a scanned decoder deeper than its encoder failed inside the init's trace and was
    refused. Its stacks are now one group per depth and train as the unscanned model does;
    with one depth the group keeps the label every scanned checkpoint's state is saved under."""
    def run(scanned):
        config = tiny_train_config(mesh=(1, 1))
        config.model.update(num_layers=2, num_decoder_layers=3, scan_layers=scanned)
        return train_steps(config, partitioning.make_mesh(config.mesh, jax.devices()[:1]), 2)

    plain_losses, plain_state = run(False)
    losses, state = run(True)
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-5)
    expected = restacked(params_by_path(plain_state.params))
    actual = params_by_path(state.params)
    assert actual.keys() == expected.keys()
    assert {value.shape[0] for path, value in actual.items() if path[1] == "layers"} == {2, 3}
    for path, value in actual.items():
        np.testing.assert_allclose(value, expected[path], atol=1e-5, err_msg=str(path))
    assert set(state.opt_state.inner_states) == {"layers_2", "layers_3", "other"}


def test_a_scanned_model_of_one_depth_keeps_its_optimiser_state_s_labels():
    config = tiny_train_config(mesh=(1, 1))
    config.model.update(scan_layers=True)
    state = jax.eval_shape(lambda: train_state.init_state(
        config, partitioning.make_mesh(config.mesh, jax.devices()[:1])))
    assert set(state.opt_state.inner_states) == {"layers", "other"}
