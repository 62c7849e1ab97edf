"""What a check reports: one ``Finding`` per problem, naming the file, line, key and rule.

Severity decides the exit code: errors and warnings fail ``mxc check`` (exit 1), notes only
inform (which catalog was used, what could not be judged). A finding from a matrix carries the
combinations it occurred in, so a problem of the base spec is reported once, not 100 times.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Literal

from mxc.compiler.errors import printable

Severity = Literal["error", "warning", "note"]
FAILING: frozenset[str] = frozenset({"error", "warning"})


@dataclass(frozen=True, slots=True)
class Finding:
    file: str
    line: int | None
    key: str
    rule: str
    severity: Severity
    message: str
    suggestion: str = ""
    combinations: tuple[int, ...] = ()

    @property
    def fails(self) -> bool:
        return self.severity in FAILING

    def where(self) -> str:
        return self.file if self.line is None else f"{self.file}:{self.line}"

    def __str__(self) -> str:
        key = f" {self.key}:" if self.key else ""
        hint = f" ({self.suggestion})" if self.suggestion else ""
        combos = f" [{describe_combinations(self.combinations)}]" if self.combinations else ""
        return printable(f"{self.where()}:{key} {self.severity}[{self.rule}]: {self.message}{hint}{combos}")

    def as_dict(self) -> dict[str, object]:
        return {
            "file": self.file,
            "line": self.line,
            "key": self.key,
            "rule": self.rule,
            "severity": self.severity,
            "message": self.message,
            "suggestion": self.suggestion,
            "combinations": list(self.combinations),
        }


def describe_combinations(combos: tuple[int, ...], limit: int = 8) -> str:
    shown = ", ".join(f"#{c}" for c in combos[:limit])
    more = f" and {len(combos) - limit} more" if len(combos) > limit else ""
    return f"combination{'s' if len(combos) > 1 else ''} {shown}{more}"


def merge(findings: Iterable[Finding]) -> list[Finding]:
    """One finding per distinct problem; the combinations it occurred in are unioned, in order."""
    merged: dict[tuple[object, ...], Finding] = {}
    for f in findings:
        key = (f.file, f.line, f.key, f.rule, f.severity, f.message, f.suggestion)
        seen = merged.get(key)
        if seen is None:
            merged[key] = f
        elif seen.combinations and f.combinations:
            combos = tuple(sorted(set(seen.combinations) | set(f.combinations)))
            merged[key] = replace(seen, combinations=combos)
        elif seen.combinations:  # also found outside any matrix: it is the spec's own problem
            merged[key] = replace(seen, combinations=())
    return sorted(merged.values(), key=_order)


def merge_matrix(findings: Iterable[Finding], total: int) -> list[Finding]:
    """Merged findings of one matrix; a problem in every one of its ``total`` combinations is the
    base spec's, and loses its combination list."""
    out = []
    for f in merge(findings):
        out.append(replace(f, combinations=()) if len(f.combinations) == total else f)
    return out


_RANK = {"error": 0, "warning": 1, "note": 2}


def _order(f: Finding) -> tuple[object, ...]:
    return (f.file, f.line or 0, _RANK[f.severity], f.rule, f.key, f.message)
