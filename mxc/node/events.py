"""The events the node program writes, as JSON lines: one definition for the writer and every reader.

* ``batch.jsonl``: the batch side of a Slurm job (``BATCH_EVENTS``);
* ``ranks/<rank>/events.jsonl``: each rank (``RANK_EVENTS``), Slurm and local alike.

Lines are ``json.dumps`` of a dataclass (``append``), never hand-made text. The node program reads
them back with ``read`` (``typed.from_dict``); mxc reads them through pydantic over these same
dataclasses (mxc/runtime/slurm/events.py). A line that does not validate is reported by both,
never guessed at. Times are seconds since the epoch; ``attempt`` is the run's restart count.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .typed import from_dict, to_dict

STRICT: Any = {"extra": "forbid", "strict": True}


# ---- batch side (batch.jsonl)


@dataclass(frozen=True)
class BatchStart:
    """The batch side started an attempt on its allocation."""

    time: float
    job_id: str
    attempt: int  # restarts so far: SLURM_RESTART_COUNT + resubmits
    slurm_restart_count: int
    resubmits: int
    restart_max: int
    nodes: str
    num_nodes: int
    partition: str
    batch_host: str
    coordinator: str
    event: Literal["start"] = "start"
    __pydantic_config__ = STRICT


@dataclass(frozen=True)
class Refused:
    """The batch side would not start (past restart.max, or the bundle changed)."""

    time: float
    job_id: str
    attempt: int
    slurm_restart_count: int
    resubmits: int
    why: str
    event: Literal["refused"] = "refused"
    __pydantic_config__ = STRICT


@dataclass(frozen=True)
class SignalReceived:
    """USR2 before the time limit or on preemption: training is asked to checkpoint and stop."""

    time: float
    job_id: str
    attempt: int
    signal: str
    cause: str  # time_limit | preemption
    time_left: float | None  # seconds, when known
    event: Literal["signal"] = "signal"
    __pydantic_config__ = STRICT


@dataclass(frozen=True)
class Decision:
    """The restart policy's decision for the attempt that ended (policy.py)."""

    time: float
    job_id: str
    attempt: int
    cause: str  # policy.CAUSES
    action: str  # requeue | stop | done
    reason: str
    checkpoint: int | None  # the latest finished checkpoint
    rank: int | None  # the rank that failed first, when one did
    node: str | None
    detail: str | None  # what that rank saw (the matched log line, the stage, the signal)
    event: Literal["decision"] = "decision"
    __pydantic_config__ = STRICT


@dataclass(frozen=True)
class Requeue:
    """How a requeue decision was carried out."""

    time: float
    job_id: str
    attempt: int
    action: str  # requeued (scontrol requeue) | requeue_failed | resubmit_requested (resubmit.request for mxc)
    why: str
    checkpoint: int | None
    event: Literal["requeue"] = "requeue"
    __pydantic_config__ = STRICT


@dataclass(frozen=True)
class Terminated:
    """SIGTERM reached the batch side (scancel, the time limit, preemption without a signal)."""

    time: float
    job_id: str
    attempt: int
    signal: str
    event: Literal["terminated"] = "terminated"
    __pydantic_config__ = STRICT


@dataclass(frozen=True)
class End:
    time: float
    job_id: str
    attempt: int
    rc: int
    event: Literal["end"] = "end"
    __pydantic_config__ = STRICT


BATCH_EVENTS = (BatchStart, Refused, SignalReceived, Decision, Requeue, Terminated, End)


# ---- each rank (ranks/<rank>/events.jsonl)


@dataclass(frozen=True)
class RankStart:
    time: float
    job_id: str
    attempt: int
    rank: int
    node: str
    nprocs: int
    coordinator: str
    pid: int
    interface: str  # network interface for NCCL/RCCL sockets and Gloo
    interface_reason: str
    event: Literal["start"] = "start"
    __pydantic_config__ = STRICT


@dataclass(frozen=True)
class StageStart:
    time: float
    job_id: str
    attempt: int
    rank: int
    node: str
    stage: str
    timeout_s: int
    event: Literal["stage_start"] = "stage_start"
    __pydantic_config__ = STRICT


@dataclass(frozen=True)
class StageEnd:
    time: float
    job_id: str
    attempt: int
    rank: int
    node: str
    stage: str
    rc: int
    seconds: float
    timed_out: bool
    detail: str | None
    event: Literal["stage_end"] = "stage_end"
    __pydantic_config__ = STRICT


@dataclass(frozen=True)
class ImageReady:
    """The image stage's outcome: which image file or reference training will use, and how it got there."""

    time: float
    job_id: str
    attempt: int
    rank: int
    node: str
    image: str
    action: str  # native | exists | pulled | cached | fetched | verified
    seconds: float
    event: Literal["image"] = "image"
    __pydantic_config__ = STRICT


@dataclass(frozen=True)
class BarrierPassed:
    time: float
    job_id: str
    attempt: int
    rank: int
    node: str
    name: str
    ranks: int
    waited_s: float
    event: Literal["barrier"] = "barrier"
    __pydantic_config__ = STRICT


@dataclass(frozen=True)
class HangDetected:
    """This rank stopped its trainer because of a hang (its own, or another rank's marker)."""

    time: float
    job_id: str
    attempt: int
    rank: int
    node: str
    phase: str  # init (before the first step) | step
    idle_seconds: float
    limit_s: int
    detected_by: int  # the rank that saw it first
    pid: int | None  # the trainer
    stacks: list[str] = field(default_factory=list)  # stack dump files
    event: Literal["hang"] = "hang"
    __pydantic_config__ = STRICT


@dataclass(frozen=True)
class RankExit:
    """How this rank's attempt ended: the stage, the exit code and the cause (policy.CAUSES)."""

    time: float
    job_id: str
    attempt: int
    rank: int
    node: str
    stage: str
    rc: int
    timed_out: bool
    cause: str
    detail: str | None
    last_step: int | None
    event: Literal["exit"] = "exit"
    __pydantic_config__ = STRICT


RANK_EVENTS = (RankStart, StageStart, StageEnd, ImageReady, BarrierPassed, HangDetected, RankExit)


def line(event: Any) -> str:
    """The JSON line of an event, ``event`` first (asdict keeps the other fields in order)."""
    data = to_dict(event)
    return json.dumps({"event": data.pop("event"), **data}, ensure_ascii=False) + "\n"


def append(path: Path, event: Any) -> None:
    """One ``write`` of one whole line: readers never see half of it (one writer per file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = line(event).encode("utf-8")
    fd = os.open(str(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def parse_numbered(text: str, kinds: tuple[type, ...], where: str = "") -> tuple[list[tuple[int, Any]], list[str]]:
    """Every line of ``text`` as (line number, event of ``kinds`` by its ``event`` name), and the
    problems of those that are not (``where:N: why``). A last line without its newline is still
    being written: it is left for the next read."""
    by_name = {kind.__dataclass_fields__["event"].default: kind for kind in kinds}  # type: ignore[attr-defined]
    found: list[tuple[int, Any]] = []
    problems: list[str] = []
    for number, raw in enumerate(text.split("\n")[:-1], 1):
        if not raw.strip():
            continue
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than the parser goes
            problems.append(f"{where}:{number}: not JSON ({type(exc).__name__})")
            continue
        kind = by_name.get(data.get("event")) if isinstance(data, dict) else None
        if kind is None:
            problems.append(f"{where}:{number}: unknown event {data.get('event') if isinstance(data, dict) else data!r:.60}")
            continue
        try:
            found.append((number, from_dict(kind, data)))
        except ValueError as exc:
            problems.append(f"{where}:{number}: {exc}")
    return found, problems


def parse(text: str, kinds: tuple[type, ...], where: str = "") -> tuple[list[Any], list[str]]:
    numbered, problems = parse_numbered(text, kinds, where)
    return [event for _, event in numbered], problems


def read(path: Path, kinds: tuple[type, ...]) -> tuple[list[Any], list[str]]:
    try:
        text = path.read_text("utf-8", errors="replace")
    except OSError:
        return [], []
    return parse(text, kinds, str(path))
