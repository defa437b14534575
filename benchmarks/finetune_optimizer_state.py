"""Fine-tuning from a fresh optimiser state against the pre-training's carried on, paired.

`finetune.optimizer_state='continue'` is how T5's code fine-tunes (the pre-trained
checkpoint's Adafactor moments and step count carry on); 'fresh' is a new state. This script
pre-trains one model per seed, fine-tunes it on each task both ways with the same seed (the
same batches: a paired comparison), and prints, per task and validation step, the validation
loss (teacher-forced, per target token) and the task's metrics: each side's mean, sample
standard deviation and values over the seeds, and the paired difference (continue - fresh).
Both sides run in this one process, on the same machine, from the same checkpoints.

    python benchmarks/finetune_optimizer_state.py --workdir runs/ft_state

The default set-up is the `cpu` preset's model, data and validation examples on SST-2 and
STS-B, with the paper's optimiser on both sides: Adafactor, pre-training at
lr 1.0 / sqrt(max(step, 10^4)) (a constant 0.01 in its 700 steps) and fine-tuning at a
constant 1e-3 for 200 steps, validated every 50. `--config.F=V` overrides apply to every run.
Finished runs are kept in WORKDIR/results.jsonl and not run again, so an interrupted
measurement resumes.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import time
from pathlib import Path

import ml_collections

from t5x_lite import finetune, presets, train
from t5x_lite.config import ConfigError, apply_overrides, parse_overrides

MODES = ("fresh", "continue")
# The paper's optimiser for both stages (section 3.1.2 and 3.1.4 of arXiv 1910.10683).
PAPER_OPTIMISER = ("train.optimizer=adafactor", "train.schedule=rsqrt",
                   "train.learning_rate=1.0", "train.warmup_steps=10000",
                   "finetune.optimizer=adafactor", "finetune.schedule=constant",
                   "finetune.learning_rate=0.001", "finetune.warmup_steps=0",
                   "finetune.eval_every=50")
TASKS = ("local_glue_sst2", "local_glue_stsb")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--preset", default="cpu", choices=sorted(presets.PRESETS))
    parser.add_argument("--seeds", default="0,1,2", type=lambda text: [
        int(seed) for seed in text.split(",")], help="comma-separated (default 0,1,2)")
    parser.add_argument("--tasks", default=",".join(TASKS),
                        help=f"comma-separated (default {','.join(TASKS)})")
    args, overrides = parser.parse_known_args(argv)
    config = presets.finetune_preset(args.preset)
    try:
        apply_overrides(config, parse_overrides(config, [*PAPER_OPTIMISER, *overrides]))
        table = measure(config, Path(args.workdir), args.seeds, args.tasks.split(","))
    except ConfigError as error:  # a bad setting: one line naming it, no traceback
        sys.exit(f"finetune_optimizer_state: {error}")
    print(json.dumps(table, indent=2))


def measure(config: ml_collections.ConfigDict, workdir: Path, seeds: list[int],
            task_names: list[str]) -> dict:
    """Pre-train `config` once per seed, fine-tune on each task both ways, append each run's
    record to WORKDIR/results.jsonl (runs on file are not run again) and return `summarise`
    of them all."""
    workdir.mkdir(parents=True, exist_ok=True)
    results_file = workdir / "results.jsonl"
    done = {(r["seed"], r["task"], r["mode"]): r for r in map(
        json.loads, results_file.read_text().splitlines() if results_file.exists() else [])}
    for seed in seeds:
        seeded = copy.deepcopy(config)
        seeded.train.seed = seed
        source = workdir / f"seed_{seed}" / "pretrain"
        if any((seed, task, mode) not in done for task in task_names for mode in MODES):
            print(f"seed {seed}: pre-training in {source}", file=sys.stderr, flush=True)
            train.train(seeded, source, progress=False)  # resumes; a finished run is kept
        for task in task_names:
            for mode in MODES:
                if (seed, task, mode) in done:
                    continue
                run = copy.deepcopy(seeded)
                run.finetune.update(tasks=(task,), optimizer_state=mode)
                print(f"seed {seed}: fine-tuning {task}, {mode}", file=sys.stderr, flush=True)
                started = time.perf_counter()
                run_dir = workdir / f"seed_{seed}" / f"{task}_{mode}"
                summary = finetune.finetune(run, run_dir, init_from=str(source),
                                            progress=False)
                validations = [json.loads(line) for line in
                               (run_dir / "eval.jsonl").read_text().splitlines()]
                record = {"seed": seed, "task": task, "mode": mode,
                          "validation": {str(v["step"]): {"loss": v["loss"], **v["metrics"]}
                                         for v in validations},
                          "train_loss": summary["loss"],
                          "wall_s": round(time.perf_counter() - started, 1)}
                with results_file.open("a") as out:
                    out.write(json.dumps(record) + "\n")
                done[(seed, task, mode)] = record
    return summarise(done, seeds, task_names)


def summarise(done: dict, seeds: list[int], task_names: list[str]) -> dict:
    """{task: {validation step: {"loss" or a metric: {mode: [mean, sd, values],
    "continue - fresh": [mean, sd, values]}}}} over `seeds` (sd None for one value, the
    values None where undefined); the differences are paired by seed."""
    def stats(values: list[float]) -> list:
        # A metric may be undefined (NaN: STS-B's correlation of constant predictions); the
        # mean and spread are those of the defined values, which are all listed.
        defined = [v for v in values if not math.isnan(v)]
        mean = round(statistics.fmean(defined), 4) if defined else None
        spread = round(statistics.stdev(defined), 4) if len(defined) > 1 else None
        return [mean, spread, [round(v, 4) if not math.isnan(v) else None for v in values]]

    table = {}
    for task in task_names:
        table[task] = {}
        for step, measures in done[(seeds[0], task, MODES[0])]["validation"].items():
            table[task][step] = {}
            for measure in measures:
                by_mode = {mode: [done[(seed, task, mode)]["validation"][step][measure]
                                  for seed in seeds] for mode in MODES}
                row = {mode: stats(values) for mode, values in by_mode.items()}
                row["continue - fresh"] = stats(
                    [c - f for c, f in zip(by_mode["continue"], by_mode["fresh"])])
                table[task][step][measure] = row
    return table


if __name__ == "__main__":
    main(sys.argv[1:])
