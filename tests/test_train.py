"""The train step: loss math, schedules, bad input, compile-once, sharding and micro-batch
equivalence on 8 simulated CPU devices, and a tiny end-to-end `train()` run.

One tiny encoder-decoder config and ONE batch layout (the whole grid's lengths, compiling span
corruption and the prefix LM) serve every test but the every-objective one, which compiles
every objective's branch, so the 1-device program compiles once for the others.
"""

import contextlib
import dataclasses
import itertools
import json
import math
import mmap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x_lite import objectives, optim, partitioning, programs, train, train_state, train_step
from t5x_lite.config import ConfigError, default_config
from t5x_lite.step_settings import step_settings
from compile_events import cold_program_cache, compilations
from tiny_configs import INPUTS_LENGTH, assert_params_follow_default_rules
from tiny_configs import tiny_train_config as tiny_config

RATES = (0.10, 0.15, 0.25, 0.50)
SPANS = (1.0, 2.0, 3.0, 5.0, 10.0)
def objective(name, rate=0.15, span=3.0):
    cfg = default_config().objective
    cfg.update(
        name=name,
        noise_density=rate,
        mean_noise_span_length=span,
        inputs_length=INPUTS_LENGTH,
        targets_length=None,
    )
    return cfg


GRID = [objective(n, r, s) for n, r, s in itertools.product(objectives.names(), RATES, SPANS)]


class Pieces:
    """The grid's vocabulary as its sentence objectives read it: real token t is a full stop
    when t % 5 == 0, else a word."""
    vocab_size = 160

    @staticmethod
    def pieces():
        return ["<pad>", "</s>", "<unk>"] + ["." if t % 5 == 0 else "\u2581w"
                                             for t in range(3, 160)]


def full_layout(family="encoder_decoder"):
    """The whole GRID's layout: one program with every objective's branch."""
    return objectives.layout_for(GRID, family, 160, 32).with_sentences(Pieces)


def layout(family="encoder_decoder"):
    """GRID's lengths, compiling only the two objectives the other tests run: a program with
    every objective's branch compiles for seconds longer, once per mesh and setting."""
    return dataclasses.replace(full_layout(family), objectives=("span_corruption", "prefix_lm"))


def raw_batch(seed=0, rows=8):
    # Real tokens only: [3, vocab_size - num_sentinels).
    return np.random.default_rng(seed).integers(3, 128, (rows, layout().raw_length), dtype=np.int32)


def run(config, mesh, steps, state=None, spec=None, fam="encoder_decoder"):
    """Metrics (lists per name) of `steps` updates on one repeated batch, and the final state."""
    state = train_state.init_state(config, mesh) if state is None else state
    step = train_step.make_train_step(config, layout(fam), mesh)
    spec = objectives.spec_from_config(objective("span_corruption")) if spec is None else spec
    history = {}
    for _ in range(steps):
        state, metrics = step(state, raw_batch(), spec, jax.random.key(0))
        for name, value in metrics.items():
            history.setdefault(name, []).append(float(value))
    return {k: np.array(v) for k, v in history.items()}, state


def one_device():
    return partitioning.make_mesh(tiny_config().mesh, jax.devices()[:1])


@pytest.fixture(scope="module")
def baseline():
    """Five steps on one device from the 1-device init: (init on host, metrics, final state)."""
    config = tiny_config()
    initial = jax.device_get(train_state.init_state(config, one_device()))
    metrics, state = run(config, one_device(), 5, state=jax.device_put(initial))
    return initial, metrics, jax.device_get(state)


# --- loss -----------------------------------------------------------------------------------


@pytest.mark.parametrize("factor", [None, 1000.0])
def test_a_step_s_loss_is_its_batch_s_per_token_cross_entropy_over_the_normaliser(factor):
    """What a step reports as its loss (metrics.jsonl, the curves, the report): the summed
    cross entropy and z-loss of its batch's weighted target tokens under the parameters before
    the update, over the number of those tokens (`train.loss_normalizing_factor=None`) or over
    the factor; padding carries none. A direct transcription from the model's logits."""
    from flax import nnx

    from t5x_lite.data import pipeline
    from t5x_lite.models import build_model, make_masks

    config, mesh = tiny_config(loss_normalizing_factor=factor), one_device()
    config.train.batch_size = 2
    state = train_state.init_state(config, mesh)
    params = jax.device_get(state.params)
    pairs = [([5, 9, 12, 1], [7, 8, 1]), ([6, 1], [4, 4, 4, 1])]
    batch, = pipeline.pad_examples(pairs, 2, 8, 8, family="encoder_decoder")
    _, metrics = train_step.make_finetune_step(config, mesh)(state, batch, jax.random.key(0))
    model = build_model(config.model, nnx.Rngs(0))
    nnx.update(model, params)
    logits = np.asarray(model(batch, make_masks(batch, "encoder_decoder")), np.float64)
    log_z = np.log(np.exp(logits).sum(-1))
    targets, weights = batch["decoder_target_tokens"], batch["decoder_loss_weights"]
    assert weights.sum() == 7 and weights[0, 3:].sum() == 0  # 3 + 4 targets, then padding
    per_token = log_z - np.take_along_axis(logits, targets[..., None], -1)[..., 0]
    per_token += config.train.z_loss * log_z**2
    expected = (per_token * weights).sum() / (weights.sum() if factor is None else factor)
    assert float(metrics["loss"]) == pytest.approx(expected, rel=1e-5)


def test_cross_entropy_with_z_loss_and_label_smoothing_matches_a_hand_computation():
    logits = np.array(
        [[[2.0, 0.5, -1.0, 0.0], [0.1, 0.2, 3.0, -2.0], [1.0, 1.0, 1.0, 1.0]]], np.float32
    )
    targets = np.array([[0, 1, 3]])
    weights = np.array([[1.0, 2.0, 0.0]], np.float32)
    smoothing, z_coef, vocab = 0.1, 1e-2, 4
    expected_ce = expected_z = expected_correct = 0.0
    for logit, target, weight in zip(logits[0], targets[0], weights[0]):
        log_z = math.log(sum(math.exp(v) for v in logit))
        q = np.full(vocab, smoothing / (vocab - 1))
        q[target] = 1 - smoothing
        # Cross entropy against q minus q's entropy (KL(q || p)): 0 for a perfect model.
        expected_ce += weight * sum(
            q[v] * (math.log(q[v]) - (logit[v] - log_z)) for v in range(vocab)
        )
        expected_z += weight * z_coef * log_z**2
        expected_correct += weight * (int(np.argmax(logit)) == target)
    sums = train_step.cross_entropy_sums(
        jnp.asarray(logits),
        jnp.asarray(targets),
        jnp.asarray(weights),
        z_loss=z_coef,
        label_smoothing=smoothing,
    )
    np.testing.assert_allclose(float(sums["cross_entropy"]), expected_ce, rtol=1e-5)
    np.testing.assert_allclose(float(sums["z_loss"]), expected_z, rtol=1e-5)
    assert float(sums["correct"]) == expected_correct == 1.0  # only the first token is right
    assert float(sums["weight"]) == 3.0


def test_cross_entropy_without_smoothing_is_minus_log_softmax():
    logits = jnp.array([[[0.0, math.log(3.0)]]])  # p = (1/4, 3/4)
    sums = train_step.cross_entropy_sums(
        logits, jnp.array([[1]]), jnp.ones((1, 1)), z_loss=0.0, label_smoothing=0.0
    )
    np.testing.assert_allclose(float(sums["cross_entropy"]), -math.log(0.75), rtol=1e-6)


# --- schedules and optimisers -----------------------------------------------------------------


def schedule(name, lr=1.0, warmup=10, steps=110):
    cfg = tiny_config()
    cfg.train.update(schedule=name, learning_rate=lr, warmup_steps=warmup, steps=steps)
    train = step_settings(cfg).train
    return lambda step: float(optim.learning_rate_schedule(train)(jnp.asarray(step)))


def test_rsqrt_schedule_is_t5s_inverse_square_root_with_constant_warmup():
    lr = schedule("rsqrt", lr=1.0, warmup=10_000, steps=2**19)
    assert lr(0) == pytest.approx(0.01) and lr(5_000) == pytest.approx(0.01)
    assert lr(10_000) == pytest.approx(0.01) and lr(40_000) == pytest.approx(0.005)


def test_adafactor_factors_an_attention_kernel_as_the_matrix_t5_stores():
    """T5 (Mesh TensorFlow) stores query/key/value as [d_model, heads * d_kv] and out as
    [heads * d_kv, d_model]; Adafactor factors their second moments over those rows and
    columns. Ours are [d_model, heads, d_kv] / [heads, d_kv, d_model], which optax would factor
    over d_model and d_kv (64 < 128 at T5-small: not at all). Two steps of ours on T5-small's
    shapes equal two steps of optax's Adafactor, T5's settings, on the matrices."""
    from flax import nnx
    import optax

    d_model, heads, d_kv = 512, 8, 64
    cfg = tiny_config()
    cfg.train.update(optimizer="adafactor", schedule="constant", learning_rate=0.01)
    tx = optim.make_optimizer(step_settings(cfg).train)
    reference = optax.adafactor(learning_rate=0.01, min_dim_size_to_factor=128, decay_rate=0.8,
                                multiply_by_parameter_scale=True, clipping_threshold=1.0,
                                momentum=None, eps=1e-30, factored=True)
    draw = lambda seed, shape: jax.random.normal(jax.random.key(seed), shape)  # noqa: E731
    shapes = {"query": ((d_model, heads, d_kv), ("embed", "heads", "kv"), (d_model, -1)),
              "out": ((heads, d_kv, d_model), ("heads", "kv", "embed"), (-1, d_model))}
    params = nnx.State({name: nnx.Param(draw(i, shape), logical_axes=axes)
                        for i, (name, (shape, axes, _)) in enumerate(shapes.items())})
    as_matrices = {name: params[name][...].reshape(matrix)
                   for name, (_, _, matrix) in shapes.items()}
    state, ref_state = tx.init(params), reference.init(as_matrices)
    # Factored: a row and a column moment, d_model and heads * d_kv long.
    factored = [leaf.shape for leaf in jax.tree.leaves(state) if getattr(leaf, "ndim", 0) == 1
                and leaf.shape[0] == d_model]
    assert len(factored) == 4  # v_row and v_col of each kernel
    for step in range(2):
        grads = jax.tree.map(lambda p, step=step: p.replace(draw(10 + step, p[...].shape)),
                             params, is_leaf=lambda x: isinstance(x, nnx.Variable))
        updates, state = tx.update(grads, state, params)
        ref_updates, ref_state = reference.update(
            {name: grads[name][...].reshape(as_matrices[name].shape) for name in shapes},
            ref_state, as_matrices)
        for name in shapes:
            assert updates[name][...].shape == params[name][...].shape
            np.testing.assert_allclose(np.asarray(updates[name][...]).reshape(
                as_matrices[name].shape), np.asarray(ref_updates[name]), rtol=1e-5, atol=1e-9)


def test_linear_cosine_and_constant_schedules():
    linear, cosine, constant = schedule("linear"), schedule("cosine"), schedule("constant", lr=3e-4)
    assert [linear(s) for s in (0, 5, 10, 60, 110)] == pytest.approx([0.0, 0.5, 1.0, 0.5, 0.0])
    assert [cosine(s) for s in (5, 10, 60, 110)] == pytest.approx([0.5, 1.0, 0.5, 0.0], abs=1e-6)
    assert constant(0) == constant(10**6) == pytest.approx(3e-4)


@pytest.mark.parametrize("kind", ["linear", "cosine"])
def test_warmup_as_long_as_the_run_warms_up_and_never_decays(kind):
    lr = schedule(kind, lr=1.0, warmup=10, steps=10)  # allowed: warmup_steps <= steps
    assert [lr(s) for s in (0, 5, 10)] == pytest.approx([0.0, 0.5, 1.0], abs=1e-6)


@pytest.mark.parametrize(
    "field, value, message",
    [
        (
            "optimizer",
            "sgd",
            "train.optimizer='sgd' is not allowed; choose one of adafactor, adamw",
        ),
        (
            "schedule",
            "step",
            "train.schedule='step' is not allowed; choose one of rsqrt, linear, cosine, constant",
        ),
        ("learning_rate", 0.0, "train.learning_rate=0.0 must be a positive number"),
        ("learning_rate", -1e-3, "train.learning_rate=-0.001 must be a positive number"),
        ("warmup_steps", 0, "train.warmup_steps=0 must be >= 1 for train.schedule='rsqrt'"),
        ("label_smoothing", 1.0, r"train.label_smoothing=1.0 must be in \[0, 1\)"),
        ("loss_normalizing_factor", -2.0, "train.loss_normalizing_factor=-2.0 must be None"),
        ("microbatches", 0, "train.microbatches=0 must be an integer >= 1"),
    ],
)
def test_bad_train_config_is_rejected_naming_the_field(field, value, message):
    config = tiny_config()
    config.train[field] = value
    with pytest.raises(ConfigError, match=message):
        step_settings(config)


def test_bad_batch_split_and_mesh_are_rejected_before_compiling():
    config = tiny_config(mesh=(4, 2), microbatches=4)  # 8 rows over 4 data shards x 4 micro-batches
    with pytest.raises(ConfigError, match=r"train.batch_size=8 must be divisible .* = 16"):
        train_step.make_train_step(config, layout(), partitioning.make_mesh(config.mesh))
    with pytest.raises(ConfigError, match=r"mesh.shape=\(16, 1\) needs 16 devices but only 8"):
        partitioning.make_mesh(tiny_config(mesh=(16, 1)).mesh)


def test_raw_tokens_of_the_wrong_shape_are_rejected():
    config = tiny_config()
    step = train_step.make_train_step(config, layout(), one_device())
    spec = objectives.spec_from_config(objective("span_corruption"))
    with pytest.raises(ValueError, match=r"raw_tokens has shape \(4, \d+\).*\[8, \d+\]"):
        step(None, raw_batch(rows=4), spec, jax.random.key(0))


def test_a_step_too_big_for_its_devices_is_refused_before_it_runs(monkeypatch):
    """On an accelerator, a step whose compiled program needs more memory than a device's
    allocator holds could only end in an out-of-memory error: a one-line ConfigError instead,
    nothing run or kept, and the same refusal again without compiling again (a vmapped sweep's
    next chunk). (A CPU reports no limit, so the devices' limit is set here.)"""
    config, mesh = tiny_config(), one_device()
    spec = objectives.spec_from_config(objective("span_corruption"))
    state = train_state.init_state(config, mesh)
    refusal = (r"^the train step needs \d+\.\d GiB on each device and a device holds 0\.0 GiB: "
               r"set model\.remat=True, lower train\.batch_size, or pre-train fewer grid points "
               r"in one step \(--vmap\)(, or give JAX more of the GPU \(\w+\))?$")
    # A program cache of this test's own: the refused program must not reach the other tests.
    monkeypatch.setattr(train_step, "_PROGRAMS", {})
    monkeypatch.setattr(programs, "device_memory_limit", lambda: 2**20)  # 1 MiB devices
    step = train_step.make_train_step(config, layout(), mesh)
    for _ in range(2):
        with pytest.raises(ConfigError, match=refusal):
            step(state, raw_batch(), spec, jax.random.key(0))
    assert step.program.executables == {} and step.program.compiles == 1
    # Where the program fits (another process, another device), the same step runs.
    monkeypatch.setattr(train_step, "_PROGRAMS", {})
    monkeypatch.setattr(programs, "device_memory_limit", lambda: 2**40)
    step = train_step.make_train_step(config, layout(), mesh)
    _, metrics = step(state, raw_batch(), spec, jax.random.key(0))
    assert np.isfinite(float(metrics["loss"]))


def test_on_a_gpu_the_refusal_also_names_jax_s_share_of_the_device(monkeypatch):
    product = jax.jit(lambda x: x @ x).lower(jnp.ones((256, 256))).compile()
    monkeypatch.setattr(programs, "device_memory_limit", lambda: 2**10)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")  # after compiling: only the check
    with pytest.raises(ConfigError, match=r"\(--vmap\), or give JAX more of the GPU "
                                          r"\(XLA_PYTHON_CLIENT_MEM_FRACTION\)$"):
        programs.require_fits_on_devices(product)


def test_memory_maps_counts_each_new_map_of_the_process(tmp_path):
    before = programs.memory_maps()
    if before is None:
        pytest.skip("no /proc/self/maps: the limit on memory maps is Linux's")
    files = [tmp_path / f"{index}.bin" for index in range(10)]
    for path in files:
        path.write_bytes(b"x" * mmap.PAGESIZE)
    with contextlib.ExitStack() as stack:
        for path in files:  # a file's map is one of its own (anonymous ones may merge)
            handle = stack.enter_context(path.open("rb"))
            stack.enter_context(mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ))
        held, limit = programs.memory_maps()
    assert held >= before[0] + 10 and limit == before[1] > held


def test_a_program_s_memory_counts_its_buffers_once():
    x = jnp.ones((256, 256), jnp.float32)  # 256 KiB
    product = jax.jit(lambda x: x @ x).lower(x).compile()
    assert programs.program_memory_bytes(product) >= 2 * x.nbytes  # argument and output
    # A donated argument's buffer holds the output: counted once.
    in_place = jax.jit(lambda x: x + 1, donate_argnums=0).lower(x).compile()
    assert x.nbytes <= programs.program_memory_bytes(in_place) < 2 * x.nbytes


# --- behaviour on one device ------------------------------------------------------------------


def test_loss_decreases_on_a_repeated_batch(baseline):
    losses = baseline[1]["loss"]
    # The raw batch repeats; its corruption is drawn afresh each step, so the loss is noisy.
    assert np.all(np.isfinite(losses)) and losses[-1] < 0.8 * losses[0], losses


def test_metrics_report_the_step_learning_rate_and_token_counts(baseline):
    metrics = baseline[1]
    # rsqrt with learning_rate 0.1 and one warm-up step: 0.1 / sqrt(max(step, 1)), step = 0, 1, ...
    np.testing.assert_allclose(
        metrics["learning_rate"], [0.1, 0.1, 0.1 / 2**0.5, 0.1 / 3**0.5, 0.05], rtol=1e-6
    )
    # Span corruption at 15% / span 3 uses 34 raw tokens: round(5.1) = 5 noise tokens in
    # round(5 / 3) = 2 spans -> 5 + 2 sentinels + EOS = 8 targets per example, 8 examples.
    assert np.all(metrics["num_tokens"] == 8 * 8)
    assert (
        np.all((metrics["accuracy"] >= 0) & (metrics["accuracy"] <= 1))
        and metrics["accuracy"][-1] > 0
    )
    assert np.all(metrics["grad_norm"] > 0) and np.all(metrics["z_loss"] > 0)
    assert np.all(metrics["z_loss"] < metrics["loss"])
    assert baseline[2].step == 5


def test_every_objective_rate_and_span_shares_one_compilation():
    config = tiny_config()
    step = train_step.make_train_step(config, full_layout(), one_device())
    state = train_state.init_state(config, one_device())
    # Rate and span are traced values, each objective is a branch of one switch: every
    # objective once (at rates and spans taken in turn) and span corruption at every rate and
    # span cover each branch and each traced value without running all of GRID's points.
    points = [objective(name, RATES[i % len(RATES)], SPANS[i % len(SPANS)])
              for i, name in enumerate(objectives.names())]
    points += [objective("span_corruption", r, s) for r, s in itertools.product(RATES, SPANS)]
    specs = [objectives.spec_from_config(point) for point in points]
    state, _ = step(state, raw_batch(), specs[0], jax.random.key(0))
    # Counted from here, not from zero: an earlier test in the process may have compiled this
    # program already (the first spec then compiles nothing either).
    before = step.compiles
    assert before >= 1  # the first spec's executable exists
    with compilations() as compiled:
        for spec in specs[1:]:
            state, metrics = step(state, raw_batch(), spec, jax.random.key(0))
            assert np.isfinite(float(metrics["loss"]))
    assert step.compiles == before
    assert compiled == []  # no backend compile of anything
    assert full_layout().objectives == objectives.names()  # the program holds every branch


def test_language_model_and_prefix_lm_share_one_compilation_but_not_their_masks():
    lm, prefix = tiny_config("language_model"), tiny_config("prefix_lm")
    mesh = one_device()
    fam = "decoder_only"
    initial = jax.device_get(train_state.init_state(lm, mesh))
    spec = objectives.spec_from_config(objective("prefix_lm"))
    program = train_step.make_train_step(lm, layout(fam), mesh).program
    assert train_step.make_train_step(prefix, layout(fam), mesh).program is program
    before = program.compiles  # an earlier test may have compiled it: count the increase
    lm_metrics, _ = run(lm, mesh, 1, state=jax.device_put(initial), spec=spec, fam=fam)
    compiles = program.compiles
    assert compiles - before <= 1 and compiles >= 1
    prefix_metrics, _ = run(prefix, mesh, 1, state=jax.device_put(initial), spec=spec, fam=fam)
    assert program.compiles == compiles  # the prefix LM ran the language model's executable
    # Same parameters, same batch: only the prefix's bidirectional attention differs.
    assert lm_metrics["loss"][0] != prefix_metrics["loss"][0]


def test_the_shared_program_runs_a_language_model_as_the_language_model_runs():
    """Through prefix_lm's program (its flag off), a language model's loss is its own
    network's under its own masks and causal position buckets (`make_masks(batch,
    'language_model')`), not the prefix LM's with the prefix switched off."""
    from flax import nnx

    from t5x_lite.data import pipeline
    from t5x_lite.models import build_model, make_masks

    lm, mesh = tiny_config("language_model"), one_device()
    params = train_state.init_state(lm, mesh).params
    pairs = [([5, 9, 12, 1], [7, 8, 1]), ([6, 1], [4, 4, 4, 1])]
    batch, = pipeline.pad_examples(pairs, 2, 8, 8, family="decoder_only")
    sums = train_step.make_eval_step(lm, mesh)(params, batch)
    model = build_model(lm.model, nnx.Rngs(0))
    nnx.update(model, jax.device_get(params))
    logits = model(batch, make_masks(batch, "language_model"))
    direct = train_step.cross_entropy_sums(logits, batch["decoder_target_tokens"],
                                           batch["decoder_loss_weights"],
                                           z_loss=lm.train.z_loss, label_smoothing=0.0)
    assert sums["cross_entropy"] == pytest.approx(float(direct["cross_entropy"]), rel=1e-5)
    as_prefix_lm = model(batch, make_masks(batch, "prefix_lm", jnp.bool_(False)))
    assert np.allclose(as_prefix_lm, logits, atol=1e-5)  # the flag switches the buckets too


def test_two_microbatches_equal_one(baseline):
    initial, metrics, final = baseline
    mesh = one_device()
    micro, state = run(tiny_config(microbatches=2), mesh, 5, state=jax.device_put(initial))
    for name in ("loss", "accuracy", "num_tokens", "grad_norm"):
        np.testing.assert_allclose(micro[name], metrics[name], rtol=1e-5, err_msg=name)
    for a, b in zip(jax.tree.leaves(jax.device_get(state.params)), jax.tree.leaves(final.params)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


# --- sharding ---------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(8, 1), (4, 2), (2, 4)])
def test_sharded_training_matches_one_device(baseline, shape):
    initial, metrics, _ = baseline
    config = tiny_config(mesh=shape)
    mesh = partitioning.make_mesh(config.mesh)
    if shape == (2, 4):  # initialised directly sharded: same values as the 1-device init
        state = train_state.init_state(config, mesh)
        for a, b in zip(jax.tree.leaves(jax.device_get(state)), jax.tree.leaves(initial)):
            np.testing.assert_array_equal(a, b)
    else:
        shardings = jax.tree.map(lambda s: s.sharding, train_state.abstract_state(config, mesh))
        state = jax.device_put(initial, shardings)
    sharded, state = run(config, mesh, 5, state=state)
    np.testing.assert_allclose(sharded["loss"], metrics["loss"], rtol=1e-5)

    assert_params_follow_default_rules(state.params, mesh)
    assert state.params["token_embedder"]["embedding"].get_value().sharding.shard_shape(
        (160, 32)
    ) == (160 // shape[1], 32)


# --- the loop ---------------------------------------------------------------------------------

RECORD_FIELDS = {
    "step",
    "loss",
    "z_loss",
    "objective_overflow",
    "accuracy",
    "num_tokens",
    "learning_rate",
    "grad_norm",
    "step_s",
    "tokens_per_s",
    "tflops_per_s",
    "mfu",
    "compile_s",
    "compiles",
}


def test_train_writes_metrics_checkpoints_and_resumes(tmp_path, capsys, monkeypatch):
    rng = np.random.default_rng(0)
    letters = list("abcdefghijklmnopqrstuvwxyz")
    words = ["".join(rng.choice(letters, rng.integers(2, 8))) for _ in range(800)]
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "docs.txt").write_text(
        "\n\n".join(" ".join(rng.choice(words, 40)) for _ in range(200))
    )
    config = tiny_config()
    config.model.update(vocab_size=300, num_sentinels=20)
    config.data.update(corpus=str(corpus / "*.txt"), data_dir=str(tmp_path / "data"))
    config.train.update(log_every=2)
    config.checkpoint.update(every=2, keep=2)
    workdir = tmp_path / "run"
    with pytest.raises(ConfigError, match="resume requested but .* holds no checkpoint"):
        train.train(config, workdir, steps=4, resume=True)

    # A cold program cache, so that the first run compiles the step whatever ran before in the
    # process, and the resumed one shows that it reuses what the first run compiled.
    with cold_program_cache():
        summary = train.train(config, workdir, steps=4, progress=True)
        records = [json.loads(line) for line in (workdir / "metrics.jsonl").open()]
        assert [r["step"] for r in records] == [1, 2, 3, 4]
        assert all(set(r) == RECORD_FIELDS for r in records)
        assert records[0]["compiles"] == 1 and records[0]["compile_s"] > 0
        assert all(r["compile_s"] == 0 and r["compiles"] == 1 for r in records[1:])
        assert all(r["tokens_per_s"] > 0 and r["tflops_per_s"] > 0 and 0 < r["mfu"]
                   for r in records)
        assert summary["step"] == 4 and summary["loss"] == records[-1]["loss"]
        assert summary["compiles"] == 1
        saved = sorted(p.name for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
        assert saved == ["2", "4"]
        logged = capsys.readouterr().err
        assert "step 2/4 loss" in logged and "step 4/4 loss" in logged and "eta" in logged
        assert "reads the corpus" not in logged  # 32 rows of its chunks: less than one pass
        # The wait for the first step's compile is announced, and its length told after.
        assert logged.count("the first step waits for its program") == 1
        assert f"step 1: the step program was ready in {records[0]['compile_s']:.1f} s" in logged

        # Resume: continues at step 5 from the checkpoint; the executable is reused.
        summary = train.train(config, workdir, steps=6, progress=False)
        records = [json.loads(line) for line in (workdir / "metrics.jsonl").open()]
        assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
        assert summary["start_step"] == 4 and summary["step"] == 6 and summary["compiles"] == 0

        # Again at its end: nothing trains, and the summary gives the loss step 6 logged.
        capsys.readouterr()
        again = train.train(config, workdir, steps=6, progress=True)
        assert "nothing to train: the newest checkpoint is at step 6" in capsys.readouterr().err
        assert (again["start_step"], again["step"], again["compiles"]) == (6, 6, 0)
        assert (again["loss"], again["accuracy"]) == (records[-1]["loss"],
                                                      records[-1]["accuracy"])
        assert again["step_s"] is None
        assert len((workdir / "metrics.jsonl").read_text().splitlines()) == 6

        # A run that starts with the process near the kernel's limit on memory maps lets go of
        # the kept programs (`train_step.release_programs_near_map_limit`), says so, and makes
        # its step again instead of reusing the kept one (compiles 0 above).
        monkeypatch.setattr(train_step, "memory_maps", lambda: (40_000, 65_530))
        summary = train.train(config, workdir, steps=8, progress=False)
        assert ("released the compiled programs this process kept (40,000 of the 65,530 "
                "memory maps") in capsys.readouterr().err
        assert summary["step"] == 8 and summary["compiles"] == 1

    other = tiny_config()
    other.update_from_flattened_dict({"model.vocab_size": 320, "data.corpus": config.data.corpus})
    with pytest.raises(ConfigError, match="model.vocab_size"):
        train.train(other, workdir, steps=8)


@pytest.mark.parametrize("schedule, steps, refusal", [
    ("cosine", 101, r"^steps=101 is past train.steps=100, where train.schedule='cosine' has "
                    r"brought the learning rate to 0; to train longer, raise train.steps "
                    r"\(--config.train.steps=101; "),
    ("linear", 0, r"^steps=0 must be an integer >= 1"),
    ("rsqrt", -4, r"^steps=-4 must be an integer >= 1"),
])
def test_steps_a_run_cannot_train_are_refused_before_anything_is_written(
        schedule, steps, refusal, tmp_path):
    """Past train.steps a decaying schedule trained at learning rate 0 without a word; 0 or
    fewer steps wrote a step-0 checkpoint and returned."""
    config = tiny_config()
    config.train.schedule = schedule
    with pytest.raises(ConfigError, match=refusal):
        train.train(config, tmp_path / "run", steps=steps)
    assert not (tmp_path / "run").exists()


def test_dropping_attention_weights_on_a_kernel_that_forms_none_is_refused_before_any_work(
        tmp_path):
    config = tiny_config()
    config.model.update(dropout_rate=0.1, attention_impl="xla")
    with pytest.raises(ConfigError, match=r"^model.attention_impl='xla' never forms the attention "
                                          r"weights, so it cannot drop them"):
        train.train(config, tmp_path / "run", steps=1)
    assert not (tmp_path / "run").exists()


def test_bfloat16_compute_keeps_float32_parameters_and_tracks_the_float32_loss(baseline):
    initial, metrics, _ = baseline
    config = tiny_config()
    config.model.dtype = "bfloat16"
    bf16, state = run(config, one_device(), 2, state=jax.device_put(initial))
    assert {leaf.dtype for leaf in jax.tree.leaves(state.params)} == {jnp.dtype("float32")}
    np.testing.assert_allclose(bf16["loss"], metrics["loss"][:2], rtol=2e-2)
