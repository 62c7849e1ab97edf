"""Run commands: run, rerun, runs, logs."""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mxc.cli.common import add_command, add_json, print_json, shown, store, table
from mxc.fsutil import open_regular

LOG_CHUNK = 1 << 24  # bytes of a log read at a time (a huge log is printed in pieces, never all in memory)


def register(sub: Any) -> None:
    p = add_command(sub, "run", "train a stored bundle (default: @, the last `mxc build`), recorded under $MXC_HOME/runs",
                    "mxc build specs/tiny.yaml && mxc run\nmxc run 3f9a --dry-run\n"
                    "mxc run 3f9a -y      # a Slurm bundle, from a script: no question asked\n"
                    "mxc run --detach     # survives the terminal: mxc logs RUN -f, mxc cancel RUN\n"
                    "mxc run 3f9a -y --wait   # Slurm (or with --detach): return when the run ends, with its status",
                    _run)
    p.add_argument("bundle", nargs="?", help="bundle hash or unique prefix, @ (the last built), @~N or label:NAME "
                   "(default: @, as `mxc show @` and the last line of `mxc ls`)")
    _add_run_options(p)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help=argparse.SUPPRESS)  # refused with a hint: a bundle is immutable (mxc build --set)
    p.add_argument("--detach", action="store_true",
                   help="local runs: print the run id and return at once; the run goes on without this terminal "
                        "(follow: mxc logs RUN -f; stop: mxc cancel RUN)")
    p.add_argument("--wait", action="store_true",
                   help="Slurm runs and --detach: block until the run ends and exit with its status "
                        "(0 succeeded, non-zero failed or cancelled), like sbatch --wait; see `mxc wait`")
    p.add_argument("--interval", type=float, default=5.0, metavar="SECONDS", help="with --wait: between looks")
    p.add_argument("--as-run-id", help=argparse.SUPPRESS)  # the run id a detached run's parent chose
    p.add_argument("--as-rerun-of", help=argparse.SUPPRESS)  # the run a detached rerun's parent reruns
    p.add_argument("--resume-from", metavar="RUN[@STEP]",
                   help="start from another run's checkpoint (its newest, or the one at STEP); a new run of this "
                        "bundle, recorded with resumed_from. Example: mxc run --resume-from 20260101-1200@20")

    p = add_command(sub, "rerun", "run a recorded run's bundle again, exactly, after checking this machine and the "
                    "environment that reaches the training for drift",
                    "mxc rerun 20260101-120000-ab12-3f9a0c1d\nmxc rerun 3f9a --strict\n"
                    "mxc rerun @ --verify    # exit 0: every step's loss matched bit for bit; 1: the first that did not",
                    _rerun)
    p.add_argument("ref", help="run id (or unique prefix), @ (the newest run), @~N, label:NAME, or bundle hash prefix")
    p.add_argument("--strict", action="store_true",
                   help="refuse to run (exit 2) when the machine drifted or a variable that reaches the training differs "
                        "from the original run's (docs/runs.md#what-reaches-the-training)")
    p.add_argument("--verify", action="store_true",
                   help="compare the rerun's loss at each step with the original run's as it trains, bit for bit; at "
                        "the first difference cancel the rerun and exit 1, printing the step and both values; exit 0 "
                        "when every step matched")
    _add_run_options(p)

    p = add_command(sub, "runs", "list runs: id, bundle, spec, status, steps, last loss, start, duration",
                    "mxc runs\nmxc runs --bundle 3f9a --json", _runs)
    p.add_argument("--bundle", help="only runs of this bundle (hash prefix)")
    p.add_argument("-n", "--last", type=int, default=0, metavar="N", help="only the N most recent runs")
    p.add_argument("--ids", action="store_true", help=argparse.SUPPRESS)  # run ids, one a line (completion)
    add_json(p)

    p = add_command(sub, "logs", "print a run's training log (default: the latest run), MaxText's config dump and "
                    "[NO-OP] notices folded",
                    "mxc logs 20260101-120000\nmxc logs -f --rank 1 --grep 'loss|Error' --tail 50\n"
                    "mxc logs RUN --since 10m     # lines logged in the last 10 minutes\n"
                    "mxc logs RUN --config        # with MaxText's `Config param` lines", _logs)
    p.add_argument("ref", nargs="?", help="run id or unique prefix, @ (the newest), @~N, label:NAME, "
                   "or a bundle prefix (its latest run)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the run ends")
    p.add_argument("--attempts", action="store_true", help="only mxc's lines (attempt starts and exits)")
    p.add_argument("--rank", type=int, metavar="N", help="only rank N's lines (Slurm: the lines srun labels 'N: ')")
    p.add_argument("--grep", metavar="RE", help="only lines matching this Python regular expression ((?i): any case)")
    p.add_argument("--tail", type=int, metavar="N", help="only the last N lines (with -f: then follow)")
    p.add_argument("--since", metavar="T", help="only lines logged since T: a duration back from now (10m, 2h, 1d) "
                   "or an ISO time (2026-11-24T01:47; local time unless Z or an offset); a line's time is the "
                   "one it was logged with (absl/TSL prefix, mxc's 'at ...Z'), else the last one before it")
    p.add_argument("--config", action="store_true", help="show MaxText's config dump (folded into one line by default)")
    p.add_argument("--all", dest="every_line", action="store_true",
                   help="show every line: MaxText's config dump and its '[NO-OP] ... using stub' notices of optional "
                        "modules (each folded into one line by default)")


def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--local", action="store_true", help="run on this machine whatever runtime.backend says")
    p.add_argument("--dry-run", action="store_true", help="print the exact command and environment; run nothing")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary (the run id is still printed)")
    p.add_argument("-y", "--yes", action="store_true",
                   help="cluster backends: submit without asking (needed when stdin is not a terminal)")
    p.add_argument("--label", dest="labels", action="append", default=[], metavar="NAME",
                   help="label the run (repeatable; in its record, not in the bundle); name it later as label:NAME")
    add_json(p)


# ---- run / rerun


def _run(args: argparse.Namespace) -> int:
    from mxc.errors import UserError

    if args.overrides:
        raise UserError("a bundle is immutable: `mxc run` cannot --set fields",
                        "build a new bundle with `mxc build SPEC --set KEY=VALUE`, then `mxc run` it")
    from mxc import refs

    for name in args.labels:
        refs.check_label(name)
    st = store()
    bundle = st.get(args.bundle) if args.bundle else st.current()
    resume = None
    if args.resume_from:
        from mxc.runtime import resume as resuming
        from mxc.runtime.contract import load as load_contract

        resume = resuming.find(st.home, args.resume_from)
        st.require_intact(bundle)
        resuming.check_bundle(resume, load_contract(bundle), bundle.hash)
    rerun_of = args.as_rerun_of
    if rerun_of is not None:  # a detached rerun's parent named it: an existing run
        from mxc.runtime import runs

        rerun_of = runs.find_run(st.home, rerun_of).run_id
    return _launch(args, bundle, rerun_of=rerun_of, named=bool(args.bundle), resume_from=resume)


def _rerun(args: argparse.Namespace) -> int:
    from mxc import refs
    from mxc.errors import UserError
    from mxc.runtime import runs
    from mxc.runtime.backends import training_python
    from mxc.runtime.provenance import hostfacts

    for name in args.labels:
        refs.check_label(name)
    st = store()
    ref = runs.resolve(st.home, args.ref, st.hashes())
    if ref.run is not None:  # its bundle from the store, put back from the run's own copy if it left
        from mxc.runtime import kept_bundle

        bundle = kept_bundle.in_store(ref.run, runs.load(ref.run), st, quiet=args.quiet)
    else:
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

        resume = resuming.recorded(st.home, old.run_id, old.resumed_from)
    expected = _expected_losses(old, ref.run) if args.verify else None
    native = contract.container.kind == "native"
    host = hostfacts.collect(training_python(contract) if native else None)
    pinned = old.code if contract.code.repo else None  # the bundle pins the commit; its export is verified at start
    current = {"host": host, "image": hostfacts.image_facts(contract, host, hostfacts.lockfile_digest(bundle.path)),
               "code": hostfacts.code_facts(contract, host, pinned)}
    drift = hostfacts.compare({"host": old.host, "image": old.image, "code": old.code}, current)
    drift += _environment_drift(old, contract, bundle.spec(), quiet=args.quiet)
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
    return _launch(args, bundle, rerun_of=old.run_id, resume_from=resume, expected=expected)


def _environment_drift(old: Any, contract: Any, spec: dict[str, Any], quiet: bool) -> list[Any]:
    """What of this shell would reach the rerun's training differently from the original's (mxc/runtime/replay.py)."""
    import os

    from mxc.runtime import replay

    found = replay.environment_drift(old.training, os.environ, contract.env_pass or [], spec)
    if found is None:
        if not quiet:
            print(f"mxc: note: run {old.run_id} recorded no environment from its caller's shell (an older mxc, or it "
                  "never reached training): this shell's is not compared", file=sys.stderr)
        return []
    return found


def _expected_losses(old: Any, run: Any) -> dict[int, float]:
    """``--verify``: the original run's loss per step (its metrics files, read, nothing written)."""
    from mxc.errors import UserError
    from mxc.runtime import replay

    expected = replay.recorded_losses(run.metrics_parts)
    if not expected:
        raise UserError(f"run {old.run_id} logged no per-step loss to verify against ({run.metrics_parts} is empty)",
                        "rerun it without --verify")
    return expected


def _launch(args: argparse.Namespace, bundle: Any, rerun_of: str | None, named: bool = True,
            resume_from: Any = None, expected: dict[int, float] | None = None) -> int:
    from mxc.runtime.backends import RunRequest, exit_code, get_backend

    st = store()
    st.require_intact(bundle)  # and again before each attempt (the local supervisor) and each resubmission
    from mxc.runtime.contract import load as load_contract

    backend = get_backend("local" if args.local else load_contract(bundle).backend)
    request = RunRequest(home=st.home, bundle=bundle, spec=bundle.spec(), rerun_of=rerun_of, quiet=args.quiet or args.json,
                         run_id=getattr(args, "as_run_id", None), labels=tuple(dict.fromkeys(args.labels)),
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
    if backend.name != "local":  # a cluster submission spends an allocation: ask first (mxc/cli/confirm.py)
        from mxc.cli.confirm import confirm_submission

        if not confirm_submission(bundle, request.contract, backend.name, plan.run_dir.run_id, named=named,
                                  yes=args.yes):
            print("mxc: not submitted", file=sys.stderr)
            return 1
    waits = getattr(args, "wait", False)
    if waits:
        from mxc.cli.wait import check_interval

        check_interval(args.interval)
    if expected is not None:  # rerun --verify: started so that this process can follow it
        if backend.name == "local":
            code = _detach(args, bundle, plan, rerun_of, resume_from, quiet_json=True, announce=False)
            if code != 0:
                return code
        else:
            backend.submit(request, plan)
        return _verified(args, plan.run_dir, backend, expected, rerun_of)
    if getattr(args, "detach", False) and backend.name == "local":  # Slurm submissions return at once anyway
        code = _detach(args, bundle, plan, rerun_of, resume_from, quiet_json=waits)
        return _waited(args, plan.run_dir) if waits and code == 0 else code
    if not request.quiet:
        print(f"mxc: run {plan.run_dir.run_id}: bundle {bundle.hash[:12]} ({request.spec_name}) on {backend.name}",
              file=sys.stderr)
        print(f"mxc: log {plan.run_dir.log}", file=sys.stderr)
    record = backend.submit(request, plan)
    if waits and not record.final:  # a submission (Slurm) returned at once: wait for its end
        if not args.json:
            print(record.run_id)
        return _waited(args, plan.run_dir)
    if args.json:
        print_json(record.model_dump(mode="json"))
    else:
        if not request.quiet:
            print(_summary(record, plan.run_dir.path), file=sys.stderr)
        print(record.run_id)
    return exit_code(record)


def _waited(args: argparse.Namespace, run: Any) -> int:
    """``--wait``: the run's end, as `mxc wait` gives it (exit status included)."""
    from mxc.cli.wait import wait_and_exit

    return wait_and_exit(run, args.interval, args.quiet, args.json)


def _verified(args: argparse.Namespace, run: Any, backend: Any, expected: dict[int, float], original: str | None) -> int:
    """``rerun --verify``: follow the rerun's losses against ``expected``; exit 0 when every step
    matched, 1 at the first that did not (the rerun cancelled, as `mxc cancel` does)."""
    from mxc.runtime import replay, runs

    if not args.quiet:
        print(f"mxc: run {run.run_id}: verifying each step's loss against run {original} ({len(expected)} steps)",
              file=sys.stderr)

    def ended() -> Any:
        record = runs.current(run)
        return record if record.final or runs.shown_status(record) == "lost" else None

    verdict = replay.verify(replay.LossFollower(run.metrics_parts), expected, ended, lambda: backend.cancel(run))
    record = verdict.record or runs.load(run)
    code, line = _verdict_line(verdict, record, original, len(expected))
    if args.json:
        print_json({"run_id": run.run_id, "rerun_of": original, "verified": code == 0, "compared": verdict.compared,
                    "steps": len(expected), "missing": verdict.missing, "status": record.status,
                    "divergence": None if verdict.divergence is None else {
                        "step": verdict.divergence.step, "original": verdict.divergence.original,
                        "rerun": verdict.divergence.rerun}})
    else:
        print(line, file=sys.stderr)
        print(run.run_id)
    return code


def _verdict_line(verdict: Any, record: Any, original: str | None, steps: int) -> tuple[int, str]:
    from mxc.runtime.backends import exit_code
    from mxc.runtime.replay import shown

    d = verdict.divergence
    if d is not None:
        return 1, (f"mxc: verify: step {d.step} differs: loss {shown(d.original)} in run {original}, {shown(d.rerun)} in "
                   f"run {record.run_id} ({verdict.compared} earlier step(s) matched); the rerun was cancelled")
    if record.status != "succeeded":
        return exit_code(record) or 1, (f"mxc: verify: run {record.run_id} {record.status} after {verdict.compared} "
                                        f"matching step(s): nothing proven" + (f" ({record.message})" if record.message else ""))
    if verdict.missing:
        return 1, (f"mxc: verify: run {record.run_id} logged {verdict.compared} of run {original}'s {steps} steps "
                   f"(none from step {verdict.missing[0]}): not a full replay")
    return 0, f"mxc: verify: all {verdict.compared} steps of run {record.run_id} match run {original} bit for bit"


def _detach(args: argparse.Namespace, bundle: Any, plan: Any, rerun_of: str | None, resume_from: Any,
            quiet_json: bool = False, announce: bool = True) -> int:
    """Start the run as its own `mxc run` in a session of its own (mxc/runtime/local/detach.py), with
    everything that shapes its record: labels, the run it reruns, the checkpoint it resumes from."""
    from mxc.runtime import runs
    from mxc.runtime.local import detach

    run = plan.run_dir
    argv = [sys.executable, "-m", "mxc", "run", bundle.hash, "--as-run-id", run.run_id, *(["--local"] if args.local else [])]
    for label in dict.fromkeys(args.labels):
        argv += ["--label", label]
    if rerun_of is not None:
        argv += ["--as-rerun-of", rerun_of]
    if resume_from is not None:
        argv += ["--resume-from", f"{resume_from.run}@{resume_from.step}"]
    code, pid = detach.start(run, argv)
    if code is not None:
        return code
    if not announce:
        return 0
    if args.json:
        if not quiet_json:  # with --wait, the JSON is the record at the end
            print_json(runs.load(run).model_dump(mode="json"))
        return 0
    if not args.quiet:
        print(f"mxc: run {run.run_id} detached (supervisor pid {pid}, its output in {run.path / detach.LOG_NAME}); "
              f"follow it with: mxc logs {run.run_id} -f; stop it with: mxc cancel {run.run_id}", file=sys.stderr)
    print(run.run_id)
    return 0


def _summary(record: Any, path: Path) -> str:
    loss = f", last loss {record.last_loss:.6f}" if record.last_loss is not None else ""
    steps = f", {record.steps} steps" if record.steps is not None else ""
    restarts = f", {record.restarts} restart(s)" if record.restarts else ""
    startup = ""
    if record.time_to_first_step_s is not None:
        compiled = f", compile {record.compile_s:.1f}s" if record.compile_s is not None else ""
        startup = f", first step after {record.time_to_first_step_s:.1f}s{compiled}"
    code = f" (exit {record.exit_code})" if record.status == "failed" and record.exit_code is not None else ""
    message = f"\nmxc: {shown(record.message)}" if record.message else ""  # a succeeded run's: a note (exit_grace)
    return shown(f"mxc: run {record.run_id} {record.status}{code}{steps}{loss}{restarts}{startup}: {path}") + message


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
    if args.ids:  # for completion: only names of the run-id shape (a directory's name is anyone's data)
        from mxc.runtime.rundir import is_run_id

        print("\n".join(run.run_id for run in selected if is_run_id(run.run_id)))
        return 0
    now = datetime.now(UTC)
    rows: list[dict[str, Any]] = []
    for run, record in zip(selected, runs.current_all(selected), strict=True):  # one Slurm poll for all
        if isinstance(record, UserError):
            rows.append({"run_id": run.run_id, "status": "unreadable", "error": str(record)})
            continue
        steps, loss = runs.live_progress(run, record)
        rows.append({
            "run_id": record.run_id, "bundle": record.bundle, "spec": record.spec_name,
            "status": runs.shown_status(record), "backend": record.backend, "steps": steps, "last_loss": loss,
            "restarts": record.restarts, "started": record.started, "ended": record.ended,
            "duration_s": runs.duration_seconds(record, now), "exit_code": record.exit_code,
            "rerun_of": record.rerun_of, "resumed_from": record.resumed_from, "labels": record.labels,
            "path": str(run.path),
            "time_to_first_step_s": record.time_to_first_step_s, "compile_s": record.compile_s,
        })
    if args.json:
        print_json(rows)
        return 0
    if not rows:
        print("no runs yet: mxc build specs/tiny.yaml && mxc run", file=sys.stderr)
        return 0
    print(table([_row(r) for r in rows], ["RUN", "BUNDLE", "SPEC", "STATUS", "STEPS", "LAST LOSS", "STARTED", "DURATION",
                                           "FIRST STEP", "LABELS"]))
    return 0


def _row(r: dict[str, Any]) -> list[str]:
    if r["status"] == "unreadable":
        return [r["run_id"], "-", "-", "unreadable", "-", "-", "-", "-", "-", "-"]
    loss = "-" if r["last_loss"] is None else f"{r['last_loss']:.4f}"
    started = (r["started"] or "-").replace("T", " ")[:19]
    duration = "-" if r["duration_s"] is None else human_seconds(r["duration_s"])
    status = r["status"] + (f" ({r['restarts']} restarts)" if r["restarts"] else "")
    # time to first step (compile time): where a slow start went, without opening the record
    first = "-" if r["time_to_first_step_s"] is None else human_seconds(r["time_to_first_step_s"])
    if r["compile_s"] is not None and first != "-":
        first += f" ({human_seconds(r['compile_s'])} compile)"
    return [r["run_id"], r["bundle"][:12], r["spec"], status, "-" if r["steps"] is None else str(r["steps"]), loss,
            started, duration, first, ",".join(r["labels"]) or "-"]


def human_seconds(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


# ---- logs


def _logs(args: argparse.Namespace) -> int:
    from collections import deque

    from mxc.errors import UserError
    from mxc.runtime import runs

    _log_view(args)  # bad --grep/--since/--tail/--rank: refused before anything is read
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
    view = _log_view(args, run)
    out = sys.stdout
    held: deque[str] | None = deque(maxlen=args.tail) if args.tail is not None else None  # until the first end
    offset = 0
    partial = b""

    def emit(lines: list[str]) -> None:
        if held is not None:
            held.extend(lines)
        else:
            out.writelines(line + "\n" for line in lines)

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
                emit(view.feed(raw.decode("utf-8", "replace")))
        if len(data) == LOG_CHUNK:
            continue  # more is there already
        if held is not None:  # the log as it was is read: its last lines, then (-f) everything new
            out.writelines(line + "\n" for line in held)
            held = None
        out.flush()
        if not args.follow:
            break
        if record is not None and (record.final or runs.shown_status(record) == "lost"):
            if not data:
                break
            continue
        time.sleep(0.5)
    if partial:
        emit(view.feed(partial.decode("utf-8", "replace")))
    emit(view.flush())
    out.flush()
    return 0


def _log_view(args: argparse.Namespace, run: Any = None) -> Any:
    """The filters of `mxc logs`, checked; with the run, a LogView of its log."""
    from mxc.errors import UserError
    from mxc.runtime.logs import logview
    from mxc.runtime.record import RunRecord, epoch_seconds

    if args.tail is not None and args.tail < 0:
        raise UserError(f"--tail: {args.tail} is not a number of lines (0 or more)")
    if args.rank is not None and args.rank < 0:
        raise UserError(f"--rank: {args.rank} is not a rank (0, 1, ...)")
    grep = logview.compile_grep(args.grep) if args.grep is not None else None
    since = logview.parse_since(args.since, datetime.now(UTC)) if args.since is not None else None
    want = logview.Filter(rank=args.rank, grep=grep, since=since, config=args.config or args.every_line,
                          notices=args.every_line, attempts=args.attempts)
    if run is None:
        return None
    try:
        record: RunRecord | None = RunRecord.load(run.record)  # as written: which backend, when it started
    except (OSError, ValueError):
        record = None  # a log without a (readable) record is still shown, as one rank
    ranks = sorted(int(p.name) for p in (run.path / "ranks").glob("*") if p.name.isdigit()) \
        if (run.path / "ranks").is_dir() else []
    if args.rank is not None and ranks and args.rank not in ranks and (record is None or record.final):
        raise UserError(f"run {run.run_id} has no rank {args.rank}", "its ranks: " + ", ".join(map(str, ranks)))
    start = epoch_seconds(record.started) if record else None
    return logview.LogView(want, labelled=record is not None and record.backend != "local", start=start,
                           line_time=_line_time(start))


def _line_time(start: float | None) -> Any:
    """A log line's own time: absl has no year, so it is the run's (the next one's across New Year)."""
    from mxc.runtime.triage.logs import line_time

    year = datetime.fromtimestamp(start if start is not None else time.time()).year

    def at(text: str) -> float | None:
        when = line_time(text, year)
        if when is not None and start is not None and when < start - 180 * 86400:
            when = line_time(text, year + 1)
        return when

    return at
