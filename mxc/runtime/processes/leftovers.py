"""What is left of a run whose supervisor died, and ending it.

Every process mxc starts for a local run carries ``MXC_RUN_DIR=<run directory>`` in its
environment: the training (entrypoint, Python, whatever they start), the exporter,
Prometheus, the Ray head and its workers. That marker, read from ``/proc/<pid>/environ`` of
this user's processes, is how the run's processes are found once nothing else knows their
pids; each is then signalled through its verified identity (``procfs.ProcessId``), so a
process that exited meanwhile and whose pid went to someone else is never touched.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from mxc.runtime.processes import scratch
from mxc.runtime.processes.procfs import ProcessId, command_line, processes_with_env

RUN_MARKER = "MXC_RUN_DIR"
GRACE_SECONDS = 10.0
_ROUNDS = 3  # a dying process may start another (a shell's exit trap): look again


@dataclass
class Cleanup:
    """What ``end_run`` found and did."""

    stopped: list[tuple[int, str]] = field(default_factory=list)  # (pid, command line) of each process ended
    killed: list[int] = field(default_factory=list)  # those that needed SIGKILL after the grace period
    removed: list[Path] = field(default_factory=list)  # scratch directories removed

    def describe(self) -> str:
        parts = []
        if self.stopped:
            listed = ", ".join(f"{pid} ({cmd})" for pid, cmd in self.stopped[:5])
            more = f" and {len(self.stopped) - 5} more" if len(self.stopped) > 5 else ""
            parts.append(f"stopped {len(self.stopped)} leftover process(es): {listed}{more}")
        else:
            parts.append("no process of it was left")
        if self.removed:
            parts.append("removed " + ", ".join(str(p) for p in self.removed))
        return "; ".join(parts)


def run_processes(run_dir: Path) -> list[ProcessId]:
    """This user's live processes started for the run in ``run_dir``."""
    return processes_with_env(RUN_MARKER, str(run_dir))


def end_run(run_dir: Path, grace: float = GRACE_SECONDS) -> Cleanup:
    """SIGTERM every process of the run, SIGKILL what is left after ``grace`` seconds, then
    remove the run's abandoned scratch directories. Only for runs whose supervisor is gone."""
    done = Cleanup()
    for _ in range(_ROUNDS):
        found = run_processes(run_dir)
        if not found:
            break
        done.stopped += [(p.pid, command_line(p.pid)) for p in found]
        for process in found:
            process.send(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while any(p.is_alive() for p in found) and time.monotonic() < deadline:
            time.sleep(0.1)
        for process in found:
            if process.send(signal.SIGKILL):
                done.killed.append(process.pid)
        while any(p.is_alive() for p in found) and time.monotonic() < deadline + grace:
            time.sleep(0.05)  # SIGKILL is final; this only waits for the kernel to finish
    done.removed = scratch.sweep(run_dir)
    return done
