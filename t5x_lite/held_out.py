"""Held-out pre-training evaluation: the objective's loss on corpus chunks the run never trains on.

    train.eval_every > 0:  every eval_every steps and at the last step,
        held-out raw chunks --objective, fixed key--> batches (made once)
        --train_step.make_eval_step (no dropout)--> loss, token accuracy -> workdir/eval.jsonl

The training loss of a step is one batch's, measured before that batch's update, and it moves
with the batch; held-out text scored the same way at every evaluation is the number to compare
runs by (nanoGPT's val loss, T5X's eval on the corpus's validation split).

Which text: the last `train.eval_batches` global batches of chunks in the first epoch's order
of the run's data (`pipeline.PretrainData.held_out_batch`). Training reads that order from its
start, so a run that stops short of them never sees them (`HeldOut` refuses one that would not,
before any step), and switching the evaluation on or off changes no training batch, so no
result of the run. The order is drawn from `train.seed`, so runs of one seed share their
held-out text, whatever their architecture. The chunks are held out, not their text: a corpus
that repeats text has it on both sides (python_docs repeats docstrings: in a 196-step run of
raw length 128, 27 of 64 held-out chunks share a 32-token span with training chunks, 6 are
identical to one); the English wiki samples hold distinct documents, but a document spans
several chunks, so most held-out chunks are parts of documents whose other parts are trained
on (at the `cpu` preset, 54 of 128 held-out chunks share an article with the chunks its
700-step run trains on: reviewer's count). T5X scores C4's validation split, other documents
altogether; this loss compares runs that saw the same documents, and favours memorising them
a little.

Which noise: the chunks are corrupted once by the run's objective (its rate and span length),
with a key of their own (`train_state.held_out_key`, fixed per seed and batch), so every
evaluation of a run, and every run of one seed and objective, scores the same examples. The
loss is therefore the objective's own: it compares architectures within one objective, and
one run over time, not one objective with another. Which runs scored the same examples is
recorded, not assumed: every evaluation carries `examples_fingerprint` of its batches, and the
report compares (bolds) held-out losses only among rows whose fingerprints agree seed by seed.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import jax
import ml_collections
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from t5x_lite import batch_format, objectives, train_state, train_step
from t5x_lite.config import ConfigError
from t5x_lite.loop import EVAL_FILE, EvalLog, Every, Run

if TYPE_CHECKING:  # the pipeline pulls in TFDS, which is imported only once data is read
    from t5x_lite.data.pipeline import PretrainData

HELD_OUT = "held_out"  # the task name of the held-out records in eval.jsonl


def examples_fingerprint(family: str, batches: Sequence[dict[str, np.ndarray]]) -> str:
    """12 hex digits that name what the held-out `batches` (global numpy rows of `family`) ask
    of a model: per example, its inputs, its targets (`batch_format.inputs_and_targets`) and
    whether it bears loss (one that overflowed the layout bears none). Runs of different batch
    families that score the same examples (an encoder-decoder and a prefix LM on one seed and
    objective) share it; a different seed, objective, rate, span length, corpus or vocabulary
    changes it, and so does a family whose targets differ (`encoder_only` predicts the noise
    positions only)."""
    _, weights_key = batch_format.loss_keys(family)
    digest = hashlib.sha256()
    for batch in batches:
        for index in range(len(batch[weights_key])):
            row = {key: value[index] for key, value in batch.items()}
            inputs, targets = batch_format.inputs_and_targets(family, row)
            digest.update(json.dumps([inputs, targets, bool(row[weights_key].any())]).encode())
    return digest.hexdigest()[:12]


def require_room(config: ml_collections.ConfigDict, layout: objectives.BatchLayout,
                 data: PretrainData, steps: int) -> None:
    """A one-line `ConfigError` unless a run of `config` training `steps` steps on `data` stays
    short of its held-out chunks (naming train.steps, train.eval_batches and the corpus's
    size). `train.train` asks before the run writes anything; `HeldOut` again."""
    if steps > data.steps_before_held_out:
        train = config.train
        raise ConfigError(
            f"train.steps={steps} x train.batch_size={train.batch_size} chunks and "
            f"train.eval_batches={train.eval_batches} held-out batches need more than the "
            f"corpus's {data.num_chunks} chunks of {layout.raw_length} tokens (the held-out "
            f"text must be text the run never trains on): at most "
            f"{data.steps_before_held_out} steps, fewer eval_batches, train.eval_every=0 "
            "or a larger data.corpus")


class HeldOut:
    """`held_out(params) -> {"loss", "token_accuracy"}` of one run on its held-out batches,
    whose `examples_fingerprint` is `examples`.

    data: the run's `pipeline.PretrainData`, made with `train.eval_batches` held-out batches;
    steps: the run's last step, which must stay short of the held-out chunks (else a one-line
    `ConfigError` naming train.steps, train.eval_batches and the corpus's size).
    """

    def __init__(self, config: ml_collections.ConfigDict, layout: objectives.BatchLayout,
                 data: PretrainData, mesh: Mesh, steps: int):
        from t5x_lite.data import pipeline

        train = config.train
        require_room(config, layout, data, steps)
        spec = objectives.spec_from_config(config.objective)
        # On the host's CPU, the same in every process; each then feeds its rows, as in training.
        with jax.default_device(jax.local_devices(backend="cpu")[0]):
            batches = [jax.device_get(objectives.jitted_corrupt_with_details(
                           data.held_out_batch(index), spec,
                           train_state.held_out_key(train.seed, index), layout)[0])
                       for index in range(data.held_out_batches)]
        batches = [{name: np.asarray(value) for name, value in batch.items()}
                   for batch in batches]
        self.examples = examples_fingerprint(layout.family, batches)
        self.batches = [pipeline.process_rows(batch, jax.process_index(), jax.process_count())
                        for batch in batches]
        self.eval_step = train_step.make_eval_step(config, mesh)

    def __call__(self, params: nnx.State) -> dict[str, float]:
        return train_step.teacher_forced(self.eval_step, params, self.batches)


def validation(run: Run, configs: Sequence[ml_collections.ConfigDict],
               layout: objectives.BatchLayout, sources: Sequence[PretrainData]
               ) -> Every | None:
    """`run_loop`'s hook for a pre-training run of `configs` (one per point) reading
    `sources` (one `PretrainData` per point): every `train.eval_every` steps and at the run's
    last step, each point's held-out loss appended to its workdir's eval.jsonl (`EvalLog`) and
    shown with the progress (`Progress.note`); None when `train.eval_every` is 0 (no
    evaluation) or the run has no step left. A run with no step left whose eval.jsonl lacks
    its last step's held-out loss (one that finished before the evaluation was switched on)
    is evaluated here, once: its final model (at the step it holds), as if it had been on.
    Either way each point's eval.jsonl is first cut back to the run's state (`EvalLog`), so a
    restarted or resumed run never reports a held-out loss of a trajectory it replaced."""
    logs = [EvalLog(point.workdir, run.start) for point in run.points]
    every = configs[0].train.eval_every
    if not every:
        return None
    finished = run.start >= run.total
    last = run.start if finished else run.total  # a finished run's state is at its start
    points = [index for index, log in enumerate(logs) if not finished or not any(
        record["task"] == HELD_OUT and record["step"] == last for record in log.records)]
    evaluators = {index: HeldOut(configs[index], layout, sources[index], run.mesh, last)
                  for index in points}
    for index, evaluator in evaluators.items():
        other = [record["step"] for record in logs[index].records if record["task"] == HELD_OUT
                 and record.get("examples") not in (None, evaluator.examples)]
        if other:
            warnings.warn(f"{run.points[index].workdir}: its held-out losses of steps "
                          f"{other[0]}-{other[-1]} scored other examples than it scores now "
                          "(train.eval_batches changed since?), so its held-out curve mixes "
                          "two sets of examples", stacklevel=2)

    def evaluate(step: int) -> None:
        results = {index: score(run.point_state(index).params)
                   for index, score in evaluators.items()}
        for index, result in results.items():
            logs[index].add(step, {HELD_OUT: {**result, "examples": evaluators[index].examples,
                                              "metrics": {}}})
        shown = ", ".join(f"{result['loss']:.4f}" for result in results.values())
        run.progress.note(f"step {step}/{run.total} held-out loss {shown}")

    if not finished:  # the hook reads each point's state from the run (`Run.point_state`)
        return Every(every, lambda step, state: evaluate(step))
    if points:
        evaluate(last)
    return None


def scores_of(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The record fields of a run's held-out evaluations `records` (its eval.jsonl's, in step
    order): `held_out_loss` and `held_out_token_accuracy` (%) of the last one, the
    `held_out_examples` it scored (`examples_fingerprint`) and `held_out_curve`, [[step, loss],
    ...] of every one; with none (no held-out evaluation), None, None, None and []."""
    last = records[-1] if records else {}
    return {"held_out_loss": last.get("loss"),
            "held_out_token_accuracy": last.get("token_accuracy"),
            "held_out_examples": last.get("examples"),
            "held_out_curve": [[record["step"], record["loss"]] for record in records]}


def last_scores(workdir: Path) -> dict[str, Any]:
    """`scores_of` the held-out evaluations of the pre-training run in `workdir`, read from its
    eval.jsonl (EvalLog keeps one trajectory, a resumed run dropping later steps, so they come
    in step order)."""
    path = Path(workdir) / EVAL_FILE
    return scores_of([record for record in map(json.loads, path.read_text().splitlines())
                      if record["task"] == HELD_OUT] if path.exists() else [])
