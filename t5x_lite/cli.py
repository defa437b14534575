"""`t5x-lite COMMAND [flags]`: the command line. Parses and checks flags, then calls the library.

`t5x-lite --help` lists the commands (`COMMANDS`); `t5x-lite COMMAND --help` prints that
command's flags, how `--config.FIELD=VALUE` overrides work and an example. Every command is an
argparse parser; every command that reads a config (all but report, launch and export) takes the
overrides, which `config.split_overrides` takes out of the arguments and
`config.parse_overrides` reads, each value as the type of the field it sets, in every command
alike (the launch command re-parses its sweep's arguments with the sweep's own parser).

train / finetune / eval / bench read one config: a preset (`--preset tiny`, the default) or an
ml_collections file (`--config=configs/tiny.py`). finetune / eval read a preset with its sweep's
fine-tuning settings and tasks (`presets.finetune_preset`), so they fine-tune and score as a
sweep point of that preset does; finetune --init_from and eval take the model and vocabulary
from the checkpoint's saved config (`evaluation.config_from_checkpoint`); export takes both
from the checkpoint alone.
`eval --zero_shot` ranks the label options instead of decoding (`zero_shot.evaluate`).
train / finetune / eval also start from a local Hugging Face T5 directory (`--init_from_hf DIR`,
`convert.with_hf_t5`): its model, vocabulary and parameters. sweep / demo read an
experiment's config under a preset (`presets.sweep_preset`, with the `sweep` section); there the
overrides apply to every grid point. preview reads the same for an experiment's point, and the
plain preset (`presets.get_preset`) without one.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import sys
import tempfile
import textwrap
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

import ml_collections
from absl import logging

from t5x_lite import compilation_cache, host_memory, presets
from t5x_lite.config import (OVERRIDES_HELP, ConfigError, apply_overrides, load_config_file,
                             parse_overrides, split_overrides)
from t5x_lite.errors import (CheckpointsUnreadable, CommandFailed, MachineFault,
                             OneLineWarnings, PointBusy, is_machine_fault)
from t5x_lite.preemption import PREEMPTED_EXIT_STATUS
from t5x_lite.results import RESULTS_FILE, ResultsError, is_writer


class Command(NamedTuple):
    """One `t5x-lite` command: its help line, its example and the function that runs it."""

    summary: str  # the line `t5x-lite --help` shows, and the start of the command's --help
    example: str  # shown at the end of the command's --help
    run: Callable[[list[str]], None]  # called with the arguments after the command's name


# ---------------------------------------------------------------------------------------------
# Parsers: one per command, sharing the help layout and the override handling


# What a command that trains does when it is preempted (`preemption`), in its --help.
_PREEMPTION_HELP = (f"A run stopped by SIGTERM or SIGINT (a preemption) saves its checkpoints at "
                    f"the step it reached and exits with status {PREEMPTED_EXIT_STATUS}, not 0; "
                    "the same command resumes it.")
_TRAINING_COMMANDS = ("train", "finetune", "sweep", "demo")


def _indented(text: str) -> str:
    return textwrap.fill(text, 96, initial_indent="  ", subsequent_indent="  ")


def _parser(command: str, sections: ml_collections.ConfigDict | None) -> argparse.ArgumentParser:
    """The parser of `command`; with `sections` (the config it reads), its help explains the
    `--config.FIELD=VALUE` overrides and names the config's sections; a command that trains
    also says what preemption does."""
    epilog = []
    if sections is not None:
        epilog += ["config overrides:", _indented(OVERRIDES_HELP),
                   f"  The config's sections: {', '.join(sections)}.", ""]
    if command in _TRAINING_COMMANDS:
        epilog += ["exit status:", _indented(_PREEMPTION_HELP), ""]
    epilog += ["example:", f"  {COMMANDS[command].example}"]
    return argparse.ArgumentParser(
        prog=f"t5x-lite {command}", description=COMMANDS[command].summary,
        epilog="\n".join(epilog), formatter_class=argparse.RawDescriptionHelpFormatter)


def _parse(parser: argparse.ArgumentParser,
           argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """`parser`'s arguments, and the `--config.F=V` overrides beside them (in order); any
    other argument is an error."""
    overrides, rest = split_overrides(argv)
    args, unknown = parser.parse_known_args(rest)
    if unknown:
        parser.error(f"unrecognised arguments: {' '.join(unknown)} (overrides look like "
                     "--config.train.steps=100)")
    return args, overrides


def _config_parser(command: str, preset_help: str = "") -> argparse.ArgumentParser:
    """train / finetune / eval / bench: the config source flags (`preset_help` adds to
    --preset's help what the command takes from the preset)."""
    parser = _parser(command, presets.tiny())
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--preset", help=f"one of {', '.join(presets.PRESETS)} (default: "
                        f"tiny){preset_help}")
    source.add_argument("--config", metavar="FILE.py[:ARG]",
                        help="an ml_collections config file; its get_config(ARG) is the config")
    return parser


def _add_run_flags(parser: argparse.ArgumentParser, writes: str) -> None:
    """--workdir and --restart, which train and finetune share: the run's folder (`writes`:
    what goes there), resumed from its checkpoints unless --restart."""
    parser.add_argument("--workdir", required=True, type=_output_folder,
                        help=f"where {writes} go; re-running "
                        "resumes from its checkpoints")
    parser.add_argument("--restart", action="store_true",
                        help="discard the checkpoints in --workdir and start from step 0")


def _config(args: argparse.Namespace, overrides: list[str],
            preset: Callable[[str], ml_collections.ConfigDict] = presets.get_preset,
            ) -> ml_collections.ConfigDict:
    """The config named by --config / --preset (default: the tiny preset, made by `preset`),
    overridden and validated (`Settings.from_config`): a bad value is reported before a
    multi-host run is joined or JAX does anything."""
    from t5x_lite.settings import Settings  # imports jax, as the commands do: not at start

    config = load_config_file(args.config) if args.config else preset(args.preset or "tiny")
    apply_overrides(config, parse_overrides(config, overrides))
    Settings.from_config(config)
    return config


# What finetune / eval take from a preset (`presets.finetune_preset`).
_FINETUNE_PRESET_HELP = ("; its fine-tuning settings and tasks are those of a sweep point of "
                         "the preset")


def _comma_list(text: str) -> list[str]:
    """A comma-separated names flag's value; one that names nothing is argparse's error."""
    items = [item for item in text.split(",") if item]
    if not items:
        raise argparse.ArgumentTypeError(f"{text!r} names nothing")
    return items


def _folder(text: str) -> str:
    """A folder flag's value: '' (the current folder, by accident) or an existing file is
    argparse's one-line error before any work."""
    if not text:
        raise argparse.ArgumentTypeError("'' is no folder name")
    if Path(text).exists() and not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file, not a folder")
    return text


def _output_folder(text: str) -> str:
    """An output folder flag's value (`_folder`'s checks), made later if missing: a folder
    that could not be made or written in (under a file, on a read-only or forbidden file
    system) is argparse's one-line error before any work, not a traceback once the run
    starts writing. Nothing is left behind by the check."""
    text = _folder(text)
    path = Path(text).absolute()
    existing = next(folder for folder in (path, *path.parents) if folder.exists())
    if not existing.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} would be under {str(existing)!r}, a file")
    try:  # the one sure test of writing there is to write there
        os.rmdir(tempfile.mkdtemp(prefix=".t5x_lite_write_check_", dir=existing))
    except OSError as error:
        raise argparse.ArgumentTypeError(
            f"{text!r}: cannot make a folder in {str(existing)!r} ({error.strerror})") from None
    return text


def _positive_int(text: str) -> int:
    """A count flag's value; anything but an integer >= 1 is argparse's one-line error."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 1")
    return value


def _seed(text: str) -> int:
    """A seed flag's value; anything but an integer seed (`settings.require_seed`) is
    argparse's one-line error."""
    from t5x_lite.settings import MAX_SEED

    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer in [0, {MAX_SEED}]")
    return value


# --init_from_hf, as train / finetune / eval take it.
_HF_HELP = ("a local Hugging Face T5 checkpoint directory (config.json, model.safetensors or "
            "pytorch_model.bin, spiece.model when present; nothing is downloaded): its model, "
            "vocabulary and parameters replace the config's")


def _hf_start(config: ml_collections.ConfigDict, hf_dir: str | None,
              overrides: list[str]) -> tuple[ml_collections.ConfigDict, Any]:
    """(config, parameters) for `--init_from_hf hf_dir` (`convert.with_hf_t5`), checked
    before any run starts; (config, None) without it. Called after a multi-host run is
    joined: building the model starts JAX, after which `jax.distributed` cannot be joined."""
    if hf_dir is None:
        return config, None
    from t5x_lite.convert import with_hf_t5
    from t5x_lite.settings import Settings

    config, params = with_hf_t5(config, hf_dir, parse_overrides(config, overrides))
    Settings.from_config(config)
    return config, params


# ---------------------------------------------------------------------------------------------
# train / finetune / eval / bench: one config


def _train(argv: list[str]) -> None:
    from t5x_lite.distributed import initialize_distributed
    from t5x_lite.train import train

    parser = _config_parser("train")
    _add_run_flags(parser, "metrics.jsonl, checkpoints, TensorBoard events and, with "
                   "train.eval_every > 0, the held-out loss in eval.jsonl")
    parser.add_argument("--steps", type=_positive_int, help="train up to this many steps "
                        "(default: config.train.steps)")
    parser.add_argument("--init_from_hf", metavar="DIR", help=f"{_HF_HELP}; pre-training "
                        "continues from its parameters (default: random parameters)")
    parser.add_argument("--resume", action="store_true", help="only resume: an error if "
                        "--workdir holds no checkpoint (a requeued job given a mistyped "
                        "--workdir would otherwise start over there)")
    args, overrides = _parse(parser, argv)
    if args.resume and args.restart:
        parser.error("--resume and --restart contradict each other: give one")
    config = _config(args, overrides)
    # Joins a multi-host run when the JAX_* / SLURM / TPU VM environment describes one.
    initialize_distributed()
    config, params = _hf_start(config, args.init_from_hf, overrides)
    summary = train(config, args.workdir, steps=args.steps, restart=args.restart,
                    resume=args.resume, init_params=params)
    print(json.dumps(summary, indent=2))


def _finetune(argv: list[str]) -> None:
    from t5x_lite.distributed import initialize_distributed
    from t5x_lite.evaluation import config_from_checkpoint
    from t5x_lite.finetune import finetune, require_optimizer_state_source

    parser = _config_parser("finetune", _FINETUNE_PRESET_HELP)
    _add_run_flags(parser, "eval.jsonl, metrics.jsonl and checkpoints")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--init_from", help="the pre-training workdir whose parameters start "
                       "the run, its model and vocabulary read from its saved config (default: "
                       "random parameters)")
    start.add_argument("--init_from_hf", metavar="DIR", help=f"{_HF_HELP}; its parameters "
                       "start the run")
    parser.add_argument("--tasks", type=_comma_list, help="task names, comma-separated "
                        "(default: config.finetune.tasks, with --preset its sweep's tasks)")
    args, overrides = _parse(parser, argv)
    config = _config(args, overrides, presets.finetune_preset)
    if args.init_from is None:  # refused before a Hugging Face checkpoint is loaded
        require_optimizer_state_source(config, None)
    initialize_distributed()
    config, params = _hf_start(config, args.init_from_hf, overrides)
    if args.init_from is not None:  # the model it fine-tunes is the source's, as eval scores it
        config = config_from_checkpoint(config, args.init_from, parse_overrides(config, overrides),
                                        keep_neutral=True)
    if args.tasks:
        config.finetune.tasks = tuple(args.tasks)
    if args.init_from is None and params is None:
        print("finetune: no --init_from or --init_from_hf given, so fine-tuning starts from "
              "random parameters.", file=sys.stderr)
    summary = finetune(config, args.workdir, init_from=args.init_from or params,
                       restart=args.restart)
    print(json.dumps(summary, indent=2))


def _eval(argv: list[str]) -> None:
    from t5x_lite import zero_shot
    from t5x_lite.distributed import initialize_distributed
    from t5x_lite.evaluation import config_from_checkpoint, evaluate

    parser = _config_parser("eval", _FINETUNE_PRESET_HELP)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint",
                        help="a train or finetune workdir (or its checkpoints/); the model and "
                        "vocabulary settings are read from its saved config")
    source.add_argument("--init_from_hf", metavar="DIR", help=f"{_HF_HELP}; it is scored")
    parser.add_argument("--tasks", type=_comma_list, help="task names, comma-separated "
                        "(default: config.finetune.tasks, with --preset its sweep's tasks)")
    parser.add_argument("--split", default="validation",
                        help="the split to score (default: validation)")
    parser.add_argument("--zero_shot", action="store_true", help="rank each task's label "
                        "options by the model's log-likelihood instead of decoding (zero-shot "
                        "scoring, as a sweep's zero_shot stage does); tasks without label "
                        "options are skipped with a note, and none with them is an error")
    args, overrides = _parse(parser, argv)
    config = _config(args, overrides, presets.finetune_preset)
    tasks = args.tasks or list(config.finetune.tasks)
    if not tasks:
        parser.error("--tasks is needed (config.finetune.tasks is empty)")
    if args.zero_shot:  # checked before the model is read
        tasks, skipped = zero_shot.scorable(tasks, "--tasks" if args.tasks else "finetune.tasks")
        for reason in skipped:
            print(f"eval --zero_shot: skipped, {reason}", file=sys.stderr)
    initialize_distributed()
    config, params = _hf_start(config, args.init_from_hf, overrides)
    if params is None:
        config = config_from_checkpoint(config, args.checkpoint,
                                        parse_overrides(config, overrides))
    score = zero_shot.evaluate if args.zero_shot else evaluate
    scores = score(config, args.checkpoint if params is None else params, tasks, args.split)
    print(json.dumps(scores, indent=2))


def _bench(argv: list[str]) -> None:
    from t5x_lite import bench

    parser = _config_parser("bench")
    parser.add_argument("--json", action="store_true", help="print one JSON object, not a table")
    parser.add_argument("--compare_torch", action="store_true",
                        help="also time the PyTorch (transformers) T5 step; needs torch and "
                        "transformers (the test extra)")
    parser.add_argument("--pipeline", action="store_true",
                        help="also time the input pipeline on the configured corpus")
    parser.add_argument("--decode", action="store_true",
                        help="time cached greedy decoding against re-computation instead")
    parser.add_argument("--bench_steps", type=_positive_int, default=None,
                        help="timed calls; the median is reported, with the fastest and "
                        "slowest (default: 10 train steps, or 3 decodings with --decode)")
    args, overrides = _parse(parser, argv)
    if args.decode and (args.compare_torch or args.pipeline):
        parser.error("--decode times decoding alone; --compare_torch and --pipeline time the "
                     "train step: give one or the other")
    missing = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None
               ] if args.compare_torch else []
    if missing:
        parser.error(f"--compare_torch needs {' and '.join(missing)} (not installed here); "
                     'pip install ".[test]" installs torch (its CPU build) and transformers')
    config = _config(args, overrides)
    if args.decode:
        result = bench.decode_benchmark(config, steps=args.bench_steps or 3)
    else:
        result = bench.run_benchmarks(config, steps=args.bench_steps or 10,
                                      compare_torch=args.compare_torch, pipeline=args.pipeline)
    if args.json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        if key != "config":  # rounded: the timings vary more than their last digits
            print(f"{key:>28}: {_four_digits(value) if isinstance(value, float) else value}")


def _four_digits(value: float) -> str:
    """`value` to 4 significant digits, or, from 10,000 on, to a whole number without an
    exponent: '0.01235', '12.35', '123,457'."""
    return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"


def _export(argv: list[str]) -> None:
    parser = _parser("export", None)
    parser.add_argument("--checkpoint", required=True,
                        help="a train or finetune workdir (or its checkpoints/); its newest "
                        "checkpoint, model and vocabulary are exported")
    parser.add_argument("--out", required=True, type=_output_folder,
                        help="the Hugging Face directory to write "
                        "(must not exist, or be empty)")
    parser.add_argument("--config", metavar="FILE.py[:ARG]",
                        help="a config file to run first, for a checkpoint of an architecture "
                        "that file registers; the model's settings are the checkpoint's")
    args = parser.parse_args(argv)
    from t5x_lite.export import export_checkpoint

    try:  # a bad path or architecture: the message names it, no traceback
        if args.config:
            load_config_file(args.config)  # run for its registrations only
        out = export_checkpoint(args.checkpoint, args.out)
    except (ConfigError, FileNotFoundError) as error:
        raise SystemExit(f"t5x-lite export: {error}") from None
    print(f"exported {args.checkpoint} to {out}: load it with "
          f"T5ForConditionalGeneration.from_pretrained({str(out)!r}) and AutoTokenizer")


# ---------------------------------------------------------------------------------------------
# sweep / report / demo / preview: experiments


def _sweep_parser() -> argparse.ArgumentParser:
    """`t5x-lite sweep`'s parser (also what `launch` checks its sweep's arguments with)."""
    from t5x_lite import grid, launchers

    parser = _parser("sweep", presets.sweep_preset("tiny"))
    parser.add_argument("experiment", help=f"one of {', '.join(grid.experiment_names())} "
                        "or a path to an experiment file")
    parser.add_argument("--preset", default="tiny",
                        help=f"{', '.join(presets.PRESETS)} (default: tiny)")
    # Checked for writing only when the sweep runs here (`_sweep`): a launched sweep's workdir
    # is on the cluster, and a dry run writes nothing.
    parser.add_argument("--workdir", required=True, type=_folder,
                        help=f"where {RESULTS_FILE} and the runs "
                        "go; re-running resumes the sweep")
    parser.add_argument("--launcher", default="local", choices=launchers.LAUNCHERS,
                        help="where the grid points run (default: local, one after another)")
    parser.add_argument("--workers", type=_positive_int, default=1,
                        help="--launcher parallel: processes (default: 1)")
    parser.add_argument("--address", help="--launcher ray: the cluster's HOST:PORT")
    parser.add_argument("--accelerator", default="cpu", choices=launchers.ACCELERATORS,
                        help="--launcher ray: what each grid point asks for")
    parser.add_argument(launchers.POINT_INDEX_FLAG, type=int,
                        help="run only this grid point (job arrays)")
    parser.add_argument("--vmap", type=_positive_int, default=1, help="pre-train up to K "
                        "compatible grid points together in one vmapped step (fills an "
                        "accelerator)")
    parser.add_argument("--dry_run", action="store_true", help="check the grid and the workdir "
                        "and list every run with its steps, FLOPs, shared program and status; "
                        "run and write nothing")
    return parser


def _misused_launcher_flag(args: argparse.Namespace) -> str | None:
    """Why a sweep's launcher flags cannot work together (a launcher's flag given to another
    launcher would be ignored without a word), or None."""
    for flag, given, allowed in (("--workers", args.workers != 1, ("parallel",)),
                                 ("--address", args.address is not None, ("ray",)),
                                 ("--accelerator", args.accelerator != "cpu", ("ray",)),
                                 # Ray sizes its tasks per point (`sweep.require_vmap`).
                                 ("--vmap", args.vmap != 1, ("local", "parallel"))):
        if given and args.launcher not in allowed:
            return (f"{flag} is for --launcher {' or '.join(allowed)}; this sweep's launcher "
                    f"is {args.launcher}")
    return None


def _sweep(argv: list[str]) -> None:
    from t5x_lite import grid, launchers, sweep
    from t5x_lite.distributed import initialize_distributed

    parser = _sweep_parser()
    args, overrides = _parse(parser, argv)
    misused = _misused_launcher_flag(args)
    if misused:
        parser.error(misused)
    if args.dry_run:
        from t5x_lite import sweep_plan

        print(sweep_plan.render(sweep_plan.plan_sweep(args.experiment, args.preset, args.workdir,
                                                      overrides, vmap=args.vmap,
                                                      point_index=args.point_index)), end="")
        return
    try:
        _output_folder(args.workdir)
    except argparse.ArgumentTypeError as error:
        parser.error(f"argument --workdir: {error}")
    # The overrides read before the join (the rest of the grid's checks need its processes).
    grid.user_overrides(args.experiment, args.preset, overrides)
    initialize_distributed()  # a TPU pod's hosts / a SLURM task's processes join one run
    try:  # a bad or silent Ray address, or Ray not installed: say so, no traceback
        launcher = launchers.make_launcher(args.launcher, workers=args.workers,
                                           address=args.address, accelerator=args.accelerator)
    except (ConnectionError, ImportError, ValueError) as error:
        raise SystemExit(f"t5x-lite sweep: {error}") from None
    sweep.run_sweep(args.experiment, args.preset, args.workdir, launcher=launcher,
                    overrides=overrides, point_index=args.point_index, vmap=args.vmap)
    if args.point_index is None and is_writer():  # the report writes files
        _print_report(args.workdir, None)


def _print_report(workdir: str, out_dir: str | None, against: str | None = None) -> None:
    from t5x_lite import report

    print(report.report(workdir, out_dir=out_dir, against=against).text)


def _report(argv: list[str]) -> None:
    parser = _parser("report", None)
    parser.add_argument("workdir", type=_folder,
                        help=f"a sweep's workdir (holding {RESULTS_FILE})")
    parser.add_argument("--out", type=_output_folder,
                        help="where the tables and plots go (default: WORKDIR/report)")
    parser.add_argument("--against", metavar="OTHER_WORKDIR", type=_folder,
                        help="also compare each row with the same row of the sweep in "
                             "OTHER_WORKDIR (e.g. before a change): comparison.md, .csv")
    args = parser.parse_args(argv)
    if args.against is not None and not Path(args.against, RESULTS_FILE).is_file():
        parser.error(f"argument --against: {args.against} holds no {RESULTS_FILE}; give the "
                     "workdir of a finished sweep")
    try:
        _print_report(args.workdir, args.out, args.against)
    except (FileNotFoundError, ValueError) as error:
        raise SystemExit(f"t5x-lite report: {error}") from None


def _demo(argv: list[str]) -> None:
    from t5x_lite import sweep

    parser = _parser("demo", presets.sweep_preset("demo"))
    parser.add_argument("--workdir", default="t5x_lite_demo", type=_output_folder,
                        help="where the sweep goes (default: t5x_lite_demo); re-running resumes")
    args, overrides = _parse(parser, argv)
    print(sweep.run_demo(args.workdir, overrides=overrides))


def _preview(argv: list[str]) -> None:
    from t5x_lite import grid, preview

    parser = _parser("preview", presets.sweep_preset("tiny"))
    parser.add_argument("experiment", nargs="?", help="one of "
                        f"{', '.join(grid.experiment_names())} or a path to an experiment file; "
                        "omit it for a plain config")
    parser.add_argument("--point", help=f"the grid point's id, as in {RESULTS_FILE} "
                        "(e.g. rate_50)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--preset", help=f"{', '.join(presets.PRESETS)} (default: tiny)")
    source.add_argument("--config", metavar="FILE.py[:ARG]", help="a plain config from an "
                        "ml_collections config file, as `train --config` reads it (its "
                        "get_config(ARG)); not with an experiment")
    parser.add_argument("--seed", type=_seed, default=0, help="the run's train.seed")
    parser.add_argument("--examples", type=int, default=3, help="how many (past the batch "
                        "size they come from the following steps' batches)")
    parser.add_argument("--json", action="store_true", help="one JSON object per example")
    args, overrides = _parse(parser, argv)
    run = preview.previewed_run(args.experiment, args.point, args.preset or "tiny", args.seed,
                                overrides, config_file=args.config)
    examples = preview.corrupted_examples(run, args.examples)
    if args.json:
        for example in examples:
            print(json.dumps(example))
    else:
        print(preview.format_text(run, examples))


# ---------------------------------------------------------------------------------------------
# launch: TPU pods and SLURM clusters


def _launched_sweep_points(sweep_args: list[str], target: str) -> int:
    """The number of runs (grid rows x seeds) of `t5x-lite sweep SWEEP_ARGS`, read with the
    sweep's own parser, after refusing what a sweep launched on `target` cannot do: a bad
    argument fails here, not on every host of the cluster."""
    from t5x_lite import grid, sweep

    args, overrides = _parse(_sweep_parser(), sweep_args)
    misused = _misused_launcher_flag(args)
    if misused:
        raise ValueError(f"in SWEEP_ARGS: {misused}")
    if args.dry_run:
        raise ValueError("--dry_run in SWEEP_ARGS would only print a plan on every host; run "
                         "`t5x-lite sweep SWEEP_ARGS --dry_run` here instead")
    if args.launcher != "local":
        raise ValueError(f"--launcher {args.launcher} in SWEEP_ARGS: launch starts the sweep's "
                         "processes itself (one jax.distributed run on the pod's hosts or in "
                         "each array task); leave --launcher out")
    if args.point_index is not None and target == "slurm":
        raise ValueError("--point_index in SWEEP_ARGS: the job array sets it, one task per "
                         "grid point; leave it out")
    if target == "tpu" and not os.path.isabs(args.workdir):
        # Each host runs the sweep in its own checkout (~/t5x_lite): a relative workdir is a
        # folder per host, and the hosts' records never meet.
        warnings.warn(f"--workdir {args.workdir} in SWEEP_ARGS is relative: each TPU host "
                      "would write its own folder under its ~/t5x_lite; give one directory "
                      "every host sees (a mounted bucket or NFS path, e.g. /mnt/shared/table2)")
    points = grid.expand(args.experiment, args.preset, overrides)
    sweep.select_point(points, args.point_index)  # an index past the grid
    return len(points)


def _launch(argv: list[str]) -> None:
    """Print (default) or submit the commands or the sbatch script that run `t5x-lite sweep
    SWEEP_ARGS` on a TPU pod or SLURM cluster."""
    from t5x_lite import launchers

    sweep_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = _parser("launch", None)
    parser.usage = "t5x-lite launch {tpu,slurm} [flags] -- SWEEP_ARGS"
    parser.epilog = ("SWEEP_ARGS: the arguments of `t5x-lite sweep`, checked with its parser.\n"
                     "`t5x-lite launch tpu --help` (or slurm --help): that target's flags.\n\n"
                     f"{parser.epilog}")
    targets = parser.add_subparsers(dest="target", required=True, metavar="{tpu,slurm}",
                                    prog="t5x-lite launch")
    tpu = targets.add_parser("tpu", help="gcloud commands for every host of a TPU pod slice",
                             description="Print the gcloud commands that install this "
                             "repository on every host of a TPU pod slice and start the sweep "
                             "there (--submit runs them).")
    tpu.add_argument("--tpu", help="TPU VM name (required)")
    tpu.add_argument("--zone", help="its zone, e.g. us-central2-b (required)")
    tpu.add_argument("--project", help="Google Cloud project (default: gcloud's)")
    tpu.add_argument("--repo", help="git URL of this repository, cloned on every host "
                     "(required)")
    slurm = targets.add_parser("slurm", help="an sbatch job-array script",
                               description="Print an sbatch script: a job array with one task "
                               "per grid point (--submit writes and submits it).")
    slurm.add_argument("--partition", help="the SLURM partition (`sinfo -s` lists them)")
    slurm.add_argument("--nodes", type=int, default=1, help="nodes per grid point (default: 1)")
    slurm.add_argument("--gpus_per_node", type=int, default=1, help="default: 1")
    slurm.add_argument("--time", default="24:00:00",
                       help="time limit per grid point (default: 24:00:00)")
    slurm.add_argument("--account", help="the account to charge")
    slurm.add_argument("--setup", action="append", default=[], help="a shell line run first "
                       "(repeatable): module loads, activating a virtualenv")
    slurm.add_argument("--script", default="t5x_lite_sweep.sbatch",
                       help="where --submit writes the script")
    for name, target, example in (("tpu", tpu, COMMANDS["launch"].example),
                                  ("slurm", slurm, _SLURM_EXAMPLE)):
        target.add_argument("--submit", action="store_true", help="run/submit, not only print")
        target.usage = f"t5x-lite launch {name} [flags] -- SWEEP_ARGS"
        target.epilog = (f"SWEEP_ARGS: the arguments of `t5x-lite sweep`, checked with its "
                         f"parser.\n\nexample:\n  {example}")
        target.formatter_class = argparse.RawDescriptionHelpFormatter
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # most likely the sweep's arguments, the '--' before them forgotten
        parser.error(f"unrecognised arguments: {' '.join(unknown)} (the sweep's arguments go "
                     "after '--', e.g. -- table2 --preset tiny --workdir runs/table2)")
    if not sweep_args:
        parser.error("give the sweep's arguments after '--', e.g. -- table2 --preset tiny "
                     "--workdir runs/table2")
    try:  # bad input (ValueError, ConfigError) is a usage error: message, no traceback
        if args.target == "tpu":
            commands = launchers.tpu_commands(sweep_args, tpu=args.tpu, zone=args.zone,
                                              repo=args.repo, project=args.project)
            _launched_sweep_points(sweep_args, "tpu")
            launchers.run_commands(commands, dry_run=not args.submit)
            return
        launchers.require_partition(args.partition)  # before counting the grid (builds configs)
        script = launchers.slurm_script(
            sweep_args, num_points=_launched_sweep_points(sweep_args, "slurm"),
            partition=args.partition,
            nodes=args.nodes, gpus_per_node=args.gpus_per_node, time=args.time,
            account=args.account, setup=args.setup,
        )
    except ValueError as error:
        parser.error(str(error))
    if not args.submit:
        print(script, end="")
        return
    launchers.require_program("sbatch")
    Path(args.script).write_text(script)
    launchers.run_commands([["sbatch", args.script]], dry_run=False)


# ---------------------------------------------------------------------------------------------
# The commands

_SLURM_EXAMPLE = ("t5x-lite launch slurm --partition gpu --nodes 2 --gpus_per_node 4 -- table2 "
                  "--preset small --workdir /scratch/table2")
COMMANDS: dict[str, Command] = {
    "train": Command("Pre-train one config.", "t5x-lite train --preset tiny --workdir runs/tiny "
                     "--config.train.steps=1000", _train),
    "finetune": Command(
        "Fine-tune a pre-trained run on downstream tasks and validate it.",
        "t5x-lite finetune --preset tiny --init_from runs/tiny --workdir runs/tiny_ft "
        "--tasks builtin_reverse", _finetune),
    "eval": Command("Score a checkpoint on tasks.",
                    "t5x-lite eval --preset tiny --checkpoint runs/tiny_ft "
                    "--tasks builtin_reverse,builtin_module", _eval),
    "sweep": Command(
        "Run a paper table's grid: pre-train, fine-tune, evaluate; then its report.",
        "t5x-lite sweep table2 --preset tiny --workdir runs/table2 --config.train.steps=100",
        _sweep),
    "report": Command("A sweep's table beside the paper's numbers, its findings and plots.",
                      "t5x-lite report runs/table2 --out runs/table2/report", _report),
    "launch": Command(
        "A sweep on a TPU pod (gcloud commands) or a SLURM cluster (sbatch script).",
        "t5x-lite launch tpu --tpu my-v4-32 --zone us-central2-b --repo "
        "https://github.com/ORG/t5x_lite -- table2 --preset paper --workdir /mnt/shared/table2",
        _launch),
    "export": Command("Write a checkpoint as a Hugging Face T5 directory (transformers).",
                      "t5x-lite export --checkpoint runs/tiny_ft --out runs/tiny_ft_hf",
                      _export),
    "bench": Command("Time the train step (or decoding) of a config.",
                     "t5x-lite bench --preset tiny --json --compare_torch", _bench),
    "demo": Command("Table 2 with a small model on the built-in corpus and tasks, then its "
                    "report.", "t5x-lite demo --workdir t5x_lite_demo", _demo),
    "preview": Command(
        "What an objective makes of real text, as the train step corrupts it.",
        "t5x-lite preview table6 --point rate_50 --preset demo --examples 2", _preview),
}


def usage() -> str:
    """`t5x-lite --help`: the commands, one line each."""
    width = max(map(len, COMMANDS))
    lines = ["usage: t5x-lite COMMAND [flags]", "", "Commands:"]
    lines += [f"  {name:<{width}}  {command.summary}" for name, command in COMMANDS.items()]
    lines += ["", "`t5x-lite COMMAND --help` prints a command's flags and an example. The",
              "commands that read a config take --config.FIELD=VALUE overrides, e.g.",
              "--config.train.steps=100. Launching on clusters: launch/README.md.", "",
              textwrap.fill(f"Preemption ({', '.join(_TRAINING_COMMANDS)}): {_PREEMPTION_HELP}",
                            78), "",
              textwrap.fill("Compiled programs are kept for the next command in "
                            f"{compilation_cache.default_dir()} (at most "
                            f"{compilation_cache.DEFAULT_MAX_BYTES / 2**30:g} GiB; "
                            "JAX_COMPILATION_CACHE_DIR=DIR puts them elsewhere, "
                            "JAX_ENABLE_COMPILATION_CACHE=false turns this off).", 78,
                            break_long_words=False, break_on_hyphens=False)]
    return "\n".join(lines)


@contextlib.contextmanager
def _warnings_on_one_line(command: str) -> Iterator[None]:
    """Within it, t5x_lite's own warnings show as one line each (`errors.OneLineWarnings`),
    here and in a parallel sweep's workers."""
    previous = warnings.formatwarning
    warnings.formatwarning = OneLineWarnings(command)
    try:
        yield
    finally:
        warnings.formatwarning = previous


# The errors whose message says what went wrong and what to do, so a command ends with it
# alone, without a traceback.
_SAID_IN_ONE_LINE = (
    ResultsError,  # a damaged results.jsonl: the message names the line
    FileNotFoundError,  # missing input: the messages name the path and the fix
    # A path of a config field (data.data_dir, a vocabulary) the machine refuses: the message
    # names it.
    PermissionError, NotADirectoryError, IsADirectoryError,
    FloatingPointError,  # a diverged run: the step, and the checkpoint kept
    CheckpointsUnreadable,  # each step's error warned above; the way on
    MachineFault, PointBusy,  # a sweep stopped: what stopped, what to do
    CommandFailed,  # launch --submit: a cluster command failed, its output shown
)


def main(argv: list[str] | None = None) -> None:
    """`t5x-lite COMMAND ...` (the console script): `argv` as `sys.argv`, the program name
    first. Without a command it prints the usage (exit 2); an unknown one is a one-line error."""
    argv = list(sys.argv if argv is None else argv)
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(usage())
        raise SystemExit(0 if len(argv) >= 2 else 2)
    if argv[1] not in COMMANDS:  # a usage error, as argparse's: exit status 2
        print(f"t5x-lite: unknown command {argv[1]!r}; the commands: {', '.join(COMMANDS)} "
              "(t5x-lite --help says what each does)", file=sys.stderr)
        raise SystemExit(2)
    command = argv.pop(1)
    host_memory.retain_if_requested()  # before JAX starts its threads (see the module)
    # Before anything compiles. bench measures compile time: it compiles everything.
    cache = contextlib.nullcontext()
    if command == "bench":
        cache = compilation_cache.turned_off()
    else:
        compilation_cache.use_default()
    # orbax and TFDS log every save and build step (and TFDS each custom config) through absl;
    # our own warnings go through `warnings` and still show.
    logging.set_verbosity(logging.ERROR)
    try:
        with cache, _warnings_on_one_line(command):
            COMMANDS[command].run(argv[1:])
    except ConfigError as error:  # a bad setting: the message names it; no traceback needed
        raise SystemExit(f"t5x-lite {command}: invalid config: {error}") from None
    except KeyboardInterrupt:  # a second Ctrl-C (`loop.PreemptionWatch`), or one in set-up
        print(f"t5x-lite {command}: interrupted: stopped at once, without saving; the same "
              "command resumes from the newest checkpoint saved before", file=sys.stderr)
        raise SystemExit(130) from None
    except _SAID_IN_ONE_LINE as error:
        raise SystemExit(f"t5x-lite {command}: {error}") from None
    except Exception as error:  # a full disk is the machine's fault: one line, not orbax's dumps
        if not is_machine_fault(error):
            raise
        first_line = str(error).splitlines()[0] if str(error) else ""
        resumes = command in ("train", "finetune", "sweep", "demo")
        raise SystemExit(f"t5x-lite {command}: stopped by the machine: {type(error).__name__}: "
                         f"{first_line[:300]}; "
                         + ("the checkpoints saved before it are kept: " if resumes else "")
                         + "fix it (e.g. free disk space, or a folder's permissions) and run "
                         + ("the same command again to resume" if resumes
                            else "the same command again")) from None


if __name__ == "__main__":
    main()
