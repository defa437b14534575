"""Scoring a model on downstream tasks: validation during fine-tuning, and `evaluate`.

    evaluate(config, params | checkpoint dir | converted HF module, tasks) -> {task: metrics}
    Evaluator(config, splits, vocab, mesh)(params) -> {task: loss, token accuracy, metrics}

Validation measures two things: the teacher-forced loss and token accuracy of the targets,
and the task's own metrics (`Task.score`, 0-100) on decoded predictions
(`t5x_lite.decoding.decode`). `t5x_lite.finetune` validates with an `Evaluator` as it trains.
The checks both share (`check_finetune_settings`), the model and vocabulary of a checkpoint
(`config_from_checkpoint`, `require_same`) and the task splits as text and ids (`TaskSplit`)
are here too.
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import heapq
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import jax
import ml_collections
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from t5x_lite import (architectures, batch_format, checkpointing, decoding, partitioning, programs,
                      run_folders, saved_config, train_state, train_step)
from t5x_lite.config import EVAL_SELECTIONS, ConfigError
from t5x_lite.data import pipeline, tasks
from t5x_lite.data.vocabulary import Vocabulary
from t5x_lite.settings import Finetune, Model

# Fields a checkpoint must share with the config that reads its parameters: the network, and
# the vocabulary that gives its token ids their meaning.
PARAMETER_FIELDS = ("model", "data.corpus", "data.vocab")


# ---------------------------------------------------------------------------------------------
# Config


def check_task_names(names: Sequence[str], field: str = "finetune.tasks") -> list[tasks.Task]:
    """The registered tasks called `names`; an empty list or unknown names are a `ConfigError`
    naming `field`, every unknown name and the known ones."""
    if isinstance(names, str) or not names:
        raise ConfigError(f"{field}={names!r} must be a non-empty list of task names")
    return tasks.get_tasks(names, field)


# The metrics of tasks whose targets are free text (translation, summarisation, SQuAD), which
# only a model that generates token by token can produce.
FREE_TEXT_METRICS = ("bleu", "rouge", "squad")


def not_applicable(arch: str, task: tasks.Task) -> str | None:
    """Why `task` cannot be fine-tuned and scored with `model.arch=arch`, or None if it can: a
    family that predicts in place (`encoder_only`) fills a fixed number of mask slots, which
    suits label words and numbers but not free text (`FREE_TEXT_METRICS`)."""
    free_text = [name for name in task.metric_names if name in FREE_TEXT_METRICS]
    if free_text and batch_format.in_place(architectures.get(arch).family):
        return (f"task {task.name!r} is not applicable to model.arch={arch!r}: its targets are "
                f"free text (metric {', '.join(free_text)}), which a model predicting mask "
                "slots in place cannot generate; choose a classification or regression task")
    return None


def require_applicable(arch: str, task_list: Sequence[tasks.Task]) -> None:
    """Raise a one-line `ConfigError` for the first task `not_applicable` to `arch`."""
    for task in task_list:
        reason = not_applicable(arch, task)
        if reason:
            raise ConfigError(reason)


def require_slot_decoding(arch: str, finetune: Finetune) -> None:
    """A model that predicts in place (`encoder_only`) is validated as it trains: greedily, at
    the `finetune.targets_length` mask slots after its inputs. Any other `finetune.decode`
    method or length is a one-line `ConfigError` before any work (it would stop the run at
    its first validation, or score slots it never trained on)."""
    family = architectures.get(arch).family
    if not batch_format.in_place(family):
        return
    decode = finetune.decode
    if decode.method not in decoding.methods_for(family):
        raise ConfigError(
            f"finetune.decode.method={decode.method!r} is not allowed for model.arch={arch!r}: "
            "it fills its mask slots in one forward pass; use 'greedy'")
    if decode.max_length not in (None, finetune.targets_length):
        raise ConfigError(
            f"finetune.decode.max_length={decode.max_length} is not allowed for "
            f"model.arch={arch!r}: it predicts the finetune.targets_length="
            f"{finetune.targets_length} mask slots it trains on; leave it unset")


def with_task_lengths(config: ml_collections.ConfigDict,
                      task_list: Sequence[tasks.Task]) -> ml_collections.ConfigDict:
    """`config` as a run of `task_list` reads it: itself unless `finetune.task_lengths`; with
    it, a copy whose `finetune.targets_length` is the longest of the tasks' own
    (`Task.targets_length`, T5's per-task lengths: a run of GLUE's tasks 84, of CNN/DM or a
    WMT pair 512; `finetune.targets_length` for a task without one), as T5 fine-tunes each
    task at its own length instead of cutting CNN/DM's summaries and WMT's sentences to one
    length, or padding GLUE's labels to theirs."""
    ft = config.finetune
    if not ft.task_lengths:
        return config
    resolved = copy.deepcopy(config)
    resolved.finetune.targets_length = max(task.targets_length or ft.targets_length
                                           for task in task_list)
    return resolved


def check_finetune_settings(
        config: ml_collections.ConfigDict, task_names: Sequence[str],
        field: str = "finetune.tasks") -> tuple[ml_collections.ConfigDict, list[tasks.Task]]:
    """The checks fine-tuning and evaluation share before any work: the model and `finetune`
    sections (`settings.Model`, `settings.Finetune`), the task names (`field` names them in
    the errors: `task_names` need not be `finetune.tasks`), that each task is applicable
    to the architecture and that it can decode as `finetune.decode` says
    (`require_slot_decoding`). Returns the config as a run of the tasks reads it
    (`with_task_lengths`) and the tasks."""
    model = Model.from_config(config.model)
    task_list = check_task_names(task_names, field)
    require_applicable(model.arch, task_list)
    Finetune.from_config(config.finetune)  # a missing or bad field, before it is read
    config = with_task_lengths(config, task_list)
    finetune = Finetune.from_config(config.finetune)
    require_slot_decoding(model.arch, finetune)
    if finetune.batch_size % config.train.microbatches:  # its steps split as pre-training's
        raise ConfigError(f"finetune.batch_size={finetune.batch_size} must be a multiple of "
                          f"train.microbatches={config.train.microbatches}")
    return config, task_list


def checkpoint_dir(path: str | Path) -> Path:
    """The checkpoint folder of `path`: a workdir of `train.train` / `finetune.finetune` (its
    `checkpoints/`), or that folder itself."""
    path = Path(path)
    if (path / saved_config.CHECKPOINTS_DIR / saved_config.CONFIG_FILE).exists():
        return path / saved_config.CHECKPOINTS_DIR
    if (path / saved_config.CONFIG_FILE).exists():
        return path
    held = run_folders.held_kind(path)
    if held is not None and held[0] == run_folders.SWEEP:
        raise ConfigError(f"{path} holds a sweep ({held[1]}), not a run's checkpoints: give "
                          "the folder of one of its runs (its pre-training or a fine-tuning, "
                          "each in a folder of its own below it)")
    raise ConfigError(f"{path} holds no t5x_lite checkpoints (no {saved_config.CONFIG_FILE} "
                      f"in it or in its {saved_config.CHECKPOINTS_DIR}/ folder)")


def config_from_checkpoint(config: ml_collections.ConfigDict, checkpoint: str | Path,
                           overrides: Mapping[str, Any], *,
                           keep_neutral: bool = False) -> ml_collections.ConfigDict:
    """A copy of `config` with the model and vocabulary (`PARAMETER_FIELDS`) of the config
    saved with `checkpoint` (a workdir or its `checkpoints/`): the settings that give its
    parameters their shapes and its token ids their meaning. The rest stays `config`'s.

    `overrides` are the user's ({dotted field: value}, as `config.parse_overrides` reads them,
    already applied to `config`). One of a parameter-neutral model field (dtype, attention
    kernel, dropout, remat: `saved_config.PARAMETER_NEUTRAL_FIELDS`) wins over the saved
    value; one of any other of those fields must agree with the checkpoint, else a one-line
    `ConfigError` names the field and both values. `keep_neutral` keeps `config`'s value of
    every parameter-neutral field (`finetune --init_from`: the fine-tuning's own dtype,
    kernel and dropout, as `--init_from_hf` keeps them; eval takes the run's).
    """
    directory = checkpoint_dir(checkpoint)
    path, saved = directory / saved_config.CONFIG_FILE, saved_config.read_saved_config(directory)
    arch = saved["model"].get("arch")
    if arch not in architectures.names():  # one a file registered in the run's own process
        raise ConfigError(
            f"{path} holds model.arch={arch!r}, which is not registered in this process; pass "
            "--config=FILE with the file that registers it (registered here: "
            f"{', '.join(architectures.names())})")
    saved_fields = {f"model.{name}": value for name, value in saved["model"].items()}
    saved_fields.update({field: saved["data"][field.split(".")[1]]
                         for field in PARAMETER_FIELDS if field.startswith("data.")})
    derived = copy.deepcopy(config)
    for field, value in saved_fields.items():
        if field in saved_config.PARAMETER_NEUTRAL_FIELDS and (keep_neutral or field in overrides):
            continue  # a choice that leaves the parameters alone, e.g. scoring in bfloat16
        if field in overrides and _json_value(overrides[field]) != value:
            raise ConfigError(
                f"--config.{field}={overrides[field]!r} contradicts the checkpoint's "
                f"{field}={value!r} (in {path}); the model and vocabulary are read from the "
                "checkpoint, so drop the override")
        section, name = field.split(".")
        # A field the saved config has and this version's config lacks is left to
        # `require_same`, which names it when the parameters are read.
        if name in derived[section]:
            derived[section][name] = value
    return derived


def _json_value(value: Any) -> Any:
    """`value` as it reads back from a saved config.json (tuples become lists)."""
    return json.loads(json.dumps(value))


def require_same(directory: Path, config: ml_collections.ConfigDict, fields: Sequence[str],
                 what: str) -> None:
    """Raise `ConfigError` listing the `fields` in which the config saved in `directory`
    differs from `config`."""
    saved = saved_config.read_saved_config(directory)
    differences = saved_config.config_differences(saved, saved_config.config_as_json(config),
                                                   fields)
    if differences:
        raise ConfigError(f"the checkpoints in {directory} {what}:\n  " + "\n  ".join(differences))


# ---------------------------------------------------------------------------------------------
# Evaluation


def select_examples(examples: Sequence[Any], limit: int | None, selection: str) -> list[Any]:
    """At most `limit` of `examples` (None: all), in the split's order, as
    `finetune.eval_selection` says: 'first', the first `limit`; 'sample', the `limit` whose
    indices have the smallest SHA-256 digests (a fixed sample, the same for every run, seed,
    grid point and numpy version). The first ones are not a sample of a split whose file is
    sorted by source (GLUE's STS-B dev lists 625 image-caption pairs, then forums, then news;
    TFDS prepares its splits shuffled by key hash, our local TSV tasks read files in order)."""
    if selection not in EVAL_SELECTIONS:
        raise ValueError(f"selection={selection!r} must be one of {', '.join(EVAL_SELECTIONS)}")
    if limit is None or limit >= len(examples):
        return list(examples)
    if selection == "first":
        return list(examples[:limit])
    kept = heapq.nsmallest(limit, range(len(examples)),
                           key=lambda index: hashlib.sha256(str(index).encode()).digest())
    return [examples[index] for index in sorted(kept)]


class TaskSplit:
    """One task's split as text (`examples`) and as ids (`encoded`: after UL2's paradigm
    token when `finetune.mode_token` names one, cut to `finetune.inputs_length` /
    `targets_length`; `truncated` counts the cut ones, with one warning). `limit` keeps at most
    that many examples (None: all), as `finetune.eval_selection` chooses them
    (`select_examples`)."""

    def __init__(self, task: tasks.Task, split: str, config: ml_collections.ConfigDict,
                 vocab: Vocabulary, limit: int | None = None):
        ft = config.finetune
        self.task, self.split = task, split
        self.examples = select_examples(task.examples(split, config.data.data_dir or None,
                                                      config.data.data_root or None), limit,
                                        ft.eval_selection)
        if not self.examples:
            raise ValueError(f"task {task.name!r} has no labeled {split} examples")
        unlabeled = sum(ex.targets is None for ex in self.examples)
        if unlabeled:  # a benchmark's hidden test labels: nothing to score against
            raise ConfigError(f"the {split} split of task {task.name!r} is unlabeled "
                              f"({unlabeled} of {len(self.examples)} examples have no targets); "
                              "score a labeled split, e.g. --split validation")
        encoded = pipeline.encode_examples(vocab, ((ex.inputs, ex.targets)
                                                   for ex in self.examples))
        if ft.mode_token is not None:  # UL2's mode switching: the paradigm token goes first
            needed = batch_format.MODE_TOKENS.index(ft.mode_token) + 1
            if config.model.num_sentinels < needed:  # its id would lie past the vocabulary
                raise ConfigError(f"finetune.mode_token={ft.mode_token!r} is the sentinel "
                                  f"{needed} from the end: model.num_sentinels="
                                  f"{config.model.num_sentinels} must be at least {needed}")
            token = batch_format.mode_token(ft.mode_token, config.model.vocab_size,
                                            config.model.num_sentinels)
            encoded = [([token, *inputs], targets) for inputs, targets in encoded]
        self.encoded, self.truncated = pipeline.truncate_examples(
            encoded, ft.inputs_length, ft.targets_length)
        if self.truncated:  # pipeline's batchers would warn per batch; say it once, counted
            warnings.warn(
                f"task {task.name!r} ({split}): truncated {self.truncated} of "
                f"{len(encoded)} examples to finetune.inputs_length={ft.inputs_length}, "
                f"finetune.targets_length={ft.targets_length} (EOS kept)", stacklevel=3)


class Evaluator:
    """Validation of a model of `config` on some tasks' split.

    `evaluator(params)` -> `{task: {"loss", "token_accuracy", "metrics": {name: 0-100}}}`:
    the mean teacher-forced loss and token accuracy over the targets, and the task's metrics on
    greedy (or `finetune.decode`) predictions of at most `decode.max_length` tokens (default
    `finetune.targets_length`). Batches have `finetune.batch_size` rows, one example each.

    With several processes, each feeds its contiguous rows of every batch
    (`pipeline.process_rows`) to the eval step and to decoding; the loss sums come back
    whole and the decoded tokens are gathered, so every process gets the results of one.
    """

    def __init__(self, config: ml_collections.ConfigDict, splits: Sequence[TaskSplit],
                 vocab: Vocabulary, mesh: Mesh):
        ft = config.finetune
        self.config, self.splits, self.vocab = config, list(splits), vocab
        self.max_length = ft.decode.max_length or ft.targets_length
        self.eval_step = train_step.make_eval_step(config, mesh)
        self.graphdef = train_state.model_graphdef(config)
        self.rows = partitioning.batch_sharding(mesh,
                                                partitioning.normalize_rules(config.mesh.rules))
        family = architectures.get(config.model.arch).family
        lengths = (ft.batch_size, ft.inputs_length, ft.targets_length)
        share = (jax.process_index(), jax.process_count())
        mask_token = batch_format.mask_token(config.model.vocab_size)
        self.batches = [[pipeline.process_rows(b, *share) for b in pipeline.pad_examples(
                            s.encoded, *lengths, family=family, mask_token=mask_token)]
                        for s in self.splits]
        # Decoding reads the inputs alone, in the encoder layout for every architecture.
        self.inputs = [[pipeline.process_rows(b, *share)["encoder_input_tokens"]
                        for b in pipeline.pad_examples(s.encoded, *lengths)]
                       for s in self.splits]

    def __call__(self, params: nnx.State) -> dict[str, dict[str, Any]]:
        model = nnx.merge(self.graphdef, params)
        results = {}
        for split, batches, inputs in zip(self.splits, self.batches, self.inputs):
            predictions = self.predict(model, inputs)[: len(split.examples)]
            results[split.task.name] = {
                **train_step.teacher_forced(self.eval_step, params, batches),
                "metrics": split.task.score(split.examples, predictions),
            }
        return results

    def predict(self, model: nnx.Module, inputs: Sequence[np.ndarray]) -> list[str]:
        """Decoded text of every row of every global inputs batch (padding rows included),
        from this process's rows of each ([rows / process_count, inputs_length])."""
        settings = self.config.finetune.decode
        # Sampling draws with train.seed's key, one fold per batch: the same predictions each
        # time a checkpoint is scored (it passed no key, and failed at the first validation).
        sample_key = jax.random.key(self.config.train.seed)
        texts = []
        for index, batch in enumerate(inputs):
            global_shape = (len(batch) * jax.process_count(), *batch.shape[1:])
            whole = programs.global_rows(batch, self.rows, global_shape, "encoder_input_tokens")
            result = decoding.decode(model, whole, max_length=self.max_length,
                                     arch=self.config.model.arch, method=settings.method,
                                     num_beams=settings.num_beams, alpha=settings.alpha,
                                     rng=jax.random.fold_in(sample_key, index))
            # Every process needs all rows: the task's metrics read every prediction.
            tokens = multihost_utils.process_allgather(result.tokens, tiled=True)
            texts.extend(self.vocab.decode(row) for row in tokens)
        return texts


def params_of(config: ml_collections.ConfigDict, source: Any, mesh: Mesh) -> nnx.State:
    """Parameters from a checkpoint folder (path), an `nnx.Module` (e.g. `convert.from_hf_t5`'s)
    or an `nnx.State` of parameters."""
    if isinstance(source, (str, Path)):
        directory = checkpoint_dir(source)
        require_same(directory, config, PARAMETER_FIELDS, "hold another model or vocabulary")
        abstract = train_state.abstract_state(config, mesh).params
        parts, step = checkpointing.restore_parts(directory, {"params": abstract})
        # Which of the run's steps is read, and whether its run had finished: the newest
        # readable one, which a preempted run or a damaged newest save leaves short.
        print(f"read the parameters of {directory} at step {step}", file=sys.stderr,
              flush=True)
        total = checkpointing.unfinished_steps(directory, step)
        if total is not None:
            warnings.warn(f"{directory} is at step {step} of its {total}: its run has not "
                          "finished", stacklevel=2)
        return parts["params"]
    if isinstance(source, nnx.Module):
        return nnx.state(source, nnx.Param)
    if isinstance(source, nnx.State):
        return source
    raise TypeError(f"params_or_checkpoint must be a checkpoint path, an nnx.Module or an "
                    f"nnx.State of parameters, got {type(source).__name__}")


def evaluate(config: ml_collections.ConfigDict, params_or_checkpoint: Any,
             task_names: Sequence[str], split: str = "validation") -> dict[str, dict[str, float]]:
    """The task metrics (0-100) of a model of `config` on `split` of each task.

    params_or_checkpoint: a checkpoint folder (a `train` / `finetune` workdir or its
    `checkpoints/`; its model and vocabulary must be `config`'s), a model (`nnx.Module`, e.g.
    the one `convert.from_hf_t5` returns with its config) or its `nnx.State` of parameters.
    Decoding follows `config.finetune.decode`; lengths and batch size are `config.finetune`'s;
    at most `finetune.eval_examples` examples per task.
    """
    config, task_list = check_finetune_settings(config, task_names, "tasks")
    mesh, vocab, splits = scoring_set_up(config, task_list, split)
    params = params_of(config, params_or_checkpoint, mesh)
    evaluator = Evaluator(config, splits, vocab, mesh)
    with scoring_note(splits, f"decoding at most {evaluator.max_length} tokens each"):
        results = evaluator(params)
    return {name: result["metrics"] for name, result in results.items()}


def scoring_set_up(config: ml_collections.ConfigDict, task_list: Sequence[tasks.Task],
                   split: str) -> tuple[Any, Vocabulary, list[TaskSplit]]:
    """(mesh, vocabulary, each task's `split` as a `TaskSplit`) that `evaluate` and
    `zero_shot.evaluate` score, read before the parameters: a bad batch split or an unlabeled
    split is a one-line error before a checkpoint is read."""
    mesh = partitioning.make_mesh(config.mesh)
    # Fine-tuning checks its batch split in the run set-up; evaluation has no micro-batches.
    partitioning.validate_batch_split(config.finetune.batch_size, 1, mesh,
                                      partitioning.normalize_rules(config.mesh.rules),
                                      "finetune.batch_size")
    vocab = pipeline.vocabulary_from_config(config)
    return mesh, vocab, [TaskSplit(task, split, config, vocab, config.finetune.eval_examples)
                         for task in task_list]


@contextlib.contextmanager
def scoring_note(splits: Sequence[TaskSplit], how: str) -> Iterator[None]:
    """Say on stderr what is scored before it starts and how long it took: decoding every
    example takes minutes on a CPU (hours at the paper's size), with nothing else to show."""
    examples = sum(len(task_split.examples) for task_split in splits)
    print(f"scoring {examples} examples of {', '.join(s.task.name for s in splits)} ({how})",
          file=sys.stderr, flush=True)
    started = time.perf_counter()
    yield
    print(f"scored in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
