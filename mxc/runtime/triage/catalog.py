"""The catalog of known failure causes (patterns.yaml), loaded and compiled once.

The catalog is data so that a new failure seen on a cluster is a new entry (with its source
and a fixture), not new code. Validation here is strict: a typo in the catalog must fail the
tests, not silently never match.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

ROLES = ("cause", "consequence")
_NAMED = re.compile(r"\(\?P<\w+>")
BLAMES = ("config", "code", "flags", "environment", "node", "network", "scheduler", "data", "user", "unknown")


@dataclass(frozen=True)
class Pattern:
    cause: str
    regex: re.Pattern[str]
    source: str
    example: str
    role: str
    priority: int
    try_: tuple[str, ...]
    context: str | None = None  # "restore": only after the attempt restored a checkpoint


@dataclass(frozen=True)
class Cause:
    id: str
    title: str
    blame: str
    priority: int
    role: str
    try_: tuple[str, ...]
    patterns: tuple[Pattern, ...]


@dataclass(frozen=True)
class Catalog:
    causes: dict[str, Cause]
    patterns: tuple[Pattern, ...]
    prefilter: re.Pattern[str]  # any pattern at all: one search per log line instead of one per pattern

    def cause(self, cause_id: str) -> Cause:
        return self.causes[cause_id]


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where}: 'try' must be a list of strings")
    return tuple(value)


def parse(data: dict[str, Any]) -> Catalog:
    causes: dict[str, Cause] = {}
    patterns: list[Pattern] = []
    for entry in data["causes"]:
        cid = entry["id"]
        unknown = set(entry) - {"id", "title", "blame", "priority", "role", "patterns", "try"}
        if unknown:
            raise ValueError(f"cause {cid}: unknown keys {sorted(unknown)}")
        if cid in causes:
            raise ValueError(f"cause {cid}: defined twice")
        role = entry.get("role", "cause")
        if role not in ROLES or entry["blame"] not in BLAMES:
            raise ValueError(f"cause {cid}: role must be one of {ROLES}, blame one of {BLAMES}")
        try_ = _strings(entry["try"], cid)
        own: list[Pattern] = []
        for p in entry.get("patterns") or []:
            extra = set(p) - {"regex", "source", "example", "role", "priority", "try", "context"}
            if extra:
                raise ValueError(f"cause {cid}: pattern {p.get('regex')!r}: unknown keys {sorted(extra)}")
            if not p.get("source") or not p.get("example"):
                raise ValueError(f"cause {cid}: pattern {p['regex']!r} needs a source and an example")
            own.append(Pattern(
                cause=cid, regex=re.compile(p["regex"]), source=p["source"], example=p["example"],
                role=p.get("role", role), priority=int(p.get("priority", entry["priority"])),
                try_=_strings(p["try"], cid) if "try" in p else try_, context=p.get("context"),
            ))
        causes[cid] = Cause(cid, entry["title"], entry["blame"], int(entry["priority"]), role, try_, tuple(own))
        patterns += own
    # Group names repeat across patterns: the prefilter only needs to know that one matches.
    prefilter = re.compile("|".join(f"(?:{_NAMED.sub('(?:', p.regex.pattern)})" for p in patterns))
    return Catalog(causes, tuple(patterns), prefilter)


@functools.cache
def data() -> dict[str, Any]:
    """patterns.yaml as plain data (libyaml's parser where PyYAML has it: `mxc build` reads it too)."""
    text = resources.files("mxc.runtime.triage").joinpath("patterns.yaml").read_text("utf-8")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    loaded: dict[str, Any] = yaml.load(text, Loader=loader)
    return loaded


@functools.cache
def load() -> Catalog:
    return parse(data())


def raw_patterns(blames: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """(cause, blame, regex) of every pattern of a cause with one of ``blames`` that is evidence of a
    cause (its role, or its cause's, is ``cause``; not a consequence) and needs no context, in catalog
    order, without compiling anything: what `mxc build` puts into a bundle's run.json."""
    out = []
    for entry in data()["causes"]:
        if entry["blame"] not in blames:
            continue
        for p in entry.get("patterns") or []:
            if p.get("role", entry.get("role", "cause")) == "cause" and p.get("context") is None:
                out.append((entry["id"], entry["blame"], p["regex"]))
    return out
