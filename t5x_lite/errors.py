"""The error of a configuration that cannot work, its one-line checks of one value, the
errors that stop a sweep (work the machine stopped, a point another process is running), and
the one-line form of t5x_lite's own warnings.

A leaf module (it imports nothing from t5x_lite), so that the registries the config is
validated against (`t5x_lite.architectures`) and `t5x_lite.config` itself can both raise it.
"""
from __future__ import annotations

import errno
import re
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable


class ConfigError(ValueError):
    """A config field holds a value that cannot work; the message names the field."""


class CommandFailed(RuntimeError):
    """A cluster client command (gcloud, sbatch) that `launch --submit` ran exited with an
    error; its own output, printed above, says why."""


class MachineFault(RuntimeError):
    """Work stopped by the machine, not by its settings: a full disk, a permission, a lost
    mount (`is_machine_fault`). A sweep stops on it instead of recording the point as failed,
    which its re-run would never retry."""


# The operating system's errors that say the machine cannot store or reach a run's files: a
# full disk or quota, a read-only or failing file system, a lost network mount, a permission.
# (A missing file is not among them: that is most often a setting, e.g. a vocabulary's path.)
MACHINE_ERRNOS = frozenset(
    (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.ESTALE, errno.EACCES,
     errno.EPERM))
# How orbax's storage layer (tensorstore) reports one inside its ValueError:
# "... No space left on device [os_error_code='28']".
_TENSORSTORE_ERRNO = re.compile(r"os_error_code='?(\d+)")


def is_machine_fault(error: BaseException | None) -> bool:
    """Whether `error`, or an error it was raised from, is one of `MACHINE_ERRNOS`."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in MACHINE_ERRNOS:
            return True
        if any(int(code) in MACHINE_ERRNOS for code in _TENSORSTORE_ERRNO.findall(str(error))):
            return True
        error = error.__cause__ or error.__context__
    return False


class CheckpointsUnreadable(RuntimeError):
    """No checkpoint of a run reads back (`checkpointing.Checkpointer.restore`, which warned
    each step's error); the message names the folder and the way on."""


class PointBusy(RuntimeError):
    """Another process is running a sweep point this one was about to run
    (`sweep_workdir.point_lock`)."""


# The checks of one value, shared by the config's sections (`t5x_lite.settings`) and by the
# modules that check their own arguments (objectives, checkpointing, decoding, ul2).


def require_positive(field: str, value: Any) -> None:
    """Raise `ConfigError` unless `value` is a positive int or float (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"{field}={value!r} must be a positive number")


def require_integer(field: str, value: Any, minimum: int) -> None:
    """Raise `ConfigError` unless `value` is an int (not a bool) of at least `minimum`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{field}={value!r} must be an integer >= {minimum}")


def require_number(field: str, value: Any, ok: Callable[[Any], bool], allowed: str) -> None:
    """Raise `ConfigError` unless `value` is an int or float (not a bool) that is `ok`;
    `allowed` says in words what it must be."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
        raise ConfigError(f"{field}={value!r} is not allowed; it must be {allowed}")


# What an unknown name of a registry (`model.arch`, `objective.name`) may be: one a file of the
# user's registers, which this process has not run.
OWN_RECORD_HINT = ("one of your own is registered by the file that defines it: pass "
                   "--config=FILE, or the experiment file to sweep and preview")


def require_choice(field: str, value: Any, allowed: Iterable[str], hint: str = "") -> None:
    """Raise `ConfigError` unless `value` is one of `allowed`; the message lists them, then
    `hint` when given."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise ConfigError(f"{field}={value!r} is not allowed; choose one of {', '.join(allowed)}"
                          + (f" ({hint})" if hint else ""))


_PACKAGE = str(Path(__file__).parent)
_PYTHON_FORMAT = warnings.formatwarning  # Python's own: file, line number and the `warn` call


class OneLineWarnings:
    """A `warnings.formatwarning` that shows t5x_lite's own warnings as one line each, like its
    errors ("t5x-lite sweep: warning: ..."); other libraries' keep Python's format, which says
    where they come from. An object, not a closure, so that a sweep hands it to its worker
    processes (`launchers.LocalParallelLauncher`) by pickling."""

    def __init__(self, command: str):
        self.command = command

    def __call__(self, message: Warning | str, category: type[Warning], filename: str,
                 lineno: int, line: str | None = None) -> str:
        if str(filename).startswith(_PACKAGE):
            return f"t5x-lite {self.command}: warning: {message}\n"
        return _PYTHON_FORMAT(message, category, filename, lineno, line)
