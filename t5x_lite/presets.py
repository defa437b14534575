"""Named presets: functions that return a full config tree (see `t5x_lite.config`).

- `tiny`: the benchmark preset of the training issue (encoder-decoder, d_model 256, 4+4 layers,
  vocabulary 8192, batch 16 x 128 inputs / 32 targets, float32, AdamW). Minutes on a laptop CPU.
- `small`: T5-small-sized (6+6 layers, d_model 512), for single-accelerator runs.
- `paper`: the paper's baseline (12+12 layers, d_model 768, batch 128 x 512, Adafactor, rsqrt).
- `demo`: smaller than `tiny`, sized for `t5x-lite demo` on a 2-core CPU.
"""
from __future__ import annotations

from typing import Callable

import ml_collections

from t5x_lite.config import ConfigError, default_config


def paper() -> ml_collections.ConfigDict:
    """The T5 paper's baseline setup (Raffel et al. 2020, section 3.1)."""
    return default_config()


def small() -> ml_collections.ConfigDict:
    config = default_config()
    config.model.update(d_model=512, d_ff=2048, num_heads=8, d_kv=64, num_layers=6)
    config.train.update(batch_size=128, steps=2**16)
    config.objective.update(inputs_length=512)
    return config


def tiny() -> ml_collections.ConfigDict:
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
    config = tiny()
    config.model.update(d_model=128, d_ff=512, num_heads=4, d_kv=32, num_layers=2, vocab_size=2048)
    config.objective.update(inputs_length=64, targets_length=None)
    config.train.update(batch_size=8, steps=200, warmup_steps=20, learning_rate=2e-3)
    config.checkpoint.update(every=100)
    return config


PRESETS: dict[str, Callable[[], ml_collections.ConfigDict]] = {
    "tiny": tiny, "small": small, "paper": paper, "demo": demo,
}


def get_preset(name: str) -> ml_collections.ConfigDict:
    """Return a fresh config for the named preset."""
    if name not in PRESETS:
        raise ConfigError(f"preset={name!r} does not exist; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]()


def get_config(name: str = "tiny") -> ml_collections.ConfigDict:
    """`config_flags` entry point: `--config=path/to/presets.py:NAME` selects a preset."""
    return get_preset(name)
