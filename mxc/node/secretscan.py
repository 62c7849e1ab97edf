"""Recognise secrets by their shape: refuse them in specs, redact them where mxc writes.

A spec is hashed, stored in the bundle (spec.json), copied to every node and shown by
``mxc show``: whatever it holds is public to everyone who can read the store. Secrets
belong in an environment variable or a file that the spec only *names* (``notify.secret_env``,
``notify.secret_file``). The same shapes are redacted from what mxc composes and writes
itself (the recorded environment in record.json, notify.log, alert texts): ``redact_secrets``.

The patterns are deliberately specific (known token prefixes and lengths, or a value next to
a name that says it is a secret), so an ordinary value is never rejected by accident:
tests/test_attacks_secrets.py runs them over every value of the shipped specs and MaxText's
own configs.
"""

from __future__ import annotations

import base64
import binascii
import re
import urllib.parse
from collections.abc import Iterator
from typing import Any

REDACTED = "***"

# (what it looks like, pattern). A pattern with a group named ``secret`` redacts only that group
# (the name next to it stays readable); otherwise the whole match is the secret.
SECRET_SHAPES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("a Slack webhook URL", re.compile(r"hooks\.slack\.com/(services|workflows|triggers)/[^\s\"'<>]+", re.I)),
    ("a Slack token", re.compile(r"\bxox[abposre]-[A-Za-z0-9-]{10,}|\bxapp-\d-[A-Za-z0-9-]{10,}")),
    ("a Discord webhook URL", re.compile(r"discord(app)?\.com/api/webhooks/[^\s\"'<>]+", re.I)),
    ("a Mattermost (or similar) incoming-webhook URL", re.compile(r"https?://[^\s\"'<>]+/hooks/[a-z0-9]{20,}\b", re.I)),
    ("a Telegram bot URL with its token", re.compile(r"api\.telegram\.org/bot[^\s\"'<>/]+", re.I)),
    ("a Telegram bot token", re.compile(r"\b\d{6,12}:[A-Za-z0-9_-]{30,}\b")),
    ("a URL with a password in it", re.compile(r"\b[a-z][a-z0-9+.-]*://[^/\s:@]+:(?!\*\*\*@)(?P<secret>[^/\s@]+)@", re.I)),
    ("a URL with a secret parameter", re.compile(
        r"[?&;](?:password|passwd|pwd|secret|client_secret|token|access_token|auth_token|api_key|apikey|sig)"
        r"=(?P<secret>[^&\s#\"'<>]{6,})", re.I)),
    ("a GitHub token", re.compile(r"\b(gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})\b")),
    ("a GitLab token", re.compile(r"\bgl(?:pat|dt|ptt|rt|cbt|oas)-[A-Za-z0-9_-]{20,}")),
    ("a Hugging Face token", re.compile(r"\bhf_[A-Za-z0-9]{30,}\b")),
    ("an AWS access key id", re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b")),
    ("an AWS secret access key", re.compile(
        r"aws_?secret_?access_?key[\"'\s]*[:=][\"'\s]*(?P<secret>[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+])", re.I)),
    ("a W&B API key", re.compile(r"wandb[\w.-]{0,20}?key[\"'\s]*[:=][\"'\s]*(?P<secret>[0-9a-f]{40})\b", re.I)),
    ("an Anthropic API key", re.compile(r"\bsk-ant-[A-Za-z0-9_-]{32,}")),
    ("an OpenAI API key", re.compile(r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{32,}")),
    ("a Stripe secret key", re.compile(r"\b[rs]k_live_[A-Za-z0-9]{20,}")),
    ("a Google API key", re.compile(r"\bAIza[0-9A-Za-z_-]{35}(?![0-9A-Za-z_-])")),
    ("an npm token", re.compile(r"\bnpm_[A-Za-z0-9]{36}\b")),
    ("a PyPI token", re.compile(r"\bpypi-AgE[A-Za-z0-9_-]{20,}")),
    ("a JSON Web Token", re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{10,}")),
    ("a private key", re.compile(
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
        r"(?:.*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----)?", re.S)),
    ("an Azure storage key or connection string", re.compile(
        r"\b(?:AccountKey|SharedAccessKey|SharedAccessSignature)=(?P<secret>[A-Za-z0-9+/=%]{16,})")),
)

# A name whose value is a secret: HF_TOKEN, DB_PASSWORD, WANDB_API_KEY, client_secret... ("token" alone
# is not enough: MaxText's reasoning_start_token is a vocabulary token).
_SECRET_NAME = re.compile(
    r"(?:^|[_.-])(?:password|passwd|secret|credentials?|apikey|api[_-]key|access[_-]key|secret[_-]key|"
    r"private[_-]key|auth[_-]key|(?:access|auth|api|bot|bearer|refresh|session|oauth|hf|hub|gh|github|gitlab|npm|"
    r"pypi|wandb|slack|telegram)[_-]?token)$|^token$", re.I)
# ... and a value of such a name that is one (credential characters; not empty, a path or a reference).
_SECRET_VALUE = re.compile(r"^[A-Za-z0-9_+=:-][A-Za-z0-9._~+/=:-]{7,}$")
_NOT_SECRET_VALUES = frozenset({"true", "false", "none", "null", "changeme", "placeholder"})
# Parts of a variable name that may mean a secret: such a variable is never *recorded* (a wider net
# than _SECRET_NAME, which *refuses* specs and so must never catch an ordinary value).
_SECRETISH_PARTS = frozenset({
    "TOKEN", "TOKENS", "SECRET", "SECRETS", "PASSWORD", "PASSWD", "PASS", "PWD", "CREDENTIAL", "CREDENTIALS",
    "APIKEY", "KEY", "AUTH", "COOKIE", "SESSION", "PRIVATE", "SIGNATURE", "SAS", "WEBHOOK", "HOOK",
})


def secret_shape(text: str) -> str | None:
    """What secret ``text`` looks like, or None."""
    for what, pattern in SECRET_SHAPES:
        if pattern.search(text):
            return what
    return None


def secret_named(name: str) -> bool:
    """Whether a variable called ``name`` may hold a secret (HF_TOKEN, TF_TOKEN_app_terraform_io, DB_PASS):
    for what mxc records, where leaving a harmless variable out costs nothing."""
    return bool(_SECRET_NAME.search(name)) or any(part in _SECRETISH_PARTS for part in re.split(r"[_.-]", name.upper()))


def secret_pair(name: str, value: str) -> str | None:
    """What secret ``value`` looks like, by its shape, or by the name it is stored under."""
    what = secret_shape(value)
    if what:
        return what
    if _SECRET_NAME.search(name) and _SECRET_VALUE.match(value) and value.lower() not in _NOT_SECRET_VALUES:
        return f"a secret (the value of {name})"
    return None


def redact_secrets(text: str) -> str:
    """``text`` with every secret-shaped part replaced by ***: for what mxc writes itself."""
    for _what, pattern in SECRET_SHAPES:
        text = pattern.sub(_redact_match, text)
    return text


def _redact_match(match: re.Match[str]) -> str:
    if "secret" in match.re.groupindex and match.group("secret") is not None:
        start, end = match.span("secret")
        whole = match.group(0)
        offset = match.start()
        return whole[: start - offset] + REDACTED + whole[end - offset:]
    return REDACTED


def _walk(data: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], str]]:
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _walk(value, (*path, str(key)))
    elif isinstance(data, (list, tuple)):
        for index, value in enumerate(data):
            yield from _walk(value, (*path, str(index)))
    elif isinstance(data, str):
        yield path, data


_BASE64_RUN = re.compile(r"[A-Za-z0-9+/_-]{24,}={0,2}")


def encoded_forms(text: str) -> Iterator[tuple[str, str]]:
    """(how it was encoded, the text decoded) for the encodings a pasted secret comes in: percent-encoding
    (up to three layers: a URL in a query parameter, quoted again) and base64 (standard or URL-safe, a
    whole run of its alphabet that decodes to printable text: a Kubernetes secret, a token file)."""
    layer = text
    for depth in range(3):
        decoded = urllib.parse.unquote(layer)
        if decoded == layer:
            break
        yield ("percent-encoded" if depth == 0 else f"percent-encoded {depth + 1} times"), decoded
        layer = decoded
    for match in _BASE64_RUN.finditer(text):
        run = match.group(0).rstrip("=")
        try:
            raw = base64.b64decode(run.replace("-", "+").replace("_", "/") + "=" * (-len(run) % 4), validate=True)
            decoded = raw.decode("utf-8")
        except (binascii.Error, ValueError):
            continue
        if decoded.isprintable():
            yield "base64", decoded


def encoded_secret_shape(text: str) -> str | None:
    """What secret ``text`` holds once decoded (``a Slack webhook URL, base64``), or None."""
    for how, decoded in encoded_forms(text):
        what = secret_shape(decoded)
        if what:
            return f"{what}, {how}"
    return None


def find_secrets(data: Any) -> list[tuple[str, str]]:
    """(dotted key path, what it looks like) for every string value (and mapping key) that looks secret,
    as written or percent- or base64-encoded."""
    found: list[tuple[str, str]] = []
    for path, text in _walk(data):
        what = secret_pair(path[-1], text) if path else secret_shape(text)
        what = what or (secret_shape(path[-1]) if path else None) or encoded_secret_shape(text)
        if what:
            found.append((".".join(path), what))
    return found
