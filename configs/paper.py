"""The `paper` preset as an ml_collections config file, for `--config=configs/paper.py`.

Override any field on the command line, e.g. `--config.train.steps=100`.
"""
import ml_collections

from t5x_lite import presets


def get_config() -> ml_collections.ConfigDict:
    """A fresh `paper` config (`presets.paper`): what `--config=configs/paper.py` loads."""
    return presets.paper()
