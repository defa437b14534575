"""Optimisers and learning-rate schedules: `train.optimizer` / `train.schedule` as optax.

Adafactor with T5's settings (the paper's default) and AdamW; T5's inverse square root with
warm-up, linear, cosine and constant schedules. `make_optimizer(..., scanned_layers=True)` keeps
a model with stacked layers (`model.scan_layers`) optimised exactly as an unscanned one.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from t5x_lite.step_settings import TrainSettings


def learning_rate_schedule(train: TrainSettings) -> optax.Schedule:
    """step -> learning rate for `train.schedule` (settings `step_settings` has validated).

    rsqrt (T5): lr / sqrt(max(step, warmup)); the paper uses lr 1.0 and 10^4 warm-up steps, i.e.
    a constant 0.01 for 10^4 steps, then inverse-square-root decay. linear / cosine: linear
    warm-up from 0 to lr, then decay to 0 at `train.steps`. constant: lr (fine-tuning).
    """
    lr, warmup, steps = float(train.learning_rate), train.warmup_steps, train.steps
    if train.schedule == "rsqrt":
        return lambda step: lr * jax.lax.rsqrt(jnp.maximum(step, warmup).astype(jnp.float32))
    if train.schedule == "constant":
        return optax.constant_schedule(lr)
    # warmup == steps leaves no decay phase; optax wants at least one decay step, which the
    # run never reaches.
    decay = max(steps - warmup, 1)
    if train.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(0.0, lr, warmup, warmup + decay, end_value=0.0)
    return optax.join_schedules(
        [optax.linear_schedule(0.0, lr, warmup), optax.linear_schedule(lr, 0.0, decay)],
        [warmup],
    )


def make_optimizer(
    train: TrainSettings, *, scanned_layers: bool = False
) -> optax.GradientTransformation:
    """The optimiser of `train.optimizer`, driven by `learning_rate_schedule(train)`.

    scanned_layers: the model stacks its layers (`model.scan_layers`); each layer's slice of a
    stacked parameter is then optimised on its own (see `_per_layer`), exactly as unscanned.

    adafactor: T5 / T5X's settings (which are optax's defaults, spelled out here): factored
    second moments for matrices whose two largest dims are >= 128 (an attention kernel seen
    as the matrix T5 stores it: `_attention_kernels_as_matrices`), decay rate 0.8
    (beta2_t = 1 - t^-0.8), no momentum, update clipping at RMS 1.0, updates scaled by the
    parameter's RMS (floor 1e-3), epsilon 1e-30.
    adamw: b1 0.9, b2 0.999, eps 1e-8 (PyTorch's defaults, so the tiny preset compares like
    for like with a PyTorch T5 step); `train.weight_decay` applied to matrices only, not to
    norm scales.
    """
    schedule = learning_rate_schedule(train)
    if train.optimizer == "adafactor":
        tx = _attention_kernels_as_matrices(optax.adafactor(
            learning_rate=schedule, min_dim_size_to_factor=128, decay_rate=0.8,
            multiply_by_parameter_scale=True, clipping_threshold=1.0, momentum=None, eps=1e-30,
            factored=True, weight_decay_rate=(
                train.weight_decay if has_decay_stage("adafactor", train.weight_decay) else None),
        ))
    else:
        matrices = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)  # noqa: E731
        tx = optax.adamw(
            schedule, b1=0.9, b2=0.999, eps=1e-8, weight_decay=train.weight_decay, mask=matrices
        )
    return _per_layer(tx) if scanned_layers else tx


def has_decay_stage(optimizer: str, weight_decay: float) -> bool:
    """Whether `make_optimizer`'s state holds a weight-decay stage of its own: Adafactor's,
    added for a non-zero `train.weight_decay` only (optax's `weight_decay_rate=None` adds
    none), so a checkpoint restores only under a config that agrees (`checkpointing`)."""
    return optimizer == "adafactor" and bool(weight_decay)


# The attention kernels' logical axes (`layers.Attention`): query, key and value, then out.
_HEADS_OUT_OF_EMBED, _HEADS_INTO_EMBED = ("embed", "heads", "kv"), ("heads", "kv", "embed")


def _is_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def _as_matrix(param: Any) -> Any:
    """An attention kernel as the matrix T5 stores it (Mesh TensorFlow combines heads and d_kv
    into one dimension): query/key/value [..., d_model, heads * d_kv], out [..., heads * d_kv,
    d_model]; any other parameter as it is."""
    if not _is_variable(param):
        return param
    axes, value = tuple(param.get_metadata().get("logical_axes", ()))[-3:], param[...]
    if axes == _HEADS_OUT_OF_EMBED:
        return param.replace(value.reshape(*value.shape[:-2], -1))
    if axes == _HEADS_INTO_EMBED:
        return param.replace(value.reshape(*value.shape[:-3], -1, value.shape[-1]))
    return param


def _attention_kernels_as_matrices(
        tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """`tx` seeing each attention kernel as the matrix T5 stores it (`_as_matrix`), the updates
    shaped back. Adafactor factors a parameter's second moments over its two largest dimensions
    when both are >= 128: as T5's matrices, over d_model and heads x d_kv, as T5 and T5X
    (whose factor rules read the same rows and columns) do; as [d_model, heads, d_kv], over
    d_model and d_kv, which at d_kv 64 (T5-small, T5-base) leaves them unfactored."""
    def matrices(tree: Any) -> Any:
        return jax.tree.map(_as_matrix, tree, is_leaf=_is_variable)

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        shaped, state = tx.update(matrices(updates), state,
                                  None if params is None else matrices(params))
        return jax.tree.map(
            lambda new, old: new.replace(new[...].reshape(old[...].shape))
            if _is_variable(new) else new, shaped, updates, is_leaf=_is_variable), state

    return optax.GradientTransformation(lambda params: tx.init(matrices(params)), update)


def _per_layer(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """`tx` with every stacked layer parameter (logical axes starting with `layers`) updated
    slice by slice, as `jax.vmap` over its layer axis, and the other parameters as they are.

    Adafactor's factored moments and its parameter-scale RMS, and AdamW's "matrices only"
    decay mask, are per-parameter statistics and choices: on a stacked `[layers, ...]` array
    they would mix the layers, so the scanned model would train differently.

    One vmap takes one layer-axis size, so stacks of different depths (a decoder deeper than
    its encoder, `model.num_decoder_layers`) are one group per depth, `layers_<depth>`; with
    one depth the group is `layers`, the label under which the optimiser state of every
    scanned checkpoint is saved.
    """
    one_layer_at_a_time = optax.GradientTransformation(
        init=jax.vmap(tx.init), update=jax.vmap(tx.update))

    def is_stacked(param: nnx.Variable) -> bool:
        return param.get_metadata()["logical_axes"][0] == "layers"

    def labels(params: nnx.State) -> Any:
        depths = {param[...].shape[0] for param in jax.tree.leaves(params, is_leaf=_is_variable)
                  if is_stacked(param)}

        def label(param: nnx.Variable) -> str:
            if not is_stacked(param):
                return "other"
            return "layers" if len(depths) == 1 else f"layers_{param[...].shape[0]}"

        return jax.tree.map(label, params, is_leaf=_is_variable)

    def grouped(tree: nnx.State) -> optax.GradientTransformation:
        """The transformation for the groups `tree` (parameters or their updates) has."""
        groups = set(jax.tree.leaves(labels(tree)))
        return optax.multi_transform(
            {group: tx if group == "other" else one_layer_at_a_time for group in groups}, labels)

    return optax.GradientTransformation(
        init=lambda params: grouped(params).init(params),
        update=lambda updates, state, params=None: grouped(updates).update(updates, state,
                                                                           params))
