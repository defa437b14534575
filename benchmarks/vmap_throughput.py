"""Pre-training throughput of K grid points vmapped in one step vs the same K stepped one by one.

    python benchmarks/vmap_throughput.py [--experiment table6] [--preset demo] [--steps 20]
        [--points K] [--override field=value ...]

Takes the experiment's largest chunk of points that can share a vmapped step
(`sweep.vmap_chunks`, e.g. Table 6's four corruption rates; with `sweep.seeds=(0, 1)` its
eight runs, each rate's seeds next to each other), or its first K points with `--points K`,
builds both the shared single-point step and the vmapped step of the chunk, and times, in
turns, one update of every point each way on random real-token batches (the step's cost does
not depend on the token values; the input pipeline is left out). Prints one JSON object: K,
the medians per update of all K points, the throughput in tokens/s (K x batch x (inputs +
targets) tokens per update of all points), the memory XLA gives each program, and each
point's loss in the first update both ways (from the same states, batch and keys, so they
agree to the dtype's rounding: the vmapped step computes what the single-point one does).

The vmapped step holds K points' activations at once: on this project's CPU, XLA's buffer
assignment gives Table 6's small-preset step (bf16, scanned layers, batch 128 x 512 / 514)
84 GiB at K = 1 and 335 GiB at K = 4, 20 and 76 GiB with `model.remat=True` (2026-12-04; the
50% row's targets are 441 since it reads T5's 511 raw tokens, 2026-12-05), so
on one 141 GB device the small preset's K = 4 needs remat.
"""
from __future__ import annotations

import argparse
import json
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from t5x_lite import bench, grid, objectives, partitioning, sweep, train_state, train_step


def vmap_benchmark(experiment: str = "table6", preset: str = "demo", steps: int = 20,
                   warmup: int = 2, points: int | None = None,
                   overrides: tuple[str, ...] = ()) -> dict[str, Any]:
    """Seconds per update of the chunk's K points (all of it, or its first `points`),
    sequential and vmapped, and tokens/s. `overrides`: 'field=value' strings, as a sweep's."""
    chunk = max(sweep.vmap_chunks(grid.expand(experiment, preset, overrides), size=1 << 30),
                key=len)
    if points is not None:
        if not 1 <= points <= len(chunk):
            raise ValueError(f"points={points} must be in [1, {len(chunk)}]: {experiment} at "
                             f"{preset} has {len(chunk)} points that share one vmapped step")
        chunk = chunk[:points]
    configs, layout = [p.config for p in chunk], chunk[0].layout
    mesh = partitioning.make_mesh(configs[0].mesh)
    raw = bench.random_raw_tokens(configs[0], layout.raw_length)
    specs = [objectives.spec_from_config(c.objective) for c in configs]
    keys = [train_state.step_key(c.train.seed) for c in configs]

    step = train_step.make_train_step(configs[0], layout, mesh)
    start = time.perf_counter()
    states = [jax.block_until_ready(train_state.init_state(c, mesh)) for c in configs]
    bench.report_phase(f"{len(configs)} initial states built", time.perf_counter() - start)

    def sequential() -> list[Any]:
        metrics = []
        for k in range(len(configs)):
            states[k], point_metrics = step(states[k], raw, specs[k], keys[k])
            metrics.append(point_metrics)
        return metrics

    vmapped_step = train_step.make_vmapped_train_step(configs, layout, mesh)
    stacked = [train_state.stack_states([train_state.init_state(c, mesh) for c in configs],
                                       configs[0], mesh)]
    stacked_raw, stacked_specs = np.stack([raw] * len(configs)), train_step.stack_specs(specs)
    stacked_keys = jnp.stack(keys)

    def vmapped() -> Any:
        stacked[0], metrics = vmapped_step(stacked[0], stacked_raw, stacked_specs, stacked_keys)
        return metrics

    first = []  # each way's metrics of the first update, from the same states, batch and keys
    for name, run in (("the single-point step", sequential), ("the vmapped step", vmapped)):
        start = time.perf_counter()
        first.append(jax.device_get(jax.block_until_ready(run())))
        bench.report_phase(f"{name} compiled and run once for all {len(configs)} points",
                           time.perf_counter() - start)
    sequential_first, vmapped_first = first
    sequential_losses = np.array([m["loss"] for m in sequential_first])
    vmapped_losses = np.asarray(vmapped_first["loss"])
    sequential_s, vmapped_s = bench.median_seconds(sequential, vmapped, steps=steps,
                                                   warmup=warmup)
    memory = {"sequential": bench.program_memory_gib(step),
              "vmapped": bench.program_memory_gib(vmapped_step)}
    tokens = len(configs) * configs[0].train.batch_size * (layout.inputs_length
                                                           + layout.targets_length)
    return {
        "experiment": experiment, "preset": preset, "points": [p.point for p in chunk],
        "K": len(configs), "devices": f"{mesh.devices.size} x {mesh.devices.flat[0].device_kind}",
        "sequential_s_per_update": sequential_s, "vmapped_s_per_update": vmapped_s,
        "sequential_tokens_per_s": tokens / sequential_s,
        "vmapped_tokens_per_s": tokens / vmapped_s, "speedup": sequential_s / vmapped_s,
        "compile_s": {"sequential": step.program.compile_seconds,
                      "vmapped": vmapped_step.program.compile_seconds},
        "memory_gib": memory,
        "first_update_losses": {"sequential": sequential_losses.tolist(),
                                "vmapped": vmapped_losses.tolist()},
        "first_update_loss_difference": float(np.max(np.abs(sequential_losses
                                                            - vmapped_losses))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", default="table6")
    parser.add_argument("--preset", default="demo")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--points", type=int, default=None,
                        help="K: time the chunk's first K points (default: all of it)")
    parser.add_argument("--override", action="append", default=[],
                        help="a 'field=value' sweep override, e.g. sweep.seeds='(0, 1)'")
    args = parser.parse_args()
    print(json.dumps(vmap_benchmark(args.experiment, args.preset, args.steps,
                                    points=args.points, overrides=tuple(args.override)),
                     indent=2))


if __name__ == "__main__":
    main()
