"""The batch format: how one (inputs, targets) example becomes a model's row, per batch family.

Written once and used by everything that builds or reads rows: pre-training
(`objectives.corrupt`, on the device with jax.numpy), fine-tuning and validation batches
(`data.pipeline`, on the host with numpy), decoding's prompts (`decoding`, `bench`) and the
preview of corrupted examples. The row builders take the array namespace `xp` (numpy or
jax.numpy) and use only operations both have, over the last axis of arrays of any number of
examples, so host and device rows are the same function of the example.

Inputs and targets are token ids that end in EOS, packed at the front of their arrays and
padded with 0 after. The families (`Architecture.family`):
- `encoder_decoder`: `encoder_input_tokens [Li]` are the inputs (never empty: an encoder
  must see a token, `min_inputs_length`); `decoder_target_tokens [Lt]` are the targets,
  `decoder_input_tokens` the targets shifted right (0 first), `decoder_loss_weights` 1 on
  the targets.
- `decoder_only`: one sequence `[Li + Lt]`, the inputs then the targets;
  `decoder_target_tokens` is the sequence, `decoder_input_tokens` the sequence shifted
  right, `decoder_loss_weights` 1 on the targets only, and `inputs_mask` marks the inputs
  plus the position predicting the first target (seqio's PrefixLM convention; all False
  without inputs).
A key belongs to the stack its name starts with (`stack_of`): `encoder_*` to the encoder,
every other key to the decoder.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from t5x_lite.config import EOS_ID, PAD_ID, require_choice

Row = dict[str, Any]  # key -> one row's array, numpy or jax


def _gather_or_pad(xp: Any, row: Any, index: Any) -> Any:
    """`row[..., index]` along the last axis, with PAD_ID where `index` is outside
    [0, width); `index [..., L]` broadcasts against `row`'s leading axes."""
    width = row.shape[-1]
    shape = row.shape[:-1] + index.shape[-1:]
    if width == 0:  # nothing to gather from (numpy cannot index an empty row)
        return xp.full(shape, PAD_ID, row.dtype)
    index = xp.broadcast_to(index, shape)
    inside = (index >= 0) & (index < width)
    clipped = xp.clip(index, 0, width - 1)
    # One example: plain indexing, which jax gathers without take_along_axis' bounds fill.
    values = row[clipped] if row.ndim == 1 else xp.take_along_axis(row, clipped, axis=-1)
    return xp.where(inside, values, PAD_ID)


def _shift_right(xp: Any, row: Any) -> Any:
    """0 followed by `row` without its last token, along the last axis: what each position is
    fed."""
    first = xp.full(row.shape[:-1] + (min(1, row.shape[-1]),), PAD_ID, row.dtype)
    return xp.concatenate([first, row[..., :-1]], axis=-1)


# The builders: (xp, inputs [..., Wi], targets [..., Wt], inputs_length, targets_length) ->
# the rows [..., length of the key's stack] of every example along the leading axes.


def _encoder_decoder_row(xp: Any, inputs: Any, targets: Any, inputs_length: int,
                         targets_length: int) -> Row:
    targets = _gather_or_pad(xp, targets, xp.arange(targets_length))
    return {
        "encoder_input_tokens": _gather_or_pad(xp, inputs, xp.arange(inputs_length)),
        "decoder_input_tokens": _shift_right(xp, targets),
        "decoder_target_tokens": targets,
        "decoder_loss_weights": (targets != PAD_ID).astype(xp.float32),
    }


def _decoder_only_row(xp: Any, inputs: Any, targets: Any, inputs_length: int,
                      targets_length: int) -> Row:
    num_inputs = xp.sum(inputs != PAD_ID, axis=-1, keepdims=True)
    position = xp.arange(inputs_length + targets_length)
    sequence = xp.where(position < num_inputs, _gather_or_pad(xp, inputs, position),
                        _gather_or_pad(xp, targets, position - num_inputs))
    return {
        "decoder_input_tokens": _shift_right(xp, sequence),
        "decoder_target_tokens": sequence,
        "decoder_loss_weights": ((position >= num_inputs) & (sequence != PAD_ID)).astype(
            xp.float32),
        # seqio's PrefixLM convention: the prefix plus the position predicting the first target.
        "inputs_mask": (position <= num_inputs) & (num_inputs > 0),
    }


def _encoder_decoder_split(row: Row) -> tuple[Any, Any]:
    return row["encoder_input_tokens"], row["decoder_target_tokens"]


def _decoder_only_split(row: Row) -> tuple[Any, Any]:
    # The inputs end at the first position with a loss weight. A row that overflowed (zero
    # weights, see objectives.corrupt) has none; there the prefix mask covers the inputs and
    # the position predicting the first target, unless the inputs fill the row.
    sequence = row["decoder_target_tokens"]
    weighted = np.flatnonzero(row["decoder_loss_weights"])
    prefix = int(np.sum(row["inputs_mask"]))
    if weighted.size:
        end = int(weighted[0])
    else:
        end = prefix - 1 if 0 < prefix < len(sequence) else prefix
    return sequence[:end], sequence[end:]


@dataclasses.dataclass(frozen=True)
class _Format:
    """One family's row: the length of each stack's part, the builder, and its inverse."""

    lengths: Callable[[int, int], dict[str, int]]  # (inputs, targets) -> {stack: length}
    build: Callable[..., Row]  # (xp, inputs, targets, inputs_length, targets_length) -> row
    split: Callable[[Row], tuple[Any, Any]]  # row -> (inputs, targets), padded
    min_inputs_length: int


_FORMATS = {
    "encoder_decoder": _Format(lambda i, t: {"encoder": i, "decoder": t},
                               _encoder_decoder_row, _encoder_decoder_split, 1),
    "decoder_only": _Format(lambda i, t: {"decoder": i + t},
                            _decoder_only_row, _decoder_only_split, 0),
}
FAMILIES = tuple(_FORMATS)


def _format(family: str) -> _Format:
    require_choice("family", family, FAMILIES)
    return _FORMATS[family]


def row_lengths(family: str, inputs_length: Any, targets_length: Any) -> dict[str, Any]:
    """{stack: length} of a `family` row holding `inputs_length` input and `targets_length`
    target tokens: {"encoder": Li, "decoder": Lt} or {"decoder": Li + Lt}. Also what one
    example takes of a packed row, given its own lengths."""
    return _format(family).lengths(inputs_length, targets_length)


def min_inputs_length(family: str) -> int:
    """The fewest input tokens a `family` row holds: one where an encoder reads them (the
    lm objective, which has no inputs, feeds it a lone EOS), else none."""
    return _format(family).min_inputs_length


def stack_of(key: str) -> str:
    """The stack whose part of the row the batch key `key` holds."""
    return "encoder" if key.startswith("encoder_") else "decoder"


def example_rows(family: str, xp: Any, inputs: Any, targets: Any, inputs_length: int,
                 targets_length: int) -> Row:
    """The `family` rows of examples, each stack's part as long as `row_lengths` says.

    inputs `[..., Wi]`, targets `[..., Wt]`: int32, one example per position of the leading
    axes (none: one example), its tokens at the front (EOS last), then 0. xp: numpy or
    jax.numpy, whichever the arrays are (traceable, and vmap-able). Returns the batch keys of
    the module docstring, `[..., length]` each: int32 tokens, float32 loss weights and, for
    `decoder_only`, the bool `inputs_mask`. An example's first `row_lengths(family,
    len(inputs), len(targets))` positions of each stack are its own, the same at any longer
    length (what packing puts one after the other); after them come padding's, except that
    the position after the last target is fed that target (EOS), as shifting right does.
    """
    return _format(family).build(xp, inputs, targets, inputs_length, targets_length)


def zeros(family: str, rows: int, inputs_length: int, targets_length: int) -> Row:
    """A numpy batch of `rows` all-padding `family` rows: each key's array `[rows, length of
    its stack]` of zeros in the key's dtype (read off the builder), to be filled in."""
    one = np.array([EOS_ID], np.int32)
    lengths = row_lengths(family, inputs_length, targets_length)
    return {key: np.zeros([rows, lengths[stack_of(key)]], value.dtype)
            for key, value in example_rows(family, np, one, one, 1, 1).items()}


def row_keys(family: str) -> tuple[str, ...]:
    """The batch keys of a `family` row."""
    return tuple(zeros(family, 0, 1, 1))


def inputs_and_targets(family: str, row: Row) -> tuple[list[int], list[int]]:
    """The (inputs, targets) token ids without padding that `row` (numpy) was built from."""
    inputs, targets = _format(family).split(row)
    return ([int(t) for t in inputs if t != PAD_ID], [int(t) for t in targets if t != PAD_ID])


def decoder_only_prompt(inputs: jax.Array, room: int) -> Row:
    """The decoder-only rows `[B, Li + room]` of `inputs [B, Li]` (each row's tokens at the
    front, EOS last, then 0) before any target: `decoder_input_tokens` `[0, inputs..., 0...]`
    and `inputs_mask`, as training lays them out, with `room` positions from the one that
    predicts the first target on."""
    no_targets = jnp.zeros((inputs.shape[0], 0), inputs.dtype)
    row = _decoder_only_row(jnp, inputs, no_targets, inputs.shape[1], room)
    return {key: row[key] for key in ("decoder_input_tokens", "inputs_mask")}
