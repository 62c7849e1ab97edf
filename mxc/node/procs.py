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

from . import sysread

PROC = Path("/proc")


def descendants(root: int, proc: Path = PROC) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid in sysread.process_ids(proc):
        fields = sysread.process_stat(proc, pid)
        if fields and len(fields) > 1 and fields[0] != "Z" and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(pid)
    out: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.append(child)
                todo.append(child)
    return out


def run_markers(run: Path, rank: int, attempt: int) -> list[str]:
    """The ``NAME=value`` variables the node program gives one rank's training (and finds it by)."""
    return [f"MXC_RUN_DIR={run}", f"MXC_RANK={rank}", f"MXC_ATTEMPT={attempt}"]


def carries(pid: int, markers: Iterable[str], proc: Path = PROC) -> bool:
    """Whether this user's process ``pid`` has every ``NAME=value`` of ``markers`` in its environment."""
    wanted = [m.partition("=") for m in markers]
    if not wanted or sysread.process_uid(proc, pid) != os.getuid():
        return False
    env = sysread.process_environ(proc, pid)
    return env is not None and all(env.get(name) == value for name, _, value in wanted)


def marked(markers: Iterable[str], proc: Path = PROC, uid: int | None = None) -> list[int]:
    """This user's live processes whose environment holds every ``NAME=value`` of ``markers``
    (none without markers: an empty filter would match every process of the user)."""
    wanted = [m.partition("=") for m in markers]
    if not wanted:
        return []
    me = os.getuid() if uid is None else uid
    out = []
    for pid in sysread.process_ids(proc):
        if sysread.process_uid(proc, pid) != me or not sysread.process_alive(proc, pid):
            continue
        env = sysread.process_environ(proc, pid)
        if env is not None and all(env.get(name) == value for name, _, value in wanted):
            out.append(pid)
    return out


def trainer_processes(pid: int | None, markers: Iterable[str], proc: Path = PROC) -> list[int]:
    """The launched process, its descendants, and marked processes elsewhere (never this process)."""
    found: list[int] = []
    if pid is not None:
        found = [pid, *descendants(pid, proc)]
    for other in marked(markers, proc):
        if other not in found:
            found.append(other)
    me = os.getpid()
    return [p for p in found if p != me]


def kill_all(pids: Iterable[int], signum: int = signal.SIGKILL) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)
