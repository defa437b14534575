"""The batch format: how one (inputs, targets) example becomes a model's row, per batch family.

Written once and used by everything that builds or reads rows: pre-training
(`objectives.corrupt`, on the device with jax.numpy), fine-tuning and validation batches
(`data.pipeline`, on the host with numpy), decoding's prompts (`decoding`, `bench`) and the
preview of corrupted examples. The row builders take the array namespace `xp` (numpy or
jax.numpy) and use only operations both have, over the last axis of arrays of any number of
examples, so host and device rows are the same function of the example.

Inputs and targets are token ids that end in EOS (blank_infilling's targets in GLM's [END]),
packed at the front of their arrays and padded with 0 after. The families (`Architecture.family`):
- `encoder_decoder`: `encoder_input_tokens [Li]` are the inputs (never empty: an encoder
  must see a token, `min_inputs_length`); `decoder_target_tokens [Lt]` are the targets,
  `decoder_input_tokens` the targets shifted right (0 first), `decoder_loss_weights` 1 on
  the targets.
- `decoder_only`: one sequence `[Li + Lt]`, the inputs then the targets;
  `decoder_target_tokens` is the sequence, `decoder_input_tokens` the sequence shifted
  right, `decoder_loss_weights` 1 on the targets only, and `inputs_mask` marks the inputs
  plus the position predicting the first target (seqio's PrefixLM convention; all False
  without inputs). With `target_positions` (GLM's blank infilling, `t5x_lite.glm`),
  `decoder_positions` too: each target slot's given position (-1: none), every other
  position its own.
- `encoder_only`: one sequence `[Li + Lt]` that one bidirectional stack reads and predicts
  at its own positions (BERT's masked LM; no decoder): `encoder_input_tokens`,
  `encoder_target_tokens` (the token to predict at each position, 0 where there is none) and
  `encoder_loss_weights` (1 on the positions to predict). Two kinds of example make it
  (`in_place`):
  - a task example (fine-tuning, validation, prediction): the inputs, then `Lt` mask slots
    (`mask_token`, `<extra_id_0>`, the token `bert_style` masks with); the targets sit at
    the first slots, with loss weight 1 there, the slots after EOS are left without targets.
    Always `Lt` slots, however long the targets: a slot count that followed the targets
    would tell the model the target's length (for label words, often its class), and
    prediction, which does not know it, could not match it. The prediction is the argmax at
    every slot, cut at the first EOS (`decoding.decode`). Such rows are never packed
    (`packable`): an example's row does not end with its own targets.
  - a pre-training example of an objective with a noise mask (`bert_style`, `mass_style`):
    inputs (the corrupted tokens, EOS last) and targets (the original tokens) aligned
    position by position, with `noise`, the positions the objective corrupted: targets there
    (and only there) get loss weight 1. Its layout has no target positions of its own
    (`objectives.layout_for` makes Lt 0), so the row is the Li inputs.
The loss reads `loss_keys(family)`: the targets and weights of the stack that predicts.
A key belongs to the stack its name starts with (`stack_of`): `encoder_*` to the encoder,
every other key to the decoder.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from t5x_lite.config import EOS_ID, PAD_ID, sentinel_id
from t5x_lite.errors import require_choice

# The key of a decoder-only row's explicit positions (GLM's blank infilling, `t5x_lite.glm`),
# which the model's relative position bias reads as `{stack}_positions` (`models._positions`).
POSITIONS_KEY = "decoder_positions"

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


# The builders: (xp, inputs [..., Wi], targets [..., Wt], inputs_length, targets_length,
# mask_token, noise, target_positions) -> the rows [..., length of the key's stack] of every
# example along the leading axes. Only `encoder_only` reads mask_token and noise, only
# `decoder_only` target_positions.


def _encoder_decoder_row(xp: Any, inputs: Any, targets: Any, inputs_length: int,
                         targets_length: int, mask_token: Any = None, noise: Any = None,
                         target_positions: Any = None) -> Row:
    targets = _gather_or_pad(xp, targets, xp.arange(targets_length))
    return {
        "encoder_input_tokens": _gather_or_pad(xp, inputs, xp.arange(inputs_length)),
        "decoder_input_tokens": _shift_right(xp, targets),
        "decoder_target_tokens": targets,
        "decoder_loss_weights": (targets != PAD_ID).astype(xp.float32),
    }


def _decoder_only_row(xp: Any, inputs: Any, targets: Any, inputs_length: int,
                      targets_length: int, mask_token: Any = None, noise: Any = None,
                      target_positions: Any = None) -> Row:
    num_inputs = xp.sum(inputs != PAD_ID, axis=-1, keepdims=True)
    position = xp.arange(inputs_length + targets_length)
    sequence = xp.where(position < num_inputs, _gather_or_pad(xp, inputs, position),
                        _gather_or_pad(xp, targets, position - num_inputs))
    row = {
        "decoder_input_tokens": _shift_right(xp, sequence),
        "decoder_target_tokens": sequence,
        "decoder_loss_weights": ((position >= num_inputs) & (sequence != PAD_ID)).astype(
            xp.float32),
        # seqio's PrefixLM convention: the prefix plus the position predicting the first target.
        "inputs_mask": (position <= num_inputs) & (num_inputs > 0),
    }
    if target_positions is not None:  # shifted by one, so that the gather's padding is -1
        given = _gather_or_pad(xp, target_positions + 1, position - num_inputs) - 1
        row[POSITIONS_KEY] = xp.where(given >= 0, given, position).astype(xp.int32)
    return row


def _encoder_only_row(xp: Any, inputs: Any, targets: Any, inputs_length: int,
                      targets_length: int, mask_token: Any = None, noise: Any = None,
                      target_positions: Any = None) -> Row:
    position = xp.arange(inputs_length + targets_length)
    if noise is not None:  # pre-training: targets aligned with the inputs, loss on the noise
        tokens = _gather_or_pad(xp, inputs, position)
        labels = _gather_or_pad(xp, targets, position)
        predict = (_gather_or_pad(xp, noise.astype(inputs.dtype), position) > 0) & (
            labels != PAD_ID)
    else:  # a task example: the inputs, then targets_length mask slots
        if mask_token is None:
            raise ValueError("encoder_only rows of task examples need mask_token (<extra_id_0>)")
        num_inputs = xp.sum(inputs != PAD_ID, axis=-1, keepdims=True)
        slot = position - num_inputs  # the slot a position is (< 0: an input)
        is_slot = (slot >= 0) & (slot < targets_length)
        slots = xp.where(is_slot, xp.asarray(mask_token, inputs.dtype),
                         xp.asarray(PAD_ID, inputs.dtype))
        tokens = xp.where(slot < 0, _gather_or_pad(xp, inputs, position), slots)
        labels = xp.where(is_slot, _gather_or_pad(xp, targets, slot), PAD_ID).astype(inputs.dtype)
        predict = labels != PAD_ID
    return {
        "encoder_input_tokens": tokens,
        "encoder_target_tokens": xp.where(predict, labels, PAD_ID).astype(inputs.dtype),
        "encoder_loss_weights": predict.astype(xp.float32),
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


def _encoder_only_split(row: Row) -> tuple[Any, Any]:
    # The inputs end at their last EOS (mask slots or padding follow it; a pre-training chunk
    # holds an EOS at every document end inside it too); the targets are the tokens at the
    # positions to predict.
    tokens = row["encoder_input_tokens"]
    eos = np.flatnonzero(tokens == EOS_ID)
    end = int(eos[-1]) + 1 if eos.size else len(tokens)
    return tokens[:end], row["encoder_target_tokens"][row["encoder_loss_weights"] > 0]


@dataclasses.dataclass(frozen=True)
class _Format:
    """One family's row: the length of each stack's part, the builder, and its inverse."""

    lengths: Callable[[int, int], dict[str, int]]  # (inputs, targets) -> {stack: length}
    build: Callable[..., Row]  # (xp, inputs, targets, inputs_length, targets_length) -> row
    split: Callable[[Row], tuple[Any, Any]]  # row -> (inputs, targets), padded
    min_inputs_length: int
    predicts: str = "decoder"  # the stack whose outputs are trained on (its *_target_tokens)
    in_place: bool = False  # predicts at positions of its own inputs (no decoder)
    packable: bool = True


_FORMATS = {
    "encoder_decoder": _Format(lambda i, t: {"encoder": i, "decoder": t},
                               _encoder_decoder_row, _encoder_decoder_split, 1),
    "decoder_only": _Format(lambda i, t: {"decoder": i + t},
                            _decoder_only_row, _decoder_only_split, 0),
    "encoder_only": _Format(lambda i, t: {"encoder": i + t},
                            _encoder_only_row, _encoder_only_split, 1, predicts="encoder",
                            in_place=True, packable=False),
}
FAMILIES = tuple(_FORMATS)


def _format(family: str) -> _Format:
    require_choice("family", family, FAMILIES)
    return _FORMATS[family]


def row_lengths(family: str, inputs_length: Any, targets_length: Any) -> dict[str, Any]:
    """{stack: length} of a `family` row holding `inputs_length` input and `targets_length`
    target tokens: {"encoder": Li, "decoder": Lt}, {"decoder": Li + Lt} or, in place,
    {"encoder": Li + Lt}. Also what one
    example takes of a packed row, given its own lengths."""
    return _format(family).lengths(inputs_length, targets_length)


def min_inputs_length(family: str) -> int:
    """The fewest input tokens a `family` row holds: one where an encoder reads them (the
    lm objective, which has no inputs, feeds it a lone EOS), else none."""
    return _format(family).min_inputs_length


def loss_keys(family: str) -> tuple[str, str]:
    """The batch keys (targets, loss weights) that a `family` row's loss reads: those of
    the stack whose outputs are the logits (`decoder_*`; `encoder_*` for `encoder_only`)."""
    stack = _format(family).predicts
    return f"{stack}_target_tokens", f"{stack}_loss_weights"


def in_place(family: str) -> bool:
    """Whether `family` predicts at positions of its own input sequence (`encoder_only`): its
    pre-training rows take the objective's noise mask and have no target positions of their
    own, its task rows end in mask slots, and it has no decoder to generate free text with."""
    return _format(family).in_place


def mask_token(vocab_size: int) -> int:
    """The mask token, `<extra_id_0>` (`config.sentinel_id`) of a vocabulary of `vocab_size`
    ids: what `bert_style`, `mass_style` and BART's token masking and text infilling mask with,
    and the slot of `encoder_only` task rows."""
    return sentinel_id(vocab_size, 0)


# UL2's mode tokens (Tay et al. 2022, section 3.2; `t5x_lite.ul2`), the last sentinels:
# MODE_TOKENS[k] is <extra_id_{num_sentinels - 1 - k}>, so a layout running UL2 keeps these
# three out of its span corruption (`objectives` counts them as sentinels it needs).
MODE_TOKENS = ("[NLU]", "[NLG]", "[S2S]")


def mode_token(name: str, vocab_size: int, num_sentinels: int) -> int:
    """The id of UL2's mode token `name` (one of MODE_TOKENS): the last sentinels, MODE_TOKENS[k]
    being `<extra_id_{num_sentinels - 1 - k}>` (= vocab_size - num_sentinels + k)."""
    require_choice("mode token", name, MODE_TOKENS)
    return sentinel_id(vocab_size, num_sentinels - 1 - MODE_TOKENS.index(name))


def mode_token_names(vocab_size: int, num_sentinels: int) -> dict[int, str]:
    """{id: name} of UL2's mode tokens, for printing a UL2 example's inputs."""
    return {mode_token(name, vocab_size, num_sentinels): name for name in MODE_TOKENS}


def packable(family: str) -> bool:
    """Whether several examples may share a `family` row (`data.pipeline.pack_examples`)."""
    return _format(family).packable


def stack_of(key: str) -> str:
    """The stack whose part of the row the batch key `key` holds."""
    return "encoder" if key.startswith("encoder_") else "decoder"


def example_rows(family: str, xp: Any, inputs: Any, targets: Any, inputs_length: int,
                 targets_length: int, *, mask_token: int | None = None,
                 noise: Any = None, target_positions: Any = None) -> Row:
    """The `family` rows of examples, each stack's part as long as `row_lengths` says.

    inputs `[..., Wi]`, targets `[..., Wt]`: int32, one example per position of the leading
    axes (none: one example), its tokens at the front (EOS last), then 0. xp: numpy or
    jax.numpy, whichever the arrays are (traceable, and vmap-able). Returns the batch keys of
    the module docstring, `[..., length]` each: int32 tokens, float32 loss weights and, for
    `decoder_only`, the bool `inputs_mask`. An example's first `row_lengths(family,
    len(inputs), len(targets))` positions of each stack are its own, the same at any longer
    length (what packing puts one after the other); after them come padding's, except that
    the position after the last target is fed that target (EOS), as shifting right does.

    `encoder_only` (see the module docstring) reads two more: `mask_token`, the slot token of
    task examples (`<extra_id_0>`, vocab_size - 1), and `noise` (bool, aligned with
    `inputs`), which makes the example a pre-training one predicted in place. The other
    families ignore both. `encoder_only` rows hold int32 `encoder_input_tokens` and
    `encoder_target_tokens` and float32 `encoder_loss_weights`; an `encoder_only` example's
    row is `inputs_length + targets_length` long whatever its own lengths (not `packable`).

    `decoder_only` reads `target_positions` (int32, aligned with `targets`; -1 where a slot
    has none): the position each target slot is fed at (GLM's blank infilling, `t5x_lite.glm`),
    which makes the row carry int32 `decoder_positions` (every other position its own). The
    other families ignore it.
    """
    return _format(family).build(xp, inputs, targets, inputs_length, targets_length,
                                 mask_token, noise, target_positions)


def zeros(family: str, rows: int, inputs_length: int, targets_length: int) -> Row:
    """A numpy batch of `rows` all-padding `family` rows: each key's array `[rows, length of
    its stack]` of zeros in the key's dtype (read off the builder), to be filled in."""
    one = np.array([EOS_ID], np.int32)
    lengths = row_lengths(family, inputs_length, targets_length)
    return {key: np.zeros([rows, lengths[stack_of(key)]], value.dtype)
            for key, value in example_rows(family, np, one, one, 1, 1,
                                           mask_token=EOS_ID).items()}


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
