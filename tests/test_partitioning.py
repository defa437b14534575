"""Mesh construction, the logical-axis rule table, and state / batch shardings (8 CPU devices)."""

import jax
import ml_collections
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from t5x_lite import partitioning
from t5x_lite.config import ConfigError, default_config

RULES = partitioning.normalize_rules(default_config().mesh.rules)


def mesh_cfg(shape, names=("data", "model")):
    return ml_collections.ConfigDict(dict(shape=shape, axis_names=names))


def test_mesh_fills_the_one_minus_one_from_the_device_count():
    assert len(jax.devices()) == 8
    mesh = partitioning.make_mesh(mesh_cfg((-1, 2)))
    assert dict(mesh.shape) == {"data": 4, "model": 2}
    mesh = partitioning.make_mesh(mesh_cfg((2, -1, 2), ("data", "fsdp", "model")))
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "model": 2}
    assert partitioning.make_mesh(mesh_cfg((-1, 1)), jax.devices()[:1]).devices.size == 1


def test_a_mesh_that_leaves_out_a_process_s_devices_is_refused():
    """Two processes of two devices each (device objects as multi-process JAX lists them): a
    (2, 1) mesh would hold process 0's devices only, and process 1 could feed its share of the
    batch nowhere."""
    import types

    devices = [types.SimpleNamespace(id=i, process_index=i // 2) for i in range(4)]
    with pytest.raises(ConfigError, match=r"^mesh.shape=\(2, 1\) uses 2 of the 4 devices, "
                       r"none of process 1: every process feeds its share of the batch to its "
                       r"own devices; use -1 in one axis$"):
        partitioning.make_mesh(mesh_cfg((2, 1)), devices)


def _fake_devices(owners):
    """Device stand-ins for a mesh array: `owners[i]` is flat device i's process."""
    import types

    return np.array([types.SimpleNamespace(id=i, process_index=p)
                     for i, p in enumerate(owners)], dtype=object)


def test_a_pod_slice_s_topology_order_is_made_host_contiguous():
    """On a TPU pod slice `create_device_mesh` walks the torus: a v4-32's (16, 1) mesh holds
    processes 0, 1, 2, 3, 0, 1, ... along the data axis (JAX's own mock v4 devices, reviewer's
    run), so process 0's contiguous rows would land at rows 0, 4, 8, 12 and validation would
    score predictions against other examples. Reordered, each process's four devices are
    consecutive, each process's in their topology order."""
    grid = _fake_devices([0, 1, 2, 3] * 4).reshape(16, 1)
    ordered = partitioning.host_contiguous(grid)
    assert [d.process_index for d in ordered.reshape(-1)] == sorted([0, 1, 2, 3] * 4)
    assert [d.id for d in ordered.reshape(-1)[:4]] == [0, 4, 8, 12]
    rules = RULES
    partitioning.require_rows_by_process(ordered, ("data", "model"), rules, (16, 1))
    with pytest.raises(ConfigError, match=r"^mesh.shape=\(16, 1\) splits the batch over the mesh "
                       r"axes \(data\) so that its rows, in 16 equal blocks, lie on processes "
                       r"\['0', '1', '2', '3', '0', .*not the model axis across processes\)$"):
        partitioning.require_rows_by_process(grid, ("data", "model"), rules, (16, 1))


@pytest.mark.parametrize("shape, owners, fits", [
    ((4, 2), [0, 0, 0, 0, 1, 1, 1, 1], True),   # each process: 2 data rows x the model axis
    ((2, 4), [0, 0, 0, 0, 1, 1, 1, 1], True),   # a process per data index
    ((1, 8), [0, 0, 0, 0, 1, 1, 1, 1], False),  # the model axis across processes: every
    ((2, 4), [0, 0, 1, 1, 0, 0, 1, 1], False),  # process holds every row; or the same block
])
def test_every_process_must_hold_its_own_share_of_the_rows(shape, owners, fits):
    """Each process feeds rows p*B/P ... (p+1)*B/P - 1 (data.pipeline); a mesh whose batch
    axes put other rows on its devices was a JAX traceback at the first step (after the
    folders and the initialiser), or a silently permuted batch."""
    rules = RULES
    grid = _fake_devices(owners).reshape(shape)
    if fits:
        partitioning.require_rows_by_process(grid, ("data", "model"), rules, shape)
    else:
        with pytest.raises(ConfigError, match=r"^mesh.shape=.* each of the 2 processes feeds "
                                              r"its own contiguous share of the rows"):
            partitioning.require_rows_by_process(grid, ("data", "model"), rules, shape)


@pytest.mark.parametrize(
    "shape, names, message",
    [
        ((16, 1), ("data", "model"), r"mesh.shape=\(16, 1\) needs 16 devices but only 8"),
        ((-1, -1), ("data", "model"), r"mesh.shape=\(-1, -1\) may contain at most one -1"),
        ((-1, 3), ("data", "model"), r"mesh.shape=\(-1, 3\): 8 devices are not divisible by 3"),
        ((4, 0), ("data", "model"), r"mesh.shape=\(4, 0\) must hold 2 positive integers"),
        ((8,), ("data", "model"), r"mesh.shape=\(8,\) must hold 2 positive integers"),
        ((8, 1), ("batch", "model"), r"mesh.axis_names=.*choose one of \('data', 'model'\)"),
    ],
)
def test_bad_mesh_is_rejected_naming_the_field(shape, names, message):
    with pytest.raises(ConfigError, match=f"^{message}") as error:
        partitioning.make_mesh(mesh_cfg(shape, names))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "rules, message",
    [
        ((("sequence", None),), "names unknown logical axis 'sequence'; choose from batch"),
        ((("batch", "pipeline"),),
         "maps 'batch' to unknown mesh axis 'pipeline'; choose from data, fsdp, model"),
        ((("mlp", "model"), ("mlp", None)), "lists logical axis 'mlp' twice"),
        ((("mlp",),), r"entry \('mlp',\) must be a \(logical_axis, mesh_axes\) pair"),
    ],
)
def test_bad_rules_are_rejected_naming_the_field(rules, message):
    with pytest.raises(ConfigError, match=f"^mesh.rules {message}") as error:
        partitioning.normalize_rules(rules)
    assert "\n" not in str(error.value)


def test_batch_must_split_evenly_over_data_axis_and_microbatches():
    mesh = partitioning.make_mesh(mesh_cfg((4, 2)))
    partitioning.validate_batch_split(16, 2, mesh, RULES)  # 16 = 4 shards x 2 micro-batches x 2
    with pytest.raises(
        ConfigError, match=r"train.batch_size=12 .* \(4\) x train.microbatches \(2\) = 8"
    ):
        partitioning.validate_batch_split(12, 2, mesh, RULES)
    with pytest.raises(ConfigError, match="train.microbatches=0"):
        partitioning.validate_batch_split(16, 0, mesh, RULES)


def test_logical_to_spec_follows_the_rule_table():
    mesh = partitioning.make_mesh(mesh_cfg((2, 4)))
    fsdp = partitioning.make_mesh(mesh_cfg((2, 2, 2), ("data", "fsdp", "model")))
    # No fsdp axis in the mesh: embed is replicated; heads / mlp / vocab go to 'model'.
    assert partitioning.logical_to_spec(("embed", "heads", "kv"), RULES, mesh) == P(
        None, "model", None
    )
    assert partitioning.logical_to_spec(("embed", "heads", "kv"), RULES, fsdp) == P(
        "fsdp", "model", None
    )
    assert partitioning.logical_to_spec(("batch", "length"), RULES, mesh) == P("data", None)
    assert partitioning.logical_to_spec(("batch", "length"), RULES, fsdp) == P(
        ("data", "fsdp"), None
    )
    # A mesh axis is used once per array: the second claimant is replicated.
    assert partitioning.logical_to_spec(("heads", "mlp"), RULES, mesh) == P("model", None)
    # A dimension the axis does not divide (6 heads over 4 devices) stays replicated.
    assert partitioning.logical_to_spec(("embed", "heads"), RULES, mesh, shape=(32, 6)) == P(
        None, None
    )
    # Of several axes, the longest run from the first that divides: 6 rows over data 2 (not
    # data x fsdp = 4); they were all dropped.
    assert partitioning.logical_to_spec(("batch", "length"), RULES, fsdp, shape=(6, 5)) == P(
        "data", None
    )


def test_a_rule_the_mesh_cannot_follow_is_named_with_the_memory_it_costs():
    """T5-base's 12 heads over a model axis of 8 stayed whole on every device, 38 % of its
    train state, without a word (resilience review); here the demo's 4 heads over 8."""
    from t5x_lite import presets, train_state

    config = presets.demo()
    config.mesh.shape = (1, 8)
    mesh = partitioning.make_mesh(config.mesh)
    with pytest.warns(UserWarning, match=r"the mesh's axes do not divide some dimensions the "
                      r"mesh.rules shard, so those stay whole on every device: heads 4 over "
                      r"model 8 \([0-9.]+ MiB of the state\), of [0-9.]+ MiB in all"):
        state = train_state.abstract_state(config, mesh)
    query = state.params["encoder"]["layers"][0]["self_attention"]["query"].value
    assert query.sharding.spec == P(None, None, None)


class _Toy(nnx.Module):
    def __init__(self):
        # [256, 128] is factored by Adafactor (two dims >= 128); [16, 8] is not.
        self.big = nnx.Param(jax.numpy.zeros((256, 128)), logical_axes=("embed", "mlp"))
        self.small = nnx.Param(jax.numpy.zeros((16, 8)), logical_axes=("vocab", "embed"))
        self.scale = nnx.Param(jax.numpy.zeros((16,)), logical_axes=("embed",))


def _abstract_state(tx):
    params = nnx.state(nnx.eval_shape(_Toy), nnx.Param)
    return _Obj(params, jax.eval_shape(tx.init, params))


class _Obj:
    """A stand-in train state exposing `.params` (registered below as a pytree)."""

    def __init__(self, params, opt_state):
        self.params, self.opt_state = params, opt_state


jax.tree_util.register_pytree_with_keys(
    _Obj,
    lambda o: (
        (
            (jax.tree_util.GetAttrKey("params"), o.params),
            (jax.tree_util.GetAttrKey("opt_state"), o.opt_state),
        ),
        None,
    ),
    lambda _, children: _Obj(*children),
)


def _specs_by_path(shardings):
    return {
        jax.tree_util.keystr(p): s.spec
        for p, s in jax.tree_util.tree_flatten_with_path(shardings)[0]
    }


def test_adafactor_factored_moments_keep_the_axes_of_the_dimension_they_keep():
    mesh = partitioning.make_mesh(mesh_cfg((2, 2, 2), ("data", "fsdp", "model")))
    specs = _specs_by_path(
        partitioning.state_shardings(_abstract_state(optax.adafactor(1e-2)), mesh, RULES)
    )
    assert specs[".params['big'].value"] == P("fsdp", "model")
    # optax factors over the two largest dims: v_row drops the largest (256, embed) and keeps
    # [128] = mlp; v_col drops the other (128, mlp) and keeps [256] = embed.
    v_row = [s for p, s in specs.items() if "v_row" in p and "'big'" in p]
    v_col = [s for p, s in specs.items() if "v_col" in p and "'big'" in p]
    assert v_row == [P("model")] and v_col == [P("fsdp")]
    # Unfactored: the full second moment mirrors the parameter; (1,) placeholders replicate.
    assert [s for p, s in specs.items() if ".v[" in p and "'small'" in p] == [P("model", "fsdp")]
    assert [s for p, s in specs.items() if "v_row" in p and "'small'" in p] == [P()]
    assert [s for p, s in specs.items() if "count" in p] == [P()]


def test_moments_of_an_attention_kernel_seen_as_t5_s_matrix_keep_its_axes():
    """Adafactor sees an attention kernel [d_model, heads, d_kv] as [d_model, heads x d_kv]
    (`optim._attention_kernels_as_matrices`): its moments, full or factored, follow the
    kernel's axes, the merged dimension named as its first (they were replicated)."""
    axes = ("embed", "heads", "kv")
    assert partitioning._axes_for_leaf((512, 256), (512, 8, 32), axes) == ("embed", "heads")
    assert partitioning._axes_for_leaf((512,), (512, 8, 32), axes) == ("embed",)
    assert partitioning._axes_for_leaf((256,), (512, 8, 32), axes) == ("heads",)
    out = ("heads", "kv", "embed")  # the output projection, and a scanned stack's kernel
    assert partitioning._axes_for_leaf((256, 512), (8, 32, 512), out) == ("heads", "embed")
    assert partitioning._axes_for_leaf((6, 512, 256), (6, 512, 8, 32), ("layers", *axes)) == (
        "layers", "embed", "heads")
    # The parameter's own shape first: a factored moment of the kernel as it is.
    assert partitioning._axes_for_leaf((512, 32), (512, 8, 32), axes) == ("embed", "kv")
    assert partitioning._axes_for_leaf((3,), (512, 8, 32), axes) is None


def test_adam_moments_mirror_their_parameters():
    mesh = partitioning.make_mesh(mesh_cfg((4, 2)))
    state = _abstract_state(optax.adamw(1e-3))
    specs = _specs_by_path(partitioning.state_shardings(state, mesh, RULES))
    mu = {p.split("mu")[1]: s for p, s in specs.items() if "mu" in p}
    assert mu == {
        "['big'].value": P(None, "model"),
        "['small'].value": P("model", None),
        "['scale'].value": P(None),
    }
    assert {p.split("nu")[1]: s for p, s in specs.items() if ".nu" in p} == mu


def test_parameters_without_logical_axes_are_an_error():
    params = nnx.state(nnx.eval_shape(lambda: nnx.Linear(2, 3, rngs=nnx.Rngs(0))), nnx.Param)
    mesh = partitioning.make_mesh(mesh_cfg((8, 1)))
    with pytest.raises(ValueError, match=r"parameter \['bias'\] has no logical_axes"):
        partitioning.state_shardings(_Obj(params, ()), mesh, RULES)


def test_batch_sharding_splits_rows_over_data():
    mesh = partitioning.make_mesh(mesh_cfg((4, 2)))
    sharding = partitioning.batch_sharding(mesh, RULES)
    assert sharding.shard_shape((16, 10)) == (4, 10)
