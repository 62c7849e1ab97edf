"""Time to first step and compile time, measured as the supervisor reads the training log.

Why here and not from MaxText's own numbers: MaxText reports each step's duration, but not how
long the run took to get there (imports, checkpoints, compilation), which is what a user waits
through and what a slow file system or a cold compilation cache changes. The phases come from
``trainlog.PHASE_LINES``; the first step is the first ``completed step`` line of the run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from mxc.runtime.record import RunRecord, epoch_seconds


@dataclass
class StartupTimes:
    clock: Callable[[], float] = time.monotonic
    _compile_began: float | None = field(default=None, init=False)

    def attempt_started(self) -> None:
        """A new attempt compiles again; only the first finished compilation is recorded."""
        self._compile_began = None

    def phase(self, name: str, record: RunRecord) -> None:
        now = self.clock()
        if name == "compile" and self._compile_began is None:
            self._compile_began = now
        elif name == "first step":
            self._compiled(now, record)

    def first_step(self, record: RunRecord) -> bool:
        """Called on every batch of step lines; True when this was the run's first step (save the record)."""
        self._compiled(self.clock(), record)  # without an ahead-of-time compile, MaxText compiles in step 0
        if record.time_to_first_step_s is not None:
            return False
        started = epoch_seconds(record.started)
        if started is not None:
            record.time_to_first_step_s = round(max(0.0, time.time() - started), 3)
        return True

    def _compiled(self, now: float, record: RunRecord) -> None:
        if self._compile_began is not None and record.compile_s is None:
            record.compile_s = round(now - self._compile_began, 3)
        self._compile_began = None
