"""What ``mxc report`` shows of one run, read from its directory: per-step curves, host/GPU series.

Per-step curves (loss, step time, throughput, learning rate) come from the run's merged
``metrics.jsonl``: exact, every step, no scrape-interval sampling. Host and GPU curves over
time come from the run's Prometheus TSDB (reopened read-only). Restarts are kept where they
happened: at the step training resumed from, and at the wall time the attempt started.
"""

from __future__ import annotations

import contextlib
import math
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mxc.fsutil import iter_lines, loads
from mxc.runtime.record import RunRecord, epoch_seconds
from mxc.runtime.rundir import RunDir

if TYPE_CHECKING:
    from mxc.report.outcome import Outcome

LOSS, STEP_TIME = "learning/loss", "perf/step_time_seconds"
TOKENS, LR = "perf/per_device_tokens_per_sec", "learning/current_learning_rate"


@dataclass
class RunData:
    run: RunDir
    record: RunRecord
    steps: list[int] = field(default_factory=list)
    values: dict[str, list[float | None]] = field(default_factory=dict)
    host: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # name -> [(seconds since start, value)]
    gpu: dict[str, dict[str, list[tuple[float, float]]]] = field(default_factory=dict)  # panel -> gpu -> points
    restarts_at_step: list[int] = field(default_factory=list)
    restarts_at_time: list[float] = field(default_factory=list)
    training_spans: list[tuple[float, float]] = field(default_factory=list)  # attempts, seconds since start
    tsdb_note: str = ""
    outcome: Outcome | None = None  # what happened (triage verdict, stages): mxc.report.collect

    @property
    def label(self) -> str:
        return f"{self.record.spec_name} {self.run.run_id}"

    def series(self, key: str) -> tuple[list[int], list[float]]:
        xs, ys = [], []
        for step, value in zip(self.steps, self.values.get(key, []), strict=False):
            if value is not None:
                xs.append(step)
                ys.append(value)
        return xs, ys

    def finite(self, key: str) -> list[float]:
        return [y for y in self.series(key)[1] if math.isfinite(y)]

    def first_nonfinite_loss(self) -> int | None:
        """The first step whose loss is NaN or infinite (training diverged there)."""
        return next((x for x, y in zip(*self.series(LOSS), strict=True) if not math.isfinite(y)), None)

    def summary(self) -> dict[str, Any]:
        """The figures of the run, every one finite or None (``--json`` prints them)."""
        _, losses = self.series(LOSS)
        times, tokens = self.finite(STEP_TIME), self.finite(TOKENS)
        steady = times[2:] or times  # steps 0-1 include compilation
        duration = None
        start, end = epoch_seconds(self.record.started), epoch_seconds(self.record.ended)
        if start is not None and end is not None:
            duration = end - start
        final = losses[-1] if losses and math.isfinite(losses[-1]) else None
        median = statistics.median(steady) if steady else None
        return {
            "run": self.run.run_id, "spec": self.record.spec_name, "bundle": self.record.bundle[:12],
            "status": self.record.status, "steps": len(self.steps), "final_loss": final,
            "loss_nonfinite_from_step": self.first_nonfinite_loss(),
            "median_step_seconds": median,
            "steps_per_second": 1 / median if median else None,
            "median_tokens_per_second_per_device": statistics.median(tokens[2:] or tokens) if tokens else None,
            "first_step_seconds": times[0] if times else None,
            "restarts": self.record.restarts, "duration_seconds": duration,
        }


def load_steps(data: RunData) -> None:
    path = data.run.metrics
    rows: dict[int, dict[str, Any]] = {}
    for line in iter_lines(path):  # bounded, regular files only (mxc/fsutil.py)
        try:
            row = loads(line.decode("utf-8", "replace"))
            rows[int(float(row["step"]))] = row
        except (ValueError, KeyError, TypeError, OverflowError):  # a torn line, or not a step at all
            continue
    data.steps = sorted(rows)
    for key in (LOSS, STEP_TIME, TOKENS, LR):
        data.values[key] = [_float(rows[s].get(key)) for s in data.steps]
    data.restarts_at_step = [a.resumed_from_step + 1 for a in data.record.attempts[1:] if a.resumed_from_step is not None]


def _float(value: Any) -> float | None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        return float(value)
    except OverflowError:  # an integer beyond any float
        return None


def load_tsdb(data: RunData) -> None:
    from mxc.runtime.observe.tsdb import open_tsdb, range_series

    if not (data.run.tsdb / "data").is_dir():
        data.tsdb_note = "no TSDB (observability was off)"
        return
    started = epoch_seconds(data.record.started) or 0.0
    interval = float((data.record.observability or {}).get("scrape_interval") or 10)
    rate = f"{max(int(4 * interval), 4)}s"
    queries = {
        "cpu": f'100 * (1 - sum(rate(mxc_host_cpu_seconds_total{{mode="idle"}}[{rate}])) '
               f"/ sum(rate(mxc_host_cpu_seconds_total[{rate}])))",
        "memory": "(mxc_host_memory_total_bytes - mxc_host_memory_available_bytes) / 2^30",
        "steps_per_second": f"sum(rate(mxc_train_step_total[{rate}]))",
    }
    gpu_queries = {"GPU utilization (%)": "100 * mxc_gpu_utilization_ratio",
                   "GPU memory used (GiB)": "mxc_gpu_memory_used_bytes / 2^30"}
    try:
        with open_tsdb(data.run, data.record) as tsdb:
            step = max(interval, tsdb.window.step(400))
            for name, expr in queries.items():
                result = range_series(tsdb, expr, step)
                if result:
                    data.host[name] = [(t - started, v) for t, v in result[0]["values"]]
            for panel, expr in gpu_queries.items():
                for r in range_series(tsdb, expr, step):
                    gpu = r["metric"].get("gpu", "?")
                    data.gpu.setdefault(panel, {})[gpu] = [(t - started, v) for t, v in r["values"]]
            for attempt in data.record.attempts[1:]:
                when = epoch_seconds(attempt.started)
                if when is not None:
                    data.restarts_at_time.append(when - started)
            data.training_spans = _training_spans(data.run, started)
    except Exception as exc:  # a report without host panels beats no report
        data.tsdb_note = f"TSDB unreadable: {exc}"


def _training_spans(run: RunDir, started: float) -> list[tuple[float, float]]:
    """When each attempt's training process ran (the run's event file), seconds since start."""
    from mxc.runtime.observe.run_events import EVENTS

    spans: list[tuple[float, float]] = []
    begin: float | None = None
    path = run.path / "observability" / EVENTS
    for line in iter_lines(path):
        with contextlib.suppress(ValueError, KeyError, TypeError):
            event = loads(line.decode("utf-8", "replace"))
            if event["event"] == "attempt_start":
                begin = float(event["time"]) - started
            elif event["event"] == "attempt_end" and begin is not None:
                spans.append((begin, float(event["time"]) - started))
                begin = None
    return spans


def gather(run: RunDir, record: RunRecord, with_tsdb: bool = True) -> RunData:
    data = RunData(run, record)
    load_steps(data)
    if with_tsdb:
        load_tsdb(data)
    return data
