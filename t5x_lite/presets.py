"""Named presets: functions that return a full config tree (see `t5x_lite.config`).

- `tiny`: the benchmark preset of the training issue (encoder-decoder, d_model 256, 4+4 layers,
  vocabulary 8192, batch 16 x 128 inputs / 32 targets, float32, AdamW). Minutes on a laptop CPU.
- `small`: T5-small-sized (6+6 layers, d_model 512), for single-accelerator runs.
- `paper`: the paper's baseline (12+12 layers, d_model 768, batch 128 x 512, Adafactor, rsqrt).
- `demo`: smaller than `tiny`, sized for `t5x-lite demo` on a 2-core CPU.
- `cpu`: Table 2 with 3 seeds on the real data (wiki text, three `local_*` tasks) in at most
  3 hours on a 2-core CPU.

`small` and `cpu` read `data.data_root` (default `SHARED_DATA_ROOT`, ../shared/data): they
pre-train on its English text (`PRETRAIN_TEXT`, linked to the root by `pretrain_on_data_root`)
and fine-tune on its `local_*` tasks.

`sweep_preset(name)` adds what a sweep (`t5x_lite.sweep`, `experiments/`) needs on top: the
fine-tuning settings and the downstream tasks each grid point is fine-tuned on, one at a time.
`finetune_preset(name)` is the preset with the same fine-tuning settings and those tasks as
`finetune.tasks`: what `t5x-lite finetune` and `t5x-lite eval` read with `--preset NAME`.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import ml_collections

from t5x_lite.config import ConfigError, default_config


def paper() -> ml_collections.ConfigDict:
    """The T5 paper's baseline setup (Raffel et al. 2020, section 3.1), with its baseline
    objective (section 3.1.4): 15% of the tokens corrupted i.i.d., each run of them replaced by
    one sentinel (`iid_denoising`)."""
    config = default_config()
    config.objective.update(name="iid_denoising", noise_density=0.15)
    return config


# The directory laid out like shared/data that the presets reading real data use, relative to
# the working directory (a checkout beside shared/, as /work/main and CI are).
SHARED_DATA_ROOT = "../shared/data"
# Where the English pre-training text lies under a data root: the blank-line separated
# documents of enwiki_sample and enwikinews_sample (shared/data/SOURCES.md, section 1).
PRETRAIN_TEXT = "pretrain/*/part-*.txt"


def pretrain_on_data_root(config: ml_collections.ConfigDict,
                          data_root: str = SHARED_DATA_ROOT) -> None:
    """Set `data.data_root` and make `data.corpus` the `PRETRAIN_TEXT` under it.

    The corpus is a reference to the data root (an ml_collections `FieldReference`), so an
    override such as `--config.data.data_root=/elsewhere` moves the corpus along with the
    `local_*` tasks; an override of `data.corpus` itself replaces the link. Missing text is a
    `ConfigError` naming the path when a run starts (`pipeline.describe_corpus`).
    """
    config.data.data_root = data_root
    config.data.corpus = config.data.get_ref("data_root") + "/" + PRETRAIN_TEXT


def small() -> ml_collections.ConfigDict:
    """T5-small-sized, pre-trained on the English wiki text under `data.data_root`."""
    config = default_config()
    config.model.update(d_model=512, d_ff=2048, num_heads=8, d_kv=64, num_layers=6)
    config.train.update(batch_size=128, steps=2**16)
    config.objective.update(inputs_length=512)
    pretrain_on_data_root(config)
    return config


def tiny() -> ml_collections.ConfigDict:
    """The benchmark preset: encoder-decoder, d_model 256, 4+4 layers, batch 16 x 128/32."""
    config = default_config()
    config.model.update(
        d_model=256, d_ff=1024, num_heads=4, d_kv=64, num_layers=4, vocab_size=8192,
        dropout_rate=0.0,
    )
    config.objective.update(inputs_length=128, targets_length=32)
    config.train.update(
        batch_size=16, steps=2000, optimizer="adamw", schedule="cosine", learning_rate=1e-3,
        warmup_steps=100,
    )
    config.checkpoint.update(every=500)
    return config


def demo() -> ml_collections.ConfigDict:
    """`t5x-lite demo`'s preset: `tiny` shrunk to 2+2 layers, d_model 64, on the built-in
    corpus."""
    config = tiny()
    # Sized so that `t5x-lite demo` runs all ten Table 2 points (pre-training, fine-tuning and
    # evaluation) in under 10 minutes on 2 CPU cores (8 min 4 s measured, 2026-12-01).
    config.model.update(d_model=64, d_ff=256, num_heads=4, d_kv=16, num_layers=2, vocab_size=2048)
    config.objective.update(inputs_length=32, targets_length=None)
    config.train.update(batch_size=8, steps=200, warmup_steps=20, learning_rate=2e-3)
    # The held-out loss at steps 100 and 200, on 128 chunks of the docs text that the 1,600
    # chunks it trains on never include.
    config.train.update(eval_every=100, eval_batches=16)
    config.checkpoint.update(every=100)
    return config


def cpu() -> ml_collections.ConfigDict:
    """Table 2 on a 2-core, 24 GB CPU machine in about 3 hours (10 points x 3 seeds).

    2+2 layers, d_model 128, d_ff 512, 4 heads, vocabulary 4096 (1.4 M parameters for the
    encoder-decoder, 0.9 M for the decoder-only models), batch 16 x 64 inputs, 700 AdamW steps
    (lr 2e-3, cosine) on the English wiki text under `data.data_root`: 0.7 M raw tokens per
    point. A pre-training step costs 0.20-0.38 CPU-seconds (0.30 averaged over the grid) and
    XLA keeps ~1.8 cores busy, so 700 steps take ~2 min; with the three 200-step fine-tunings
    and their evaluations a (point, seed) costs ~630 CPU-seconds, ~5.8 min, and all 30 ~2.9 h.
    Measured on a shared machine (one run alone: 373 s, so ~3.1 h for all 30); the arithmetic,
    caveats and the measured table are in experiments/README.md.
    """
    config = tiny()
    config.model.update(d_model=128, d_ff=512, num_heads=4, d_kv=32, num_layers=2,
                        vocab_size=4096)
    config.objective.update(inputs_length=64, targets_length=None)
    config.train.update(batch_size=16, steps=700, warmup_steps=50, learning_rate=2e-3)
    # The held-out loss every 100 steps, on 128 chunks of the wiki text (11,200 trained on).
    config.train.update(eval_every=100, eval_batches=8)
    config.checkpoint.update(every=350)
    pretrain_on_data_root(config)
    return config


PRESETS: dict[str, Callable[[], ml_collections.ConfigDict]] = {
    "tiny": tiny, "small": small, "paper": paper, "demo": demo, "cpu": cpu,
}


def get_preset(name: str) -> ml_collections.ConfigDict:
    """Return a fresh config for the named preset."""
    if name not in PRESETS:
        raise ConfigError(f"preset={name!r} does not exist; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]()


def get_config(name: str = "tiny") -> ml_collections.ConfigDict:
    """`config_flags` entry point: `--config=path/to/presets.py:NAME` selects a preset."""
    return get_preset(name)


# The downstream tasks a sweep fine-tunes every grid point on, one task at a time (GLUE's as one
# task, `grid.finetune_runs`).
# Generated from the built-in corpus (no downloads): a seq2seq and a classification task.
BUILTIN_TASKS = ("builtin_reverse", "builtin_module")
# The small real sets under ../shared/data (`data.data_root`), standing in for the paper's
# tasks (local_glue_qnli has no training split, so it is left out).
LOCAL_TASKS = (
    "local_glue_cola", "local_glue_sst2", "local_glue_mrpc", "local_glue_stsb", "local_glue_rte",
    "local_squad", "local_dialogsum", "local_multi30k_ende", "local_multi30k_enfr",
    "local_rosts_enro",
)
# The paper's tasks from the TFDS catalog (prepared in data.data_dir); SuperGLUE is not
# registered in data.tasks, so the SGLUE column stays empty. MNLI is `glue_mnli` (trained on
# MNLI's train split, validated on validation_matched): glue_mnli_matched / _mismatched hold
# validation splits only, so a sweep could not fine-tune on them.
PAPER_TASKS = (
    "glue_cola", "glue_sst2", "glue_mrpc", "glue_stsb", "glue_qqp", "glue_mnli", "glue_qnli",
    "glue_rte", "cnn_dailymail", "squad", "wmt_ende", "wmt_enfr", "wmt_enro",
)
# The local tasks the `cpu` preset fine-tunes on: single-sentence classification, a sentence
# pair (similarity as 26-way generation) and translation (generation).
CPU_TASKS = ("local_glue_sst2", "local_glue_stsb", "local_multi30k_ende")


@dataclasses.dataclass(frozen=True)
class _Sweep:
    """What `sweep_preset` adds to a preset: the tasks, the seeds, `config.finetune` fields
    and whether GLUE's tasks are fine-tuned as one (`grid.finetune_runs`; the paper's way)."""

    tasks: tuple[str, ...]
    finetune: dict
    seeds: tuple[int, ...] = (0,)
    glue_as_one_task: bool = False


# The paper fine-tunes for 2^18 steps with batch 128 and a constant learning rate of 1e-3
# (Adafactor, its state and update count carried on from the pre-training, as T5's code does),
# GLUE's tasks as one; `small` does too (scaled down). `paper` fine-tunes each task at T5's
# targets length for it (task_lengths: 84 for GLUE, 97 for SQuAD, 512 for CNN/DM and WMT;
# `tasks.T5_TARGETS_LENGTHS`), which `small`'s local stand-ins do not have. `cpu` fine-tunes
# each task alone, as its measured tables (experiments/README.md) were made, and 200 steps on
# sst2 and stsb mixed would give stsb under a twelfth of them; `tiny` and `demo` have no GLUE
# task. The smaller presets scale steps and lengths down with their pre-training, and
# `tiny` / `demo` / `cpu` fine-tune with AdamW like their pre-training (in a few hundred steps
# it learns where Adafactor at 1e-3 barely moves).
_SWEEPS = {
    "paper": _Sweep(PAPER_TASKS, dict(
        steps=2**18, batch_size=128, inputs_length=512, targets_length=128, task_lengths=True,
        eval_every=5000, optimizer_state="continue"), glue_as_one_task=True),
    "small": _Sweep(LOCAL_TASKS, dict(
        steps=2**13, batch_size=64, inputs_length=512, targets_length=128, eval_every=1000,
        optimizer_state="continue"), glue_as_one_task=True),
    "tiny": _Sweep(BUILTIN_TASKS, dict(
        steps=500, batch_size=16, inputs_length=128, targets_length=32, eval_every=250,
        eval_examples=200, optimizer="adamw", learning_rate=1e-3)),
    "demo": _Sweep(BUILTIN_TASKS, dict(
        steps=200, batch_size=16, inputs_length=64, targets_length=32, eval_every=200,
        eval_examples=None, optimizer="adamw", learning_rate=3e-3)),
    "cpu": _Sweep(CPU_TASKS, dict(
        steps=200, batch_size=16, inputs_length=96, targets_length=64, eval_every=200,
        eval_examples=500, optimizer="adamw", learning_rate=1e-3), seeds=(0, 1, 2)),
}


def apply_finetune_settings(config: ml_collections.ConfigDict, name: str) -> None:
    """Set `config.finetune` to preset `name`'s fine-tuning settings (`_SWEEPS`): the one
    definition that a sweep point (`sweep_preset`) and `t5x-lite finetune / eval --preset NAME`
    (`finetune_preset`) both read, so the two fine-tune alike. `finetune.tasks` is left alone:
    a sweep sets it to each of its fine-tuning runs' tasks (`grid.finetune_runs`)."""
    config.finetune.update(_SWEEPS[name].finetune)


def finetune_preset(name: str) -> ml_collections.ConfigDict:
    """The preset `name` with its fine-tuning settings (`apply_finetune_settings`) and, as
    `finetune.tasks`, its sweep's tasks: the config `t5x-lite finetune / eval --preset NAME`
    start from, whose `finetune` section is that of a sweep point of NAME."""
    config = get_preset(name)
    apply_finetune_settings(config, name)
    config.finetune.tasks = _SWEEPS[name].tasks
    return config


def sweep_preset(name: str) -> ml_collections.ConfigDict:
    """The preset `name` plus its fine-tuning settings (`apply_finetune_settings`) and the
    sweep section: `sweep.tasks` (fine-tuned one at a time, but GLUE's together under
    `sweep.glue_as_one_task`: `grid.finetune_runs`), `sweep.seeds` (each grid point
    runs once per seed), `sweep.progress` (train progress), `sweep.budget` /
    `sweep.budget_reference` (what the points' pre-training steps match: `config.BUDGETS`) and
    `sweep.zero_shot` (default False; True also scores each classification task zero-shot
    on the pre-trained model, before fine-tuning: `t5x_lite.zero_shot`).

    The data root (and the corpus derived from it) is the preset's own, so `t5x-lite train
    --preset NAME` and a sweep of NAME read the same data."""
    config = get_preset(name)
    settings = _SWEEPS[name]
    apply_finetune_settings(config, name)
    config.objective.targets_length = None  # each objective's own; the sweep's layout pads
    config.sweep = ml_collections.ConfigDict(
        dict(tasks=settings.tasks, seeds=settings.seeds, progress=True, budget="steps",
             zero_shot=False, glue_as_one_task=settings.glue_as_one_task))
    # None: the grid's first point (`grid.expand`, "Compute-matched sweeps").
    config.sweep.budget_reference = ml_collections.config_dict.placeholder(str)
    return config
