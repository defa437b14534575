"""Resumable training state on disk: orbax checkpoints, and a resume refused where the saved
config (`t5x_lite.saved_config`) differs in what the checkpoints depend on.

`Checkpointer` owns one run's checkpoint folder (e.g. `workdir/checkpoints`):

    config.json                   the config of the run that wrote the checkpoints
    batch_layout.json             a pre-training run's: what its examples read beyond the config
    <step>/                       one orbax checkpoint of the whole train state per saved step
    unreadable/<step>-<time>/     checkpoints that failed to restore, moved aside for inspection

`step` is the number of optimizer updates applied (the state's own step counter), so a run
restored at step s continues with update s + 1. The input pipeline position is derived from the
step, so the checkpoint is all a resumed run needs. The loop (`t5x_lite.loop.run_loop`, which
also decides when a preempted run saves and stops) uses it like this:

    with Checkpointer(workdir / "checkpoints", every=K, keep=N, config=config) as ckpt:
        state = ckpt.restore(abstract_state) if ckpt.latest_step() is not None else init()
        while step < steps:
            state, metrics = train_step(state, ...); step += 1
            if ckpt.should_save(step):           # every K steps
                ckpt.maybe_save(step, state)     # asynchronous
        ckpt.maybe_save(step, state, force=True) # leaving the block waits for the save

Multi-host: every process makes the same calls with the same step; orbax writes each array
shard from the process that holds it and does the file bookkeeping on process 0.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time
import warnings
from pathlib import Path
from types import TracebackType
from typing import Any, Sequence

import jax
import ml_collections
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint import checkpoint_managers as policies

from t5x_lite.config import ConfigError, flat_fields
from t5x_lite.errors import CheckpointsUnreadable, require_integer
from t5x_lite.results import write_atomically
from t5x_lite.saved_config import (BATCH_LAYOUT_FILE, CONFIG_FILE, OBSERVING_FIELDS,
                                   RESUME_FIELDS, config_as_json, config_differences,
                                   overrides_as_begun, read_saved_config,
                                   saved_batch_layout_differences)

log = logging.getLogger(__name__)

UNREADABLE_DIR = "unreadable"  # in a run's checkpoints folder: the steps that did not restore


def _one_item() -> ocp.PyTreeCheckpointHandler:
    """A manager's handler of its steps' one item, the train state: told so, orbax does not
    guess it per step (a step whose item folder is gone read as one of several items, and
    every older step after it too)."""
    return ocp.PyTreeCheckpointHandler()


def _restore_args(target: Any, partial: bool = False) -> ocp.args.PyTreeRestore:
    """Orbax arguments restoring into `target`'s shapes, dtypes and shardings.

    `target` holds `jax.ShapeDtypeStruct`s with a `.sharding` (or arrays); each process reads
    only the shards its devices hold, so nothing is materialised unsharded.
    """
    return ocp.args.PyTreeRestore(
        target,
        restore_args=ocp.checkpoint_utils.construct_restore_args(target),
        partial_restore=partial,
    )


def _short(error: Exception) -> str:
    """First line of an error, clipped: tensorstore errors carry a page-long spec dump."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:300] if lines else ''}"


def _is_a_failed_read_leftover(unraisable: Any) -> bool:
    """Whether an unraisable exception is what a failed read leaves behind: asyncio's "Event
    loop is closed" RuntimeError, which tensorstore's reader threads raise when they call
    back into orbax's event loop after the read closed it, or the error of one of orbax's
    reading coroutines that nobody awaited any more (each 0 to ~100 traceback lines, between
    and after our own one-line report)."""
    error = unraisable.exc_value
    if isinstance(error, RuntimeError) and str(error) == "Event loop is closed":
        return True
    code = getattr(unraisable.object, "cr_code", None)  # a coroutine's
    return (code is not None and _ORBAX_SOURCE in code.co_filename
            and code.co_name in _ORBAX_READS)


_ORBAX_SOURCE = os.path.dirname(ocp.__file__)
# orbax's coroutines that read an array back, whose errors a failed read leaves unawaited
# (orbax/checkpoint/_src/serialization/serialization.py); a failed save's stay visible.
_ORBAX_READS = ("async_deserialize", "_read_and_create_array", "_read_array_index_and_device_put",
                "_read_shard")


class _FailedReadLeftovers(logging.Filter):
    """Drops asyncio's "... exception was never retrieved" records of a failed read's tasks
    and futures: the future's repr names one of `_ORBAX_READS` or orbax's read error."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("exception was never retrieved" in message
                    and ("Encountered error while reading array index" in message
                         or any(f"<{name}()" in message for name in _ORBAX_READS)))


def _drop_failed_read_leftovers() -> None:
    """From now on in this process, `sys.unraisablehook` drops `_is_a_failed_read_leftover`
    exceptions and the asyncio logger `_FailedReadLeftovers`' records, once a read has failed
    (the only time they come) and been reported as a warning; every other unraisable exception
    goes to the hook replaced, every other record is logged."""
    previous = sys.unraisablehook
    if getattr(previous, "drops_failed_read_leftovers", False):
        return

    def hook(unraisable: Any) -> None:
        if not _is_a_failed_read_leftover(unraisable):
            previous(unraisable)

    hook.drops_failed_read_leftovers = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook
    logging.getLogger("asyncio").addFilter(_FailedReadLeftovers())


def _restore_newest(
    manager: ocp.CheckpointManager, args: ocp.args.PyTreeRestore, way_on: str = "",
    at_most: int | None = None,
) -> tuple[Any, int, list[int]]:
    """Restore the newest checkpoint (of those at or before step `at_most`, when given) that
    reads back; return it, its step and the newer unreadable steps.

    A truncated or damaged step (a crash while the disk filled up, a bad copy) raises from deep
    inside orbax / tensorstore with unrelated exception types (ValueError, JSONDecodeError, bare
    Exception), so any failure counts as "unreadable": it is reported with a warning naming the
    step and the next older step is tried. If none reads back, `CheckpointsUnreadable` chained
    to the newest step's error is raised, ending with `way_on` (what the caller can do).
    """
    steps = sorted((step for step in manager.all_steps() if at_most is None or step <= at_most),
                   reverse=True)
    if not steps:
        raise FileNotFoundError(f"{manager.directory} holds no saved step to restore (its run "
                                "stopped before its first checkpoint)")
    unreadable: list[tuple[int, Exception]] = []
    for step in steps:
        try:
            restored = manager.restore(step, args=args)
        except Exception as error:  # noqa: BLE001 -- reported here, re-raised below if all fail
            _drop_failed_read_leftovers()
            unreadable.append((step, error))
            warnings.warn(
                f"checkpoint at step {step} in {manager.directory} is unreadable "
                f"({_short(error)}); falling back to the previous checkpoint",
                stacklevel=3,
            )
            continue
        log.info("restored the checkpoint at step %d from %s", step, manager.directory)
        return restored, step, [bad for bad, _ in unreadable]
    raise CheckpointsUnreadable(
        f"none of the checkpoints in {manager.directory} (steps {steps}) could be restored "
        f"(the warnings above give each step's error){way_on}"
    ) from unreadable[0][1]


class Checkpointer:
    """Saves and restores one run's train state every `every` steps, keeping the newest `keep`.

    Opening a folder that holds checkpoints of an incompatible config (one that differs in
    `resume_fields`, by default `RESUME_FIELDS`) raises `ConfigError` listing the differences;
    `restart=True` deletes the old checkpoints first. `require_existing=True` (an explicit
    resume request) raises `ConfigError` if there is nothing to resume. Use it as a context
    manager: leaving waits for the last save and closes.

    `batch_layout` (pre-training: `objective_layout.layout_record`) is saved as
    BATCH_LAYOUT_FILE; training on from checkpoints saved with another one is refused
    (`require_same_examples`, which the run set-up calls: a resume would go on with other
    examples), and the saved one is kept; checkpoints saved before batch layouts were recorded
    resume unchecked, and record it.
    """

    def __init__(
        self,
        directory: str | epath.PathLike,
        *,
        every: int,
        keep: int,
        config: ml_collections.ConfigDict,
        restart: bool = False,
        require_existing: bool = False,
        resume_fields: Sequence[str] = RESUME_FIELDS,
        batch_layout: dict[str, Any] | None = None,
    ) -> None:
        # The arguments, whoever passes them, checked as `settings.Checkpoint` checks the config.
        require_integer("checkpoint.every", every, 1)
        require_integer("checkpoint.keep", keep, 1)
        if restart and require_existing:
            raise ConfigError(
                "restart=True deletes the checkpoints that require_existing=True asks to "
                "resume; pass only one of them"
            )
        # orbax's storage layer needs an absolute path; users pass relative workdirs.
        self.directory = epath.Path(os.path.abspath(directory))
        self._config = config_as_json(config)
        self._resume_fields = tuple(resume_fields)
        self._batch_layout = batch_layout
        self._layout_differences: list[str] = []  # the saved layout's from batch_layout
        self._changed_settings: list[str] = []  # the saved config's from config, on resume
        if restart:
            self._wipe()
        if require_existing and not self.directory.exists():  # before orbax makes the folder
            self._refuse_missing()
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                # Exactly the multiples of `every` (and a preemption step on multi-host); the
                # default policy would also save the first step of a fresh run.
                save_decision_policy=policies.AnySavePolicy(
                    [policies.FixedIntervalPolicy(every), policies.PreemptionCheckpointingPolicy()]
                ),
                max_to_keep=keep,
                enable_async_checkpointing=True,
                cleanup_tmp_directories=True,  # saves cut short by a crash never finalised
            ),
            item_handlers=_one_item(),
        )
        try:
            self._check_resumable(require_existing)
            self._write_config()
        except BaseException:  # never leave orbax's background threads behind; re-raised
            self._manager.close()
            raise

    def _wipe(self) -> None:
        if self.directory.exists():
            log.warning("restart requested: deleting the old checkpoints in %s", self.directory)
            if jax.process_index() == 0:
                self.directory.rmtree()
        ocp.multihost.sync_global_processes("t5x_lite_checkpoint_wipe")

    def _refuse_missing(self) -> None:
        raise ConfigError(f"resume requested but {self.directory} holds no checkpoint; start a "
                          "new run without --resume, or point --workdir at an existing run")

    def _check_resumable(self, require_existing: bool) -> None:
        if self.latest_step() is None:
            if require_existing:
                self._refuse_missing()
            return
        saved = read_saved_config(self.directory)
        if saved is None:
            warnings.warn(
                f"{self.directory} holds checkpoints but no {CONFIG_FILE}; cannot check that "
                "they were written with a compatible config",
                stacklevel=3,
            )
            return
        differences = config_differences(saved, self._config, self._resume_fields)
        if differences:
            began = overrides_as_begun(saved, self._config, self._resume_fields)
            as_begun = f" ({' '.join(began)})" if began else ""
            raise ConfigError(
                f"the checkpoints in {self.directory} were written with an incompatible "
                "config:\n  " + "\n  ".join(differences) + f"\nresume with the saved "
                f"settings{as_begun}, or pass --restart to delete these checkpoints and start "
                "over"
            )
        if self._batch_layout is not None:
            self._layout_differences = saved_batch_layout_differences(self.directory,
                                                                      self._batch_layout)
        # What may change on resume (a learning rate, the steps, the mesh), said once the
        # run knows it trains on (`note_changed_settings`), as the saved config is replaced by
        # this one. Not a sweep's own settings (more seeds or tasks are the same sweep), nor
        # what only observes, nor fields added since the save.
        self._changed_settings = config_differences(saved, self._config, [
            field for field in flat_fields(saved)
            if not field.startswith("sweep.") and field not in OBSERVING_FIELDS])

    def note_changed_settings(self, restored_step: int | None, total: int) -> None:
        """Warn, in one line naming them, of the settings changed since the checkpoints were
        saved, when the run trains on from `restored_step` up to `total` (a finished run,
        scored or fine-tuned, trains with none of them)."""
        if self._changed_settings and restored_step is not None and restored_step < total:
            warnings.warn(f"resuming from {self.directory} at step {restored_step} with settings "
                          f"changed since it was saved: {'; '.join(self._changed_settings)}",
                          stacklevel=2)

    def require_same_examples(self, restored_step: int | None, total: int) -> None:
        """Refuse (`ConfigError`) to train on from `restored_step` (None: the newest saved) up
        to `total` checkpoints pre-trained on examples laid out otherwise (`batch_layout`):
        with no step left to train they may be scored or fine-tuned, as nothing reads their
        examples again."""
        step = self.latest_step() if restored_step is None else restored_step
        if self._layout_differences and step is not None and step < total:
            raise ConfigError(
                f"the checkpoints in {self.directory} were pre-trained on examples laid out "
                "otherwise, or by another network (its objective's lengths or definition, its "
                "grid's other rows, or its architecture's record changed since):\n  "
                + "\n  ".join(self._layout_differences) + "\nresume with the t5x_lite version "
                "and grid that began it, or pass --restart to delete these checkpoints and "
                "start over"
            )

    def _write_config(self) -> None:
        """Record the current config; written to a temporary file and renamed, so a reader on
        another process never sees half a file."""
        if jax.process_index() != 0:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        write_atomically(self.directory / CONFIG_FILE,
                         json.dumps(self._config, indent=2, sort_keys=True))
        if self._batch_layout is not None and not self._layout_differences:
            write_atomically(self.directory / BATCH_LAYOUT_FILE,
                             json.dumps(self._batch_layout, indent=2, sort_keys=True))

    def latest_step(self) -> int | None:
        """Newest saved step, or None. `restore` may fall back to an older one if it is damaged,
        so take the resumed step from the restored state, not from here."""
        return self._manager.latest_step()

    def should_save(self, step: int) -> bool:
        """Whether `maybe_save(step, ...)` would save without `force`: `step` is a multiple of
        `every` (or, on multi-host, the agreed preemption step) after the newest saved step."""
        return self._manager.should_save(step)

    def maybe_save(self, step: int, state: Any, force: bool = False) -> bool:
        """Start saving `state` at `step` if `step` is a multiple of `every` (or `force`).

        Asynchronous: the arrays are copied to host memory before this returns (so the train
        step may donate them) and written in the background; older checkpoints beyond `keep`
        are deleted once it is written. Returns whether a save started; a step that is already
        saved is not saved again.
        """
        if step == self.latest_step():
            return False
        return self._manager.save(step, args=ocp.args.PyTreeSave(state), force=force)

    def restore(self, abstract_state: Any, at_most: int | None = None) -> Any:
        """The newest readable checkpoint (at or before step `at_most`, when given), restored
        into `abstract_state`'s shardings.

        `abstract_state` is the train state's pytree of `jax.ShapeDtypeStruct`s with
        `.sharding` set (from `jax.eval_shape` and the partitioning rules). A damaged newest
        checkpoint is reported with a warning naming its step, moved to `unreadable/`, and the
        previous one is used.
        """
        restored, _, unreadable = _restore_newest(
            self._manager, _restore_args(abstract_state),
            "; the run starts over with --restart, which deletes them (a sweep's point: "
            "delete its folder and its lines in results.jsonl)", at_most)
        if unreadable:
            self._set_aside(unreadable)
        return restored

    def delete_steps(self, after: int) -> None:
        """Delete the saved steps after step `after` (0: all but a step 0, which is never
        saved), so that the run can save those steps anew (without --restart's wipe: its
        folder, config and set-aside steps stay)."""
        for step in self._manager.all_steps():
            if step > after:
                self._manager.delete(step)
        self._manager.reload()

    def _set_aside(self, steps: list[int]) -> None:
        """Move unreadable step folders out of the way, so the resumed run can save those
        steps again. Only after an older step restored with the same target: that rules out a
        wrong target (a bug) as the reason they failed."""
        if jax.process_index() == 0:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            for step in steps:
                target = self.directory / UNREADABLE_DIR / f"{step}-{stamp}"
                target.parent.mkdir(parents=True, exist_ok=True)
                (self.directory / str(step)).rename(target)  # orbax's default step folder name
                log.warning("moved the unreadable checkpoint at step %d to %s", step, target)
        ocp.multihost.sync_global_processes("t5x_lite_checkpoint_set_aside")
        self._manager.reload()

    def wait(self) -> None:
        """Block until the pending asynchronous save (if any) is on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Finish the pending save and release orbax."""
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def newest_step(directory: str | os.PathLike) -> int | None:
    """The newest finished save in the checkpoint folder `directory`, or None (none, or no
    such folder): orbax names each save by its step, and a save cut short by a temporary name.
    Read from the listing, without opening the folder (a dry run asks it of every point)."""
    directory = Path(directory)
    if not directory.is_dir():
        return None
    return max((int(path.name) for path in directory.iterdir() if path.name.isdigit()),
               default=None)


# The file in each save's folder where orbax keeps that save's metadata (its `StepMetadata`).
STEP_METADATA_FILE = "_CHECKPOINT_METADATA"


def save_began_ns(directory: str | os.PathLike, step: int) -> int | None:
    """When the save of `step` in the checkpoint folder `directory` began, in nanoseconds
    since the epoch, as orbax recorded it in that save's own metadata (`init_timestamp_nsecs`):
    a copy or a move of the folder keeps it, another save of the same step (the run made
    again) changes it. None when orbax recorded no time or its file is not JSON (a damaged
    save, which restoring it then reports). Read from the file, not through a
    `CheckpointManager`, which would log three warnings about a read-only folder."""
    path = Path(directory) / str(step) / STEP_METADATA_FILE
    try:
        metadata = json.loads(path.read_bytes())
    except (FileNotFoundError, ValueError):  # ValueError: JSON's and Unicode's decode errors
        return None
    began = metadata.get("init_timestamp_nsecs") if isinstance(metadata, dict) else None
    return began if isinstance(began, int) else None


def unfinished_steps(directory: str | epath.PathLike, step: int | None) -> int | None:
    """The `train.steps` of the run saved in `directory` when `step`, one of its saved steps,
    comes before them (a preempted run, or one stopped by --steps), else None."""
    steps = (read_saved_config(directory) or {}).get("train", {}).get("steps")
    return steps if isinstance(steps, int) and step is not None and step < steps else None


def restore_params_only(
    directory: str | epath.PathLike,
    abstract_params: Any,
    *,
    config: ml_collections.ConfigDict | None = None,
) -> Any:
    """Parameters of the newest readable checkpoint in `directory`, without optimizer state
    (`restore_parts` of `{"params": abstract_params}`)."""
    return restore_parts(directory, {"params": abstract_params}, config=config)[0]["params"]


def restore_parts(
    directory: str | epath.PathLike,
    abstract_parts: dict[str, Any],
    *,
    config: ml_collections.ConfigDict | None = None,
) -> tuple[dict[str, Any], int]:
    """Some fields of the train state saved in the newest readable checkpoint in `directory`,
    and that checkpoint's step.

    For fine-tuning from a pre-training run: `abstract_parts` maps the `TrainState` fields to
    read ("params", and "opt_state" to carry the optimiser on) to their abstract trees, whose
    shapes and shardings they are read into; the rest of the saved state is not read. If
    `config` is given, its model structure must match the saved run's (`ConfigError` lists the
    differences). The folder is opened read-only; unreadable checkpoints are skipped with a
    warning, not moved.
    """
    directory = epath.Path(os.path.abspath(directory))
    if config is not None:
        saved = read_saved_config(directory)
        if saved is None:
            raise ConfigError(f"{directory} holds no {CONFIG_FILE}: not a t5x_lite checkpoint folder")
        differences = config_differences(saved, config_as_json(config), ("model",))
        if differences:
            raise ConfigError(
                f"the checkpoints in {directory} hold a different model:\n  "
                + "\n  ".join(differences)
            )
    manager = ocp.CheckpointManager(
        directory, options=ocp.CheckpointManagerOptions(read_only=True), item_handlers=_one_item()
    )
    try:
        restored, step, _ = _restore_newest(manager,
                                            _restore_args(abstract_parts, partial=True))
    finally:
        manager.close()
    return {name: restored[name] for name in abstract_parts}, step


def saved_layout_differences(directory: str | os.PathLike,
                             shapes: dict[str, Any]) -> list[str]:
    """How the newest checkpoint in `directory` whose metadata reads holds the parts of the
    train state that `shapes` names ({"opt_state": its tree of `jax.ShapeDtypeStruct`s})
    otherwise than those shapes: one 'opt_state/0/v/...: saved (1,) != now (128, 2, 64)' per
    array (None where one side has none), from orbax's metadata, no array read; [] when they
    agree, or when no step's metadata reads (restoring then says so). A checkpoint written
    before a change of layout (Adafactor's factored moments, 2026-12-05) restores only its
    parameters into this version's program. A step with damaged metadata is passed over as
    restoring passes over it (`_restore_newest`, which warns of it)."""
    manager = ocp.CheckpointManager(
        epath.Path(os.path.abspath(directory)),
        options=ocp.CheckpointManagerOptions(read_only=True), item_handlers=_one_item())
    saved = None
    try:
        for step in sorted(manager.all_steps(), reverse=True):
            try:
                saved = manager.item_metadata(step).tree
                break
            except Exception:  # noqa: BLE001 -- damaged: the restore warns of it, as above
                continue
    finally:
        manager.close()
    if saved is None:
        return []

    def flat(tree: Any) -> dict[tuple, tuple | None]:  # None: an empty node
        return {key: tuple(leaf.shape) if hasattr(leaf, "shape") else None
                for key, leaf in ocp.tree.to_flat_dict(tree).items()}

    differences = []
    for part, tree in shapes.items():
        before = flat(saved.get(part, {}))
        now = flat(ocp.tree.serialize_tree(tree, keep_empty_nodes=True))
        differences += [f"{part}/{'/'.join(key)}: saved {before.get(key)} != now {now.get(key)}"
                        for key in sorted(before.keys() | now.keys())
                        if before.get(key) != now.get(key)]
    return differences
