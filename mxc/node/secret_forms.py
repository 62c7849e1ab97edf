"""Redact one known secret in every form a server or library may echo it back.

A webhook that answers with the request path, an HTTP error page, an exception from the
URL parser: each may hold the secret not only as it is but URL-quoted (``quote``,
``quote_plus``, lower- or upper-case ``%2f``, quoted twice), JSON-escaped (``\\/``,
``\\u002f``), HTML-escaped, base64- or hex-encoded, or only its secret *part*: the token of a
Telegram ``bot<token>`` path, the path and query of a webhook URL. ``Redactor`` matches all of
them (case-insensitively: over-redacting a look-alike is harmless) and replaces each by ***.
"""

from __future__ import annotations

import base64
import re
import urllib.parse
from functools import lru_cache

REDACTED = "***"
MIN_PART = 8  # shorter pieces (a bot id, "hooks") are not secret on their own and would redact ordinary text
_HTML = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}


def secret_parts(secret: str, fmt: str | None = None) -> list[str]:
    """The secret and the pieces of it that are secret on their own, longest first."""
    parts = {secret}
    if fmt == "telegram" and ":" in secret:
        parts.add(secret.split(":", 1)[1])  # the bot id before ':' is public; the rest is the key
    split = urllib.parse.urlsplit(secret) if "://" in secret else None
    if split is not None:
        path_query = split.path + (f"?{split.query}" if split.query else "")
        parts.update({path_query, split.path, split.query, split.path.rstrip("/").rsplit("/", 1)[-1]})
        parts.update(segment for segment in split.path.split("/") if len(segment) >= 12)
        parts.update(value for _key, value in urllib.parse.parse_qsl(split.query))
    return sorted((p for p in parts if len(p) >= MIN_PART), key=len, reverse=True)


def _char_pattern(char: str) -> str:
    """Every way one character of the secret may be written: raw, %HH (or %25HH), \\uHHHH, \\/, +, &amp;, &#58;."""
    forms = [re.escape(char)]
    data = char.encode("utf-8")
    forms.append("".join(f"%(?:25)?{b:02x}" for b in data))
    # JSON escapes, also escaped again (JSON inside JSON): \u002f, \\u002f, \/
    forms.append(f"\\\\+u{ord(char):04x}" if ord(char) < 0x10000 else "(?!)")
    if char == "/":
        forms.append(r"\\+/")
    elif char in ('"', "\\"):
        forms.append(re.escape("\\" + char))
    elif char == " ":
        forms.append(r"\+")
    if char in _HTML:
        forms.append(re.escape(_HTML[char]))
    if not char.isalnum():
        forms.append(f"&#0*{ord(char)};|&#x0*{ord(char):x};")
    return "(?:" + "|".join(forms) + ")"


def _base64_cores(data: bytes) -> list[str]:
    """The base64 text every encoding of a string holding ``data`` must contain, for each of the three
    alignments of ``data`` in it (standard and URL-safe alphabets): the characters made of its bits only."""
    cores = []
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + data + b"\0\0").decode()
        first = -(-shift * 8 // 6)  # ceil: first character with only our bits
        last = ((shift + len(data)) * 8) // 6  # characters before this are complete
        core = encoded[first:last]
        if len(core) >= MIN_PART:
            cores += [core, core.translate(str.maketrans("+/", "-_"))]
    return cores


@lru_cache(maxsize=64)
def _pattern(secret: str, fmt: str | None) -> re.Pattern[str] | None:
    parts = secret_parts(secret, fmt)
    if not parts:
        return None
    alternatives = ["".join(_char_pattern(c) for c in part) for part in parts]
    for part in parts:
        data = part.encode("utf-8")
        alternatives += [re.escape(core) for core in _base64_cores(data)]
        alternatives.append(re.escape(data.hex()))
    return re.compile("|".join(alternatives), re.I)


class Redactor:
    """Replaces one secret, in all its forms and parts, by ***."""

    def __init__(self, secret: str, fmt: str | None = None) -> None:
        self.pattern = _pattern(secret, fmt) if secret else None

    def __call__(self, text: str) -> str:
        return self.pattern.sub(REDACTED, text) if self.pattern is not None else text

    def mask(self, text: str) -> str:
        """Each form replaced by as many ``*`` as it has characters: the length stays (a record whose
        length is written beside it, a TensorBoard event, stays valid)."""
        return self.pattern.sub(lambda m: "*" * len(m.group(0)), text) if self.pattern is not None else text
