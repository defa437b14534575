"""The `cpu` preset as an ml_collections config file, for `--config=configs/cpu.py`.

Override any field on the command line, e.g. `--config.train.steps=100`.
"""
import ml_collections

from t5x_lite import presets


def get_config() -> ml_collections.ConfigDict:
    """A fresh `cpu` config (`presets.cpu`): what `--config=configs/cpu.py` loads."""
    return presets.cpu()
