"""Evidence that is not a log line: the record, each rank's events (stages, exits) and preflight
files, the kernel log the node program saved, crash notes and stacks, and the metrics.

Everything becomes ``Hit``s for the same catalog ids as the log patterns, so one ranking
decides between them (mxc/runtime/triage/classify.py).
"""

from __future__ import annotations

import math
import re
import signal
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mxc.fsutil import iter_lines, loads, read_json, read_text
from mxc.node import events as node_events
from mxc.runtime.record import RunRecord, epoch_seconds
from mxc.runtime.triage.catalog import Catalog
from mxc.runtime.triage.logs import Hit, Scanner

CRASH_SIGNALS = frozenset({"SIGSEGV", "SIGABRT", "SIGBUS", "SIGILL", "SIGFPE", "SIGQUIT", "SIGTRAP", "SIGSYS"})
CRASH_NOTE = re.compile(r"^crash\.rank-(\d+)\.attempt-(\d+)\.txt$")
NATIVE = re.compile(r"^native\.rank-(\d+)\.attempt-(\d+)\.txt$")
KERNEL_LOG = re.compile(r"^kernel\.(\d+)\.log$")
GDB_FRAME = re.compile(r"^#\d+\s+")
HANG_MIN_SECONDS = 20.0  # a stage timeout counts as a hang when no step came for this long (and 50 steps' time)


@dataclass
class Crash:
    """A fatal signal of one rank in one attempt: what the entrypoint kept."""

    rank: int
    attempt: int
    signal: str | None = None
    core: str | None = None
    backtrace: str | None = None
    note: list[str] = field(default_factory=list)
    native_frames: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "attempt": self.attempt, "signal": self.signal, "core": self.core,
                "backtrace": self.backtrace, "native_frames": self.native_frames, "note": self.note}


@dataclass
class Facts:
    """What the structured files say, besides hits."""

    exits: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)  # (attempt, rank) -> exit event
    crashes: list[Crash] = field(default_factory=list)
    stacks: list[str] = field(default_factory=list)  # other stack dumps (hang detection)
    stack_excerpt: list[str] = field(default_factory=list)
    nan_step: int | None = None
    steps: int = 0


def signal_name(code: int | None) -> str | None:
    if code is None:
        return None
    number = -code if code < 0 else code - 128 if 128 < code < 160 else 0
    try:
        return signal.Signals(number).name if number else None
    except ValueError:
        return None


def _hit(catalog: Catalog, cause: str, text: str, source: str, **kw: Any) -> Hit:
    c = catalog.cause(cause)
    return Hit(cause=cause, role=c.role, priority=kw.pop("priority", c.priority), text=text, source=source,
               try_=c.try_, **kw)


def _signal_hit(catalog: Catalog, sig: str, source: str, **kw: Any) -> Hit | None:
    if sig in CRASH_SIGNALS:
        return _hit(catalog, "native_crash", f"the training process died by {sig}", source, detail=sig, **kw)
    if sig == "SIGKILL":
        return _hit(catalog, "killed", "the training process was killed by SIGKILL", source, detail="SIGKILL", **kw)
    if sig in ("SIGTERM", "SIGINT", "SIGHUP"):
        return _hit(catalog, "killed", f"the training process was stopped by {sig}", source, detail=sig, **kw)
    return None


def rank_files(root: Path, scanner: Scanner, facts: Facts, labelled: bool) -> None:
    """ranks/<rank>/: events.jsonl (stages, exits), preflight.json, kernel.<attempt>.log and other logs."""
    catalog = scanner.catalog
    base = root / "ranks"
    if not base.is_dir():
        return
    for rank_dir in sorted((d for d in base.iterdir() if d.name.isdigit()), key=lambda d: int(d.name)):
        rank = int(rank_dir.name)
        rel = f"ranks/{rank}"
        try:
            lines = read_text(rank_dir / "events.jsonl")  # a regular file only, bounded
        except OSError:
            lines = ""
        numbered, problems = node_events.parse_numbered(lines, node_events.RANK_EVENTS, f"{rel}/events.jsonl")
        scanner.scan.notes.extend(f"invalid event line {p}" for p in problems[:5])
        for _, event in numbered:
            if isinstance(event, node_events.RankStart):
                scanner.scan.nodes.setdefault(rank, event.node)
            elif isinstance(event, node_events.RankExit):
                facts.exits[(event.attempt, rank)] = asdict(event)
        preflight = read_json(rank_dir / "preflight.json")
        if isinstance(preflight, dict) and preflight.get("node"):
            scanner.scan.nodes.setdefault(rank, str(preflight["node"]))
        node = scanner.scan.nodes.get(rank)
        failed_checks = []
        checks = preflight.get("checks") if isinstance(preflight, dict) else None
        if isinstance(preflight, dict) and preflight.get("passed") is False and isinstance(checks, list):
            failed_checks = [f"{c.get('check')}: {c.get('detail')}" for c in checks
                             if isinstance(c, dict) and c.get("status") == "fail"]
        source = f"{rel}/events.jsonl"
        for number, event in numbered:
            if not isinstance(event, node_events.StageEnd) or event.rc == 0:
                continue
            where = {"line": number, "rank": rank, "node": node, "attempt": event.attempt, "time": event.time}
            text = f"stage {event.stage} exited {event.rc} after {event.seconds:.0f}s"
            if event.stage == "preflight":
                for check in failed_checks or [f"exit {event.rc}"]:
                    scanner.add(_hit(catalog, "preflight_failed", f"{text}: {check}", source, detail=check, **where))
            elif event.timed_out or event.rc == 124:
                scanner.add(_hit(catalog, "stage_timeout", text + " (timed out)", source, detail=event.stage, **where))
            elif sig := signal_name(event.rc):
                hit = _signal_hit(catalog, sig, source, **where)
                if hit:
                    hit.text = f"{text} ({sig})"
                    scanner.add(hit)
        for path in sorted(rank_dir.iterdir()):
            if m := KERNEL_LOG.match(path.name):
                scanner.read_file(path, rank=rank, attempt=int(m[1]))
            elif path.suffix in (".log", ".out", ".err") and path.is_file():
                scanner.read_file(path, rank=rank, labelled=labelled)


def stack_files(root: Path, scanner: Scanner, facts: Facts) -> None:
    """stacks/: crash notes and gdb backtraces from entrypoint.sh, and any other dumps (hangs)."""
    base = root / "stacks"
    if not base.is_dir():
        return
    crashes: dict[tuple[int, int], Crash] = {}
    for path in sorted(base.iterdir()):
        if not path.is_file():
            continue
        if m := CRASH_NOTE.match(path.name):
            crash = crashes.setdefault((int(m[2]), int(m[1])), Crash(rank=int(m[1]), attempt=int(m[2])))
            node: str | None = None
            for line in _lines(path):
                key, _, value = line.partition(": ")
                if key == "signal":
                    number = value.split()[0]
                    crash.signal = signal_name(128 + int(number)) if number.isdigit() else value
                elif key == "core" and value.startswith("cores/"):
                    crash.core = value.split()[0]
                elif key == "backtrace" and value.startswith("stacks/"):
                    crash.backtrace = value.split()[0]
                elif key == "node":
                    node = value
                elif key == "address_space_limit_kb" and value.isdigit() and crash.signal in CRASH_SIGNALS:
                    scanner.add(_hit(
                        scanner.catalog, "host_oom",
                        f"{crash.signal} under an address-space limit of {int(value) // 1024} MB (ulimit -v {value}):"
                        " a failed allocation is the likely cause", f"stacks/{path.name}",
                        detail=f"ulimit -v {value}", rank=crash.rank, attempt=crash.attempt, node=node))
                if key in ("core", "backtrace"):
                    crash.note.append(line)
        elif m := NATIVE.match(path.name):
            crash = crashes.setdefault((int(m[2]), int(m[1])), Crash(rank=int(m[1]), attempt=int(m[2])))
            crash.native_frames = crashing_thread(path)
        else:
            facts.stacks.append(f"stacks/{path.name}")
            if not facts.stack_excerpt:
                facts.stack_excerpt = stack_excerpt(path)
    facts.crashes = [crashes[k] for k in sorted(crashes)]


def _lines(path: Path) -> list[str]:
    """A crash note's or stack dump's lines; none when it is not a regular file (a FIFO is not waited on)."""
    try:
        return read_text(path).splitlines()
    except OSError:
        return []


def stack_excerpt(path: Path, limit: int = 12) -> list[str]:
    """The first thread of a stack dump (py-spy's "Thread ... (active)" block, or faulthandler's)."""
    out: list[str] = []
    for line in _lines(path):
        if line.startswith("#") or not line.strip():
            if out:
                break
            continue
        out.append(line.rstrip()[:200])
        if len(out) >= limit:
            break
    return out


def crashing_thread(path: Path, limit: int = 12) -> list[str]:
    """The frames of the thread that got the signal, from gdb's ``thread apply all bt``.

    gdb names it ("[Current thread is N ...]"); its block is "Thread N (...)". Frames above
    "<signal handler called>" are faulthandler re-raising the signal, so the list starts below it.
    """
    lines = _lines(path)
    signal_line = next((ln.strip() for ln in lines if ln.startswith("Program terminated with signal")), "")
    current = next((m[1] for ln in lines if (m := re.match(r"^\[Current thread is (\d+) ", ln))), None)
    frames: list[str] = []
    inside = False
    for line in lines:
        if line.startswith("Thread "):
            if inside:
                break
            inside = current is not None and line.startswith(f"Thread {current} (")
            continue
        if inside and GDB_FRAME.match(line):
            frames.append(re.sub(r"\s+", " ", line.strip())[:200])
    if not frames:  # no "thread apply all" output: the frame gdb printed when it loaded the core
        frames = [re.sub(r"\s+", " ", ln.strip())[:200] for ln in lines if GDB_FRAME.match(ln)][:1]
    handler = next((i for i, f in enumerate(frames) if "<signal handler called>" in f), None)
    if handler is not None and handler + 1 < len(frames):
        frames = frames[handler + 1:]
    return ([signal_line] if signal_line else []) + frames[:limit]


# Who stopped a cancelled run (record.cancelled_by), for a person.
CANCELLED_BY = {"mxc cancel": "mxc cancel", "SIGINT": "Ctrl-C: SIGINT to mxc run",
                "SIGTERM": "SIGTERM to mxc run: kill or an older mxc cancel", "SIGHUP": "SIGHUP: mxc run's terminal closed"}


def record_hits(record: RunRecord, scanner: Scanner) -> None:
    catalog = scanner.catalog
    last = max((a.number for a in record.attempts), default=0)
    if record.status == "cancelled":  # the record knows: no signal the trainer died of is evidence of a failure
        by = CANCELLED_BY.get(record.cancelled_by or "", record.cancelled_by or record.message or "status cancelled")
        scanner.add(_hit(catalog, "cancelled", f"status cancelled ({by})", "record.json", attempt=last,
                         detail=by))
    if record.status == "hung":
        scanner.add(_hit(catalog, "hang", f"record.json: status hung ({record.message or 'no progress'})", "record.json",
                         attempt=last, detail=record.message or "status hung", priority=catalog.cause("hang").priority + 10))
    for attempt in record.attempts:
        if attempt.hung:  # the supervisor marks the attempt the node program's hang watch stopped
            scanner.add(_hit(catalog, "hang", f"record.json: attempt {attempt.number}: {attempt.reason or 'hung'}",
                             "record.json", attempt=attempt.number, time=epoch_seconds(attempt.ended),
                             detail=attempt.reason or "hung"))
            continue
        if attempt.signal and attempt.exit_code not in (None, 0):
            hit = _signal_hit(catalog, attempt.signal, "record.json", attempt=attempt.number, time=epoch_seconds(attempt.ended))
            if hit:
                hit.priority -= 1  # the rank's own files say more (which rank, which stage)
                scanner.add(hit)
    state = (record.slurm.state if record.slurm else None) or ""
    mapping = {"NODE_FAIL": "node_failure", "OUT_OF_MEMORY": "host_oom", "TIMEOUT": "time_limit", "PREEMPTED": "preempted"}
    if state in mapping:
        failure = record.slurm.first_failure if record.slurm else None
        scanner.add(_hit(catalog, mapping[state], f"Slurm job state {state}", "record.json", attempt=last,
                         rank=failure.rank if failure else None, node=failure.node if failure else None, detail=state))


def platform_hits(record: RunRecord | None, scanner: Scanner) -> None:
    """JAX's platform start-up, told apart from the code and the config: a traceback that ends in
    jax's backend start-up (xla_bridge.py) is a ``jax_platform`` failure too, and each such hit names
    the training's JAX_PLATFORMS (the record's view of rank 0's training environment)."""
    environment = (record.training or {}).get("environment") if record else None
    wanted = environment.get("JAX_PLATFORMS") if isinstance(environment, dict) else None
    named = f"JAX_PLATFORMS={wanted}" if wanted else "JAX_PLATFORMS not set"
    for hit in list(scanner.scan.hits):
        innermost = str((hit.extra.get("innermost") or {}).get("file", ""))
        if hit.cause == "python_exception" and innermost.endswith("jax/_src/xla_bridge.py"):
            scanner.add(_hit(scanner.catalog, "jax_platform", hit.text, hit.source, line=hit.line, rank=hit.rank,
                             node=hit.node, attempt=hit.attempt, time=hit.time, detail=named))
        elif hit.cause == "jax_platform" and hit.detail is None:
            hit.detail = named
        elif hit.cause == "jax_platform":
            hit.detail = f"{named}: {hit.detail}"


def metrics_facts(root: Path, scanner: Scanner, facts: Facts, attempt: int) -> None:
    """metrics.jsonl: how many steps, and the first step whose loss is not finite."""
    path = root / "metrics.jsonl"
    for number, line in enumerate(iter_lines(path), 1):
        try:
            data = loads(line.decode("utf-8", "replace"))
            loss = float(data["learning/loss"])
            step = int(data["step"])
        except (ValueError, KeyError, TypeError, OverflowError):  # OverflowError: an int beyond any float, inf
            continue
        facts.steps += 1
        if not math.isfinite(loss) and facts.nan_step is None:
            facts.nan_step = step
            scanner.add(_hit(scanner.catalog, "nan_loss", f"metrics.jsonl: step {step} loss {loss}", "metrics.jsonl",
                             line=number, attempt=attempt, rank=0, detail=f"loss {loss} at step {step}"))


def hang_from_progress(scanner: Scanner, facts: Facts) -> None:
    """A stage timeout after training stopped stepping long before it is a hang, not a slow run."""
    for hit in [h for h in scanner.scan.hits if h.cause == "stage_timeout" and h.attempt is not None]:
        progress = scanner.scan.progress.get(hit.attempt or 0)
        if progress is None or progress.last_step_time is None:
            continue
        end = hit.time or progress.last_time
        if end is None:
            continue
        typical = statistics.median(progress.step_seconds) if progress.step_seconds else 0.0
        quiet = end - progress.last_step_time
        if quiet >= max(HANG_MIN_SECONDS, 50 * typical):
            scanner.add(_hit(
                scanner.catalog, "hang",
                f"no step for {quiet:.0f}s after step {progress.last_step} (steps took {typical:.3f}s); "
                "the stage timeout then stopped it",
                hit.source, line=hit.line, rank=hit.rank, node=hit.node, attempt=hit.attempt, time=hit.time,
                detail=f"no step for {quiet:.0f}s after step {progress.last_step}",
                priority=scanner.catalog.cause("stage_timeout").priority + 1,
            ))
