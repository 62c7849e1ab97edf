"""``mxc stacks``: where every rank of a live run is, now (py-spy; the training goes on)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from mxc import fsutil
from mxc.cli.common import add_command, add_json, print_json, store


def register(sub: Any) -> None:
    p = add_command(sub, "stacks", "dump the Python (and native) stacks of every rank of a live run, without "
                    "stopping it, into <run>/stacks/<UTC time>/ and the terminal",
                    "mxc stacks 20260101-120000\nmxc stacks --json", _stacks)
    p.add_argument("run", nargs="?", help="run id or unique prefix (default: the latest run)")
    add_json(p)


def _stacks(args: argparse.Namespace) -> int:
    from mxc.errors import UserError
    from mxc.runtime import livestacks, runs

    st = store()
    if args.run:
        run = runs.find_run(st.home, args.run)
    else:
        every = runs.all_runs(st.home)
        if not every:
            raise UserError("no runs yet", "mxc build specs/tiny.yaml && mxc run")
        run = every[-1]
    record = runs.load(run)
    bundle_dir, nodes = None, 1
    if record.backend == "slurm" and (st.bundles / record.bundle).is_dir():
        from mxc.runtime.contract import load as load_contract

        bundle = st.get(record.bundle)
        st.require_intact(bundle)  # its node program is about to run on every node of the job
        bundle_dir, nodes = bundle.path, load_contract(bundle).nodes
    dump = livestacks.take(run, bundle_dir, nodes)
    if args.json:
        print_json(dump.as_dict())
        return 0 if dump.ok else 1
    for entry in dump.entries:
        try:
            text = fsutil.read_text(dump.directory / entry["file"])
        except OSError as exc:
            text = f"(unreadable: {exc})"
        where = f" on {entry['node']}" if entry.get("node") else ""
        print(f"==> rank {entry['rank']}{where}, pid {entry['pid']}, attempt {entry.get('attempt')} "
              f"({entry['method']}{'' if entry['ok'] else ', failed'}) <==")
        print(text.rstrip("\n"), end="\n\n")
    for problem in dump.problems:
        print(f"mxc: warning: {problem}", file=sys.stderr)
    ranks = len({e["rank"] for e in dump.entries})
    print(f"mxc: {len(dump.entries)} process(es) of {ranks} rank(s): {dump.directory}", file=sys.stderr)
    return 0 if dump.ok else 1
