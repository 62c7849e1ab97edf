"""The static picture of ``mxc report -o x.png`` (and the base of ``mxc compare -o``): matplotlib,
Agg backend, imported inside functions so the CLI stays light. One image to paste into a review;
the interactive report is the HTML page (mxc/report/page.py).
"""

from __future__ import annotations

import io
from typing import Any

from mxc.report.data import LOSS, LR, STEP_TIME, TOKENS, RunData

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
STYLES = ("-", "--", ":", "-.")  # a second run stays visible where it overlaps the first


def fmt(value: float | None, unit: str = "", digits: int = 4) -> str:
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
        line = (f"\u25cf {r.run.run_id}  {s['status']}, {s['steps']} steps, final loss {fmt(s['final_loss'], '', 6)}, "
                f"median step {fmt((s['median_step_seconds'] or 0) * 1000, ' ms', 3)}, "
                f"{fmt(s['median_tokens_per_second_per_device'], ' tok/s/device')}, "
                f"restarts {s['restarts']}, run {fmt(s['duration_seconds'], ' s', 3)}")
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

    clip_compile_steps(ax_time, runs)
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


def clip_compile_steps(ax: Any, runs: list[RunData]) -> None:
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
