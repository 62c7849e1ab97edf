"""Talking to Slurm from the submitting side: sbatch, squeue, sacct, scancel.

Only the client commands are used (no REST API, no slurmdbd requirement): ``squeue -t all``
while Slurm still remembers a job (MinJobAge), then ``sacct``, or ``sacct -c`` (the
job-completion log, for clusters without accounting storage). Reads ask about all their runs
at once (``poll``): one ``squeue`` and at most one ``sacct`` call, whatever the number of runs.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mxc.errors import UserError
from mxc.fsutil import read_text, write_atomic

# Slurm job states (long names) grouped by what they mean for a run.
QUEUED = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "CONFIGURING"})
RUNNING = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESIZING"})
ENDED = {
    "COMPLETED": "succeeded",
    "CANCELLED": "cancelled",
    "FAILED": "failed",
    "TIMEOUT": "failed",
    "NODE_FAIL": "failed",
    "OUT_OF_MEMORY": "failed",
    "PREEMPTED": "failed",
    "BOOT_FAIL": "failed",
    "DEADLINE": "failed",
    "REVOKED": "failed",
    "SPECIAL_EXIT": "failed",
}

_SQUEUE_FIELDS = ("JobID", "State", "Reason", "NodeList", "Partition", "RestartCnt", "exit_code", "StartTime",
                  "EndTime", "BatchHost", "TimeLeft")


_JOB_ID = re.compile(r"[0-9]+(?:[_+][0-9]+)?")


@dataclass(frozen=True)
class JobState:
    """What Slurm says about one job right now."""

    job_id: str
    state: str  # long Slurm name, e.g. RUNNING; "UNKNOWN" when no source knows the job
    reason: str = ""
    nodes: str = ""
    partition: str = ""
    restart_count: int | None = None
    exit_code: int | None = None
    start: str = ""
    end: str = ""
    batch_host: str = ""
    time_left: str = ""
    source: str = ""  # squeue, sacct or sacct -c

    @property
    def status(self) -> str:
        """The run status this state maps to (queued, running, succeeded, failed, cancelled)."""
        base = self.state.split()[0].rstrip("+") if self.state else "UNKNOWN"
        if base in QUEUED:
            return "queued"
        if base in RUNNING:
            return "running"
        return ENDED.get(base, "running" if base == "UNKNOWN" else "failed")

    @property
    def ended(self) -> bool:
        return self.status in ("succeeded", "failed", "cancelled")


def require(command: str) -> str:
    path = shutil.which(command)
    if path is None:
        raise UserError(f"'{command}' is not on PATH: the Slurm backend runs on a Slurm login node",
                        "run the bundle on this machine with: mxc run --local")
    return path


def _run(argv: Sequence[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)


def submit(argv: Sequence[str]) -> str:
    """Run ``sbatch --parsable ...``; the job id, or a UserError with sbatch's own message."""
    require("sbatch")
    proc = _run(argv, timeout=120)
    if proc.returncode != 0:
        message = " ".join(proc.stderr.split()) or f"exit {proc.returncode}"
        raise UserError(f"sbatch refused the job: {message}")
    job_id = proc.stdout.strip().split(";")[0]  # --parsable: "id" or "id;cluster"
    if not job_id.isdigit():
        raise UserError(f"sbatch printed no job id: {proc.stdout.strip()!r}")
    return job_id


def _int(text: str) -> int | None:
    text = text.strip().split(":")[0]
    return int(text) if text.lstrip("-").isdigit() else None


def parse_squeue(line: str) -> JobState | None:
    cols = line.split("|")
    if len(cols) < len(_SQUEUE_FIELDS):
        return None
    f = dict(zip(_SQUEUE_FIELDS, (c.strip() for c in cols), strict=False))
    return JobState(job_id=f["JobID"], state=f["State"], reason="" if f["Reason"] == "None" else f["Reason"],
                    nodes=f["NodeList"], partition=f["Partition"], restart_count=_int(f["RestartCnt"]),
                    exit_code=_int(f["exit_code"]), start=f["StartTime"], end=f["EndTime"],
                    batch_host=f["BatchHost"], time_left=f["TimeLeft"], source="squeue")


def parse_sacct(output: str, source: str) -> JobState | None:
    """The last line of ``sacct -n -P -o JobID,State,ExitCode,NodeList,Partition,Start,End`` (latest run)."""
    rows = [line.split("|") for line in output.splitlines() if line.strip()]
    rows = [r for r in rows if len(r) >= 7 and "." not in r[0]]  # the job itself, not its steps
    if not rows:
        return None
    job_id, state, exit_code, nodes, partition, start, end = (c.strip() for c in rows[-1][:7])
    return JobState(job_id=job_id, state=state, exit_code=_int(exit_code), nodes=nodes, partition=partition,
                    start=start, end=end, restart_count=len(rows) - 1 if source == "sacct -c" else None,
                    source=source)


@dataclass(frozen=True)
class Snapshot:
    """Slurm's state of many jobs at once, from one ``squeue`` and at most one ``sacct`` call
    (``poll``): what every read of live runs folds in, whatever their number (submitit's watcher
    is the model). ``history`` is the state each run of a job ended in, oldest first (sacct;
    requeued runs show as PENDING or REQUEUED), for the jobs that needed it."""

    states: dict[str, JobState] = field(default_factory=dict)
    histories: dict[str, list[str]] = field(default_factory=dict)

    def state(self, job_id: str) -> JobState:
        return self.states.get(job_id) or JobState(job_id=job_id, state="UNKNOWN")

    def history(self, job_id: str) -> list[str]:
        return self.histories.get(job_id, [])


def _ids(job_ids: Iterable[str]) -> list[str]:
    """Job ids as Slurm takes them (digits, array and het-job suffixes), each once, in order."""
    return list(dict.fromkeys(j for j in job_ids if _JOB_ID.fullmatch(j)))


def squeue_states(job_ids: Iterable[str]) -> dict[str, JobState]:
    """One ``squeue -t all -j ID,ID,...`` call: the jobs Slurm still remembers (MinJobAge).
    An id it forgot is simply absent (squeue fails only when it knows none of them)."""
    ids = _ids(job_ids)
    if not ids or not shutil.which("squeue"):
        return {}
    fmt = ",".join(f"{name}:|" for name in _SQUEUE_FIELDS)
    proc = _run(["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-O", fmt])
    wanted = set(ids)
    out: dict[str, JobState] = {}
    for line in proc.stdout.splitlines():
        state = parse_squeue(line)
        if state and state.job_id in wanted:
            out[state.job_id] = state
    return out


# Which sacct answers on this cluster: accounting storage (sacct -X), else the job-completion log (sacct -c).
_SACCT_SOURCES = {"sacct": ["-X", "-D"], "sacct -c": ["-c"]}
_SACCT_COLUMNS = ["-n", "-P", "-o", "JobID,State,ExitCode,NodeList,Partition,Start,End"]


def sacct_states(job_ids: Iterable[str], memo: Path | None = None) -> tuple[dict[str, JobState], dict[str, list[str]]]:
    """One ``sacct`` call for many jobs: each job's latest state and the state each of its runs
    ended in. ``memo`` remembers which source answered (accounting storage or the job-completion
    log), so the next poll asks that one first: one call, not a failing one and then another."""
    ids = _ids(job_ids)
    if not ids or not shutil.which("sacct"):
        return {}, {}
    order = list(_SACCT_SOURCES)
    remembered = _read_memo(memo)
    if remembered in order:
        order.remove(remembered)
        order.insert(0, remembered)
    for source in order:
        proc = _run(["sacct", *_SACCT_SOURCES[source], "-j", ",".join(ids), *_SACCT_COLUMNS])
        if proc.returncode != 0:
            continue
        if source != remembered and memo is not None:
            with contextlib.suppress(OSError):
                write_atomic(memo, source + "\n")
        return _by_job(proc.stdout, source, set(ids))
    return {}, {}


def _read_memo(memo: Path | None) -> str:
    if memo is None:
        return ""
    try:
        return read_text(memo, 64).strip()
    except OSError:
        return ""


def _by_job(output: str, source: str, wanted: set[str]) -> tuple[dict[str, JobState], dict[str, list[str]]]:
    rows: dict[str, list[str]] = {}
    for line in output.splitlines():
        job_id = line.split("|", 1)[0].strip()
        if job_id in wanted:
            rows.setdefault(job_id, []).append(line)
    states: dict[str, JobState] = {}
    histories: dict[str, list[str]] = {}
    for job_id, lines in rows.items():
        state = parse_sacct("\n".join(lines), source)
        if state is not None:
            states[job_id] = state
        histories[job_id] = [line.split("|")[1].strip() for line in lines if line.count("|") >= 1]
    return states, histories


def poll(live: Sequence[tuple[str, Sequence[str], bool]], memo: Path | None = None) -> Snapshot:
    """Slurm's view of every live run of one command: ``live`` holds, per run, its current job,
    all the jobs it ever submitted, and whether its history is needed anyway (it restarted).
    One ``squeue`` for the current jobs; one ``sacct`` for those squeue no longer knows, and for
    the history of runs that ended or restarted (what ``attempts`` need to say why)."""
    states = squeue_states(job for job, _, _ in live if job)
    need: list[str] = []
    for job, jobs, restarted in live:
        if not job:
            continue
        seen = states.get(job)
        if seen is None:
            need.append(job)
        if seen is None or seen.ended or restarted:
            need += jobs
    accounted, histories = sacct_states(need, memo) if need else ({}, {})
    return Snapshot({**accounted, **states}, histories)


def work_dir(job_id: str) -> str | None:
    """The working directory Slurm has for a job it still knows (``squeue -O WorkDir``): mxc submits
    every job with ``--chdir`` its run directory, so this proves whose job it is. None: unknown."""
    if not _JOB_ID.fullmatch(job_id) or not shutil.which("squeue"):
        return None
    proc = _run(["squeue", "-h", "-t", "all", "-j", job_id, "-O", "WorkDir:|"])
    lines = [line.rstrip("|").strip() for line in proc.stdout.splitlines() if line.strip()]
    return lines[0] if proc.returncode == 0 and len(lines) == 1 and lines[0] else None


def cancel(job_id: str) -> None:
    require("scancel")
    proc = _run(["scancel", job_id])
    if proc.returncode != 0:
        raise UserError(f"scancel {job_id} failed: {' '.join(proc.stderr.split())}")
