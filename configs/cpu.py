"""The `cpu` preset as an ml_collections config file, for `--config=configs/cpu.py`.

Override any field on the command line, e.g. `--config.train.steps=100`.
"""
from t5x_lite import presets


def get_config():
    return presets.cpu()
