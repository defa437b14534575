"""Pre-training: one config (`train`), or K compatible grid points in one vmapped step
(`train_vmapped`).

Both describe the run to the one run set-up (`run_setup.RunPlan`: the pipeline's step-indexed
raw tokens, the pre-training step of `t5x_lite.train_step` that corrupts them on the device,
and the objective spec and step key it takes as data) and run `loop.run_loop` over it: one
record per step in `workdir/metrics.jsonl` (and TensorBoard events), checkpoints every
`checkpoint.every` steps and at the end, and on preemption a save, then
`preemption.Preempted`. Fine-tuning (`t5x_lite.finetune`) is the other kind of run of that
set-up.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from t5x_lite import held_out, objectives, run_folders
from t5x_lite.loop import run_loop, summaries
from t5x_lite.run_setup import RunPlan, set_up
from t5x_lite.settings import require_run_steps
from t5x_lite.train_state import init_state, state_from_params, step_key
from t5x_lite.train_step import (TrainStep, make_train_step, make_vmapped_train_step,
                                 stack_specs)


class _RawBatches:
    """The step-indexed raw tokens of K points (one but for a vmapped run): `batch(step)`,
    stacked on a leading [K] axis for a vmapped run; `sources`, each point's
    `pipeline.PretrainData` (its held-out batches too)."""

    def __init__(self, sources: Sequence[Any], vmapped: bool):
        self.sources, self.vmapped = list(sources), vmapped

    def batch(self, step: int) -> np.ndarray:
        if not self.vmapped:
            return self.sources[0].batch(step)
        return np.stack([source.batch(step) for source in self.sources])


def _pretrain_plan(configs: Sequence[ml_collections.ConfigDict],
                   workdirs: Sequence[str | os.PathLike], layout: objectives.BatchLayout,
                   vmapped: bool, init_params: nnx.State | None = None,
                   steps: int | None = None) -> tuple[RunPlan, objectives.BatchLayout]:
    """Pre-training `configs` (one, or K vmapped points) into `workdirs`, batches in `layout`,
    from `init_params` (one point) or from each config's seed, up to `steps` (None: each
    config's train.steps; the held-out text's room is checked for it before anything is
    written); and the layout bound to the run's vocabulary if it reads sentences (else
    `layout`). Each point's checkpoints must hold its examples' layout record
    (`objective_layout.layout_record`) to train on (`Checkpointer.require_same_examples`)."""
    configs = list(configs)
    for workdir in workdirs:
        run_folders.require_kind(workdir, run_folders.PRE_TRAINING)
    for config in configs:
        layout.require_objective(config.objective.name)
        if steps is not None:
            require_run_steps(steps, config.train.schedule, config.train.steps)
    if layout.reads_sentences:  # the points of a vmapped group share their data (`vmap_group_key`)
        from t5x_lite.data.pipeline import layout_with_vocabulary

        layout = layout_with_vocabulary(layout, configs[0])
    specs = [objectives.spec_from_config(config.objective) for config in configs]
    keys = [step_key(config.train.seed) for config in configs]

    def make_data() -> _RawBatches:
        # Imported here: the pipeline pulls in TFDS, which the train step alone does not need.
        from t5x_lite.data.pipeline import describe_corpus, pretrain_data_from_config

        print(f"pre-training corpus: {describe_corpus(configs[0])}", file=sys.stderr, flush=True)
        sources = [pretrain_data_from_config(config, layout.raw_length, jax.process_index(),
                                             jax.process_count())[1] for config in configs]
        for config, source in zip(configs, sources):
            if config.train.eval_every:  # before the run writes (or --restart deletes) anything
                held_out.require_room(config, layout, source, steps or config.train.steps)
        passes = sources[0].passes(steps or configs[0].train.steps)
        if passes > 1:  # the `small` preset reads the shared sample some 200 times: say so
            print(f"pre-training reads the corpus {passes:.1f} times ({sources[0].num_chunks} "
                  f"chunks of at most {layout.raw_length} tokens)", file=sys.stderr, flush=True)
        return _RawBatches(sources, vmapped)

    def make_step(mesh: jax.sharding.Mesh) -> TrainStep:
        if vmapped:
            return make_vmapped_train_step(configs, layout, mesh)
        return make_train_step(configs[0], layout, mesh)

    return RunPlan(
        configs=configs, workdirs=[Path(workdir) for workdir in workdirs], make_data=make_data,
        make_step=make_step,
        step_args=(stack_specs(specs), jnp.stack(keys)) if vmapped else (specs[0], keys[0]),
        lengths=(layout.inputs_length, layout.targets_length), vmapped=vmapped,
        fresh_state=init_state if init_params is None else (
            lambda point, mesh: state_from_params(point, mesh, init_params)),
        batch_layouts=[objectives.layout_record(layout, config.objective, config.model.arch)
                       for config in configs]
    ), layout


def _run(plan: RunPlan, layout: objectives.BatchLayout, **options: Any) -> list[dict[str, Any]]:
    """Set up `plan` (`set_up(plan, **options)`), loop over it with the held-out evaluation
    its configs ask for (`held_out.validation`), and summarise each point (with its latest
    held-out scores, `held_out.last_scores`)."""
    with set_up(plan, **options) as run:
        records = run_loop(run, held_out.validation(run, plan.configs, layout,
                                                    run.data.sources))
    return [{**summary, **held_out.last_scores(summary["workdir"])}
            for summary in summaries(run, records)]


def train(
    config: ml_collections.ConfigDict,
    workdir: str | os.PathLike,
    *,
    steps: int | None = None,
    progress: bool = True,
    restart: bool = False,
    resume: bool = False,
    layout: objectives.BatchLayout | None = None,
    init_params: nnx.State | None = None,
) -> dict[str, Any]:
    """Pre-train `config` in `workdir` up to `steps` updates (default `config.train.steps`).

    `layout` defaults to `objectives.layout_from_config(config)`; a sweep passes the layout of
    its whole grid, so that every run of an architecture family shares one compiled program.
    `init_params` (e.g. `convert.with_hf_t5`'s) start a run without a checkpoint, with a fresh
    optimiser state, instead of `train.seed`'s random parameters: continued pre-training.

    Resumes from `workdir/checkpoints` when it holds a checkpoint of a compatible config
    (`restart=True` wipes them; `resume=True` makes a missing checkpoint an error). The data
    position is a function of the step, so the checkpoint is all a resume needs. Appends one
    record per step to `workdir/metrics.jsonl`, and with `train.eval_every` > 0 the held-out
    loss to `workdir/eval.jsonl` (`t5x_lite.held_out`); saves every `config.checkpoint.every`
    steps and at the end. Returns a summary of the run (`loop.summarize`, with
    `held_out.last_scores`). On SIGTERM / SIGINT it saves the step reached and raises
    `preemption.Preempted` (its exit status, unless caught).
    """
    layout = objectives.layout_from_config(config) if layout is None else layout
    plan, layout = _pretrain_plan([config], [workdir], layout, vmapped=False,
                                  init_params=init_params, steps=steps)
    return _run(plan, layout, steps=steps, progress=progress, restart=restart,
                require_existing=resume)[0]


def train_vmapped(
    configs: Sequence[ml_collections.ConfigDict],
    workdirs: Sequence[str | os.PathLike],
    *,
    layout: objectives.BatchLayout,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Pre-train K points together: one `jax.vmap`-ed step (`make_vmapped_train_step`) per
    update, over their stacked states, specs and step keys, to `train.steps`.

    configs: K configs that agree under `vmap_group_key`; workdirs: one per point, each laid
    out as `train`'s (checkpoints/, metrics.jsonl), so a point can be fine-tuned from
    (`finetune.finetune(init_from=...)`) or continued like a run of its own. Point k's
    initial parameters, data and step keys are those of `train(configs[k], ...)`: its first
    step's loss is that run's to the bit, later ones differ by rounding that training
    amplifies (the vmapped program reduces in another order; about 1e-5 relative in loss over
    tens of steps at `tiny`), not bit-identical. The speed fields of the records (tokens/s,
    MFU, step_s) are the whole step's, all K points together.

    Resume: the points resume from their checkpoints when all hold the same newest step;
    otherwise (a crash between the points' saves, or runs started apart) they all restart
    from step 0 and their checkpoints are deleted. Returns one `train`-style summary per point.
    """
    plan, layout = _pretrain_plan(configs, workdirs, layout, vmapped=True)
    return _run(plan, layout, progress=progress)
