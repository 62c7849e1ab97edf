"""Cleaning up: gc (by policy, a dry run unless --yes) and rm (named runs and bundles)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from mxc.cli.common import add_command, add_json, print_json, store, table


def register(sub: Any) -> None:
    p = add_command(sub, "gc", "remove old runs, bundles, code exports and images from $MXC_HOME (a dry run unless --yes)",
                    "mxc gc --older-than 30d                 # what would go, and the bytes freed\n"
                    "mxc gc --status failed,cancelled --keep-last 5 --yes", _gc)
    p.add_argument("--older-than", metavar="AGE", help="only what ended or was last used longer ago than AGE "
                   "(30d, 12h, 90m, 2w); bundles, code exports and images are removed only with this or --keep-last")
    p.add_argument("--status", metavar="S[,S...]", help="only runs with these statuses: succeeded, failed, cancelled, "
                   "hung, lost, unreadable (default: every finished run, and lost ones)")
    p.add_argument("--keep-last", type=int, metavar="N", help="keep the N most recent runs matching --status, and the "
                   "N most recently used bundles, whatever their age")
    p.add_argument("--include-used-bundles", action="store_true", help="also bundles (their code exports and "
                   "images) that kept runs used; never one a live run uses")
    p.add_argument("-y", "--yes", action="store_true", help="remove them (default: only list what would go)")
    add_json(p)

    p = add_command(sub, "rm", "remove named runs and bundles (a live run is refused: cancel it first)",
                    "mxc rm 20260101-120000-ab12-3f9a0c1d\nmxc rm 3f9a 7c1e", _rm)
    p.add_argument("refs", nargs="+", metavar="RUN|BUNDLE", help="run id or unique prefix, or bundle hash prefix")
    add_json(p)


def _policy(args: argparse.Namespace) -> Any:
    from mxc.errors import UserError
    from mxc.runtime import gc

    age = None
    if args.older_than is not None:
        try:
            age = gc.parse_age(args.older_than)
        except ValueError as exc:
            raise UserError(f"--older-than: {exc}") from None
    statuses = None
    if args.status is not None:
        statuses = frozenset(s.strip() for s in args.status.split(",") if s.strip())
        unknown = sorted(statuses - set(gc.RUN_STATUSES))
        if unknown or not statuses:
            raise UserError(f"--status: unknown status '{','.join(unknown) or args.status}'",
                            "one or more of " + ", ".join(gc.RUN_STATUSES))
    if args.keep_last is not None and args.keep_last < 0:
        raise UserError(f"--keep-last: {args.keep_last} is negative", "a count of runs to keep: --keep-last 5")
    if age is None and statuses is None and args.keep_last is None:
        raise UserError("say what to remove: --older-than AGE, --status S, --keep-last N (or several)",
                        "mxc gc --older-than 30d")
    return gc.Policy(older_than_s=age, statuses=statuses, keep_last=args.keep_last,
                     used_bundles=args.include_used_bundles)


def _gc(args: argparse.Namespace) -> int:
    from mxc.runtime import gc
    from mxc.runtime.runpaths import Roots

    policy = _policy(args)
    roots = Roots.of(store().home)
    if args.yes:
        gc.sweep_leftovers(roots)
    inventory = gc.Inventory.scan(roots)
    items = gc.plan(inventory, policy, time.time())
    done, problems = (_remove(items, roots) if args.yes else ([], []))
    total = sum(i.size for i in items)
    others = sorted(s.run.run_id for s in inventory.others)
    if args.json:
        print_json({"removed": args.yes, "bytes": total, "items": [i.as_dict() for i in items],
                    "problems": problems, "other_users_runs": others})
        return 1 if problems else 0
    if others:
        print(f"mxc gc: {len(others)} run(s) of other users left alone (mxc acts only on your own)", file=sys.stderr)
    if not items:
        print("mxc gc: nothing to remove", file=sys.stderr)
        return 0
    rows = [[i.kind, i.name if i.kind != "bundle" else i.name[:12], _when(i.when), gc.human_bytes(i.size), i.why,
             _paths(i)] for i in items]
    print(table(rows, ["KIND", "NAME", "LAST USED", "SIZE", "WHY", "PATHS"]))
    counts = ", ".join(f"{n} {kind}{'s' if n != 1 else ''}" for kind in ("run", "bundle", "code", "image")
                       if (n := sum(1 for i in items if i.kind == kind)))
    if args.yes:
        freed = sum(i.size for i in done)
        print(f"mxc gc: removed {len(done)} of {len(items)} ({counts}), freed {gc.human_bytes(freed)}", file=sys.stderr)
        for problem in problems:
            print(f"mxc gc: not removed: {problem}", file=sys.stderr)
        return 1 if problems else 0
    print(f"mxc gc: would free {gc.human_bytes(total)} ({counts}); nothing removed: add --yes to remove them",
          file=sys.stderr)
    return 0


def _paths(item: Any) -> str:
    """Every path an item's removal removes, as a shell would quote it (``mxc gc`` lists them all)."""
    import shlex

    return " ".join(shlex.quote(str(p)) for p in item.paths)


def _remove(items: list[Any], roots: Any) -> tuple[list[Any], list[str]]:
    """Remove each item still removable now; what went, and one line per item that did not."""
    from mxc.runtime import gc

    done, problems = [], []
    for item in items:
        why_not = gc.still_removable(item, roots)
        if why_not:
            problems.append(why_not)
            continue
        try:
            gc.remove(item)
        except OSError as exc:
            problems.append(f"{item.kind} {item.name}: {exc}")
            continue
        done.append(item)
    return done, problems


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(epoch)) if epoch else "-"


def _rm(args: argparse.Namespace) -> int:
    from mxc.errors import UserError
    from mxc.runtime import gc, runs
    from mxc.runtime.runpaths import Roots

    st = store()
    roots = Roots.of(st.home)
    states = [gc.run_state(r, roots) for r in runs.all_runs(roots.home)]
    items: list[Any] = []
    for ref in args.refs:  # every name checked before anything is removed
        ref = ref.strip()
        matched_runs = [s for s in states if ref and s.run.run_id.startswith(ref)]
        exact = [s for s in matched_runs if s.run.run_id == ref]
        matched_runs = exact or matched_runs
        bundles = [h for h in st.hashes() if ref and h.startswith(ref.lower())] if not exact else []
        if matched_runs and bundles:
            raise UserError(f"'{ref}' matches both run {matched_runs[0].run.run_id} and bundle {bundles[0][:12]}",
                            "give more characters")
        if len(matched_runs) > 1 or len(bundles) > 1:
            names = [s.run.run_id for s in matched_runs] or [b[:12] for b in bundles]
            raise UserError(f"'{ref}' is ambiguous: {len(names)} match ({', '.join(names[:5])})", "give more characters")
        if matched_runs:
            state = matched_runs[0]
            runs.require_own(state.run, "remove")
            if state.live:
                raise UserError(f"run {state.run.run_id} is live ({state.status}): cancel it first",
                                f"mxc cancel {state.run.run_id}")
            items.append(gc.Item("run", state.run.run_id, state.paths, state.when, "named", gc.size_of(state.paths)))
        elif bundles:
            user = gc.protected_bundle(bundles[0], states)
            if user is not None:
                raise UserError(f"bundle {bundles[0][:12]} is used by live run {user.run.run_id}",
                                f"wait for it to end, or cancel it first: mxc cancel {user.run.run_id}")
            path = st.bundles / bundles[0]
            items.append(gc.Item("bundle", bundles[0], (path,), gc.mtime(path), "named", gc.size_of([path])))
        else:
            raise UserError(f"no run or bundle matches '{ref}'", "list them with: mxc runs, mxc ls")
    unique = list({(i.kind, i.name): i for i in items}.values())
    done, problems = _remove(unique, roots)
    if args.json:
        print_json({"removed": [i.as_dict() for i in done], "problems": problems})
    else:
        for item in done:
            print(f"removed {item.kind} {item.name} ({gc.human_bytes(item.size)}): {_paths(item)}")
        for problem in problems:
            print(f"mxc rm: not removed: {problem}", file=sys.stderr)
    return 1 if problems else 0
