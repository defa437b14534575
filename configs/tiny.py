"""The `tiny` preset as an ml_collections config file, for `--config=configs/tiny.py`.

Override any field on the command line, e.g. `--config.train.steps=100`.
"""
import ml_collections

from t5x_lite import presets


def get_config() -> ml_collections.ConfigDict:
    """A fresh `tiny` config (`presets.tiny`): what `--config=configs/tiny.py` loads."""
    return presets.tiny()
