"""`t5x-lite COMMAND [flags]`: the command line. Parses flags and calls the library; no logic.

Commands:
  train   pre-train one config:   t5x-lite train --preset tiny --workdir runs/tiny
  bench   speed of the train step: t5x-lite bench --preset tiny --json [--compare_torch]
  demo    a short pre-training of the `demo` preset on the built-in corpus

The config is an ml_collections file (`--config=configs/tiny.py`) or a preset
(`--preset tiny`, short for the packaged preset file); any field can be overridden with
`--config.train.steps=100`, `--config.model.arch=prefix_lm`, ...
"""
from __future__ import annotations

import json
import os
import sys
from typing import Callable

import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags

from t5x_lite import presets
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
flags.DEFINE_bool("json", False, "bench: print one JSON object instead of a table.")
flags.DEFINE_bool("compare_torch", False, "bench: also time the PyTorch (transformers) T5 step.")
flags.DEFINE_bool("pipeline", False, "bench: also time the input pipeline on the configured corpus.")
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


def _train() -> None:
    from t5x_lite.train import initialize_distributed, train

    # Joins a multi-host run when the JAX_* / SLURM / TPU VM environment describes one.
    initialize_distributed()
    if not FLAGS.workdir:
        raise SystemExit("train needs --workdir (where metrics.jsonl and checkpoints go)")
    summary = train(_config(), FLAGS.workdir, steps=FLAGS.steps, restart=FLAGS.restart)
    print(json.dumps(summary, indent=2))


def _demo() -> None:
    from t5x_lite.train import train

    config = presets.demo()
    model, objective = config.model, config.objective
    workdir = FLAGS.workdir or "t5x_lite_demo"
    steps = FLAGS.steps or config.train.steps
    print(
        f"t5x-lite demo: pre-training a small {model.arch} (d_model {model.d_model}, "
        f"{model.num_layers} layers per stack, vocabulary {model.vocab_size}) with "
        f"{objective.name} ({objective.noise_density:.0%}, mean span "
        f"{objective.mean_noise_span_length:g}) on the {config.data.corpus} corpus for {steps} steps.\n"
        f"This is smaller than the `tiny` benchmark preset so that it finishes in minutes on a laptop CPU.\n"
        f"Metrics: {workdir}/metrics.jsonl; re-running resumes from {workdir}/checkpoints "
        f"(--restart starts over).",
        flush=True,
    )
    summary = train(config, workdir, steps=steps, restart=FLAGS.restart)
    if summary["step"] == summary["start_step"]:
        print(f"\n{workdir} already holds a run at step {summary['step']}; "
              "pass --restart to train again from step 0, or --steps N to go further.")
        return
    first = _first_loss(os.path.join(workdir, "metrics.jsonl"))
    print(f"\nDone: step {summary['step']}, loss {first:.3f} -> {summary['loss']:.3f}, "
          f"token accuracy {summary['accuracy']:.3f}, {summary['tokens_per_s']:.0f} tokens/s, "
          f"compiled {summary['compiles']}x in {summary['compile_s']:.1f} s.")


def _first_loss(metrics_path: str) -> float:
    with open(metrics_path) as f:
        return json.loads(f.readline())["loss"]


def _bench() -> None:
    from t5x_lite.bench import run_benchmarks

    result = run_benchmarks(_config(), steps=FLAGS.bench_steps, compare_torch=FLAGS.compare_torch,
                            pipeline=FLAGS.pipeline)
    if FLAGS.json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        if key != "config":
            print(f"{key:>28}: {value}")


COMMANDS: dict[str, Callable[[], None]] = {"train": _train, "bench": _bench, "demo": _demo}


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv if argv is None else argv)
    if len(argv) < 2 or argv[1] not in COMMANDS:
        print(__doc__)
        raise SystemExit(0 if len(argv) >= 2 and argv[1] in ("-h", "--help") else 2)
    command = argv.pop(1)

    def run(_: list[str]) -> None:
        # orbax and TFDS log every save and build step (and TFDS each custom config) through absl;
        # our own warnings go through `warnings` and still show.
        logging.set_verbosity(logging.ERROR)
        try:
            COMMANDS[command]()
        except ConfigError as error:  # a bad setting: the message names it; no traceback needed
            raise SystemExit(f"t5x-lite {command}: invalid config: {error}") from None

    app.run(run, argv=_expand_preset(argv))


if __name__ == "__main__":
    main()
