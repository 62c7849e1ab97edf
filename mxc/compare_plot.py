"""The picture for ``mxc compare -o``: in ``mxc report`` form (its colours, header lines and step
panels, mxc/report/png.py), plus what only a comparison has: the loss difference per step and the
first step where the losses diverge (a dotted line on every step panel).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from mxc.fsutil import write_atomic
from mxc.report.data import LOSS, STEP_TIME, TOKENS, RunData
from mxc.report.png import COLORS, clip_compile_steps, finish_png, fmt


def render_png(a: RunData, b: RunData, comparison: Any) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [a, b]
    header = 0.75 + 0.24 * 3
    height = 3.0 * 2 + header
    fig, axes = plt.subplots(2, 2, figsize=(13, height), dpi=110)
    first = comparison.losses.first_diverging_exact
    tol = comparison.losses.first_diverging_tolerance
    title = f"mxc compare: {a.label} vs {b.label}"
    fig.text(0.01, 1 - 0.28 / height, title, fontsize=12, fontweight="bold", ha="left", va="top")
    for i, r in enumerate(runs):
        s = r.summary()
        line = (f"\u25cf {r.run.run_id}  {s['status']}, {s['steps']} steps, final loss {fmt(s['final_loss'], '', 6)}, "
                f"median step {fmt((s['median_step_seconds'] or 0) * 1000, ' ms', 3)}")
        fig.text(0.01, 1 - (0.62 + 0.24 * i) / height, line, color=COLORS[i], fontsize=9, ha="left", va="top",
                 family="monospace")
    ratio = comparison.step_time_ratio
    verdict = ("losses bit-identical at every common step" if first is None else
               f"losses differ from step {first} (beyond rtol {comparison.losses.rtol:g}: "
               f"{'step ' + str(tol) if tol is not None else 'never'})")
    verdict += f"; step time b/a {ratio:.3f}" if ratio else ""
    verdict += f"; {len(comparison.spec_changes)} spec field(s) differ"
    fig.text(0.01, 1 - (0.62 + 0.24 * 2) / height, verdict, fontsize=9, ha="left", va="top", family="monospace")

    (ax_loss, ax_diff), (ax_time, ax_tok) = axes
    for i, r in enumerate(runs):
        xs, ys = r.series(LOSS)
        ax_loss.plot(xs, ys, color=COLORS[i], label=r.run.run_id, linewidth=1.6, linestyle="-" if i == 0 else "--")
        xs, ys = r.series(STEP_TIME)
        ax_time.plot(xs, [y * 1000 for y in ys], color=COLORS[i], linewidth=1.2, marker=".", markersize=3)
        xs, ys = r.series(TOKENS)
        ax_tok.plot(xs, ys, color=COLORS[i], linewidth=1.2, marker=".", markersize=3)
    la, lb = dict(zip(*a.series(LOSS), strict=True)), dict(zip(*b.series(LOSS), strict=True))
    common = sorted(set(la) & set(lb))
    diffs = [abs(la[s] - lb[s]) for s in common]
    positive = [d for d in diffs if d > 0 and math.isfinite(d)]
    ax_diff.plot(common, [d if d > 0 else float("nan") for d in diffs], color="#555555", linewidth=1.4)
    if positive:
        ax_diff.set_yscale("log")
    else:
        ax_diff.text(0.5, 0.5, "bit-identical", ha="center", va="center", transform=ax_diff.transAxes, color="#777777")
    if first is not None:
        for ax in (ax_loss, ax_diff, ax_time, ax_tok):
            ax.axvline(first, color="#555555", linestyle=":", linewidth=1)
    clip_compile_steps(ax_time, runs)
    ax_loss.set(title="Training loss", xlabel="step", ylabel="loss")
    ax_diff.set(title="|loss a - loss b| (dotted: first diverging step)", xlabel="step", ylabel="absolute difference")
    ax_time.set(title="Step time (steps 0-1 compile; clipped)", xlabel="step", ylabel="ms per step")
    ax_tok.set(title="Throughput", xlabel="step", ylabel="tokens/s per device")
    ax_loss.legend(fontsize=8, loc="upper right")
    return finish_png(fig, axes, header / height)


def write_png(a: RunData, b: RunData, comparison: Any, output: Path) -> Path:
    write_atomic(output, render_png(a, b, comparison))
    return output
