"""Stopping runs: cancel (Slurm jobs, live local runs, and what is left of lost ones)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from mxc.cli.common import add_command, add_json, print_json, shown, store


def register(sub: Any) -> None:
    p = add_command(sub, "cancel", "stop a run: scancel its Slurm job (no requeue afterwards), or stop a local run "
                    "(a lost one: end what is left of it)",
                    "mxc cancel 20260101-120000-ab12-3f9a0c1d\nmxc cancel 2026 --json", _cancel)
    p.add_argument("run", help="run id or unique prefix")
    add_json(p)


def _cancel(args: argparse.Namespace) -> int:
    from mxc.errors import UserError
    from mxc.runtime import runs
    from mxc.runtime.backends import get_backend

    run = runs.find_run(store().home, args.run)
    runs.require_own(run, "cancel")
    record = runs.load(run)
    if record.final:
        raise UserError(f"run {run.run_id} already ended ({record.status})")
    record = get_backend(record.backend).cancel(run)  # Slurm: saves what Slurm says first
    if args.json:
        print_json(record.model_dump(mode="json"))
    else:
        job = record.slurm.job_id if record.slurm else None
        what = f"Slurm job {job}" if job else "its supervisor"
        print(shown(f"mxc: run {run.run_id}: {record.status}" + ("" if record.final else f" (asked {what} to stop)")),
              file=sys.stderr)
    return 0 if record.status == "cancelled" or not record.final else 1
