"""``mxc wait RUN``: block until a run ends and exit with its status, like ``sbatch --wait``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from mxc.cli.common import add_command, add_json, print_json, shown, store

DEFAULT_INTERVAL = 5.0


def register(sub: Any) -> None:
    p = add_command(sub, "wait", "block until a run ends; exit 0 when it succeeded, non-zero when it failed or was "
                    "cancelled (like sbatch --wait)",
                    "mxc wait 20260101-1200 && echo trained\n"
                    "mxc run 3f9a -y --wait       # submit, then the same wait", _wait)
    p.add_argument("ref", help="run id (or unique prefix), @ (the newest run), @~N or label:NAME")
    add_interval(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress line")
    add_json(p)


def add_interval(p: argparse.ArgumentParser) -> None:
    p.add_argument("--interval", type=float, default=DEFAULT_INTERVAL, metavar="SECONDS",
                   help=f"between looks at the run (default {DEFAULT_INTERVAL:g}; each look at a Slurm run asks Slurm)")


def check_interval(interval: float) -> None:
    from mxc.errors import UserError

    if not interval > 0:
        raise UserError(f"--interval {interval:g}: expected a number of seconds above 0")


def wait_and_exit(run: Any, interval: float, quiet: bool, as_json: bool) -> int:
    """Wait for ``run``, print its end (the record as JSON with ``as_json``), return the exit status."""
    from mxc.runtime import waiting

    outcome = waiting.wait(run, interval, quiet=quiet)
    code = waiting.exit_status(outcome)
    record = outcome.record
    if as_json:
        print_json({**record.model_dump(mode="json"), "shown_status": outcome.status, "exit_status": code})
    elif not quiet:
        end = f" (exit {record.exit_code})" if record.exit_code not in (None, 0) else ""
        why = f": {record.message}" if record.message else ""  # a succeeded run's: a note (runtime.exit_grace)
        print(shown(f"mxc: run {record.run_id} {outcome.status}{end}{why}"), file=sys.stderr)
    return code


def _wait(args: argparse.Namespace) -> int:
    from mxc.runtime import runs

    check_interval(args.interval)
    run = runs.find_run(store().home, args.ref)
    runs.load(run)  # one clear line when it has no readable record
    return wait_and_exit(run, args.interval, args.quiet, args.json)
