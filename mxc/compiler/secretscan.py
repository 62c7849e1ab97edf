"""Refuse specs that hold something looking like a secret (webhook URLs, bot tokens, passwords in URLs).

A spec is hashed, stored in the bundle (spec.json), copied to every node and shown by
``mxc show``: whatever it holds is public to everyone who can read the store. Secrets
belong in an environment variable or a file that the spec only *names* (``notify.secret_env``,
``notify.secret_file``). The patterns are deliberately specific (known token shapes), so an
ordinary value is never rejected by accident.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

# (what it looks like, pattern)
SECRET_SHAPES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("a Slack webhook URL", re.compile(r"hooks\.slack\.com/(services|workflows|triggers)/\S+", re.I)),
    ("a Slack token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}")),
    ("a Discord webhook URL", re.compile(r"discord(app)?\.com/api/webhooks/\S+", re.I)),
    ("a Mattermost (or similar) incoming-webhook URL", re.compile(r"https?://\S+/hooks/[a-z0-9]{20,}\b", re.I)),
    ("a Telegram bot URL with its token", re.compile(r"api\.telegram\.org/bot\S+", re.I)),
    ("a Telegram bot token", re.compile(r"\b\d{6,12}:[A-Za-z0-9_-]{30,}\b")),
    ("a URL with a password in it", re.compile(r"\b[a-z][a-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@", re.I)),
    ("a GitHub token", re.compile(r"\b(gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})\b")),
)


def secret_shape(text: str) -> str | None:
    """What secret ``text`` looks like, or None."""
    for what, pattern in SECRET_SHAPES:
        if pattern.search(text):
            return what
    return None


def _walk(data: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], str]]:
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _walk(value, (*path, str(key)))
    elif isinstance(data, (list, tuple)):
        for index, value in enumerate(data):
            yield from _walk(value, (*path, str(index)))
    elif isinstance(data, str):
        yield path, data


def find_secrets(data: Any) -> list[tuple[str, str]]:
    """(dotted key path, what it looks like) for every string value (and mapping key) that looks secret."""
    found: list[tuple[str, str]] = []
    for path, text in _walk(data):
        what = secret_shape(text) or (secret_shape(path[-1]) if path else None)
        if what:
            found.append((".".join(path), what))
    return found
