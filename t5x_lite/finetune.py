"""Fine-tuning a pre-trained model on downstream tasks: the paper's second stage.

    pre-training checkpoint --params (and, to continue, optimiser state)-->
        finetune(config, workdir, init_from=...)
        task examples -> the pre-training vocabulary -> MixtureData batches (f(seed, step))
        -> train_step.make_finetune_step (the pre-training update on ready batches)
        every finetune.eval_every steps and at the end: evaluation.Evaluator on the
        validation split -> workdir/eval.jsonl; the best score per task is reported (the
        paper's convention)

A fine-tuning run is a run of the one set-up (`run_setup.set_up`, `loop.run_loop`) like
pre-training; what it brings is its data, its step on ready batches, and its start from the
checkpoint's parameters with a fresh optimiser state, or with the pre-training's carried on
(`finetune.optimizer_state='continue'`, as T5's code does; `require_optimizer_state_source`
says when it can). Its step count starts at 0 either way. Its own
checkpoints under `workdir/checkpoints` make it resumable, and `eval.jsonl` keeps the
validation history that the best scores are taken from, so they survive a resume.
"""
from __future__ import annotations

import copy
import json
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

import jax
import ml_collections
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from t5x_lite import (architectures, attention, batch_format, checkpointing, run_folders,
                      saved_config, train_state, train_step)
from t5x_lite.config import ConfigError
from t5x_lite.data import pipeline, tasks
from t5x_lite.evaluation import (PARAMETER_FIELDS, Evaluator, TaskSplit, check_finetune_settings,
                                 checkpoint_dir, require_same)
from t5x_lite.loop import EvalLog, Every, run_loop, summaries
from t5x_lite.results import write_json
from t5x_lite.run_setup import RunPlan, set_up

# Fields a resumed fine-tuning run must share with the run that wrote its checkpoints, besides
# `saved_config.RESUME_FIELDS`: they fix which examples the step-indexed batches hold, which
# examples validation scores and how it decodes them (the best scores are chosen among
# every validation of the run, eval.jsonl's earlier ones included, so all must compare), and
# what the optimiser began from. `task_lengths` sets targets_length: a run saved before it existed
# is refused naming --config.finetune.task_lengths=False, which resumes it.
_FINETUNE_RESUME_FIELDS = ("finetune.tasks", "finetune.mixing_limit", "finetune.pack",
                           "finetune.inputs_length", "finetune.targets_length",
                           "finetune.task_lengths",
                           "finetune.eval_examples", "finetune.eval_selection",
                           "finetune.decode", "finetune.optimizer_state",
                           "finetune.mode_token")


def finetune_train_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """`config` with `train` set up for fine-tuning: the optimiser, schedule, learning rate,
    warm-up, steps and batch size of `config.finetune` (the train step reads `config.train`)."""
    derived = copy.deepcopy(config)
    derived.train.update({field: config.finetune[field]
                          for field in run_folders.TRAIN_FIELDS_FROM_FINETUNE})
    return derived


def require_optimizer_state_source(config: ml_collections.ConfigDict,
                                   pretraining: dict[str, Any] | None) -> None:
    """Refuse, in one line before any work, `finetune.optimizer_state='continue'` from a start
    that holds no optimiser state (`pretraining` None: `--init_from_hf` or random parameters)
    or that of another optimiser (`pretraining`: the config the source run saved, as JSON;
    its `train.optimizer`, and Adafactor's weight-decay stage, must be the fine-tuning's:
    `finetune.optimizer`). A 'fresh' start is always possible."""
    if config.finetune.optimizer_state != "continue":
        return
    if pretraining is None:
        raise ConfigError(
            "finetune.optimizer_state='continue' carries on the optimiser state of the "
            "pre-training run that --init_from names; a start from --init_from_hf or from "
            "random parameters has none: set --config.finetune.optimizer_state=fresh")
    differences = saved_config.config_differences(
        pretraining, saved_config.config_as_json(finetune_train_config(config)),
        ("train.optimizer",))
    if differences:
        raise ConfigError(
            "finetune.optimizer_state='continue' carries on the pre-training's optimiser "
            f"state, which the fine-tuning's (finetune.optimizer) cannot: {'; '.join(differences)}"
            "; fine-tune with the pre-training's optimiser settings, or with "
            "finetune.optimizer_state=fresh")


def _require_saved_layout(source: Path, ft_config: ml_collections.ConfigDict) -> None:
    """Refuse, before any work, to continue an optimiser state that `source`'s newest
    checkpoint holds in another layout than `ft_config`'s program (one written before
    Adafactor's moments changed shape): it would not restore."""
    differences = checkpointing.saved_layout_differences(
        source, {"opt_state": train_state.state_shapes(ft_config).opt_state})
    if differences:
        raise ConfigError(
            f"finetune.optimizer_state='continue': the optimiser state saved in {source} is "
            f"laid out otherwise than this version's ({len(differences)} arrays, e.g. "
            f"{differences[0]}; as in an Adafactor run saved before its attention moments "
            "changed shape on 2026-12-05), so it cannot carry on: fine-tune with "
            "finetune.optimizer_state=fresh")


class _TaskData:
    """Fine-tuning's step-indexed batches (`batch(step)`: `pipeline.MixtureData` of the tasks'
    train splits) and the splits: `train` (which counts the cut examples) and `validation`,
    both in `vocab`."""

    def __init__(self, config: ml_collections.ConfigDict, task_list: Sequence[tasks.Task]):
        ft = config.finetune
        self.vocab = pipeline.vocabulary_from_config(config)
        self.train = [TaskSplit(task, "train", config, self.vocab) for task in task_list]
        self.validation = [TaskSplit(task, "validation", config, self.vocab, ft.eval_examples)
                           for task in task_list]
        self.mixture = pipeline.MixtureData(
            [s.encoded for s in self.train], ft.mixing_limit, ft.batch_size, ft.inputs_length,
            ft.targets_length, family=architectures.get(config.model.arch).family,
            pack=ft.pack, seed=config.train.seed, process_index=jax.process_index(),
            process_count=jax.process_count(),
            mask_token=batch_format.mask_token(config.model.vocab_size))

    def batch(self, step: int) -> dict[str, np.ndarray]:
        return self.mixture.batch(step)


def _source_record(workdir: Path, source: Path, resuming: bool) -> dict[str, Any] | None:
    """Refuse a source with no saved step, and refuse to resume a fine-tuning run whose
    pre-training source has changed since it started, which would return the old run's scores
    as the new model's: its newest step is another (the pre-training was continued), or the
    same step saved anew (the pre-training was run again, e.g. with --restart). Else the
    record of the source to write once the run starts (`saved_config.FINETUNE_SOURCE_FILE`;
    None when `resuming`: it is written). Its folder is recorded but not compared: a sweep's
    workdir may be moved or copied whole, which keeps the saves' times. Warn when the source
    stopped before its own `train.steps` (e.g. a preempted pre-training)."""
    step = checkpointing.newest_step(source)
    if step is None:
        raise ConfigError(f"--init_from {source} holds no saved step to fine-tune from (its "
                          "run stopped before its first checkpoint)")
    began = checkpointing.save_began_ns(source, step)
    current = {"path": str(source.resolve()), "step": step, "save_began_ns": began}
    saved_steps = checkpointing.unfinished_steps(source, step)
    if saved_steps is not None:
        warnings.warn(f"fine-tuning from {source} at step {step} of its {saved_steps}: its "
                      "pre-training has not finished", stacklevel=3)
    record = workdir / saved_config.FINETUNE_SOURCE_FILE
    if resuming and record.is_file():
        before = json.loads(record.read_text())
        if before.get("path") is None:
            raise ConfigError(
                f"{workdir} was fine-tuned from {before.get('parameters')} parameters, not a "
                f"pre-training run: pass --restart to fine-tune it from {current['path']}, or "
                "use a new --workdir")
        began_before = before.get("save_began_ns")
        if before["step"] != current["step"]:
            changed = (f"at step {before['step']}; --init_from now gives {current['path']} at "
                       f"step {current['step']}")
        elif None not in (began_before, began) and began_before != began:
            changed = (f"at step {before['step']}, saved at {_utc(began_before)}; --init_from "
                       f"now gives {current['path']} at that step saved anew at {_utc(began)} "
                       "(its pre-training ran again, or --init_from names another run)")
        else:
            return None
        raise ConfigError(
            f"{workdir} was fine-tuned from {before['path']} {changed}: pass --restart to "
            "fine-tune again from it, or use a new --workdir")
    return None if resuming else current


def _utc(nanoseconds: int) -> str:
    """Nanoseconds since the epoch as 'YYYY-MM-DD HH:MM:SS UTC'."""
    return datetime.fromtimestamp(nanoseconds / 1e9, timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S UTC")


def finetune(config: ml_collections.ConfigDict, workdir: str | Path, *,
             init_from: str | nnx.State | None, progress: bool = True,
             restart: bool = False) -> dict[str, Any]:
    """Fine-tune on `config.finetune.tasks` in `workdir` and return the best validation scores.

    init_from: a pre-training run (a `train.train` workdir or its `checkpoints/`) whose
    parameters start the run, with a fresh optimiser state or, under
    `finetune.optimizer_state='continue'`, its own (of the same optimiser); its model and
    vocabulary must be `config`'s; or parameters of `config`'s model (`nnx.State`, e.g. a
    Hugging Face checkpoint's from `convert.with_hf_t5`). None starts from random parameters.
    Resumes from `workdir/checkpoints` (`restart=True` deletes them). Validates every
    `finetune.eval_every` steps and at the end, appending to `workdir/eval.jsonl`; train
    metrics go to `workdir/metrics.jsonl`. Returns {"scores": {task: {metric: value}} (each
    task's best validation record, the paper's convention), "best_step": {task: step},
    "steps", "loss" (the last step's train loss), "wall_s", "compile_s",
    "compiles" (of the train step), "truncated": {task: training examples cut}}. Preempted,
    it saves and raises `preemption.Preempted` as pre-training does (`train.train`).
    """
    started = time.perf_counter()
    config, task_list = check_finetune_settings(config, config.finetune.tasks)
    workdir, ft = Path(workdir), config.finetune
    run_folders.require_kind(workdir, run_folders.FINE_TUNING, restart=restart)
    attention.require_available(config.model.attention_impl)
    source_record = None  # written once the run starts: a run refused before leaves nothing
    ft_config = finetune_train_config(config)
    source = init_from if init_from is None or isinstance(init_from, nnx.State) else (
        checkpoint_dir(init_from))
    resuming = not restart and checkpointing.newest_step(
        workdir / saved_config.CHECKPOINTS_DIR) is not None
    if isinstance(source, Path):
        own = (workdir / saved_config.CHECKPOINTS_DIR).resolve()
        if source.resolve() in (own, *own.parents):  # its --restart would delete the source
            raise ConfigError(f"--init_from {init_from} is this run's own workdir {workdir}: "
                              "fine-tune into a workdir of its own")
        require_same(source, config, PARAMETER_FIELDS, "hold another model or vocabulary")
        require_optimizer_state_source(config, saved_config.read_saved_config(source))
        if ft.optimizer_state == "continue":
            _require_saved_layout(source, ft_config)
        source_record = _source_record(workdir, source, resuming)
    else:
        require_optimizer_state_source(config, None)
        if not resuming:
            source_record = {"path": None, "parameters": "random" if source is None else "given"}
    restored_step = None  # the source's step that a new run started from

    def fresh_state(point: ml_collections.ConfigDict, mesh: Mesh) -> train_state.TrainState:
        nonlocal restored_step
        if source is None:
            return train_state.init_state(point, mesh)
        if isinstance(source, nnx.State):
            return train_state.state_from_params(point, mesh, source)
        abstract = train_state.abstract_state(point, mesh)
        parts = {"params": abstract.params}
        if ft.optimizer_state == "continue":
            parts["opt_state"] = abstract.opt_state
        restored, restored_step = checkpointing.restore_parts(source, parts)
        return train_state.state_from_params(point, mesh, restored["params"],
                                             restored.get("opt_state"))

    plan = RunPlan(
        configs=[ft_config], workdirs=[workdir],
        make_data=lambda: _TaskData(config, task_list),
        make_step=lambda mesh: train_step.make_finetune_step(ft_config, mesh),
        step_args=(train_state.finetune_key(config.train.seed),),
        lengths=(ft.inputs_length, ft.targets_length), fresh_state=fresh_state,
        batch_field="finetune.batch_size",
        resume_fields=saved_config.RESUME_FIELDS + _FINETUNE_RESUME_FIELDS)
    with set_up(plan, progress=progress, restart=restart) as run:
        if source_record is not None:
            source_record["restored_step"] = restored_step
            write_json(workdir / saved_config.FINETUNE_SOURCE_FILE, source_record)
            if ft.optimizer_state == "continue":
                run.progress.note(f"fine-tuning carries on the optimiser state saved at step "
                                  f"{restored_step} of {source}, its update count too")
        evaluator = Evaluator(config, run.data.validation, run.data.vocab, run.mesh)
        log = EvalLog(workdir, run.start)

        examples = sum(len(split.examples) for split in run.data.validation)

        def validate(step: int, state: train_state.TrainState) -> None:
            # Decoding every validation example takes a while (minutes on a CPU): say so.
            run.progress.note(f"step {step}/{run.total}: validating on {examples} examples "
                              f"({evaluator.max_length} tokens decoded at most)")
            started_validation = time.perf_counter()
            results = evaluator(state.params)
            log.add(step, results)
            scores = "; ".join(
                f"{task} " + ", ".join(f"{name} {value:.2f}"
                                       for name, value in result["metrics"].items())
                for task, result in results.items())
            run.progress.note(f"step {step}/{run.total}: validation "
                              f"({time.perf_counter() - started_validation:.0f} s): {scores}")

        records = run_loop(run, Every(ft.eval_every, validate))
    summary = summaries(run, records)[0]
    best = log.best()
    return {
        "scores": {task: record["metrics"] for task, record in best.items()},
        "best_step": {task: record["step"] for task, record in best.items()},
        "steps": summary["step"], "loss": summary["loss"],
        "wall_s": time.perf_counter() - started,
        "compile_s": summary["compile_s"], "compiles": summary["compiles"],
        "truncated": {s.task.name: s.truncated for s in run.data.train},
    }
