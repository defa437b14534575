"""Each pre-training objective's on-device corruption, as a share of the train step it runs in.

    python benchmarks/objective_costs.py [--preset tiny] [--steps 10] [--objectives a,b,...]

For every pre-training objective (`objective_registry.names()`), builds the preset's train step
with that objective (its layout compiles only that objective's branch,
`objectives.BatchLayout.objectives`), on the preset's architecture where that trains the
objective and else on the first one that does (GLM's `blank_infilling`: `prefix_lm`), and the
objective's corruption jitted alone, and times the two in turns (`bench.median_seconds`).
Prints one JSON object: per objective the architecture, the step and corruption medians (ms),
the corruption's share of the step (issue #17's bound: < 5 %), and the step's compile time.
The objectives' own settings are the preset's (density, span length); `objective.targets_length`
is None, so each objective's targets are as long as it needs (the preset's padding fits span
corruption's targets only).
"""
from __future__ import annotations

import argparse
import json
import sys

from t5x_lite import architectures, bench, objective_registry, presets
from t5x_lite.config import parse_overrides, apply_overrides


def objective_costs(preset: str = "tiny", steps: int = 10, warmup: int = 2,
                    names: tuple[str, ...] | None = None,
                    overrides: tuple[str, ...] = ()) -> dict[str, dict[str, float]]:
    """{objective: {"arch", "step_ms", "corruption_ms", "corruption_share_of_step",
    "compile_s"}}, for the objectives `names` (default: every registered one)."""
    results = {}
    for name in names or objective_registry.names():
        config = presets.get_preset(preset)
        apply_overrides(config, parse_overrides(config, overrides))
        trains_it = architectures.names(objective=name)
        arch = config.model.arch if config.model.arch in trains_it else trains_it[0]
        apply_overrides(config, parse_overrides(config, [
            f"model.arch={arch}", f"objective.name={name}", "objective.targets_length=None"]))
        step, info = bench.jax_train_step(config)
        step_s, corrupt_s = bench.median_seconds(step, bench.corruption_only(config),
                                                 steps=steps, warmup=warmup)
        results[name] = {"arch": arch, "step_ms": step_s * 1e3, "corruption_ms": corrupt_s * 1e3,
                         "corruption_share_of_step": corrupt_s / step_s,
                         "compile_s": info["compile_s"]}
        print(f"{name} ({arch}): step {step_s * 1e3:.0f} ms, corruption {corrupt_s * 1e3:.2f} ms "
              f"({100 * corrupt_s / step_s:.2f} %)", file=sys.stderr, flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--steps", type=int, default=10)
    registered = objective_registry.names()
    parser.add_argument("--objectives", default=",".join(registered),
                        help="comma-separated objective names (default: all)")
    parser.add_argument("--override", action="append", default=[],
                        help="a 'field=value' config override, e.g. train.batch_size=8")
    args = parser.parse_args()
    names = tuple(args.objectives.split(","))
    unknown = [name for name in names if name not in registered]
    if unknown:
        parser.error(f"--objectives: unknown {', '.join(unknown)}; choose from "
                     f"{', '.join(registered)}")
    print(json.dumps({"preset": args.preset, "objectives": objective_costs(
        args.preset, args.steps, names=names, overrides=tuple(args.override))}, indent=1))


if __name__ == "__main__":
    main()
