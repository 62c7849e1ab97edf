"""``mxc report``: one picture of a run (or two, overlaid) an engineer can paste into a review.

Per-step curves (loss, step time, throughput, learning rate) come from the run's merged
``metrics.jsonl``: exact, every step, no scrape-interval sampling. Host and GPU curves over
time come from the run's Prometheus TSDB (reopened read-only). Restarts are drawn where they
happened: at the step training resumed from, and at the wall time the attempt started.
matplotlib only (Agg backend), imported inside functions so the CLI stays light.
"""

from __future__ import annotations

import base64
import contextlib
import html
import io
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mxc.fsutil import iter_lines, loads
from mxc.runtime.record import RunRecord, epoch_seconds
from mxc.runtime.rundir import RunDir

LOSS, STEP_TIME = "learning/loss", "perf/step_time_seconds"
TOKENS, LR = "perf/per_device_tokens_per_sec", "learning/current_learning_rate"
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")
STYLES = ("-", "--", ":", "-.")  # a second run stays visible where it overlaps the first


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

    def summary(self) -> dict[str, Any]:
        _, losses = self.series(LOSS)
        _, times = self.series(STEP_TIME)
        _, tokens = self.series(TOKENS)
        steady = times[2:] or times  # steps 0-1 include compilation
        duration = None
        if self.record.started and self.record.ended:
            start, end = epoch_seconds(self.record.started), epoch_seconds(self.record.ended)
            duration = end - start if start and end else None
        return {
            "run": self.run.run_id, "spec": self.record.spec_name, "bundle": self.record.bundle[:12],
            "status": self.record.status, "steps": len(self.steps), "final_loss": losses[-1] if losses else None,
            "median_step_seconds": statistics.median(steady) if steady else None,
            "steps_per_second": 1 / statistics.median(steady) if steady and statistics.median(steady) > 0 else None,
            "median_tokens_per_second_per_device": statistics.median(tokens[2:] or tokens) if tokens else None,
            "first_step_seconds": times[0] if times else None,
            "restarts": self.record.restarts, "duration_seconds": duration,
        }


def load_steps(data: RunData) -> None:
    path = data.run.metrics
    if not path.is_file():
        return
    rows: dict[int, dict[str, Any]] = {}
    for line in iter_lines(path):
        try:
            row = loads(line.decode("utf-8", "replace"))
            rows[int(float(row["step"]))] = row
        except (ValueError, KeyError, TypeError, OverflowError):
            continue
    data.steps = sorted(rows)
    for key in (LOSS, STEP_TIME, TOKENS, LR):
        data.values[key] = [_float(rows[s].get(key)) for s in data.steps]
    data.restarts_at_step = [a.resumed_from_step + 1 for a in data.record.attempts[1:] if a.resumed_from_step is not None]


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


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


# ---- drawing


def _fmt(value: float | None, unit: str = "", digits: int = 4) -> str:
    if value is None:
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}{unit}"
    return f"{value:.{digits}g}{unit}"


def _restart_lines(ax: Any, xs: list[float], color: str) -> None:
    for x in xs:
        ax.axvline(x, color=color, linestyle=":", linewidth=1.5, alpha=0.8)


def _no_data(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#777777", fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])


def render_png(runs: list[RunData]) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    has_gpu = any(r.gpu for r in runs)
    rows = 4 if has_gpu else 3
    header = 0.75 + 0.24 * len(runs)  # inches: title and one summary line per run
    height = 3.0 * rows + header
    fig, axes = plt.subplots(rows, 2, figsize=(13, height), dpi=110)
    title = "mxc report: " + " vs ".join(r.label for r in runs)
    fig.text(0.01, 1 - 0.28 / height, title, fontsize=12, fontweight="bold", ha="left", va="top")
    for i, r in enumerate(runs):
        s = r.summary()
        line = (f"\u25cf {r.run.run_id}  {s['status']}, {s['steps']} steps, final loss {_fmt(s['final_loss'], '', 6)}, "
                f"median step {_fmt((s['median_step_seconds'] or 0) * 1000, ' ms', 3)}, "
                f"{_fmt(s['median_tokens_per_second_per_device'], ' tok/s/device')}, "
                f"restarts {s['restarts']}, run {_fmt(s['duration_seconds'], ' s', 3)}")
        fig.text(0.01, 1 - (0.62 + 0.24 * i) / height, line, color=COLORS[i % len(COLORS)], fontsize=9,
                 ha="left", va="top", family="monospace")

    (ax_loss, ax_time), (ax_tok, ax_lr), (ax_cpu, ax_mem) = axes[0], axes[1], axes[2]
    for i, r in enumerate(runs):
        color, style = COLORS[i % len(COLORS)], STYLES[i % len(STYLES)]
        short = r.run.run_id
        xs, ys = r.series(LOSS)
        ax_loss.plot(xs, ys, color=color, linestyle=style, label=short, linewidth=1.6)
        xs, ys = r.series(STEP_TIME)
        ax_time.plot(xs, [y * 1000 for y in ys], color=color, linestyle=style, linewidth=1.2, marker=".", markersize=3)
        xs, ys = r.series(TOKENS)
        ax_tok.plot(xs, ys, color=color, linestyle=style, linewidth=1.2, marker=".", markersize=3)
        xs, ys = r.series(LR)
        ax_lr.plot(xs, ys, color=color, linestyle=style, linewidth=1.4)
        for ax in (ax_loss, ax_time, ax_tok, ax_lr):
            _restart_lines(ax, [float(x) for x in r.restarts_at_step], color)
        if "cpu" in r.host:
            ax_cpu.plot(*zip(*r.host["cpu"], strict=True), color=color, linestyle=style, linewidth=1.3)
        if "memory" in r.host:
            ax_mem.plot(*zip(*r.host["memory"], strict=True), color=color, linestyle=style, linewidth=1.3)
        for ax in (ax_cpu, ax_mem):
            _restart_lines(ax, r.restarts_at_time, color)
            for begin, end in r.training_spans:
                ax.axvspan(begin, end, color=color, alpha=0.07, linewidth=0)

    _clip_compile_steps(ax_time, runs)
    ax_loss.set(title="Training loss", xlabel="step", ylabel="loss")
    ax_time.set(title="Step time (steps 0-1 compile; clipped)", xlabel="step", ylabel="ms per step")
    ax_tok.set(title="Throughput", xlabel="step", ylabel="tokens/s per device")
    ax_lr.set(title="Learning rate", xlabel="step", ylabel="learning rate")
    shaded = " (shaded: training attempts)" if any(r.training_spans for r in runs) else ""
    ax_cpu.set(title=f"Host CPU busy, all cores{shaded}", xlabel="seconds since run start",
               ylabel="%", ylim=(0, 105))
    ax_mem.set(title="Host memory in use (whole machine)", xlabel="seconds since run start", ylabel="GiB")
    ax_mem.set_ylim(bottom=0)
    if not any("cpu" in r.host for r in runs):
        _no_data(ax_cpu, "; ".join(r.tsdb_note or "no host series" for r in runs))
    if not any("memory" in r.host for r in runs):
        _no_data(ax_mem, "; ".join(r.tsdb_note or "no host series" for r in runs))
    if has_gpu:
        ax_gu, ax_gm = axes[3]
        for ax, panel in ((ax_gu, "GPU utilization (%)"), (ax_gm, "GPU memory used (GiB)")):
            for i, r in enumerate(runs):
                for gpu, points in sorted(r.gpu.get(panel, {}).items()):
                    ax.plot(*zip(*points, strict=True), color=COLORS[i % len(COLORS)], linewidth=1, alpha=0.8,
                            label=f"gpu {gpu}" if i == 0 else None)
            ax.set(title=panel, xlabel="seconds since run start")
    ax_loss.legend(fontsize=8, loc="upper right")
    if any(r.restarts_at_step for r in runs):
        ax_loss.plot([], [], color="#555555", linestyle=":", linewidth=1.5, label="restart (resumed from checkpoint)")
        ax_loss.legend(fontsize=8, loc="upper right")
    return finish_png(fig, axes, header / height)


def finish_png(fig: Any, axes: Any, header_fraction: float) -> bytes:
    """The common finish of every mxc figure: grids, title size, room for the header lines."""
    import matplotlib.pyplot as plt

    for ax in axes.flat:
        ax.grid(True, alpha=0.3)
        ax.title.set_fontsize(10)
    fig.tight_layout(rect=(0, 0, 1, 1 - header_fraction))
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


def _clip_compile_steps(ax: Any, runs: list[RunData]) -> None:
    """Steps 0-1 include XLA compilation (seconds vs milliseconds): keep the y axis on the rest."""
    steady = [y * 1000 for r in runs for x, y in zip(*r.series(STEP_TIME), strict=True) if x >= 2]
    if len(steady) >= 3:
        ordered = sorted(steady)
        p95 = ordered[int(0.95 * (len(ordered) - 1))]
        ax.set_ylim(0, p95 * 1.6)
        notes = []
        for i, r in enumerate(runs):
            first = [f"{y:.2f} s" for x, y in zip(*r.series(STEP_TIME), strict=True) if x < 2]
            if first:
                notes.append((f"steps 0-1: {', '.join(first)}", COLORS[i % len(COLORS)]))
        for j, (text, color) in enumerate(notes):
            ax.text(0.99, 0.96 - 0.08 * j, text, transform=ax.transAxes, ha="right", va="top", fontsize=8, color=color)


def render_html(runs: list[RunData], png: bytes) -> str:
    rows = []
    keys = [("run", "run"), ("spec", "spec"), ("bundle", "bundle"), ("status", "status"), ("steps", "steps"),
            ("final_loss", "final loss"), ("median_step_seconds", "median step (s)"),
            ("steps_per_second", "steps/s"), ("median_tokens_per_second_per_device", "tokens/s/device"),
            ("first_step_seconds", "first step (s)"), ("restarts", "restarts"), ("duration_seconds", "duration (s)")]
    summaries = [r.summary() for r in runs]
    for key, title in keys:
        cells = "".join(f"<td>{html.escape(_cell(s[key]))}</td>" for s in summaries)
        rows.append(f"<tr><th>{html.escape(title)}</th>{cells}</tr>")
    notes = "".join(f"<li>{html.escape(r.run.run_id)}: {html.escape(r.tsdb_note)}</li>" for r in runs if r.tsdb_note)
    image = base64.b64encode(png).decode("ascii")
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>mxc report {html.escape(' vs '.join(r.run.run_id for r in runs))}</title>
<style>body{{font-family:sans-serif;margin:24px;color:#222}} table{{border-collapse:collapse;margin-bottom:16px}}
td,th{{border:1px solid #ccc;padding:4px 10px;text-align:right;font-size:13px}} th{{text-align:left;background:#f4f4f4}}
img{{max-width:100%}} .note{{color:#666;font-size:12px}}</style></head>
<body><h2>mxc report</h2>
<table>{''.join(rows)}</table>
<img alt="training and host metrics" src="data:image/png;base64,{image}">
<p class="note">Per-step curves: each run's metrics.jsonl (MaxText metrics_file, every step, full precision).
Host/GPU curves: the run's Prometheus TSDB. Dotted vertical lines: restarts (resumed from a checkpoint).</p>
{f'<ul class="note">{notes}</ul>' if notes else ''}
</body></html>
"""


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "-" if value is None else str(value)


def write_report(runs: list[RunData], output: Path) -> Path:
    from mxc.fsutil import write_atomic

    png = render_png(runs)
    write_atomic(output, png if output.suffix.lower() == ".png" else render_html(runs, png))
    return output
