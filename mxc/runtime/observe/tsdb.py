"""Reading a run's Prometheus TSDB, while the run is live or long after it ended.

Live: the run's own Prometheus answers (its URL is in ``record.observability``). After the
run: a fresh Prometheus is started on a *copy* of the TSDB (``prometheus.readonly_copy``:
hard links for immutable blocks, copies for the WAL), with no scrape targets, on a free
loopback port; the run directory is never written. Every question is asked over the run's
time window with ``query_range`` or ``*_over_time`` evaluated at the run's end: an instant
query at "now" would find every series stale (five minutes after its last sample).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mxc.errors import UserError
from mxc.runtime.observe.observer import tsdb_data
from mxc.runtime.observe.prometheus import PrometheusAPI, PrometheusServer, readonly_copy
from mxc.runtime.processes.procfs import ProcessId
from mxc.runtime.record import RunRecord, epoch_seconds
from mxc.runtime.rundir import RunDir

POSTMORTEM_CONFIG = "global:\n  scrape_interval: 1h\nscrape_configs: []\n"


@dataclass(frozen=True)
class Window:
    """The run's time span (unix seconds), padded so the first and last scrapes are inside."""

    start: float
    end: float

    @property
    def seconds(self) -> float:
        return max(1.0, self.end - self.start)

    def step(self, points: int = 600, minimum: float = 1.0) -> float:
        return max(minimum, self.seconds / points)

    def range_selector(self) -> str:
        """A PromQL range covering the whole run, for ``last_over_time(x[...])`` at ``end``."""
        return f"{int(self.seconds) + 1}s"


def window(record: RunRecord, pad: float = 30.0) -> Window:
    start = epoch_seconds(record.started) or time.time()
    end = epoch_seconds(record.ended) if record.final else None
    return Window(start - pad, (end or time.time()) + pad)


@dataclass
class OpenTSDB:
    api: PrometheusAPI
    window: Window
    live: bool
    url: str


def _live_url(record: RunRecord) -> str | None:
    info = (record.observability or {}).get("prometheus") or {}
    process = ProcessId.from_record(info)  # a bare pid could be anyone's by now
    if record.final or process is None or not process.is_alive():
        return None
    url = info.get("url")
    if url and PrometheusAPI(url).ready():
        return str(url)
    return None


def lookback(record: RunRecord) -> str:
    """Staleness window for the reopened TSDB: a few scrape intervals, so a series ends where
    its scrapes ended (Prometheus writes no staleness markers when it is stopped)."""
    interval = float((record.observability or {}).get("scrape_interval") or 10)
    return f"{max(5, int(3 * interval))}s"


@contextlib.contextmanager
def open_tsdb(run: RunDir, record: RunRecord, bind: str = "127.0.0.1", first_port: int = 19190) -> Iterator[OpenTSDB]:
    """The run's TSDB behind a Prometheus API; started and stopped here when the run is over."""
    live = _live_url(record)
    if live:
        yield OpenTSDB(PrometheusAPI(live), window(record), True, live)
        return
    data = tsdb_data(run)
    if not data.is_dir():
        hint = "this run had observability off" if not record.observability else f"expected {data}"
        raise UserError(f"run {run.run_id} has no Prometheus TSDB ({hint})")
    scratch = Path(tempfile.mkdtemp(prefix=f"mxc-tsdb-{run.run_id[:15]}-"))
    server: PrometheusServer | None = None
    try:
        readonly_copy(data, scratch / "data")
        config = scratch / "prometheus.yml"
        config.write_text(POSTMORTEM_CONFIG)
        server = PrometheusServer.start(config, scratch / "data", bind, first_port, scratch / "prometheus.log",
                                        (f"--query.lookback-delta={lookback(record)}",))
        yield OpenTSDB(server.api, window(record), False, server.url)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(scratch, ignore_errors=True)


def series_name(metric: dict[str, str]) -> str:
    name = metric.get("__name__", "")
    labels = ",".join(f'{k}="{v}"' for k, v in sorted(metric.items()) if k != "__name__")
    return f"{name}{{{labels}}}" if labels else name


def _labels_key(metric: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in metric.items() if k != "__name__"))


def metric_names(tsdb: OpenTSDB, selector: str) -> list[str]:
    return sorted(tsdb.api.label_values("__name__", tsdb.window.start, tsdb.window.end, match=selector))


def last_values(tsdb: OpenTSDB, selector: str) -> list[dict[str, Any]]:
    """Each series matching ``selector``: its last value in the run and how many samples it has.

    One metric name at a time: ``*_over_time`` drops the name, so series of different
    metrics with equal labels would collide in one answer.
    """
    span, at = tsdb.window.range_selector(), tsdb.window.end
    out = []
    for name in metric_names(tsdb, selector):
        one = f'{{__name__="{name}"}}'
        last = tsdb.api.query(f"last_over_time({one}[{span}])", at)
        counts = {_labels_key(r["metric"]): int(float(r["value"][1]))
                  for r in tsdb.api.query(f"count_over_time({one}[{span}])", at)}
        for r in sorted(last, key=lambda r: series_name(r["metric"])):
            metric = {**r["metric"], "__name__": name}
            key = _labels_key(r["metric"])
            out.append({"series": series_name(metric), "metric": metric, "last": float(r["value"][1]),
                        "samples": counts.get(key, 0)})
    return out


def range_series(tsdb: OpenTSDB, expr: str, step: float | None = None) -> list[dict[str, Any]]:
    """``query_range`` over the run's window: [{metric, values: [(t, v), ...]}]."""
    w = tsdb.window
    result = tsdb.api.query_range(expr, w.start, w.end, step or w.step())
    return [{"metric": r["metric"], "values": [(float(t), float(v)) for t, v in r["values"]]} for r in result]
