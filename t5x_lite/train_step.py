"""The one jitted train step: T5X's loss, the update, and the programs that run it.

    raw tokens [B, raw_len] --jit(train_step)--> corrupt -> masks -> model -> loss -> grads -> optax
    ready batch (fine-tuning) --jit(finetune_step)------^

Pre-training and fine-tuning run the same update (`_step_fn`); they differ only in how the
step's data becomes a batch on the device (corruption, or none). A step is compiled once per
*program*: its `step_settings.StepSettings` (the model, optimiser, loss, data kind, e.g. the
batch layout, and sharding rules; all the compiled program reads of the config) and its
mesh. The objective, corruption rate and span length arrive as a traced `ObjectiveSpec`, and
the architectures of one program (`Architecture.program`: `language_model` and `prefix_lm`) run it
with their prefix attention as a traced flag, so a whole ablation grid for one architecture
family shares one executable.

Vectorised sweeps: K points that differ only in that traced data (`vmap_group_key`) can share
one step `jax.vmap`-ed over their stacked states, specs and step keys
(`make_vmapped_train_step`), one compilation for the K. The one loop around these steps is
`t5x_lite.loop.run_loop` (pre-training, vmapped points and fine-tuning alike). The state the
steps update, its keys and its creation are `t5x_lite.train_state`'s; compiling a program and
placing its arguments on the mesh, `t5x_lite.programs`'.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import sys
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from t5x_lite import architectures, batch_format, objectives, partitioning, train_state
from t5x_lite.config import ConfigError, flat_fields
from t5x_lite.models import make_masks
from t5x_lite.optim import learning_rate_schedule
from t5x_lite.programs import Program, global_rows, memory_maps, replicated_array
from t5x_lite.step_settings import StepSettings, step_settings
from t5x_lite.train_state import TrainState, batch_and_dropout_keys, stacked_sharding

# (settings, mesh, the step's kind) -> the shared train, fine-tuning or eval step: equal keys
# share one executable. Kept for the process's life, but for `release_compiled_programs`.
_PROGRAMS: dict[Any, Program] = {}


def release_compiled_programs() -> None:
    """Let go of every compiled program the process keeps: the train, fine-tuning and eval
    steps, the state initialisers (`train_state._INITS`) and JAX's own caches (decoding's,
    among others). A run holding a step keeps it; the next run compiles its own, or loads it
    from the persistent compilation cache (`t5x_lite.compilation_cache`) where one is set."""
    _PROGRAMS.clear()
    train_state._INITS.clear()
    jax.clear_caches()
    gc.collect()


def release_programs_near_map_limit(share: float = 0.5) -> bool:
    """`release_compiled_programs` when the process holds more than `share` of the memory maps
    the kernel allows it (`programs.memory_maps`: kept programs would otherwise crash a
    long-lived process, a notebook kernel, after a few sweeps), saying so in one line; True
    if released. Every run calls it as it starts (`run_setup.set_up`), between steps."""
    maps = memory_maps()
    if maps is None or maps[0] <= share * maps[1]:
        return False
    release_compiled_programs()
    print(f"t5x_lite: released the compiled programs this process kept ({maps[0]:,} of the "
          f"{maps[1]:,} memory maps Linux allows a process were in use); the next runs load "
          "or compile theirs again", file=sys.stderr, flush=True)
    return True


# ---------------------------------------------------------------------------------------------
# Loss


def cross_entropy_sums(
    logits: jax.Array, targets: jax.Array, weights: jax.Array, *, z_loss: float,
    label_smoothing: float,
) -> dict[str, jax.Array]:
    """Weighted sums over tokens of T5X's loss terms, in float32 (not yet normalised).

    logits [B, L, V]; targets int [B, L]; weights float [B, L]. Returns scalars:
    `cross_entropy` (against targets smoothed to 1 - s on the label and s / (V - 1) elsewhere,
    minus that distribution's entropy so a perfect model scores 0, as T5X does), `z_loss`
    (z_loss * logsumexp(logits)^2, which keeps the softmax normaliser near 1), `correct`
    (argmax hits) and `weight` (sum of weights). The smoothed cross entropy is computed from
    logsumexp and two reductions, never a one-hot [B, L, V] array.
    """
    logits = logits.astype(jnp.float32)
    vocab = logits.shape[-1]
    log_z = jax.nn.logsumexp(logits, axis=-1)
    label_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    on, off = 1.0 - label_smoothing, label_smoothing / (vocab - 1)
    # -sum_v q_v log p_v with q = off everywhere plus (on - off) at the label.
    cross_entropy = log_z - (on - off) * label_logit
    if label_smoothing > 0:  # a static setting: without smoothing, skip a pass over [B, L, V]
        cross_entropy -= off * jnp.sum(logits, axis=-1)
        cross_entropy += on * math.log(on) + (vocab - 1) * off * math.log(off)
    weights = weights.astype(jnp.float32)
    return {
        "cross_entropy": jnp.sum(cross_entropy * weights),
        "z_loss": jnp.sum(z_loss * jnp.square(log_z) * weights),
        # label logit == max logit: argmax without its slow (value, index) reduction on CPU;
        # differs from argmax only on exact ties.
        "correct": jnp.sum((label_logit >= jnp.max(logits, axis=-1)) * weights),
        "weight": jnp.sum(weights),
    }


# ---------------------------------------------------------------------------------------------
# The train step: one update core, fed raw tokens (pre-training) or ready batches (fine-tuning)


def _split_microbatches(
    batch: dict[str, jax.Array], count: int, rows: NamedSharding
) -> dict[str, jax.Array]:
    """[B, ...] -> [count, B / count, ...]; micro-batch m takes rows m, m + count, ... so that
    every device's rows hold an equal share of every micro-batch (no resharding)."""
    stacked = stacked_sharding(rows)

    def split(x: jax.Array) -> jax.Array:
        x = jnp.swapaxes(x.reshape(x.shape[0] // count, count, *x.shape[1:]), 0, 1)
        return jax.lax.with_sharding_constraint(x, stacked)

    return jax.tree.map(split, batch)


def _prefix_attention(config: ml_collections.ConfigDict) -> bool:
    """The value of the program's prefix flag for `config` (`models.make_masks`'
    `prefix_attention`: it switches prefix attention and the decoder-only bucket rule)."""
    return architectures.get(config.model.arch).prefix_attention


def _loss_sums_fn(settings: StepSettings) -> Callable:
    graphdef, arch = train_state.graphdef(settings.model), settings.model.arch
    train = settings.train
    # The targets and weights of the stack the logits come from (the batch format's).
    targets, weights = batch_format.loss_keys(architectures.get(arch).family)

    def loss_sums(params: nnx.State, batch: dict, rng: jax.Array | None,
                  prefix_flag: jax.Array | None = None) -> dict[str, jax.Array]:
        model = nnx.merge(graphdef, params)
        logits = model(batch, make_masks(batch, arch, prefix_flag), dropout_rng=rng)
        return cross_entropy_sums(
            logits, batch[targets], batch[weights],
            z_loss=train.z_loss, label_smoothing=train.label_smoothing,
        )

    return loss_sums


def loss_sums_fn(config: ml_collections.ConfigDict) -> Callable:
    """(params, batch, dropout_rng | None[, prefix_flag]) -> T5X's loss sums
    (`cross_entropy_sums`) of the program's model on `batch`; no dropout when the rng is
    None; the program architecture's own prefix attention without a flag."""
    return _loss_sums_fn(step_settings(config))


def _step_fn(
    settings: StepSettings, mesh: Mesh, make_batch: Callable[[Any, jax.Array], dict]
) -> Callable:
    """The pure train step: (state, data, key_data, prefix_flag) -> (state, metrics).

    `make_batch(data, rng)` turns the step's data into (the batch dict, metrics of its making)
    on the device: `objectives.corrupt` of (raw tokens, spec) and its overflow count for
    pre-training, the batch itself and no metrics for fine-tuning. Everything after it (loss,
    micro-batches, optimiser, metrics) is shared.
    """
    tx, train = train_state.optimizer(settings), settings.train
    schedule, loss_sums = learning_rate_schedule(train), _loss_sums_fn(settings)
    dropout = settings.model.dropout_rate > 0
    rows = _rows_sharding(settings, mesh)
    weights_key = batch_format.loss_keys(architectures.get(settings.model.arch).family)[1]

    def loss_fn(params: nnx.State, batch: dict, rng: jax.Array, normalizer: jax.Array,
                prefix_flag: jax.Array):
        sums = loss_sums(params, batch, rng if dropout else None, prefix_flag)
        return (sums["cross_entropy"] + sums["z_loss"]) / normalizer, sums

    def step(state: TrainState, data: Any, key_data: jax.Array, prefix_flag: jax.Array):
        batch_rng, dropout_rng = batch_and_dropout_keys(jax.random.wrap_key_data(key_data),
                                                        state.step)
        batch, data_metrics = make_batch(data, batch_rng)
        batch = jax.lax.with_sharding_constraint(batch, rows)
        # One normaliser for the whole batch, so summed micro-batch gradients equal the full one.
        weight_sum = jnp.sum(batch[weights_key].astype(jnp.float32))
        normalizer = (
            jnp.maximum(weight_sum, 1.0)
            if train.loss_normalizing_factor is None
            else jnp.float32(train.loss_normalizing_factor)
        )
        micro = _split_microbatches(batch, train.microbatches, rows)
        # make_batch above saw the whole batch; only dropout draws depend on the split.
        rngs = jax.random.split(dropout_rng, train.microbatches)
        grad_fn = jax.grad(loss_fn, has_aux=True)

        def accumulate(carry, xs):
            grads, sums = grad_fn(state.params, xs[0], xs[1], normalizer, prefix_flag)
            return jax.tree.map(jnp.add, carry, (grads, sums)), None

        zeros = jax.tree.map(jnp.zeros_like, state.params)
        zero_sums = {
            k: jnp.zeros((), jnp.float32) for k in ("cross_entropy", "z_loss", "correct", "weight")
        }
        (grads, sums), _ = jax.lax.scan(accumulate, (zeros, zero_sums), (micro, rngs))
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {
            "loss": (sums["cross_entropy"] + sums["z_loss"]) / normalizer,
            "z_loss": sums["z_loss"] / normalizer,
            "accuracy": sums["correct"] / jnp.maximum(sums["weight"], 1.0),
            "num_tokens": sums["weight"],
            "grad_norm": optax.tree.norm(grads),
            "learning_rate": schedule(state.step),
            **data_metrics,
        }
        return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

    return step


@dataclasses.dataclass
class _StepCaller:
    """What both step callers share: the compiled program, the mesh, the row sharding of the
    batch, and the static prefix-attention setting fed to the program as a traced flag."""

    program: Program
    mesh: Mesh
    rows: NamedSharding
    prefix_attention: bool | np.ndarray  # bool [K] for a vmapped step

    def _run(self, state: TrainState, data: Any, rng: jax.Array) -> tuple[TrainState, dict]:
        key_data = replicated_array(jax.random.key_data(rng), self.mesh)
        flag = replicated_array(np.asarray(self.prefix_attention, np.bool_), self.mesh)
        return self.program(state, data, key_data, flag)

    @property
    def compiles(self) -> int:
        """Compilations of the shared program so far (by every caller using it)."""
        return self.program.compiles

    @property
    def function_name(self) -> str:
        """The jitted function's name, which its backend-compile events carry
        (`compile_events.count`)."""
        return self.program.jitted.__name__


@dataclasses.dataclass
class TrainStep(_StepCaller):
    """`train_step(state, raw_tokens, spec, rng) -> (state, metrics)` for one config.

    raw_tokens: this process's rows of the global batch, int32 [batch_size / process_count,
    layout.raw_length] (a numpy array, or an already global jax.Array). spec: an
    `objectives.ObjectiveSpec` (traced: any objective / rate / span reuses the executable).
    rng: the run's step key (`train_state.step_key`); the step folds in `state.step`. The
    state is donated.

    A vmapped step (`make_vmapped_train_step`, K points) takes and returns everything with a
    leading [K] axis: `train_state.stack_states` of the points' states, raw tokens [K,
    batch_size / process_count, raw_length], `stack_specs` of their specs, a [K] array of step
    keys; each metric is [K] (a spec field may stay a scalar that all points share).
    """

    global_shape: tuple[int, ...]

    def __call__(
        self, state: TrainState, raw_tokens: Any, spec: Any, rng: jax.Array
    ) -> tuple[TrainState, dict]:
        if not isinstance(raw_tokens, jax.Array):
            raw_tokens = np.asarray(raw_tokens, np.int32)
        raw_tokens = global_rows(raw_tokens, self.rows, self.global_shape, "raw_tokens",
                                  rows_axis=len(self.global_shape) - 2)
        spec = jax.tree.map(lambda x: replicated_array(x, self.mesh), spec)
        return self._run(state, (raw_tokens, spec), rng)


@dataclasses.dataclass
class FinetuneStep(_StepCaller):
    """`finetune_step(state, batch, rng) -> (state, metrics)`: the train step on a ready batch.

    batch: this process's rows of a `data.pipeline.pack_examples` / `pad_examples` batch
    (dict of [batch_size / process_count, length] arrays). Each new set of keys or lengths
    compiles once. rng: the run's step key, as for `TrainStep`. The state is donated.
    """

    batch_size: int

    def __call__(
        self, state: TrainState, batch: dict[str, Any], rng: jax.Array
    ) -> tuple[TrainState, dict]:
        batch = {
            name: global_rows(value, self.rows, (self.batch_size, *np.shape(value)[1:]), name)
            for name, value in batch.items()
        }
        return self._run(state, batch, rng)


def _validate_batch_split(settings: StepSettings, mesh: Mesh,
                          field: str = "train.batch_size") -> None:
    partitioning.validate_batch_split(
        settings.train.batch_size, settings.train.microbatches, mesh, settings.rules, field)


def _vmap_points(step: Callable) -> Callable:
    """`step` over K points: state, key data and flag stacked on axis 0, and so is the data,
    except its scalar leaves, which all points share (e.g. an objective every point uses,
    which then stays a real `lax.switch` branch rather than a select over all objectives)."""

    def vmapped(state: TrainState, data: Any, key_data: jax.Array, flag: jax.Array):
        data_axes = jax.tree.map(lambda x: 0 if jnp.ndim(x) else None, data)
        return jax.vmap(step, in_axes=(0, data_axes, 0, 0))(state, data, key_data, flag)

    return vmapped


def _compiled_step(settings: StepSettings, mesh: Mesh, make_batch: Callable,
                   data_sharding: Any, vmapped: bool = False) -> Program:
    """The shared program for (settings, mesh): jitted once with explicit shardings, the state
    donated; `make_batch` (see `_step_fn`) must depend on nothing but the settings' data kind,
    and `data_sharding` places the step's data argument.

    vmapped: the step `jax.vmap`-ed over a leading [K] axis of every argument (K points
    trained together); the state's shardings gain that axis unsharded, and `data_sharding`
    must already have it. Each K compiles once."""
    _validate_batch_split(settings, mesh)
    key = (settings, mesh, vmapped)
    if key not in _PROGRAMS:
        state_shardings = jax.tree.map(
            lambda s: s.sharding, train_state.settings_abstract_state(settings, mesh))
        replicated = NamedSharding(mesh, PartitionSpec())
        step = _step_fn(settings, mesh, make_batch)
        if vmapped:
            step = _vmap_points(step)
            state_shardings = jax.tree.map(stacked_sharding, state_shardings)
        _PROGRAMS[key] = Program(jax.jit(
            step,
            in_shardings=(state_shardings, data_sharding, replicated, replicated),
            out_shardings=(state_shardings, replicated),
            donate_argnums=0,
        ))
    return _PROGRAMS[key]


def _rows_sharding(settings: StepSettings, mesh: Mesh) -> NamedSharding:
    return partitioning.batch_sharding(mesh, settings.rules)


def _pretrain_program(settings: StepSettings, mesh: Mesh, rows: NamedSharding,
                      vmapped: bool) -> Program:
    """The shared pre-training program: corruption on the device to the settings' layout (their
    data kind), then the update core.

    Its metrics add `objective_overflow`, the examples of the batch that did not fit the layout
    (left out of the loss; see `objectives.corrupt_with_details`)."""
    layout = settings.data_kind
    layout.require_sentences()

    def corrupt(data: Any, rng: jax.Array) -> tuple[dict, dict]:
        batch, details = objectives.corrupt_with_details(data[0], data[1], rng, layout)
        return batch, {"objective_overflow": jnp.sum(details["overflow"].astype(jnp.int32))}

    replicated = NamedSharding(mesh, PartitionSpec())
    return _compiled_step(settings, mesh, corrupt, (rows, replicated), vmapped)


def make_train_step(
    config: ml_collections.ConfigDict, layout: objectives.BatchLayout, mesh: Mesh
) -> TrainStep:
    """The pre-training step for `config` on `mesh`; executables are shared through a module
    cache, so every objective of one layout runs the same program."""
    settings = step_settings(config, layout)
    rows = _rows_sharding(settings, mesh)
    return TrainStep(program=_pretrain_program(settings, mesh, rows, vmapped=False),
                     mesh=mesh, rows=rows, prefix_attention=_prefix_attention(config),
                     global_shape=(settings.train.batch_size, layout.raw_length))


def vmap_group_key(config: ml_collections.ConfigDict) -> tuple[StepSettings, str]:
    """Configs with equal keys can pre-train together in one vmapped step.

    The key is the step settings (one program; the architectures sharing it, language_model
    and prefix_lm, agree, their prefix attention being a traced flag) and, as JSON, every
    other field but the objective and `train.seed`, which the step takes as per-point data
    (spec, step key). Those other fields must agree too because the K points also share one
    loop (`train.steps`, the log and checkpoint cadence) and one data pipeline (`data`); the
    layout is an argument of its own."""
    shared = json.loads(config.to_json_best_effort(sort_keys=True))
    del shared["objective"], shared["model"], shared["train"]["seed"]  # model: in the settings
    return step_settings(config), json.dumps(shared, sort_keys=True)


def require_one_group(configs: Sequence[ml_collections.ConfigDict]) -> None:
    """Raise `ConfigError` naming the fields in which a config differs from the first one
    beyond what a vmapped step can take as data (see `vmap_group_key`)."""
    if not configs:
        raise ConfigError("configs is empty: give at least one config to train")

    def fields(config: ml_collections.ConfigDict) -> tuple[dict, dict]:
        settings, shared = vmap_group_key(config)
        return settings.by_config_path(), flat_fields(json.loads(shared))

    first = fields(configs[0])
    program = architectures.get(configs[0].model.arch).program
    for index, config in enumerate(configs[1:], 1):
        differing = {name for mine, theirs in zip(first, fields(config))
                     for name in mine.keys() | theirs.keys() if mine.get(name) != theirs.get(name)}
        if differing:
            raise ConfigError(
                f"configs[{index}] differs from configs[0] in {', '.join(sorted(differing))}; "
                "points trained in one vmapped step may differ only in objective, train.seed "
                f"and model.arch among {', '.join(architectures.names(program=program))}")


def make_vmapped_train_step(
    configs: Sequence[ml_collections.ConfigDict], layout: objectives.BatchLayout, mesh: Mesh
) -> TrainStep:
    """The pre-training step of K = len(configs) points in one `jax.vmap`-ed program (see
    `TrainStep`); the configs must agree under `vmap_group_key`. The [K] axis is unsharded,
    every other axis keeps its sharding rules."""
    require_one_group(configs)
    settings = step_settings(configs[0], layout)
    rows = stacked_sharding(_rows_sharding(settings, mesh))
    return TrainStep(
        program=_pretrain_program(settings, mesh, rows, vmapped=True), mesh=mesh,
        rows=rows, prefix_attention=np.array([_prefix_attention(c) for c in configs]),
        global_shape=(len(configs), settings.train.batch_size, layout.raw_length))


def stack_specs(specs: Sequence[objectives.ObjectiveSpec]) -> objectives.ObjectiveSpec:
    """K scalar specs -> one spec for a vmapped step: [K] where the points differ, a scalar
    where they agree (shared by all points, see `_vmap_points`)."""

    def stack(*fields: Any) -> np.ndarray:
        stacked = np.stack(fields)
        return stacked[0] if (stacked == stacked[0]).all() else stacked

    return jax.tree.map(stack, *specs)



_READY_BATCHES = "ready batches"  # the data kind of fine-tuning programs (no corruption)


def make_finetune_step(config: ml_collections.ConfigDict, mesh: Mesh) -> FinetuneStep:
    """The train step on ready batches (fine-tuning) for `config` on `mesh`; `config.train`
    holds the fine-tuning optimiser and batch size (see `finetune.finetune_train_config`)."""
    settings = step_settings(config, _READY_BATCHES)
    rows = _rows_sharding(settings, mesh)
    program = _compiled_step(settings, mesh, lambda batch, rng: (batch, {}), rows)
    return FinetuneStep(program=program, mesh=mesh, rows=rows,
                        prefix_attention=_prefix_attention(config),
                        batch_size=settings.train.batch_size)


def make_eval_step(
    config: ml_collections.ConfigDict, mesh: Mesh
) -> Callable[[nnx.State, dict[str, np.ndarray]], dict[str, float]]:
    """`eval_step(params, batch) -> loss sums` without dropout: teacher-forced validation.

    batch: this process's rows of a `pad_examples` / `pack_examples` batch (dict of
    [rows / process_count, length] arrays; `data.pipeline.process_rows`), fed like the train
    step's. Returns the float sums of `cross_entropy_sums` (cross_entropy, z_loss, correct,
    weight) over the whole global batch, the same on every process; add them over batches and
    divide by `weight` for the mean loss and token accuracy.
    """
    settings = step_settings(config, "eval")
    key = (settings, mesh, "eval")
    if key not in _PROGRAMS:
        loss_sums = _loss_sums_fn(settings)
        _PROGRAMS[key] = Program(jax.jit(
            lambda params, batch, flag: loss_sums(params, batch, None, flag),
            out_shardings=NamedSharding(mesh, PartitionSpec())))
    program, rows = _PROGRAMS[key], _rows_sharding(settings, mesh)
    flag = replicated_array(np.bool_(_prefix_attention(config)), mesh)

    def eval_step(params: nnx.State, batch: dict[str, np.ndarray]) -> dict[str, float]:
        batch = {name: global_rows(value, rows, (len(value) * jax.process_count(),
                                                  *np.shape(value)[1:]), name)
                 for name, value in batch.items()}
        sums = jax.device_get(program(params, batch, flag))
        return {name: float(value) for name, value in sums.items()}

    return eval_step


def teacher_forced(eval_step: Callable[[nnx.State, dict], dict[str, float]], params: nnx.State,
                   batches: Sequence[dict[str, np.ndarray]]) -> dict[str, float]:
    """{"loss", "token_accuracy"}: the mean loss (z-loss included, as the train step's) and
    the token accuracy in % over every target of `batches`, from `make_eval_step`'s sums."""
    sums = {"cross_entropy": 0.0, "z_loss": 0.0, "correct": 0.0, "weight": 0.0}
    for batch in batches:
        for name, value in eval_step(params, batch).items():
            sums[name] += value
    weight = max(sums["weight"], 1.0)
    return {"loss": (sums["cross_entropy"] + sums["z_loss"]) / weight,
            "token_accuracy": 100.0 * sums["correct"] / weight}
