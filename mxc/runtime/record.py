"""The run record: plain JSON anyone can read and diff, with a schema version.

Written atomically at start, on every state change while the run is live, and once more
at the end; after ``final`` is true it is never rewritten.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mxc.fsutil import loads, read_bounded, read_json, write_atomic

RECORD_VERSION = "mxc-run/v1"

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


class Attempt(BaseModel):
    """One start of the training process (the first, or a restart from a checkpoint)."""

    model_config = ConfigDict(extra="allow")

    number: int
    started: str
    ended: str | None = None
    exit_code: int | None = None
    signal: str | None = None
    reason: str | None = None
    resumed_from_step: int | None = None
    last_step: int | None = None


class RunRecord(BaseModel):
    model_config = ConfigDict(extra="allow")

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
    slurm: dict[str, Any] | None = None
    observability: dict[str, Any] | None = None
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
        return cls.model_validate(loads(data.decode("utf-8")))
