"""Where a CPU train step gains or loses against PyTorch: the forward, the forward + backward
and the whole step of t5x_lite and of transformers' T5, then the step's matmul shapes alone.

    python benchmarks/cpu_step_breakdown.py [--preset tiny] [--steps 8]

Part 1 times, in turns, t5x_lite's loss (forward), its gradient (forward + backward) and its
train step (corruption included), and the same three of the PyTorch T5 of the same size and
batch (`bench.torch_t5`). Part 2 times each matmul shape the step runs (projections, MLP,
their weight gradients, logits, attention scores and values) in JAX and in PyTorch, one
library at a time: a library's threads keep spinning for a moment after a call and would slow
the other's next call, which for a millisecond-long matmul is most of it. Prints one JSON
object: milliseconds and the PyTorch / t5x_lite time ratio of each (above 1: t5x_lite faster),
and GFLOP/s for the matmuls.
"""
from __future__ import annotations

import argparse
import json
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from t5x_lite import bench, host_memory, objectives, partitioning, presets, train_state, train_step


def _median_ms(fns: dict[str, Callable[[], Any]], steps: int, warmup: int = 2) -> dict[str, float]:
    """Median milliseconds of each of `fns`, timed in turns (`bench.median_seconds`)."""
    return {name: s * 1e3 for name, s in
            zip(fns, bench.median_seconds(*fns.values(), steps=steps, warmup=warmup))}


def phases(config: ml_collections.ConfigDict, steps: int) -> dict[str, dict[str, float]]:
    """Forward, forward + backward and train step of both implementations, in milliseconds."""
    import torch

    layout = objectives.layout_from_config(config)
    spec = objectives.spec_from_config(config.objective)
    raw = jnp.asarray(bench.random_raw_tokens(config, layout.raw_length))
    batch = jax.jit(lambda r, k: objectives.corrupt(r, spec, k, layout))(raw, jax.random.key(0))
    params = train_state.init_state(config, partitioning.make_mesh(config.mesh)).params
    loss_sums = train_step.loss_sums_fn(config)

    def loss(p: Any, b: dict) -> jax.Array:
        sums = loss_sums(p, b, None)
        return (sums["cross_entropy"] + sums["z_loss"]) / sums["weight"]

    forward, gradient = jax.jit(loss), jax.jit(jax.grad(loss))
    step, _ = bench.jax_train_step(config)
    model, optimizer, inputs, labels = bench.torch_t5(config)

    def torch_forward() -> None:
        with torch.no_grad():
            model(input_ids=inputs, labels=labels)

    def torch_gradient() -> None:
        model.zero_grad(set_to_none=True)
        model(input_ids=inputs, labels=labels).loss.backward()

    def torch_step() -> None:
        torch_gradient()
        optimizer.step()

    ms = _median_ms({
        "jax forward": lambda: forward(params, batch), "torch forward": torch_forward,
        "jax forward+backward": lambda: gradient(params, batch),
        "torch forward+backward": torch_gradient,
        "jax step": step, "torch step": torch_step,
    }, steps)
    return {phase: {"t5x_lite_ms": ms[f"jax {phase}"], "torch_ms": ms[f"torch {phase}"],
                    "torch_over_t5x_lite": ms[f"torch {phase}"] / ms[f"jax {phase}"]}
            for phase in ("forward", "forward+backward", "step")}


def matmul_shapes(config: ml_collections.ConfigDict) -> dict[str, tuple[str, tuple, tuple]]:
    """name -> (einsum, lhs shape, rhs shape) of the matmuls in the encoder-decoder step."""
    m, layout = config.model, objectives.layout_from_config(config)
    batch, length = config.train.batch_size, layout.inputs_length
    tokens, targets = batch * length, batch * layout.targets_length
    inner, heads = m.num_heads * m.d_kv, batch * m.num_heads
    return {
        "q/k/v/o projection": ("ti,io->to", (tokens, m.d_model), (m.d_model, inner)),
        "MLP in": ("ti,io->to", (tokens, m.d_model), (m.d_model, m.d_ff)),
        "MLP out": ("ti,io->to", (tokens, m.d_ff), (m.d_ff, m.d_model)),
        "projection weight gradient": ("ti,to->io", (tokens, m.d_model), (tokens, inner)),
        "MLP-in weight gradient": ("ti,to->io", (tokens, m.d_model), (tokens, m.d_ff)),
        "logits": ("td,vd->tv", (targets, m.d_model), (m.vocab_size, m.d_model)),
        "logits input gradient": ("tv,vd->td", (targets, m.vocab_size), (m.vocab_size, m.d_model)),
        "attention scores": ("bqk,bsk->bqs", (heads, length, m.d_kv), (heads, length, m.d_kv)),
        "attention values": ("bqs,bsk->bqk", (heads, length, length), (heads, length, m.d_kv)),
    }


def matmuls(config: ml_collections.ConfigDict, steps: int) -> dict[str, dict[str, float]]:
    """Milliseconds and GFLOP/s of each shape in JAX (jitted) and PyTorch, float32."""
    import torch

    out = {}
    for name, (equation, lhs_shape, rhs_shape) in matmul_shapes(config).items():
        rng = np.random.default_rng(0)
        lhs, rhs = (rng.standard_normal(s, dtype=np.float32) for s in (lhs_shape, rhs_shape))
        lhs_indices, rhs_indices = equation.split("->")[0].split(",")
        sizes = {**dict(zip(lhs_indices, lhs_shape)), **dict(zip(rhs_indices, rhs_shape))}
        flops = 2 * np.prod(list(sizes.values()))  # a multiply-add per combination of indices
        jax_lhs, jax_rhs = jnp.asarray(lhs), jnp.asarray(rhs)
        jitted = jax.jit(lambda a, b, equation=equation: jnp.einsum(equation, a, b))
        torch_lhs, torch_rhs = torch.from_numpy(lhs), torch.from_numpy(rhs)
        jax_ms = _median_ms({"jax": lambda: jitted(jax_lhs, jax_rhs)}, steps)["jax"]
        torch_ms = _median_ms({"torch": lambda: torch.einsum(equation, torch_lhs, torch_rhs)},
                              steps)["torch"]
        out[name] = {"lhs": list(lhs_shape), "rhs": list(rhs_shape), "t5x_lite_ms": jax_ms,
                     "torch_ms": torch_ms, "t5x_lite_gflops": flops / jax_ms / 1e6,
                     "torch_gflops": flops / torch_ms / 1e6,
                     "torch_over_t5x_lite": torch_ms / jax_ms}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny", choices=presets.PRESETS)
    parser.add_argument("--steps", type=int, default=8, help="timed calls of each (medians)")
    args = parser.parse_args()
    host_memory.retain_if_requested()  # as the CLI does, before JAX starts
    config = presets.get_config(args.preset)
    print(json.dumps({"phases": phases(config, args.steps),
                      "matmuls": matmuls(config, 4 * args.steps),
                      "host_memory_retained": host_memory.retained,
                      "config": config.to_dict()}, indent=1))


if __name__ == "__main__":
    main()
