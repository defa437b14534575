"""The `cpu` preset as an ml_collections config file, for `--config=configs/cpu.py`:
every command that takes `--config` runs with it as with `--preset cpu` (fine-tuning and
scoring included).

Override any field on the command line, e.g. `--config.train.steps=100`.
"""
import ml_collections

from t5x_lite import presets


def get_config() -> ml_collections.ConfigDict:
    """A fresh `cpu` config with the preset's fine-tuning settings and tasks
    (`presets.finetune_preset`), which `train` and `bench` do not read."""
    return presets.finetune_preset("cpu")
