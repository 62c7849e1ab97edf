"""The run's alert receiver: where its Prometheus sends the alerts of the bundle's rules.

Prometheus evaluates ``alerts.rules.yml`` and sends what fires to "Alertmanagers": a POST of a
JSON list of alerts to ``/api/v2/alerts``, repeated while an alert fires (``resend_delay``, one
minute) and once more with ``endsAt`` in the past when it resolves. This module is that endpoint
and nothing more (no Alertmanager to install, route or secure): a small HTTP server on
127.0.0.1, started by whoever starts the run's Prometheus (the local observer, or node rank 0's
node observer on Slurm), named to Prometheus by a file_sd target
(``targets/alert-receiver-<node>.json``). Each alert's first firing and its resolution become one
line of ``<run>/observability/alerts.jsonl``, and is handed to ``on_event``
(``alert_notify.py`` sends it to the spec's notify webhook).

Any local user can reach a loopback port, and a forged alert would reach the team's chat: so the
receiver answers only the run's scrape token (``scrape_token.py``; Prometheus sends it from
``credentials_file``, as to the exporters), and whatever arrives is bounded and checked (1 MiB,
at most 1000 alerts per request, string labels and annotations of bounded size). A request that
is not an alert list gets 400 and changes nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from mxc.fsutil import loads, read_jsonl

FILE = "alerts.jsonl"  # in <run>/observability/
PATH = "/api/v2/alerts"
MAX_BODY = 1 << 20
MAX_ALERTS = 1000
MAX_LABELS = 64
MAX_VALUE = 4096


@dataclass(frozen=True)
class Alert:
    """One alert as Prometheus sends it (the fields mxc keeps)."""

    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: str
    ends_at: str | None

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "?")

    @property
    def fingerprint(self) -> str:
        """Which alert (rule and labels): the same for every resend."""
        return hashlib.sha256(json.dumps(sorted(self.labels.items())).encode()).hexdigest()[:16]

    @property
    def key(self) -> str:
        """One firing of one alert: it fires again (a new key) after it resolved."""
        return f"{self.name}:{self.fingerprint}:{self.starts_at}"

    def resolved(self, now: datetime | None = None) -> bool:
        ends = _time(self.ends_at)
        return ends is not None and ends <= (now or datetime.now(UTC))


def parse(body: bytes) -> list[Alert]:
    """Prometheus' alert list; ``ValueError`` for anything else."""
    data = loads(body)
    if not isinstance(data, list) or len(data) > MAX_ALERTS:
        raise ValueError(f"expected a list of at most {MAX_ALERTS} alerts")
    return [_alert(item) for item in data]


def _alert(item: Any) -> Alert:
    if not isinstance(item, dict):
        raise ValueError("an alert is an object")
    labels, annotations = _strings(item.get("labels")), _strings(item.get("annotations", {}))
    if "alertname" not in labels:
        raise ValueError("an alert has labels.alertname")
    starts, ends = item.get("startsAt"), item.get("endsAt")
    if not isinstance(starts, str) or _time(starts) is None:
        raise ValueError("an alert has startsAt (RFC 3339)")
    if ends is not None and (not isinstance(ends, str) or _time(ends) is None):
        raise ValueError("endsAt is RFC 3339")
    return Alert(labels, annotations, starts, ends)


def _strings(value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or len(value) > MAX_LABELS:
        raise ValueError(f"labels and annotations are objects of at most {MAX_LABELS} strings")
    out = {}
    for key, text in value.items():
        if not isinstance(text, str) or len(key) > 256 or len(text) > MAX_VALUE:
            raise ValueError(f"label and annotation values are strings of at most {MAX_VALUE} characters")
        out[key] = text
    return out


def _time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


@dataclass
class AlertLog:
    """``alerts.jsonl``: the first firing and the resolution of each alert, once each (also across a
    restarted receiver: the keys already in the file are read at start)."""

    path: Path
    on_event: Callable[[dict[str, Any]], str | None] | None = None  # returns how the sending went
    _seen: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._seen = {f"{line.get('state')}:{line.get('key')}" for line in read_jsonl(self.path)}

    def accept(self, alerts: list[Alert]) -> list[dict[str, Any]]:
        """The lines written for ``alerts`` (new firings and resolutions only)."""
        written = []
        now = datetime.now(UTC)
        for alert in alerts:
            state = "resolved" if alert.resolved(now) else "firing"
            line = {"time": time.time(), "state": state, "key": alert.key, "alertname": alert.name,
                    "severity": alert.labels.get("severity"), "labels": alert.labels,
                    "annotations": alert.annotations, "starts_at": alert.starts_at, "ends_at": alert.ends_at}
            with self._lock:
                if f"{state}:{alert.key}" in self._seen:
                    continue
                self._seen.add(f"{state}:{alert.key}")
            if self.on_event is not None:
                try:
                    sent = self.on_event(line)
                except Exception as exc:  # an alert that cannot be sent never stops the receiver
                    sent = f"failed: {type(exc).__name__}"
                if sent:
                    line["sent"] = sent
            with self._lock:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with open(self.path, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(line, sort_keys=True) + "\n")
            written.append(line)
        return written


class AlertReceiver:
    """The HTTP endpoint (``start``/``stop``) in front of an ``AlertLog``."""

    def __init__(self, log: AlertLog, token: str) -> None:
        self.log = log
        self.expected = f"Bearer {token}".encode()
        self.server: ThreadingHTTPServer | None = None

    def start(self, bind: str = "127.0.0.1", port: int = 0) -> int:
        log, expected = self.log, self.expected

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's naming
                given = (self.headers.get("Authorization") or "").encode("latin-1", "replace")
                if not hmac.compare_digest(given, expected):
                    self._answer(401, "the run's scrape token is required")
                    return
                if self.path.split("?")[0] != PATH:
                    self._answer(404, "not found")
                    return
                try:
                    length = int(self.headers.get("Content-Length") or "0")
                except ValueError:
                    length = -1
                if not 0 <= length <= MAX_BODY:
                    self._answer(413, f"at most {MAX_BODY} bytes")
                    return
                try:
                    alerts = parse(self.rfile.read(length))
                except ValueError as exc:
                    self._answer(400, str(exc))
                    return
                log.accept(alerts)
                self._answer(200, "")

            def _answer(self, code: int, text: str) -> None:
                body = text.encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: the alerts themselves are the record."""

        self.server = ThreadingHTTPServer((bind, port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, name="mxc-alert-receiver", daemon=True).start()
        return int(self.server.server_address[1])

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

