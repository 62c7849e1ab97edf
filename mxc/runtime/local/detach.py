"""``mxc run --detach``: a local run that outlives the terminal it was started from.

Why a second ``mxc run`` rather than a fork: the supervisor must be an ordinary ``mxc run``
process (its identity goes into the record, so ``mxc cancel`` and the lost-run check work
unchanged), started clean, without the parent's terminal. The parent chooses the run id,
starts ``mxc run <bundle> --as-run-id <id>`` in a session of its own (no controlling terminal:
a dropped ssh connection's SIGHUP never reaches it) with stdin from /dev/null and stdout and
stderr to a file, and waits only until the run's first record exists. That file is then moved
into the run directory as ``mxc.log``; the child keeps writing to it (a rename keeps open
files open). If the child ends before writing a record (a bad bundle, a code export that
failed), its output is printed and its exit code returned, as a foreground run would.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from mxc.runtime.rundir import RunDir

LOG_NAME = "mxc.log"  # what the detached `mxc run` itself printed (summary, warnings)
START_TIMEOUT_S = 600.0  # a safety net only: the child writes its record within seconds


def pending_log(run: RunDir) -> Path:
    """The child's output until its run directory exists: beside it, hidden from `mxc runs` by the dot."""
    return run.path.parent / f".{run.run_id}.detached.log"


def start(run: RunDir, argv: Sequence[str], poll_s: float = 0.05) -> tuple[int | None, int]:
    """Start ``argv`` detached; (None, pid) once the run's record exists, else (exit code, pid)
    of a child that ended before (its output already copied to stderr)."""
    pending = pending_log(run)
    pending.parent.mkdir(parents=True, exist_ok=True)
    with open(pending, "wb") as out:
        child = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True, close_fds=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not run.record.exists():
        code = child.poll()
        if code is not None and not run.record.exists():
            with contextlib.suppress(OSError):
                sys.stderr.write(pending.read_text("utf-8", "replace"))
                pending.unlink()
            return (code or 1), child.pid
        if time.monotonic() > deadline:
            break  # leave it running: its record may still come; `mxc runs` will tell
        time.sleep(poll_s)
    with contextlib.suppress(OSError):
        os.replace(pending, run.path / LOG_NAME)
    child.returncode = 0  # not ours to wait for: it outlives this process (no "still running" warning)
    return None, child.pid
