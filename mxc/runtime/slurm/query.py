"""Talking to Slurm from the submitting side: sbatch, squeue, sacct, scancel.

Only the client commands are used (no REST API, no slurmdbd requirement): ``squeue -t all``
while Slurm still remembers the job (MinJobAge), then ``sacct``, then ``sacct -c`` (the
job-completion log, for clusters without accounting storage).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from mxc.errors import UserError

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


def query(job_id: str) -> JobState:
    """The job's state from the first source that knows it."""
    fmt = ",".join(f"{name}:|" for name in _SQUEUE_FIELDS)
    if shutil.which("squeue"):
        proc = _run(["squeue", "-h", "-t", "all", "-j", job_id, "-O", fmt])
        for line in proc.stdout.splitlines():
            state = parse_squeue(line)
            if state and state.job_id == job_id:
                return state
    if shutil.which("sacct"):
        columns = ["-n", "-P", "-o", "JobID,State,ExitCode,NodeList,Partition,Start,End"]
        for source, argv in (("sacct", ["sacct", "-X", "-j", job_id, *columns]),
                             ("sacct -c", ["sacct", "-c", "-j", job_id, *columns])):
            proc = _run(argv)
            if proc.returncode == 0:
                state = parse_sacct(proc.stdout, source)
                if state:
                    return state
    return JobState(job_id=job_id, state="UNKNOWN")


def history(job_id: str) -> list[str]:
    """The state each run of a job ended in, oldest first (``sacct -c``; requeued runs show as PENDING)."""
    if not shutil.which("sacct"):
        return []
    for argv in (["sacct", "-D", "-X", "-j", job_id, "-n", "-P", "-o", "State"],
                 ["sacct", "-c", "-j", job_id, "-n", "-P", "-o", "State"]):
        proc = _run(argv)
        if proc.returncode == 0 and proc.stdout.strip():
            return [line.strip() for line in proc.stdout.splitlines() if line.strip()]
    return []


def cancel(job_id: str) -> None:
    require("scancel")
    proc = _run(["scancel", job_id])
    if proc.returncode != 0:
        raise UserError(f"scancel {job_id} failed: {' '.join(proc.stderr.split())}")
