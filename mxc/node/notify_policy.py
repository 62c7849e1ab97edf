"""Where alerts may go, and what a webhook secret must look like before anything is sent.

A spec is reviewed, but a reviewed-looking change must not be able to post a credential to a
stranger. So the destination never comes from the spec alone: it is the format's official API
(Telegram ``https://api.telegram.org``, Slack ``https://hooks.slack.com``), a Mattermost
incoming-webhook URL (its URL *is* the secret, read from outside the spec), or a base URL the
operator lists outside the spec in ``$MXC_NOTIFY_ALLOWED_URLS`` (a self-hosted Bot API server, a
company proxy, a local test server). And the secret must have the shape of the format's secret
(a bot token, a webhook URL), so naming another credential (``HF_TOKEN``, ``~/.ssh/id_rsa``)
sends nothing. Pure functions: the runtime (mxc/runtime/notify.py, where the request is built)
and ``mxc check`` (rule ``notify-destination``) pass in the operator's setting.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass

from .secretscan import redact_secrets

ALLOWED_URLS_ENV = "MXC_NOTIFY_ALLOWED_URLS"
OFFICIAL_API = {"telegram": "https://api.telegram.org", "slack": "https://hooks.slack.com"}
TELEGRAM_TOKEN = re.compile(r"^\d{5,16}:[A-Za-z0-9_-]{30,64}$")
_SLACK_PATH = re.compile(r"^/(services|workflows|triggers)/[A-Za-z0-9_/-]+$")
_MATTERMOST_PATH = re.compile(r"^(/[A-Za-z0-9._~-]+)*/hooks/[A-Za-z0-9]{16,64}$")
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
_PRINTABLE = re.compile(r"^[\x21-\x7e]+$")
# A variable named by notify.secret_env must say it holds a chat secret (docs/alerts.md, "The secret").
CHAT_SECRET_NAME = re.compile(r"HOOK|BOT|TELEGRAM|SLACK|MATTERMOST|CHAT|NOTIFY|ALERT", re.I)
MAX_SECRET_BYTES = 4096


@dataclass(frozen=True)
class Base:
    """A URL prefix requests may go to: scheme, host, port, and a path prefix (whole segments)."""

    scheme: str
    host: str
    port: int
    path: str

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}{self.path}"

    def holds(self, url: str) -> bool:
        parts = _parts(url)
        if parts is None:
            return False
        scheme, host, port, path = parts
        if (scheme, host, port) != (self.scheme, self.host, self.port):
            return False
        return not self.path or path == self.path or path.startswith(self.path + "/")


def _parts(url: str) -> tuple[str, str, int, str] | None:
    """(scheme, host, port, path) of a plain http(s) URL, or None for anything odd."""
    if not _PRINTABLE.match(url) or "\\" in url:
        return None
    try:
        split = urllib.parse.urlsplit(url)
        port = split.port
    except ValueError:
        return None
    if split.scheme not in ("http", "https") or not split.hostname or "@" in split.netloc or _dot_segment(split.path):
        return None
    return split.scheme, split.hostname.lower(), port or (443 if split.scheme == "https" else 80), split.path


def _dot_segment(path: str) -> bool:
    """Whether ``path`` has a ``.`` or ``..`` segment, as is, percent-encoded (``%2e%2e``, ``%252e``,
    ``%2f`` for the slash) or with path parameters (``..;``, ``..;x=1``): the server resolves it, so
    ``<allowed base>/../other`` would leave the operator's base while its text still starts with it.
    No webhook path needs one."""
    for _ in range(4):  # each round undoes one layer of encoding; four is more than any client adds
        decoded = urllib.parse.unquote(path)
        if decoded == path:
            break
        path = decoded
    # A segment's path parameters (";x": Tomcat and Jetty drop them, so "..;" is "..") and a NUL
    # (where C servers stop reading) do not hide a dot segment either.
    return any(re.split(r"[;\x00]", segment)[0] in (".", "..") for segment in re.split(r"[/\\]", path))


def url_problem(url: str) -> str | None:
    """Why ``url`` is not a plain http(s) URL (no credentials, no spaces or control characters, no
    ``.``/``..`` path segments), or None."""
    if _parts(url) is not None:
        return None
    return "not a plain http(s) URL (scheme, host, optional port and path, no . or .. segments)"


def operator_bases(setting: str | None) -> tuple[Base, ...]:
    """The bases listed in ``$MXC_NOTIFY_ALLOWED_URLS`` (whitespace-separated); ValueError names a bad one.

    Each is an https URL, or an http URL of this machine's loopback (127.0.0.1, ::1, localhost),
    with no user, query or fragment: ``https://mattermost.example.com``, ``http://127.0.0.1:8080``.
    """
    bases = []
    for entry in (setting or "").split():
        parts = _parts(entry)
        split = urllib.parse.urlsplit(entry) if parts else None
        shown = repr(redact_secrets(entry)[:80])
        if parts is None or split is None or split.query or split.fragment:
            raise ValueError(f"${ALLOWED_URLS_ENV}: {shown} is not a plain http(s) URL (no user, query or fragment)")
        scheme, host, port, path = parts
        if scheme == "http" and host not in _LOOPBACK:
            raise ValueError(f"${ALLOWED_URLS_ENV}: {shown} is plain http to another machine "
                             "(https, or http only to 127.0.0.1)")
        bases.append(Base(scheme, host, port, path.rstrip("/")))
    return tuple(bases)


def _official(fmt: str) -> Base | None:
    url = OFFICIAL_API.get(fmt)
    return operator_bases(url)[0] if url else None


def api_url_problem(api_url: str, setting: str | None) -> str | None:
    """Why Telegram alerts may not go to ``api_url`` (the spec's notify.api_url), or None.

    ValueError when the operator's setting itself is malformed."""
    bases = operator_bases(setting)
    official = _official("telegram")
    if _parts(api_url) is not None and any(b.holds(api_url) for b in (*bases, *([official] if official else []))):
        return None
    return (f"notify.api_url {api_url[:80]!r} is neither the official Telegram API ({OFFICIAL_API['telegram']}) "
            f"nor under a URL the operator allows in ${ALLOWED_URLS_ENV}")


def secret_problem(fmt: str, secret: str) -> str | None:
    """Why ``secret`` is not the format's kind of secret (nothing is sent then), or None. Never echoes it."""
    if len(secret.encode("utf-8", "replace")) > MAX_SECRET_BYTES:
        return f"it is longer than {MAX_SECRET_BYTES} bytes"
    if fmt == "telegram":
        return None if TELEGRAM_TOKEN.match(secret) else "it is not a Telegram bot token (<digits>:<30-64 characters>)"
    if _parts(secret) is None:
        return f"it is not a {fmt} webhook URL (a plain http(s) URL)"
    return None


def destination_problem(fmt: str, url: str, setting: str | None) -> str | None:
    """Why a request of format ``fmt`` may not go to ``url``, or None: checked where the request is built."""
    parts = _parts(url)
    if parts is None:
        return "the destination is not a plain http(s) URL (no user, no . or .. path segments)"
    bases = operator_bases(setting)
    if any(b.holds(url) for b in bases):
        return None
    split = urllib.parse.urlsplit(url)
    official = _official(fmt)
    if fmt == "telegram":
        if official and official.holds(url):
            return None
        return f"only {OFFICIAL_API['telegram']} or a URL in ${ALLOWED_URLS_ENV}"
    if fmt == "slack":
        if official and official.holds(url) and _SLACK_PATH.match(split.path) and not split.fragment:
            return None
        return (f"a Slack webhook is under {OFFICIAL_API['slack']} (path /services/...); other hosts only when listed "
                f"in ${ALLOWED_URLS_ENV}")
    if split.scheme == "https" and _MATTERMOST_PATH.match(split.path) and not split.query and not split.fragment:
        return None
    return (f"a Mattermost webhook is https://<server>/hooks/<id>; http or other paths only when listed in "
            f"${ALLOWED_URLS_ENV}")


def secret_env_problem(name: str) -> str | None:
    """Why ``name`` may not be notify.secret_env, or None."""
    if name.startswith("MXC_"):
        return f"'{name}': MXC_* variables belong to mxc itself (and are recorded); use another name"
    if not CHAT_SECRET_NAME.search(name):
        return (f"'{name}' does not say it holds a chat secret: the name must contain HOOK, BOT, SLACK, MATTERMOST, "
                "TELEGRAM, CHAT, NOTIFY or ALERT (e.g. CHAT_WEBHOOK_URL), so a spec cannot send another credential")
    return None
