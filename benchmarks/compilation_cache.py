"""What the commands' persistent compilation cache (`t5x_lite.compilation_cache`) saves: a
researcher's sequence of commands, each its own process, timed without the cache, with an
empty one (filling it) and with the one the previous sequence filled.

    python benchmarks/compilation_cache.py [--preset tiny] [--repeats 2]

The sequence, at `--preset`, each in fresh workdirs: pre-train 10 steps; the same with one
setting changed (10 % of the tokens corrupted instead of 15 %: the same program); resume
the first to step 20; fine-tune it 10 steps on builtin_reverse; score that with `eval`. The
three ways run in turns, `--repeats` times, so a drift of the machine's speed hits them
alike. Prints one JSON object: each command's median seconds per way, their sum, and the
ratio of each way's sum to the uncached one's.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from t5x_lite import compilation_cache

WAYS = ("off", "empty", "filled")


def sequence(preset: str, root: Path) -> dict[str, list[str]]:
    """name -> t5x-lite arguments, in the order they run."""
    first, other, tuned = root / "first", root / "other", root / "tuned"
    return {
        "train": ["train", "--preset", preset, "--workdir", str(first), "--steps", "10"],
        "train, other rate": ["train", "--preset", preset, "--workdir", str(other),
                              "--steps", "10", "--config.objective.noise_density=0.1"],
        "resume": ["train", "--preset", preset, "--workdir", str(first), "--steps", "20"],
        "finetune": ["finetune", "--preset", preset, "--init_from", str(first), "--workdir",
                     str(tuned), "--tasks", "builtin_reverse", "--config.finetune.steps=10"],
        "eval": ["eval", "--preset", preset, "--checkpoint", str(tuned), "--tasks",
                 "builtin_reverse"],
    }


def timed_sequence(preset: str, environment: dict[str, str]) -> dict[str, float]:
    """Seconds of each command of `sequence`, run in a new temporary folder."""
    seconds = {}
    with tempfile.TemporaryDirectory() as root:
        for name, arguments in sequence(preset, Path(root)).items():
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "t5x_lite.cli", *arguments],
                                  env=environment, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"t5x-lite {' '.join(arguments)} failed:\n{done.stderr[-3000:]}")
            seconds[name] = time.perf_counter() - start
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    base = {name: value for name, value in os.environ.items()
            if not name.startswith(compilation_cache.JAX_VARIABLE_PREFIXES)}
    times: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
    for _ in range(args.repeats):
        cache = tempfile.mkdtemp(prefix="t5x_lite_cache_bench_")
        try:
            environments = {
                "off": {**base, "JAX_ENABLE_COMPILATION_CACHE": "false"},
                # The commands' own default, in a folder of this benchmark's.
                "empty": {**base, "XDG_CACHE_HOME": cache},
                "filled": {**base, "XDG_CACHE_HOME": cache},
            }
            for way in WAYS:
                times[way].append(timed_sequence(args.preset, environments[way]))
        finally:
            shutil.rmtree(cache)
    medians = {way: {name: statistics.median(run[name] for run in runs)
                     for name in runs[0]} for way, runs in times.items()}
    totals = {way: sum(seconds.values()) for way, seconds in medians.items()}
    print(json.dumps({
        "preset": args.preset, "repeats": args.repeats,
        "seconds": {way: {name: round(s, 1) for name, s in seconds.items()}
                    for way, seconds in medians.items()},
        "total_s": {way: round(total, 1) for way, total in totals.items()},
        "total_over_uncached": {way: round(total / totals["off"], 2)
                                for way, total in totals.items()},
    }, indent=2))


if __name__ == "__main__":
    main()
