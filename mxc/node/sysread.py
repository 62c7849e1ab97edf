"""Reading kernel pseudo-files (/proc, /sys) the way a node check must: tolerantly.

Such files vanish while they are read (a process exits), refuse to be read (another user's
process, ``kernel.dmesg_restrict``, a GID entry the kernel has no data for), or are not there at
all (a container, an older kernel). A node check that raised on any of that would fail a job for
nothing, so these helpers answer ``None`` (or an empty list) instead, and the caller decides what
a missing fact means. Reads are bounded: a pseudo-file is small, and a fake one in a test or a
broken mount must not make the node program read gigabytes.
"""

from __future__ import annotations

import os
from pathlib import Path

LIMIT = 1 << 20  # bytes: far more than any /proc or /sys file this package reads


def read_bytes(path: Path, limit: int = LIMIT) -> bytes | None:
    """The first ``limit`` bytes of ``path``; None when it cannot be read."""
    try:
        with open(path, "rb") as fh:
            return fh.read(limit)
    except (OSError, ValueError):
        return None


def read_text(path: Path, limit: int = LIMIT) -> str | None:
    """The file's text (undecodable bytes replaced), stripped of surrounding whitespace; None when unreadable."""
    data = read_bytes(path, limit)
    return None if data is None else data.decode("utf-8", "replace").strip()


def read_int(path: Path) -> int | None:
    """A file holding one integer (``/proc/sys/kernel/core_uses_pid``); None when unreadable or not a number."""
    text = read_text(path, 256)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def list_dir(path: Path) -> list[str]:
    """Entry names of a directory, sorted; empty when it is missing or unreadable."""
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def process_ids(proc: Path) -> list[int]:
    """The pids listed under a /proc root, ascending."""
    return sorted(int(name) for name in list_dir(proc) if name.isdigit())


def process_stat(proc: Path, pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the ``(comm)`` field: state, ppid, pgrp, session, ...

    The command name may hold spaces and parentheses, so the fields start after the last ``)``.
    """
    text = read_text(proc / str(pid) / "stat", 4096)
    if not text or ")" not in text:
        return None
    return text[text.rfind(")") + 1:].split()


def process_alive(proc: Path, pid: int) -> bool:
    """Listed under ``proc`` and not a zombie (a zombie has exited: its output is complete)."""
    fields = process_stat(proc, pid)
    return fields is not None and len(fields) > 0 and fields[0] != "Z"


def process_environ(proc: Path, pid: int) -> dict[str, str] | None:
    """The environment a process started with (/proc/<pid>/environ); None when unreadable."""
    data = read_bytes(proc / str(pid) / "environ")
    if data is None:
        return None
    env = {}
    for item in data.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep and name:
            env[name.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def process_cmdline(proc: Path, pid: int) -> str | None:
    """The command line, arguments joined by spaces (what ``pgrep -f`` matches); None when unreadable."""
    data = read_bytes(proc / str(pid) / "cmdline")
    if data is None:
        return None
    return data.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")


def process_uid(proc: Path, pid: int) -> int | None:
    """The effective uid (the second ``Uid:`` field of /proc/<pid>/status, what ``pgrep -u`` matches)."""
    text = read_text(proc / str(pid) / "status", 16384)
    for line in (text or "").splitlines():
        if line.startswith("Uid:"):
            fields = line.split()
            if len(fields) >= 3 and fields[2].isdigit():
                return int(fields[2])
    return None
