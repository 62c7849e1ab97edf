"""Read MaxText's training log as it grows: completed steps, losses, restores.

MaxText logs ``completed step: N, seconds: S, ..., loss: L, ...`` on stderr for every step
(0-based, 3 decimals, one step late). The log is good enough for live progress; exact
values come from the metrics file (``metrics_merge``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from mxc.fsutil import open_regular, read_tail

# The one definition of MaxText's per-step line; the Slurm record and triage read it too.
STEP_PREFIX = re.compile(r"completed step: (?P<step>\d+), seconds: (?P<seconds>[\d.]+)")
STEP_LINE = re.compile(
    STEP_PREFIX.pattern
    + r"(?:, TFLOP/s/device: [\d.]+, Tokens/s/device: [\d.]+)?, total_weights: \S+, loss: (?P<loss>[^,\s]+)"
)
RESTORE_LINE = re.compile(r"restoring from this run's directory step (?P<step>\d+)")
# Where a starting attempt is, told by the first line of each phase (the node program's stage
# lines, then MaxText's): the progress bar shows the phase, the record the compile time.
# "compile" starts when MaxText is done with checkpoints (restored or not) and ends with its report
# of the compiled train step's memory; without that report (no ahead-of-time compile) MaxText
# compiles inside the first step, and compilation ends with the first step line.
PHASE_LINES: tuple[tuple[bytes, str], ...] = (
    (b"] stage preflight: start", "preflight"),
    (b"] stage image: start", "image"),
    (b"] stage train: start", "start-up"),
    (b"No existing checkpoints found, not restoring checkpoint", "compile"),
    (b"restoring from this run's directory step", "compile"),
    (b"Loading full state from path", "compile"),
    (b"restoring params from", "compile"),
    (b"[train] Total estimated memory size", "first step"),
)
# Lines that say why an attempt failed, best first: mxc's own stage messages, then Python's
# final exception line, then absl fatal/error lines (e.g. "Unknown flag in XLA_FLAGS").
_REASONS = (
    re.compile(r"^preflight failed: .*|.*\] stage \w+ timed out after .*"),
    re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)\b: .*"),
    re.compile(r"^[FE]\d{4} [\d:. ]+\d+ \S+\] .*"),
    re.compile(r".*(: No such file or directory|: command not found|: Permission denied)$"),
    re.compile(r".*\] stage \w+ failed \(exit \d+\)$"),
)


@dataclass(frozen=True)
class StepEvent:
    step: int
    loss: float
    seconds: float


def parse_step(line: str) -> StepEvent | None:
    match = STEP_LINE.search(line)
    if not match:
        return None
    try:
        loss = float(match["loss"])
    except ValueError:
        loss = math.nan
    return StepEvent(int(match["step"]), loss, float(match["seconds"]))


@dataclass
class LogFollower:
    """Reads only what was appended since the last call; keeps a partial last line for later."""

    path: Path
    offset: int = 0
    _partial: bytes = b""
    last_step: StepEvent | None = None
    restored_step: int | None = None
    steps_seen: int = 0

    attempt_offset: int = 0
    phases: list[str] = field(default_factory=list)  # phases entered since the last ``take_phases``

    def start_at_end(self) -> None:
        """Ignore what is already in the log (an earlier attempt's lines)."""
        try:
            self.offset = self.path.stat().st_size
        except FileNotFoundError:
            self.offset = 0
        self.attempt_offset = self.offset
        self._partial = b""

    def failure_reason(self, limit: int = 1 << 22) -> str | None:
        """The most telling line of the current attempt's output, for a failed run's message."""
        try:
            with open_regular(self.path) as fh:
                fh.seek(max(self.attempt_offset, self.offset - limit))
                text = fh.read(limit).decode("utf-8", "replace")
        except OSError:
            return None
        lines = text.splitlines()
        for pattern in _REASONS:
            for line in reversed(lines):
                if pattern.match(line.strip()):
                    return line.strip()[:300]
        return None

    def reset_attempt(self) -> None:
        self.restored_step = None
        self.steps_seen = 0
        self.phases.clear()

    def take_phases(self) -> list[str]:
        """The phases whose first line was read since the last call, in order."""
        taken, self.phases = self.phases, []
        return taken

    def poll(self, limit: int = 1 << 22) -> list[StepEvent]:
        """New step events since the last poll (reads at most ``limit`` bytes per call)."""
        try:
            with open_regular(self.path) as fh:
                fh.seek(self.offset)
                data = fh.read(limit)
        except OSError:
            return []
        if not data:
            return []
        self.offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        events: list[StepEvent] = []
        for raw in lines:
            if b"completed step" in raw:
                event = parse_step(raw.decode("utf-8", "replace"))
                if event:
                    events.append(event)
            elif b"restoring from this run" in raw:
                match = RESTORE_LINE.search(raw.decode("utf-8", "replace"))
                if match:
                    self.restored_step = int(match["step"])
            if not self.steps_seen and not events:  # phases are before the first step only
                self._phase(raw)
        if events:
            self.last_step = events[-1]
            self.steps_seen += len(events)
        return events

    def _phase(self, raw: bytes) -> None:
        for marker, phase in PHASE_LINES:
            if marker in raw:
                self.phases.append(phase)
                return


def last_step_in_tail(path: Path, tail_bytes: int = 1 << 16) -> StepEvent | None:
    """The last completed step in the end of a log: cheap status for live runs in `mxc runs`."""
    try:
        text = read_tail(path, tail_bytes)[0].decode("utf-8", "replace")
    except OSError:  # missing, or a FIFO or directory where the log belongs: no progress to show
        return None
    for line in reversed(text.splitlines()):
        event = parse_step(line)
        if event:
            return event
    return None
