"""`t5x-lite preview`: what a pre-training objective makes of real text, exactly as training does.

    run = previewed_run("table6", "rate_50", "demo", seed=0)   # validated, nothing built yet
    examples = corrupted_examples(run, count=3)                # the corpus, then the corruption
    print(format_text(run, examples))

The examples are the first `count` rows of the batches a run of `run.config` corrupts at steps
0, 1, ...: the chunks of `PretrainData.batch(step)` (single-process), the layout the run trains
with (an experiment point: its grid's shared layout, as `grid.expand` gives it; a plain config:
`objectives.layout_from_config`), and the batch key of `train_state.batch_and_dropout_keys`. The
whole batch is corrupted, because each example's key is split from the batch key over the batch
rows; a count beyond the batch size continues with the batches of steps 1, 2, ...
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any, Mapping, Sequence

import jax
import ml_collections
import numpy as np

from t5x_lite import batch_format, grid, objectives, presets, ul2
from t5x_lite.config import (EOS_ID, PAD_ID, ConfigError, apply_overrides, load_config_file,
                             parse_overrides)
from t5x_lite.data.vocabulary import Vocabulary
from t5x_lite.settings import Settings
from t5x_lite.train_state import batch_and_dropout_keys, step_key

# How an EOS id shows in text: T5's piece for it. Raw chunks hold one at every document end.
EOS_TEXT = "</s>"


@dataclasses.dataclass(frozen=True)
class PreviewedRun:
    """The run whose corruption is shown: its config (`train.seed` set), the layout it trains
    with, and where it comes from: the preset, or the config file (`--config`; the preset is
    then None), and for a grid point the experiment, point id and the paper's row label (all
    None for a plain config)."""

    config: ml_collections.ConfigDict
    layout: objectives.BatchLayout
    preset: str | None
    experiment: str | None = None
    point: str | None = None
    row: str | None = None
    config_file: str | None = None

    @property
    def seed(self) -> int:
        return self.config.train.seed


def previewed_run(experiment: str | None, point: str | None, preset: str = "tiny",
                  seed: int = 0, overrides: Sequence[str] = (),
                  config_file: str | None = None) -> PreviewedRun:
    """Validate the request and resolve its config and layout; builds no data.

    experiment given: grid point `point` (its id as in results.jsonl) of `grid.expand(
    experiment, preset, overrides)`, with the grid's shared layout. experiment None: the preset,
    or the config file `config_file` (`path.py[:ARG]`, as `train --config` reads it, so that
    an objective it registers is known), with the 'field=value' overrides and its own layout.
    Either way `train.seed` = seed. Raises `ConfigError` naming the field for an unknown
    experiment, point (listing the grid's points), preset or override field, a config file
    beside an experiment, and a config that cannot train.
    """
    if experiment is None:
        if point is not None:
            raise ConfigError(f"point={point!r} needs the experiment it is a point of: "
                              f"t5x-lite preview EXPERIMENT --point {point} (e.g. table6)")
        config = load_config_file(config_file) if config_file else presets.get_preset(preset)
        apply_overrides(config, parse_overrides(config, overrides))
        config.train.seed = seed
        Settings.from_config(config)  # every bad value, before any data or array is built
        return PreviewedRun(config, objectives.layout_from_config(config),
                            None if config_file else preset, config_file=config_file)
    if config_file is not None:
        raise ConfigError(f"config={config_file!r} and experiment={experiment!r}: give one; an "
                          "experiment's points take their config from the experiment file")
    points = grid.expand(experiment, preset, overrides)
    ids = list(dict.fromkeys(p.point for p in points))  # a point once, whatever its seeds
    if point not in ids:
        which = ("an experiment's preview needs --point" if point is None
                 else f"point={point!r} is not a point of {points[0].experiment}")
        raise ConfigError(f"{which}; choose one of {', '.join(ids)}")
    grid_point = next(p for p in points if p.point == point)
    config = copy.deepcopy(grid_point.config)
    config.train.seed = seed  # as `grid.expand` seeds a run (the seed changes no layout)
    return PreviewedRun(config, grid_point.layout, preset, grid_point.experiment, point,
                        grid_point.row)


def token_text(vocab: Vocabulary, ids: Sequence[int],
               names: Mapping[int, str] | None = None) -> str:
    """`ids` as text: sentinels as `<extra_id_k>`, every EOS as `</s>`, an id in `names` (UL2's
    mode tokens) as its name. `Vocabulary.decode` stops at the first EOS, but a chunk holds one
    at each document end."""
    pieces, current, names = [], [], names or {}
    for token in map(int, ids):
        if token in names:
            pieces.append((vocab.decode(current) if current else "") + names[token])
            current = []
        elif token == EOS_ID:
            pieces.append(vocab.decode(current) + EOS_TEXT)
            current = []
        elif token != PAD_ID:
            current.append(token)
    return "".join(pieces) + (vocab.decode(current) if current else "")


def corrupted_examples(run: PreviewedRun, count: int = 3) -> list[dict[str, Any]]:
    """The first `count` examples the run's train steps corrupt (see the module docstring).

    Each is a dict: `raw` (the chunk's tokens the objective reads, ids), `noise_mask` (0/1 per
    raw token, the ones it corrupted; None for an objective without a noise mask, see
    `Objective.has_noise_mask`), `inputs` and `targets` (ids as the model gets them, without
    padding, ending in EOS, or blank_infilling's targets in its [END], unless cut by an
    overflow; a decoder-only row split where its
    targets start), their texts `raw_text`, `inputs_text`, `targets_text` (`token_text`),
    `overflow` (did not fit the layout: cut to it and left out of the loss), and where it
    comes from: `experiment`, `point`, `preset`, `config_file`, `objective`, `seed`, `step`,
    `batch_row`;
    `denoiser`: for the ul2 objective, the example's denoiser (`ul2.describe`), else None.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigError(f"examples={count!r} must be an integer >= 1")
    # Imported here: the pipeline pulls in TFDS, which validating a request does not need.
    from t5x_lite.data.pipeline import pretrain_data_from_config

    config = run.config
    spec = objectives.spec_from_config(config.objective)
    vocab, data = pretrain_data_from_config(config, run.layout.raw_length)
    layout = run.layout.with_sentences(vocab)
    name = config.objective.name
    names = (batch_format.mode_token_names(layout.vocab_size, layout.num_sentinels)
             if name == "ul2" else {})
    key, examples, step = step_key(config.train.seed), [], 0
    while len(examples) < count:
        raw_tokens = data.batch(step)
        batch_key = batch_and_dropout_keys(key, step)[0]
        batch, details = jax.device_get(
            objectives.jitted_corrupt_with_details(raw_tokens, spec, batch_key, layout))
        # Each example's denoiser, drawn as `corrupt` draws it (`ul2.choose`).
        chosen = (jax.device_get(ul2.choose(objectives.example_draws(
            batch_key, len(raw_tokens), layout)[:, 2, 0], layout.denoisers))
            if name == "ul2" else None)
        for row in range(min(len(raw_tokens), count - len(examples))):
            tokens = raw_tokens[row]
            # The tokens `corrupt` reads: the first spec.raw_length, up to any padding.
            used = int(np.sum((np.arange(tokens.shape[0]) < int(spec.raw_length))
                              & (tokens != PAD_ID)))
            if chosen is not None:  # a ul2 denoiser reads its own raw length
                used = min(used, layout.denoisers[int(chosen[row])].raw_length)
            raw = [int(t) for t in tokens[:used]]
            inputs, targets = batch_format.inputs_and_targets(
                layout.family, {key: value[row] for key, value in batch.items()})
            examples.append({
                "experiment": run.experiment, "point": run.point, "preset": run.preset,
                "config_file": run.config_file,
                "objective": name, "seed": run.seed, "step": step, "batch_row": row,
                "raw": raw,
                "noise_mask": ([int(m) for m in details["noise_mask"][row][:used]]
                               if objectives.get(name).has_noise_mask else None),
                "inputs": inputs, "targets": targets,
                "raw_text": token_text(vocab, raw),
                "inputs_text": token_text(vocab, inputs, names),
                "targets_text": token_text(vocab, targets, names),
                "denoiser": (ul2.describe(layout.denoisers[int(chosen[row])])
                             if chosen is not None else None),
                "overflow": bool(details["overflow"][row]),
            })
        step += 1
    return examples


def _header(run: PreviewedRun) -> list[str]:
    config, layout = run.config, run.layout
    objective = config.objective
    if run.experiment is None:
        where = (f"config file {run.config_file}" if run.config_file
                 else f"preset {run.preset} (a plain config)")
        layout_source = "its own layout"
    else:
        where = f"{run.experiment} point {run.point} ({run.row!r}), preset {run.preset}"
        layout_source = "the grid's shared layout"
    record = objectives.get(objective.name)
    settings = ", ".join(f"{field} {objective[field]}" + (
        " (the Poisson lambda of its span lengths)"
        if field == "mean_noise_span_length" and record.poisson_spans else "")
        for field in record.reads)
    if record.effective_settings is not None:  # what rounding makes of them, e.g. span counts
        seen = ", ".join(f"{key} {value}" for key, value in record.effective(objective).items())
        settings += f" (as it sees them: {seen})"
    settings = f": {settings}" if settings else ""
    if objective.name == "ul2":
        settings = ": denoisers " + ", ".join(
            f"{d.kind}(r={d.noise_density:g}, mu={d.mean_noise_span_length:g}, "
            f"share={d.share:g}) {ul2.MODE_OF_KIND[d.kind]}" for d in layout.denoisers)
    # An encoder_only layout has no target positions: it predicts at the noise positions of
    # its inputs (`batch_format`), so "targets 0 tokens" would read as no targets at all.
    lengths = (f"inputs {layout.inputs_length}, targets {layout.targets_length} tokens"
               if layout.targets_length else
               f"inputs {layout.inputs_length} tokens, targets predicted in place")
    return [
        f"{where}, seed {run.seed}",
        f"objective {objective.name}{settings}; model.arch {config.model.arch}",
        f"corpus {config.data.corpus}; {layout_source}: {layout.family}, raw {layout.raw_length}"
        f", {lengths}",
    ]


def format_text(run: PreviewedRun, examples: Sequence[dict[str, Any]]) -> str:
    """A header naming the run, then per example its counts (lengths incl. EOS), the raw text,
    the inputs and the targets."""
    lines = _header(run)
    for number, example in enumerate(examples, 1):
        mask = example["noise_mask"]
        counts = [f"raw {len(example['raw'])} tokens"]
        if example.get("denoiser"):
            denoiser = example["denoiser"]
            counts.append(f"denoiser {denoiser['kind']} (r={denoiser['noise_density']:g}, "
                          f"mu={denoiser['mean_noise_span_length']:g})")
        if mask is not None:
            counts.append(f"noise {sum(mask)}")
        counts += [f"inputs {len(example['inputs'])}", f"targets {len(example['targets'])}"]
        if example["overflow"]:
            counts.append("OVERFLOW: does not fit the layout, cut to it and left out of the loss")
        lines += [
            "",
            f"[{number}] step {example['step']}, batch row {example['batch_row']}: "
            + ", ".join(counts),
            f"  raw:     {example['raw_text']}",
            f"  inputs:  {example['inputs_text']}",
            f"  targets: {example['targets_text']}",
        ]
    return "\n".join(lines)
