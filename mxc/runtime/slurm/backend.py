"""The Slurm backend: submit a bundle's ``job.sbatch`` with sbatch, and keep its record current.

``plan`` builds the exact sbatch command (``--output`` into the run directory, the
bundle's and run's paths passed with ``--export``) and shows the script it submits, as is;
``submit`` submits it and returns at once with the job queued. No mxc process stays with the
job, so two functions bring Slurm's view of it in:

* ``view`` / ``view_all`` (every read: ``mxc runs``, ``logs -f``, ``triage``, ``metrics``, ``report``)
  asks Slurm for the jobs' state (one squeue, then at most one sacct or sacct -c for all runs of
  the command together: ``slurm_query.poll``), reads what each job wrote into the run
  directory and folds both into a copy of the record. It writes no record, submits, cancels
  and sends nothing.
* ``refresh`` (``mxc watch``, ``mxc cancel``) does the same, saves ``record.json`` (the final record
  once the job ended), sends the alerts the change calls for that the job did not send itself
  (its batch side alerts and writes its end: mxc/node/jobreport.py) and, where compute nodes
  cannot requeue (no scontrol) and the job left ``resubmit.request``, resubmits the same
  bundle into the same run: the bundle from the store, verified, with recomputed exports.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import shlex
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from mxc import tempdirs
from mxc.errors import UserError, cannot_write
from mxc.node import policy
from mxc.node.contract import RunContract
from mxc.node.secretscan import redact_secrets
from mxc.runtime import detections, kept_bundle
from mxc.runtime.backends import (
    DEFAULT_PYTHON,
    Plan,
    RunRequest,
    allocate_run_dir,
    create_run_dir,
    first_record,
    job_variables,
    pinned_code,
    recorded_environment,
    seed_checkpoint,
    tensorboard_of,
)
from mxc.runtime.logs.metrics_merge import write_merged
from mxc.runtime.provenance import hostfacts, training
from mxc.runtime.provenance.environment import scrubbed
from mxc.runtime.record import FINISHED, RunRecord, SlurmJob, SlurmState, iso_time, now_iso
from mxc.runtime.rundir import RunDir
from mxc.runtime.runpaths import Roots
from mxc.runtime.slurm import events as slurm_events
from mxc.runtime.slurm import query as slurm_query
from mxc.runtime.slurm.query import JobState
from mxc.store import Store, StoredBundle

SACCT_MEMO = ".slurm-sacct"  # in the runs root: which sacct source answers on this cluster (slurm_query.sacct_states)


@dataclass
class SlurmPlan(Plan):
    """A plan whose command is ``sbatch ...``; ``--dry-run`` shows the script too."""

    script_path: Path | None = None
    script: str = ""

    def render(self) -> str:
        lines = [f"# backend slurm, run directory {self.run_dir.path} (created at submission)"]
        lines += [f"# {note}" for note in self.notes]
        lines.append(" ".join(shlex.quote(arg) for arg in self.command))
        lines.append(f"# ---- {self.script_path} (submitted as is)")
        return "\n".join(lines) + "\n" + self.script.rstrip("\n")

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "script_path": str(self.script_path), "script": self.script}


def node_python(contract: RunContract) -> str | None:
    """The interpreter compute nodes use for a native run, or None to leave it to the spec.

    ``$MXC_PYTHON`` wins; with the spec's default ``python3``, the interpreter running mxc
    when it has maxtext (a shared-file-system virtual environment); a non-default
    ``runtime.python`` is resolved on the node, after its ``module load``s.
    """
    if os.environ.get("MXC_PYTHON"):
        return os.environ["MXC_PYTHON"]
    configured = contract.container.python
    if configured == DEFAULT_PYTHON and importlib.util.find_spec("maxtext") is not None:
        return sys.executable
    return None


def job_exports(request: RunRequest, run: RunDir, resubmits: int = 0) -> dict[str, str]:
    """The variables the job gets on top of the submitting environment (sbatch --export=ALL,...)."""
    contract = request.contract
    env = {
        **job_variables(request, run),
        "MXC_RUN_ID": run.run_id,
        "MXC_RESUBMITS": str(resubmits),
    }
    if contract.container.kind == "native":
        python = node_python(contract)
        if python:
            env["MXC_PYTHON"] = python
    if contract.observability.enabled:
        # The nodes' exporter and Prometheus run mxc itself: this interpreter, on the shared file system.
        env["MXC_AGENT_PYTHON"] = sys.executable
    if request.code_commit:
        from mxc.runtime.provenance import codepin

        env["MXC_CODE_DIR"] = str(codepin.store_dir(request.home, request.code_commit))
    return env


def sbatch_argv(bundle_dir: Path, run: RunDir, exports: Mapping[str, str]) -> list[str]:
    """``sbatch`` with the output in the run directory (appended across requeues) and the exports.

    ``--export`` separates variables with commas, so a value holding one cannot be passed; one holding
    a quote sbatch calls "improperly formed" and the job starts without it (MXC_RUN_DIR missing).
    """
    for key, value in exports.items():
        if any(char in value for char in ",\n'\""):
            raise UserError(f"{key}={value!r} cannot be passed to sbatch --export (it splits on commas and refuses "
                            "quotes)", "use paths without commas or quotes for MXC_HOME, MXC_RUNS_DIR and the bundle store")
    export = ",".join(["ALL", *(f"{k}={v}" for k, v in sorted(exports.items()))])
    return ["sbatch", "--parsable", f"--output={run.log}", f"--chdir={run.path}", f"--export={export}",
            str(bundle_dir / "job.sbatch")]


class SlurmBackend:
    name = "slurm"

    def plan(self, request: RunRequest) -> SlurmPlan:
        run = allocate_run_dir(request)
        exports = job_exports(request, run)
        argv = sbatch_argv(request.bundle.path, run, exports)
        notes = [f"bundle {request.bundle.hash[:12]} ({request.spec_name}); the job appends its output to {run.log}"]
        if "MXC_PYTHON" in exports:
            notes.append(f"compute nodes run {exports['MXC_PYTHON']} (must exist there: shared file system)")
        notes.append("requeue on node failure, preemption, a hang, an infrastructure failure, or the time limit after a "
                     f"checkpoint (docs/restarts.md): at most {request.contract.restart.max}")
        script_path = request.bundle.path / "job.sbatch"
        return SlurmPlan("slurm", run, argv, {}, run.path, notes=notes, script_path=script_path,
                         script=script_path.read_text("utf-8"))

    def submit(self, request: RunRequest, plan: Plan) -> RunRecord:
        """sbatch the plan and return at once, the job queued (``mxc watch`` follows it)."""
        slurm_query.require("sbatch")
        contract = request.contract
        pinned = pinned_code(request)
        run = plan.run_dir
        exports = job_exports(request, run)
        record = first_record(
            request, plan, "submitted", command=[redact_secrets(arg) for arg in plan.command],
            environment=recorded_environment({**os.environ, **exports}, request.spec),
            code=pinned.as_record() if pinned else hostfacts.code_facts(contract, {}, None),
            image=hostfacts.image_facts(contract, {}),
            slurm=SlurmState(exports=scrubbed(exports), partition=contract.slurm.partition,
                             restart_max=contract.restart.max),
        )
        record.tensorboard = tensorboard_of(request, run)
        create_run_dir(run, record, request.bundle)  # before submitting: never a job without its run directory
        try:
            seed_checkpoint(request, run)
            job_id = slurm_query.submit(plan.command)
        except BaseException:
            with contextlib.suppress(OSError):
                tempdirs.remove(run.path)  # nothing was submitted: leave no run behind
            raise
        slurm = record.slurm or SlurmState()
        slurm.job_id, slurm.jobs = job_id, [SlurmJob(job_id=job_id, submitted=now_iso())]
        record.slurm = slurm
        record.status = "queued"
        try:
            record.save(run.record)
        except OSError as exc:  # a job nobody can follow: take it back
            with contextlib.suppress(Exception):
                slurm_query.cancel(job_id)
            with contextlib.suppress(OSError):
                tempdirs.remove(run.path)
            raise cannot_write(f"the record of run {run.run_id} (Slurm job {job_id} was cancelled)", exc) from None
        if not request.quiet:
            print(f"mxc: submitted Slurm job {job_id} for run {run.run_id}; follow it with: mxc logs {run.run_id} -f; "
                  f"`mxc watch {run.run_id}` keeps its record, alerts and resubmissions going", file=sys.stderr)
        return record

    def status(self, run: RunDir) -> RunRecord:
        """``view``: Slurm's state and the job's files folded into a copy of the record (a pure read)."""
        return view(run)

    def cancel(self, run: RunDir) -> RunRecord:
        """``cancel``: scancel the job, no resubmission afterwards."""
        return cancel(run)

    def logs(self, run: RunDir) -> list[Path]:
        """One log: sbatch --output appends every requeue and resubmission to train.log."""
        return [run.log]


# ---- keeping the record current


@contextlib.contextmanager
def _locked(run: RunDir) -> Iterator[None]:
    """One refresher at a time per run (two `mxc` commands must not both resubmit)."""
    with open(run.path / ".slurm.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def view(run: RunDir, record: RunRecord | None = None) -> RunRecord:
    """The run as Slurm and the job's files say it is now: what ``mxc show``, ``logs``, ``triage``,
    ``metrics`` and ``report`` show. A read: record.json is not written, nothing is submitted,
    cancelled or sent (a requested resubmission is shown as pending; ``mxc watch`` acts)."""
    record = record or RunRecord.load(run.record)
    return view_all([(run, record)])[0]


def view_all(items: Sequence[tuple[RunDir, RunRecord]]) -> list[RunRecord]:
    """``view`` of many runs with one Slurm poll for all of them (``mxc runs``): one ``squeue`` and
    at most one ``sacct`` call, whatever their number. Records of ended or non-Slurm runs pass as they are."""
    live = [(run, record) for run, record in items if record.backend == "slurm" and not record.final]
    files = {run.path: slurm_events.JobFiles.read(run) for run, _ in live}
    snapshot = poll([(run, record, files[run.path]) for run, record in live])
    out = []
    for run, record in items:
        if record.backend != "slurm" or record.final:
            out.append(record)
            continue
        seen = record.model_copy(deep=True)
        if _update(run, seen, snapshot, files[run.path]) is not None:
            seen.message = (f"job {seen.slurm.job_id if seen.slurm else None} asked to be resubmitted; "
                            f"`mxc watch {run.run_id}` resubmits it")
        out.append(seen)
    return out


def poll(live: Sequence[tuple[RunDir, RunRecord, slurm_events.JobFiles | None]]) -> slurm_query.Snapshot:
    """One Slurm snapshot for these live runs (``slurm_query.poll``); which sacct answers on this
    cluster is remembered next to the run directories (``.slurm-sacct``), so it is asked once."""
    asks = []
    for run, record, files in live:
        slurm = record.slurm or SlurmState()
        files = files or slurm_events.JobFiles.read(run)
        asks.append((slurm.job_id or "", [j.job_id for j in slurm.jobs], any(e.attempt > 0 for e in files.starts())))
    memo = live[0][0].path.parent / SACCT_MEMO if live else None
    return slurm_query.poll(asks, memo)


def refresh(run: RunDir, snapshot: slurm_query.Snapshot | None = None) -> RunRecord:
    """Bring record.json up to date from Slurm and the run directory, and act on it: resubmit a
    job that asked for it (the stored bundle, verified), send the alerts the change calls for.
    Only for commands whose job is to act (``mxc watch``, ``mxc cancel``). ``snapshot``: Slurm's
    state from one poll of many runs (``mxc watch``); without it, this run's own."""
    from mxc.runtime import runs

    runs.require_own(run, "save the record of, resubmit or alert for")  # the callers checked: defence in depth
    with _locked(run):
        record = runs.read_record(run)
        if record.final or record.backend != "slurm":
            return record
        before = record.model_copy(deep=True)
        files = slurm_events.JobFiles.read(run)
        if snapshot is None:
            snapshot = poll([(run, record, files)])
        request = _update(run, record, snapshot, files)
        if request is not None:
            _resubmit(run, record, request)
        if record.model_dump_json() != before.model_dump_json():
            record.save(run.record)
            _alert(run, before, record)
    return record


def _alert(run: RunDir, before: RunRecord, after: RunRecord) -> None:
    """No mxc process follows a Slurm job: ``mxc watch`` sends alerts when it sees a change."""
    from mxc.runtime import notify

    spec = _spec_of(run, after)
    if spec:  # else no copy of the bundle is left: no notify settings to follow
        notify.notify_transition(spec, run, before, after)


def _spec_of(run: RunDir, record: RunRecord) -> dict[str, Any]:
    """The run's spec (its notify settings, which names its record may keep) from the bundle it ran:
    its own copy, else the store's of this mxc (``runpaths.Roots``); none when neither is left."""
    return dict(kept_bundle.spec_of(run, record, Roots.current().store()) or {})


def _update(run: RunDir, record: RunRecord, snapshot: slurm_query.Snapshot,
            files: slurm_events.JobFiles) -> dict[str, Any] | None:
    """Fold Slurm's state (from ``snapshot``) and the job's files into ``record`` (in memory).
    Returns the job's resubmission request when the job ended asking for one, else None."""
    slurm = record.slurm = record.slurm or SlurmState()
    job_id = slurm.job_id or ""
    state = snapshot.state(job_id) if job_id else JobState(job_id="", state="UNKNOWN")
    log = slurm_events.LogFacts.of_run(run)  # its cursor in the run directory's private file, not the record
    history: dict[str, list[str]] = {}
    if any(e.attempt > 0 for e in files.starts()) or state.ended:
        history = {j.job_id: snapshot.history(j.job_id) for j in slurm.jobs}
    slurm_events.apply(record, files, log, history)
    if observed := slurm_events.observability(run):
        record.observability = observed
    slurm = record.slurm or SlurmState()
    if state.state != "UNKNOWN":
        slurm.state, slurm.reason, slurm.source = state.state, state.reason, state.source
        if state.nodes:
            slurm.nodes = state.nodes
        if state.partition:
            slurm.partition = state.partition
        if state.restart_count is not None:
            slurm.slurm_restarts = state.restart_count
        if state.time_left:
            slurm.time_left = state.time_left
    record.slurm = slurm
    record.detected = detections.collect(run.path) or record.detected
    started = training.rank0(run.path, _spec_of(run, record))
    if started is not None:
        record.training = started
    merged = write_merged(run.metrics_parts, run.metrics)  # derived from the job's files alone
    if merged.steps:
        record.steps, record.last_loss = merged.steps, merged.last_loss
    if not state.ended:
        # Keep what we knew when Slurm could not be asked just now, and the end the job wrote itself
        # (mxc/node/jobreport.py) while Slurm still shows its batch step finishing.
        if state.state != "UNKNOWN" and record.status not in FINISHED:
            record.status = state.status  # type: ignore[assignment]
        return None
    request = files.resubmit_request
    if request and str(request.get("job_id")) == job_id and not files.cancel_requested:
        return request
    _finish(record, state, files)
    return None


def _finish(record: RunRecord, state: JobState, files: slurm_events.JobFiles) -> None:
    ends = files.ends()
    rc = ends[-1].rc if ends and ends[-1].job_id == state.job_id else state.exit_code
    status = state.status
    if files.cancel_requested and status != "succeeded":
        status = "cancelled"
        record.cancelled_by = "mxc cancel"
    record.status = status  # type: ignore[assignment]
    slurm = record.slurm = record.slurm or SlurmState()
    slurm.exit_code = rc
    # The exit code of the rank that failed first says more than srun's (the highest of all ranks,
    # often the SIGTERM of the ranks it brought down).
    failure = slurm.first_failure
    if status == "failed" and failure is not None and failure.rc:
        rc = failure.rc
    record.exit_code = rc if rc is not None else (0 if status == "succeeded" else None)
    if status == "succeeded":  # the job's note when a trainer went badly after the training was over
        decided = record.attempts[-1].decision if record.attempts else None
        record.message = decided.detail if decided is not None and decided.cause == policy.COMPLETED else None
    elif status == "cancelled":
        record.message = "cancelled with mxc cancel" if files.cancel_requested else f"Slurm job {state.job_id} was cancelled"
    elif not record.message:
        record.message = f"Slurm job {state.job_id} ended {state.state}" + (f" ({state.reason})" if state.reason else "")
    record.ended = _slurm_time(state.end) or now_iso()
    if record.attempts and record.attempts[-1].ended is None:
        record.attempts[-1].ended = record.ended
        record.attempts[-1].exit_code = record.exit_code
    record.final = True


def _slurm_time(text: str) -> str | None:
    """A Slurm time (``2026-01-01T12:00:00``, the cluster's local time) in the record's format;
    None for Slurm's ``Unknown``/``None`` (so every view of an ended job says the same end)."""
    try:
        return iso_time(datetime.fromisoformat(text).timestamp()) if text else None
    except ValueError:
        return None


def _resubmit(run: RunDir, record: RunRecord, request: dict[str, Any]) -> None:
    """Submit the same bundle into the same run again, one restart further on.

    Nothing to submit is taken from record.json, which anyone who can write the run
    directory could have changed: the bundle comes from the store, found by the record's
    hash and verified file by file, and the exports are recomputed as ``mxc run`` computed
    them (only ``MXC_RESUBMITS`` differs).
    """
    slurm = record.slurm = record.slurm or SlurmState()
    old = str(request.get("job_id"))
    resubmits = slurm.resubmits + 1
    roots = Roots.current()
    bundle = _verified_bundle(run, record, roots.store())
    exports = job_exports(RunRequest(home=roots.home, bundle=bundle, spec=bundle.spec()), run, resubmits)
    recorded = dict(slurm.exports)
    expected = scrubbed(exports)  # what mxc run recorded (secret-shaped parts redacted)
    differ = sorted(k for k in set(recorded) | set(expected) if k != "MXC_RESUBMITS" and recorded.get(k) != expected.get(k))
    if differ:
        print(f"mxc: warning: run {run.run_id}: record.json's exports differ from what its bundle gives here "
              f"({', '.join(differ)}); resubmitting with the recomputed ones", file=sys.stderr)
    argv = sbatch_argv(bundle.path, run, exports)
    job_id = slurm_query.submit(argv)
    (run.path / slurm_events.RESUBMIT_REQUEST).rename(run.path / f"{slurm_events.RESUBMIT_REQUEST}.{old}")
    slurm.jobs = [*slurm.jobs, SlurmJob(job_id=job_id, submitted=now_iso(), resubmits=resubmits, resubmit_of=old,
                                        why=_text(request.get("why")), cause=_text(request.get("cause")))]
    slurm.job_id, slurm.exports, slurm.resubmits, slurm.state = job_id, expected, resubmits, "PENDING"
    record.status = "queued"
    record.message = f"resubmitted by mxc as job {job_id}: {request.get('why')}"


def _text(value: Any) -> str | None:
    """A field of the job's resubmit.request as the record's text (the file is the job's to write)."""
    return None if value is None else str(value)


def _verified_bundle(run: RunDir, record: RunRecord, store: Store) -> StoredBundle:
    """The run's bundle in the store of this mxc, intact (put back from the run's own copy when it
    left the store); a UserError names why not."""
    try:
        return kept_bundle.in_store(run, record, store)
    except UserError as exc:
        raise UserError(f"run {run.run_id}: {exc.args[0]}; not resubmitting", exc.suggestion) from None


# ---- cancel


def _require_job_of(run: RunDir, job_id: str) -> None:
    """The job a record names is cancelled only when Slurm says it runs in this run's directory
    (``sbatch --chdir``): a record is a file others may write, Slurm's own data is not."""
    where = slurm_query.work_dir(job_id)
    if where is None or os.path.realpath(where) != os.path.realpath(run.path):
        seen = f"runs in {where}" if where else "is not known to Slurm as a job in it"
        raise UserError(f"run {run.run_id}: Slurm job {job_id}, which its record names, {seen}: not cancelling it",
                        "cancel the job yourself if it is this run's: scancel JOBID")


def cancel(run: RunDir, timeout: float = 60) -> RunRecord:
    """scancel the run's job (no resubmission afterwards) and wait for Slurm to say it ended."""
    record = refresh(run)
    if record.final:
        raise UserError(f"run {run.run_id} already ended ({record.status})")
    job_id = record.slurm.job_id if record.slurm and record.slurm.job_id else ""
    if job_id:
        _require_job_of(run, job_id)
    (run.path / slurm_events.CANCEL_REQUEST).write_text(now_iso() + "\n")
    if job_id:
        slurm_query.cancel(job_id)
    deadline = time.monotonic() + timeout
    while not record.final and time.monotonic() < deadline:
        time.sleep(0.5)
        record = refresh(run)
    return record
