"""Zero-shot scoring: classify with a model that was never fine-tuned, by ranking each task's
label options by their log-likelihood (Wang et al. 2022, arXiv 2204.05832, "What language
model architecture and pretraining objective work best for zero-shot generalization?").

    evaluate(config, params | checkpoint dir | nnx.Module, tasks) -> {task: metrics}
    t5x-lite eval --zero_shot --checkpoint RUN --tasks builtin_module    (the same, `scorable`)
    ZeroShotScorer(config, splits, vocab, mesh)(params) -> {task: metrics}

For every validation example of a classification task (`Task.label_options`, its label words)
and every option, the row (the example's inputs, the option + EOS) is scored by
`decoding.score`: the **summed** log-likelihood of the option's tokens, EOS included, with no
length normalisation. The sum is the log-probability the model gives the whole option string,
so the argmax is the option the model itself would most likely produce; Wang et al. rank by
log-likelihood, and dividing by the length would favour long options whose later tokens
follow from their first (`not_entailment` after `not`). The EOS term says that the answer
ends there. The prediction is the best option (the first of equals), scored by the task's own
metrics (`Task.score`), so the numbers compare with the fine-tuned ones. Summed, a weak
model's likelihoods favour the option of fewest tokens whatever the input (GLUE's
`equivalent` is 1 piece of the demo vocabulary, `not_equivalent` 8), which scores what
always predicting it scores: `rank` says how often the most predicted option was predicted
and what the best such constant prediction scores (`Ranking`), and the report shows both.

Every architecture scores the rows fine-tuning trains on (`data.pipeline.pad_examples`):
encoder-decoders the option as decoder targets, decoder-only models (causal or prefix LM) the
option after the inputs, and `encoder_only` the option at the first of the
`finetune.targets_length` mask slots after the inputs (each slot predicted from the inputs and
the masks, the masked LM's own likelihood of a filled-in answer). Tasks without label options
(free text, STS-B's numbers) have no zero-shot score (`not_applicable`). The rows are the same
whatever the objective a model pre-trained on: a GLM model (`blank_infilling`), which saw
blanks marked in its inputs and spans ended by [END], is scored on the option as a
continuation ended by EOS, not as GLM's own scoring puts it (a [MASK] in the input, the answer
after [START], ended by [END]): a format it never saw, which cost a 200-step demo model about 7
nats per option (reviewer's measurement), so its zero-shot scores are not GLM's protocol.
`finetune.mode_token` puts UL2's paradigm token before a UL2 model's inputs.

Rows are batched `finetune.batch_size` at a time (the last batch padded), lengths are
`finetune.inputs_length` / `targets_length` and at most `finetune.eval_examples` examples of
each task are scored, as validation does; every batch has one shape, so `decoding.score`
compiles once per architecture and shapes. With several processes each feeds its contiguous
rows of every batch and gets every row's score back, as `evaluation.Evaluator` does.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Any, Sequence

import jax
import ml_collections
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from t5x_lite import architectures, batch_format, decoding, partitioning, programs, train_state
from t5x_lite.config import EOS_ID, ConfigError
from t5x_lite.data import pipeline, tasks
from t5x_lite.data.vocabulary import Vocabulary
from t5x_lite.evaluation import (TaskSplit, check_task_names, params_of, scoring_note,
                                 scoring_set_up, with_task_lengths)
from t5x_lite.settings import Finetune, Model


def not_applicable(task: tasks.Task) -> str | None:
    """Why `task` has no zero-shot score, or None if it has one: it needs label options."""
    if task.label_options:
        return None
    return (f"task {task.name!r} has no label options to rank (its targets are free text or "
            "numbers); zero-shot scoring needs a classification task")


def require_label_options(task_list: Sequence[tasks.Task], field: str) -> None:
    """Raise a one-line `ConfigError` naming `field` for the first task without label options."""
    for task in task_list:
        reason = not_applicable(task)
        if reason:
            raise ConfigError(f"{field}: {reason}")


def scorable(task_names: Sequence[str], field: str = "tasks") -> tuple[list[str], list[str]]:
    """(the names of `task_names` that have label options, the reason each other one has no
    zero-shot score), for `t5x-lite eval --zero_shot`, which scores the first and skips the
    others with a note, as a zero-shot sweep records them `not_applicable`. An unknown task,
    or none with label options, is a one-line `ConfigError` naming `field`."""
    task_list = check_task_names(task_names, field)
    verdicts = [(task.name, not_applicable(task)) for task in task_list]
    reasons = [reason for _, reason in verdicts if reason]
    if len(reasons) == len(task_list):
        raise ConfigError(f"{field}={list(task_names)} has no task with label options "
                          f"(Task.label_options) to rank zero-shot: {'; '.join(reasons)}")
    return [name for name, reason in verdicts if not reason], reasons


@dataclasses.dataclass(frozen=True)
class Ranking:
    """One task's ranked predictions, scored: its `metrics` (0-100), the share of examples
    given the option predicted most often, and per metric the best score of predicting one
    option for every example (the score a model ignoring its inputs can reach)."""

    metrics: dict[str, float]
    most_predicted_share: float
    constant_metrics: dict[str, float]

    def entry(self) -> dict[str, Any]:
        """The fields a sweep's record keeps of it (with "status" and "error")."""
        return dataclasses.asdict(self)


def constant_metrics(task: tasks.Task, examples: Sequence[Any]) -> dict[str, float]:
    """Per metric of `task`, the best score over its label options of predicting that option
    for every one of `examples`."""
    scores = [task.score(examples, [option] * len(examples)) for option in task.label_options]
    return {metric: max(score[metric] for score in scores) for metric in scores[0]}


class ZeroShotScorer:
    """Zero-shot scores of a model of `config` on some classification tasks' split.

    `scorer(params)` -> `{task: {metric: 0-100}}`: the task's metrics on the best-ranked
    option of every example (see the module docstring). `splits` are `evaluation.TaskSplit`s
    of tasks with label options; an option longer than `finetune.targets_length` (EOS
    included) is a `ConfigError` naming that field, since a cut option would be scored as
    another string.
    """

    def __init__(self, config: ml_collections.ConfigDict, splits: Sequence[TaskSplit],
                 vocab: Vocabulary, mesh: Mesh):
        ft = config.finetune
        require_label_options([split.task for split in splits], "tasks")
        self.arch, self.splits = config.model.arch, list(splits)
        self.graphdef = train_state.model_graphdef(config)
        self.rows = partitioning.batch_sharding(mesh,
                                                partitioning.normalize_rules(config.mesh.rules))
        family = architectures.get(self.arch).family
        share = (jax.process_index(), jax.process_count())
        self.batches = []
        for split in self.splits:
            options = [ids + [EOS_ID] for ids in vocab.encode_batch(split.task.label_options)]
            longest = max(len(ids) for ids in options)
            if longest > ft.targets_length:
                raise ConfigError(
                    f"finetune.targets_length={ft.targets_length} is too short for task "
                    f"{split.task.name!r}'s label options (the longest is {longest} tokens "
                    f"with EOS); set it to at least {longest}")
            # Example-major: the rows of example i are i * K ... i * K + K - 1.
            pairs = [(inputs, option) for inputs, _ in split.encoded for option in options]
            self.batches.append([pipeline.process_rows(batch, *share) for batch in
                                 pipeline.pad_examples(
                                     pairs, ft.batch_size, ft.inputs_length, ft.targets_length,
                                     family=family,
                                     mask_token=batch_format.mask_token(config.model.vocab_size))])

    def log_likelihoods(self, params: nnx.State) -> list[np.ndarray]:
        """float32 `[examples, options]` per split: each option's summed log-likelihood."""
        model = nnx.merge(self.graphdef, params)
        out = []
        for split, batches in zip(self.splits, self.batches):
            scores = []
            for batch in batches:
                whole = {name: programs.global_rows(
                             value, self.rows, (len(value) * jax.process_count(),
                                                *value.shape[1:]), name)
                         for name, value in batch.items()}
                scores.append(decoding.score(model, whole, arch=self.arch))
            count, options = len(split.encoded), len(split.task.label_options)
            out.append(np.concatenate(scores)[:count * options].reshape(count, options))
        return out

    def rank(self, params: nnx.State) -> dict[str, Ranking]:
        """`{task: Ranking}` of the best-ranked option of every example."""
        results = {}
        for split, likelihoods in zip(self.splits, self.log_likelihoods(params)):
            options = split.task.label_options
            predictions = [options[best] for best in np.argmax(likelihoods, axis=1)]
            most = collections.Counter(predictions).most_common(1)[0][1]
            results[split.task.name] = Ranking(
                split.task.score(split.examples, predictions), most / len(predictions),
                constant_metrics(split.task, split.examples))
        return results

    def __call__(self, params: nnx.State) -> dict[str, dict[str, float]]:
        return {task: ranking.metrics for task, ranking in self.rank(params).items()}


def evaluate(config: ml_collections.ConfigDict, params_or_checkpoint: object,
             task_names: Sequence[str], split: str = "validation") -> dict[str, dict[str, float]]:
    """The zero-shot task metrics (0-100) of a model of `config` on `split` of each task
    (`rank`'s metrics)."""
    return {task: ranking.metrics
            for task, ranking in rank(config, params_or_checkpoint, task_names, split).items()}


def rank(config: ml_collections.ConfigDict, params_or_checkpoint: object,
         task_names: Sequence[str], split: str = "validation") -> dict[str, Ranking]:
    """`{task: Ranking}` of a model of `config` on `split` of each task.

    params_or_checkpoint: as `evaluation.evaluate` takes it (a checkpoint folder, an
    `nnx.Module` or its `nnx.State` of parameters). A task without label options, an unknown
    task or a bad `model` / `finetune` field is a one-line `ConfigError` before any work.
    """
    Model.from_config(config.model)
    task_list = check_task_names(task_names, "tasks")
    require_label_options(task_list, "tasks")
    Finetune.from_config(config.finetune)  # a missing or bad field, before it is read
    config = with_task_lengths(config, task_list)
    mesh, vocab, splits = scoring_set_up(config, task_list, split)
    scorer = ZeroShotScorer(config, splits, vocab, mesh)  # checks the options' lengths
    params = params_of(config, params_or_checkpoint, mesh)
    with scoring_note(splits, "zero-shot: ranking each task's label options"):
        return scorer.rank(params)
