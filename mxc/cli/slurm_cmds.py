"""Commands for runs on a scheduler: cancel."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from mxc.cli.common import add_command, add_json, print_json, store


def register(sub: Any) -> None:
    p = add_command(sub, "cancel", "stop a run: scancel its Slurm job (no requeue afterwards), or stop a local run",
                    "mxc cancel 20260101-120000-ab12-3f9a0c1d\nmxc cancel 2026 --json", _cancel)
    p.add_argument("run", help="run id or unique prefix")
    add_json(p)


def _cancel(args: argparse.Namespace) -> int:
    from mxc.errors import UserError
    from mxc.runtime import runs

    run = runs.find_run(store().home, args.run)
    record = runs.load(run)
    if record.final:
        raise UserError(f"run {run.run_id} already ended ({record.status})")
    if record.backend == "slurm":
        from mxc.runtime.slurm.backend import cancel

        record = cancel(run)
    else:
        record = _cancel_local(run, record)
    if args.json:
        print_json(record.model_dump(mode="json"))
    else:
        job = (record.slurm or {}).get("job_id")
        what = f"Slurm job {job}" if job else "its supervisor"
        print(f"mxc: run {run.run_id}: {record.status}" + ("" if record.final else f" (asked {what} to stop)"),
              file=sys.stderr)
    return 0 if record.status == "cancelled" or not record.final else 1


def _cancel_local(run: Any, record: Any) -> Any:
    """A local run stops like on Ctrl-C: SIGTERM to its supervisor, which records `cancelled`."""
    import os
    import signal
    import time

    from mxc.errors import UserError
    from mxc.runtime import runs

    if runs.supervisor_alive(record) is not True:
        raise UserError(f"run {run.run_id} is not running on this machine (no live supervisor)")
    os.kill(int(record.supervisor["pid"]), signal.SIGTERM)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        record = runs.load(run)
        if record.final:
            break
        time.sleep(0.25)
    return record
