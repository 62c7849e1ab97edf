"""``mxc report``: one self-contained HTML page about one run or several side by side.

``collect`` reads what there is to show (per-step metrics, host/GPU series from the TSDB, the
triage verdict and stages of each run, and for several runs the spec diff and environment
drift of each against the first, ``mxc compare``'s); ``page.render`` writes it as HTML with the
plotting library inlined, so the file opens anywhere with no network. ``-o x.png`` still draws
the static matplotlib picture (png.py) for pasting into a review.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mxc.report.data import RunData, gather
from mxc.report.outcome import outcome
from mxc.runtime.record import RunRecord, now_iso
from mxc.runtime.rundir import RunDir
from mxc.runtime.triage.compare import Comparison, compare_runs
from mxc.store import Store

MAX_RUNS = 8  # one colour each that stays distinguishable (mxc.cli.observe.MAX_REPORT_RUNS)


@dataclass
class Report:
    runs: list[RunData]
    comparisons: list[Comparison] = field(default_factory=list)  # run k (k >= 1) against run 0
    generated: str = field(default_factory=now_iso)

    def as_dict(self, output: Path) -> dict[str, Any]:
        """What ``mxc report --json`` prints."""
        runs = [{**r.summary(), "outcome": r.outcome.as_dict() if r.outcome else None} for r in self.runs]
        return {"output": str(output), "runs": runs, "comparisons": [c.as_dict() for c in self.comparisons]}


def collect(found: list[tuple[RunDir, RunRecord]], store: Store, with_tsdb: bool = True) -> Report:
    runs = []
    for run, record in found:
        data = gather(run, record, with_tsdb=with_tsdb)
        data.outcome = outcome(run, record, len(data.steps))
        runs.append(data)
    base = found[0]
    comparisons = [compare_runs(store, base, other) for other in found[1:]]
    return Report(runs, comparisons)


def write_report(report: Report, output: Path) -> Path:
    """The HTML page, or for a ``.png`` name the static picture; written atomically."""
    from mxc.fsutil import write_atomic

    if output.suffix.lower() == ".png":
        from mxc.report.png import render_png

        write_atomic(output, render_png(report.runs))
    else:
        from mxc.report.page import render

        write_atomic(output, render(report))
    return output
