"""``mxc watch``: the one command that acts on what Slurm says about a run.

Reads (``mxc runs``, ``logs``, ``triage``, ...) only show a Slurm run as it is now. ``mxc watch``
saves what they show into record.json (the final record once the job ended), sends the
alerts the change calls for, and resubmits a job that asked for it (compute nodes without
scontrol) from the stored, verified bundle.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from mxc.cli.common import add_command, add_json, print_json, shown, store


def register(sub: Any) -> None:
    p = add_command(sub, "watch", "keep Slurm runs' records current: save their state, send alerts, resubmit on request",
                    "mxc watch                # every live Slurm run, until all have ended\n"
                    "mxc watch 20260101-1200 --once", _watch)
    p.add_argument("runs", nargs="*", metavar="RUN", help="run ids or unique prefixes (default: every live Slurm run)")
    p.add_argument("--once", action="store_true", help="one look at each run, then exit")
    p.add_argument("--interval", type=float, default=30.0, metavar="SECONDS", help="between looks (default 30)")
    add_json(p)


def _watch(args: argparse.Namespace) -> int:
    from mxc.errors import UserError
    from mxc.runtime import runs

    home = store().home
    if args.interval <= 0:
        raise UserError(f"--interval {args.interval:g}: expected a number of seconds above 0")
    named = [runs.find_run(home, ref) for ref in args.runs]
    problems = 0
    while True:
        selected = named or [r for r in runs.all_runs(home) if _live_slurm(r)]
        if not selected:
            print("mxc: no live Slurm run to watch", file=sys.stderr)
        records = []
        snapshot = _poll(selected)
        for run in selected:
            record, ok = _look(run, snapshot)
            problems += 0 if ok else 1
            if record is not None:
                records.append(record)
        live = [r for r in records if not r.final and r.backend == "slurm"]
        if args.once or not live:
            break
        time.sleep(args.interval)
    if args.json:
        print_json([r.model_dump(mode="json") for r in records])
    return 1 if problems else 0


def _live_slurm(run: Any) -> bool:
    """A live Slurm run of this user's (another user's runs are read-only: watched by their owner)."""
    from mxc.runtime import runs

    try:
        record = runs.read_record(run)
    except (OSError, ValueError):
        return False
    return record.backend == "slurm" and not record.final and runs.other_owner(run) is None


def _poll(selected: list[Any]) -> Any:
    """Slurm's state of every live Slurm run of this look, from one squeue and at most one sacct
    call (None when Slurm cannot be asked just now: each run is then asked on its own)."""
    from mxc.runtime import runs
    from mxc.runtime.slurm.backend import poll

    live = []
    for run in selected:
        try:
            record = runs.read_record(run)
        except (OSError, ValueError):
            continue
        if record.backend == "slurm" and not record.final:
            live.append((run, record, None))
    if not live:
        return None
    try:
        return poll(live)
    except Exception as exc:  # Slurm unreachable just now: the next look tries again
        print(f"mxc: warning: could not ask slurm about {len(live)} run(s): {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return None


def _look(run: Any, snapshot: Any = None) -> tuple[Any, bool]:
    """Refresh one run and say what changed; (record or None, whether it went well)."""
    from mxc.errors import UserError
    from mxc.runtime import runs

    try:
        before = runs.read_record(run)
    except (OSError, ValueError) as exc:
        print(f"mxc: error: run {run.run_id}: record.json is unreadable ({str(exc).splitlines()[0]})", file=sys.stderr)
        return None, False
    status = runs.shown_status(before)
    if before.backend != "slurm":  # named by the user: say why nothing is done (a local run needs no watch)
        what = ("lost: `mxc cancel` ends what is left of it" if status == "lost"
                else "final" if before.final else "live: its own `mxc run` keeps its record and restarts it")
        print(f"mxc: run {run.run_id} is a {before.backend} run ({status}), {what}; only Slurm runs need "
              "`mxc watch` (local runs record themselves)", file=sys.stderr)
        return before, True
    if before.final:
        print(f"mxc: run {run.run_id}: {status}, its record is final: nothing left to watch", file=sys.stderr)
        return before, True
    from mxc.runtime.slurm.backend import refresh

    try:
        runs.require_own(run, "watch (save the record of, resubmit or alert for)")
        after = refresh(run, snapshot)
    except UserError as exc:
        print(f"mxc: error: {exc}", file=sys.stderr)
        return None, False
    except Exception as exc:  # Slurm unreachable just now: the next look tries again
        print(f"mxc: warning: run {run.run_id}: could not ask slurm about it: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return before, False
    for line in _changes(before, after):
        print(shown(f"mxc: run {run.run_id}: {line}"), file=sys.stderr)
    return after, True


def _changes(before: Any, after: Any) -> list[str]:
    out = []
    jobs_before = len(before.slurm.jobs) if before.slurm else 0
    for job in (after.slurm.jobs if after.slurm else [])[jobs_before:]:
        out.append(f"resubmitted as Slurm job {job.job_id} ({job.why})")
    if after.status != before.status or after.final != before.final:
        end = f": {after.message}" if after.final and after.message else ""
        out.append(f"{before.status} -> {after.status}{end}")
    return out
