"""Hang detection: no training step for ``observability.hang_timeout`` seconds after the first.

A step is a line appended to the attempt's metrics file (MaxText writes one per step, one
step late); the watchdog only ``stat``s those files, so it costs nothing. The clock starts
at the first step: compilation and checkpoint restore before it can take long and are not
hangs. When it fires, the watchdog

1. dumps the Python stacks of every Python process of the training (its process group)
   into ``<run>/stacks/`` with ``py-spy dump`` (``--native`` too where it works); without
   py-spy it sends SIGABRT, and Python's faulthandler (``PYTHONFAULTHANDLER=1``, set by the
   launcher) prints every thread's stack into the training log, which is copied there;
2. kills the training (SIGKILL to its process group), so the supervisor's restart logic (or
   Slurm's requeue) takes over, and the run records the attempt as hung.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mxc.runtime.procfs import group_processes

PYSPY_TIMEOUT = 60.0


def is_python(pid: int) -> bool:
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return False
    return "python" in Path(exe).name


def py_spy() -> str | None:
    """py-spy next to the running interpreter (a venv's bin/), else on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


@dataclass(frozen=True)
class StackDump:
    pid: int
    path: Path
    method: str  # py-spy, py-spy --native, faulthandler
    ok: bool


def dump_with_pyspy(pid: int, out: Path, tool: str) -> StackDump:
    last = "timed out"
    for native in (True, False):
        argv = [tool, "dump", "--pid", str(pid), *(["--native"] if native else [])]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=PYSPY_TIMEOUT, check=False)
        except subprocess.TimeoutExpired:
            last = "timed out"
            continue
        if done.returncode == 0 and done.stdout.strip():
            out.write_text(f"# {' '.join(argv)}\n{done.stdout}")
            return StackDump(pid, out, "py-spy --native" if native else "py-spy", True)
        last = done.stderr.strip() or done.stdout.strip()
    out.write_text(f"# py-spy could not read process {pid}: {last}\n")
    return StackDump(pid, out, "py-spy", False)


def dump_with_faulthandler(pid: int, out: Path, log: Path | None, wait: float = 5.0) -> StackDump:
    """SIGABRT: with faulthandler enabled Python prints all threads' stacks to stderr (the log)."""
    start = log.stat().st_size if log is not None and log.exists() else 0
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGABRT)
    deadline = time.monotonic() + wait
    text = ""
    while time.monotonic() < deadline:
        if log is not None and log.exists():
            with open(log, "rb") as fh:
                fh.seek(start)
                text = fh.read().decode("utf-8", "replace")
            if "Fatal Python error" in text and ("Current thread" in text or "Thread 0x" in text):
                time.sleep(0.5)  # let it finish writing every thread
                with open(log, "rb") as fh:
                    fh.seek(start)
                    text = fh.read().decode("utf-8", "replace")
                break
        time.sleep(0.1)
    begin = text.find("Fatal Python error")
    out.write_text(f"# faulthandler (SIGABRT to {pid}); from the training log\n" + (text[begin:] if begin >= 0 else text))
    return StackDump(pid, out, "faulthandler", begin >= 0)


def dump_stacks(pgid: int, stacks_dir: Path, label: str, log: Path | None = None) -> list[StackDump]:
    """Every Python process of a training attempt's process group (the trainer and its workers)."""
    return dump_pids([pid for pid in group_processes(pgid) if is_python(pid)], stacks_dir, label, log)


def dump_pids(pids: list[int], stacks_dir: Path, label: str, log: Path | None = None) -> list[StackDump]:
    stacks_dir.mkdir(parents=True, exist_ok=True)
    tool = py_spy()
    dumps = []
    for pid in pids:
        out = stacks_dir / f"{label}-pid{pid}.txt"
        if tool:
            dump = dump_with_pyspy(pid, out, tool)
            if dump.ok:
                dumps.append(dump)
                continue
        dumps.append(dump_with_faulthandler(pid, out, log))
    return dumps


class HangWatchdog:
    """Watches one attempt; ``on_hang(seconds_idle, last_step_time)`` runs once, in its thread."""

    def __init__(self, progress: Callable[[], int], timeout: float, on_hang: Callable[[float], None],
                 poll: float | None = None) -> None:
        self.progress = progress  # grows with every step (bytes of metrics written)
        self.timeout = timeout
        self.on_hang = on_hang
        self.poll = poll if poll is not None else min(5.0, max(0.2, timeout / 20))
        self.fired = False
        self.first_step_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mxc-hang-watchdog", daemon=True)

    def start(self) -> HangWatchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=PYSPY_TIMEOUT * 2)

    def _run(self) -> None:
        last_size = 0
        last_change = time.monotonic()
        while not self._stop.wait(self.poll):
            size = self.progress()
            now = time.monotonic()
            if size != last_size:
                if self.first_step_at is None and size > 0:
                    self.first_step_at = now
                last_size, last_change = size, now
                continue
            if self.first_step_at is not None and now - last_change >= self.timeout:
                self.fired = True
                self.on_hang(now - last_change)
                return
