"""Stacks of a live training on demand (``mxc stacks``): read, never disturb.

The hang watch's dump (stacks.py) may end with SIGABRT, since the hung trainer is killed anyway;
here the training must go on, so only py-spy reads the processes (``--native`` first, then
without), and a process py-spy cannot read gets a file saying why.

Which processes: each rank records its trainer when it starts (``ranks/<rank>/trainer.json``:
pid, start time and boot id, node, attempt, the markers its processes carry, the py-spy it found).
On one node, ``dump_node`` takes every rank of that node whose recorded trainer still runs (by
identity: a pid handed to another process since is not the trainer), finds its processes the
way the hang watch does (procs.trainer_processes: descendants and marked processes, so a trainer
in a Ray actor is found too), dumps the Python ones into ``<out>/rank-<r>-pid<pid>.txt`` and lists
them in ``<out>/node-<node>.json`` (mxc merges the nodes' lists into the dump's index).

``trainer.json`` lies in the run directory, which others may write (a shared runs root), so it only
says where to look: the process it names must carry the run's own markers in its environment
(MXC_RUN_DIR of this run, the rank, the attempt), the markers are derived here, never read from the
file (a ``HOME=`` marker would match every process of the user), and the py-spy that runs is the one
this node program finds, never the path the file names (that would run any program as the user).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import atomicfile, layout, procs, stacks, sysread

_STARTTIME = 19  # position of the start time (clock ticks since boot) in /proc/<pid>/stat after (comm)
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def _boot_id() -> str:
    return (sysread.read_text(BOOT_ID, 256) or "").strip()


def _start_ticks(pid: int, proc: Path = procs.PROC) -> int | None:
    fields = sysread.process_stat(proc, pid)
    if not fields or len(fields) <= _STARTTIME or fields[0] == "Z" or not fields[_STARTTIME].isdigit():
        return None
    return int(fields[_STARTTIME])


def record_trainer(run: Path, rank: int, node: str, attempt: int, pid: int, markers: list[str],
                   py_spy: str | None) -> None:
    """Called by the rank as soon as its trainer runs; replaced by each attempt's trainer."""
    atomicfile.write_json(layout.trainer_record(run, rank), {
        "rank": rank, "node": node, "attempt": attempt, "pid": pid, "start_ticks": _start_ticks(pid),
        "boot_id": _boot_id(), "markers": markers, "py_spy": py_spy})


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def live_trainers(run: Path, node: str | None = None, proc: Path = procs.PROC) -> list[dict[str, Any]]:
    """The recorded trainers (of ``node``, or of any node) that run now on this machine, by rank."""
    found = []
    for name in sysread.list_dir(run / "ranks"):
        if not name.isdigit():
            continue
        info = _read(layout.trainer_record(run, int(name)))
        if info is None or (node is not None and info.get("node") != node):
            continue
        pid, ticks, attempt = info.get("pid"), info.get("start_ticks"), info.get("attempt")
        if type(pid) is not int or pid <= 0 or info.get("boot_id") != _boot_id() or _start_ticks(pid, proc) != ticks:
            continue
        if type(attempt) is not int or not procs.carries(pid, procs.run_markers(run, int(name), attempt), proc):
            continue  # not this run's training (a pid written by someone else, or reused)
        found.append({**info, "rank": int(name)})
    return sorted(found, key=lambda i: int(i.get("rank", 0)))


def dump_node(run: Path, out_dir: Path, node: str | None = None) -> list[dict[str, Any]]:
    """Every live trainer's Python stacks on this node into ``out_dir``; the list of what was written.

    Each entry: rank, node, attempt, pid, file (relative to ``out_dir``), method, ok. The list also
    goes to ``out_dir/node-<node>.json`` when ``node`` is given (several nodes write one dump).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    entries: list[dict[str, Any]] = []
    for info in live_trainers(run, node):
        rank = int(info["rank"])
        markers = procs.run_markers(run, rank, int(info["attempt"]))
        pids = stacks.pythons(procs.trainer_processes(int(info["pid"]), markers))
        for dump in stacks.dump_stacks(pids, out_dir, f"rank-{rank}", tool=stacks.AUTO, last_resort=False):
            entries.append({"rank": rank, "node": info.get("node"), "attempt": info.get("attempt"), "pid": dump.pid,
                            "file": dump.path.name, "method": dump.method, "ok": dump.ok})
    if node is not None:
        atomicfile.write_json(out_dir / f"node-{node}.json", entries)
    return entries
