"""Chat alerts for a run: start, finish, failure, hang and restart, posted to a webhook.

Formats: Slack and Mattermost incoming webhooks (JSON ``{"text": ...}`` to the webhook URL)
and the Telegram Bot API (``sendMessage`` with the bot token in the URL path). The webhook
URL or bot token is a secret: the spec only names the environment variable or file holding
it (``notify.secret_env`` / ``notify.secret_file``), it is read when an alert is sent, and it
never reaches a bundle, the record or a log (everything reported is redacted in every form
the secret can take: mxc/runtime/secret_forms.py). It is sent only if it has the shape of the
format's secret and only to an allowed destination (mxc/compiler/notify_policy.py), checked
here, where the request is built; redirects are not followed. A failed alert never fails the
run: every send has a timeout, and errors end up in ``notify.log`` in the run directory.

Local runs send through ``NotifyObserver`` (a ``RunObserver`` of the supervisor). Runs that no
mxc process follows (Slurm) can call ``notify_transition`` whenever their record is refreshed;
``notify.sent`` in the run directory makes each event go out once.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mxc.compiler import notify_policy
from mxc.compiler.secretscan import redact_secrets
from mxc.runtime.hooks import TrainingProcess
from mxc.runtime.record import RunRecord, parse_time
from mxc.runtime.rundir import RunDir
from mxc.runtime.secret_forms import Redactor

EVENTS = ("start", "finish", "failure", "hang", "restart")
NOTIFY_LOG = "notify.log"
SENT = "notify.sent"
MAX_TEXT = 3500  # Telegram allows 4096 characters; Slack and Mattermost more
MAX_ERROR = 400  # characters of a failure's explanation kept (a server's error page can be long)


class SecretMissing(Exception):
    """The variable or file the spec names is not there, or not safe to read (the message never holds the secret)."""


class Refused(ValueError):
    """The secret or the destination is not allowed: nothing was sent (the message never holds the secret)."""


@dataclass(frozen=True)
class NotifyConfig:
    format: str
    secret_env: str | None = None
    secret_file: str | None = None
    chat_id: str | None = None
    api_url: str = "https://api.telegram.org"
    events: tuple[str, ...] = EVENTS
    timeout: float = 5.0

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> NotifyConfig | None:
        """The spec's ``notify`` section (spec.json of a bundle), or None when it has none."""
        section = spec.get("notify")
        if not section:
            return None
        return cls(
            format=str(section["format"]), secret_env=section.get("secret_env"), secret_file=section.get("secret_file"),
            chat_id=None if section.get("chat_id") is None else str(section["chat_id"]),
            api_url=str(section.get("api_url") or "https://api.telegram.org").rstrip("/"),
            events=tuple(section.get("events") or EVENTS), timeout=float(section.get("timeout", 5.0)),
        )

    def where(self) -> str:
        """Where the secret comes from, for messages (never the secret)."""
        return f"${self.secret_env}" if self.secret_env else f"file {self.secret_file}"


@dataclass(frozen=True)
class SendResult:
    ok: bool
    status: int | None = None
    error: str | None = None

    def __str__(self) -> str:
        if self.ok:
            return f"sent (HTTP {self.status})"
        return f"failed: {self.error}" + (f" (HTTP {self.status})" if self.status else "")


def read_secret(config: NotifyConfig, env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    if config.secret_env:
        value = env.get(config.secret_env, "").strip()
        if not value:
            raise SecretMissing(f"environment variable {config.secret_env} (notify.secret_env) is not set")
        return value
    assert config.secret_file
    return _read_secret_file(Path(config.secret_file).expanduser())


def _read_secret_file(path: Path) -> str:
    """The secret in ``path``: a regular file of this user that only this user may read (mode 600, as ssh
    wants of a key), at most MAX_SECRET_BYTES. Opened without blocking, so a FIFO cannot hang an alert."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise SecretMissing(f"cannot read {path} (notify.secret_file): {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SecretMissing(f"{path} (notify.secret_file) is not a regular file")
        if info.st_uid != os.getuid():
            raise SecretMissing(f"{path} (notify.secret_file) is not owned by you (uid {os.getuid()})")
        if info.st_mode & 0o077:
            raise SecretMissing(f"{path} (notify.secret_file) can be read or written by others "
                                f"(mode {stat.S_IMODE(info.st_mode):03o}): chmod 600 {path}")
        data = os.read(fd, notify_policy.MAX_SECRET_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > notify_policy.MAX_SECRET_BYTES:
        raise SecretMissing(f"{path} (notify.secret_file) is larger than {notify_policy.MAX_SECRET_BYTES} bytes: "
                            "not a webhook URL or bot token")
    value = data.decode("utf-8", "replace").strip()
    if not value:
        raise SecretMissing(f"{path} (notify.secret_file) is empty")
    return value


def redact(text: str, secret: str, fmt: str | None = None) -> str:
    """The text with the secret, in every form and part it can take (secret_forms.py), replaced by ***."""
    return Redactor(secret, fmt)(text)


def build_request(config: NotifyConfig, secret: str, text: str, allowed: str | None = None) -> tuple[str, bytes]:
    """(URL, JSON body) for one message in the configured format.

    Refuses (``Refused``) a secret without the format's shape and a destination that is not the
    format's official API, a Mattermost webhook, or under a URL of ``$MXC_NOTIFY_ALLOWED_URLS``
    (``allowed``): this is the one place requests are addressed, so nothing is ever sent elsewhere.
    """
    where = config.where()
    problem = notify_policy.secret_problem(config.format, secret)
    if problem:
        raise Refused(f"the secret in {where} was not sent: {problem}")
    text = text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 3] + "..."
    if config.format == "telegram":
        problem = notify_policy.api_url_problem(config.api_url, allowed)
        if problem:
            raise Refused(f"nothing was sent: {problem}")
        url = f"{config.api_url}/bot{secret}/sendMessage"
        body: dict[str, Any] = {"chat_id": config.chat_id, "text": text, "disable_web_page_preview": True}
    elif config.format == "mattermost":
        url, body = secret, {"text": text, "username": "mxc"}
    else:
        url, body = secret, {"text": text}
    problem = notify_policy.destination_problem(config.format, url, allowed)
    if problem:
        raise Refused(f"the {config.format} URL in {where} is not an allowed destination, nothing was sent: {problem}")
    return url, json.dumps(body).encode("utf-8")


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is a failure: the destination was checked, the server may not pick another one."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> urllib.request.Request | None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


def send(config: NotifyConfig, text: str, env: Mapping[str, str] | None = None) -> SendResult:
    """Post one message. Never raises: every problem is a ``SendResult`` with a redacted error."""
    env = os.environ if env is None else env
    scrub = Redactor("")
    try:
        secret = read_secret(config, env)
        scrub = Redactor(secret, config.format)
        url, body = build_request(config, secret, redact_secrets(text), env.get(notify_policy.ALLOWED_URLS_ENV))
        request = urllib.request.Request(url, data=body, method="POST",
                                         headers={"Content-Type": "application/json", "User-Agent": "mxc-notify"})
        with _OPENER.open(request, timeout=config.timeout) as response:
            status = int(response.status)
            reply = response.read(65536).decode("utf-8", "replace")
        if config.format == "telegram":
            try:
                data = json.loads(reply)
            except ValueError:
                data = {}
            if isinstance(data, dict) and data.get("ok") is False:
                return _failed(scrub, status, str(data.get("description", "Telegram refused the message")))
        return SendResult(True, status)
    except (SecretMissing, Refused) as exc:
        return _failed(scrub, None, str(exc))
    except urllib.error.HTTPError as exc:
        detail = exc.read(65536).decode("utf-8", "replace").strip() if exc.fp else ""
        if 300 <= exc.code < 400:
            detail = "a redirect, not followed (alerts go only to the checked destination)"
        return _failed(scrub, exc.code, f"{exc.reason}" + (f": {detail}" if detail else ""))
    except (urllib.error.URLError, OSError, ValueError, TimeoutError) as exc:
        reason = getattr(exc, "reason", exc)
        return _failed(scrub, None, f"{type(exc).__name__}: {reason}")
    except Exception as exc:  # an alert must never fail the run
        return _failed(scrub, None, f"{type(exc).__name__}: {exc}")


def _failed(scrub: Redactor, status: int | None, error: str) -> SendResult:
    """A failure whose text holds neither this secret (in any form) nor anything shaped like a secret.
    Redacted first, shortened after: cutting first could leave the start of a secret."""
    text = " ".join(redact_secrets(scrub(error)).split())
    return SendResult(False, status, text if len(text) <= MAX_ERROR else text[: MAX_ERROR - 3] + "...")


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


# ---- delivery with a log and once-only bookkeeping


def _log(run: RunDir, line: str) -> None:
    stamp = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    try:
        with open(run.path / NOTIFY_LOG, "a", encoding="utf-8") as fh:
            fh.write(f"{stamp} {line}\n")
    except OSError:
        pass


def _claim(run: RunDir, key: str) -> bool:
    """True the first time ``key`` is claimed for this run (O_APPEND lines; one writer at a time is enough)."""
    path = run.path / SENT
    try:
        if key in path.read_text("utf-8").split():
            return False
    except FileNotFoundError:
        pass
    except OSError:
        return True
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(key + "\n")
    except OSError:
        pass
    return True


def deliver(config: NotifyConfig, event: str, run: RunDir, record: RunRecord, key: str | None = None,
            env: Mapping[str, str] | None = None) -> SendResult | None:
    """Send ``event`` if the spec asks for it and it was not sent before; log the outcome."""
    if event not in config.events:
        return None
    if not _claim(run, key or event):
        return None
    try:
        text = message(event, run, record)
    except Exception as exc:
        text = f"mxc: run {record.run_id} {event} ({type(exc).__name__} while composing the message)"
    result = send(config, text, env)
    _log(run, redact_secrets(f"{event}: {config.format} via {config.where()}: {result}"))
    return result


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
