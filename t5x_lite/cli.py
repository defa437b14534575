"""`t5x-lite COMMAND [flags]`: the command line. Parses flags and calls the library; no logic.

Commands:
  train     pre-train one config:      t5x-lite train --preset tiny --workdir runs/tiny
  finetune  fine-tune a pre-trained run on downstream tasks:
            t5x-lite finetune --preset tiny --init_from runs/tiny --workdir runs/tiny_ft \\
                --tasks builtin_reverse
  eval      score a checkpoint on tasks: t5x-lite eval --preset tiny --checkpoint runs/tiny_ft \\
                --tasks builtin_reverse,builtin_module
  sweep     run a paper table's grid:   t5x-lite sweep table2 --preset tiny --workdir runs/table2
                [--config.train.steps=100] [--launcher local|parallel|ray] [--workers N]
                [--address HOST:PORT] [--accelerator cpu|gpu|tpu] [--point_index I] [--vmap K]
  report    a sweep's table and plots: t5x-lite report runs/table2 [--out DIR]
  launch    commands for a TPU pod or a SLURM cluster (see launch/README.md):
            t5x-lite launch tpu|slurm [flags] -- table2 --preset paper --workdir DIR
  bench     speed of the train step:   t5x-lite bench --preset tiny --json [--compare_torch]
                [--decode]
  demo      Table 2 with a small model on the built-in corpus and tasks, then its report
  preview   what an objective makes of real text, as the train step corrupts it:
            t5x-lite preview table6 --point rate_50 [--preset demo] [--seed S] [--examples N]
                [--json]
            t5x-lite preview --preset tiny --config.objective.name=bert_style  (a plain config)

train / finetune / eval / bench read one config: an ml_collections file
(`--config=configs/tiny.py`) or a preset (`--preset tiny`, short for the packaged preset file);
any field can be overridden with `--config.train.steps=100`, `--config.model.arch=prefix_lm`, ...
In `sweep`, `--preset` names the experiment's preset (tiny, small, paper, demo) and
`--config.F=V` overrides apply to every grid point.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Callable

import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags

from t5x_lite import host_memory, presets
from t5x_lite.config import ConfigError

_PRESETS_FILE = os.path.abspath(presets.__file__)

FLAGS = flags.FLAGS
# No default file: config_flags defines the `--config.*` override flags when it loads a file,
# and a default loaded at start-up would collide with the one named on the command line.
config_flags.DEFINE_config_file(
    "config", None, "ml_collections config file (path.py or path.py:ARG); default: the tiny preset.",
    lock_config=True,
)
flags.DEFINE_string("preset", None, f"Preset name ({', '.join(presets.PRESETS)}); replaces --config.")
flags.DEFINE_string("workdir", None, "Directory for metrics.jsonl, checkpoints and TensorBoard events.")
flags.DEFINE_integer("steps", None, "Train up to this many steps (default: config.train.steps).")
flags.DEFINE_bool("restart", False, "Discard the checkpoints in --workdir and start from step 0.")
flags.DEFINE_string("init_from", None, "finetune: the pre-training workdir whose parameters start the run.")
flags.DEFINE_string("checkpoint", None, "eval: a train or finetune workdir (or its checkpoints/).")
flags.DEFINE_list("tasks", None, "finetune / eval: task names, comma-separated (default: "
                  "config.finetune.tasks).")
flags.DEFINE_string("split", "validation", "eval: the split to score.")
flags.DEFINE_bool("json", False, "bench: print one JSON object instead of a table.")
flags.DEFINE_bool("compare_torch", False, "bench: also time the PyTorch (transformers) T5 step.")
flags.DEFINE_bool("pipeline", False, "bench: also time the input pipeline on the configured corpus.")
flags.DEFINE_bool("decode", False, "bench: time cached greedy decoding against re-computation.")
flags.DEFINE_integer("bench_steps", 10, "bench: timed steps (the median is reported).")


def _expand_preset(argv: list[str]) -> list[str]:
    """`--preset NAME` -> `--config=<packaged presets.py>:NAME`, so overrides still apply."""
    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--preset" and i + 1 < len(argv):
            name, i = argv[i + 1], i + 2
        elif arg.startswith("--preset="):
            name, i = arg.split("=", 1)[1], i + 1
        else:
            out.append(arg)
            i += 1
            continue
        if name not in presets.PRESETS:
            raise SystemExit(f"--preset={name!r} does not exist; choose one of {', '.join(presets.PRESETS)}")
        out.append(f"--config={_PRESETS_FILE}:{name}")
    return out


def _config() -> ml_collections.ConfigDict:
    """The config named by --config / --preset, else the tiny preset."""
    return presets.tiny() if FLAGS.config is None else FLAGS.config


def _require_workdir(command: str, what: str) -> str:
    if not FLAGS.workdir:
        raise SystemExit(f"{command} needs --workdir ({what})")
    return FLAGS.workdir


def _train() -> None:
    from t5x_lite.train import initialize_distributed, train

    # Joins a multi-host run when the JAX_* / SLURM / TPU VM environment describes one.
    initialize_distributed()
    workdir = _require_workdir("train", "where metrics.jsonl and checkpoints go")
    summary = train(_config(), workdir, steps=FLAGS.steps, restart=FLAGS.restart)
    print(json.dumps(summary, indent=2))


def _finetune() -> None:
    from t5x_lite.evaluation import finetune
    from t5x_lite.train import initialize_distributed

    initialize_distributed()
    workdir = _require_workdir("finetune", "where eval.jsonl and checkpoints go")
    if FLAGS.init_from is None:
        print("finetune: no --init_from given, so fine-tuning starts from random parameters.",
              file=sys.stderr)
    config = _config()
    if FLAGS.tasks:  # config_flags makes no override flag for a tuple that starts empty
        config.finetune.tasks = tuple(FLAGS.tasks)
    summary = finetune(config, workdir, init_from=FLAGS.init_from, restart=FLAGS.restart)
    print(json.dumps(summary, indent=2))


def _eval() -> None:
    from t5x_lite.evaluation import evaluate
    from t5x_lite.train import initialize_distributed

    initialize_distributed()
    config = _config()
    if not FLAGS.checkpoint:
        raise SystemExit("eval needs --checkpoint (a train or finetune workdir)")
    tasks = FLAGS.tasks or list(config.finetune.tasks)
    if not tasks:
        raise SystemExit("eval needs --tasks (or config.finetune.tasks)")
    print(json.dumps(evaluate(config, FLAGS.checkpoint, tasks, FLAGS.split), indent=2))


def _bench() -> None:
    from t5x_lite import bench

    config = _config()
    if FLAGS.decode:
        result = bench.decode_benchmark(config)
    else:
        result = bench.run_benchmarks(config, steps=FLAGS.bench_steps,
                                      compare_torch=FLAGS.compare_torch, pipeline=FLAGS.pipeline)
    if FLAGS.json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        if key != "config":
            print(f"{key:>28}: {value}")


# Commands whose flags are one config tree (absl + config_flags).
CONFIG_COMMANDS: dict[str, Callable[[], None]] = {
    "train": _train, "finetune": _finetune, "eval": _eval, "bench": _bench,
}


def _parse_with_overrides(parser: argparse.ArgumentParser,
                          argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """`parser`'s arguments, and the `--config.F=V` overrides (for every grid point) beside
    them; any other argument is an error."""
    args, rest = parser.parse_known_args(argv)
    overrides = [arg for arg in rest if arg.startswith("--config.")]
    unknown = [arg for arg in rest if arg not in overrides]
    if unknown:
        parser.error(f"unrecognised arguments: {' '.join(unknown)} (overrides look like "
                     "--config.train.steps=100)")
    return args, overrides


def _sweep(argv: list[str]) -> None:
    import jax

    from t5x_lite import launchers, sweep
    from t5x_lite.train import initialize_distributed

    parser = argparse.ArgumentParser(prog="t5x-lite sweep")
    parser.add_argument("experiment", help=f"one of {', '.join(sweep.experiment_names())} "
                        "or a path to an experiment file")
    parser.add_argument("--preset", default="tiny", help=", ".join(presets.PRESETS))
    parser.add_argument("--workdir", required=True, help="where results.jsonl and the runs go")
    parser.add_argument("--launcher", default="local", choices=launchers.LAUNCHERS)
    parser.add_argument("--workers", type=int, default=1, help="--launcher parallel: processes")
    parser.add_argument("--address", help="--launcher ray: the cluster's HOST:PORT")
    parser.add_argument("--accelerator", default="cpu", choices=("cpu", "gpu", "tpu"),
                        help="--launcher ray: what each grid point asks for")
    parser.add_argument("--point_index", type=int, help="run only this grid point (job arrays)")
    parser.add_argument("--vmap", type=int, default=1, help="pre-train up to K compatible grid "
                        "points together in one vmapped step (fills an accelerator)")
    args, overrides = _parse_with_overrides(parser, argv)
    initialize_distributed()  # a TPU pod's hosts / a SLURM task's processes join one run
    launcher = launchers.make_launcher(args.launcher, workers=args.workers,
                                       address=args.address, accelerator=args.accelerator)
    sweep.run_sweep(args.experiment, args.preset, args.workdir, launcher=launcher,
                    overrides=overrides, point_index=args.point_index, vmap=args.vmap)
    if args.point_index is None and jax.process_index() == 0:  # the report writes files
        _print_report(args.workdir, None)


def _print_report(workdir: str, out_dir: str | None) -> None:
    from t5x_lite import report

    print(report.report(workdir, out_dir=out_dir).text)


def _report(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="t5x-lite report")
    parser.add_argument("workdir", help="a sweep's workdir (holding results.jsonl)")
    parser.add_argument("--out", help="where the tables and plots go (default: WORKDIR/report)")
    args = parser.parse_args(argv)
    try:
        _print_report(args.workdir, args.out)
    except (FileNotFoundError, ValueError) as error:
        raise SystemExit(f"t5x-lite report: {error}") from None


def _demo(argv: list[str]) -> None:
    from t5x_lite import sweep

    parser = argparse.ArgumentParser(prog="t5x-lite demo", description="Table 2 of the T5 paper "
                                     "with a small model on the built-in corpus and tasks.")
    parser.add_argument("--workdir", default="t5x_lite_demo", help="re-running resumes it")
    args, overrides = _parse_with_overrides(parser, argv)
    print(sweep.run_demo(args.workdir, overrides=overrides))


def _preview(argv: list[str]) -> None:
    from t5x_lite import preview, sweep

    parser = argparse.ArgumentParser(
        prog="t5x-lite preview", description="What a pre-training objective makes of the "
        "corpus: the first examples a run corrupts, exactly as its train steps do from step 0.")
    parser.add_argument("experiment", nargs="?", help="one of "
                        f"{', '.join(sweep.experiment_names())} or a path to an experiment file; "
                        "omit it for a plain config")
    parser.add_argument("--point", help="the grid point's id, as in results.jsonl (e.g. rate_50)")
    parser.add_argument("--preset", default="tiny", help=", ".join(presets.PRESETS))
    parser.add_argument("--seed", type=int, default=0, help="the run's train.seed")
    parser.add_argument("--examples", type=int, default=3, help="how many (past the batch "
                        "size they come from the following steps' batches)")
    parser.add_argument("--json", action="store_true", help="one JSON object per example")
    args, overrides = _parse_with_overrides(parser, argv)
    run = preview.previewed_run(args.experiment, args.point, args.preset, args.seed, overrides)
    examples = preview.corrupted_examples(run, args.examples)
    if args.json:
        for example in examples:
            print(json.dumps(example))
    else:
        print(preview.format_text(run, examples))


def _launch(argv: list[str]) -> None:
    from t5x_lite import launchers

    launchers.main(argv)


# Commands with their own argument parsers (positional arguments, per-point overrides).
PLAIN_COMMANDS: dict[str, Callable[[list[str]], None]] = {
    "sweep": _sweep, "report": _report, "demo": _demo, "launch": _launch, "preview": _preview,
}


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv if argv is None else argv)
    if len(argv) < 2 or argv[1] not in {**CONFIG_COMMANDS, **PLAIN_COMMANDS}:
        print(__doc__)
        raise SystemExit(0 if len(argv) >= 2 and argv[1] in ("-h", "--help") else 2)
    command = argv.pop(1)
    host_memory.retain_if_requested()  # before JAX starts its threads (see the module)
    # orbax and TFDS log every save and build step (and TFDS each custom config) through absl;
    # our own warnings go through `warnings` and still show.
    logging.set_verbosity(logging.ERROR)

    def run(body: Callable[[], None]) -> None:
        try:
            body()
        except ConfigError as error:  # a bad setting: the message names it; no traceback needed
            raise SystemExit(f"t5x-lite {command}: invalid config: {error}") from None

    if command in PLAIN_COMMANDS:
        run(lambda: PLAIN_COMMANDS[command](argv[1:]))
        return
    app.run(lambda _: run(CONFIG_COMMANDS[command]), argv=_expand_preset(argv))


if __name__ == "__main__":
    main()
