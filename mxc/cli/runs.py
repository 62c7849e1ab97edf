"""Run commands: run, rerun, runs, logs."""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mxc.cli.common import add_command, add_json, print_json, store, table
from mxc.fsutil import open_regular

LOG_CHUNK = 1 << 24  # bytes of a log read at a time (a huge log is printed in pieces, never all in memory)


def register(sub: Any) -> None:
    p = add_command(sub, "run", "train a stored bundle (default: the last `mxc build`), recorded under $MXC_HOME/runs",
                    "mxc build specs/tiny.yaml && mxc run\nmxc run 3f9a --dry-run", _run)
    p.add_argument("bundle", nargs="?", help="bundle hash or unique prefix (default: the last bundle built)")
    _add_run_options(p)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="not allowed: a bundle is immutable (use `mxc build --set`)")
    p.add_argument("--resume-from", metavar="RUN[@STEP]",
                   help="start from another run's checkpoint (its newest, or the one at STEP); a new run of this "
                        "bundle, recorded with resumed_from. Example: mxc run --resume-from 20260101-1200@20")

    p = add_command(sub, "rerun", "run a recorded run's bundle again, exactly, after checking this machine for drift",
                    "mxc rerun 20260101-120000-ab12-3f9a0c1d\nmxc rerun 3f9a --strict", _rerun)
    p.add_argument("ref", help="run id (or unique prefix), or bundle hash prefix")
    p.add_argument("--strict", action="store_true", help="refuse to run when the environment drifted")
    _add_run_options(p)

    p = add_command(sub, "runs", "list runs: id, bundle, spec, status, steps, last loss, start, duration",
                    "mxc runs\nmxc runs --bundle 3f9a --json", _runs)
    p.add_argument("--bundle", help="only runs of this bundle (hash prefix)")
    p.add_argument("-n", "--last", type=int, default=0, metavar="N", help="only the N most recent runs")
    add_json(p)

    p = add_command(sub, "logs", "print a run's training log (default: the latest run)",
                    "mxc logs 20260101-120000\nmxc logs -f", _logs)
    p.add_argument("ref", nargs="?", help="run id or unique prefix, or a bundle prefix (its latest run)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the run ends")
    p.add_argument("--attempts", action="store_true", help="only mxc's lines (attempt starts and exits)")


def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--local", action="store_true", help="run on this machine whatever runtime.backend says")
    p.add_argument("--dry-run", action="store_true", help="print the exact command and environment; run nothing")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary (the run id is still printed)")
    add_json(p)


# ---- run / rerun


def _run(args: argparse.Namespace) -> int:
    from mxc.errors import UserError

    if args.overrides:
        raise UserError("a bundle is immutable: `mxc run` cannot --set fields",
                        "build a new bundle with `mxc build SPEC --set KEY=VALUE`, then `mxc run` it")
    st = store()
    bundle = st.get(args.bundle) if args.bundle else st.last()
    resume = None
    if args.resume_from:
        from mxc.runtime import resume as resuming
        from mxc.runtime.contract import load as load_contract

        resume = resuming.find(st.home, args.resume_from)
        st.require_intact(bundle)
        resuming.check_bundle(resume, load_contract(bundle), bundle.hash)
    return _launch(args, bundle, rerun_of=None, resume_from=resume)


def _rerun(args: argparse.Namespace) -> int:
    from mxc.errors import UserError
    from mxc.runtime import runs
    from mxc.runtime.backends import training_python
    from mxc.runtime.provenance import hostfacts

    st = store()
    ref = runs.resolve(st.home, args.ref, st.hashes())
    if not (st.bundles / ref.bundle).is_dir():
        raise UserError(f"bundle {ref.bundle[:12]} of run {ref.run.run_id if ref.run else '?'} is not in the store",
                        f"rebuild it from its spec; {st.bundles} no longer has it")
    bundle = st.get(ref.bundle)
    st.require_intact(bundle)  # before anything of it is read: the spec, the lock, the scripts
    from mxc.runtime.contract import load as load_contract

    contract = load_contract(bundle)
    if ref.run is None:
        if not args.quiet:
            print(f"mxc: bundle {bundle.hash[:12]} has no earlier run to compare with; running it", file=sys.stderr)
        return _launch(args, bundle, rerun_of=None)
    old = runs.load(ref.run)
    resume = None
    if old.resumed_from:  # the same start too: a rerun of a resumed run resumes from the same checkpoint
        from mxc.runtime import resume as resuming

        resume = resuming.recorded(old.run_id, old.resumed_from)
    native = contract.container.kind == "native"
    host = hostfacts.collect(training_python(contract) if native else None)
    pinned = old.code if contract.code.repo else None  # the bundle pins the commit; its export is verified at start
    current = {"host": host, "image": hostfacts.image_facts(contract, host, hostfacts.lockfile_digest(bundle.path)),
               "code": hostfacts.code_facts(contract, host, pinned)}
    drift = hostfacts.compare({"host": old.host, "image": old.image, "code": old.code}, current)
    significant = [d for d in drift if d.significant]
    shown = 20
    for d in drift[:shown]:
        label = "drift" if d.significant else "note"
        print(f"mxc: {label}: {d} (run {old.run_id} -> this machine)", file=sys.stderr)
    if len(drift) > shown:
        print(f"mxc: drift: ... and {len(drift) - shown} more differences", file=sys.stderr)
    if significant:
        if args.strict:
            raise UserError(f"refusing to rerun {old.run_id}: {len(significant)} environment difference(s) (listed above)",
                            "restore the environment, or rerun without --strict")
        print(f"mxc: warning: the environment drifted in {len(significant)} way(s) since run {old.run_id}; "
              "results may differ (--strict refuses)", file=sys.stderr)
    elif not args.quiet:
        print(f"mxc: no drift from run {old.run_id}", file=sys.stderr)
    return _launch(args, bundle, rerun_of=old.run_id, resume_from=resume)


def _launch(args: argparse.Namespace, bundle: Any, rerun_of: str | None, resume_from: Any = None) -> int:
    from mxc.runtime.backends import RunRequest, exit_code, get_backend

    st = store()
    st.require_intact(bundle)  # and again before each attempt (the local supervisor) and each resubmission
    from mxc.runtime.contract import load as load_contract

    backend = get_backend("local" if args.local else load_contract(bundle).backend)
    request = RunRequest(home=st.home, bundle=bundle, spec=bundle.spec(), rerun_of=rerun_of, quiet=args.quiet or args.json,
                         resume_from=resume_from)
    plan = backend.plan(request)
    if resume_from is not None:
        plan.notes.append(f"resumes from run {resume_from.run} at step {resume_from.step}: its checkpoint "
                          f"{resume_from.path} is seeded into this run's checkpoints first")
    if args.dry_run:
        if args.json:
            print_json(plan.as_dict())
        else:
            print(plan.render())
        return 0
    if not request.quiet:
        print(f"mxc: run {plan.run_dir.run_id}: bundle {bundle.hash[:12]} ({request.spec_name}) on {backend.name}",
              file=sys.stderr)
        print(f"mxc: log {plan.run_dir.log}", file=sys.stderr)
    record = backend.run(request, plan)
    if args.json:
        print_json(record.model_dump(mode="json"))
    else:
        if not request.quiet:
            print(_summary(record, plan.run_dir.path), file=sys.stderr)
        print(record.run_id)
    return exit_code(record)


def _summary(record: Any, path: Path) -> str:
    loss = f", last loss {record.last_loss:.6f}" if record.last_loss is not None else ""
    steps = f", {record.steps} steps" if record.steps is not None else ""
    restarts = f", {record.restarts} restart(s)" if record.restarts else ""
    code = f" (exit {record.exit_code})" if record.status == "failed" and record.exit_code is not None else ""
    message = f"\nmxc: {record.message}" if record.message and record.status != "succeeded" else ""
    return f"mxc: run {record.run_id} {record.status}{code}{steps}{loss}{restarts}: {path}{message}"


# ---- runs


def _runs(args: argparse.Namespace) -> int:
    from mxc.errors import UserError
    from mxc.runtime import runs

    st = store()
    selected = runs.all_runs(st.home)
    if args.bundle:
        selected = runs.runs_of_bundle(st.home, st.get(args.bundle).hash)
    if args.last > 0:
        selected = selected[-args.last:]
    now = datetime.now(UTC)
    rows: list[dict[str, Any]] = []
    for run in selected:
        try:
            record = runs.current(run)
        except UserError as exc:
            rows.append({"run_id": run.run_id, "status": "unreadable", "error": str(exc)})
            continue
        steps, loss = runs.live_progress(run, record)
        rows.append({
            "run_id": record.run_id, "bundle": record.bundle, "spec": record.spec_name,
            "status": runs.shown_status(record), "backend": record.backend, "steps": steps, "last_loss": loss,
            "restarts": record.restarts, "started": record.started, "ended": record.ended,
            "duration_s": runs.duration_seconds(record, now), "exit_code": record.exit_code,
            "rerun_of": record.rerun_of, "resumed_from": record.resumed_from, "path": str(run.path),
        })
    if args.json:
        print_json(rows)
        return 0
    if not rows:
        print("no runs yet: mxc build specs/tiny.yaml && mxc run", file=sys.stderr)
        return 0
    print(table([_row(r) for r in rows], ["RUN", "BUNDLE", "SPEC", "STATUS", "STEPS", "LAST LOSS", "STARTED", "DURATION"]))
    return 0


def _row(r: dict[str, Any]) -> list[str]:
    if r["status"] == "unreadable":
        return [r["run_id"], "-", "-", "unreadable", "-", "-", "-", "-"]
    loss = "-" if r["last_loss"] is None else f"{r['last_loss']:.4f}"
    started = (r["started"] or "-").replace("T", " ")[:19]
    duration = "-" if r["duration_s"] is None else _human_seconds(r["duration_s"])
    status = r["status"] + (f" ({r['restarts']} restarts)" if r["restarts"] else "")
    return [r["run_id"], r["bundle"][:12], r["spec"], status, "-" if r["steps"] is None else str(r["steps"]), loss,
            started, duration]


def _human_seconds(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


# ---- logs


def _logs(args: argparse.Namespace) -> int:
    from mxc.errors import UserError
    from mxc.runtime import runs

    st = store()
    if args.ref:
        ref = runs.resolve(st.home, args.ref, st.hashes())
        if ref.run is None:
            raise UserError(f"bundle {ref.bundle[:12]} has no runs yet", f"start one with: mxc run {ref.bundle[:12]}")
        run = ref.run
    else:
        every = runs.all_runs(st.home)
        if not every:
            raise UserError("no runs yet", "mxc build specs/tiny.yaml && mxc run")
        run = every[-1]
    if not run.log.exists() and not args.follow:
        raise UserError(f"run {run.run_id} has no log yet ({run.log})")
    out = sys.stdout
    offset = 0
    partial = b""
    while True:
        record = runs.current(run) if args.follow and run.record.exists() else None
        data = b""
        if run.log.exists():
            try:
                fh = open_regular(run.log)
            except OSError as exc:
                raise UserError(f"run {run.run_id}: its log {run.log} cannot be read ({exc.strerror or exc})") from None
            with fh:
                fh.seek(offset)
                data = fh.read(LOG_CHUNK)
        if data:
            offset += len(data)
            lines = (partial + data).split(b"\n")
            partial = lines.pop()
            for raw in lines:
                text = raw.decode("utf-8", "replace")
                if not args.attempts or text.startswith("[mxc"):
                    out.write(text + "\n")
            out.flush()
        if len(data) == LOG_CHUNK:
            continue  # more is there already
        if not args.follow:
            break
        if record is not None and (record.final or runs.shown_status(record) == "lost"):
            if not data:
                break
            continue
        time.sleep(0.5)
    if partial:
        out.write(partial.decode("utf-8", "replace") + "\n")
    return 0
