"""Parameter and FLOP accounting for the registered architectures, and model FLOPs utilisation.

Everything that counts is plain Python arithmetic on a model config and sequence lengths: no
model is built and nothing is timed, so the ratios behind the paper's Params (P / 2P) and Cost
(M / M/2) columns are measured rather than typed, and the train loop can turn step times into MFU.

What `train_flops_per_example` counts (2 FLOPs per multiply-add; training = 3 x forward, since
the backward pass does two matmuls the size of each forward one):
- attention: the q, k, v and output projections, the scores q.k^T and the weighted sum of
  values; cross-attention projects q and o over the decoder length, k and v over the encoder's;
- the MLP (two weight matrices, three for gated-GELU);
- the logits at every position of the last stack (the decoder; `encoder_only`'s encoder),
  tied or untied, the same matmul.
Masks do not reduce the count: dense attention kernels compute every (query, key) pair and mask
afterwards, so causal attention is counted at full length. As usual for MFU these are model
FLOPs: recomputation under rematerialisation is not counted, and neither is the work that is
not a matmul (embedding lookups, norms, softmax, relative-position buckets, dropout, residual
adds, the loss), which is O(length x d_model) or O(length^2 x heads) and about 1-2% of the
total at d_model 128 (the tests check this against XLA's own count), less at larger sizes.

The paper's columns (Raffel et al. 2020, section 3.2.2 and Table 2): P is the parameter count
of one L-layer stack and M the cost of processing an input-target pair with the L + L
encoder-decoder, which is about what the L-layer decoder-only model pays for the same
inputs + targets tokens as one sequence. We use that decoder-only `language_model` with the
same settings as the reference for both, so P and M are counted rather than chosen.
The labels themselves (`Architecture.params_label` / `cost_label`) are properties of an
architecture's structure: at small sizes the embedding and the logits, which do not grow with
depth, dominate both counts and pull the measured ratios away from them (the full
encoder-decoder of the `demo` preset costs about 0.65 M), so the ratios are reported beside
the labels, not rounded into them.
"""
from __future__ import annotations

import dataclasses
import re
import time
import warnings
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections

from t5x_lite import architectures, batch_format
from t5x_lite.settings import Model, model_settings

# The yardstick of the paper's P and M (see the module docstring).
_REFERENCE_ARCH = "language_model"


def _num_mlp_matrices(model_cfg: Model) -> int:
    """wi and wo for ReLU; wi_0, wi_1 and wo for gated-GELU."""
    return 3 if model_cfg.mlp == "gated-gelu" else 2


def param_count(model: Model | ml_collections.ConfigDict) -> int:
    """Exact number of parameters in the tree `models.build_model(model)` creates (the model
    settings, or a `config.model` section, read and validated first).

    Parameters shared between stacks (`encoder_decoder_shared`) are counted once.
    """
    model_cfg = model_settings(model)
    d_model, inner = model_cfg.d_model, model_cfg.num_heads * model_cfg.d_kv
    attention = 4 * d_model * inner  # query, key, value [embed, heads, kv]; out [heads, kv, embed]
    mlp = _num_mlp_matrices(model_cfg) * d_model * model_cfg.d_ff
    total = model_cfg.num_embeddings * d_model  # token embedding
    if not model_cfg.tie_embeddings:
        total += d_model * model_cfg.num_embeddings  # lm_head
    for stack in architectures.get(model_cfg.arch).stacks:
        total += model_cfg.relpos_buckets * model_cfg.num_heads + d_model  # relpos, final norm
        shared = stack.shares_layers_of is not None
        per_layer = 0 if shared else (d_model + attention) + (d_model + mlp)
        if stack.cross_attention:
            per_layer += d_model + attention
        total += stack.num_layers(model_cfg) * per_layer
    return total


def _require_length(field: str, value: Any, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{field}={value!r} must be an integer >= {minimum} (tokens per example)")


def _attention_flops(d_model: int, inner: int, q_len: int, kv_len: int) -> int:
    """Forward FLOPs of one attention block: projections, scores q.k^T and the weighted values."""
    projections = 2 * d_model * inner * (2 * q_len + 2 * kv_len)  # q, o per query; k, v per key
    scores_and_values = 2 * 2 * q_len * kv_len * inner
    return projections + scores_and_values


def train_flops_per_example(
    model: Model | ml_collections.ConfigDict, inputs_length: int, targets_length: int
) -> float:
    """Training FLOPs (forward + backward = 3 x forward matmul FLOPs) for one example.

    Each stack runs its part of the batch format's row (`batch_format.row_lengths`): for
    encoder-decoder archs `inputs_length` tokens through the encoder and `targets_length`
    through the decoder; for decoder-only and encoder-only archs `inputs_length +
    targets_length` tokens as one sequence (encoder_only pre-training layouts have
    targets_length 0: the targets sit at the inputs' positions). See the module docstring for
    which terms are counted.
    """
    model_cfg = model_settings(model)
    architecture = architectures.get(model_cfg.arch)
    # A decoder-only model trained with the LM objective has no inputs part.
    _require_length("inputs_length", inputs_length,
                    minimum=batch_format.min_inputs_length(architecture.family))
    # A family that predicts in place pre-trains without target positions of its own.
    _require_length("targets_length", targets_length,
                    minimum=0 if batch_format.in_place(architecture.family) else 1)
    d_model, inner = model_cfg.d_model, model_cfg.num_heads * model_cfg.d_kv
    mlp_per_token = 2 * _num_mlp_matrices(model_cfg) * d_model * model_cfg.d_ff
    lengths = batch_format.row_lengths(architecture.family, inputs_length, targets_length)
    forward = 0
    for stack in architecture.stacks:
        length = lengths[stack.role]
        per_layer = _attention_flops(d_model, inner, length, length) + mlp_per_token * length
        if stack.cross_attention:
            per_layer += _attention_flops(d_model, inner, length, lengths["encoder"])
        forward += stack.num_layers(model_cfg) * per_layer
    # The logits, on the last stack's output (the decoder's; encoder_only's one encoder).
    forward += 2 * d_model * model_cfg.num_embeddings * lengths[architecture.stacks[-1].role]
    return 3.0 * forward


@dataclasses.dataclass(frozen=True)
class Table2Columns:
    """An architecture's Params and Cost columns of the paper's Table 2.

    The labels are the paper's, from the architecture's record; the ratios are measured,
    relative to the decoder-only `language_model` with the same settings (P: its parameters,
    M: its training FLOPs for the inputs + targets sequence).
    """
    params: int
    train_flops: float
    params_ratio: float
    flops_ratio: float
    params_label: str  # "P" or "2P"
    cost_label: str  # "M" or "M/2"


def table2_columns(
    model: Model | ml_collections.ConfigDict, inputs_length: int, targets_length: int
) -> Table2Columns:
    """The Params (P / 2P) and Cost (M / M/2) labels of `model.arch`, with the measured
    parameter and training-FLOP ratios behind them."""
    model_cfg = model_settings(model)
    # One L-layer stack, whatever depth this model's decoder has.
    reference = dataclasses.replace(model_cfg, arch=_REFERENCE_ARCH, num_decoder_layers=None)
    params = param_count(model_cfg)
    architecture = architectures.get(model_cfg.arch)
    # A family that predicts in place reads no target sequence: its targets are the inputs'
    # own positions (its pre-training layouts have targets_length 0).
    own_targets = 0 if batch_format.in_place(architecture.family) else targets_length
    flops = train_flops_per_example(model_cfg, inputs_length, own_targets)
    return Table2Columns(
        params=params,
        train_flops=flops,
        params_ratio=params / param_count(reference),
        flops_ratio=flops / train_flops_per_example(reference, inputs_length, targets_length),
        params_label=architecture.params_label,
        cost_label=architecture.cost_label,
    )


class _Peak(NamedTuple):
    """Dense peak FLOP/s of one JAX device; `float32` at JAX's default matmul precision."""
    device_kind: str  # regular expression, full match on the lower-cased `Device.device_kind`
    bfloat16: float
    float32: float


# Vendor spec sheets, dense (no structured sparsity), per JAX device; first match wins, so the
# more specific pattern comes first. JAX's default precision runs float32 matmuls as one bfloat16
# pass on TPU and as TF32 on Ampere and later NVIDIA GPUs, so those are the float32 peaks.
# TPU v2 and v3 expose each of a chip's two TensorCores as a device, hence half the chip's peak.
PEAKS = (
    _Peak(r"tpu v2", 22.5e12, 22.5e12),  # cloud.google.com/tpu/docs/v2: 45 TFLOPS per chip
    _Peak(r"tpu v3", 61.5e12, 61.5e12),  # cloud.google.com/tpu/docs/v3: 123 TFLOPS per chip
    _Peak(r"tpu v4", 275e12, 275e12),  # cloud.google.com/tpu/docs/v4
    _Peak(r"tpu v5( lite|e)", 197e12, 197e12),  # cloud.google.com/tpu/docs/v5e
    _Peak(r"tpu v5p?", 459e12, 459e12),  # cloud.google.com/tpu/docs/v5p
    _Peak(r"tpu v6( lite|e)", 918e12, 918e12),  # cloud.google.com/tpu/docs/v6e (Trillium)
    _Peak(r"nvidia a100.*", 312e12, 156e12),  # NVIDIA A100 datasheet: BF16 312, TF32 156
    _Peak(r"nvidia h100.*pcie.*", 756.5e12, 378e12),  # NVIDIA H100 datasheet, PCIe column
    _Peak(r"nvidia h[12]00.*nvl.*", 835.5e12, 417.5e12),  # H100 / H200 datasheets, NVL column
    _Peak(r"nvidia g?h[12]00.*", 989.5e12, 494.5e12),  # H100 SXM, H200 SXM, GH200 datasheets
    _Peak(r"nvidia l4", 121e12, 60e12),  # NVIDIA L4 datasheet (242 / 120 with sparsity)
    _Peak(r"nvidia l40s", 362e12, 183e12),  # NVIDIA L40S datasheet
)
_PEAK_DTYPES = ("float32", "bfloat16")


def peak_flops(device: jax.Device | str, dtype: Any) -> float | None:
    """The vendor's dense peak FLOP/s for one device (or its `device_kind`) computing in `dtype`.

    Returns None, with a warning saying why, for a device not in `PEAKS`: MFU is then reported
    as None. CPUs have no entry; measure them with `measure_cpu_matmul_peak`.
    """
    dtype_name = dtype if isinstance(dtype, str) else jnp.dtype(dtype).name
    if dtype_name not in _PEAK_DTYPES:
        raise ValueError(f"dtype={dtype_name!r} has no peak entry; choose one of "
                         f"{', '.join(_PEAK_DTYPES)}")
    kind = device if isinstance(device, str) else device.device_kind
    for peak in PEAKS:
        if re.fullmatch(peak.device_kind, kind.strip().lower()):
            return getattr(peak, dtype_name)
    warnings.warn(
        f"No peak FLOP/s known for device kind {kind!r}, so MFU is reported as None. Known "
        f"kinds (regular expressions): {', '.join(p.device_kind for p in PEAKS)}. For a CPU, "
        "pass the peak from t5x_lite.accounting.measure_cpu_matmul_peak() instead.",
        stacklevel=2,
    )
    return None


def mfu(flops_per_second: float, peak_flops_per_second: float | None) -> float | None:
    """Model FLOPs utilisation: achieved model FLOP/s over the peak; None if the peak is unknown."""
    if peak_flops_per_second is None:
        return None
    if peak_flops_per_second <= 0:
        raise ValueError(f"peak_flops_per_second={peak_flops_per_second} must be positive")
    if flops_per_second < 0:
        raise ValueError(f"flops_per_second={flops_per_second} must be >= 0")
    return flops_per_second / peak_flops_per_second


def cpu_matmul(dtype: Any = jnp.float32, size: int = 1024) -> tuple[Callable[[], jax.Array], float]:
    """The yardstick of MFU on a CPU: a closure running one compiled, warmed-up
    `[size, size] @ [size, size]` matmul on the first CPU device, and its FLOPs.

    CPUs have no spec-sheet entry in `PEAKS`, and their throughput depends on the cores and
    vector units actually available, so their peak is measured on the same machine, in the
    same run. The default size makes 4 MiB operands, larger than the caches like a model's
    weight matrices, and short runs (tens of ms on two cores).
    """
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise ValueError(f"size={size!r} must be a positive integer")
    x = jax.device_put(jnp.ones((size, size), dtype), jax.devices("cpu")[0])
    matmul = jax.jit(jnp.matmul)
    matmul(x, x).block_until_ready()  # compile and warm up outside any timed run
    return lambda: matmul(x, x), 2.0 * size**3


def measure_cpu_matmul_peak(dtype: Any = jnp.float32, seconds: float = 1.0,
                            size: int = 1024) -> float:
    """FLOP/s of the best of repeated `cpu_matmul`s: repeats for about `seconds` (at least 3
    timed runs) and keeps the fastest, the one least disturbed by other processes."""
    if seconds <= 0:
        raise ValueError(f"seconds={seconds} must be positive")
    matmul, flops = cpu_matmul(dtype, size)
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(times) < 3 or time.perf_counter() < deadline:
        start = time.perf_counter()
        matmul().block_until_ready()
        times.append(time.perf_counter() - start)
    return flops / min(times)
