"""Incremental readers for files a training appends to: JSON lines and TensorBoard event files.

Each reader remembers a byte offset and, on ``read_new()``, reads only what was appended
since, so a scrape costs time proportional to the new data, never to the file's length
(a month-long run's metrics file is read once, a few lines at a time). A torn last line or
record (the writer is mid-write, or was killed) is held back until it is complete. A file
that shrank was rewritten: it is read again from the start.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Bytes per call: a backlog (an exporter started late on a long run) is read over several
# scrapes, each well under a second, so none runs into Prometheus's scrape timeout.
MAX_READ = 16 * 1024 * 1024


class JsonlTail:
    """New complete lines of a JSON-lines file, parsed; invalid lines are counted and skipped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self._partial = b""
        self.bytes_read = 0  # total, for tests and the benchmark
        self.invalid_lines = 0

    def read_new(self) -> list[dict[str, Any]]:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        if size < self.offset:  # truncated or replaced: start over
            self.offset, self._partial = 0, b""
        if size == self.offset:
            return []
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read(min(size - self.offset, MAX_READ))
        self.offset += len(data)
        self.bytes_read += len(data)
        chunk = self._partial + data
        cut = chunk.rfind(b"\n")
        if cut < 0:
            self._partial = chunk
            return []
        self._partial = chunk[cut + 1 :]
        out = []
        for line in chunk[:cut].split(b"\n"):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except ValueError:
                self.invalid_lines += 1
                continue
            if isinstance(value, dict):
                out.append(value)
        return out


@dataclass(frozen=True)
class ScalarEvent:
    step: int
    wall_time: float
    tag: str
    value: float


_HEADER = struct.Struct("<QI")  # uint64 length, uint32 masked crc of the length
_FOOTER = 4  # uint32 masked crc of the data


class EventFileTail:
    """New scalar summaries of a TensorBoard event file (TFRecord framing around ``Event`` protos).

    CRCs are not checked: the framing length is, and a record is only parsed once all of it
    has been written.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self._buffer = b""
        self.bytes_read = 0

    def read_new(self) -> list[ScalarEvent]:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        if size < self.offset:
            self.offset, self._buffer = 0, b""
        if size > self.offset:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(min(size - self.offset, MAX_READ))
            self.offset += len(data)
            self.bytes_read += len(data)
            self._buffer += data
        records, used = split_records(self._buffer)
        self._buffer = self._buffer[used:]
        out: list[ScalarEvent] = []
        for record in records:
            out.extend(scalars(record))
        return out


def split_records(buffer: bytes) -> tuple[list[bytes], int]:
    """Complete TFRecord payloads at the start of ``buffer`` and how many bytes they used."""
    records, pos = [], 0
    while len(buffer) - pos >= _HEADER.size:
        length, _ = _HEADER.unpack_from(buffer, pos)
        end = pos + _HEADER.size + length + _FOOTER
        if end > len(buffer):
            break
        records.append(buffer[pos + _HEADER.size : pos + _HEADER.size + length])
        pos = end
    return records, pos


def scalars(record: bytes) -> Iterator[ScalarEvent]:
    from tensorboard.compat.proto import event_pb2  # type: ignore[import-untyped]  # only where event files are read

    event = event_pb2.Event.FromString(record)
    if not event.HasField("summary"):
        return
    for value in event.summary.value:
        number = _scalar_value(value)
        if number is not None:
            yield ScalarEvent(int(event.step), float(event.wall_time), value.tag, number)


def _scalar_value(value: Any) -> float | None:
    if value.HasField("simple_value"):
        return float(value.simple_value)
    if value.HasField("tensor"):
        tensor = value.tensor
        if tensor.float_val:
            return float(tensor.float_val[0])
        if tensor.double_val:
            return float(tensor.double_val[0])
        if tensor.int64_val:
            return float(tensor.int64_val[0])
        if tensor.tensor_content and tensor.dtype in (1, 2):  # DT_FLOAT, DT_DOUBLE
            fmt = "<f" if tensor.dtype == 1 else "<d"
            if len(tensor.tensor_content) == struct.calcsize(fmt):
                return float(struct.unpack(fmt, tensor.tensor_content)[0])
    return None
