"""`WORKDIR/results.jsonl`, a sweep's records: its name, its one writer and its one reader.

One JSON record per line, one line per (grid point, seed, task), written by `t5x_lite.sweep`
and read by it (to skip finished points on a re-run) and by `t5x_lite.report_table`.

    path = results_path("runs/table2")
    ResultsFile("runs/table2").append(record)   # process 0 only
    records = read_records(path)

Writing: the sweep process appends each record as one `os.write` of a whole line, then fsyncs,
so a killed run leaves at most its last line cut short, and concurrent job-array tasks never
interleave lines. Only process 0 of a multi-process run (TPU pod hosts, SLURM tasks) writes.

When one (grid point, seed, task) has several records, the last one counts (`latest_records`):
a re-run of a failed point, or a finished point given its zero-shot scores or held-out loss
later, appends a new record rather than rewriting the old one.

Reading: a last line without its newline that is not JSON is what a killed run leaves; it is
skipped with a warning (and cut by the next sweep before it appends; a whole record without
its newline is kept). Any other line that is not JSON means the file was damaged, and reading
it raises, naming the file and the line: silently dropping a record would change the table.
"""
from __future__ import annotations

import dataclasses
import json
import os
import uuid
import warnings
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

RESULTS_FILE = "results.jsonl"


@dataclasses.dataclass(frozen=True)
class Budget:
    """A compute-matched sweep's budget, as its grid derives it and its records carry it
    (`budget*` fields): `kind` ("tokens" or "flops") of `reference`'s pre-training in its
    `reference_steps` configured steps, `total` in that unit."""

    kind: str
    reference: str
    reference_steps: int
    total: float


class ResultsError(ValueError):
    """A results file that cannot be read as records; the message names the file and line."""


def results_path(workdir: str | os.PathLike) -> Path:
    """Where the records of the sweep in `workdir` are."""
    return Path(workdir) / RESULTS_FILE


def is_writer() -> bool:
    """Whether this process writes a sweep's files: process 0 of a multi-process run, as
    `train` writes its logs only there (every process runs the sweep)."""
    import jax  # here, not at the top: reading records (the report) needs no JAX

    return jax.process_index() == 0


def write_atomically(path: Path, content: str | bytes) -> None:
    """Replace `path` with `content` (text, written as UTF-8, or bytes, e.g. a PNG), so that a
    reader, a crash or a power cut never meets half a file: written to a temporary file of its
    own beside it (several processes may write one path at once, e.g. the array tasks of a
    SLURM sweep starting on a new workdir), flushed to disk, then renamed over `path`, and the
    rename itself flushed (`sync_folder`)."""
    path = Path(path)
    # A name no other writer uses; opened as any new file is (the umask's permissions).
    partial = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        with open(partial, "xb") as file:
            file.write(content.encode("utf-8") if isinstance(content, str) else content)
            file.flush()
            os.fsync(file.fileno())
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    sync_folder(path.parent)


def sync_folder(folder: Path) -> None:
    """Flush `folder`'s entries to disk: a file's own fsync does not make a new name (a rename,
    a created file) survive a power cut; its folder's does (POSIX; Linux, macOS)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: Path, data: Any) -> None:
    """Write a sweep's JSON file (a saved record, the zero-shot entries, the workdir's
    identity) atomically (`write_atomically`); process 0 only (`is_writer`)."""
    if not is_writer():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(data))


def numbered_records(path: str | os.PathLike) -> Iterator[tuple[int, Any]]:
    """(line number, the line as JSON) for every line of `path`, blank lines skipped; nothing
    without the file.

    A cut-off last line (no newline, not JSON) is skipped with a warning; any other line
    that is not JSON raises `ResultsError` naming the file and the line number.
    """
    path = Path(path)
    if not path.exists():
        return
    lines = path.read_text(encoding="utf-8").split("\n")
    # The piece after the last newline is "" unless the last write was cut short.
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            if number == len(lines):  # no newline after it: a write the run did not finish
                warnings.warn(f"{path} line {number}: skipping a partly written last line "
                              f"(a killed run's): {line[:80]!r}", stacklevel=2)
                continue
            raise ResultsError(f"{path} line {number} is not JSON ({error.msg}): "
                               f"{line[:80]!r}; the file is damaged: repair or delete that "
                               "line") from None
        yield number, record


def read_records(path: str | os.PathLike) -> list[Any]:
    """The records of `path` in file order (see `numbered_records`); [] without the file."""
    return [record for _, record in numbered_records(path)]


class ResultsFile:
    """`workdir/results.jsonl` as the sweep writes it: appended by process 0 (`is_writer`;
    elsewhere the changing methods do nothing)."""

    def __init__(self, workdir: str | os.PathLike):
        self.path = results_path(workdir)

    def records(self) -> list[dict]:
        """The records so far (`read_records`)."""
        return read_records(self.path)

    def finish_last_line(self) -> None:
        """Before appending: give a last line left without its newline by a killed run its
        newline when it is a whole record, else cut it (with a warning), as `read_records`
        reads it."""
        if not is_writer() or not self.path.exists():
            return
        data = self.path.read_bytes()
        if not data or data.endswith(b"\n"):
            return
        keep = data.rfind(b"\n") + 1
        try:
            json.loads(data[keep:])
        except json.JSONDecodeError:
            warnings.warn(f"{self.path}: dropping a partly written last line "
                          f"{data[keep:keep + 80]!r}", stacklevel=2)
            with self.path.open("r+b") as f:
                f.truncate(keep)
            return
        with self.path.open("ab") as f:
            f.write(b"\n")

    def append(self, record: dict) -> None:
        """One write of one line, then fsync: a crash leaves the line whole or cut short,
        never interleaved with another. A line another job's short write (a full disk) left
        without its newline is ended first, so that this record does not join it."""
        if not is_writer():
            return
        line = (json.dumps(record) + "\n").encode()
        created = not self.path.exists()
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line
            if os.write(fd, line) != len(line):
                raise OSError(f"{self.path}: short write of a record")
            os.fsync(fd)
        finally:
            os.close(fd)
        if created:  # the file's name too, so that its first record survives a power cut
            sync_folder(self.path.parent)


def run_key(record: Mapping[str, Any]) -> tuple[str, int]:
    """(point, seed): the run (one pre-training) a record comes from."""
    return record["point"], record["seed"]


def record_key(record: Mapping[str, Any]) -> tuple[str, int, str]:
    """(point, seed, task): what a record is of; results.jsonl's last record of a key counts."""
    return (*run_key(record), record["task"])


def latest_records(records: Sequence[dict]) -> list[dict]:
    """The last record of each `record_key`, in the order each key first appears."""
    return list({record_key(r): r for r in records}.values())
