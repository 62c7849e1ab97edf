"""Stacks of a live training: where every Python process of it is (stuck).

Port of the dump part of mxc/runtime/observe/hang.py, for the node program's hang watch; also the
dump behind ``mxc stacks`` (livestacks.py), which passes ``last_resort=False``: on demand, a
training must never be disturbed, so there is py-spy or nothing.
For each process: ``py-spy dump`` where py-spy is installed (``--native`` first, for the C++ and
NCCL frames; without it when that fails), into ``<out_dir>/<tag>-pid<pid>.txt``. Without py-spy,
SIGABRT, so that Python's faulthandler (``PYTHONFAULTHANDLER=1``, set for training) prints every
thread's stack into the training log, which is copied into the same file. SIGABRT ends the
process: that is the last resort, used only when the hang is going to be killed anyway.

Fixed against hang.py: the faulthandler path waits until the process has died (its output is
then complete) instead of sleeping a fixed half second after the first line.

A stopped process (SIGSTOP, state T) has neither: py-spy 0.4 cannot read one ("Failed to find
python version from target process" or "Failed to get stack traces", --nonblocking too), and a
SIGABRT stays pending until it runs again, so the file held only its header. The hang watch kills
the process next anyway, so it sends SIGCONT first (the process resumes where it stopped, which is
the stack worth having) and says so in the file; ``mxc stacks`` never resumes a process: its file
says the process is stopped.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from . import sysread

PYSPY_TIMEOUT = 60.0  # seconds for one py-spy dump
FAULTHANDLER = "faulthandler"  # the method of a dump whose stacks come through the trainer's output
FAULTHANDLER_WAIT = 10.0  # seconds for a process to print its stacks and die after SIGABRT
AUTO = "auto"  # find py-spy (see find_py_spy)
_PGRP = 2  # position of the process group in /proc/<pid>/stat after the (comm) field


@dataclass(frozen=True)
class StackDump:
    pid: int
    path: Path
    method: str  # "py-spy --native", "py-spy", "faulthandler"
    ok: bool


def is_python(pid: int, proc: Path = Path("/proc")) -> bool:
    """Whether the process runs a Python interpreter (its executable's name says python)."""
    try:
        exe = os.readlink(proc / str(pid) / "exe")
    except OSError:
        return False
    return "python" in os.path.basename(exe)


def python_pids(pgid: int, proc: Path = Path("/proc")) -> list[int]:
    """Live Python processes of one process group (a training attempt and the workers it started)."""
    out = []
    for pid in sysread.process_ids(proc):
        fields = sysread.process_stat(proc, pid)
        if not fields or len(fields) <= _PGRP or fields[0] == "Z":
            continue
        if fields[_PGRP] == str(pgid) and is_python(pid, proc):
            out.append(pid)
    return out


def pythons(pids: list[int], proc: Path = Path("/proc")) -> list[int]:
    """The Python processes among a trainer's (py-spy reads Python stacks; a shell has none)."""
    return [p for p in pids if is_python(p, proc)]


PY_SPY_ENV = "MXC_PY_SPY"  # the py-spy of the `mxc stacks` that started this program (srun --export=ALL)


def find_py_spy() -> str | None:
    """The py-spy ``MXC_PY_SPY`` names (set by `mxc stacks` from its own environment, never read from
    a run's files), else the one beside the running interpreter (a virtualenv's bin/), else on PATH."""
    named = os.environ.get(PY_SPY_ENV, "")
    if named.startswith("/") and os.path.isfile(named) and os.access(named, os.X_OK):
        return named
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


def dump_with_pyspy(pid: int, out: Path, tool: str, timeout: float = PYSPY_TIMEOUT) -> StackDump:
    last = "timed out"
    for native in (True, False):
        argv = [tool, "dump", "--pid", str(pid)] + (["--native"] if native else [])
        try:
            done = subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL,
                                  timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            last = "timed out"
            continue
        except OSError as exc:
            last = str(exc)
            break
        stdout = done.stdout.decode("utf-8", "replace")
        if done.returncode == 0 and stdout.strip():
            out.write_text(f"# {' '.join(argv)}\n{stdout}", encoding="utf-8")
            return StackDump(pid, out, "py-spy --native" if native else "py-spy", True)
        last = done.stderr.decode("utf-8", "replace").strip() or stdout.strip()
    out.write_text(f"# py-spy could not read process {pid}: {last}\n", encoding="utf-8")
    return StackDump(pid, out, "py-spy", False)


def _log_size(log: Path | None) -> int:
    try:
        return os.stat(log).st_size if log is not None else 0
    except OSError:
        return 0


def _read_from(log: Path | None, start: int) -> str:
    if log is None:
        return ""
    try:
        with open(log, "rb") as fh:
            fh.seek(start)
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def dump_with_faulthandler(pid: int, out: Path, log: Path | None, wait: float = FAULTHANDLER_WAIT,
                           proc: Path = Path("/proc")) -> StackDump:
    """SIGABRT: faulthandler prints all threads' stacks to stderr (the log), then the process dies."""
    start = _log_size(log)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGABRT)
    deadline = time.monotonic() + wait
    while sysread.process_alive(proc, pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    text = _read_from(log, start)
    begin = text.find("Fatal Python error")
    out.write_text(f"# faulthandler (SIGABRT to {pid}); from the training log\n" + (text[begin:] if begin >= 0 else text),
                   encoding="utf-8")
    return StackDump(pid, out, FAULTHANDLER, begin >= 0)


def dump_stacks(pids: list[int], out_dir: Path, tag: str, log: Path | None = None, tool: str | None = AUTO,
                proc: Path = Path("/proc"), last_resort: bool = True) -> list[StackDump]:
    """One stack dump per process into ``out_dir/<tag>-pid<pid>.txt``.

    ``tool`` is py-spy's path, ``AUTO`` to look for it, None for none (then SIGABRT and the
    faulthandler output in ``log``, the file the training's stderr goes to). ``last_resort=False``
    never sends SIGABRT: a process py-spy cannot read gets a file saying why, and lives on.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    spy = find_py_spy() if tool == AUTO else tool
    dumps = []
    for pid in pids:
        out = out_dir / f"{tag}-pid{pid}.txt"
        resumed = stopped(pid, proc)
        if resumed and not last_resort:
            out.write_text(f"# no stacks of process {pid}: it is stopped (SIGSTOP or a debugger); py-spy cannot read a "
                           "stopped process, and mxc stacks never resumes one\n", encoding="utf-8")
            dumps.append(StackDump(pid, out, "none", False))
            continue
        if resumed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        dump = _dump_one(pid, out, spy, log, proc, last_resort)
        if resumed:
            note = f"# process {pid} was stopped (state T): sent SIGCONT to read its stacks, as it is killed next\n"
            with contextlib.suppress(OSError):
                out.write_text(note + out.read_text(encoding="utf-8"), encoding="utf-8")
        dumps.append(dump)
    return dumps


def stopped(pid: int, proc: Path = Path("/proc")) -> bool:
    """Whether the process is stopped by a signal (SIGSTOP, SIGTSTP; state T)."""
    fields = sysread.process_stat(proc, pid)
    return fields is not None and len(fields) > 0 and fields[0] == "T"


def _dump_one(pid: int, out: Path, spy: str | None, log: Path | None, proc: Path, last_resort: bool) -> StackDump:
    if spy:
        dump = dump_with_pyspy(pid, out, spy)
        if dump.ok or not last_resort:
            return dump
    if not last_resort:
        out.write_text(f"# no stacks of process {pid}: py-spy is not installed (pip install py-spy)\n",
                       encoding="utf-8")
        return StackDump(pid, out, "none", False)
    return dump_with_faulthandler(pid, out, log, proc=proc)
