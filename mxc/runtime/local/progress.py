"""A one-line live progress bar on stderr: step, loss, steps/s, attempt, phase, elapsed time.

Fed with step events parsed from the training log (``trainlog``), and before the first step
with the phase the run is in (code, preflight, image, start-up, compile, first step: minutes
can pass there, and "starting" alone looks hung). The elapsed time counts from the bar's
creation, the start of ``mxc run``. Drawn only on a terminal (redirected output stays clean
for logs and scripts) and never when ``--quiet``.
"""

from __future__ import annotations

import math
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import TextIO

from mxc.runtime.logs.trainlog import StepEvent

WIDTH = 24
RATE_WINDOW_S = 5.0


class ProgressBar:
    def __init__(self, total_steps: int | None, stream: TextIO | None = None, enabled: bool | None = None,
                 min_interval: float = 0.1, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.started = clock()
        self.stream = stream or sys.stderr
        self.total = total_steps
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.min_interval = min_interval
        self.attempt = 0
        self.status = "starting"
        self.step: int | None = None
        self.loss: float | None = None
        self._times: deque[tuple[float, int]] = deque()
        self._drawn = 0.0
        self._visible = False

    def set_status(self, status: str, attempt: int | None = None) -> None:
        self.status = status
        if attempt is not None:
            self.attempt = attempt
            self._times.clear()
        self.draw(force=True)

    def update(self, events: list[StepEvent], now: float | None = None) -> None:
        if not events:
            return
        now = time.monotonic() if now is None else now
        for event in events:
            self._times.append((now, event.step))
        while len(self._times) > 2 and now - self._times[0][0] > RATE_WINDOW_S:
            self._times.popleft()
        last = events[-1]
        self.step, self.loss, self.status = last.step, last.loss, "training"
        self.draw()

    def rate(self) -> float | None:
        """Steps per second over the last few seconds (log lines arrive in bursts)."""
        if len(self._times) < 2:
            return None
        (t0, s0), (t1, s1) = self._times[0], self._times[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else None

    def line(self) -> str:
        done = 0 if self.step is None else self.step + 1
        if self.total:
            filled = min(WIDTH, round(WIDTH * done / self.total))
            bar = "[" + "#" * filled + "." * (WIDTH - filled) + f"] {done}/{self.total}"
        else:
            bar = f"step {done}"
        parts = [bar]
        if self.loss is not None:
            parts.append(f"loss {self.loss:.3f}" if math.isfinite(self.loss) else "loss nan")
        rate = self.rate()
        if rate is not None:
            parts.append(f"{rate:.1f} steps/s")
        if self.attempt:
            parts.append(f"restart {self.attempt}")
        if self.status != "training":
            parts.append(self.status)
        parts.append(elapsed(self.clock() - self.started))
        return "  ".join(parts)

    def draw(self, force: bool = False) -> None:
        if not self.enabled:
            return
        now = self.clock()
        if not force and now - self._drawn < self.min_interval:
            return
        self._drawn = now
        self.stream.write("\r\x1b[K" + self.line())
        self.stream.flush()
        self._visible = True

    def tick(self) -> None:
        """Redraw at most once a second when nothing new came (the elapsed time moves on)."""
        if self.enabled and self.clock() - self._drawn >= 1.0:
            self.draw(force=True)

    def close(self) -> None:
        if self.enabled and self._visible:
            self.draw(force=True)
            self.stream.write("\n")
            self.stream.flush()
            self._visible = False


def elapsed(seconds: float) -> str:
    """``42s``, ``3m07s``, ``2h05m``: short enough for the bar."""
    whole = max(0, int(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
