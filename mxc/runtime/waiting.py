"""Waiting for a run to end (``mxc wait RUN``, ``mxc run --wait``), like ``sbatch --wait``.

Each look is a read (``runs.current``: a local run's record, a Slurm run's record with Slurm's
state folded in), so waiting never writes, submits or alerts: the job reports its own end
(mxc/node/jobreport.py), and ``mxc watch`` acts. A local run whose supervisor is gone without
writing its end is *lost*: waiting ends there too (exit 1), since nothing will end it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TextIO

from mxc.runtime import runs
from mxc.runtime.record import RunRecord
from mxc.runtime.rundir import RunDir


@dataclass(frozen=True)
class Outcome:
    record: RunRecord
    status: str  # the record's status, or "lost"


def progress_line(run: RunDir, record: RunRecord, status: str, now: datetime) -> str:
    """One line: status, steps, last loss, time so far (Slurm: the job id and its state)."""
    steps, loss = runs.live_progress(run, record)
    parts = [f"mxc: run {record.run_id}: {status}"]
    slurm = record.slurm
    if slurm is not None and slurm.job_id:
        parts.append(f"Slurm job {slurm.job_id}" + (f" {slurm.state}" if slurm.state else ""))
    if steps is not None:
        parts.append(f"step {steps}")
    if loss is not None:
        parts.append(f"loss {loss:.4f}")
    seconds = runs.duration_seconds(record, now)
    if seconds is not None:
        parts.append(f"{int(seconds) // 60}m{int(seconds) % 60:02d}s")
    if record.restarts:
        parts.append(f"restart {record.restarts}")
    return ", ".join(parts)


def wait(run: RunDir, interval: float, stream: TextIO | None = None, quiet: bool = False,
         sleep: Callable[[float], None] = time.sleep) -> Outcome:
    """Look at the run every ``interval`` seconds until it ends; a progress line on ``stream``
    (rewritten in place on a terminal, one line per change elsewhere)."""
    out = stream or sys.stderr
    tty = out.isatty()
    shown = ""
    while True:
        record = runs.current(run)
        status = runs.shown_status(record)
        if not quiet:
            line = progress_line(run, record, status, datetime.now(UTC))
            if tty:
                out.write("\r\x1b[2K" + line[:200])
                out.flush()
            elif _changed(shown, line):
                out.write(line + "\n")
                out.flush()
            shown = line
        if record.final or status == "lost":
            if tty and not quiet:
                out.write("\n")
            return Outcome(record, status)
        sleep(interval)


def _changed(before: str, after: str) -> bool:
    """A line worth printing again off a terminal: anything but the time differs (a log, not a clock)."""
    return before.rsplit(", ", 1)[0] != after.rsplit(", ", 1)[0] if before else True


def exit_status(outcome: Outcome) -> int:
    """0 when it succeeded; else what ``mxc run`` exits with for that record (1 when it was lost)."""
    from mxc.runtime.backends import exit_code

    if outcome.status == "lost":
        return 1
    return exit_code(outcome.record)
