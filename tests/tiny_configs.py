"""The tiny training config shared by the train-step tests and the multi-host worker script.

A plain module (not a fixture) so `tests/test_multihost.py` can import it when it runs as a
worker process; the tests directory is on `sys.path` both under pytest and as a script.
"""
from t5x_lite.config import default_config

INPUTS_LENGTH = 32


def tiny_train_config(arch="encoder_decoder", mesh=(-1, 1), **train_fields):
    """A 2-layer, d_model 32 model with vocabulary 160 (32 sentinels), batch 8, Adafactor."""
    config = default_config()
    config.model.update(
        arch=arch, d_model=32, d_ff=64, num_heads=4, d_kv=8, num_layers=2, vocab_size=160,
        num_sentinels=32, dropout_rate=0.0,
    )
    config.objective.update(inputs_length=INPUTS_LENGTH, targets_length=None)
    config.train.update(
        batch_size=8, optimizer="adafactor", learning_rate=0.1, warmup_steps=1, steps=100,
        **train_fields,
    )
    config.mesh.shape = mesh
    return config
