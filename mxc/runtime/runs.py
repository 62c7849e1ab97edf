"""Finding runs in ``$MXC_HOME/runs``: by id, unique id prefix, or bundle-hash prefix.

Run ids start with their UTC start time, so sorting names sorts runs by start. A record
that is not final belongs to a live run, unless the supervisor that wrote it is gone (it
was killed without a chance to write the end): such runs are shown as ``lost``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import socket
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from mxc.errors import UserError
from mxc.node import integrity
from mxc.runtime.logs.trainlog import last_step_in_tail
from mxc.runtime.processes.procfs import ProcessId, pid_alive
from mxc.runtime.record import RunRecord, parse_time
from mxc.runtime.rundir import RunDir
from mxc.runtime.runpaths import real_run_dir, runs_root


@dataclass(frozen=True)
class RunRef:
    """What a user's reference names: a run (and its bundle), or only a bundle."""

    bundle: str
    run: RunDir | None = None


def all_runs(home: Path) -> list[RunDir]:
    """Every run in the runs root: a directory named like a run id (never a link, never another
    name: ``runs/projects`` is not a run, whatever it holds). Its record is checked when read
    (``read_record``)."""
    root = runs_root(home)
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return []
    return [RunDir(p) for p in entries if real_run_dir(p)]


def read_record(run: RunDir) -> RunRecord:
    """The run's record, only when it validates and is this run's (its ``run_id`` is the directory's
    name: a record copied from another run is not this one's; its ``bundle`` a sha256);
    FileNotFoundError when there is none, ValueError when it is not one (``RunRecord.load``). Whether
    the bundle it names is the one the run's id names is checked where the bundle is used
    (mxc/runtime/kept_bundle.py): a record naming another bundle gets neither's files."""
    record = RunRecord.load(run.record)
    if record.run_id != run.run_id:
        raise ValueError(f"run_id: {record.run_id[:80]!r} is not this run's")
    if not integrity.valid_hash(record.bundle):
        raise ValueError(f"bundle: {record.bundle[:80]!r} is not a bundle hash")
    return record


def other_owner(run: RunDir) -> int | None:
    """The uid of another user who owns the run directory or its record, else None. Such a run is
    read-only to mxc: in a shared runs root anyone may have written it (docs/security.md)."""
    me = os.geteuid()
    for path in (run.path, run.record):
        try:
            uid = os.lstat(path).st_uid
        except FileNotFoundError:
            continue
        except OSError:
            return -1
        if uid != me:
            return uid
    return None


def user_name(uid: int) -> str:
    import pwd

    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (KeyError, OverflowError):
        return f"uid {uid}" if uid >= 0 else "an owner that cannot be read"


def require_own(run: RunDir, action: str) -> None:
    """Refuse (exit 2) to ``action`` a run another user owns: only reads see it."""
    owner = other_owner(run)
    if owner is not None:
        raise UserError(f"run {run.run_id} belongs to {user_name(owner)}: mxc does not {action} another user's run",
                        "its owner can; reads (mxc runs, show, logs) still work")


def load(run: RunDir) -> RunRecord:
    try:
        record = read_record(run)
    except FileNotFoundError:
        raise UserError(f"run {run.run_id} has no record.json") from None
    except ValueError as exc:
        raise UserError(f"run {run.run_id}: record.json is unreadable ({str(exc).splitlines()[0]})") from None
    if record.backend == "slurm" and not record.final:
        from mxc.runtime.slurm.backend import view  # Slurm's state folded in; nothing written, submitted or sent

        record = view(run, record)
    return record


def _ambiguous(ref: str, names: list[str], what: str) -> UserError:
    listed = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
    return UserError(f"'{ref}' is ambiguous: {len(names)} {what} match ({listed})", "give more characters")


def current(run: RunDir) -> RunRecord:
    """The record as its backend sees the run now, for a live run whose backend keeps no process
    of its own watching it (Slurm: ``mxc.runtime.slurm.backend.view``). A read: it never writes
    the record, submits, cancels or alerts (``mxc watch`` and ``mxc cancel`` do)."""
    seen = current_all([run])[0]
    if isinstance(seen, UserError):
        raise seen
    return seen


def current_all(selected: list[RunDir]) -> list[RunRecord | UserError]:
    """``current`` for many runs, each backend asked once for all its live runs (Slurm: one
    ``squeue`` and at most one ``sacct`` call, whatever their number; ``view_all``). A run whose
    record cannot be read gives its one-line error in its place."""
    out: list[RunRecord | UserError] = []
    live: dict[str, list[int]] = {}
    for i, run in enumerate(selected):
        try:
            record = read_record(run)
        except (OSError, ValueError):
            try:
                record = load(run)  # the same one-line errors
            except UserError as exc:
                out.append(exc)
                continue
        out.append(record)
        if not record.final and record.backend != "local":
            live.setdefault(record.backend, []).append(i)
    for backend, indices in live.items():
        view_all = _backend_view(backend)
        if view_all is None:
            continue
        items = [(selected[i], out[i]) for i in indices]
        try:
            seen = view_all(items)
        except Exception as exc:  # a listing must not fail because a scheduler is unreachable
            print(f"mxc: warning: could not ask {backend} about {len(items)} run(s): {exc}", file=sys.stderr)
            continue
        for i, record in zip(indices, seen, strict=True):
            out[i] = record
    return out


def _backend_view(backend: str) -> Any:
    """The backend module's ``view_all`` (many runs, one poll), else its ``Backend.status`` asked run
    by run; None for a backend this mxc does not have."""
    from mxc.runtime.backends import BACKENDS, get_backend

    module_name = BACKENDS.get(backend, "").partition(":")[0]
    if not module_name or importlib.util.find_spec(module_name) is None:
        return None
    view_all = getattr(importlib.import_module(module_name), "view_all", None)
    if view_all is not None:
        return view_all
    status = get_backend(backend).status
    return lambda items: [status(run) for run, _record in items]


def labels_of(run: RunDir) -> list[str]:
    """The labels its record gives a run (none when the record cannot be read)."""
    try:
        return read_record(run).labels
    except (OSError, ValueError):
        return []


def find_run(home: Path, ref: str) -> RunDir:
    """A run by full id or unique prefix of its id, or relative: ``@`` the newest (by start), ``@~N``
    N before it, ``label:NAME`` the newest run labelled so (mxc/refs.py)."""
    from mxc import refs

    relative = refs.parse(ref)
    if relative is not None:
        return refs.pick(relative, all_runs(home), "run", labels_of, "mxc runs")
    ref = ref.strip()
    if not ref:
        raise UserError("empty run id")
    matches = [r for r in all_runs(home) if r.run_id.startswith(ref)]
    exact = [r for r in matches if r.run_id == ref]
    if exact:
        return exact[0]
    if not matches:
        raise UserError(f"no run matches '{ref}' in {runs_root(home)}", "list runs with: mxc runs")
    if len(matches) > 1:
        raise _ambiguous(ref, [r.run_id for r in matches], "runs")
    return matches[0]


def runs_of_bundle(home: Path, bundle_hash: str) -> list[RunDir]:
    """Runs of one bundle, oldest first (the id ends with the bundle's short hash; the record confirms)."""
    out = []
    for run in all_runs(home):
        if not run.run_id.endswith(bundle_hash[:8]):
            continue
        try:
            if read_record(run).bundle == bundle_hash:
                out.append(run)
        except (OSError, ValueError):
            continue
    return out


def resolve(home: Path, ref: str, bundle_hashes: list[str]) -> RunRef:
    """A run id (or unique prefix) or a bundle-hash prefix; a ref matching both is ambiguous.
    A relative reference (``@``, ``@~N``, ``label:NAME``) names a run (``find_run``)."""
    from mxc import refs

    if refs.parse(ref) is not None:
        run = find_run(home, ref)
        return RunRef(load(run).bundle, run)
    ref = ref.strip()
    runs = [r for r in all_runs(home) if r.run_id.startswith(ref)] if ref else []
    exact = [r for r in runs if r.run_id == ref]
    if exact:
        runs = exact
    bundles = [h for h in bundle_hashes if ref and h.startswith(ref.lower())] if not exact else []
    if runs and bundles:
        raise UserError(f"'{ref}' matches both run {runs[0].run_id} and bundle {bundles[0][:12]}",
                        "give more characters")
    if len(runs) > 1:
        raise _ambiguous(ref, [r.run_id for r in runs], "runs")
    if runs:
        return RunRef(load(runs[0]).bundle, runs[0])
    if len(bundles) > 1:
        raise _ambiguous(ref, [b[:12] for b in bundles], "bundles")
    if bundles:
        earlier = runs_of_bundle(home, bundles[0])
        return RunRef(bundles[0], earlier[-1] if earlier else None)
    raise UserError(f"no run or bundle matches '{ref}'", "list them with: mxc runs, mxc ls")


def _on_this_host(info: dict[str, Any]) -> bool:
    return info.get("host") in (socket.gethostname(), os.uname().nodename)


def supervisor(record: RunRecord) -> ProcessId | None:
    """The local supervisor's identity, when it ran on this machine and the record names it
    fully (pid, start time, boot id); None: it cannot be verified from here."""
    info = record.supervisor
    if not isinstance(info, dict) or not _on_this_host(info):
        return None
    return ProcessId.from_record(info)


def supervisor_alive(record: RunRecord) -> bool | None:
    """Whether the local supervisor of a live record still runs (None: cannot tell from here).

    By identity, not by pid: a pid that now belongs to another process says the supervisor
    is gone (the run is lost), not that it runs. A record without the start time (written
    before identities were recorded) can only tell "gone" (its pid is free) from "unknown".
    """
    identity = supervisor(record)
    if identity is not None:
        return identity.is_alive()
    info = record.supervisor if isinstance(record.supervisor, dict) else {}
    pid = info.get("pid")
    if type(pid) is int and pid > 0 and _on_this_host(info) and not pid_alive(pid):
        return False
    return None


def shown_status(record: RunRecord) -> str:
    if not record.final and record.backend == "local" and supervisor_alive(record) is False:
        return "lost"
    return record.status


def live_progress(run: RunDir, record: RunRecord) -> tuple[int | None, float | None]:
    """(steps done, last loss) of a run: from the record once final, else from the log's tail."""
    if record.final or (record.steps is not None and record.status not in ("running", "starting")):
        return record.steps, record.last_loss
    event = last_step_in_tail(run.log)
    if event is None:
        return record.steps, record.last_loss
    return event.step + 1, event.loss


def duration_seconds(record: RunRecord, now: datetime) -> float | None:
    start = parse_time(record.started)
    if start is None:
        return None
    end = parse_time(record.ended) or (now if not record.final else None)
    return (end - start).total_seconds() if end else None
