"""What a Slurm job wrote into its run directory, folded into the run record.

The job runs on compute nodes without mxc; its node program (mxc/node/) leaves plain files,
whose layout and event types are defined once, in mxc/node/layout.py and mxc/node/events.py:

* ``batch.jsonl``: the batch side's events (each start with its restart count, nodes and
  coordinator; USR2 and its cause; the restart policy's decision and how a requeue was done; the end);
* ``ranks/<rank>/events.jsonl``: each rank's start, stages, hang and exit (stage, exit code, cause);
* ``ranks/<rank>/preflight.json``: the node checks of the latest attempt;
* ``train.log``: read incrementally for each restart's resumed checkpoint and last step.

Event lines are validated here by pydantic over the node program's dataclasses; a line that does
not validate is reported in ``record.slurm.invalid_events``, never guessed at.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, TypeAdapter, ValidationError

from mxc.fsutil import open_regular, read_json, read_text, write_atomic
from mxc.node import events as ev
from mxc.node import layout, policy
from mxc.runtime.logs.trainlog import RESTORE_LINE, STEP_PREFIX
from mxc.runtime.record import (
    Attempt,
    Decision,
    FirstFailure,
    Requeue,
    RequeueEntry,
    RunRecord,
    SlurmState,
    iso_time,
)
from mxc.runtime.rundir import RunDir

BATCH_EVENTS = layout.BATCH_EVENTS
RESUBMIT_REQUEST = layout.RESUBMIT_REQUEST
CANCEL_REQUEST = layout.CANCEL_REQUEST
NODE_STATUS = "node-{node}.json"  # observability/, written by mxc/runtime/observe/node_observer.py on each node
MAX_PROBLEMS = 20
MAX_EVENTS_BYTES = 64 << 20  # far more than any job writes

BatchEvent = Annotated[
    ev.BatchStart | ev.Refused | ev.SignalReceived | ev.Decision | ev.Requeue | ev.Terminated | ev.End,
    Field(discriminator="event"),
]
RankEvent = Annotated[
    ev.RankStart | ev.StageStart | ev.StageEnd | ev.ImageReady | ev.BarrierPassed | ev.HangDetected | ev.RankExit,
    Field(discriminator="event"),
]
BATCH_ADAPTER: TypeAdapter[Any] = TypeAdapter(BatchEvent)
RANK_ADAPTER: TypeAdapter[Any] = TypeAdapter(RankEvent)

_BATCH_START = re.compile(r"\[mxc batch \d+\] nodes .* restart (\d+) of at most")
_SRUN_TASK_ERROR = re.compile(r"^srun: error: (\S+): tasks? (\d+)(?:-\d+)?: (.+)$")


def read_events(path: Path, adapter: TypeAdapter[Any], label: str | None = None) -> tuple[list[Any], list[str]]:
    """Every complete line of an event file, validated; and ``label:N: why`` for each line that is not
    an event (a last line without its newline is still being written, and waits for the next read)."""
    try:
        text = read_text(path, MAX_EVENTS_BYTES)  # a regular file only (never hang on a FIFO), bounded
    except OSError:
        return [], []
    label = label or path.name
    found: list[Any] = []
    problems: list[str] = []
    for number, line in enumerate(text.split("\n")[:-1], 1):
        if not line.strip():
            continue
        try:
            found.append(adapter.validate_json(line))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "line"
            problems.append(f"{label}:{number}: {where}: {first.get('msg')}")
    return found, problems


@dataclass
class JobFiles:
    """Everything the job wrote, read once per refresh."""

    batch: list[Any]
    ranks: dict[int, list[Any]]
    preflight: dict[int, dict[str, Any]]
    resubmit_request: dict[str, Any] | None
    cancel_requested: bool
    problems: list[str] = field(default_factory=list)

    @classmethod
    def read(cls, run: RunDir) -> JobFiles:
        ranks: dict[int, list[Any]] = {}
        preflight: dict[int, dict[str, Any]] = {}
        batch, problems = read_events(layout.batch_events(run.path), BATCH_ADAPTER, BATCH_EVENTS)
        root = run.path / "ranks"
        if root.is_dir():
            for d in sorted(root.iterdir()):
                if not d.name.isdigit():
                    continue
                rank = int(d.name)
                ranks[rank], bad = read_events(layout.rank_events(run.path, rank), RANK_ADAPTER,
                                               f"ranks/{rank}/{layout.RANK_EVENTS}")
                problems += bad
                checks = read_json(layout.preflight_result(run.path, rank))
                if checks is not None:
                    preflight[rank] = checks
        return cls(batch=batch, ranks=ranks, preflight=preflight, resubmit_request=read_json(run.path / RESUBMIT_REQUEST),
                   cancel_requested=(run.path / CANCEL_REQUEST).exists(), problems=problems[:MAX_PROBLEMS])

    def starts(self) -> list[ev.BatchStart]:
        return [e for e in self.batch if isinstance(e, ev.BatchStart)]

    def latest_start(self) -> ev.BatchStart | None:
        starts = self.starts()
        return starts[-1] if starts else None

    def ends(self) -> list[ev.End]:
        return [e for e in self.batch if isinstance(e, ev.End)]


@dataclass
class LogFacts:
    """Read from train.log incrementally: per restart, the checkpoint it resumed from and its last step."""

    offset: int = 0
    restart: int = 0
    resumed: dict[int, int] = field(default_factory=dict)
    last_step: dict[int, int] = field(default_factory=dict)
    # srun's first "task N: ..." error of each restart: the rank srun saw fail first
    srun_first_error: dict[int, dict[str, Any]] = field(default_factory=dict)

    inode: int = 0  # of the train.log the offset belongs to (a replaced log is read again from its start)

    @classmethod
    def from_data(cls, data: Any) -> LogFacts:
        """From what ``as_dict`` wrote; malformed data (the file is anyone's who can write the run
        directory) starts over from the log's beginning, which is always right, only slower."""
        try:
            return cls(offset=int(data["offset"]), restart=int(data["restart"]), inode=int(data.get("inode", 0)),
                       resumed={int(k): int(v) for k, v in data["resumed"].items()},
                       last_step={int(k): int(v) for k, v in data["last_step"].items()},
                       srun_first_error={int(k): {"node": str(v["node"]), "rank": int(v["rank"]), "what": str(v["what"])}
                                         for k, v in data["srun_first_error"].items()})
        except (KeyError, TypeError, ValueError, AttributeError):
            return cls()

    def as_dict(self) -> dict[str, Any]:
        return {"offset": self.offset, "inode": self.inode, "restart": self.restart, "resumed": self.resumed,
                "last_step": self.last_step, "srun_first_error": self.srun_first_error}

    @classmethod
    def of_run(cls, run: RunDir) -> LogFacts:
        """The facts of the run's train.log so far: from its private cursor file, brought up to date
        with what was appended since, and saved again (a derived cache, never the record; a run
        directory this user cannot write is read from the start each time)."""
        facts = cls.from_data(read_json(run.log_cursor))
        before = facts.offset
        facts.update(run.log)
        if facts.offset != before:
            with contextlib.suppress(OSError):
                write_atomic(run.log_cursor, json.dumps(facts.as_dict()) + "\n", mode=0o600)
        return facts

    def update(self, log: Path) -> None:
        try:
            with open_regular(log) as fh:  # a FIFO in the log's place must not hang `mxc runs`
                info = os.fstat(fh.fileno())
                if info.st_ino != self.inode or info.st_size < self.offset:  # another file: read it from its start
                    fresh = LogFacts(inode=info.st_ino)
                    self.__dict__.update(fresh.__dict__)
                fh.seek(self.offset)
                data = fh.read(1 << 26)
        except OSError:
            return
        end = data.rfind(b"\n") + 1  # only whole lines; the rest is read next time
        for raw in data[:end].decode("utf-8", errors="replace").splitlines():
            if match := _BATCH_START.search(raw):
                self.restart = int(match[1])
            elif match := RESTORE_LINE.search(raw):
                self.resumed[self.restart] = int(match[1])
            elif (match := _SRUN_TASK_ERROR.match(raw)) and self.restart not in self.srun_first_error:
                self.srun_first_error[self.restart] = {"node": match[1], "rank": int(match[2]), "what": match[3]}
            elif match := STEP_PREFIX.search(raw):
                step = int(match[1])
                self.last_step[self.restart] = max(step, self.last_step.get(self.restart, -1))
        self.offset += end


def _requeue_entry(decision: ev.Decision, done: ev.Requeue | None) -> Requeue:
    """A decision as the record's ``requeue`` shows it: action requeued / resubmit_requested /
    requeue_failed (how a requeue went), refused (the policy said stop) or none (done)."""
    if decision.action == policy.REQUEUE:
        action = done.action if done is not None else "requeue_pending"
        why = done.why if done is not None and done.action != "requeued" else decision.reason
    else:
        action, why = ("refused" if decision.action == policy.STOP else "none"), decision.reason
    return Requeue(cause=decision.cause, action=action, why=why or None, checkpoint=decision.checkpoint)


def _reason(entry: Requeue) -> str:
    cause, why = entry.cause, entry.why
    return {
        "requeued": f"{cause}: requeued after checkpoint {entry.checkpoint if entry.checkpoint is not None else 'none'}",
        "resubmit_requested": f"{cause}: resubmit requested ({why})",
        "requeue_failed": f"{cause}: requeue failed ({why})",
        "refused": f"{cause}: not requeued ({why})",
        "none": f"{cause}: nothing to requeue ({why})",
    }.get(entry.action, f"{cause}: {why}")


def attempts(files: JobFiles, log: LogFacts, history: dict[str, list[str]]) -> list[Attempt]:
    """One attempt per start of the batch side, with how it ended.

    A start followed by another start without an end was cut short by Slurm itself (node
    failure, preemption, ``scontrol requeue``): ``history`` (job id -> the state each run of
    that job ended in, from sacct) names it where the cluster keeps that record.
    """
    out: list[Attempt] = []
    runs_of_job: dict[str, int] = {}
    decision: ev.Decision | None = None
    for event in files.batch:
        if isinstance(event, ev.BatchStart | ev.Refused):
            n = runs_of_job.get(event.job_id, 0)
            runs_of_job[event.job_id] = n + 1
            attempt = Attempt(number=event.attempt, started=iso_time(event.time) or "", job_id=event.job_id,
                              run_of_job=n)
            if isinstance(event, ev.BatchStart):
                attempt.nodes = event.nodes
                attempt.coordinator = event.coordinator
                attempt.resumed_from_step = log.resumed.get(event.attempt)
                attempt.last_step = log.last_step.get(event.attempt)
            else:
                attempt.ended, attempt.exit_code, attempt.reason = attempt.started, 1, event.why
            out.append(attempt)
            decision = None
            continue
        if not out:
            continue
        current = out[-1]
        if isinstance(event, ev.SignalReceived):
            current.signal = event.signal
            current.cause = event.cause
        elif isinstance(event, ev.Decision):
            decision = event
            current.decision = Decision(cause=event.cause, action=event.action, reason=event.reason, rank=event.rank,
                                        node=event.node, detail=event.detail)
            if event.cause != policy.COMPLETED:
                current.requeue = _requeue_entry(event, None)
                current.reason = _reason(current.requeue)
            if event.action != policy.REQUEUE:
                current.ended = iso_time(event.time)
        elif isinstance(event, ev.Requeue) and decision is not None:
            current.requeue = _requeue_entry(decision, event)
            current.reason = _reason(current.requeue)
            if event.action != "requeued":
                current.ended = iso_time(event.time)
        elif isinstance(event, ev.End):
            current.ended = iso_time(event.time)
            current.exit_code = event.rc
            if current.exit_code and not current.reason:
                current.reason = f"exit {current.exit_code}"
        elif isinstance(event, ev.Terminated):
            current.ended = iso_time(event.time)
            current.exit_code = 143
            current.reason = current.reason or "SIGTERM (scancel, time limit, or preemption without a user signal)"
    why = {"NODE_FAIL": "node failure", "PREEMPTED": "preemption", "PENDING": "requeued (scontrol requeue)",
           "REQUEUED": "requeued (scontrol requeue)"}
    for i, attempt in enumerate(out[:-1]):
        ours = attempt.requeue is not None and attempt.requeue.action == "requeued"
        if ours or attempt.job_id != out[i + 1].job_id:
            attempt.ended = attempt.ended or out[i + 1].started
            continue
        # The same job started again without requeueing itself: Slurm requeued it.
        states = history.get(attempt.job_id or "", [])
        n = attempt.run_of_job or 0
        slurm_state = states[n] if n < len(states) else None
        attempt.ended = attempt.ended or out[i + 1].started
        attempt.reason = (f"Slurm requeued the job: {why.get(slurm_state or '', slurm_state)}" if slurm_state
                          else "Slurm requeued the job (node failure, preemption or scontrol requeue)")
        attempt.slurm_state = slurm_state
    return out


def first_failure(files: JobFiles, log: LogFacts, restart: int) -> FirstFailure | None:
    """The rank that died first in an attempt.

    Once the job has decided on the attempt, the rank its decision names: that is the rank its
    restart and its alerts were about, so the record never names another one (two ranks failing
    within milliseconds can be ordered differently by srun and by their exit events). Before
    that, srun's first "task N: ..." error names it (with --kill-on-bad-exit, that failure is what
    brought the others down); the rank's own exit event adds the stage, the cause and whether it
    timed out. Without an srun line, the earliest failing exit event; without one either, a rank
    that started and never recorded an exit (killed outright).
    """
    started: dict[int, ev.RankStart] = {}
    exits: dict[int, ev.RankExit] = {}
    for rank, events in files.ranks.items():
        for e in events:
            if e.attempt != restart:
                continue
            if isinstance(e, ev.RankStart):
                started[rank] = e
            elif isinstance(e, ev.RankExit):
                exits[rank] = e
    srun = log.srun_first_error.get(restart)
    decided = next((e for e in reversed(files.batch)
                    if isinstance(e, ev.Decision) and e.attempt == restart and e.rank is not None), None)
    if decided is not None and decided.rank is not None:
        said = str(srun["what"]) if srun is not None and int(srun["rank"]) == decided.rank else None
        if decided.rank in exits:
            return _failure(exits[decided.rank], said)
        return FirstFailure(rank=decided.rank, node=decided.node, cause=decided.cause, srun=said,
                            why=decided.detail or "no exit recorded: killed outright (SIGKILL, OOM killer or node "
                                                  "failure)")
    failed = sorted((e for e in exits.values() if e.rc != 0 and e.cause != policy.CANCELLED), key=lambda e: e.time)
    if srun is not None:
        rank = int(srun["rank"])
        exit_event = exits.get(rank)
        if exit_event is None:
            return FirstFailure(rank=rank, node=str(srun["node"]), cause=policy.KILLED, srun=str(srun["what"]),
                                why=f"{srun['what']} (no exit recorded: killed outright, e.g. SIGKILL, OOM killer, "
                                    "node failure)")
        return _failure(exit_event, str(srun["what"]))
    if failed:
        return _failure(failed[0], None)
    vanished = sorted(r for r in started if r not in exits)
    if vanished:
        rank = vanished[0]
        return FirstFailure(rank=rank, node=started[rank].node, cause=policy.KILLED,
                            why="no exit recorded: killed outright (SIGKILL, OOM killer or node failure)")
    return None


def _failure(event: ev.RankExit, srun: str | None) -> FirstFailure | None:
    if event.rc == 0:
        return None
    if event.cause == policy.HANG:
        why = f"training hung ({event.detail})"
    elif event.timed_out:
        limit = "image" if event.stage == "barrier" else event.stage
        why = f"stage {event.stage} timed out (runtime.timeouts.{limit})"
    elif event.stage == "preflight":
        why = "preflight failed"
    elif event.cause == policy.INFRASTRUCTURE:
        why = f"infrastructure failure: {event.detail}"
    else:
        sig = _signal_name(event.rc)
        why = f"stage {event.stage} failed with exit {event.rc}" + (f" ({sig})" if sig else "")
    return FirstFailure(rank=event.rank, node=event.node, stage=event.stage, rc=event.rc, cause=event.cause,
                        timed_out=event.timed_out, why=why, srun=srun,
                        detail=event.detail if event.detail and event.cause != policy.HANG else None)


def _signal_name(rc: int) -> str | None:
    if 128 < rc < 160:
        try:
            return signal.Signals(rc - 128).name
        except ValueError:
            return None
    return None


def preflight_summary(files: JobFiles) -> dict[str, dict[str, Any]]:
    """Per rank (as text keys, JSON-friendly) the latest preflight result; failed checks listed."""
    out: dict[str, dict[str, Any]] = {}
    for rank, result in sorted(files.preflight.items()):
        checks = result.get("checks", [])
        failed = [f"{c.get('check')}: {c.get('detail')}" for c in checks if isinstance(c, dict) and c.get("status") == "fail"]
        out[str(rank)] = {**result, "failed": failed}
    return out


def failure_message(failure: FirstFailure, preflight: dict[str, dict[str, Any]]) -> str:
    where = f"rank {failure.rank} ({failure.node})"
    if failure.stage == "preflight":
        failed = preflight.get(str(failure.rank), {}).get("failed") or []
        return f"{where} failed first: preflight: " + ("; ".join(failed) or f"exit {failure.rc}")
    return f"{where} failed first: {failure.why}"


def apply(record: RunRecord, files: JobFiles, log: LogFacts, history: dict[str, list[str]]) -> None:
    """Fold the job's files into the record (attempts, restarts, preflight, first failure, decisions)."""
    record.attempts = attempts(files, log, history)
    start = files.latest_start()
    slurm = record.slurm or SlurmState()
    begun = [e for e in files.batch if isinstance(e, ev.BatchStart | ev.Refused)]
    if begun:  # SLURM_RESTART_COUNT of the latest start lands here, as do mxc's resubmissions
        record.restarts = begun[-1].attempt
        slurm.restart_count = begun[-1].slurm_restart_count
        slurm.resubmits = begun[-1].resubmits
    if start is not None:
        slurm.coordinator = start.coordinator
        slurm.batch_host = start.batch_host
        slurm.node_list = start.nodes
        slurm.num_nodes = start.num_nodes
        if start.partition:
            slurm.partition = start.partition
    slurm.requeues = [RequeueEntry(job_id=a.job_id, restart=a.number, **a.requeue.model_dump())
                      for a in record.attempts if a.requeue is not None and a.requeue.cause in policy.REQUEUE_CAUSES]
    slurm.invalid_events = list(files.problems)
    preflight = preflight_summary(files)
    if preflight:
        record.preflight = preflight
    restart = record.restarts
    failure = first_failure(files, log, restart)
    slurm.first_failure = failure
    record.slurm = slurm
    refused = [e for e in files.batch if isinstance(e, ev.Refused) and e.attempt == restart]
    last = record.attempts[-1] if record.attempts else None
    decided = last.decision if last is not None else None
    if refused:
        record.message = refused[-1].why
    elif decided is not None and decided.action == policy.STOP and decided.rank is not None and failure is not None:
        record.message = f"{failure_message(failure, preflight)}; not requeued: {decided.reason}"
    elif decided is not None and decided.action == policy.STOP and last is not None:
        record.message = last.reason
    elif failure is not None:
        record.message = failure_message(failure, preflight)


def observability(run: RunDir) -> dict[str, Any] | None:
    """``record.observability`` of a Slurm run: every node observer's status, Prometheus' where it ran."""
    nodes = {}
    for path in sorted((run.path / "observability").glob(NODE_STATUS.format(node="*"))):
        status = read_json(path)
        if status is not None:
            nodes[path.stem.removeprefix("node-")] = status
    if not nodes:
        return None
    first = next((n for n in nodes.values() if "prometheus" in n), next(iter(nodes.values())))
    return {"scrape_interval": first.get("scrape_interval"), "tsdb": str(run.tsdb / "data"),
            "prometheus": first.get("prometheus", {}), "nodes": nodes,
            "errors": [f"{name}: {e}" for name, n in nodes.items() for e in n.get("errors", [])]}
