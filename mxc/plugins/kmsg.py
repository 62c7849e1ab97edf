"""GPU driver errors in the kernel log, counted as they are logged: NVIDIA Xid events and amdgpu
errors (ring timeouts, page faults, failed resets, RAS events), read from ``/dev/kmsg``.

Why the kernel log: a GPU that fell off the bus (Xid 79), a double-bit ECC error (Xid 48) or an
amdgpu ring timeout reach the kernel log, and usually nothing else: the training only sees a
collective that never returns. Counted per scrape they line up with the step-time curve.

How it stays cheap: ``/dev/kmsg`` (the device ``dmesg`` itself reads) is opened once and kept
open; each read returns the next record, so a scrape reads only the records logged since the
last one (the ring buffer's backlog at start is read a bounded number of records per scrape).
Only records of the kernel facility count: a process writing "NVRM: Xid" into /dev/kmsg gets
the user facility and cannot fake a GPU error. Reading needs root or CAP_SYSLOG where
``kernel.dmesg_restrict`` is 1; without it the reader is unavailable and says so.

Record format (Documentation/ABI/testing/dev-kmsg): ``prefix,seq,usec,flags[,...];message``
with ``prefix = facility * 8 + level``; continuation lines start with a space.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

KERNEL_FACILITY = 0
WARNING = 4  # levels 0..4: emerg, alert, crit, err, warning
XID = re.compile(r"NVRM: Xid \((?P<device>[^)]*)\): (?P<code>\d+)")
AMDGPU = re.compile(r"\bamdgpu\b")
READ_SIZE = 16384  # more than a record's maximum (a smaller buffer makes read() fail with EINVAL)
RECORDS_PER_POLL = 5000  # bounds a scrape that starts on a full ring buffer
DRIVERS = ("amdgpu", "nvidia")


@dataclass(frozen=True)
class Record:
    facility: int
    level: int
    sequence: int
    message: str


def parse_record(line: bytes) -> Record | None:
    """One ``/dev/kmsg`` record line; None for continuation lines and anything else."""
    head, sep, message = line.partition(b";")
    if not sep or line[:1] == b" ":
        return None
    fields = head.split(b",")
    if len(fields) < 4 or not fields[0].isdigit() or not fields[1].isdigit():
        return None
    prefix = int(fields[0])
    return Record(prefix >> 3, prefix & 7, int(fields[1]), message.decode("utf-8", "replace"))


def classify(record: Record) -> tuple[str, str] | None:
    """(driver, xid code or "") when the record is a GPU driver error, else None."""
    if record.facility != KERNEL_FACILITY:
        return None
    xid = XID.search(record.message)
    if xid:
        return "nvidia", xid["code"]
    if record.level <= WARNING and AMDGPU.search(record.message):
        return "amdgpu", ""
    return None


@dataclass
class GpuErrorCounts:
    by_driver: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DRIVERS, 0))
    by_xid: dict[str, int] = field(default_factory=dict)
    records: int = 0  # every record read (any facility), for tests and the benchmark

    def add(self, record: Record) -> None:
        self.records += 1
        found = classify(record)
        if found is None:
            return
        driver, code = found
        self.by_driver[driver] += 1
        if code:
            self.by_xid[code] = self.by_xid.get(code, 0) + 1


class KernelLog:
    """``/dev/kmsg`` held open; ``poll()`` reads what was logged since the last call.

    Also reads a regular file of records (tests): there a read returns many records at once,
    and a torn last line waits for the rest.
    """

    def __init__(self, path: Path = Path("/dev/kmsg"), listener: Callable[[Record], None] | None = None) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # PermissionError: not readable
        self.counts = GpuErrorCounts()
        self.listener = listener  # sees every record (tests)
        self._partial = b""

    def poll(self, max_records: int = RECORDS_PER_POLL) -> GpuErrorCounts:
        seen = 0
        while seen < max_records:
            try:
                data = os.read(self.fd, READ_SIZE)
            except BlockingIOError:  # nothing new
                break
            except BrokenPipeError:  # records were overwritten before we read them; the next read goes on
                seen += 1
                continue
            if not data:  # end of a regular file
                break
            chunk = self._partial + data
            lines = chunk.split(b"\n")
            self._partial = lines.pop()
            for line in lines:
                record = parse_record(line)
                if record is not None:
                    self.counts.add(record)
                    if self.listener is not None:
                        self.listener(record)
                    seen += 1
        return self.counts

    def close(self) -> None:
        os.close(self.fd)
