"""Two runs side by side (``mxc compare``): what differs in the spec, in the environment, and in
the numbers (the first step where the losses part, and the step-time ratio).

Losses come from each run's merged ``metrics.jsonl`` (MaxText's full-precision floats), so
"exact" really means bit-identical: two runs of the same bundle on the same software are, and
the first step where they are not points at what changed (the spec diff and the drift list say
what). A tolerance comparison (numpy ``isclose`` rules) separates noise from divergence.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mxc.compiler.diff import Change, diff_specs
from mxc.runtime import detections
from mxc.runtime.logs.metrics_merge import LOSS_KEY, read_lines
from mxc.runtime.provenance import training
from mxc.runtime.provenance.hostfacts import Drift
from mxc.runtime.provenance.hostfacts import compare as compare_facts
from mxc.runtime.record import RunRecord
from mxc.runtime.rundir import RunDir
from mxc.store import Store

STEP_TIME_KEY = "perf/step_time_seconds"
WARMUP_STEPS = 2  # step 0 compiles and step 1 often recompiles: not part of the step time


@dataclass
class Series:
    """One run's per-step numbers."""

    loss: dict[int, float] = field(default_factory=dict)
    step_time: dict[int, float] = field(default_factory=dict)

    @classmethod
    def read(cls, path: Path) -> Series:
        out = cls()
        if not path.is_file():
            return out
        for step, _, data in read_lines(path):
            if (loss := _number(data.get(LOSS_KEY))) is not None:
                out.loss[step] = loss
            if (seconds := _number(data.get(STEP_TIME_KEY))) is not None:
                out.step_time[step] = seconds
        return out

    def median_step_time(self) -> float | None:
        times = [t for s, t in self.step_time.items() if s >= WARMUP_STEPS and math.isfinite(t)]
        return statistics.median(times) if times else None


def _number(value: Any) -> float | None:
    """A JSON number as a float; None for anything else, and for an integer beyond any float."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def same(a: float, b: float, rtol: float = 0.0, atol: float = 0.0) -> bool:
    """Equal within ``atol + rtol * |b|`` (numpy.isclose); two NaNs are the same outcome."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if a == b:
        return True
    return abs(a - b) <= atol + rtol * abs(b)


@dataclass
class LossDiff:
    common_steps: int
    first_step: int | None
    last_step: int | None
    first_diverging_exact: int | None
    first_diverging_tolerance: int | None
    max_abs_diff: float | None
    max_abs_diff_step: int | None
    only_a: list[int]
    only_b: list[int]
    rtol: float
    atol: float

    def as_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        for key in ("only_a", "only_b"):  # a long run resumed differently can differ in thousands of steps
            steps = out.pop(key)
            out[f"{key}_count"] = len(steps)
            out[key] = steps[:20]
        return out


def loss_diff(a: Series, b: Series, rtol: float, atol: float) -> LossDiff:
    common = sorted(set(a.loss) & set(b.loss))
    exact = next((s for s in common if not same(a.loss[s], b.loss[s])), None)
    tol = next((s for s in common if not same(a.loss[s], b.loss[s], rtol, atol)), None)
    diffs = [(abs(a.loss[s] - b.loss[s]), s) for s in common if math.isfinite(a.loss[s]) and math.isfinite(b.loss[s])]
    worst = max(diffs) if diffs else None
    return LossDiff(
        common_steps=len(common), first_step=common[0] if common else None, last_step=common[-1] if common else None,
        first_diverging_exact=exact, first_diverging_tolerance=tol,
        max_abs_diff=worst[0] if worst else None, max_abs_diff_step=worst[1] if worst else None,
        only_a=sorted(set(a.loss) - set(b.loss)), only_b=sorted(set(b.loss) - set(a.loss)), rtol=rtol, atol=atol,
    )


@dataclass
class Comparison:
    a: str
    b: str
    spec_changes: list[Change]
    drift: list[Drift]
    losses: LossDiff
    step_time_a: float | None
    step_time_b: float | None
    notes: list[str] = field(default_factory=list)

    @property
    def step_time_ratio(self) -> float | None:
        if self.step_time_a and self.step_time_b:
            return self.step_time_b / self.step_time_a
        return None

    @property
    def differs(self) -> bool:
        """The runs differ, as ``mxc diff`` means it (exit 1): a spec field, a significant environment
        difference, or losses apart beyond the tolerance. Step time and notes are not differences."""
        return bool(self.spec_changes or any(d.significant for d in self.drift)
                    or self.losses.first_diverging_tolerance is not None)

    def as_dict(self) -> dict[str, Any]:
        return {
            "a": self.a, "b": self.b, "differs": self.differs,
            "spec_changes": [c.as_dict() for c in self.spec_changes],
            "environment": [{"what": d.what, "a": d.recorded, "b": d.now, "significant": d.significant} for d in self.drift],
            "losses": self.losses.as_dict(),
            "step_time": {"median_a": self.step_time_a, "median_b": self.step_time_b, "ratio_b_over_a": self.step_time_ratio,
                          "warmup_steps_excluded": WARMUP_STEPS},
            "notes": self.notes,
        }


def _spec(store: Store, run: RunDir, record: RunRecord, notes: list[str]) -> dict[str, Any]:
    """The spec of the bundle the run ran: the run's own copy, else the store's, each verified
    against the record's hash (record.json only names the bundle)."""
    from mxc.runtime import kept_bundle

    spec = kept_bundle.spec_of(run, record, store)
    if spec is None:
        notes.append(f"run {record.run_id}: its bundle {record.bundle[:12]} is neither in the run directory nor in "
                     "the store (or damaged); spec fields not compared")
        return {}
    return dict(spec)


def facts(record: RunRecord) -> dict[str, Any]:
    return {"host": record.host or {}, "image": record.image or {}, "code": record.code or {}}


def compare_runs(store: Store, a: tuple[RunDir, RunRecord], b: tuple[RunDir, RunRecord],
                 rtol: float = 1e-5, atol: float = 1e-8) -> Comparison:
    (run_a, rec_a), (run_b, rec_b) = a, b
    notes: list[str] = []
    spec_a, spec_b = _spec(store, run_a, rec_a, notes), _spec(store, run_b, rec_b, notes)
    changes = diff_specs(spec_a, spec_b) if spec_a and spec_b else []
    drift = (detections.drift(rec_a.detected, rec_b.detected) + compare_facts(facts(rec_a), facts(rec_b))
             + training.drift(rec_a, rec_b))
    for rec in (rec_a, rec_b):
        if not rec.host:
            notes.append(f"run {rec.run_id} recorded no host facts; environment drift is incomplete")
    series_a, series_b = Series.read(run_a.metrics), Series.read(run_b.metrics)
    for run, series in ((run_a, series_a), (run_b, series_b)):
        if not series.loss:
            notes.append(f"run {run.run_id} has no metrics ({run.metrics.name}); losses not compared")
    return Comparison(
        a=rec_a.run_id, b=rec_b.run_id, spec_changes=changes, drift=drift,
        losses=loss_diff(series_a, series_b, rtol, atol),
        step_time_a=series_a.median_step_time(), step_time_b=series_b.median_step_time(), notes=notes,
    )
