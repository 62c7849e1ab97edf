"""Semantic diff of two resolved specs: which fields changed, not which lines."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_MISSING: Any = object()


@dataclass(frozen=True)
class Change:
    key: str
    old: Any
    new: Any

    @property
    def kind(self) -> str:
        if self.old is _MISSING:
            return "added"
        if self.new is _MISSING:
            return "removed"
        return "changed"

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "kind": self.kind}
        if self.old is not _MISSING:
            out["old"] = self.old
        if self.new is not _MISSING:
            out["new"] = self.new
        return out

    def __str__(self) -> str:
        if self.kind == "added":
            return f"+ {self.key}: {self.new!r}"
        if self.kind == "removed":
            return f"- {self.key}: {self.old!r}"
        return f"~ {self.key}: {self.old!r} -> {self.new!r}"


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Mappings become dotted keys; lists and scalars are leaves (they are replaced whole)."""
    if isinstance(data, dict) and data:
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: data}


def diff_specs(old: dict[str, Any], new: dict[str, Any]) -> list[Change]:
    a, b = flatten(old), flatten(new)
    return [
        Change(key, a.get(key, _MISSING), b.get(key, _MISSING))
        for key in sorted(set(a) | set(b))
        if a.get(key, _MISSING) != b.get(key, _MISSING)
    ]


def diff_files(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """Names of bundle files whose hashes differ (manifest maps name -> sha256)."""
    return sorted(n for n in set(old) | set(new) if old.get(n) != new.get(n))
