"""Chat alerts for a run, from the submitting side: start, finish, failure, hang and restart.

How one alert is sent (formats, the secret, allowed destinations, redaction, once-only
bookkeeping in ``notify.sent`` and ``notify.log``) is the node program's mxc/node/notify.py: one
stdlib definition for mxc and the batch side of a Slurm job, which posts its own alerts
(mxc/node/jobreport.py). Here: the messages composed from a run record, ``NotifyObserver`` for
the local supervisor, and ``notify_transition`` for ``mxc watch`` and ``mxc cancel``, which alert
what the job could not (a job killed outright, cancelled outside mxc, vanished from Slurm); the
keys of ``notify.sent`` are the same on both sides, so nothing goes out twice.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from mxc.node import notify as node_notify
from mxc.node.notify import NotifyConfig, SendResult, redact, send
from mxc.runtime.hooks import TrainingProcess
from mxc.runtime.record import RunRecord, parse_time
from mxc.runtime.rundir import RunDir

__all__ = ["NotifyConfig", "SendResult", "redact", "send"]  # re-exported: one definition (mxc/node/notify.py)


# ---- messages


def _duration(record: RunRecord) -> str:
    start, end = parse_time(record.started), parse_time(record.ended) if record.ended else datetime.now(UTC)
    if start is None or end is None:
        return ""
    seconds = int((end - start).total_seconds())
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def _triage_line(run: RunDir, record: RunRecord) -> str:
    """One line from `mxc triage` for failure alerts (best effort: never fails the alert)."""
    try:
        from mxc.runtime.triage import classify

        verdict = classify(run.path, record)
    except Exception:
        return ""
    if verdict.cause in ("none", "unknown"):
        return ""
    where = f" on rank {verdict.rank}" if verdict.rank is not None else ""
    where += f" ({verdict.node})" if verdict.node else ""
    first = f"\nfirst error: {verdict.first_error.text[:300]}" if verdict.first_error else ""
    return f"\ncause: {verdict.title}{where}{first}"


def message(event: str, run: RunDir, record: RunRecord) -> str:
    host = os.uname().nodename
    name = f"run {record.run_id} ({record.spec_name})"
    if event == "start":
        return f"mxc: {name} started on {record.backend} ({host}), bundle {record.bundle[:12]}"
    steps = f", {record.steps} steps" if record.steps is not None else ""
    loss = f", last loss {record.last_loss:.4f}" if record.last_loss is not None else ""
    took = _duration(record)
    if event == "finish":
        return f"mxc: {name} succeeded{steps}{loss} in {took}"
    if event == "restart":
        attempts = record.attempts
        last = attempts[-1] if attempts else None
        before = attempts[-2] if len(attempts) > 1 else None
        why = f" after {before.reason}" if before and before.reason else ""
        resume = f", resuming from checkpoint {last.resumed_from_step}" if last and last.resumed_from_step is not None else ""
        return f"mxc: {name} restarting (restart {record.restarts}){why}{resume}"
    code = f" (exit {record.exit_code})" if record.exit_code not in (None, 0) else ""
    what = "hung" if event == "hang" else record.status
    text = f"mxc: {name} {what}{code}{steps}{loss} after {took}"
    if record.message:
        text += f"\n{record.message}"
    return text + _triage_line(run, record)


def hung_attempt(run: RunDir, number: int) -> bool:
    """Whether the node program's hang watch stopped attempt ``number`` (a ``hang`` event of a rank)."""
    from mxc.node import events as node_events

    for path in sorted(run.path.glob("ranks/*/events.jsonl")):
        found, _ = node_events.read(path, node_events.RANK_EVENTS)
        if any(isinstance(e, node_events.HangDetected) and e.attempt == number for e in found):
            return True
    return False


def end_event(record: RunRecord) -> str:
    if record.status == "succeeded":
        return "finish"
    return "hang" if record.status == "hung" else "failure"


# ---- delivery (once-only bookkeeping and the log: mxc/node/notify.py)


def deliver(config: NotifyConfig, event: str, run: RunDir, record: RunRecord, key: str | None = None,
            env: Mapping[str, str] | None = None) -> SendResult | None:
    """Send ``event`` if the spec asks for it and it was not sent before (by mxc or by the job); log the outcome."""
    if event not in config.events:
        return None
    try:
        text = message(event, run, record)
    except Exception as exc:
        text = f"mxc: run {record.run_id} {event} ({type(exc).__name__} while composing the message)"
    return node_notify.deliver(config, event, run.path, text, key, env)


class NotifyObserver:
    """A ``RunObserver`` for the local supervisor: alerts at start, restart and end."""

    def __init__(self, config: NotifyConfig, env: Mapping[str, str] | None = None) -> None:
        self.config = config
        self.env = dict(os.environ if env is None else env)

    def on_start(self, run: RunDir, record: RunRecord) -> None:
        deliver(self.config, "start", run, record, env=self.env)

    def on_attempt(self, run: RunDir, record: RunRecord, process: TrainingProcess) -> None:
        number = record.attempts[-1].number if record.attempts else 0
        if number > 0:
            deliver(self.config, "restart", run, record, key=f"restart:{number}", env=self.env)

    def on_attempt_end(self, run: RunDir, record: RunRecord, exit_code: int) -> None:
        """A hang alert when the hang watch stopped this attempt (other failures are alerted by
        the restart that follows, or at the end)."""
        number = record.attempts[-1].number if record.attempts else 0
        if exit_code != 0 and hung_attempt(run, number):
            deliver(self.config, "hang", run, record, key=f"hang:{number}", env=self.env)

    def on_end(self, run: RunDir, record: RunRecord) -> None:
        deliver(self.config, end_event(record), run, record, key="end", env=self.env)


def observers(spec: Mapping[str, Any]) -> list[NotifyObserver]:
    """The observers a run of ``spec`` needs: one when the spec has a ``notify`` section."""
    config = NotifyConfig.from_spec(spec)
    return [NotifyObserver(config)] if config else []


def notify_transition(spec: Mapping[str, Any], run: RunDir, before: RunRecord | None, after: RunRecord) -> None:
    """For runs no mxc process follows (Slurm): alert on what changed between two reads of the record."""
    config = NotifyConfig.from_spec(spec)
    if config is None:
        return
    if after.status in ("running", "succeeded", "failed", "hung") and (before is None or before.status in
                                                                        ("submitted", "queued", "starting")):
        deliver(config, "start", run, after)
    if before is not None and after.restarts > before.restarts:
        deliver(config, "restart", run, after, key=f"restart:{after.restarts}")
    if after.final and (before is None or not before.final):
        deliver(config, end_event(after), run, after, key="end")


def probe_message(spec: Mapping[str, Any], config: NotifyConfig) -> str:
    """The text `mxc notify test` sends."""
    return (f"mxc: test alert for spec {spec.get('name')} from {socket.gethostname()} "
            f"({datetime.now(UTC).isoformat(timespec='seconds')}); alerts go out on: {', '.join(config.events)}")
