"""Decide why a run failed: the cause, the first failing rank and its node, the first error line.

All evidence (log patterns, tracebacks, the record, per-rank files, kernel log, crash notes,
metrics) is a list of hits. The verdict is computed per attempt:

1. Consequence hits (a peer died, the step was cancelled) count only when nothing else is found.
2. The first failing rank is the one whose first cause hit (or recorded exit) is earliest: in a
   multi-node job the others fail *because* it failed, so rank 0 is often not the culprit.
3. On that rank, the highest-priority cause wins (an OOM explains the traceback it produced).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mxc.runtime.record import RunRecord
from mxc.runtime.rundir import RunDir
from mxc.runtime.triage import catalog as catalog_mod
from mxc.runtime.triage import evidence
from mxc.runtime.triage.logs import Hit, Scanner

LOG_GLOBS = ("train.log", "*.out", "*.err", "slurm-*.log", "logs/*.log")
SITE = re.compile(r"/(site|dist)-packages/(?P<pkg>[A-Za-z0-9_]+)/")
STRUCTURED = (".tsv", ".json", ".jsonl")


@dataclass
class Verdict:
    run_id: str
    status: str
    cause: str
    title: str
    blame: str
    exit_code: int | None = None
    attempt: int | None = None
    attempts: int = 0
    rank: int | None = None
    node: str | None = None
    first_error: Hit | None = None
    evidence: list[Hit] = field(default_factory=list)
    try_: list[str] = field(default_factory=list)
    crash: dict[str, Any] | None = None
    python_stack: list[str] = field(default_factory=list)
    ranks: list[dict[str, Any]] = field(default_factory=list)
    earlier: list[dict[str, Any]] = field(default_factory=list)
    also: list[dict[str, Any]] = field(default_factory=list)
    stacks: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "status": self.status, "exit_code": self.exit_code, "cause": self.cause,
            "title": self.title, "blame": self.blame, "attempt": self.attempt, "attempts": self.attempts,
            "rank": self.rank, "node": self.node,
            "first_error": hit_dict(self.first_error) if self.first_error else None,
            "evidence": [hit_dict(h) for h in self.evidence], "try": self.try_, "crash": self.crash,
            "python_stack": self.python_stack, "ranks": self.ranks, "earlier_attempts": self.earlier,
            "also_seen": self.also, "stacks": self.stacks, "notes": self.notes,
        }


def hit_dict(hit: Hit) -> dict[str, Any]:
    out: dict[str, Any] = {"cause": hit.cause, "text": hit.text, "source": hit.source, "line": hit.line,
                           "rank": hit.rank, "node": hit.node, "attempt": hit.attempt, "detail": hit.detail,
                           "time": iso(hit.time)}
    out.update(hit.extra)
    return out


def iso(t: float | None) -> str | None:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z") if t else None


def _sort_key(hit: Hit) -> tuple[bool, bool, float, int]:
    """Log lines before structured facts; then by time (unknown last), then by reading order."""
    return (hit.source.endswith(STRUCTURED), hit.time is None, hit.time or 0.0, hit.order)


def first_failing_rank(hits: list[Hit], exits: dict[int, float]) -> int | None:
    """The rank that failed first: earliest cause hit with a time, else earliest recorded exit."""
    ranks = {h.rank for h in hits if h.rank is not None}
    if not ranks:
        return None
    if len(ranks) == 1:
        return ranks.pop()
    first: dict[int, float] = {}
    for h in hits:
        if h.rank is not None and h.time is not None:
            first[h.rank] = min(first.get(h.rank, h.time), h.time)
    for rank, t in exits.items():
        if rank in ranks and rank not in first:
            first[rank] = t
    if first:
        return min(first, key=lambda r: (first[r], r))
    best = max(hits, key=lambda h: (h.priority, -h.order))
    return best.rank


def decide(hits: list[Hit], exits: dict[int, float]) -> tuple[Hit | None, int | None, list[Hit]]:
    """(the deciding hit, the first failing rank, the hits considered) for one attempt."""
    primary = [h for h in hits if h.role == "cause"] or hits
    if not primary:
        return None, None, []
    rank = first_failing_rank(primary, exits)
    candidates = [h for h in primary if h.rank in (rank, None)] or primary
    best = max(candidates, key=lambda h: (h.priority, -(h.time or 0.0), -h.order))
    return best, rank if best.rank is None else best.rank, candidates


def _where_in_code(hit: Hit, record: RunRecord | None) -> str:
    innermost = hit.extra.get("innermost") or {}
    file = str(innermost.get("file", ""))
    code_dir = (record.environment.get("MXC_CODE_DIR") if record else None) or ""
    at = f"{Path(file).name}:{innermost.get('line')} in {innermost.get('function')}"
    if code_dir and file.startswith(code_dir):
        return f"the training code ({file[len(code_dir):].lstrip('/')}:{innermost.get('line')})"
    if m := SITE.search(file):
        pkg = m["pkg"]
        if pkg == "maxtext":
            return f"MaxText ({file[m.end() - len(pkg) - 1:]}:{innermost.get('line')})"
        return f"library {pkg} ({at})"
    return f"user code ({at})" if file else "the training process"


_FIELD = re.compile(r"\{(\w+)\}")


def _try(hit: Hit) -> list[str]:
    """The cause's advice with {detail} and the pattern's other named groups filled in."""
    values = {**hit.groups, "detail": hit.detail or "see the evidence above"}
    return [_FIELD.sub(lambda m: values.get(m[1], "?"), t) for t in hit.try_]


def classify(root: Path, record: RunRecord | None = None) -> Verdict:
    """The verdict for the run in ``root`` (a run directory)."""
    run = RunDir(root)
    if record is None and run.record.is_file():
        try:
            record = RunRecord.load(run.record)
        except (OSError, ValueError):
            record = None
    catalog = catalog_mod.load()
    year = int(record.started[:4]) if record and record.started[:4].isdigit() else datetime.now().year
    scanner = Scanner(catalog, root, year)
    facts = evidence.Facts()
    labelled = bool(record and record.backend == "slurm")
    seen: set[Path] = set()
    for pattern in LOG_GLOBS:
        for path in sorted(root.glob(pattern)):
            if path.is_file() and path not in seen:
                seen.add(path)
                scanner.read_file(path, labelled=labelled)
    evidence.rank_files(root, scanner, facts, labelled)
    evidence.stack_files(root, scanner, facts)
    if record:
        evidence.record_hits(record, scanner)
    attempts_seen = sorted(scanner.scan.attempts | {a.number for a in (record.attempts if record else [])})
    last = attempts_seen[-1] if attempts_seen else 0
    evidence.metrics_facts(root, scanner, facts, last)
    evidence.hang_from_progress(scanner, facts)

    status = record.status if record else "unknown"
    verdict = Verdict(run_id=run.run_id, status=status, cause="none", title="", blame="unknown",
                      exit_code=record.exit_code if record else None, attempts=len(attempts_seen),
                      stacks=facts.stacks, notes=list(scanner.scan.notes))
    nodes = scanner.scan.nodes
    host = str((record.host or {}).get("hostname")) if record and record.host else None

    def attempt_verdict(number: int) -> tuple[Hit | None, int | None, list[Hit]]:
        hits = [h for h in scanner.scan.hits if h.attempt in (number, None)]
        exits = {r: float(e["time"]) for (a, r), e in facts.exits.items()
                 if a == number and int(e.get("rc", 0)) != 0 and isinstance(e.get("time"), (int, float))}
        return decide(hits, exits)

    for number in attempts_seen[:-1]:
        best, rank, _ = attempt_verdict(number)
        if best is not None:
            first = sorted((h for h in scanner.scan.hits if h.cause == best.cause and h.attempt == number), key=_sort_key)[0]
            verdict.earlier.append({"attempt": number, "cause": best.cause, "title": catalog.cause(best.cause).title,
                                    "rank": rank, "node": best.node or nodes.get(rank or 0),
                                    "first_error": hit_dict(first)})

    verdict.attempt = last
    best, rank, candidates = attempt_verdict(last)
    failed = status in ("failed", "hung", "unknown", "cancelled") or (record is None and best is not None)
    if status == "succeeded" or (not failed and best is None):
        verdict.cause = "none"
        verdict.title = "run succeeded" if status == "succeeded" else f"run is {status}; nothing failed so far"
        if verdict.earlier:
            verdict.title += f" after {len(verdict.earlier)} failed attempt(s)"
        return verdict
    progress = scanner.scan.progress.get(last)
    no_steps = (progress is None or progress.last_step is None) and facts.steps == 0
    if best is None:
        if not no_steps:
            verdict.cause, verdict.title = "unknown", "failed; no known error found"
            verdict.try_ = ["Read the end of the log (mxc logs RUN); a new kind of failure belongs in "
                            "runtime/triage/patterns.yaml with a fixture."]
            return verdict
        c = catalog.cause("startup_failure")
        verdict.cause, verdict.title, verdict.blame = c.id, c.title, c.blame
        if len(nodes) <= 1:
            verdict.rank = 0
            verdict.node = nodes.get(0) or host
        verdict.try_ = [t.replace("{detail}", "") for t in c.try_]
        return verdict

    assert best is not None
    cause = catalog.cause(best.cause)
    verdict.cause, verdict.blame = cause.id, cause.blame
    verdict.title = cause.title
    verdict.rank = rank
    mine = sorted((h for h in candidates if h.cause == best.cause), key=_sort_key)
    first = mine[0]
    verdict.first_error = first
    verdict.node = first.node or best.node or nodes.get(rank if rank is not None else -1) or (host if rank in (0, None) else None)
    if cause.id == "python_exception":
        verdict.title = f"Python exception in {_where_in_code(first, record)}"
    elif best.detail and cause.id in ("native_crash", "killed", "stage_timeout", "device_oom", "host_oom", "nccl_error"):
        verdict.title = f"{cause.title} ({best.detail})" if len(best.detail) < 60 else cause.title
    texts: set[str] = set()
    for h in mine:
        if h.text not in texts and len(verdict.evidence) < 8:
            texts.add(h.text)
            verdict.evidence.append(h)
    verdict.try_ = _try(first if first.try_ else best)
    # crash details for this rank and attempt
    for crash in facts.crashes:
        if crash.attempt == last and crash.rank == (rank if rank is not None else 0):
            verdict.crash = crash.as_dict()
    verdict.python_stack = scanner.scan.python_stacks.get((last, rank if rank is not None else 0), [])
    if cause.id == "hang" and not verdict.python_stack:
        verdict.python_stack = facts.stack_excerpt
    # other causes seen in this attempt (consequences on other ranks, secondary errors)
    others: dict[tuple[str, int | None], Hit] = {}
    for h in sorted((h for h in scanner.scan.hits if h.attempt in (last, None) and h.cause != best.cause), key=_sort_key):
        others.setdefault((h.cause, h.rank), h)
    verdict.also = [{"cause": h.cause, "title": catalog.cause(h.cause).title, "rank": h.rank,
                     "role": h.role, "first": h.text[:200], "where": h.where()}
                    for h in sorted(others.values(), key=lambda h: -h.priority)[:8]]
    # per rank: the first cause hit of each rank in this attempt
    per_rank: dict[int, Hit] = {}
    for h in sorted((h for h in scanner.scan.hits if h.attempt == last), key=lambda h: h.order):
        if h.rank is not None and (h.rank not in per_rank or (per_rank[h.rank].role != "cause" and h.role == "cause")):
            per_rank[h.rank] = h
    verdict.ranks = [{"rank": r, "node": nodes.get(r), "cause": h.cause, "first": h.text[:200], "where": h.where(),
                      "time": iso(h.time)} for r, h in sorted(per_rank.items())]
    return verdict
