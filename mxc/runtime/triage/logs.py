"""Read a run's logs into evidence: every line that matches the catalog, with its rank, node,
attempt and time.

A run's output mixes ranks and attempts: the local supervisor appends every attempt to
``train.log``; a Slurm job appends all nodes' output to the same file, each line labelled
``R: `` by ``srun --label``; per-rank files may live under ``ranks/<rank>/``. Lines carry time
only when the program logged it (absl ``I1123 09:51:09.195687``, TSL ``2024-01-01 10:00:00.1:``,
Slurm ``CANCELLED AT ...``); a line without one inherits the last time seen for its rank, which
is how the first failing rank is found: the rank whose first error is earliest.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from mxc.fsutil import open_regular
from mxc.runtime.logs.trainlog import RESTORE_LINE, STEP_PREFIX
from mxc.runtime.triage.catalog import Catalog

MAX_TEXT = 1000  # characters of a line kept as evidence (tensorstore errors run to several KB)
MAX_BYTES = 256 << 20  # per file: longer logs are read from their last 256 MB (noted in the verdict)

ABSL_TIME = re.compile(r"^[IWEF](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})\.(\d+) ")
TSL_TIME = re.compile(r"^(\d{4}-\d{2}-\d{2}) (\d{2}:\d{2}:\d{2})\.(\d+): [IWEF] ")
ISO_AT = re.compile(r"\bAT (\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})\b")
SRUN_LABEL = re.compile(r"^\s*(\d+): ")
ENTRY = re.compile(r"^\[mxc (\S+) rank (\d+)\] (.*)$")
ENTRY_ATTEMPT = re.compile(r"^bundle \S+ attempt (\d+) ")
SUPERVISOR_ATTEMPT = re.compile(r"^\[mxc\] attempt (\d+): start")
BATCH_RESTART = re.compile(r"^\[mxc batch \S+\] .*\brestart (\d+) of at most")
TRACEBACK = "Traceback (most recent call last):"
HANDLING = "During handling of the above exception, another exception occurred"
FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+),? in (?P<func>\S.*)$')
EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(: (?P<msg>.*))?$")
FAULT_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ .*most recent call first")
# Lines that repeat other lines (mxc's own summaries, the full command line, MaxText's config dump).
SKIP = re.compile(r"^\[mxc\] (run|attempt \d+: exit)|^\[mxc \S+ rank \d+\] train: |Config param ")


@dataclass
class Hit:
    """One piece of evidence for a cause."""

    cause: str
    role: str
    priority: int
    text: str
    source: str
    line: int | None = None
    rank: int | None = None
    node: str | None = None
    attempt: int | None = None
    time: float | None = None
    detail: str | None = None
    try_: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    groups: dict[str, str] = field(default_factory=dict)  # the pattern's named groups, for {name} in `try`
    order: int = 0

    def where(self) -> str:
        return f"{self.source}:{self.line}" if self.line else self.source


@dataclass
class Progress:
    """Steps seen in one attempt: for hang detection and the 'failed before its first step' verdict."""

    last_step: int | None = None
    last_step_time: float | None = None
    last_time: float | None = None
    step_seconds: list[float] = field(default_factory=list)
    restored: int | None = None


@dataclass
class LogScan:
    hits: list[Hit] = field(default_factory=list)
    nodes: dict[int, str] = field(default_factory=dict)  # rank -> node
    attempts: set[int] = field(default_factory=set)
    progress: dict[int, Progress] = field(default_factory=dict)
    python_stacks: dict[tuple[int | None, int | None], list[str]] = field(default_factory=dict)  # (attempt, rank)
    other_stacks: dict[tuple[int | None, int | None], list[str]] = field(default_factory=dict)  # last non-current thread
    notes: list[str] = field(default_factory=list)


@dataclass
class _Stream:
    """What is known about one rank's lines in one file."""

    rank: int | None
    attempt: int = 0
    time: float | None = None
    traceback: list[str] | None = None
    frames: list[tuple[str, int, str]] = field(default_factory=list)
    tb_start: int = 0
    tb_noise: int = 0
    fault: str | None = None  # inside a faulthandler dump: "current" (the crashing thread) or "other"


def _absl_time(match: re.Match[str], year: int) -> float:
    month, day, hh, mm, ss, frac = match.groups()
    stamp = datetime(year, int(month), int(day), int(hh), int(mm), int(ss))
    return time.mktime(stamp.timetuple()) + float("0." + frac)


def line_time(text: str, year: int) -> float | None:
    if m := ABSL_TIME.match(text):
        try:
            return _absl_time(m, year)
        except ValueError:
            return None
    if m := TSL_TIME.match(text):
        return time.mktime(datetime.fromisoformat(f"{m[1]}T{m[2]}").timetuple()) + float("0." + m[3])
    if m := ISO_AT.search(text):
        return time.mktime(datetime.fromisoformat(m[1]).timetuple())
    return None


def _read_lines(path: Path, notes: list[str], root: Path) -> Iterator[tuple[int, str]]:
    try:
        fh = open_regular(path)  # a FIFO or directory in a log's place is skipped, never waited on
    except OSError:
        notes.append(f"{path.relative_to(root)}: not a regular file, not read")
        return
    with fh:
        size = os.fstat(fh.fileno()).st_size
        start = 0
        if size > MAX_BYTES:
            start = size - MAX_BYTES
            fh.seek(start)
            fh.readline()  # a partial line
            notes.append(f"{path.relative_to(root)}: {size >> 20} MB, only its last {MAX_BYTES >> 20} MB were read")
        for number, raw in enumerate(fh, 1):
            yield number, raw.decode("utf-8", "replace").rstrip("\r\n")


class Scanner:
    """Feeds lines of the run's files through the catalog."""

    def __init__(self, catalog: Catalog, root: Path, year: int) -> None:
        self.catalog = catalog
        self.root = root
        self.year = year
        self.scan = LogScan()
        self._order = 0
        self._cancelled: set[tuple[str, int]] = set()  # (file, attempt) where Slurm cancelled the step

    def add(self, hit: Hit) -> None:
        self._order += 1
        hit.order = self._order
        self.scan.hits.append(hit)
        if hit.attempt is not None:
            self.scan.attempts.add(hit.attempt)

    # ---- files

    def read_file(self, path: Path, rank: int | None = None, attempt: int | None = None,
                  labelled: bool = False) -> None:
        """Scan one file. ``rank``/``attempt``: known from its place (ranks/<r>/kernel.<a>.log);
        ``labelled``: lines carry srun's ``R: `` label (a Slurm job's output), so unlabelled lines
        belong to no rank."""
        source = str(path.relative_to(self.root))
        streams: dict[int | None, _Stream] = {}
        file_attempt = attempt or 0
        last_time: float | None = None
        for number, raw in _read_lines(path, self.scan.notes, self.root):
            text = raw
            line_rank = rank
            if m := SRUN_LABEL.match(text):
                labelled = True
                line_rank = int(m[1])
                text = text[m.end():]
            elif labelled:
                line_rank = None  # srun's own lines, or the batch shell's, in a labelled file
            node = None
            if m := ENTRY.match(text):
                node, line_rank = m[1], int(m[2])
                self.scan.nodes.setdefault(line_rank, node)
                if a := ENTRY_ATTEMPT.match(m[3]):
                    file_attempt = max(file_attempt, int(a[1]))
                    streams.setdefault(line_rank, _Stream(line_rank)).attempt = int(a[1])
            elif (m := SUPERVISOR_ATTEMPT.match(text)) or (m := BATCH_RESTART.match(text)):
                file_attempt = int(m[1])
                for s in streams.values():
                    s.attempt = file_attempt
            if attempt is None and line_rank is None and not labelled:
                line_rank = 0 if rank is None else rank
            stream = streams.get(line_rank)
            if stream is None:
                stream = streams[line_rank] = _Stream(line_rank, attempt=file_attempt)
            if attempt is not None:
                stream.attempt = attempt
            elif line_rank is None:
                stream.attempt = file_attempt
            t = line_time(text, self.year)
            if t is not None:
                stream.time = t
                last_time = t
            elif stream.time is None:
                stream.time = last_time
            self._line(stream, source, number, text, node)

    def _line(self, stream: _Stream, source: str, number: int, text: str, node: str | None) -> None:
        progress = self.scan.progress.setdefault(stream.attempt, Progress())
        self.scan.attempts.add(stream.attempt)
        if stream.time is not None:
            progress.last_time = max(progress.last_time or 0, stream.time)
        if "completed step" in text and (m := STEP_PREFIX.search(text)):
            progress.last_step, progress.last_step_time = int(m[1]), stream.time
            if len(progress.step_seconds) < 10000:
                progress.step_seconds.append(float(m[2]))
            return
        if "restoring from" in text and (m := RESTORE_LINE.search(text)):
            progress.restored = int(m[1])
        self._python(stream, source, number, text)
        if SKIP.search(text) or not self.catalog.prefilter.search(text):
            return
        for pattern in self.catalog.patterns:
            m = pattern.regex.search(text)
            if not m:
                continue
            if pattern.context == "restore" and progress.restored is None:
                continue
            groups = m.groupdict()
            rank = int(groups["rank"]) if groups.get("rank") else stream.rank
            role = pattern.role
            if pattern.cause == "step_cancelled":
                self._cancelled.add((source, stream.attempt))
            elif pattern.cause == "killed" and (source, stream.attempt) in self._cancelled:
                role = "consequence"  # srun kills the other tasks after the step was cancelled
            last = self.scan.hits[-1] if self.scan.hits else None
            if role == "consequence" and last and last.cause == "python_exception" and last.line == number \
                    and last.source == source:
                last.role = "consequence"  # the exception only reports a peer's failure
            self.add(Hit(
                cause=pattern.cause, role=role, priority=pattern.priority, text=text.strip()[:MAX_TEXT], source=source,
                line=number, rank=rank, node=groups.get("node") or node or self.scan.nodes.get(rank if rank is not None else -1),
                attempt=stream.attempt, time=stream.time, detail=(groups.get("detail") or "").strip() or None,
                try_=pattern.try_, groups={k: v for k, v in groups.items() if v and k not in ("rank", "node")},
            ))
            return  # one cause per line: the first pattern in catalog order (most specific first)

    def _python(self, stream: _Stream, source: str, number: int, text: str) -> None:
        """Tracebacks (-> python_exception with the innermost frame) and faulthandler stacks."""
        if text.startswith(TRACEBACK):
            stream.traceback, stream.frames, stream.tb_start, stream.tb_noise = [], [], number, 0
            return
        if text.startswith(HANDLING):
            # The exception above was being handled (an optional import, a retry) when the real
            # one happened: it is context, not the cause.
            for hit in reversed(self.scan.hits[-20:]):
                if hit.cause == "python_exception" and hit.source == source and hit.rank == stream.rank:
                    hit.role = "consequence"
                    break
            return
        if FAULT_THREAD.match(text):
            # faulthandler: every Python thread's stack; the one that got the signal is "Current
            # thread". A signal that hit a thread without Python state (an XLA worker) marks none:
            # then the last thread listed (the oldest, normally the main thread) stands in.
            key = (stream.attempt, stream.rank)
            stream.fault = "current" if text.startswith("Current thread") else "other"
            if stream.fault == "current":
                self.scan.python_stacks[key] = [text.strip()]
            else:
                self.scan.other_stacks[key] = [text.strip()]
            return
        if stream.fault is not None:
            if text.startswith("  File "):
                key = (stream.attempt, stream.rank)
                stacks = self.scan.python_stacks if stream.fault == "current" else self.scan.other_stacks
                stack = stacks.get(key)
                if stack is not None and len(stack) < 16:
                    stack.append(text.strip())
                return
            stream.fault = None
        if stream.traceback is None:
            return
        if m := FRAME.match(text):
            stream.frames.append((m["file"], int(m["line"]), m["func"]))
            return
        if text.startswith((" ", "\t")) or not text:
            return
        m = EXCEPTION.match(text)
        if not m or not stream.frames:
            stream.tb_noise += 1  # another thread's line in the middle of the traceback
            if stream.tb_noise > 5:
                stream.traceback = None
            return
        frames, stream.traceback = stream.frames, None
        file, line, func = frames[-1]
        cause = self.catalog.cause("python_exception")
        self.add(Hit(
            cause="python_exception", role="cause", priority=cause.priority, text=text.strip()[:MAX_TEXT], source=source,
            line=number, rank=stream.rank, node=self.scan.nodes.get(stream.rank if stream.rank is not None else -1),
            attempt=stream.attempt, time=stream.time, detail=text.strip()[:300], try_=cause.try_,
            extra={"innermost": {"file": file, "line": line, "function": func},
                   "frames": [f"{f}:{n} in {fn}" for f, n, fn in frames[-4:]], "traceback_line": stream.tb_start},
        ))
