"""TensorBoard scalar event files, written directly: no tensorboardX, TensorFlow or torch.

Why not tensorboardX: it imports torch whenever torch is installed (to accept its tensors),
2.4 s added to every process that trains on a machine with torch, and the scalars a run logs
need none of it.

The format TensorBoard reads (`events.out.tfevents.*` in a log directory) is a TFRecord file
of `Event` protocol buffers. Each record is

    uint64 length | uint32 masked CRC-32C of those 8 bytes | data | uint32 masked CRC-32C of data

(little-endian), where masked(c) = ((c >> 15 | c << 17) + 0xA282EAD8) mod 2^32 and CRC-32C is
the Castagnoli CRC (reflected polynomial 0x82F63B78). The first event names the version,
`Event{wall_time = 1 (double), file_version = 3: "brain.Event:2"}`; each scalar is
`Event{wall_time = 1, step = 2 (int64), summary = 5: Summary{value = 1: Value{tag = 1 (string),
simple_value = 2 (float)}}}`, one event per scalar as tensorboardX writes them (its bytes are
ours, a test checks).
"""
from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path

FILE_VERSION = "brain.Event:2"


def _crc32c_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_CRC32C_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """The CRC-32C (Castagnoli) of `data`, as TFRecord files checksum their records."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> bytes:
    crc = crc32c(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


def tfrecord(data: bytes) -> bytes:
    """`data` framed as one TFRecord record."""
    length = struct.pack("<Q", len(data))
    return length + _masked_crc(length) + data + _masked_crc(data)


# Protocol-buffer wire format: a field is its key (number << 3 | wire type), then its value.
def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # int64: a negative step is its two's complement, 10 bytes
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, wire_type: int, value: bytes) -> bytes:
    return _varint(number << 3 | wire_type) + value


def _message(number: int, payload: bytes) -> bytes:  # wire type 2: length-delimited
    return _field(number, 2, _varint(len(payload)) + payload)


def version_event(wall_time: float) -> bytes:
    """The serialised `Event` that begins every event file."""
    return _field(1, 1, struct.pack("<d", wall_time)) + _message(3, FILE_VERSION.encode())


def scalar_event(tag: str, value: float, step: int, wall_time: float) -> bytes:
    """The serialised `Event` of one scalar (stored as float32, as TensorBoard's scalars are)."""
    summary_value = _message(1, tag.encode()) + _field(2, 5, struct.pack("<f", value))
    return (_field(1, 1, struct.pack("<d", wall_time)) + _field(2, 0, _varint(step))
            + _message(5, _message(1, summary_value)))


class EventFileWriter:
    """Appends scalars to a new `events.out.tfevents.<time>.<host>.<pid><suffix>` file in
    `logdir` (made if missing), which TensorBoard shows while it is written. Each call appends
    and closes, so the writer holds no open file and a crash loses nothing written; `suffix`
    tells apart two writers of one process in one folder (TensorBoard reads every
    `*tfevents*` file of a folder as one run)."""

    def __init__(self, logdir: str | os.PathLike, suffix: str = ""):
        logdir = Path(logdir)
        logdir.mkdir(parents=True, exist_ok=True)
        now = time.time()
        self.path = logdir / (f"events.out.tfevents.{int(now)}.{socket.gethostname()}."
                              f"{os.getpid()}{suffix}")
        self._append(tfrecord(version_event(now)))

    def _append(self, data: bytes) -> None:
        with self.path.open("ab") as f:
            f.write(data)

    def add_scalars(self, scalars: dict[str, float], step: int,
                    wall_time: float | None = None) -> None:
        """One event per scalar (tag -> value) at `step`, in one write."""
        wall_time = time.time() if wall_time is None else wall_time
        self._append(b"".join(tfrecord(scalar_event(tag, value, step, wall_time))
                              for tag, value in scalars.items()))
