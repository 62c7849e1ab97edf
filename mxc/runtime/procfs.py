"""Processes by group or session, read from /proc: what killpg and friends act on, made visible."""

from __future__ import annotations

import os
from pathlib import Path

# Field positions in /proc/<pid>/stat after the ``(comm)`` field: state, ppid, pgrp, session.
_PGRP, _SESSION = 2, 3


def _live_where(position: int, value: int) -> list[int]:
    """Live (non-zombie) processes whose stat field at ``position`` equals ``value``."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > position and fields[0] != "Z" and int(fields[position]) == value:
            out.append(int(entry))
    return sorted(out)


def group_processes(pgid: int) -> list[int]:
    """Live processes of one process group (a training attempt and everything it started)."""
    return _live_where(_PGRP, pgid)


def session_processes(sid: int) -> list[int]:
    """Live processes of one session (a Ray head and every worker it forked)."""
    return _live_where(_SESSION, sid)


def pid_alive(pid: int | None) -> bool:
    """Running (not a zombie); a process of another user counts as alive."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False
