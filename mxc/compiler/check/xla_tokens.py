"""``XLA_FLAGS`` text -> tokens, the way XLA itself splits it (xla/parse_flags_from_env.cc).

XLA's reader is lenient in ways that burn jobs: a value whose first character is not ``-``
is taken as a *file name*; reading stops silently at the first token that does not start
with ``-`` (everything after it is ignored); ``--flag="a b"`` may quote a value. This module
reproduces that split so the checker sees exactly the tokens jaxlib will parse, and reports
every token XLA would drop or reject. Value rules follow tsl's flag parser, confirmed by
probing jaxlib (tests/test_check_catalog.py): bools are true/false/1/0 in any case or bare,
integers are decimal with an optional sign, a non-bool flag needs ``=value``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

_WS = " \t\r\n"
_NAME_CHARS = re.compile(r"[-_A-Za-z0-9]*")
_FLAG_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?(([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|inf|infinity|nan)", re.I)
_LIMITS = {"int32": 2**31, "int64": 2**63}


@dataclass(frozen=True, slots=True)
class Token:
    """One flag as XLA reads it. ``problem`` is set when XLA would reject or drop it."""

    text: str
    name: str
    value: str | None  # None: bare --flag
    problem: str = ""


@lru_cache(maxsize=4096)
def split_flags(text: str) -> tuple[Token, ...]:
    """Tokens of an XLA_FLAGS value; malformed ones carry a ``problem``. (Cached: a sweep
    repeats the same few raw strings thousands of times.)"""
    return tuple(_split(text))


def _split(text: str) -> list[Token]:
    start = _skip_ws(text, 0)
    if start == len(text):
        return []
    if text[start] != "-":
        return [Token(text.strip(), "", None,
                      "XLA_FLAGS does not start with '-', so XLA reads it as a file name and aborts if there is none")]
    tokens: list[Token] = []
    b = start
    while b < len(text) and text[b] == "-":
        e = _NAME_CHARS.match(text, b).end()  # type: ignore[union-attr]
        if e < len(text) - 1 and text[e] == "=" and text[e + 1] in "'\"":
            head = text[b:e]
            value, e = _quoted(text, e + 1)
            tokens.append(_token(text[b:e], head, value))
        else:
            e = _find_ws(text, e)
            raw = text[b:e]
            head, sep, value = raw.partition("=")
            tokens.append(_token(raw, head, value if sep else None))
        b = _skip_ws(text, e)
    if b < len(text):
        rest = text[b:].strip()
        first = rest.split()[0]
        tokens.append(Token(rest, "", None, f"'{first}' does not start with '-': "
                            f"XLA stops reading here and silently ignores the rest ({rest!r})"))
    return tokens


def _token(raw: str, head: str, value: str | None) -> Token:
    if not head.startswith("--"):
        return Token(raw, head.lstrip("-"), value, f"'{raw}' must start with '--' (XLA rejects it as an unknown flag)")
    name = head[2:]
    if not _FLAG_NAME.fullmatch(name):
        return Token(raw, name, value, f"'{raw}' is not --name or --name=value")
    return Token(raw, name, value)


def _quoted(text: str, q: int) -> tuple[str, int]:
    """Value of a quoted flag starting at ``text[q]`` (a quote); backslash escapes in double quotes."""
    quote = text[q]
    e = q + 1
    out = []
    while e < len(text) and text[e] != quote:
        c = text[e]
        if quote == '"' and c == "\\" and e + 1 < len(text):
            e += 1
            c = text[e]
        out.append(c)
        e += 1
    return "".join(out), min(e + 1, len(text))


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def _find_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] not in _WS:
        i += 1
    return i


def value_problem(kind: str, value: str | None) -> str:
    """Why tsl's parser would reject ``value`` for a flag of type ``kind``; empty when it accepts it."""
    if value is None:
        return "" if kind == "bool" else f"a {kind} flag needs a value (--name=value); a bare --name is an unknown flag to XLA"
    if kind == "bool":
        return "" if value.lower() in ("true", "false", "1", "0") else f"expected true, false, 1 or 0, got {value!r}"
    if kind in _LIMITS:
        if not _INT.fullmatch(value):
            return f"expected a decimal {kind} integer, got {value!r}"
        limit = _LIMITS[kind]
        return "" if -limit <= int(value) < limit else f"{value} does not fit in {kind}"
    if kind == "float":
        return "" if _FLOAT.fullmatch(value) else f"expected a number, got {value!r}"
    return ""


_ANY_WS = re.compile(r"[ \t\r\n]")


def render_problem(value: str) -> str:
    """Why a value from ``env.xla_flags`` would not survive ``--name=value`` in XLA_FLAGS."""
    if _ANY_WS.search(value):
        return f"the value {value!r} contains whitespace: XLA splits XLA_FLAGS on it and reads the rest as another flag"
    if value[:1] in ("'", '"'):
        return f"the value {value!r} starts with a quote, which XLA strips as quoting"
    return ""
