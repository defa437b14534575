"""Checkpointer: sharded round trip, schedule and retention, damaged checkpoints, config checks,
params-only restore. (Saving on SIGTERM / SIGINT is the loop's: test_loop.)"""
import copy
import gc
import json
import logging
import os
import pathlib
import shutil
import sys
import types
import warnings

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import nnx, struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from t5x_lite import finetune
from t5x_lite.checkpointing import (STEP_METADATA_FILE, Checkpointer, restore_params_only,
                                    save_began_ns, saved_layout_differences)
from t5x_lite.config import ConfigError, default_config
from t5x_lite.errors import CheckpointsUnreadable
from t5x_lite.saved_config import (BATCH_LAYOUT_FILE, RESUME_FIELDS, config_as_json,
                                   config_differences, read_saved_config)

# A failed tensorstore read (the damaged-checkpoint tests) can leave a callback for orbax's
# already closed event loop, reported whenever it is garbage-collected: noise, not ours.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:(?s).*Event loop is closed:pytest.PytestUnraisableExceptionWarning"
)


class Toy(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.kernel = nnx.Param(jax.random.normal(rngs.params(), (8, 6)), logical_axes=("embed", "mlp"))
        self.bias = nnx.Param(jnp.zeros((6,)), logical_axes=("mlp",))


@struct.dataclass
class ToyState:
    """Stands in for train_state.TrainState: step, nnx params and optax state in one pytree."""
    step: jax.Array
    params: nnx.State
    opt_state: optax.OptState


def make_state(seed: int = 0) -> ToyState:
    _, params = nnx.split(Toy(nnx.Rngs(seed)), nnx.Param)
    return ToyState(jnp.array(0), params, optax.adam(1e-3).init(params))


def advance(state: ToyState, steps: int) -> ToyState:
    """A state that differs from `state` in every leaf, as after `steps` updates."""
    return jax.tree.map(lambda x: x + steps, state)


def place(state: ToyState, matrix_spec: P, mesh: Mesh) -> ToyState:
    """Put 2-D leaves under `matrix_spec`, everything else replicated."""
    return jax.tree.map(
        lambda x: jax.device_put(x, NamedSharding(mesh, matrix_spec if x.ndim == 2 else P())), state
    )


def abstract(state: ToyState) -> ToyState:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)


def assert_same_values(a, b) -> None:
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture
def config():
    config = default_config()
    config.model.update(d_model=32, d_ff=64, num_layers=2, vocab_size=256)
    return config


@pytest.fixture
def mesh():
    return Mesh(np.array(jax.devices()[:2]).reshape(2, 1), ("data", "model"))


def save_steps(directory, config, states: dict[int, ToyState], *, every=1, keep=5) -> None:
    with Checkpointer(directory, every=every, keep=keep, config=config) as ckpt:
        for step, state in states.items():
            assert ckpt.maybe_save(step, state)


def test_round_trip_restores_into_the_target_sharding(tmp_path, config, mesh):
    saved = place(advance(make_state(), 3), P("data", None), mesh)
    save_steps(tmp_path, config, {3: saved})
    # Restore under a different layout: the target's sharding wins, not the saved one.
    target = abstract(place(make_state(), P(None, "data"), mesh))
    with Checkpointer(tmp_path, every=1, keep=5, config=config) as ckpt:
        restored = ckpt.restore(target)
    assert isinstance(restored, ToyState)
    assert_same_values(restored, saved)
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(target), strict=True):
        assert got.sharding == want.sharding
    kernel = restored.params["kernel"][...]
    assert {shard.data.shape for shard in kernel.addressable_shards} == {(8, 3)}


def test_saves_every_k_steps_and_keeps_the_last_n(tmp_path, config):
    state = make_state()
    with Checkpointer(tmp_path, every=2, keep=2, config=config) as ckpt:
        assert [step for step in range(1, 8) if ckpt.should_save(step)] == [2, 4, 6]
        started = [step for step in range(1, 8) if ckpt.maybe_save(step, advance(state, step))]
        assert started == [2, 4, 6]
        assert ckpt.maybe_save(7, advance(state, 7), force=True)
        assert not ckpt.maybe_save(7, advance(state, 7), force=True)  # already saved
        assert not ckpt.should_save(6)  # saved already
        ckpt.wait()
        assert ckpt._manager.all_steps() == [6, 7]
        assert_same_values(ckpt.restore(abstract(state)), advance(state, 7))


def test_a_save_s_start_time_is_its_own_kept_by_a_copy_and_new_for_a_new_save(tmp_path, config):
    state = make_state()
    save_steps(tmp_path / "run", config, {2: advance(state, 2), 4: advance(state, 4)})
    began = {step: save_began_ns(tmp_path / "run", step) for step in (2, 4)}
    assert all(isinstance(ns, int) for ns in began.values()) and began[2] < began[4]
    shutil.copytree(tmp_path / "run", tmp_path / "copy")
    assert save_began_ns(tmp_path / "copy", 4) == began[4]
    save_steps(tmp_path / "again", config, {4: advance(state, 4)})
    assert save_began_ns(tmp_path / "again", 4) > began[4]
    # No time to read: no such save, or a damaged metadata file (restoring reports that).
    assert save_began_ns(tmp_path / "run", 6) is None
    (tmp_path / "run" / "4" / STEP_METADATA_FILE).write_bytes(b"\xff not json")
    assert save_began_ns(tmp_path / "run", 4) is None


def truncate_array_data(step_dir: pathlib.Path) -> None:
    for path in (step_dir / "default").rglob("d/*"):
        with open(path, "r+b") as handle:
            handle.truncate(os.path.getsize(path) // 2)


def delete_manifest(step_dir: pathlib.Path) -> None:
    (step_dir / "default" / "manifest.ocdbt").unlink()


def delete_item_folder(step_dir: pathlib.Path) -> None:
    shutil.rmtree(step_dir / "default")  # a step orbax would then read as of several items


@pytest.mark.parametrize("damage", [truncate_array_data, delete_manifest, delete_item_folder])
def test_damaged_latest_falls_back_to_previous_with_warning(tmp_path, config, damage):
    state = make_state()
    save_steps(tmp_path, config, {2: advance(state, 2), 4: advance(state, 4)})
    damage(tmp_path / "4")
    # Read as a source of parameters (finetune --init_from, eval, export) too.
    with pytest.warns(UserWarning, match="checkpoint at step 4 .* is unreadable"):
        params = restore_params_only(tmp_path, abstract(state).params, config=config)
    assert_same_values(params, advance(state, 2).params)
    with Checkpointer(tmp_path, every=2, keep=5, config=config) as ckpt:
        with pytest.warns(UserWarning, match="checkpoint at step 4 .* is unreadable"):
            restored = ckpt.restore(abstract(state))
        assert_same_values(restored, advance(state, 2))
        # The damaged step is set aside, so the resumed run can save step 4 again.
        assert ckpt.latest_step() == 2
        assert [p.name.split("-")[0] for p in (tmp_path / "unreadable").iterdir()] == ["4"]
        assert ckpt.maybe_save(4, advance(state, 40))
    with Checkpointer(tmp_path, every=2, keep=5, config=config) as ckpt:
        assert_same_values(ckpt.restore(abstract(state)), advance(state, 40))


def test_no_readable_checkpoint_raises(tmp_path, config):
    state = make_state()
    save_steps(tmp_path, config, {2: state})
    delete_manifest(tmp_path / "2")
    with Checkpointer(tmp_path, every=2, keep=5, config=config) as ckpt:
        with pytest.warns(UserWarning, match="step 2"):
            with pytest.raises(CheckpointsUnreadable, match="none of the checkpoints .* could "
                               "be restored .* starts over with --restart"):
                ckpt.restore(abstract(state))
    # Read as a source of parameters (finetune --init_from, eval, export), --restart would not
    # help: not offered.
    with pytest.warns(UserWarning, match="step 2"):
        with pytest.raises(CheckpointsUnreadable, match=r"step's error\)$"):
            restore_params_only(tmp_path, abstract(state).params, config=config)


def test_after_a_failed_read_its_leftovers_are_dropped_and_nothing_else(
        tmp_path, config, monkeypatch):
    """A failed read leaves tracebacks behind its one-line warning: tensorstore's reader
    threads calling back into orbax's closed event loop ("Event loop is closed" through
    `sys.unraisablehook`), orbax's reading coroutines nobody awaits any more (unraisable too)
    and asyncio's "exception was never retrieved" records of its tasks: ~2,000 lines around
    `t5x-lite eval`'s output for one truncated step. Those are dropped, any other kept."""
    gc.collect()  # earlier tests' leftovers, collected later, would reach the hook below
    seen, logged = [], []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    asyncio_log = logging.getLogger("asyncio")
    monkeypatch.setattr(asyncio_log, "filters", list(asyncio_log.filters))
    state = make_state()
    save_steps(tmp_path, config, {2: state})
    delete_manifest(tmp_path / "2")
    with Checkpointer(tmp_path, every=2, keep=5, config=config) as ckpt:
        with pytest.warns(UserWarning, match="step 2"), pytest.raises(CheckpointsUnreadable):
            ckpt.restore(abstract(state))

    def unraisable(error, obj=None):
        return types.SimpleNamespace(exc_type=type(error), exc_value=error, exc_traceback=None,
                                     err_msg=None, object=obj)

    def coroutine(folder, name):
        return types.SimpleNamespace(cr_code=types.SimpleNamespace(
            co_filename=os.path.join(folder, "serialization.py"), co_name=name))

    orbax_folder = os.path.dirname(ocp.__file__)
    closed, reader, other, ours, saving = (
        unraisable(RuntimeError("Event loop is closed")),
        unraisable(Exception("Encountered error while reading array index"),
                   coroutine(orbax_folder, "_read_array_index_and_device_put")),
        unraisable(RuntimeError("a callback of ours failed")),
        unraisable(Exception("a coroutine of ours failed"),
                   coroutine(str(tmp_path), "_read_shard")),
        unraisable(OSError("No space left on device"), coroutine(orbax_folder, "_finalize")))
    for item in (closed, reader, other, ours, saving):
        sys.unraisablehook(item)
    assert seen == [other, ours, saving]
    handler = logging.Handler()
    handler.emit = logged.append
    asyncio_log.addHandler(handler)
    try:
        asyncio_log.error("Task exception was never retrieved\nfuture: <Task finished "
                          "coro=<async_deserialize() defined at .../orbax/checkpoint/...>>")
        asyncio_log.error("_GatheringFuture exception was never retrieved\nfuture: "
                          "<_GatheringFuture exception=Exception('Encountered error while "
                          "reading array index: ...')>")
        asyncio_log.error("Task exception was never retrieved\nfuture: <Task of ours>")
        asyncio_log.error("Task exception was never retrieved\nfuture: <Task coro=<_finalize() "
                          "defined at .../orbax/checkpoint/...> exception=OSError('No space')>")
    finally:
        asyncio_log.removeHandler(handler)
    assert [record.getMessage().split("\n")[1][:20] for record in logged] == [
        "future: <Task of our", "future: <Task coro=<"]


def test_a_run_saved_before_a_field_was_added_resumes_only_as_it_began(config):
    """Configs saved before 2026-12-05 have no `model.attention_dropout` (the weights were never
    dropped), `finetune.eval_selection` (the first eval_examples) nor
    `finetune.optimizer_state` (a fresh one): each reads as that, so a run with dropout (or a
    fine-tuning now set to continue) resumes only when told to go on as it began; where
    the field changes nothing (no dropout, every example scored) it resumes as it is. Starting
    another run from the checkpoint (fine-tuning, eval: `("model",)`) may drop or not."""
    config.model.dropout_rate = 0.1
    config.finetune.update(eval_examples=100, optimizer_state="continue")
    now = config_as_json(config)
    saved = copy.deepcopy(now)
    for section, field in (("model", "attention_dropout"), ("finetune", "eval_selection"),
                           ("finetune", "optimizer_state")):
        del saved[section][field]
    resume = (*RESUME_FIELDS, *finetune._FINETUNE_RESUME_FIELDS)  # a fine-tuning run's
    assert config_differences(saved, now, resume) == [
        "finetune.eval_selection: saved 'first' != now 'sample'",
        "finetune.optimizer_state: saved 'fresh' != now 'continue'",
        "model.attention_dropout: saved False != now True"]
    assert config_differences(saved, now, ("model",)) == []
    as_before = copy.deepcopy(now)
    as_before["model"]["attention_dropout"] = False
    as_before["finetune"].update(eval_selection="first", optimizer_state="fresh")
    assert config_differences(saved, as_before, resume) == []
    for section, field, value in (("model", "dropout_rate", 0.0),
                                  ("finetune", "eval_examples", None),
                                  ("finetune", "optimizer_state", "fresh")):
        saved[section][field] = now[section][field] = value
    assert config_differences(saved, now, resume) == []
    # A resume may change the dropout rate, which switches the attention dropout with it: a run
    # saved today with dropout 0 (attention_dropout True, in effect off) resumes at 0.1, and
    # back. Only a run whose saved attention_dropout is False is held to it.
    today = config_as_json(config)
    today["model"]["dropout_rate"] = 0.0
    later = copy.deepcopy(today)
    later["model"]["dropout_rate"] = 0.1
    assert config_differences(today, later, resume) == []
    assert config_differences(later, today, resume) == []
    today["model"]["attention_dropout"] = False
    assert config_differences(today, later, resume) == [
        "model.attention_dropout: saved False != now True"]


def test_a_fine_tuning_run_resumes_only_with_the_mode_token_it_began_with(config):
    """UL2's paradigm token changes every task input: one run's validations with and without
    it would be picked among as one; a run saved before the field resumes as None."""
    resume = (*RESUME_FIELDS, *finetune._FINETUNE_RESUME_FIELDS)
    now = config_as_json(config)
    saved = copy.deepcopy(now)
    del saved["finetune"]["mode_token"]
    assert config_differences(saved, now, resume) == []
    now["finetune"]["mode_token"] = "[NLU]"
    assert config_differences(saved, now, resume) == [
        "finetune.mode_token: saved None != now '[NLU]'"]


def test_incompatible_config_is_refused_listing_the_fields(tmp_path, config):
    save_steps(tmp_path, config, {1: make_state()})
    changed = config.copy_and_resolve_references()
    changed.model.d_model = 64
    changed.objective.inputs_length = 128
    with pytest.raises(ConfigError, match=r"(?s)model\.d_model: saved 32 != now 64.*"
                       r"objective\.inputs_length: saved 512 != now 128.*--restart"):
        Checkpointer(tmp_path, every=1, keep=5, config=changed)


def test_a_refused_run_saved_before_a_field_was_added_is_told_the_overrides_it_began_with(
        tmp_path, config):
    """Its config.json lacks the added fields; the refusal names the overrides that resume it
    as it began, those the resume compares only (no fine-tuning field for a pre-training)."""
    config.model.dropout_rate = 0.1
    config.finetune.update(eval_examples=100, optimizer_state="continue")
    save_steps(tmp_path, config, {1: make_state()})
    saved = json.loads((tmp_path / "config.json").read_text())
    for section, field in (("model", "attention_dropout"), ("finetune", "eval_selection"),
                           ("finetune", "optimizer_state")):
        del saved[section][field]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    with pytest.raises(ConfigError) as refused:
        Checkpointer(tmp_path, every=1, keep=5, config=config,
                     resume_fields=(*RESUME_FIELDS, *finetune._FINETUNE_RESUME_FIELDS))
    assert str(refused.value).endswith(
        "resume with the saved settings (--config.model.attention_dropout=False "
        "--config.finetune.eval_selection=first --config.finetune.optimizer_state=fresh), or "
        "pass --restart to delete these checkpoints and start over")
    with pytest.raises(ConfigError, match=r"model.attention_dropout: saved False != now True\n"
                       r"resume with the saved settings \(--config.model.attention_dropout="
                       r"False\), or pass --restart"):
        Checkpointer(tmp_path, every=1, keep=5, config=config)


def test_a_run_may_require_more_fields_to_resume(tmp_path, config):
    save_steps(tmp_path, config, {1: make_state()})
    changed = config.copy_and_resolve_references()
    changed.finetune.tasks = ("glue_sst2",)
    with pytest.raises(ConfigError, match=r"finetune\.tasks: saved \[\] != now \['glue_sst2'\]"):
        Checkpointer(tmp_path, every=1, keep=5, config=changed,
                     resume_fields=RESUME_FIELDS + ("finetune.tasks",))
    Checkpointer(tmp_path, every=1, keep=5, config=changed).close()  # not a default field


def test_checkpoints_of_examples_laid_out_otherwise_are_refused(tmp_path, config):
    """A pre-training run saves what its examples read beyond its config (its layout record)
    with its checkpoints; training on under another record is refused, naming the fields,
    from the newest step or the one a damaged newest fell back to, while a run with no step
    left (scored, fine-tuned) is not, and keeps its record; one saved before records were
    kept resumes and records it, and --restart starts over."""
    before = {"raw_length": 557, "objective_lengths": [557, 512, 127], "denoisers": []}
    now = {**before, "raw_length": 511, "objective_lengths": [511, 512, 118]}
    with Checkpointer(tmp_path, every=1, keep=5, config=config, batch_layout=before) as ckpt:
        assert ckpt.maybe_save(1, make_state())
        assert ckpt.maybe_save(2, make_state())
    assert json.loads((tmp_path / BATCH_LAYOUT_FILE).read_text()) == before
    with Checkpointer(tmp_path, every=1, keep=5, config=config, batch_layout=now) as ckpt:
        for restored, total in ((None, 3), (1, 2)):  # the newest (2), or a fall-back to 1
            with pytest.raises(ConfigError, match=(
                    r"pre-trained on examples laid out otherwise, .*:\n"
                    r"  objective_lengths: saved \[557, 512, 127\] != now \[511, 512, 118\]\n"
                    r"  raw_length: saved 557 != now 511\nresume with .* or pass --restart")):
                ckpt.require_same_examples(restored, total)
        ckpt.require_same_examples(None, 2)  # finished: nothing reads its examples again
    assert json.loads((tmp_path / BATCH_LAYOUT_FILE).read_text()) == before
    with Checkpointer(tmp_path, every=1, keep=5, config=config, batch_layout=before) as ckpt:
        ckpt.require_same_examples(None, 3)
    Checkpointer(tmp_path, every=1, keep=5, config=config).close()  # a run without one
    (tmp_path / BATCH_LAYOUT_FILE).write_text("{")
    with pytest.raises(ConfigError, match=rf"^{tmp_path / BATCH_LAYOUT_FILE} is damaged"):
        Checkpointer(tmp_path, every=1, keep=5, config=config, batch_layout=before)
    (tmp_path / BATCH_LAYOUT_FILE).unlink()  # as saved before layout records were kept
    Checkpointer(tmp_path, every=1, keep=5, config=config, batch_layout=now).close()
    assert json.loads((tmp_path / BATCH_LAYOUT_FILE).read_text()) == now
    with Checkpointer(tmp_path, every=1, keep=5, config=config, batch_layout=before,
                      restart=True) as ckpt:
        assert ckpt.latest_step() is None
    assert json.loads((tmp_path / BATCH_LAYOUT_FILE).read_text()) == before


def test_run_settings_may_change_on_resume_and_the_change_is_said(tmp_path, config):
    """A resume may change what leaves the saved state's meaning alone; it says which, as the
    saved config is replaced (a learning rate changed on resume was silent). A sweep's own
    settings (more seeds or tasks: the same sweep) and fields added since the save are no
    change."""
    config.sweep = ml_collections.ConfigDict(dict(tasks=("builtin_reverse",), seeds=(0,)))
    save_steps(tmp_path, config, {1: make_state()})
    changed = config.copy_and_resolve_references()
    changed.train.update(steps=10, learning_rate=0.5)
    changed.model.dtype = "bfloat16"
    changed.mesh.shape = (2, 4)
    changed.train.eval_every = 5  # observes only: no change
    with Checkpointer(tmp_path, every=1, keep=5, config=changed, require_existing=True) as ckpt:
        assert ckpt.latest_step() == 1
        with warnings.catch_warnings():  # a finished run trains with none of them
            warnings.simplefilter("error")
            ckpt.note_changed_settings(10, 10)
        with pytest.warns(UserWarning, match=(
                rf"^resuming from {tmp_path} at step 1 with settings changed since it was "
                r"saved: mesh.shape: saved \[-1, 1\] != now \[2, 4\]; model.dtype: saved "
                r"'float32' != now 'bfloat16'; train.learning_rate: saved 1.0 != now 0.5; "
                r"train.steps: saved 524288 != now 10$")):
            ckpt.note_changed_settings(1, 10)
    assert read_saved_config(tmp_path)["train"]["learning_rate"] == 0.5
    extended = changed.copy_and_resolve_references()
    extended.sweep.update(tasks=("builtin_reverse", "builtin_module"), seeds=(0, 1))
    extended.train.added_since = 3  # as a field a later version adds
    with Checkpointer(tmp_path, every=1, keep=5, config=extended) as ckpt:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ckpt.note_changed_settings(1, 10)


def test_checkpoints_without_saved_config_open_with_a_warning(tmp_path, config):
    save_steps(tmp_path, config, {1: make_state()})
    (tmp_path / "config.json").unlink()
    with pytest.warns(UserWarning, match="holds checkpoints but no config.json"):
        Checkpointer(tmp_path, every=1, keep=5, config=config).close()
    assert (tmp_path / "config.json").exists()  # recorded for the next time


def test_restart_deletes_old_checkpoints(tmp_path, config, caplog):
    save_steps(tmp_path, config, {1: make_state()})
    changed = config.copy_and_resolve_references()
    changed.model.vocab_size = 512
    with caplog.at_level(logging.WARNING, logger="t5x_lite.checkpointing"):
        with Checkpointer(tmp_path, every=1, keep=5, config=changed, restart=True) as ckpt:
            assert ckpt.latest_step() is None
    assert "deleting the old checkpoints" in caplog.text
    # The folder now belongs to the new config.
    Checkpointer(tmp_path, every=1, keep=5, config=changed).close()


def test_resume_request_without_checkpoint(tmp_path, config):
    with pytest.raises(ConfigError, match="resume requested but .* holds no checkpoint"):
        Checkpointer(tmp_path, every=1, keep=5, config=config, require_existing=True)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(every=0, keep=1), r"checkpoint\.every=0 must be an integer >= 1"),
        (dict(every=1, keep=1.5), r"checkpoint\.keep=1\.5 must be an integer >= 1"),
        (dict(every=1, keep=1, restart=True, require_existing=True), "pass only one of them"),
    ],
)
def test_bad_arguments(tmp_path, config, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        Checkpointer(tmp_path, config=config, **kwargs)
    assert not tmp_path.joinpath("config.json").exists()  # rejected before touching the folder


def test_an_optimiser_state_saved_in_another_layout_is_told_from_the_metadata(tmp_path, config):
    """`finetune.optimizer_state='continue'` checks the saved optimiser state against its
    program's before any work (a state of an older layout would not restore): the shapes of
    the newest step's arrays, from orbax's metadata, against the program's; each difference
    is one line naming the array."""
    state = make_state()
    save_steps(tmp_path, config, {1: advance(state, 1), 3: advance(state, 3)})
    shapes = jax.eval_shape(lambda: state.opt_state)
    assert saved_layout_differences(tmp_path, {"opt_state": shapes}) == []
    # Adam's moments of the kernel held flat, as a layout of the kernel as a vector would.
    flat = jax.eval_shape(lambda: optax.adam(1e-3).init(
        jax.tree.map(lambda x: x.reshape(-1), state.params)))
    assert saved_layout_differences(tmp_path, {"opt_state": flat}) == [
        "opt_state/0/mu/kernel/value: saved (8, 6) != now (48,)",
        "opt_state/0/nu/kernel/value: saved (8, 6) != now (48,)"]
    # Another optimiser's state: its arrays are missing from the saved one, and Adam's
    # moments from it.
    other = jax.eval_shape(lambda: optax.adafactor(1e-3).init(state.params))
    differences = saved_layout_differences(tmp_path, {"opt_state": other})
    assert "opt_state/0/mu/kernel/value: saved (8, 6) != now None" in differences
    assert "opt_state/0/v/kernel/value: saved None != now (8, 6)" in differences
    # A newest step whose metadata is damaged is passed over, as restoring passes over it.
    (tmp_path / "3" / "default" / "_METADATA").write_text("{")
    assert saved_layout_differences(tmp_path, {"opt_state": flat})[0] == (
        "opt_state/0/mu/kernel/value: saved (8, 6) != now (48,)")


def test_restore_params_only(tmp_path, config, mesh):
    saved = place(advance(make_state(), 5), P("data", None), mesh)
    save_steps(tmp_path, config, {5: saved})
    target = abstract(place(make_state(), P(None, None), mesh)).params
    params = restore_params_only(tmp_path, target, config=config)
    assert_same_values(params, saved.params)
    assert params["kernel"].get_value().sharding == target["kernel"].get_value().sharding

    other = config.copy_and_resolve_references()
    other.model.num_layers = 4
    other.objective.name = "prefix_lm"  # fine-tuning may change everything but the model
    with pytest.raises(ConfigError, match=r"different model:\n  model\.num_layers: saved 2 != now 4$"):
        restore_params_only(tmp_path, target, config=other)


def test_a_scanned_run_does_not_resume_an_unscanned_checkpoint(tmp_path, config):
    """The README's promise: the two layouts of the layer parameters are not interchangeable,
    and the refusal names the field."""
    save_steps(tmp_path, config, {1: make_state()})
    scanned = config.copy_and_resolve_references()
    scanned.model.scan_layers = True
    with pytest.raises(ConfigError, match=r"model\.scan_layers: saved False != now True"):
        Checkpointer(tmp_path, every=1, keep=5, config=scanned)


def test_a_saved_config_without_the_later_model_fields_reads_as_their_none():
    """Checkpoints written before model.num_decoder_layers / embedding_rows existed resume
    under a config that leaves them None, and only under such a config."""
    from t5x_lite.saved_config import config_differences

    current = default_config()
    saved = current.to_dict()
    for name in ("num_decoder_layers", "embedding_rows"):
        del saved["model"][name]
    assert config_differences(saved, current.to_dict(), RESUME_FIELDS) == []
    current.model.num_decoder_layers = 4
    assert config_differences(saved, current.to_dict(), RESUME_FIELDS) == [
        "model.num_decoder_layers: saved None != now 4"]


def test_switching_adafactor_s_weight_decay_on_or_off_is_refused_as_the_state_differs():
    """Adafactor's state holds a weight-decay stage only for a non-zero rate (optax's
    `weight_decay_rate=None`), so its checkpoints restore under another non-zero rate but not
    with it switched on or off: that is named before the restore, not after every saved step
    has failed to read."""
    from t5x_lite import optim
    from t5x_lite.saved_config import config_differences
    from t5x_lite.settings import Train

    def state_structure(weight_decay):
        config = default_config()
        config.train.update(optimizer="adafactor", weight_decay=weight_decay)
        params = {"kernel": jnp.zeros((4, 4))}
        tx = optim.make_optimizer(Train.from_config(config.train))
        return config.to_dict(), jax.tree.structure(tx.init(params))

    (off, off_tree), (on, on_tree), (other, other_tree) = map(state_structure, (0.0, 0.01, 0.02))
    assert off_tree != on_tree and on_tree == other_tree
    assert config_differences(on, other, ("train.optimizer",)) == []
    for saved, now in ((off, on), (on, off)):
        assert config_differences(saved, now, RESUME_FIELDS) == [
            f"train.weight_decay: saved {saved['train']['weight_decay']!r} != now "
            f"{now['train']['weight_decay']!r} (Adafactor's state holds a weight-decay stage "
            "only when it is non-zero: a resume may change it, not switch it on or off)"]
    adamw = {**on, "train": {**on["train"], "optimizer": "adamw"}}
    assert config_differences(adamw, {**off, "train": {**off["train"], "optimizer": "adamw"}},
                              RESUME_FIELDS) == []


def test_a_saved_config_without_the_ul2_mixture_resumes_unless_the_run_is_ul2():
    """Checkpoints written before objective.ul2_denoisers existed resume under any objective
    that does not read it; a ul2 run compares its mixture."""
    from t5x_lite.saved_config import config_differences

    current = default_config()
    saved = json.loads(current.to_json_best_effort())
    del saved["objective"]["ul2_denoisers"]
    assert config_differences(saved, current.to_dict(), RESUME_FIELDS) == []
    saved["objective"]["name"] = current.objective.name = "ul2"
    differences = config_differences(saved, current.to_dict(), RESUME_FIELDS)
    assert [line.split(":")[0] for line in differences] == ["objective.ul2_denoisers"]
