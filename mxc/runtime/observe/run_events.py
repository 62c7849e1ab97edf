"""The run's life as JSON lines (``<run>/observability/events.jsonl``): attempts, hangs, the end.

The supervisor-side observer appends; the exporter reads incrementally and turns the lines
into annotation series (restarts, hangs), so one run is one set of training series with its
restarts marked on it, and a dashboard can draw them without reading ``record.json``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from mxc.plugins.tail import JsonlTail

EVENTS = "events.jsonl"


def append(path: Path, event: str, **fields: Any) -> None:
    """One line per event; small appends are atomic enough for a single writer."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"time": time.time(), "event": event, **fields}, sort_keys=True)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


class RunEventsCollector:
    """Annotation series from the events file; cheap (reads only new lines)."""

    def __init__(self, path: Path) -> None:
        self.tail = JsonlTail(path)
        self.attempt: int | None = None
        self.attempt_started: dict[int, float] = {}
        self.attempt_ended: dict[int, tuple[float, int]] = {}
        self.hangs = 0
        self.running = False

    def update(self) -> None:
        for line in self.tail.read_new():
            kind, when = line.get("event"), float(line.get("time", 0.0))
            number = line.get("attempt")
            if kind == "attempt_start" and isinstance(number, int):
                self.attempt = number
                self.attempt_started[number] = when
                self.running = True
            elif kind == "attempt_end" and isinstance(number, int):
                self.attempt_ended[number] = (when, int(line.get("exit_code", 0)))
                self.running = False
            elif kind == "hang":
                self.hangs += 1
            elif kind == "run_end":
                self.running = False

    def collect(self) -> Iterable[Metric]:
        self.update()
        out: list[Metric] = []
        if self.attempt is not None:
            out.append(GaugeMetricFamily("mxc_run_attempt", "current attempt (0 = first start)", value=self.attempt))
        out.append(CounterMetricFamily("mxc_run_restarts", "automatic restarts so far",
                                       value=max(0, len(self.attempt_started) - 1)))
        out.append(CounterMetricFamily("mxc_run_hangs", "hangs detected (the node program's hang watch: runtime.hang)",
                                       value=self.hangs))
        out.append(GaugeMetricFamily("mxc_run_training", "1 while a training attempt runs", value=1 if self.running else 0))
        started = GaugeMetricFamily("mxc_run_attempt_start_timestamp_seconds", "start of each attempt (annotation)",
                                    labels=["attempt"])
        for number, when in sorted(self.attempt_started.items()):
            started.add_metric([str(number)], when)
        ended = GaugeMetricFamily("mxc_run_attempt_exit_code", "exit code of each finished attempt", labels=["attempt"])
        for number, (_, code) in sorted(self.attempt_ended.items()):
            ended.add_metric([str(number)], code)
        out += [started, ended]
        return out
