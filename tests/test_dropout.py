"""layers.dropout and the random bits behind it: Threefry-2x32 against JAX's and a published
known-answer vector, the drop rate and scaling, masks that do not depend on sharding, and a
fine-tuning run's steps keyed apart from pre-training's."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.random import threefry_2x32 as jax_threefry_2x32
from jax.sharding import NamedSharding, PartitionSpec

from t5x_lite import finetune, train_state
from t5x_lite.layers import dropout, random_bits, threefry_2x32
from tiny_configs import tiny_train_config


def test_threefry_matches_jax_and_the_random123_known_answer():
    key = jax.random.bits(jax.random.key(0), (2,), jnp.uint32)
    counter = jax.random.bits(jax.random.key(1), (2, 50), jnp.uint32)
    ours = threefry_2x32((key[0], key[1]), (counter[0], counter[1]))
    expected = jax_threefry_2x32(key, counter.reshape(-1))  # first halves, then second halves
    np.testing.assert_array_equal(jnp.concatenate(ours), expected)
    # Random123's kat_vectors: threefry2x32_20 with zero key and counter.
    zero = jnp.uint32(0)
    words = threefry_2x32((zero, zero), (zero, zero))
    assert [int(word) for word in words] == [0x6B200159, 0x99BA4EFE]


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_dropout_drops_the_rate_and_keeps_the_mean(rate):
    x = jnp.ones((16, 12, 1000))  # [batch, length, features]
    out = np.asarray(dropout(x, rate, jax.random.key(0)))
    dropped = out == 0
    assert abs(dropped.mean() - rate) < 0.015  # binomial sd over 16000 masks is <= 0.004
    np.testing.assert_allclose(out[~dropped], 1.0 / (1.0 - rate), rtol=1e-6)
    # As T5 drops: one mask per (example, feature), the same at every position of the
    # sequence (Mesh TensorFlow's noise shape without the length axis; T5X's broadcast_dims).
    assert (dropped == dropped[:, :1, :]).all()
    # Examples and features are not copies of each other (each mask has its own counter).
    assert not np.array_equal(dropped[0, 0], dropped[1, 0])
    assert not np.array_equal(dropped[:, 0, 0], dropped[:, 0, 1])


def test_dropout_is_identity_without_a_key_or_at_rate_zero():
    x = jax.random.normal(jax.random.key(0), (4, 8))
    np.testing.assert_array_equal(dropout(x, 0.3, None), x)
    np.testing.assert_array_equal(dropout(x, 0.0, jax.random.key(1)), x)


def test_random_bits_do_not_depend_on_sharding():
    shape, key = (8, 4, 6), jax.random.key(3)
    whole = jax.jit(random_bits, static_argnums=1)(key, shape)
    mesh = jax.make_mesh((8,), ("data",))
    sharded = jax.jit(random_bits, static_argnums=1,
                      out_shardings=NamedSharding(mesh, PartitionSpec("data")))(key, shape)
    assert len(sharded.sharding.device_set) == 8
    np.testing.assert_array_equal(sharded, whole)
    assert len(np.unique(np.asarray(whole))) == whole.size  # no repeated counters


def test_random_bits_refuses_more_than_its_counter_can_index():
    with pytest.raises(ValueError, match=r"fewer than 2\^32 values; shape \(65536, 65536\)"):
        random_bits(jax.random.key(0), (2**16, 2**16))


def test_fine_tuning_steps_draw_a_stream_of_their_own(tmp_path, monkeypatch):
    """Both runs count their steps from 0, and fine-tuning was given pre-training's step key:
    its step n drew pre-training step n's dropout masks (T5's are shared along the length,
    so the same [batch, 1, d] mask wherever the batch and width agree, as in `paper`)."""
    planned = []

    def stop_at_set_up(plan, **_):
        planned.append(plan)
        raise RuntimeError("planned")

    monkeypatch.setattr(finetune, "set_up", stop_at_set_up)
    config = tiny_train_config()
    config.finetune.tasks = ("builtin_reverse",)
    with pytest.raises(RuntimeError, match="planned"):
        finetune.finetune(config, tmp_path / "ft", init_from=None, progress=False)
    (key,) = planned[0].step_args
    seed = config.train.seed
    pretrain_dropout = train_state.batch_and_dropout_keys(train_state.step_key(seed), 0)[1]
    finetune_dropout = train_state.batch_and_dropout_keys(key, 0)[1]
    assert not np.array_equal(jax.random.key_data(finetune_dropout),
                              jax.random.key_data(pretrain_dropout))
    assert np.array_equal(jax.random.key_data(key),
                          jax.random.key_data(train_state.finetune_key(seed)))
