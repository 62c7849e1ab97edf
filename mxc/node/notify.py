"""Posting one chat alert: the secret read from where the spec names it, checked, sent, redacted.

One definition for both sides: the batch side of a Slurm job (jobreport.py) posts its own alerts
with it, and mxc (mxc/runtime/notify.py) posts those of local runs, ``mxc watch`` and
``mxc notify test``. Formats: Slack and Mattermost incoming webhooks (JSON ``{"text": ...}`` to the
webhook URL) and the Telegram Bot API (``sendMessage``, the bot token in the URL path).

The webhook URL or bot token is a secret: the spec only names the environment variable or the
file holding it (``notify.secret_env`` / ``notify.secret_file``); it is read when an alert is sent
and reaches nothing else (every text reported is redacted in every form the secret can take:
secret_forms.py). It is sent only if it has the format's shape and only to an allowed
destination (notify_policy.py), checked in ``build_request``; redirects are not followed.
``send`` never raises and every request has a timeout: a failed alert never fails a run.
``deliver`` adds the once-only bookkeeping (``notify.sent``) and the log (``notify.log``) that
both sides share, so an event alerted by the job is not alerted again by ``mxc watch``.
"""

from __future__ import annotations

import json
import os
import stat
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from . import notify_policy
from .secret_forms import Redactor
from .secretscan import redact_secrets

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
        """The spec's ``notify`` section (spec.json of a bundle, or run.json's ``notify``), or None."""
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
    return read_secret_file(Path(config.secret_file).expanduser())


def read_secret_file(path: Path) -> str:
    """The secret in ``path``: a regular file of this user that only this user may read (mode 600, as ssh
    wants of a key), at most MAX_SECRET_BYTES. Opened without blocking, so a FIFO cannot hang an alert."""
    try:
        fd = os.open(str(path), os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
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
    body: dict[str, Any]
    if config.format == "telegram":
        problem = notify_policy.api_url_problem(config.api_url, allowed)
        if problem:
            raise Refused(f"nothing was sent: {problem}")
        url = f"{config.api_url}/bot{secret}/sendMessage"
        body = {"chat_id": config.chat_id, "text": text, "disable_web_page_preview": True}
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

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


def send(config: NotifyConfig, text: str, env: Mapping[str, str] | None = None, secret: str | None = None) -> SendResult:
    """Post one message (``secret``: already read, else read now). Never raises: every problem is a
    ``SendResult`` with a redacted error."""
    env = os.environ if env is None else env
    scrub = Redactor("")
    try:
        secret = secret if secret is not None else read_secret(config, env)
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
    except (urllib.error.URLError, OSError, ValueError) as exc:  # TimeoutError is an OSError
        reason = getattr(exc, "reason", exc)
        return _failed(scrub, None, f"{type(exc).__name__}: {reason}")
    except Exception as exc:  # an alert must never fail the run
        return _failed(scrub, None, f"{type(exc).__name__}: {exc}")


def _failed(scrub: Redactor, status: int | None, error: str) -> SendResult:
    """A failure whose text holds neither this secret (in any form) nor anything shaped like a secret.
    Redacted first, shortened after: cutting first could leave the start of a secret. The text comes
    from the server: control and format characters (an ANSI escape sequence that moves the cursor or
    rewrites the terminal's title, a bidi override) are shown escaped (``\\x1b``), never sent to a terminal."""
    text = " ".join(redact_secrets(scrub(error)).split())
    text = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
    return SendResult(False, status, text if len(text) <= MAX_ERROR else text[: MAX_ERROR - 3] + "...")


# ---- once-only bookkeeping and the log, in the run directory (both sides)


def log(run: Path, line: str) -> None:
    """One line in ``notify.log`` (redacted by the caller); a run directory we cannot write is no failure."""
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    try:
        with open(str(run / NOTIFY_LOG), "a", encoding="utf-8") as fh:
            fh.write(f"{stamp} {line}\n")
    except OSError:
        pass


def claim(run: Path, key: str) -> bool:
    """True the first time ``key`` is claimed for this run (O_APPEND lines; one writer at a time is enough)."""
    path = run / SENT
    try:
        if key in path.read_text("utf-8").split():
            return False
    except FileNotFoundError:
        pass
    except OSError:
        return True
    try:
        with open(str(path), "a", encoding="utf-8") as fh:
            fh.write(key + "\n")
    except OSError:
        pass
    return True


def deliver(config: NotifyConfig, event: str, run: Path, text: str, key: str | None = None,
            env: Mapping[str, str] | None = None, secret: str | None = None) -> SendResult | None:
    """Send ``text`` for ``event`` if the spec asks for it and ``key`` (default: the event) was not sent
    before; log the outcome. None: not asked for, or sent already."""
    if event not in config.events:
        return None
    if not claim(run, key or event):
        return None
    result = send(config, text, env, secret)
    log(run, redact_secrets(f"{event}: {config.format} via {config.where()}: {result}"))
    return result
