"""The one error type users see.

A ``SpecError`` is a problem in the user's input, never a bug in mxc: the CLI prints it as
``file:line: key.path: message (suggestion)`` and exits 2, without a traceback.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass

# Characters that would let an echoed user string start a new line, move the cursor, recolour
# or reorder the terminal (C0/C1 controls, DEL, Unicode line separators, bidi overrides), or
# not encode at all (lone surrogates).
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_SHORT_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def printable(text: str) -> str:
    """``text`` with every control character escaped as Python would write it (``\\n``, ``\\x1b``,
    ``\\u202e``): an error about a hostile key stays one line and cannot forge another."""

    def escape(match: re.Match[str]) -> str:
        char = match.group()
        return _SHORT_ESCAPES.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")

    return _UNPRINTABLE.sub(escape, text)


@dataclass(frozen=True)
class SpecError:
    file: str
    line: int | None
    key: str
    message: str
    suggestion: str = ""
    column: int | None = None  # 1-based, where the parser knows it (YAML syntax): file:line:column, as compilers print

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        if self.line is not None and self.column is not None:
            where += f":{self.column}"
        key = f" {self.key}:" if self.key else ""
        hint = f" ({self.suggestion})" if self.suggestion else ""
        return printable(f"{where}:{key} {self.message}{hint}")

    def as_dict(self) -> dict[str, object]:
        return {
            "file": self.file,
            "line": self.line,
            "column": self.column,
            "key": self.key,
            "message": self.message,
            "suggestion": self.suggestion,
        }


class SpecErrors(Exception):
    """One or more problems found in a spec; raised once, after collecting all of them."""

    def __init__(self, errors: Iterable[SpecError]) -> None:
        self.errors = sorted(errors, key=lambda e: (e.file, e.line or 0, e.key, e.message))
        super().__init__("\n".join(str(e) for e in self.errors))

    @classmethod
    def one(cls, file: str, line: int | None, key: str, message: str, suggestion: str = "",
            column: int | None = None) -> SpecErrors:
        return cls([SpecError(file, line, key, message, suggestion, column)])


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """SkyPilot-style hint for a misspelled key or value; empty when nothing is close."""
    close = difflib.get_close_matches(word, sorted(set(choices)), n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'?" if close else ""
