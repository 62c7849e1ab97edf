"""Stopping a local run (``mxc cancel``): its supervisor stops it, or, when it is gone, what is left is ended here.

Kept apart from the supervisor: cancelling runs in another ``mxc`` process than the run itself.
"""

from __future__ import annotations

import sys

from mxc.runtime.record import RunRecord
from mxc.runtime.rundir import RunDir


def cancel(run: RunDir, record: RunRecord) -> RunRecord:
    """A live local run stops like on Ctrl-C: SIGTERM to its supervisor (the very process that
    wrote the record, verified by identity and by its registration in this user's scratch
    directory, ``scratch.vouches``), which records `cancelled`. A lost run (its
    supervisor is gone) has nobody to ask: what is left of it is ended here and the record closed."""
    import signal
    import time

    from mxc.errors import UserError
    from mxc.node import layout
    from mxc.runtime import runs
    from mxc.runtime.processes import scratch
    from mxc.runtime.record import now_iso

    alive = runs.supervisor_alive(record)
    if alive is None:
        raise UserError(f"run {run.run_id} is not running on this machine (its supervisor cannot be verified here)")
    identity = runs.supervisor(record)
    if alive and identity is not None and not scratch.vouches(run.path, identity):
        # The record is a file others may have written (a shared runs root): it names a process, it does
        # not prove it is this run's. The supervisor registered itself where only this user writes.
        raise UserError(f"run {run.run_id}: process {identity.pid}, which its record names, is not registered as "
                        f"its supervisor in {scratch.root()}: not signalling it",
                        "stop the run where it was started (Ctrl-C), or check that process yourself")
    if alive and identity is not None:
        # The record then says who stopped it (cancelled_by "mxc cancel", not a bare SIGTERM).
        (run.path / layout.CANCEL_REQUEST).write_text(now_iso() + "\n")
    if not alive or identity is None or not identity.send(signal.SIGTERM):
        return _end_lost(run, record)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        record = runs.load(run)
        if record.final:
            break
        time.sleep(0.25)
    return record


def _end_lost(run: RunDir, record: RunRecord) -> RunRecord:
    """End the processes a lost run left (found by MXC_RUN_DIR, verified), remove its scratch
    directories, and close its record as cancelled, saying what was cleaned."""
    from mxc.runtime.logs.metrics_merge import write_merged
    from mxc.runtime.processes.leftovers import end_run
    from mxc.runtime.processes.procfs import pid_alive
    from mxc.runtime.record import now_iso

    pid = (record.supervisor or {}).get("pid")
    reused = " (that pid now belongs to another process)" if isinstance(pid, int) and pid_alive(pid) else ""
    cleanup = end_run(run.path)
    merged = write_merged(run.metrics_parts, run.metrics)
    if merged.steps:
        record.steps, record.last_loss = merged.steps, merged.last_loss
    record.status, record.final, record.ended = "cancelled", True, now_iso()
    if record.attempts and record.attempts[-1].ended is None:
        record.attempts[-1].ended = record.ended
        record.attempts[-1].reason = "the supervisor died; what was left of the attempt was ended by mxc cancel"
    record.cancelled_by = "mxc cancel"
    record.message = f"lost: its supervisor (mxc run, pid {pid}) was gone{reused}; mxc cancel: {cleanup.describe()}"
    record.save(run.record)
    print(f"mxc: run {run.run_id} was lost: its supervisor (pid {pid}) is gone{reused}; {cleanup.describe()}",
          file=sys.stderr)
    return record
