"""The one run set-up: pre-training, vmapped pre-training and fine-tuning all start here.

    RunPlan (what a kind of run brings: configs, workdirs, data, step, step arguments, lengths)
      --set_up--> settings -> mesh -> batch split -> preemption watch -> data
                  -> checkpointers -> step -> restore or initialise -> metrics writers
                  -> progress
      --> loop.Run --loop.run_loop--> records

`train.train` (one point), `train.train_vmapped` (K points in one vmapped step) and
`finetune.finetune` each describe their run as a `RunPlan` and loop over what `set_up` yields.
A run has K points (one, but for a vmapped run), each with its own config, workdir,
checkpoints and metrics, all trained by one compiled step; a check, a restore policy or a file
every run writes is added here once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import ml_collections
from jax.sharding import Mesh

from t5x_lite import attention, partitioning, train_step
from t5x_lite.checkpointing import Checkpointer
from t5x_lite.config import ConfigError
from t5x_lite.errors import CheckpointsUnreadable
from t5x_lite.loop import MetricsWriter, Point, PreemptionWatch, Progress, Run, Throughput
from t5x_lite.saved_config import CHECKPOINTS_DIR, RESUME_FIELDS
from t5x_lite.settings import Settings, require_trainable
from t5x_lite.train_state import TrainState, abstract_state, init_state, stack_states
from t5x_lite.train_step import FinetuneStep, TrainStep, require_one_group


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """What a kind of run brings to `set_up`; everything else is the same for every run.

    configs / workdirs: the points, one config and workdir each (one point but for a vmapped
    run). A config is the one the step compiles and the checkpoints are checked against
    (fine-tuning's carries its optimiser, batch size and steps in `train`).
    make_data: () -> the step-indexed data, `data.batch(step)` -> the step's data argument;
    called once the checks passed.
    make_step: mesh -> the compiled step, called `step(state, data, *step_args)`.
    step_args: the step's arguments after its data (pre-training: objective spec and step
    key; fine-tuning: the step key), with a leading [K] axis for a vmapped run.
    lengths: (inputs, targets) positions of one example, for the throughput.
    fresh_state: (config, mesh) -> the state a point without a checkpoint starts from.
    vmapped: the points train in one `jax.vmap`-ed step (their state stacked on a [K] axis).
    batch_field: the config field the batch size is set by, named in the errors.
    resume_fields: the config fields a point's checkpoints must share with its config.
    batch_layouts: pre-training: what each point's examples read
    (`objective_layout.layout_record`), which its checkpoints must share too (`Checkpointer`'s
    `batch_layout`); None for fine-tuning.
    """

    configs: Sequence[ml_collections.ConfigDict]
    workdirs: Sequence[Path]
    make_data: Callable[[], Any]
    make_step: Callable[[Mesh], TrainStep | FinetuneStep]
    step_args: tuple
    lengths: tuple[int, int]
    fresh_state: Callable[[ml_collections.ConfigDict, Mesh], TrainState] = init_state
    vmapped: bool = False
    batch_field: str = "train.batch_size"
    resume_fields: Sequence[str] = RESUME_FIELDS
    batch_layouts: Sequence[dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if len(self.workdirs) != len(self.configs):
            raise ConfigError(f"got {len(self.configs)} configs but {len(self.workdirs)} "
                              "workdirs; give one workdir per config")
        if self.batch_layouts is not None and len(self.batch_layouts) != len(self.configs):
            raise ValueError(f"got {len(self.configs)} configs but {len(self.batch_layouts)} "
                             "batch layouts")
        if self.vmapped:
            require_one_group(self.configs)  # before any folder is touched
        elif len(self.configs) != 1:
            raise ValueError(f"got {len(self.configs)} configs for a run that is not vmapped; "
                             "only a vmapped run trains several points")


def _checkpointer(plan: RunPlan, index: int, **options: bool) -> Checkpointer:
    """The checkpoints of the plan's point `index`."""
    config = plan.configs[index]
    return Checkpointer(plan.workdirs[index] / CHECKPOINTS_DIR, every=config.checkpoint.every,
                        keep=config.checkpoint.keep, config=config,
                        resume_fields=plan.resume_fields,
                        batch_layout=None if plan.batch_layouts is None
                        else plan.batch_layouts[index], **options)


def _newest_steps_agree(plan: RunPlan) -> bool:
    """Whether the points' checkpoint folders hold the same newest step (or all none)."""
    steps = set()
    for index in range(len(plan.configs)):
        with _checkpointer(plan, index) as checkpointer:
            steps.add(checkpointer.latest_step())
    return len(steps) == 1


def _initial_state(plan: RunPlan, checkpointers: Sequence[Checkpointer],
                   mesh: Mesh) -> tuple[TrainState, int]:
    """The state the run starts from and its step: every point's newest readable checkpoint,
    or, when the points have none, their fresh states; stacked for a vmapped run."""
    if checkpointers[0].latest_step() is None:  # all points alike: see `set_up`
        states = [plan.fresh_state(config, mesh) for config in plan.configs]
    else:
        states = [checkpointer.restore(abstract_state(config, mesh))
                  for config, checkpointer in zip(plan.configs, checkpointers)]
    steps = [int(state.step) for state in states]
    if len(set(steps)) > 1:  # a damaged newest checkpoint made one point fall back
        # Every point from the step the fallen-back one reached, where all still hold it, else
        # all from step 0 as points saved apart (`set_up`); the later steps are deleted so that
        # they can be saved anew. (This raised before, and a sweep recorded every point of the
        # chunk as failed, for good.)
        common = min(steps)
        states = [state if step == common else _restored_at_most(checkpointer, config, mesh,
                                                                  common)
                  for state, step, config, checkpointer
                  in zip(states, steps, plan.configs, checkpointers)]
        if any(state is None or int(state.step) != common for state in states):
            common = 0
            states = [plan.fresh_state(config, mesh) for config in plan.configs]
        warnings.warn(f"the points of {', '.join(map(str, plan.workdirs))} restored different "
                      f"steps {steps} (an unreadable checkpoint was set aside); pre-training all "
                      f"of them on from step {common}")
        for checkpointer in checkpointers:
            checkpointer.delete_steps(after=common)
        steps = [common] * len(states)
    state = stack_states(states, plan.configs[0], mesh) if plan.vmapped else states[0]
    return state, steps[0]


def _restored_at_most(checkpointer: Checkpointer, config: Any, mesh: Mesh,
                      step: int) -> TrainState | None:
    """The point's newest readable state at or before `step`; None when it holds none."""
    try:
        return checkpointer.restore(abstract_state(config, mesh), at_most=step)
    except (FileNotFoundError, CheckpointsUnreadable):
        return None


@contextlib.contextmanager
def set_up(plan: RunPlan, *, steps: int | None = None, progress: bool = True,
           restart: bool = False, require_existing: bool = False) -> Iterator[Run]:
    """The run `plan` describes, ready for `loop.run_loop`; leaving the block waits for the
    last saves and closes the run's files.

    steps: train up to this step (default: the configs' `train.steps`). progress: show a
    progress bar or log lines (process 0). restart: delete the points' checkpoints first.
    require_existing: a point without a checkpoint is an error (an explicit resume request).

    Every point resumes from its newest checkpoint (see `checkpointing.Checkpointer`). A
    vmapped run whose points hold different newest steps (a crash between their saves, or
    points started apart) pre-trains them all again from step 0, with a warning; one whose
    point fell back past an unreadable newest step trains on from that step where every point
    holds it (`_initial_state`).
    """
    config = plan.configs[0]
    # Every point's config, typed and validated before JAX does anything (a bad value is
    # reported first); the ConfigDicts still flow on to the components below.
    settings = [Settings.from_config(point) for point in plan.configs]
    for point in settings:
        require_trainable(point.model)
    train_step.release_programs_near_map_limit()  # before this run compiles its own
    mesh = partitioning.make_mesh(config.mesh)
    attention.require_available(settings[0].model.attention_impl)
    train = settings[0].train  # the points share one step (`RunPlan` checks it)
    partitioning.validate_batch_split(train.batch_size, train.microbatches, mesh,
                                      dict(settings[0].mesh.rules), plan.batch_field)
    with contextlib.ExitStack() as stack:
        # Watched from the start: a signal during the set-up stops the run after one step.
        preemption = stack.enter_context(PreemptionWatch())
        # Before any checkpoint folder is opened: a missing corpus or task stops the run with
        # nothing written.
        data = plan.make_data()
        if len(plan.configs) > 1 and not restart and not _newest_steps_agree(plan):
            warnings.warn(f"the checkpoints of {', '.join(map(str, plan.workdirs))} are at "
                          "different steps; pre-training all of them again from step 0")
            restart = True
        checkpointers = [
            stack.enter_context(_checkpointer(plan, index, restart=restart,
                                              require_existing=require_existing))
            for index in range(len(plan.configs))]
        total = config.train.steps if steps is None else steps
        for checkpointer in checkpointers:  # before the step compiles, from the newest step
            checkpointer.require_same_examples(None, total)
        step = plan.make_step(mesh)
        state, start = _initial_state(plan, checkpointers, mesh)
        for checkpointer in checkpointers:  # a damaged newest step may have fallen back
            checkpointer.require_same_examples(start, total)
            checkpointer.note_changed_settings(start, total)
        points = []
        for workdir, checkpointer in zip(plan.workdirs, checkpointers):
            writer = MetricsWriter(workdir, start)
            stack.callback(writer.close)
            points.append(Point(workdir, checkpointer, writer))
        bar = Progress(start, total, config.train.log_every, progress)
        stack.callback(bar.close)
        yield Run(mesh=mesh, step=step, data=data, step_args=plan.step_args, state=state,
                  start=start, total=total, points=points, vmapped=plan.vmapped,
                  speed=Throughput.of(config, plan.lengths, mesh, points=len(plan.configs)),
                  progress=bar, preemption=preemption)
