"""The plots of the HTML report as data: panels of aligned series, markers and bands, for report.js.

uPlot draws aligned data (one x array, one y array per series, ``null`` where a series has no
point), so every panel is built here on the union of its runs' x values. Nothing here draws.
What can be decided once is decided here, where it is tested: which panels exist, the compile
steps to keep off the step-time axis, where restarts and the first diverging step are, and how a
run of a million steps is thinned (bucket means, said in the panel's note) so the file stays small.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mxc.report.data import LOSS, LR, STEP_TIME, TOKENS, RunData
from mxc.runtime.triage.compare import Comparison

MAX_POINTS = 4000  # per series: ~6 points per pixel of a wide panel, a few hundred KB for a long run
COMPILE_STEPS = 2  # steps 0-1 include XLA compilation (mxc.runtime.triage.compare.WARMUP_STEPS)

Points = list[tuple[float, float]]


@dataclass
class Series:
    run: int  # index into the report's runs (its colour)
    label: str  # run N (gpu G): the page's legend says which run is N
    points: Points
    dash: bool = False  # a second series of the same run (another GPU)


@dataclass
class Panel:
    id: str
    title: str
    x: str  # "step" or "time" (seconds since the run started): panels of one kind zoom together
    unit: str
    series: list[Series] = field(default_factory=list)
    note: str = ""
    log: bool = False  # the initial y scale (the page has a toggle)
    smooth: bool = True  # the smoothing slider applies
    clip_top: float | None = None  # initial y maximum: keeps compile steps from flattening the rest
    y_span: tuple[float | None, float | None] = (None, None)  # always shown on a linear axis: 0-100 for a percentage
    markers: list[dict[str, Any]] = field(default_factory=list)  # {x, run, kind, label}
    bands: list[dict[str, Any]] = field(default_factory=list)  # {from, to, run}: training attempts

    def payload(self) -> dict[str, Any]:
        xs, ys = align([s.points for s in self.series])
        return {"id": self.id, "title": self.title, "x": self.x, "unit": self.unit, "log": self.log,
                "smooth": self.smooth, "clip_top": _finite(self.clip_top), "y_span": list(self.y_span),
                "markers": self.markers, "bands": self.bands,
                "series": [{"run": s.run, "label": s.label, "dash": s.dash} for s in self.series], "data": [xs, *ys]}


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def align(series: Sequence[Points]) -> tuple[list[float], list[list[float | None]]]:
    """One x array (the union, ascending) and each series' y on it (None where it has no point,
    and for NaN/inf, which JSON cannot carry: markers say where a loss stopped being finite)."""
    xs = sorted({x for points in series for x, _ in points if math.isfinite(x)})
    index = {x: i for i, x in enumerate(xs)}
    out: list[list[float | None]] = []
    for points in series:
        ys: list[float | None] = [None] * len(xs)
        for x, y in points:
            if x in index:
                ys[index[x]] = y if math.isfinite(y) else None
        out.append(ys)
    return xs, out


def thin(points: Points, limit: int = MAX_POINTS) -> tuple[Points, int]:
    """At most ``limit`` points: bucket means (x of the bucket's first point) and the bucket size.
    A mean keeps the trend and the level; spikes shrink, so the panel's note says it was thinned."""
    if len(points) <= limit:
        return points, 1
    size = math.ceil(len(points) / limit)
    out: Points = []
    for start in range(0, len(points), size):
        bucket = points[start:start + size]
        finite = [y for _, y in bucket if math.isfinite(y)]
        out.append((bucket[0][0], sum(finite) / len(finite) if finite else math.nan))
    return out, size


def _step_points(run: RunData, key: str, scale: float = 1.0) -> Points:
    xs, ys = run.series(key)
    return [(float(x), y * scale) for x, y in zip(xs, ys, strict=True)]


def _thinned(panel: Panel, run: int, label: str, points: Points, notes: dict[int, int]) -> None:
    kept, size = thin(points)
    if size > 1:
        notes[run] = max(size, notes.get(run, 1))
    if kept:
        panel.series.append(Series(run, label, kept))


def _thin_note(panel: Panel, notes: dict[int, int], runs: Sequence[RunData]) -> None:
    if notes:
        parts = [f"run {i + 1}: means of {size} steps" for i, size in sorted(notes.items())]
        total = max(len(runs[i].steps) for i in notes)
        panel.note = " ".join(filter(None, [panel.note, f"{total:,} steps, thinned ({', '.join(parts)})."]))


def step_panels(runs: Sequence[RunData], comparisons: Sequence[Comparison]) -> list[Panel]:
    """Loss (and its difference to run 1), step time, throughput, learning rate: per step."""
    loss = Panel("loss", "Training loss", "step", "loss")
    time = Panel("step_time", "Step time", "step", "ms per step")
    tokens = Panel("throughput", "Throughput", "step", "tokens/s per device")
    rate = Panel("learning_rate", "Learning rate", "step", "learning rate", smooth=False)
    for panel, key, scale in ((loss, LOSS, 1.0), (time, STEP_TIME, 1000.0), (tokens, TOKENS, 1.0), (rate, LR, 1.0)):
        notes: dict[int, int] = {}
        for i, run in enumerate(runs):
            _thinned(panel, i, f"run {i + 1}", _step_points(run, key, scale), notes)
        _thin_note(panel, notes, runs)
    for i, run in enumerate(runs):
        for step in run.restarts_at_step:
            for panel in (loss, time, tokens, rate):
                panel.markers.append({"x": step, "run": i, "kind": "restart", "label": f"run {i + 1} restarted"})
        if (bad := run.first_nonfinite_loss()) is not None:
            loss.markers.append({"x": bad, "run": i, "kind": "nonfinite", "label": f"run {i + 1}: loss not finite"})
    difference = _difference_panel(runs, comparisons, (loss, time, tokens, rate))
    _clip_compile(time, runs)
    panels = [loss, *([difference] if difference else []), time, tokens, rate]
    return [p for p in panels if p.series]


def _difference_panel(runs: Sequence[RunData], comparisons: Sequence[Comparison],
                      marked: Sequence[Panel]) -> Panel | None:
    """|loss of run k - loss of run 1| per common step (log scale): where and how fast runs part."""
    if len(runs) < 2:
        return None
    panel = Panel("loss_difference", "Loss difference to run 1", "step", "|loss - loss of run 1|", log=True)
    base = dict(zip(*runs[0].series(LOSS), strict=True))
    for k, (run, comparison) in enumerate(zip(runs[1:], comparisons, strict=True), start=1):
        other = dict(zip(*run.series(LOSS), strict=True))
        # 0 cannot be drawn on a log scale: bit-identical steps are gaps, and the note says so
        points = [(float(s), abs(other[s] - base[s])) for s in sorted(set(base) & set(other))]
        kept, _ = thin([(x, y if y > 0 else math.nan) for x, y in points])
        if any(math.isfinite(y) for _, y in kept):
            panel.series.append(Series(k, f"run {k + 1}", kept))
        first = comparison.losses.first_diverging_exact
        if first is not None:
            for target in (*marked, panel):
                target.markers.append({"x": first, "run": k, "kind": "diverge",
                                       "label": f"run {k + 1} differs from run 1 from step {first}"})
    identical = [k + 1 for k, c in enumerate(comparisons, start=1)
                 if c.losses.common_steps and c.losses.first_diverging_exact is None]
    if identical:
        panel.note = f"Run {', '.join(map(str, identical))}: bit-identical to run 1 at every common step (no line)."
    return panel if panel.series else None


def _clip_compile(panel: Panel, runs: Sequence[RunData]) -> None:
    """Steps 0-1 compile (seconds, against milliseconds later): the y axis starts on the rest,
    the note prints them, and log scale shows everything."""
    steady = sorted(y for s in panel.series for x, y in s.points if x >= COMPILE_STEPS and math.isfinite(y))
    compile_ms = [(i, [y for x, y in s.points if x < COMPILE_STEPS]) for i, s in enumerate(panel.series)]
    if len(steady) < 3:
        return
    top = steady[int(0.95 * (len(steady) - 1))] * 1.6
    if any(y > top for _, ys in compile_ms for y in ys if math.isfinite(y)):
        panel.clip_top = top
        shown = [f"run {panel.series[i].run + 1}: " + ", ".join(f"{y / 1000:.2f} s" for y in ys)
                 for i, ys in compile_ms if ys]
        panel.note = " ".join(filter(None, [f"Steps 0-1 compile ({'; '.join(shown)}): above the axis; log scale shows "
                                            "them.", panel.note]))


HOST_PANELS = (("cpu", "Host CPU busy, all cores", "%"), ("memory", "Host memory in use (whole machine)", "GiB"))
GPU_PANELS = (("GPU utilization (%)", "gpu_utilization", "%"), ("GPU memory used (GiB)", "gpu_memory", "GiB"))
SPANS: dict[str, tuple[float | None, float | None]] = {"%": (0.0, 100.0), "GiB": (0.0, None)}  # 99.9% is not 100% x 0.1


def time_panels(runs: Sequence[RunData]) -> list[Panel]:
    """Host CPU and memory, GPU utilization and memory over time, from each run's TSDB."""
    panels = []
    for key, title, unit in HOST_PANELS:
        panel = Panel(f"host_{key}", title, "time", unit, smooth=False, y_span=SPANS[unit])
        for i, run in enumerate(runs):
            if run.host.get(key):
                panel.series.append(Series(i, f"run {i + 1}", run.host[key]))
        panels.append(panel)
    for name, panel_id, unit in GPU_PANELS:
        panel = Panel(panel_id, name.split(" (")[0], "time", unit, smooth=False, y_span=SPANS[unit])
        for i, run in enumerate(runs):
            for j, (gpu, points) in enumerate(sorted(run.gpu.get(name, {}).items())):
                panel.series.append(Series(i, f"run {i + 1} gpu {gpu}", points, dash=j > 0))
        panels.append(panel)
    drawn = [p for p in panels if p.series]
    for panel in drawn:
        for i, run in enumerate(runs):
            panel.bands += [{"from": a, "to": b, "run": i} for a, b in run.training_spans]
            panel.markers += [{"x": t, "run": i, "kind": "restart", "label": f"run {i + 1} restarted"}
                              for t in run.restarts_at_time]
        if panel.bands:
            panel.note = "Shaded: while training ran."
    return drawn
