"""The Slurm backend: submit a bundle's ``job.sbatch`` with sbatch, and keep its record current.

``plan`` builds the exact sbatch command (``--output`` into the run directory, the
bundle's and run's paths passed with ``--export``) and shows the script it submits, as is;
``run`` submits it and returns at once with the job queued. There is no daemon: every
``mxc`` command that looks at a live Slurm run (``runs``, ``logs -f``, ``cancel``) calls
``refresh``, which asks Slurm for the job's state (squeue, then sacct / sacct -c), reads what
the job wrote into the run directory, and rewrites ``record.json``; the refresh that sees the
job end writes the final record. Where compute nodes cannot requeue (no scontrol), the job
leaves ``resubmit.request`` and the next refresh resubmits the same bundle into the same run.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import shlex
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mxc.compiler.secretscan import redact_secrets
from mxc.errors import UserError
from mxc.runtime.backends import DEFAULT_PYTHON, Plan, RunRequest, allocate_run_dir, recorded_environment
from mxc.runtime.metrics_merge import write_merged
from mxc.runtime.provenance.environment import scrubbed
from mxc.runtime.record import RunRecord, now_iso
from mxc.runtime.rundir import RunDir
from mxc.runtime.slurm import events as slurm_events
from mxc.runtime.slurm import query as slurm_query
from mxc.runtime.slurm.query import JobState


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


def node_python(spec: Mapping[str, Any]) -> str | None:
    """The interpreter compute nodes use for a native run, or None to leave it to the spec.

    ``$MXC_PYTHON`` wins; with the spec's default ``python3``, the interpreter running mxc
    when it has maxtext (a shared-file-system virtual environment); a non-default
    ``runtime.python`` is resolved on the node, after its ``module load``s.
    """
    if os.environ.get("MXC_PYTHON"):
        return os.environ["MXC_PYTHON"]
    configured = str(spec.get("runtime", {}).get("python", DEFAULT_PYTHON))
    if configured == DEFAULT_PYTHON and importlib.util.find_spec("maxtext") is not None:
        return sys.executable
    return None


def job_exports(request: RunRequest, run: RunDir, resubmits: int = 0) -> dict[str, str]:
    """The variables the job gets on top of the submitting environment (sbatch --export=ALL,...)."""
    spec = request.spec
    env = {
        "MXC_BUNDLE_DIR": str(request.bundle.path),
        "MXC_RUN_DIR": str(run.path),
        "MXC_RUN_ID": run.run_id,
        "MXC_RESUBMITS": str(resubmits),
        "MXC_JAX_CACHE": os.environ.get("MXC_JAX_CACHE") or str(request.home / "cache" / "jax"),
    }
    if spec.get("runtime", {}).get("container", "native") == "native":
        python = node_python(spec)
        if python:
            env["MXC_PYTHON"] = python
    if spec.get("observability", {}).get("enabled"):
        # The nodes' exporter and Prometheus run mxc itself: this interpreter, on the shared file system.
        env["MXC_AGENT_PYTHON"] = sys.executable
    if request.code_commit:
        from mxc.runtime.provenance import codepin

        env["MXC_CODE_DIR"] = str(codepin.store_dir(request.home, request.code_commit))
    return env


def sbatch_argv(bundle_dir: Path, run: RunDir, exports: Mapping[str, str]) -> list[str]:
    """``sbatch`` with the output in the run directory (appended across requeues) and the exports.

    ``--export`` separates variables with commas, so a value holding one cannot be passed.
    """
    for key, value in exports.items():
        if "," in value or "\n" in value:
            raise UserError(f"{key}={value!r} cannot be passed to sbatch --export (it splits on commas)",
                            "use paths without commas for MXC_HOME and the bundle store")
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
        restart_max = request.spec.get("restart", {}).get("max", 0)
        notes.append(f"requeue on node failure, preemption, or the time limit after a checkpoint: at most {restart_max}")
        script_path = request.bundle.path / "job.sbatch"
        return SlurmPlan("slurm", run, argv, {}, run.path, notes=notes, script_path=script_path,
                         script=script_path.read_text("utf-8"))

    def run(self, request: RunRequest, plan: Plan) -> RunRecord:
        slurm_query.require("sbatch")
        spec = request.spec
        pinned = None
        if request.code_commit:
            from mxc.runtime.provenance import codepin

            pinned = codepin.materialise(request.home, str(spec["code"]["repo"]), request.code_commit)
        run = plan.run_dir
        run.path.mkdir(parents=True)
        exports = job_exports(request, run)
        record = RunRecord(
            run_id=run.run_id, bundle=request.bundle.hash, spec_name=request.spec_name, backend="slurm",
            status="submitted", started=now_iso(), command=[redact_secrets(arg) for arg in plan.command],
            environment=recorded_environment({**os.environ, **exports}, spec),
            code=pinned.as_record() if pinned else _code_facts(spec), image=_image_facts(spec),
            rerun_of=request.rerun_of,
            slurm={"jobs": [], "exports": scrubbed(exports), "partition": spec.get("resources", {}).get("partition"),
                   "restart_max": int(spec.get("restart", {}).get("max", 0))},
        )
        record.tensorboard = str(run.tensorboard() / run.run_id)
        try:
            job_id = slurm_query.submit(plan.command)
        except BaseException:
            import shutil

            shutil.rmtree(run.path, ignore_errors=True)  # nothing was submitted: leave no run behind
            raise
        record.slurm = {**(record.slurm or {}), "job_id": job_id,
                        "jobs": [{"job_id": job_id, "submitted": now_iso(), "resubmits": 0}]}
        record.status = "queued"
        record.save(run.record)
        if not request.quiet:
            print(f"mxc: submitted Slurm job {job_id} for run {run.run_id}; follow it with: mxc logs {run.run_id} -f",
                  file=sys.stderr)
        return record


def _code_facts(spec: Mapping[str, Any]) -> dict[str, Any]:
    code = spec.get("code", {})
    return {"maxtext_version": code.get("maxtext_version")} if code.get("maxtext_version") else {}


def _image_facts(spec: Mapping[str, Any]) -> dict[str, Any]:
    image = spec.get("image")
    container = spec.get("runtime", {}).get("container", "native")
    if image:
        return {"container": container, "ref": image.get("ref"), "digest": image.get("digest")}
    return {"container": container}


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


def refresh(run: RunDir, record: RunRecord | None = None) -> RunRecord:
    """The run's record, brought up to date from Slurm and the run directory (and saved if changed)."""
    record = record or RunRecord.load(run.record)
    if record.final or record.backend != "slurm":
        return record
    with _locked(run):
        record = RunRecord.load(run.record)
        if record.final:
            return record
        before = record.model_dump_json()
        _update(run, record)
        if record.model_dump_json() != before:
            record.save(run.record)
            _alert(run, RunRecord.model_validate_json(before), record)
    return record


def _alert(run: RunDir, before: RunRecord, after: RunRecord) -> None:
    """No mxc process follows a Slurm job: alerts go out when a look at the record sees a change."""
    from mxc.fsutil import mxc_home
    from mxc.runtime import notify
    from mxc.store import Store

    try:
        spec = Store(mxc_home()).get(after.bundle).spec()
    except UserError:
        return  # the bundle left the store: no notify settings to follow
    notify.notify_transition(spec, run, before, after)


def _update(run: RunDir, record: RunRecord) -> None:
    slurm = dict(record.slurm or {})
    job_id = str(slurm.get("job_id", ""))
    state = slurm_query.query(job_id) if job_id else JobState(job_id="", state="UNKNOWN")
    files = slurm_events.JobFiles.read(run)
    log = slurm_events.LogFacts.from_record(slurm.get("log"))
    log.update(run.log)
    slurm["log"] = log.as_dict()
    record.slurm = slurm
    history: dict[str, list[str]] = {}
    starts = [e for e in files.batch if e.get("event") == "start"]
    if any(int(e.get("restart", 0)) > 0 for e in starts) or state.ended:
        history = {str(j["job_id"]): slurm_query.history(str(j["job_id"])) for j in slurm.get("jobs", [])}
    slurm_events.apply(record, files, log, history)
    if observed := slurm_events.observability(run):
        record.observability = observed
    slurm = dict(record.slurm or {})
    if state.state != "UNKNOWN":
        slurm.update(state=state.state, reason=state.reason, source=state.source)
        if state.nodes:
            slurm["nodes"] = state.nodes
        if state.partition:
            slurm["partition"] = state.partition
        if state.restart_count is not None:
            slurm["slurm_restarts"] = state.restart_count
        if state.time_left:
            slurm["time_left"] = state.time_left
    record.slurm = slurm
    merged = write_merged(run.metrics_parts, run.metrics)
    if merged.steps:
        record.steps, record.last_loss = merged.steps, merged.last_loss
    if not state.ended:
        if state.state != "UNKNOWN":  # else keep what we knew (Slurm could not be asked just now)
            record.status = state.status  # type: ignore[assignment]
        return
    request = files.resubmit_request
    if request and str(request.get("job_id")) == job_id and not files.cancel_requested:
        _resubmit(run, record, request)
        return
    _finish(record, state, files)


def _finish(record: RunRecord, state: JobState, files: slurm_events.JobFiles) -> None:
    ends = [e for e in files.batch if e.get("event") == "end"]
    rc = int(ends[-1]["rc"]) if ends and str(ends[-1].get("job_id")) == state.job_id else state.exit_code
    status = state.status
    if files.cancel_requested and status != "succeeded":
        status = "cancelled"
        record.cancelled_by = "mxc cancel"  # type: ignore[attr-defined]
    record.status = status  # type: ignore[assignment]
    record.slurm = {**(record.slurm or {}), "exit_code": rc}
    # The exit code of the rank that failed first says more than srun's (the highest of all ranks,
    # often the SIGTERM of the ranks it brought down).
    failure = (record.slurm or {}).get("first_failure") or {}
    if status == "failed" and failure.get("rc"):
        rc = int(failure["rc"])
    record.exit_code = rc if rc is not None else (0 if status == "succeeded" else None)
    if status == "succeeded":
        record.message = None
    elif status == "cancelled":
        record.message = "cancelled with mxc cancel" if files.cancel_requested else f"Slurm job {state.job_id} was cancelled"
    elif not record.message:
        record.message = f"Slurm job {state.job_id} ended {state.state}" + (f" ({state.reason})" if state.reason else "")
    record.ended = now_iso()
    if record.attempts and record.attempts[-1].ended is None:
        record.attempts[-1].ended = record.ended
        record.attempts[-1].exit_code = record.exit_code
    record.final = True


def _resubmit(run: RunDir, record: RunRecord, request: dict[str, Any]) -> None:
    """Submit the same bundle into the same run again, one restart further on."""
    slurm = dict(record.slurm or {})
    old = str(request.get("job_id"))
    resubmits = int(slurm.get("resubmits", 0)) + 1
    exports = {**slurm.get("exports", {}), "MXC_RESUBMITS": str(resubmits)}
    bundle_dir = Path(exports["MXC_BUNDLE_DIR"])
    argv = sbatch_argv(bundle_dir, run, exports)
    job_id = slurm_query.submit(argv)
    (run.path / slurm_events.RESUBMIT_REQUEST).rename(run.path / f"{slurm_events.RESUBMIT_REQUEST}.{old}")
    slurm["jobs"] = [*slurm.get("jobs", []), {"job_id": job_id, "submitted": now_iso(), "resubmits": resubmits,
                                               "resubmit_of": old, "why": request.get("why"),
                                               "cause": request.get("cause")}]
    slurm.update(job_id=job_id, exports=exports, resubmits=resubmits, state="PENDING")
    record.slurm = slurm
    record.status = "queued"
    record.message = f"resubmitted by mxc as job {job_id}: {request.get('why')}"


# ---- cancel


def cancel(run: RunDir, timeout: float = 60) -> RunRecord:
    """scancel the run's job (no resubmission afterwards) and wait for Slurm to say it ended."""
    record = refresh(run)
    if record.final:
        raise UserError(f"run {run.run_id} already ended ({record.status})")
    (run.path / slurm_events.CANCEL_REQUEST).write_text(now_iso() + "\n")
    job_id = str((record.slurm or {}).get("job_id", ""))
    if job_id:
        slurm_query.cancel(job_id)
    deadline = time.monotonic() + timeout
    while not record.final and time.monotonic() < deadline:
        time.sleep(0.5)
        record = refresh(run)
    return record
