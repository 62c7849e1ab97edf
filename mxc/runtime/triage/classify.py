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
from datetime import datetime
from pathlib import Path
from typing import Any

from mxc.runtime.record import RunRecord, iso_time
from mxc.runtime.rundir import RunDir
from mxc.runtime.triage import catalog as catalog_mod
from mxc.runtime.triage import evidence
from mxc.runtime.triage.logs import Hit, Scanner

LOG_GLOBS = ("train.log", "*.out", "*.err", "slurm-*.log", "logs/*.log")
SITE = re.compile(r"/(site|dist)-packages/(?P<pkg>[A-Za-z0-9_]+)/")
STRUCTURED = (".tsv", ".json", ".jsonl")
TITLED = frozenset({"native_crash", "killed", "stage_timeout", "device_oom", "host_oom", "nccl_error",
                    "cancelled", "jax_platform"})  # detail in title


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

    def cause_line(self) -> str:
        """The cause in one line: what `mxc triage` says first, and what a failed run's record says."""
        if self.cause == "none":
            return f"none ({self.title})"
        return f"{self.title}  [{self.cause}; blame: {self.blame}]"

    def summary(self) -> str:
        """``cause_line`` and the first error's detail where the title does not hold it yet."""
        first = self.first_error
        detail = (first.detail or first.text) if first is not None else None
        return self.cause_line() + (f": {detail[:300]}" if detail and detail not in self.title else "")

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
                           "time": iso_time(hit.time)}
    out.update(hit.extra)
    return out


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


@dataclass
class _Scan:
    """Everything read from one run directory."""

    scanner: Scanner
    facts: evidence.Facts
    attempts: list[int]

    @property
    def hits(self) -> list[Hit]:
        return self.scanner.scan.hits

    def decide(self, number: int) -> tuple[Hit | None, int | None, list[Hit]]:
        """The verdict of one attempt (hits without an attempt belong to every attempt)."""
        hits = [h for h in self.hits if h.attempt in (number, None)]
        exits = {r: float(e["time"]) for (a, r), e in self.facts.exits.items()
                 if a == number and int(e.get("rc", 0)) != 0 and isinstance(e.get("time"), (int, float))}
        return decide(hits, exits)


def _scan(root: Path, record: RunRecord | None) -> _Scan:
    catalog = catalog_mod.load()
    year = int(record.started[:4]) if record and record.started[:4].isdigit() else datetime.now().year
    scanner = Scanner(catalog, root, year)
    facts = evidence.Facts()
    labelled = bool(record and record.backend == "slurm")  # srun --label: unlabelled lines belong to no rank
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
    evidence.platform_hits(record, scanner)
    attempts = sorted(scanner.scan.attempts | {a.number for a in (record.attempts if record else [])})
    evidence.metrics_facts(root, scanner, facts, attempts[-1] if attempts else 0)
    evidence.hang_from_progress(scanner, facts)
    return _Scan(scanner, facts, attempts)


def classify(root: Path, record: RunRecord | None = None) -> Verdict:
    """The verdict for the run in ``root`` (a run directory; the record is read when not given)."""
    run = RunDir(root)
    if record is None and run.record.is_file():
        try:
            record = RunRecord.load(run.record)
        except (OSError, ValueError):
            record = None
    scan = _scan(root, record)
    catalog = scan.scanner.catalog
    nodes = scan.scanner.scan.nodes
    status = record.status if record else "unknown"
    last = scan.attempts[-1] if scan.attempts else 0
    verdict = Verdict(run_id=run.run_id, status=status, cause="none", title="", blame="unknown",
                      exit_code=record.exit_code if record else None, attempts=len(scan.attempts), attempt=last,
                      stacks=scan.facts.stacks, notes=list(scan.scanner.scan.notes))
    host = str(record.host.get("hostname")) if record and record.host else None

    for number in scan.attempts[:-1]:
        earlier, rank, _ = scan.decide(number)
        if earlier is not None:
            first = sorted((h for h in scan.hits if h.cause == earlier.cause and h.attempt == number), key=_sort_key)[0]
            verdict.earlier.append({"attempt": number, "cause": earlier.cause, "title": catalog.cause(earlier.cause).title,
                                    "rank": rank, "node": earlier.node or nodes.get(rank or 0),
                                    "first_error": hit_dict(first)})

    best, rank, candidates = scan.decide(last)
    failed = status in ("failed", "hung", "unknown", "cancelled") or (record is None and best is not None)
    if status == "succeeded" or (not failed and best is None):
        verdict.title = "run succeeded" if status == "succeeded" else f"run is {status}; nothing failed so far"
        if verdict.earlier:
            verdict.title += f" after {len(verdict.earlier)} failed attempt(s)"
        return verdict
    if best is None:
        progress = scan.scanner.scan.progress.get(last)
        if (progress is not None and progress.last_step is not None) or scan.facts.steps:
            verdict.cause, verdict.title = "unknown", "failed; no known error found"
            verdict.try_ = ["Read the end of the log (mxc logs RUN); a new kind of failure belongs in "
                            "mxc/runtime/triage/patterns.yaml with a fixture."]
            return verdict
        c = catalog.cause("startup_failure")
        verdict.cause, verdict.title, verdict.blame = c.id, c.title, c.blame
        if len(nodes) <= 1:
            verdict.rank, verdict.node = 0, nodes.get(0) or host
        verdict.try_ = [t.replace("{detail}", "") for t in c.try_]
        return verdict

    _describe(verdict, best, rank, candidates, record, nodes, host)
    _context(verdict, scan, best, rank if rank is not None else 0)
    return verdict


def _describe(verdict: Verdict, best: Hit, rank: int | None, candidates: list[Hit], record: RunRecord | None,
              nodes: dict[int, str], host: str | None) -> None:
    """Cause, title, where, first error, evidence and what to try."""
    cause = catalog_mod.load().cause(best.cause)
    verdict.cause, verdict.blame, verdict.title, verdict.rank = cause.id, cause.blame, cause.title, rank
    mine = sorted((h for h in candidates if h.cause == best.cause), key=_sort_key)
    first = mine[0]
    verdict.first_error = first
    verdict.node = (first.node or best.node or nodes.get(rank if rank is not None else -1)
                    or (host if rank in (0, None) else None))
    if cause.id == "python_exception":
        verdict.title = f"Python exception in {_where_in_code(first, record)}"
    elif best.detail and len(best.detail) < 60 and cause.id in TITLED:
        verdict.title = f"{cause.title} ({best.detail})"
    texts: set[str] = set()
    for h in mine:
        if h.text not in texts and len(verdict.evidence) < 8:
            texts.add(h.text)
            verdict.evidence.append(h)
    verdict.try_ = _try(first if first.try_ else best)


def _context(verdict: Verdict, scan: _Scan, best: Hit, rank: int) -> None:
    """Crash details and stacks of the failing rank, what else was seen, and each rank's first error."""
    last = verdict.attempt
    catalog = scan.scanner.catalog
    for crash in scan.facts.crashes:
        if crash.attempt == last and crash.rank == rank:
            verdict.crash = crash.as_dict()
    stacks = scan.scanner.scan
    verdict.python_stack = stacks.python_stacks.get((last, rank)) or stacks.other_stacks.get((last, rank), [])
    if best.cause == "hang" and not verdict.python_stack:
        verdict.python_stack = scan.facts.stack_excerpt
    others: dict[tuple[str, int | None], Hit] = {}
    for h in sorted((h for h in scan.hits if h.attempt in (last, None) and h.cause != best.cause), key=_sort_key):
        others.setdefault((h.cause, h.rank), h)
    verdict.also = [{"cause": h.cause, "title": catalog.cause(h.cause).title, "rank": h.rank,
                     "role": h.role, "first": h.text[:200], "where": h.where()}
                    for h in sorted(others.values(), key=lambda h: -h.priority)[:8]]
    per_rank: dict[int, Hit] = {}  # each rank's first cause hit (else its first consequence), in reading order
    for h in sorted((h for h in scan.hits if h.attempt == last), key=lambda h: h.order):
        if h.rank is not None and (h.rank not in per_rank or (per_rank[h.rank].role != "cause" and h.role == "cause")):
            per_rank[h.rank] = h
    verdict.ranks = [{"rank": r, "node": stacks.nodes.get(r), "cause": h.cause, "first": h.text[:200],
                      "where": h.where(), "time": iso_time(h.time)} for r, h in sorted(per_rank.items())]
