"""Device mesh, logical-axis rules and the shardings of the train state and the batch.

Every parameter carries `logical_axes` metadata (e.g. `('embed', 'mlp')`). A short rule table
(`config.mesh.rules`) maps each logical name to zero or more mesh axes, t5x-style:

    batch -> (data, fsdp)   vocab/heads/mlp -> model   embed -> fsdp   kv/length/... -> replicated

Mesh axes named by a rule but absent from the mesh are ignored, so one table serves a
('data', 'model') mesh and a ('data', 'fsdp', 'model') one. This module knows nothing about
layers: it reads the metadata that `nnx.eval_shape` leaves on the abstract state.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from t5x_lite.config import ConfigError

MESH_AXES = ("data", "fsdp", "model")
MESH_AXIS_LAYOUTS = (("data", "model"), ("data", "fsdp", "model"))
LOGICAL_AXES = ("batch", "length", "embed", "vocab", "heads", "kv", "mlp", "relpos_buckets",
                "layers")

Rules = Mapping[str, tuple[str, ...]]


def normalize_rules(rules: Iterable[tuple[str, Any]]) -> dict[str, tuple[str, ...]]:
    """Turn `config.mesh.rules` pairs into {logical name: tuple of mesh axes}, validating names.

    A rule's target may be None (replicated), one mesh axis name, or a tuple of them.
    """
    table: dict[str, tuple[str, ...]] = {}
    for entry in rules:
        if not (isinstance(entry, (tuple, list)) and len(entry) == 2):
            raise ConfigError(
                f"mesh.rules entry {entry!r} must be a (logical_axis, mesh_axes) pair"
            )
        logical, target = entry
        if logical not in LOGICAL_AXES:
            raise ConfigError(
                f"mesh.rules names unknown logical axis {logical!r}; "
                f"choose from {', '.join(LOGICAL_AXES)}"
            )
        if logical in table:
            raise ConfigError(f"mesh.rules lists logical axis {logical!r} twice")
        axes = () if target is None else (target,) if isinstance(target, str) else tuple(target)
        for axis in axes:
            if axis not in MESH_AXES:
                raise ConfigError(
                    f"mesh.rules maps {logical!r} to unknown mesh axis {axis!r}; "
                    f"choose from {', '.join(MESH_AXES)} or None"
                )
        table[logical] = axes
    return table


def resolve_mesh_shape(mesh_cfg: ml_collections.ConfigDict, num_devices: int) -> tuple[int, ...]:
    """Validate `config.mesh` against the device count and fill in its one allowed -1."""
    names = tuple(mesh_cfg.axis_names)
    if names not in MESH_AXIS_LAYOUTS:
        raise ConfigError(
            f"mesh.axis_names={names!r} is not allowed; choose one of "
            + " or ".join(repr(layout) for layout in MESH_AXIS_LAYOUTS)
        )
    shape = tuple(mesh_cfg.shape)
    if len(shape) != len(names) or not all(
        isinstance(s, int) and (s == -1 or s > 0) for s in shape
    ):
        raise ConfigError(
            f"mesh.shape={shape!r} must hold {len(names)} positive integers (one may be -1) "
            f"for mesh.axis_names={names!r}"
        )
    if shape.count(-1) > 1:
        raise ConfigError(f"mesh.shape={shape!r} may contain at most one -1")
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        if num_devices % known:
            raise ConfigError(
                f"mesh.shape={shape!r}: {num_devices} devices are not divisible by {known}"
            )
        shape = tuple(num_devices // known if s == -1 else s for s in shape)
    if math.prod(shape) > num_devices:
        raise ConfigError(
            f"mesh.shape={shape!r} needs {math.prod(shape)} devices but only {num_devices} "
            "are available"
        )
    return shape


def make_mesh(
    mesh_cfg: ml_collections.ConfigDict, devices: Sequence[jax.Device] | None = None
) -> Mesh:
    """Build the mesh of `config.mesh` over `devices` (default: all devices of all processes):
    over the first `prod(mesh.shape)` of them, so a shape without -1 may use fewer than all
    (tests put (1, 1) meshes on 8 simulated devices); -1 in one axis uses every device. A mesh
    that leaves out every device of a process is a `ConfigError`: each process feeds its share
    of the batch to its own devices."""
    pool = list(jax.devices() if devices is None else devices)
    shape = resolve_mesh_shape(mesh_cfg, len(pool))
    devices = pool[: math.prod(shape)]
    left_out = sorted({d.process_index for d in pool} - {d.process_index for d in devices})
    if left_out:
        raise ConfigError(
            f"mesh.shape={tuple(mesh_cfg.shape)!r} uses {len(devices)} of the {len(pool)} "
            f"devices, none of process {', '.join(map(str, left_out))}: every process feeds "
            "its share of the batch to its own devices; use -1 in one axis"
        )
    # create_device_mesh orders devices by physical topology on TPU/GPU; a plain reshape on CPU.
    grid = host_contiguous(mesh_utils.create_device_mesh(shape, devices))
    names = tuple(mesh_cfg.axis_names)
    if len({d.process_index for d in devices}) > 1:
        require_rows_by_process(grid, names, normalize_rules(mesh_cfg.rules), mesh_cfg.shape)
    return Mesh(grid, names)


def host_contiguous(devices: np.ndarray) -> np.ndarray:
    """A mesh's array of `devices` reordered so that each process's devices are consecutive in
    its flat order, in process order, each process's otherwise as they were. On a TPU pod
    slice `create_device_mesh` walks the torus, which interleaves hosts along the first axis
    (a v4-32's (16, 1) mesh: processes 0, 1, 2, 3, 0, 1, ...), while each process feeds a
    contiguous share of every batch's rows (`require_rows_by_process`): the global batch would
    be permuted and validation would score predictions against other examples' references.
    T5X tiles its meshes by host for the same reason."""
    flat = devices.reshape(-1)
    order = sorted(range(flat.size), key=lambda i: flat[i].process_index)  # stable
    return flat[order].reshape(devices.shape)


def require_rows_by_process(devices: np.ndarray, axis_names: Sequence[str], rules: Rules,
                            shape: Any) -> None:
    """A one-line `ConfigError` naming `mesh.shape` unless splitting a batch's rows over the
    batch axes (`rules`' "batch" axes present in `axis_names`) gives process p exactly the
    p-th of P equal, contiguous shares, which is what it feeds (`data.pipeline`): a batch
    replicated over an axis that spans processes (a model axis across hosts) would need every
    process to feed every row, and shares out of order would permute the batch."""
    processes = sorted({d.process_index for d in devices.reshape(-1)})
    split = [axis_names.index(a) for a in rules.get("batch", ()) if a in axis_names]
    rest = [i for i in range(len(axis_names)) if i not in split]
    owners = np.vectorize(lambda d: d.process_index, otypes=[int])(devices)
    blocks = np.transpose(owners, split + rest).reshape(math.prod(
        devices.shape[i] for i in split), -1)  # row block i: the processes holding it
    wanted = [[p] for p in processes for _ in range(len(blocks) // len(processes))]
    found = [sorted(set(block.tolist())) for block in blocks]
    if found != wanted:
        axes = ", ".join(axis_names[i] for i in split) or "none"
        raise ConfigError(
            f"mesh.shape={tuple(shape)!r} splits the batch over the mesh axes ({axes}) so that "
            f"its rows, in {len(blocks)} equal blocks, lie on processes "
            f"{['/'.join(map(str, b)) for b in found]}; each of the {len(processes)} processes "
            "feeds its own contiguous share of the rows, so the batch axes must split into a "
            "multiple of the process count with each process's devices on its own share "
            "(put the devices of a process on the model axis, not the model axis across "
            "processes)")


def batch_axes(mesh: Mesh, rules: Rules) -> tuple[str, ...]:
    """The mesh axes the batch dimension is split over (those of the 'batch' rule in this mesh)."""
    return tuple(a for a in rules.get("batch", ()) if a in mesh.axis_names)


def validate_process_split(batch_size: int, field: str) -> None:
    """Every process feeds an equal, contiguous share of a batch's rows; `field` names the
    batch size in the error."""
    processes = jax.process_count()
    if batch_size % processes:
        raise ConfigError(
            f"{field}={batch_size} must be divisible by the number of processes ({processes}): "
            "each process feeds an equal share of every batch's rows"
        )


def validate_batch_split(batch_size: int, microbatches: int, mesh: Mesh, rules: Rules,
                         field: str = "train.batch_size") -> None:
    """Every process must feed an equal share of the rows, and every device get whole
    examples of every micro-batch; `field` names the batch size in the errors."""
    if not isinstance(microbatches, int) or microbatches < 1:
        raise ConfigError(f"train.microbatches={microbatches!r} must be a positive integer")
    validate_process_split(batch_size, field)
    _require_whole_shards(batch_size, microbatches,
                          math.prod(mesh.shape[a] for a in batch_axes(mesh, rules)), field)


def validate_batch_split_on(mesh_cfg: ml_collections.ConfigDict, num_devices: int,
                            batch_size: int, microbatches: int, field: str) -> None:
    """`validate_batch_split` for the mesh `config.mesh` makes of `num_devices` devices that
    this process does not hold (a sweep's worker processes, checked before they start): the
    mesh fits them (`resolve_mesh_shape`) and every device gets whole examples."""
    shape = resolve_mesh_shape(mesh_cfg, num_devices)
    batch = normalize_rules(mesh_cfg.rules).get("batch", ())
    _require_whole_shards(batch_size, microbatches, math.prod(
        size for size, name in zip(shape, mesh_cfg.axis_names) if name in batch), field)


def _require_whole_shards(batch_size: int, microbatches: int, shards: int, field: str) -> None:
    if batch_size % (shards * microbatches):
        raise ConfigError(
            f"{field}={batch_size} must be divisible by the batch-sharding mesh size "
            f"({shards}) x train.microbatches ({microbatches}) = {shards * microbatches}"
        )


def logical_to_spec(
    logical_axes: Sequence[str | None], rules: Rules, mesh: Mesh, shape: Sequence[int] | None = None
) -> PartitionSpec:
    """PartitionSpec for an array whose dimensions have the given logical names.

    A mesh axis is used at most once per array (the first dimension claiming it wins). When
    `shape` is given, a dimension keeps the longest run of its rule's mesh axes, from the first,
    whose sizes divide it, and stays replicated when none does (`state_shardings` warns of
    those, with what they cost).
    """
    return _spec_and_replicated(logical_axes, rules, mesh, shape)[0]


def _spec_and_replicated(
    logical_axes: Sequence[str | None], rules: Rules, mesh: Mesh, shape: Sequence[int] | None
) -> tuple[PartitionSpec, list[str]]:
    """`logical_to_spec`'s spec, and 'heads 12 over model 8' per dimension whose rule's mesh
    axes did not all divide it."""
    used: set[str] = set()
    entries: list[str | tuple[str, ...] | None] = []
    dropped = []
    for dim, name in enumerate(logical_axes):
        axes = tuple(a for a in rules.get(name, ()) if a in mesh.axis_names and a not in used)
        if shape is not None:
            wanted = axes
            while axes and shape[dim] % math.prod(mesh.shape[a] for a in axes):
                axes = axes[:-1]
            if axes != wanted:
                dropped.append(f"{name} {shape[dim]} over "
                               + " x ".join(f"{a} {mesh.shape[a]}" for a in wanted[len(axes):]))
        used.update(axes)
        entries.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*entries), dropped


def _key_name(key: Any) -> Any:
    """The plain dict key / index / attribute name inside a jax key-path entry."""
    for attr in ("key", "idx", "name"):
        if hasattr(key, attr):
            return getattr(key, attr)
    return key


def _param_table(params: Any) -> dict[tuple, tuple[tuple[int, ...], tuple[str, ...]]]:
    """{path inside params (plain keys): (shape, logical axes)} for every Param in the tree."""
    table = {}
    is_var = lambda x: isinstance(x, nnx.Variable)  # noqa: E731
    for path, var in jax.tree_util.tree_flatten_with_path(params, is_leaf=is_var)[0]:
        axes = var.get_metadata().get("logical_axes") if is_var(var) else None
        if axes is None:
            raise ValueError(f"parameter {jax.tree_util.keystr(path)} has no logical_axes metadata")
        table[tuple(_key_name(k) for k in path) + ("value",)] = (
            tuple(var.get_value().shape),
            tuple(axes),
        )
    return table


def _axes_for_leaf(
    leaf_shape: tuple[int, ...], param_shape: tuple[int, ...], axes: tuple[str, ...]
) -> tuple[str, ...] | None:
    """Logical axes of an optimizer leaf that belongs to a parameter, or None (replicate).

    Same shape (Adam moments, Adafactor's unfactored v): the parameter's axes. One dimension
    fewer (Adafactor's factored row/column moments): the parameter's axes minus the reduced
    dimension. When two dimensions have equal size either reading fits the shape and gives a
    valid sharding; we take the first. Failing those, the same of the parameter seen with two
    adjacent dimensions merged, named as the first of them: Adafactor sees an attention
    kernel `[d_model, heads, d_kv]` as T5's matrix `[d_model, heads x d_kv]`
    (`optim._attention_kernels_as_matrices`), whose moments were left whole on every device.
    """
    merged = [(param_shape[:dim] + (param_shape[dim] * param_shape[dim + 1],)
               + param_shape[dim + 2:], axes[:dim + 1] + axes[dim + 2:])
              for dim in range(len(param_shape) - 1)]
    for shape, names in [(param_shape, axes), *merged]:
        if leaf_shape == shape:
            return names
        if len(leaf_shape) == len(shape) - 1:
            for dim in range(len(shape)):
                if shape[:dim] + shape[dim + 1:] == leaf_shape:
                    return names[:dim] + names[dim + 1:]
    return None


def state_shardings(abstract_state: Any, mesh: Mesh, rules: Rules) -> Any:
    """NamedShardings (same tree as `abstract_state`) for a train state with `.params`.

    Parameters follow the rule table through their `logical_axes`. Any other leaf whose key
    path ends with a parameter's path (optax keeps the parameter tree inside its state) mirrors
    that parameter as `_axes_for_leaf` describes; everything else (step, counts) is replicated.
    """
    table = _param_table(abstract_state.params)
    suffix_lengths = sorted({len(p) for p in table}, reverse=True)
    replicated: dict[str, int] = {}  # 'heads 12 over model 8' -> the state's bytes it leaves whole

    def sharding_for(path, leaf) -> NamedSharding:
        keys = tuple(_key_name(k) for k in path)
        for n in suffix_lengths:
            if len(keys) >= n and keys[-n:] in table:
                param_shape, axes = table[keys[-n:]]
                leaf_axes = _axes_for_leaf(tuple(leaf.shape), param_shape, axes)
                if leaf_axes is not None:
                    spec, dropped = _spec_and_replicated(leaf_axes, rules, mesh, leaf.shape)
                    for what in dropped:
                        replicated[what] = replicated.get(what, 0) + _nbytes(leaf)
                    return NamedSharding(mesh, spec)
                break
        return NamedSharding(mesh, PartitionSpec())

    shardings = jax.tree_util.tree_map_with_path(sharding_for, abstract_state)
    if replicated:  # the rule table asked for more than the mesh can give: say what it costs
        total = sum(_nbytes(leaf) for leaf in jax.tree_util.tree_leaves(abstract_state))
        warnings.warn(
            "the mesh's axes do not divide some dimensions the mesh.rules shard, so those "
            "stay whole on every device: " + "; ".join(
                f"{what} ({size / 2**20:.1f} MiB of the state)"
                for what, size in sorted(replicated.items())) + f", of {total / 2**20:.1f} MiB "
            "in all; choose mesh.shape axes that divide them (e.g. model.num_heads)",
            stacklevel=2)
    return shardings


def _nbytes(leaf: Any) -> int:
    return math.prod(leaf.shape) * jnp.dtype(leaf.dtype).itemsize


def batch_sharding(mesh: Mesh, rules: Rules) -> NamedSharding:
    """Sharding of [batch, length] arrays: rows split over the batch axes, length replicated."""
    return NamedSharding(mesh, logical_to_spec(("batch", "length"), rules, mesh))
