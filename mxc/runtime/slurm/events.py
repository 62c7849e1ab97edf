"""What a Slurm job wrote into its run directory, folded into the run record.

The job runs on compute nodes without mxc, so it leaves plain files (see docs/slurm.md):

* ``batch.jsonl``: the batch shell's events (start of each attempt with restart count,
  nodes and coordinator; the USR2 signal and its cause; requeue decisions; the end).
* ``ranks/<rank>/events.jsonl``: each rank's start and exit, with the stage it exited in.
* ``ranks/<rank>/preflight.json``: the node checks of the latest attempt.

Each ``mxc`` command that looks at a live Slurm run reads them again (they are small) and
derives attempts, restarts, which rank died first, and the message of a failure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mxc.fsutil import open_regular, read_json, read_jsonl
from mxc.runtime.record import Attempt, RunRecord, iso_time
from mxc.runtime.rundir import RunDir
from mxc.runtime.trainlog import RESTORE_LINE, STEP_PREFIX

BATCH_EVENTS = "batch.jsonl"
RESUBMIT_REQUEST = "resubmit.request"
CANCEL_REQUEST = "cancel.request"
NODE_STATUS = "node-{node}.json"  # observability/, written by mxc/runtime/observe/node_observer.py on each node

_BATCH_START = re.compile(r"\[mxc batch \d+\] nodes .* restart (\d+) of at most")
_SRUN_TASK_ERROR = re.compile(r"^srun: error: (\S+): tasks? (\d+)(?:-\d+)?: (.+)$")


@dataclass
class JobFiles:
    """Everything the job wrote, read once per refresh."""

    batch: list[dict[str, Any]]
    ranks: dict[int, list[dict[str, Any]]]
    preflight: dict[int, dict[str, Any]]
    resubmit_request: dict[str, Any] | None
    cancel_requested: bool

    @classmethod
    def read(cls, run: RunDir) -> JobFiles:
        ranks: dict[int, list[dict[str, Any]]] = {}
        preflight: dict[int, dict[str, Any]] = {}
        root = run.path / "ranks"
        if root.is_dir():
            for d in root.iterdir():
                if not d.name.isdigit():
                    continue
                ranks[int(d.name)] = read_jsonl(d / "events.jsonl")
                checks = read_json(d / "preflight.json")
                if checks is not None:
                    preflight[int(d.name)] = checks
        return cls(batch=read_jsonl(run.path / BATCH_EVENTS), ranks=ranks, preflight=preflight,
                   resubmit_request=read_json(run.path / RESUBMIT_REQUEST),
                   cancel_requested=(run.path / CANCEL_REQUEST).exists())

    def latest_start(self) -> dict[str, Any] | None:
        starts = [e for e in self.batch if e.get("event") == "start"]
        return starts[-1] if starts else None


@dataclass
class LogFacts:
    """Read from train.log incrementally: per restart, the checkpoint it resumed from and its last step."""

    offset: int = 0
    restart: int = 0
    resumed: dict[int, int] = field(default_factory=dict)
    last_step: dict[int, int] = field(default_factory=dict)
    # srun's first "task N: ..." error of each restart: the rank srun saw fail first
    srun_first_error: dict[int, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def from_record(cls, data: dict[str, Any] | None) -> LogFacts:
        data = data or {}
        return cls(offset=int(data.get("offset", 0)), restart=int(data.get("restart", 0)),
                   resumed={int(k): int(v) for k, v in data.get("resumed", {}).items()},
                   last_step={int(k): int(v) for k, v in data.get("last_step", {}).items()},
                   srun_first_error={int(k): v for k, v in data.get("srun_first_error", {}).items()})

    def as_dict(self) -> dict[str, Any]:
        return {"offset": self.offset, "restart": self.restart, "resumed": self.resumed, "last_step": self.last_step,
                "srun_first_error": self.srun_first_error}

    def update(self, log: Path) -> None:
        try:
            with open_regular(log) as fh:  # a FIFO in the log's place must not hang `mxc runs`
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


def attempts(files: JobFiles, log: LogFacts, history: dict[str, list[str]]) -> list[Attempt]:
    """One attempt per start of the batch script, with how it ended.

    A start followed by another start without an end was cut short by Slurm itself (node
    failure, preemption, ``scontrol requeue``): ``history`` (job id -> the state each run of
    that job ended in, from sacct) names it where the cluster keeps that record.
    """
    out: list[Attempt] = []
    runs_of_job: dict[str, int] = {}
    for event in files.batch:
        kind = event.get("event")
        job = str(event.get("job_id", ""))
        if kind in ("start", "refused"):
            n = runs_of_job.get(job, 0)
            runs_of_job[job] = n + 1
            restart = int(event.get("restart", 0))
            attempt = Attempt(number=restart, started=iso_time(event.get("time")) or "")
            attempt.job_id = job  # type: ignore[attr-defined]
            attempt.run_of_job = n  # type: ignore[attr-defined]
            if kind == "start":
                attempt.nodes = event.get("nodes")  # type: ignore[attr-defined]
                attempt.coordinator = event.get("coordinator")  # type: ignore[attr-defined]
                attempt.resumed_from_step = log.resumed.get(restart)
                attempt.last_step = log.last_step.get(restart)
            else:
                attempt.ended, attempt.exit_code, attempt.reason = attempt.started, 1, str(event.get("why"))
            out.append(attempt)
            continue
        if not out:
            continue
        current = out[-1]
        if kind == "signal":
            current.signal = str(event.get("signal"))
            current.cause = event.get("cause")  # type: ignore[attr-defined]
        elif kind == "requeue":
            action = event.get("action")
            current.requeue = {k: event.get(k) for k in ("cause", "action", "why", "checkpoint")  # type: ignore[attr-defined]
                               if event.get(k) not in (None, "")}
            current.reason = {
                "requeued": f"{event.get('cause')}: requeued after checkpoint {event.get('checkpoint') or 'none'}",
                "resubmit_requested": f"{event.get('cause')}: resubmit requested ({event.get('why')})",
                "refused": f"{event.get('cause')}: not requeued ({event.get('why')})",
                "none": f"{event.get('cause')}: nothing to requeue ({event.get('why')})",
            }.get(str(action), current.reason)
            if action != "requeued":
                current.ended = iso_time(event.get("time"))
        elif kind == "end":
            current.ended = iso_time(event.get("time"))
            current.exit_code = int(event.get("rc", 0))
            if current.exit_code and not current.reason:
                current.reason = f"exit {current.exit_code}"
        elif kind == "terminated":
            current.ended = iso_time(event.get("time"))
            current.exit_code = 143
            current.reason = current.reason or "SIGTERM (scancel, time limit, or preemption without a user signal)"
    why = {"NODE_FAIL": "node failure", "PREEMPTED": "preemption", "PENDING": "requeued (scontrol requeue)",
           "REQUEUED": "requeued (scontrol requeue)"}
    for i, attempt in enumerate(out[:-1]):
        job = str(getattr(attempt, "job_id", ""))
        ours = getattr(attempt, "requeue", {}).get("action") == "requeued"
        if ours or job != str(getattr(out[i + 1], "job_id", "")):
            attempt.ended = attempt.ended or out[i + 1].started
            continue
        # The same job started again without requeueing itself: Slurm requeued it.
        states = history.get(job, [])
        n = int(getattr(attempt, "run_of_job", 0))
        slurm_state = states[n] if n < len(states) else None
        attempt.ended = attempt.ended or out[i + 1].started
        attempt.reason = (f"Slurm requeued the job: {why.get(slurm_state or '', slurm_state)}" if slurm_state
                          else "Slurm requeued the job (node failure, preemption or scontrol requeue)")
        if slurm_state:
            attempt.slurm_state = slurm_state  # type: ignore[attr-defined]
    return out


def first_failure(files: JobFiles, log: LogFacts, restart: int) -> dict[str, Any] | None:
    """The rank that died first in an attempt.

    srun's first "task N: ..." error names it (with --kill-on-bad-exit, that failure is what
    brought the others down); the rank's own exit event adds the stage and whether it timed
    out. Without an srun line, the earliest non-zero exit event; without one either, a rank
    that started and never recorded an exit (killed outright).
    """
    started: dict[int, dict[str, Any]] = {}
    exits: dict[int, dict[str, Any]] = {}
    for rank, events in files.ranks.items():
        for e in events:
            if int(e.get("attempt", -1)) != restart:
                continue
            if e.get("event") == "start":
                started[rank] = e
            elif e.get("event") == "exit":
                exits[rank] = e
    srun = log.srun_first_error.get(restart)
    failed = sorted((e for e in exits.values() if int(e.get("rc", 0)) != 0), key=lambda e: float(e.get("time", 0)))
    if srun is not None:
        rank = int(srun["rank"])
        exit_event = exits.get(rank)
        if exit_event is None:
            return {"rank": rank, "node": srun["node"], "stage": None, "rc": None, "srun": srun["what"],
                    "why": f"{srun['what']} (no exit recorded: killed outright, e.g. SIGKILL, OOM killer, node failure)"}
        return _failure(exit_event, srun["what"])
    if failed:
        return _failure(failed[0], None)
    vanished = sorted(r for r in started if r not in exits)
    if vanished:
        rank = vanished[0]
        return {"rank": rank, "node": started[rank].get("node"), "stage": None, "rc": None,
                "why": "no exit recorded: killed outright (SIGKILL, OOM killer or node failure)"}
    return None


def _failure(event: dict[str, Any], srun: str | None) -> dict[str, Any] | None:
    stage = str(event.get("stage"))
    rc = int(event.get("rc", 0))
    if rc == 0:
        return None
    if event.get("timed_out") is True:
        why = f"stage {stage} timed out (runtime.timeouts.{stage})"
    elif stage == "preflight":
        why = "preflight failed"
    else:
        why = f"stage {stage} failed with exit {rc}" + (f" ({_signal_name(rc)})" if _signal_name(rc) else "")
    out = {"rank": int(event.get("rank", -1)), "node": event.get("node"), "stage": stage, "rc": rc,
           "timed_out": event.get("timed_out") is True, "why": why}
    if srun:
        out["srun"] = srun
    return out


def _signal_name(rc: int) -> str | None:
    import signal

    if 128 < rc < 160:
        try:
            return signal.Signals(rc - 128).name
        except ValueError:
            return None
    return None


def preflight_summary(files: JobFiles) -> dict[str, Any]:
    """Per rank (as text keys, JSON-friendly) the latest preflight result; failed checks listed."""
    out: dict[str, Any] = {}
    for rank, result in sorted(files.preflight.items()):
        failed = [f"{c.get('check')}: {c.get('detail')}" for c in result.get("checks", []) if c.get("status") == "fail"]
        out[str(rank)] = {**result, "failed": failed}
    return out


def failure_message(failure: dict[str, Any], preflight: dict[str, Any]) -> str:
    where = f"rank {failure['rank']} ({failure.get('node')})"
    if failure.get("stage") == "preflight":
        failed = preflight.get(str(failure["rank"]), {}).get("failed") or []
        return f"{where} failed first: preflight: " + ("; ".join(failed) or f"exit {failure.get('rc')}")
    return f"{where} failed first: {failure['why']}"


def apply(record: RunRecord, files: JobFiles, log: LogFacts, history: dict[str, list[str]]) -> None:
    """Fold the job's files into the record (attempts, restarts, preflight, first failure)."""
    record.attempts = attempts(files, log, history)
    start = files.latest_start()
    slurm = dict(record.slurm or {})
    begun = [e for e in files.batch if e.get("event") in ("start", "refused")]
    if begun:  # SLURM_RESTART_COUNT of the latest start lands here, as do mxc's resubmissions
        record.restarts = int(begun[-1].get("restart", 0))
        slurm["restart_count"] = int(begun[-1].get("slurm_restart_count", 0))
        slurm["resubmits"] = int(begun[-1].get("resubmits", 0))
    if start is not None:
        slurm["coordinator"] = start.get("coordinator")
        slurm["batch_host"] = start.get("batch_host")
        slurm["node_list"] = start.get("nodes")
        slurm["num_nodes"] = start.get("num_nodes")
        if start.get("partition"):
            slurm["partition"] = start.get("partition")
    requeues = [{k: e.get(k) for k in ("job_id", "restart", "cause", "action", "why", "checkpoint") if e.get(k) is not None}
                for e in files.batch if e.get("event") == "requeue"]
    if requeues:
        slurm["requeues"] = requeues
    preflight = preflight_summary(files)
    if preflight:
        record.preflight = preflight  # type: ignore[attr-defined]
    restart = record.restarts
    failure = first_failure(files, log, restart)
    slurm["first_failure"] = failure
    record.slurm = slurm
    refused = [e for e in files.batch if e.get("event") in ("refused",) and int(e.get("restart", -1)) == restart]
    last = record.attempts[-1] if record.attempts else None
    if refused:
        record.message = str(refused[-1].get("why"))
    elif last is not None and getattr(last, "requeue", {}).get("action") in ("refused",):
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
