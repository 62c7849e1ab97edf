"""The trainer's processes, found in /proc: its descendants, and those that carry its markers.

The training usually is a child of the node program, but not always: with observability on a
Slurm node it runs in a Ray actor, parented by the raylet. The node program therefore gives the
training three variables (``MXC_RUN_DIR``, ``MXC_RANK``, ``MXC_ATTEMPT``) and finds its processes
by them as well as by descent, so a hang's stacks and kill reach the real trainer either way.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Iterable


def _stat(proc: Path, pid: int) -> tuple[int, str] | None:
    """(parent pid, state) of a live process."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()
    return (int(fields[1]), fields[0]) if len(fields) > 1 else None


def _pids(proc: Path) -> list[int]:
    try:
        return [int(name) for name in os.listdir(proc) if name.isdigit()]
    except OSError:
        return []


def descendants(root: int, proc: Path = Path("/proc")) -> list[int]:
    parents: dict[int, list[int]] = {}
    for pid in _pids(proc):
        info = _stat(proc, pid)
        if info is not None and info[1] != "Z":
            parents.setdefault(info[0], []).append(pid)
    out: list[int] = []
    todo = [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in out:
                out.append(child)
                todo.append(child)
    return out


def marked(markers: Iterable[str], proc: Path = Path("/proc")) -> list[int]:
    """This user's live processes whose environment holds every ``NAME=value`` of ``markers``."""
    wanted = [m.encode() for m in markers]
    uid = os.getuid()
    out = []
    for pid in _pids(proc):
        try:
            if (proc / str(pid)).stat().st_uid != uid:
                continue
            environ = (proc / str(pid) / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        info = _stat(proc, pid)
        if info is not None and info[1] != "Z" and all(w in environ for w in wanted):
            out.append(pid)
    return out


def trainer_processes(pid: int | None, markers: Iterable[str], proc: Path = Path("/proc")) -> list[int]:
    """The launched process, its descendants, and marked processes elsewhere (not this process)."""
    found: list[int] = []
    if pid is not None:
        found = [pid, *descendants(pid, proc)]
    for other in marked(markers, proc):
        if other not in found:
            found.append(other)
    me = os.getpid()
    return [p for p in found if p != me]


def is_python(pid: int, proc: Path = Path("/proc")) -> bool:
    try:
        return "python" in os.path.basename(os.readlink(str(proc / str(pid) / "exe")))
    except OSError:
        return False


def kill_all(pids: Iterable[int], signum: int = signal.SIGKILL) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)
