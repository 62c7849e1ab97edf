"""Processes read from /proc: by group or session (what killpg and friends act on, made visible),
and by identity (a pid plus the start time that makes it unique).

A pid alone does not name a process: once it exits, the kernel hands the number to the next
one. ``ProcessId`` adds the process's start time (``/proc/<pid>/stat`` field 22, clock ticks
since boot) and the boot id, which together name one process for as long as the machine
runs. Every pid mxc records and may later signal is recorded as a ``ProcessId``, and every
signal to such a process goes through ``ProcessId.send``: it pins the process with a pidfd,
checks the identity, then signals through the pidfd, so a reused pid is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Field positions in /proc/<pid>/stat after the ``(comm)`` field: state, ppid, pgrp, session, ..., starttime.
_STATE, _PGRP, _SESSION, _STARTTIME = 0, 2, 3, 19
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after ``(comm)`` (comm may hold spaces and parentheses)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    return stat[stat.rfind(")") + 2 :].split()


def _live_where(position: int, value: int) -> list[int]:
    """Live (non-zombie) processes whose stat field at ``position`` equals ``value``."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        if fields and len(fields) > position and fields[_STATE] != "Z" and int(fields[position]) == value:
            out.append(int(entry))
    return sorted(out)


def group_processes(pgid: int) -> list[int]:
    """Live processes of one process group (a training attempt and everything it started)."""
    return _live_where(_PGRP, pgid)


def session_processes(sid: int) -> list[int]:
    """Live processes of one session (a Ray head and every worker it forked)."""
    return _live_where(_SESSION, sid)


def pid_alive(pid: int | None) -> bool:
    """Running (not a zombie); a process of another user counts as alive. Only for pids that
    cannot have been reused (an unreaped child); a recorded pid needs ``ProcessId``."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # OverflowError: a pid no process can have (a doctored record)
        return False
    except PermissionError:
        return True
    fields = _stat_fields(pid)
    return fields is not None and len(fields) > _STATE and fields[_STATE] != "Z"


def boot_id() -> str:
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


def start_ticks(pid: int) -> int | None:
    """When the process started, in clock ticks since boot; None when it is gone (or a zombie)."""
    fields = _stat_fields(pid)
    if not fields or len(fields) <= _STARTTIME or fields[_STATE] == "Z":
        return None
    return int(fields[_STARTTIME])


@dataclass(frozen=True)
class ProcessId:
    """One process, for as long as this machine runs: pid, start time and boot id."""

    pid: int
    start_ticks: int
    boot_id: str

    @classmethod
    def capture(cls, pid: int) -> ProcessId | None:
        """The identity of the process that has ``pid`` now (None: no such live process)."""
        ticks = start_ticks(pid)
        return None if ticks is None else cls(pid, ticks, boot_id())

    @classmethod
    def this_process(cls) -> ProcessId:
        found = cls.capture(os.getpid())
        assert found is not None
        return found

    @classmethod
    def from_record(cls, data: Mapping[str, Any] | None) -> ProcessId | None:
        """From what ``as_record`` wrote (None: absent or malformed, e.g. a record from before
        identities were recorded, which names no process that can be verified)."""
        if not isinstance(data, Mapping):
            return None
        pid, ticks, boot = data.get("pid"), data.get("start_ticks"), data.get("boot_id")
        if not (type(pid) is int and pid > 0 and type(ticks) is int and ticks >= 0 and isinstance(boot, str) and boot):
            return None
        return cls(pid, ticks, boot)

    def as_record(self) -> dict[str, Any]:
        return {"pid": self.pid, "start_ticks": self.start_ticks, "boot_id": self.boot_id}

    def is_alive(self) -> bool:
        """This very process still runs (not a zombie): same boot, same pid, same start time."""
        return self.boot_id == boot_id() and start_ticks(self.pid) == self.start_ticks

    def send(self, signum: int) -> bool:
        """Signal this process, and only it: False when it is gone (or not ours to signal).

        The pidfd pins whatever process has the pid when it is opened; the identity is checked
        after that, so the signal reaches the verified process or nobody.
        """
        try:
            fd = os.pidfd_open(self.pid)
        except (ProcessLookupError, PermissionError):
            return False
        try:
            if not self.is_alive():
                return False
            signal.pidfd_send_signal(fd, signum)
            return True
        except (ProcessLookupError, PermissionError):
            return False
        finally:
            os.close(fd)


def _owned_by_me(pid: int) -> bool:
    try:
        return os.stat(f"/proc/{pid}").st_uid == os.getuid()
    except OSError:
        return False


def processes_with_env(name: str, value: str) -> list[ProcessId]:
    """This user's live processes whose environment has ``name=value`` (as they were started).

    The identity is taken before the environment is read and checked after, so a pid that
    changed hands in between is not reported.
    """
    marker = f"{name}={value}".encode()
    me = os.getpid()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me or not _owned_by_me(int(entry)):
            continue
        found = ProcessId.capture(int(entry))
        if found is None:
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in environ and found.is_alive():
            out.append(found)
    return sorted(out, key=lambda p: p.pid)


def command_line(pid: int, limit: int = 120) -> str:
    """The process's arguments, space-separated and shortened (for messages)."""
    with contextlib.suppress(OSError):
        text = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        return text if len(text) <= limit else text[: limit - 3] + "..."
    return "?"
