"""Parameter and FLOP counts against hand-derived numbers and the real model; MFU and peaks."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from t5x_lite import accounting
from t5x_lite import architectures
from t5x_lite.config import ConfigError, model_config

ARCHS = architectures.names()

# A config small enough to count by hand: D=4, F=8, H=2, K=3 (H*K=6), V=10, 5 buckets, 2 layers.
D, F, H, K, V, BUCKETS = 4, 8, 2, 3, 10, 5


def small_cfg(arch: str = "encoder_decoder", **overrides):
    cfg = model_config()
    cfg.update(arch=arch, vocab_size=V, num_sentinels=0, d_model=D, d_ff=F, num_heads=H, d_kv=K,
               num_layers=2, relpos_buckets=BUCKETS)
    cfg.update(overrides)
    return cfg


V1_1 = dict(mlp="gated-gelu", tie_embeddings=False)

# ---- parameters, by hand from the tree in the model brief ----
EMBEDDING = V * D  # 40
NORM = D  # 4, one scale per norm
ATTENTION = 4 * D * H * K  # query, key, value [4, 2, 3] and out [2, 3, 4]: 96
RELU_MLP = 2 * D * F  # wi, wo: 64
STACK = BUCKETS * H + NORM  # relative position embedding + final norm: 14
SELF_LAYER = NORM + ATTENTION + NORM + RELU_MLP  # 168
CROSS = NORM + ATTENTION  # 100

HAND_PARAMS = {
    "encoder_decoder": EMBEDDING + 2 * STACK + 2 * SELF_LAYER + 2 * (SELF_LAYER + CROSS),  # 940
    # decoder layers reuse the encoder's self-attention, MLP and their norms: only cross is new
    "encoder_decoder_shared": EMBEDDING + 2 * STACK + 2 * SELF_LAYER + 2 * CROSS,  # 604
    "encoder_decoder_half": EMBEDDING + 2 * STACK + SELF_LAYER + (SELF_LAYER + CROSS),  # 504
    "language_model": EMBEDDING + STACK + 2 * SELF_LAYER,  # 390
    "prefix_lm": EMBEDDING + STACK + 2 * SELF_LAYER,
    # one bidirectional stack, the (tied) LM head on it: a decoder-only model's tree
    "encoder_only": EMBEDDING + STACK + 2 * SELF_LAYER,
}


@pytest.mark.parametrize("arch", ARCHS)
def test_param_count_matches_hand_count(arch):
    assert accounting.param_count(small_cfg(arch)) == HAND_PARAMS[arch]


def test_param_count_v1_1_adds_lm_head_and_gate():
    # untied: an lm_head [D, V]; gated-GELU: one more [D, F] matrix per MLP (4 MLPs here)
    expected = HAND_PARAMS["encoder_decoder"] + D * V + 4 * D * F
    assert accounting.param_count(small_cfg(**V1_1)) == expected


@pytest.mark.parametrize("size, published", [
    (dict(d_model=512, d_ff=2048, num_heads=8, num_layers=6), 60_506_624),  # t5-small
    (dict(d_model=768, d_ff=3072, num_heads=12, num_layers=12), 222_903_552),  # t5-base
])
def test_param_count_matches_released_t5_sizes(size, published):
    # The released T5 v1.0 checkpoints (vocabulary 32128, tied); the numbers are what
    # transformers' T5ForConditionalGeneration.num_parameters() reports for t5-small / t5-base.
    cfg = model_config()
    cfg.update(vocab_size=32128, d_kv=64, **size)
    assert accounting.param_count(cfg) == published


@pytest.mark.parametrize("flavour", [{}, V1_1], ids=["v1.0", "v1.1"])
@pytest.mark.parametrize("arch", ARCHS)
def test_param_count_matches_built_model(arch, flavour):
    from t5x_lite.models import build_model

    cfg = small_cfg(arch, **flavour)
    model = nnx.eval_shape(lambda: build_model(cfg, nnx.Rngs(0)))
    leaves = jax.tree.leaves(nnx.state(model, nnx.Param))  # shared parameters appear once
    assert accounting.param_count(cfg) == sum(math.prod(np.shape(leaf)) for leaf in leaves)


# ---- FLOPs, by hand: 2 per multiply-add, inputs 5 tokens, targets 3 tokens ----
INPUTS, TARGETS = 5, 3
# encoder layer over 5 tokens: q, k, v, o projections 4 * (2*5*4*6) = 960; scores q.k^T 2*5*5*6 =
# 300; weighted values 300; MLP wi and wo 2 * (2*5*4*8) = 640
ENCODER_LAYER = 960 + 300 + 300 + 640
# decoder layer over 3 tokens: self projections 4 * (2*3*4*6) = 576, scores 2*3*3*6 = 108, values
# 108; cross q, o 2 * (2*3*4*6) = 288, cross k, v over the 5 encoder tokens 2 * (2*5*4*6) = 480,
# cross scores 2*3*5*6 = 180, values 180; MLP 2 * (2*3*4*8) = 384
DECODER_LAYER = 576 + 108 + 108 + 288 + 480 + 180 + 180 + 384
LOGITS = 2 * TARGETS * D * V  # 240
# decoder-only over 5 + 3 = 8 tokens: projections 4 * (2*8*4*6) = 1536, scores 2*8*8*6 = 768,
# values 768, MLP 2 * (2*8*4*8) = 1024; logits over all 8 positions 2*8*4*10 = 640
DECODER_ONLY_LAYER = 1536 + 768 + 768 + 1024
DECODER_ONLY_LOGITS = 2 * 8 * D * V

HAND_TRAIN_FLOPS = {  # forward x 3
    "encoder_decoder": 3 * (2 * ENCODER_LAYER + 2 * DECODER_LAYER + LOGITS),  # 27744
    "encoder_decoder_shared": 3 * (2 * ENCODER_LAYER + 2 * DECODER_LAYER + LOGITS),
    "encoder_decoder_half": 3 * (ENCODER_LAYER + DECODER_LAYER + LOGITS),
    "language_model": 3 * (2 * DECODER_ONLY_LAYER + DECODER_ONLY_LOGITS),  # 26496
    "prefix_lm": 3 * (2 * DECODER_ONLY_LAYER + DECODER_ONLY_LOGITS),
    # a task example: the 5 inputs and 3 mask slots through one encoder stack, logits at all 8
    "encoder_only": 3 * (2 * DECODER_ONLY_LAYER + DECODER_ONLY_LOGITS),
}


@pytest.mark.parametrize("arch", ARCHS)
def test_train_flops_match_hand_count(arch):
    flops = accounting.train_flops_per_example(small_cfg(arch), INPUTS, TARGETS)
    assert flops == HAND_TRAIN_FLOPS[arch]


def test_encoder_only_pretraining_counts_only_its_inputs():
    """Pre-training predicts in place (targets_length 0): 5 tokens through 2 encoder layers,
    logits at the 5 positions 2*5*4*10 = 400."""
    flops = accounting.train_flops_per_example(small_cfg("encoder_only"), INPUTS, 0)
    assert flops == 3 * (2 * ENCODER_LAYER + 2 * INPUTS * D * V)  # 14400
    with pytest.raises(ValueError, match="targets_length=0 must be an integer >= 1"):
        accounting.train_flops_per_example(small_cfg("encoder_decoder"), INPUTS, 0)


def test_train_flops_v1_1_adds_only_the_gate_matmul():
    # the untied lm_head costs what the tied embedding matmul costs; the gate adds one [D, F]
    # matmul per token per layer: 2 layers * (5 + 3 tokens) * 2*4*8
    expected = HAND_TRAIN_FLOPS["encoder_decoder"] + 3 * 2 * (INPUTS + TARGETS) * 2 * D * F
    assert accounting.train_flops_per_example(small_cfg(**V1_1), INPUTS, TARGETS) == expected


@pytest.mark.parametrize("arch, flavour", [pytest.param(arch, {}, id=arch) for arch in ARCHS]
                         + [pytest.param("encoder_decoder", V1_1, id="encoder_decoder-v1.1")])
def test_forward_flops_match_xla_count_of_the_model(arch, flavour):
    # XLA counts every op of the lowered forward pass, we count only the matmuls: XLA's count
    # is higher by the elementwise work (softmax, norms, activations, residual adds), about 1-2%
    # at these sizes, and never lower. A matmul term we missed or invented would break the band.
    from t5x_lite.models import build_model

    cfg = small_cfg(arch, d_model=128, d_ff=512, num_heads=4, d_kv=32, vocab_size=256, **flavour)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: build_model(cfg, nnx.Rngs(0))))
    inputs, targets = 32, 16
    if architectures.get(arch).family == "encoder_decoder":
        batch = {"encoder_input_tokens": jax.ShapeDtypeStruct((1, inputs), jnp.int32),
                 "decoder_input_tokens": jax.ShapeDtypeStruct((1, targets), jnp.int32)}
    elif architectures.get(arch).family == "encoder_only":
        batch = {"encoder_input_tokens": jax.ShapeDtypeStruct((1, inputs + targets), jnp.int32)}
    else:
        batch = {"decoder_input_tokens": jax.ShapeDtypeStruct((1, inputs + targets), jnp.int32),
                 "inputs_mask": jax.ShapeDtypeStruct((1, inputs + targets), jnp.bool_)}
    forward = jax.jit(lambda state, batch: nnx.merge(graphdef, state)(batch))
    xla_flops = forward.lower(state, batch).cost_analysis()["flops"]
    ours = accounting.train_flops_per_example(cfg, inputs, targets) / 3
    assert ours <= xla_flops <= 1.03 * ours


# ---- the paper's Table 2 columns for the base config, inputs and targets of equal length ----
# The labels round each ratio to the nearest power of two in log space, so a ratio within a
# factor sqrt(2) (0.71x to 1.41x) of the paper's label gets it. Why the base config's ratios sit
# inside those bands: a layer holds 4*768^2 attention + 2*768*3072 MLP weights (about 7.1M), a
# decoder layer's cross-attention adds 2.4M, the embedding 24.6M is counted once. So P is about
# 12*7.1 + 24.6 = 110M; enc-dec 12*(7.1 + 9.4) + 24.6 = 223M (2.0P); shared 12*(7.1 + 2.4) + 24.6
# = 138M (1.3P); half 6*(7.1 + 9.4) + 24.6 = 124M (1.1P). Cost: per layer and token the matmuls
# are the same in both stacks of an enc-dec and in the decoder-only model, cross-attention's
# extra about balances the shorter attention span, so enc-dec is about M; the logits do not
# shrink with depth and keep the half model a little above M/2.
PAPER_COLUMNS = {
    "encoder_decoder": ("2P", "M"),
    "encoder_decoder_shared": ("P", "M"),
    "encoder_decoder_half": ("P", "M/2"),
    "language_model": ("P", "M"),
    "prefix_lm": ("P", "M"),
    # Not a Table 2 row: one L-layer stack over the inputs alone (its targets sit there).
    "encoder_only": ("P", "M/2"),
}


def base_cfg(arch: str):
    cfg = model_config()  # T5 base: d_model 768, d_ff 3072, 12 heads, 12 layers per stack
    cfg.arch = arch
    return cfg


@pytest.mark.parametrize("arch", ARCHS)
def test_table2_columns_reproduce_the_paper(arch):
    cfg = base_cfg(arch)
    columns = accounting.table2_columns(cfg, 512, 512)
    assert (columns.params_label, columns.cost_label) == PAPER_COLUMNS[arch]
    assert columns.params == accounting.param_count(cfg)


def test_table2_sharing_changes_params_not_cost():
    full, shared = (accounting.table2_columns(base_cfg(arch), 512, 512)
                    for arch in ("encoder_decoder", "encoder_decoder_shared"))
    assert shared.train_flops == full.train_flops
    assert shared.params < full.params


# ---- bad input ----
def test_counts_reject_bad_config_before_counting():
    with pytest.raises(ConfigError, match="model.arch='t6'.*encoder_decoder"):
        accounting.param_count(small_cfg("t6"))
    with pytest.raises(ConfigError, match="model.num_layers"):
        accounting.train_flops_per_example(small_cfg("encoder_decoder_half", num_layers=3), 4, 4)


@pytest.mark.parametrize("lengths, field", [((0, 3), "inputs_length"), ((5, -1), "targets_length"),
                                            ((5.0, 3), "inputs_length")])
def test_train_flops_reject_bad_lengths(lengths, field):
    with pytest.raises(ValueError, match=f"{field}=.*integer >= 1"):
        accounting.train_flops_per_example(small_cfg(), *lengths)


def test_decoder_only_lm_objective_has_no_inputs_part():
    """The LM objective gives decoder-only models inputs_length 0: the whole sequence is targets."""
    for arch in ("language_model", "prefix_lm"):
        cfg = small_cfg(arch)
        assert accounting.train_flops_per_example(cfg, 0, 9) == accounting.train_flops_per_example(cfg, 4, 5)
    with pytest.raises(ValueError, match="inputs_length=0 must be an integer >= 1"):
        accounting.train_flops_per_example(small_cfg("encoder_decoder"), 0, 9)


# ---- peaks and MFU ----
@pytest.mark.parametrize("kind, dtype, expected", [
    ("TPU v5 lite", "bfloat16", 197e12),  # v5e, not v5p
    ("TPU v5", "bfloat16", 459e12),  # v5p reports itself as "TPU v5"
    ("TPU v3", "float32", 61.5e12),  # one of the chip's two cores
    ("NVIDIA A100-SXM4-80GB", "float32", 156e12),  # TF32 at JAX's default precision
    ("NVIDIA H100 PCIe", "bfloat16", 756.5e12),  # the datasheet's 1,513 TFLOPS with sparsity, halved
    ("NVIDIA H100 80GB HBM3", "bfloat16", 989.5e12),
    ("NVIDIA H200", np.dtype("float32"), 494.5e12),
])
def test_peak_flops_table(kind, dtype, expected):
    assert accounting.peak_flops(kind, dtype) == expected


@pytest.mark.parametrize("kind", ["TPU v4 lite", "NVIDIA GeForce GTX 1080"])
def test_unknown_accelerator_warns_and_mfu_is_none(kind):
    with pytest.warns(UserWarning, match=f"device kind '{kind}'.*MFU is reported as None"):
        peak = accounting.peak_flops(kind, "bfloat16")
    assert peak is None
    assert accounting.mfu(1e12, peak) is None


def test_cpu_device_points_to_the_measured_peak():
    with pytest.warns(UserWarning, match="measure_cpu_matmul_peak"):
        assert accounting.peak_flops(jax.devices("cpu")[0], "float32") is None


@pytest.mark.parametrize("dtype", ["float16", np.float16, "bf16"])
def test_peak_flops_rejects_unknown_dtype(dtype):
    with pytest.raises(ValueError, match="dtype='(float16|bf16)'.*float32, bfloat16"):
        accounting.peak_flops("TPU v4", dtype)


def test_mfu():
    assert accounting.mfu(5e12, 2e13) == 0.25
    assert accounting.mfu(5e12, None) is None  # a device whose peak is not known
    with pytest.raises(ValueError, match=r"^peak_flops_per_second=0.0 must be positive$"):
        accounting.mfu(1.0, 0.0)
    with pytest.raises(ValueError, match=r"^flops_per_second=-1.0 must be >= 0$"):
        accounting.mfu(-1.0, 1e12)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_measure_cpu_matmul_peak_is_plausible(dtype):
    peak = accounting.measure_cpu_matmul_peak(dtype, seconds=0.05, size=128)
    # a few cores manage at least MFLOP/s and no CPU reaches 100 TFLOP/s
    assert 1e6 < peak < 1e14


@pytest.mark.parametrize("kwargs, field", [(dict(seconds=0), "seconds"), (dict(size=0), "size")])
def test_measure_cpu_matmul_peak_rejects_bad_arguments(kwargs, field):
    with pytest.raises(ValueError, match=field):
        accounting.measure_cpu_matmul_peak(**kwargs)
