"""The train state: what training changes, the streams a run's randomness is drawn from, and
how a state is created directly in its shardings (from a seed, or from parameters), stacked for
K vmapped points and unstacked again.

    seed --init (compiled once per program)--> TrainState(step, params, opt_state), sharded
    seed --step_key--> the key every train step folds its own number into
    seed --finetune_key--> the same for a fine-tuning run's steps
    seed --held_out_key--> the keys of the held-out batches' corruption

The compiled inits are keyed by the program's `step_settings.StepSettings` and mesh, as the
steps in `t5x_lite.train_step` are: a sweep initialises many runs of one program with one
compile.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from t5x_lite import partitioning
from t5x_lite.models import build_model
from t5x_lite.optim import make_optimizer
from t5x_lite.step_settings import ModelSettings, StepSettings, step_settings


@flax.struct.dataclass
class TrainState:
    """Everything that changes during training; the model's graphdef stays outside (static).

    step: int32 scalar, the number of updates applied. params: `nnx.State` of the model's
    `nnx.Param`s (float32, with `logical_axes` metadata). opt_state: the optax state.
    """

    step: jax.Array
    params: nnx.State
    opt_state: optax.OptState


# ---------------------------------------------------------------------------------------------
# The run's random streams


# Parameter initialisation, the pre-training and fine-tuning steps and the held-out batches'
# corruption draw from separate streams of the seed key, so no noise is derived from the key
# that drew a parameter, and fine-tuning step n does not repeat pre-training step n's dropout
# (both count their steps from 0).
_INIT_STREAM, _STEP_STREAM, _HELD_OUT_STREAM, _FINETUNE_STREAM = 0, 1, 2, 3


def step_key(seed: int) -> jax.Array:
    """The key a pre-training run passes to its train steps (each step folds in its own
    number)."""
    return jax.random.fold_in(jax.random.key(seed), _STEP_STREAM)


def finetune_key(seed: int) -> jax.Array:
    """The key a fine-tuning run passes to its train steps, as `step_key` for pre-training."""
    return jax.random.fold_in(jax.random.key(seed), _FINETUNE_STREAM)


def held_out_key(seed: int, index: int) -> jax.Array:
    """The key that corrupts held-out batch `index` of a run of `seed` (`t5x_lite.held_out`):
    fixed, so every evaluation of the run scores the same examples."""
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), _HELD_OUT_STREAM), index)


def batch_and_dropout_keys(key: jax.Array, step: jax.Array | int) -> tuple[jax.Array, jax.Array]:
    """The keys train step `step` of a run with key `key` (`step_key`) draws from: one for
    making its batch (the objective's corruption), one for dropout.

    Folding in the step number makes the randomness of step n independent of how the run got
    there (resumed or not). `t5x_lite.preview` uses it to show the corruption a step makes.
    """
    batch_key, dropout_key = jax.random.split(jax.random.fold_in(key, step))
    return batch_key, dropout_key


# ---------------------------------------------------------------------------------------------
# Creating a state: abstract shapes, shardings, initialisation


def optimizer(settings: StepSettings) -> optax.GradientTransformation:
    """The program's optax optimiser (`optim.make_optimizer` of its train settings)."""
    return make_optimizer(settings.train, scanned_layers=settings.model.scan_layers)


def _init_fn(settings: StepSettings) -> Callable[[jax.Array], TrainState]:
    """seed key -> a fresh train state. The key is an argument, not a constant, so one
    compiled init serves every seed."""
    model_cfg, tx = settings.model, optimizer(settings)

    def init(seed_key: jax.Array) -> TrainState:
        rngs = nnx.Rngs(jax.random.fold_in(seed_key, _INIT_STREAM))
        params = nnx.state(build_model(model_cfg, rngs), nnx.Param)
        return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))

    return init


# Tracing the model's construction takes ~0.2 s on a CPU, and every run of a sweep asks for its
# structure several times (init, restore, fine-tuning, evaluation): each is traced once per
# process. Both results are immutable (a GraphDef; a tree of ShapeDtypeStructs nobody mutates).
@functools.lru_cache(maxsize=None)
def graphdef(model: ModelSettings) -> nnx.GraphDef:
    """The static structure (no arrays allocated) of the model `model` describes."""
    structure, _ = nnx.split(
        nnx.eval_shape(lambda: build_model(model, nnx.Rngs(0))), nnx.Param)
    return structure


def model_graphdef(config: ml_collections.ConfigDict) -> nnx.GraphDef:
    """The static structure (no arrays allocated) of `config`'s model, to merge its parameters
    into: the program's (architectures sharing a program have the same parameters) under the
    config's own `arch`, so the network's defaults are its own (a `language_model` merged into
    the program's `prefix_lm` structure masked and decoded as a prefix LM when not told)."""
    return graphdef(dataclasses.replace(step_settings(config).model, arch=config.model.arch))


@functools.lru_cache(maxsize=None)
def _shapes(settings: StepSettings) -> TrainState:
    return jax.eval_shape(_init_fn(settings), jax.random.key(0))


def state_shapes(config: ml_collections.ConfigDict) -> TrainState:
    """The train state of `config`'s program as `jax.ShapeDtypeStruct`s, without shardings
    (no mesh needed): what its checkpoints hold (`checkpointing.saved_layout_differences`)."""
    return _shapes(step_settings(config))


@functools.lru_cache(maxsize=None)
def settings_abstract_state(settings: StepSettings, mesh: Mesh) -> TrainState:
    """`abstract_state` of the program that `settings` describe."""
    shapes = _shapes(settings)
    shardings = partitioning.state_shardings(shapes, mesh, settings.rules)
    return jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings
    )


def abstract_state(config: ml_collections.ConfigDict, mesh: Mesh) -> TrainState:
    """The train state as `jax.ShapeDtypeStruct`s with their shardings (for init and restore)."""
    return settings_abstract_state(step_settings(config), mesh)


# (settings, mesh, what the state starts from) -> the jitted init: equal keys share one executable.
_INITS: dict[Any, Callable] = {}


def init_state(config: ml_collections.ConfigDict, mesh: Mesh) -> TrainState:
    """Fresh parameters and optimiser state, created directly in their shardings."""
    settings = step_settings(config)
    key = (settings, mesh, "from seed")
    if key not in _INITS:  # a sweep initialises many runs of one program: compile once
        shardings = jax.tree.map(lambda s: s.sharding, settings_abstract_state(settings, mesh))
        _INITS[key] = jax.jit(_init_fn(settings), out_shardings=shardings)
    return _INITS[key](jax.random.key(config.train.seed))


def state_from_params(
    config: ml_collections.ConfigDict, mesh: Mesh, params: nnx.State,
    opt_state: optax.OptState | None = None,
) -> TrainState:
    """A train state at step 0 holding `params` (fine-tuning from a checkpoint's parameters),
    created in the state's shardings, with a fresh optimiser state, or `opt_state` carried on
    (`finetune.optimizer_state='continue'`: the pre-training's, its update count included)."""
    settings, fresh = step_settings(config), opt_state is None
    key = (settings, mesh, "from params", fresh)
    if key not in _INITS:
        tx = optimizer(settings)
        shardings = jax.tree.map(lambda s: s.sharding, settings_abstract_state(settings, mesh))

        def start(p: nnx.State, o: optax.OptState | None) -> TrainState:
            return TrainState(step=jnp.zeros((), jnp.int32), params=p,
                              opt_state=tx.init(p) if fresh else o)

        _INITS[key] = jax.jit(start, out_shardings=shardings, in_shardings=(
            shardings.params, None if fresh else shardings.opt_state))
    return _INITS[key](params, opt_state)


# ---------------------------------------------------------------------------------------------
# K points' states stacked for a vmapped step (`train_step.make_vmapped_train_step`)


def stacked_sharding(sharding: NamedSharding) -> NamedSharding:
    """The sharding of K stacked copies: a leading, unsharded [K] axis."""
    return NamedSharding(sharding.mesh, PartitionSpec(None, *sharding.spec))


def stack_states(states: Sequence[TrainState], config: ml_collections.ConfigDict,
                 mesh: Mesh) -> TrainState:
    """K train states of `config`'s program -> one with a leading [K] axis, placed in the
    vmapped step's shardings."""
    shardings = jax.tree.map(lambda s: stacked_sharding(s.sharding), abstract_state(config, mesh))
    stack = jax.jit(lambda *trees: jax.tree.map(lambda *xs: jnp.stack(xs), *trees),
                    out_shardings=shardings)
    return stack(*states)


@jax.jit
def _point_of(state: TrainState, index: jax.Array) -> TrainState:
    return jax.tree.map(lambda x: x[index], state)


def unstack_state(state: TrainState, index: int) -> TrainState:
    """Point `index` of a stacked train state. One program for all points (the index is an
    argument): slicing each array eagerly costs a dispatch, and a compile per shape, per array."""
    return _point_of(state, np.int32(index))

