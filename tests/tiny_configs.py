"""Tiny configs shared by the tests, the multi-host worker script and the test experiment files,
and the sharding check the training tests share.

A plain module (not a fixture) so `tests/test_multihost.py` can import it when it runs as a
worker process; the tests directory is on `sys.path` both under pytest and as a script.
"""
import jax
import numpy as np
from flax import nnx

from t5x_lite import architectures, models, presets
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
    allowed = architectures.get(arch).objectives  # encoder_only: bert_style or mass_style
    if allowed is not None and config.objective.name not in allowed:
        config.objective.name = allowed[0]
    config.train.update(
        batch_size=8, optimizer="adafactor", learning_rate=0.1, warmup_steps=1, steps=100,
        **train_fields,
    )
    config.mesh.shape = mesh
    return config


def tiny_finetune_config(arch, corpus, data_dir, tasks=("test_reverse",)):
    """`tiny_train_config` widened to d_model 64, on one device, reading the text files
    `corpus` (a glob; vocabulary cached under `data_dir`): 2 pre-training steps on 32-token
    chunks, 2 fine-tuning steps with batch 8 on 16 + 16 tokens."""
    config = tiny_train_config(arch, mesh=(1, 1), log_every=1)
    config.model.update(d_model=64, d_ff=128, d_kv=16)
    config.train.update(learning_rate=0.01, steps=2)
    config.data.update(corpus=str(corpus), data_dir=str(data_dir))
    config.finetune.update(tasks=tasks, steps=2, batch_size=8, inputs_length=16,
                           targets_length=16, eval_every=100, eval_examples=16)
    config.checkpoint.update(every=100, keep=1)
    return config


def tiny_sweep_config(preset, task="builtin_reverse"):
    """The sweep preset `preset` shrunk for tests: a 1-layer, d_model 32 model with vocabulary
    256, 6 pre-training steps on 16-token inputs, 4 fine-tuning steps on `task` with validation
    on 8 examples. Experiment files written by the tests return it from `get_config`."""
    config = presets.sweep_preset(preset)
    config.model.update(d_model=32, d_ff=64, num_heads=2, d_kv=16, num_layers=1,
                        vocab_size=256, num_sentinels=16)
    config.objective.update(inputs_length=16, mean_noise_span_length=3.0)
    config.train.update(batch_size=4, steps=6, warmup_steps=1, log_every=2)
    config.mesh.shape = (1, 1)
    config.checkpoint.every = 2
    config.finetune.update(steps=4, batch_size=4, inputs_length=24, targets_length=16,
                           eval_every=4, eval_examples=8)
    config.sweep.update(tasks=(task,), progress=False)
    return config


def write_letter_corpus(root, prefix, letters, per_line=8):
    """Write root/corpus.txt for the fine-tuning tests' vocabulary: 300 lines of 8 made-up
    words, then 1,000 lines of `prefix` and `per_line` of `letters`, so each letter becomes a
    piece.
    Returns (corpus glob, data dir) for `tiny_finetune_config`."""
    import numpy as np

    rng = np.random.default_rng(0)
    words = ["".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), rng.integers(2, 7)))
             for _ in range(300)]
    lines = [" ".join(rng.choice(words, 8)) for _ in range(300)]
    lines += [f"{prefix}: " + " ".join(rng.choice(list(letters), per_line)) for _ in range(1000)]
    (root / "corpus.txt").write_text("\n".join(lines) + "\n")
    return root / "corpus.txt", root / "cache"


# The default rule table, written out independently: (data, model) meshes have no fsdp axis.
EXPECTED_MESH_AXIS = {"vocab": "model", "heads": "model", "mlp": "model"}


def assert_params_follow_default_rules(params, mesh):
    """Every parameter of the `nnx.State` `params` is sharded on the ('data', 'model') `mesh`
    as `EXPECTED_MESH_AXIS` maps its logical axes (jax is imported here, not at the top, so
    the multi-host worker can set up jax before importing this module)."""
    import jax
    from flax import nnx
    from jax.sharding import NamedSharding, PartitionSpec

    is_param = lambda x: isinstance(x, nnx.Variable)  # noqa: E731
    for path, param in jax.tree_util.tree_flatten_with_path(params, is_leaf=is_param)[0]:
        axes = param.get_metadata()["logical_axes"]
        expected = NamedSharding(mesh, PartitionSpec(*(EXPECTED_MESH_AXIS.get(a) for a in axes)))
        assert param.get_value().sharding.is_equivalent_to(expected, len(axes)), path


def random_model(config, seed=0):
    """A model of `config` with large random weights (norm scales in [0.5, 1.5], the rest
    N(0, 1)), so its outputs and rankings depend on the inputs, unlike a fresh init's."""
    model = models.build_model(config.model, nnx.Rngs(0))
    rng = np.random.default_rng(seed)
    nnx.update(model, jax.tree_util.tree_map_with_path(
        lambda path, x: (rng.uniform(0.5, 1.5, x.shape) if "norm" in jax.tree_util.keystr(path)
                         else rng.normal(0.0, 1.0, x.shape)).astype(x.dtype),
        nnx.state(model, nnx.Param)))
    return model
