"""The run record: plain JSON anyone can read and diff, with a schema version.

Written atomically at start, on every state change while the run is live, and once more
at the end; after ``final`` is true it is never rewritten.

Format ``mxc-run/v2``: every field is declared here (``extra="forbid"``: a field nobody declared
is an error, not a silent extra), the Slurm state is a typed model (``SlurmState``), and nothing
in it is a parser's bookkeeping (the Slurm backend's train.log cursor lives in the run directory's
private ``.log-cursor.json``, ``RunDir.log_cursor``). ``mxc schema --record`` prints the JSON
Schema. Records of format ``mxc-run/v1`` (and older ones without a format) are still read:
``record_v1.upgrade`` converts them on load; a final record is never rewritten, so a finished
v1 run keeps its v1 file.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mxc.fsutil import loads, read_bounded, read_json, write_atomic

RECORD_VERSION = "mxc-run/v2"

Status = Literal["starting", "running", "succeeded", "failed", "cancelled", "hung", "submitted", "queued"]
FINISHED: frozenset[str] = frozenset({"succeeded", "failed", "cancelled", "hung"})


# The record's one time format (and that of every file a run writes): UTC, ISO 8601, milliseconds, "Z".
def iso_time(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def epoch_seconds(text: str | None) -> float | None:
    parsed = parse_time(text)
    return parsed.timestamp() if parsed else None


class Strict(BaseModel):
    """Every model of the record: an undeclared field is an error."""

    model_config = ConfigDict(extra="forbid")


class Decision(Strict):
    """The restart policy's decision for an attempt (mxc/node/policy.py), as the batch side took it."""

    cause: str
    action: str  # requeue | stop | done
    reason: str
    rank: int | None = None  # the rank that failed first, when one did
    node: str | None = None
    detail: str | None = None  # what that rank saw


class Requeue(Strict):
    """How a decision on a requeue-able cause went: requeued, resubmit_requested, requeue_failed,
    requeue_pending, refused (the policy said stop) or none (nothing to requeue)."""

    cause: str
    action: str
    why: str | None = None
    checkpoint: int | None = None


class Attempt(Strict):
    """One start of the training process (the first, or a restart from a checkpoint)."""

    number: int
    started: str
    ended: str | None = None
    exit_code: int | None = None
    signal: str | None = None
    reason: str | None = None
    resumed_from_step: int | None = None
    last_step: int | None = None
    cause: str | None = None  # why it ended (mxc/node/policy.py causes), as its rank or the batch side saw it
    hung: bool = False  # the node program's hang watch stopped it (local)
    idle_seconds: float | None = None  # ... after this long without progress
    stacks: list[str] = Field(default_factory=list)  # ... and these stack dumps were kept
    # Slurm: which job ran it and how the batch side ended it
    job_id: str | None = None
    run_of_job: int | None = None  # 0 for the job's first start, 1 after Slurm requeued it once...
    nodes: str | None = None
    coordinator: str | None = None
    decision: Decision | None = None
    requeue: Requeue | None = None
    slurm_state: str | None = None  # sacct's state of a start Slurm cut short (NODE_FAIL, PREEMPTED...)


class SlurmJob(Strict):
    """One submission of the run (the first, or a resubmission by ``mxc watch``)."""

    job_id: str
    submitted: str
    resubmits: int = 0
    resubmit_of: str | None = None
    why: str | None = None
    cause: str | None = None


class RequeueEntry(Requeue):
    """A requeue-able cause of one attempt, listed in ``slurm.requeues``."""

    job_id: str | None = None
    restart: int


class FirstFailure(Strict):
    """The rank that failed first in the latest attempt."""

    rank: int
    node: str | None = None
    stage: str | None = None
    rc: int | None = None
    cause: str | None = None
    timed_out: bool = False
    why: str
    detail: str | None = None
    srun: str | None = None  # srun's words about it ("Exited with exit code 137")


class SlurmState(Strict):
    """What the Slurm backend knows of a run: its submissions, Slurm's latest view, what the job wrote."""

    job_id: str | None = None  # the current submission
    jobs: list[SlurmJob] = Field(default_factory=list)
    exports: dict[str, str] = Field(default_factory=dict)  # sbatch --export (secret-shaped parts redacted)
    partition: str | None = None
    restart_max: int | None = None
    # Slurm's view (squeue, sacct or sacct -c)
    state: str | None = None  # long state name: PENDING, RUNNING, COMPLETED, FAILED...
    reason: str | None = None
    source: str | None = None
    nodes: str | None = None
    slurm_restarts: int | None = None  # Slurm's restart count of the job
    time_left: str | None = None
    # what the job wrote (batch.jsonl, ranks/*/events.jsonl)
    restart_count: int | None = None  # SLURM_RESTART_COUNT of the latest start
    resubmits: int = 0
    coordinator: str | None = None
    batch_host: str | None = None
    node_list: str | None = None
    num_nodes: int | None = None
    requeues: list[RequeueEntry] = Field(default_factory=list)
    first_failure: FirstFailure | None = None
    invalid_events: list[str] = Field(default_factory=list)
    exit_code: int | None = None  # the batch side's


class RunRecord(Strict):
    """One run (mxc-run/v2): what ran, how it went, where its files are."""

    format: str = RECORD_VERSION
    run_id: str
    bundle: str
    spec_name: str
    backend: str
    status: Status
    final: bool = False
    started: str
    ended: str | None = None
    exit_code: int | None = None
    restarts: int = 0
    attempts: list[Attempt] = Field(default_factory=list)
    command: list[str] = Field(default_factory=list)
    environment: dict[str, str] = Field(default_factory=dict)
    host: dict[str, Any] = Field(default_factory=dict)
    code: dict[str, Any] = Field(default_factory=dict)
    image: dict[str, Any] = Field(default_factory=dict)
    steps: int | None = None
    last_loss: float | None = None
    slurm: SlurmState | None = None
    observability: dict[str, Any] | None = None
    preflight: dict[str, dict[str, Any]] = Field(default_factory=dict)  # Slurm, per rank: preflight.json + failed checks
    cancelled_by: str | None = None  # SIGINT/SIGTERM/SIGHUP (local), "mxc cancel"
    rerun_of: str | None = None
    labels: list[str] = Field(default_factory=list)  # mxc run --label: names for `label:NAME` references
    resumed_from: dict[str, Any] | None = None  # mxc run --resume-from: {run, step, path} of the checkpoint it started from
    tensorboard: str | None = None  # directory of MaxText's TensorBoard event files
    supervisor: dict[str, Any] | None = None  # pid and host of the local process that writes this record
    time_to_first_step_s: float | None = None  # from `started` to the first step line (local runs)
    compile_s: float | None = None  # the first finished compilation of the train step (local runs; trainlog.PHASE_LINES)
    message: str | None = None
    detected: dict[str, Any] | None = None  # env.detect, by rank: what each detector found and set (runtime/detections.py)
    # rank 0's training start: the environment training saw (image's and spec's joined; allow-listed,
    # redacted like `environment`), optional mounts skipped, container (mxc/runtime/provenance/training.py)
    training: dict[str, Any] | None = None

    def save(self, path: Path) -> None:
        if path.exists():
            old = read_json(path)
            if old is not None and old.get("final"):
                raise RuntimeError(f"{path} is final and must not be rewritten")
        write_atomic(path, self.model_dump_json(indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> RunRecord:
        """The record; FileNotFoundError when there is none, ValueError (pydantic's included) when
        it is not one: a directory, a FIFO, too big, too deep, not UTF-8, the wrong shape."""
        try:
            data = read_bounded(path)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise ValueError(str(exc)) from None
        return cls.parse(loads(data.decode("utf-8")))

    @classmethod
    def parse(cls, data: Any) -> RunRecord:
        """A record from its JSON data, of this format or an older one (converted)."""
        from mxc.runtime import record_v1

        if isinstance(data, dict) and data.get("format", record_v1.FORMAT) == record_v1.FORMAT:
            data = record_v1.upgrade(data)
        elif isinstance(data, dict) and data.get("format") != RECORD_VERSION:
            raise ValueError(f"record format {str(data.get('format'))[:40]!r}: this mxc reads {RECORD_VERSION} "
                             f"and {record_v1.FORMAT}")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:  # one line naming the field: `mxc runs` shows it as the run's error
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "record"
            raise ValueError(f"{where}: {first.get('msg')}" + (f" (and {exc.error_count() - 1} more)"
                                                               if exc.error_count() > 1 else "")) from None


def json_schema() -> dict[str, Any]:
    """The record's JSON Schema (``mxc schema --record``)."""
    schema: dict[str, Any] = RunRecord.model_json_schema()
    schema["title"] = f"mxc run record ({RECORD_VERSION})"
    return schema
