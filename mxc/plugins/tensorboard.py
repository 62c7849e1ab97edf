"""Training metrics: step, loss, step time, tokens/s, learning rate, MFU, and every other scalar
MaxText logs (``mxc_train_scalar{tag}``: param norm, MoE load-balance loss, MTP loss, eval loss,
whatever a MaxText version adds), read incrementally.

Source, in order of preference:

1. MaxText's ``metrics_file`` JSON lines, one file per attempt and rank
   (``<run>/metrics/attempt-N.rank-R.jsonl``): full precision, written every step.
2. Otherwise MaxText's TensorBoard event files (any MaxText run, also one mxc did not start).

MFU is the model TFLOP/s per device MaxText logs over the GPU's dense BF16 peak
(``peak_flops.py``): ``observability.peak_tflops`` from the spec, else the peak of the model this
node's GPUs report; without either there is no MFU series (CPU runs).

Series carry the run (a target label) and the rank, never the attempt: a restart continues
the same series. The attempt is a value of its own (``mxc_train_attempt``), so restarts read
as annotations on one curve. Steps recomputed after a restart count again in
``mxc_train_step_total`` (it measures work done; ``rate()`` of it is steps per second).
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from mxc.plugins import gpu, peak_flops
from mxc.plugins.api import PluginContext
from mxc.plugins.tail import EventFileTail, JsonlTail

PART = re.compile(r"^attempt-(?P<attempt>\d+)\.rank-(?P<rank>\d+)\.jsonl$")
LOSS = "learning/loss"
TFLOPS = "perf/per_device_tflops_per_sec"
STEP_TIME = "perf/step_time_seconds"
MAX_TAGS = 256  # scalars kept per rank: a runaway writer cannot grow the exporter's page without bound
# MaxText key -> (metric name, help)
GAUGES: dict[str, tuple[str, str]] = {
    LOSS: ("mxc_train_loss", "training loss of the newest logged step (MaxText learning/loss)"),
    "perf/step_time_seconds": ("mxc_train_step_time_seconds", "wall time of the newest step (MaxText perf/step_time_seconds)"),
    "perf/per_device_tokens_per_sec": ("mxc_train_tokens_per_second_per_device",
                                       "tokens per second per device (MaxText perf/per_device_tokens_per_sec)"),
    "learning/current_learning_rate": ("mxc_train_learning_rate", "learning rate of the newest step"),
    "learning/grad_norm": ("mxc_train_grad_norm", "gradient norm after clipping (MaxText learning/grad_norm)"),
    "perf/per_device_tflops_per_sec": ("mxc_train_tflops_per_second_per_device", "model TFLOP/s per device"),
}


@dataclass
class RankState:
    steps: int = 0  # steps logged (recomputed ones count again)
    last_step: int | None = None
    attempt: int | None = None
    values: dict[str, float] = field(default_factory=dict)  # GAUGES of the newest step
    scalars: dict[str, float] = field(default_factory=dict)  # every scalar tag -> its newest value
    tag_steps: dict[str, int] = field(default_factory=dict)  # tag -> step of that value
    seen_at: float | None = None  # when the newest step was written (file mtime)
    # (when read, step time) of the recent steps that no later step outlasts: the window's
    # maximum is the first entry. A monotonic queue, because a scrape after a backlog (10^6 steps
    # read at once, all "recent") must not scan them all (105 ms per scrape, measured).
    recent: deque[tuple[float, float]] = field(default_factory=deque)

    def step_time(self, seconds: float, now: float, window: float) -> None:
        while self.recent and self.recent[-1][1] <= seconds:
            self.recent.pop()  # never the maximum again: this step is at least as slow and leaves later
        self.recent.append((now, seconds))
        self.forget(now, window)

    def slowest(self) -> float | None:
        return self.recent[0][1] if self.recent else None

    def forget(self, now: float, window: float) -> None:
        while self.recent and now - self.recent[0][0] > window:
            self.recent.popleft()

    def scalar(self, tag: str, step: int, value: float, newest_wins: bool = False) -> None:
        """Keep a tag's value: the newest line's (metrics files, read in order, where a restart
        recomputes earlier steps), or the highest step's (event files, like the gauges)."""
        if tag not in self.scalars and len(self.scalars) >= MAX_TAGS:
            return
        if newest_wins or step >= self.tag_steps.get(tag, step):
            self.scalars[tag], self.tag_steps[tag] = value, step


class TrainingMetricsPlugin:
    name = "tensorboard"

    def __init__(self, context: PluginContext, clock: Callable[[], float] = time.monotonic) -> None:
        self.run_dir = context.run_dir
        self.ranks = context.ranks
        self.tensorboard_dir = context.tensorboard_dir or _tensorboard_dir(context.run_dir)
        self.jsonl: dict[Path, tuple[int, int, JsonlTail]] = {}
        self.events: dict[Path, EventFileTail] = {}
        self.state: dict[int, RankState] = {}
        self.source = "none"
        self.peak = _peak(context)
        self.clock = clock
        # Every step read is in the max of the scrapes of the next 2 intervals: none is missed by
        # sampling, whoever else reads the page in between (a scrape reads the steps logged since the last).
        interval = context.config.get("scrape_interval", 10)
        self.window = 2.0 * (float(interval) if isinstance(interval, (int, float)) and interval > 0 else 10.0)

    # ---- reading

    def _metric_parts(self) -> list[tuple[int, int, Path]]:
        if self.run_dir is None:
            return []
        folder = self.run_dir / "metrics"
        try:
            names = [p.name for p in folder.iterdir()]
        except FileNotFoundError:
            return []
        found = []
        for name in names:
            match = PART.match(name)
            if match and (self.ranks is None or int(match["rank"]) in self.ranks):
                found.append((int(match["attempt"]), int(match["rank"]), folder / name))
        return sorted(found)

    def update(self) -> None:
        """Read what was appended since the last call (the whole cost of a scrape)."""
        parts = self._metric_parts()
        if parts:
            self.source = "metrics_file"
            for attempt, rank, path in parts:
                if path not in self.jsonl:
                    self.jsonl[path] = (attempt, rank, JsonlTail(path))
            for attempt, rank, tail in sorted(self.jsonl.values(), key=lambda t: (t[0], t[1])):
                lines = tail.read_new()
                if lines:
                    self._apply_lines(self.state.setdefault(rank, RankState()), attempt, lines, tail.path)
            return
        if self.tensorboard_dir is not None and self.tensorboard_dir.is_dir():
            self.source = "tensorboard"
            for path in sorted(self.tensorboard_dir.rglob("events.out.tfevents.*")):
                events = self.events.setdefault(path, EventFileTail(path))
                self._apply_events(self.state.setdefault(0, RankState()), events)

    def _apply_lines(self, state: RankState, attempt: int, lines: list[dict[str, object]], path: Path) -> None:
        for line in lines:
            step = _step(line.get("step"))
            if step is None:
                continue
            for key, value in line.items():
                if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    state.scalar(key, step, float(value), newest_wins=True)
            if LOSS not in line:
                continue  # eval lines and anything else MaxText may add: scalars only, not a training step
            seconds = line.get(STEP_TIME)
            if isinstance(seconds, (int, float)) and not isinstance(seconds, bool):
                state.step_time(float(seconds), self.clock(), self.window)
            state.steps += 1
            state.last_step = step
            state.attempt = attempt
            for key in GAUGES:
                value = line.get(key)
                if isinstance(value, (int, float)):
                    state.values[key] = float(value)
        state.seen_at = _mtime(path)

    def _apply_events(self, state: RankState, tail: EventFileTail) -> None:
        by_step: dict[int, dict[str, float]] = {}
        wall: dict[int, float] = {}
        for event in tail.read_new():
            state.scalar(event.tag, event.step, event.value)
            if event.tag == STEP_TIME:
                state.step_time(event.value, self.clock(), self.window)
            if event.tag in GAUGES:
                by_step.setdefault(event.step, {})[event.tag] = event.value
                wall[event.step] = event.wall_time
        for step in sorted(by_step):
            if LOSS in by_step[step]:
                state.steps += 1
            if state.last_step is None or step >= state.last_step:
                state.last_step = step
                state.values.update(by_step[step])
                state.seen_at = wall[step]

    # ---- exporting

    def collect(self) -> Iterable[Metric]:
        self.update()
        labels = ["rank"]
        steps = CounterMetricFamily("mxc_train_step", "training steps completed (recomputed steps after a restart count again)",
                                    labels=labels)
        last = GaugeMetricFamily("mxc_train_last_step", "step number of the newest logged step", labels=labels)
        attempt = GaugeMetricFamily("mxc_train_attempt", "attempt (0 = first start) that logged the newest step", labels=labels)
        seen = GaugeMetricFamily("mxc_train_last_step_timestamp_seconds", "when the newest step was logged (unix time)",
                                 labels=labels)
        gauges = {key: GaugeMetricFamily(name, doc, labels=labels) for key, (name, doc) in GAUGES.items()}
        scalars = GaugeMetricFamily("mxc_train_scalar", "every scalar MaxText logs, by its TensorBoard tag "
                                    "(learning/param_norm, learning/moe_lb_loss, eval/avg_loss, ...): newest value",
                                    labels=[*labels, "tag"])
        slowest = GaugeMetricFamily("mxc_train_step_time_max_seconds", "the longest step among those logged in the last "
                                    "two scrape intervals: a slow step shows even when several steps pass between scrapes",
                                    labels=labels)
        mfu = GaugeMetricFamily("mxc_train_mfu_ratio", "model FLOPs utilisation: MaxText's model TFLOP/s per device over "
                                "the GPU's dense BF16 peak (mxc_train_peak_tflops_per_device)", labels=labels)
        peak = GaugeMetricFamily("mxc_train_peak_tflops_per_device", "the dense BF16 peak MFU is computed against, and "
                                 "the GPU model it is for (or \"spec\": observability.peak_tflops)", labels=["model"])
        if self.peak is not None:
            peak.add_metric([self.peak.model], self.peak.bf16_dense_tflops)
        for rank, state in sorted(self.state.items()):
            if state.last_step is None:
                continue
            label = [str(rank)]
            steps.add_metric(label, state.steps)
            last.add_metric(label, state.last_step)
            if state.attempt is not None:
                attempt.add_metric(label, state.attempt)
            if state.seen_at is not None:
                seen.add_metric(label, state.seen_at)
            for key, value in state.values.items():
                gauges[key].add_metric(label, value)
            for tag, value in sorted(state.scalars.items()):
                scalars.add_metric([*label, tag], value)
            state.forget(self.clock(), self.window)
            longest = state.slowest()
            if longest is not None:
                slowest.add_metric(label, longest)
            if self.peak is not None and TFLOPS in state.values:
                mfu.add_metric(label, state.values[TFLOPS] / self.peak.bf16_dense_tflops)
        return [steps, last, attempt, seen, *gauges.values(), slowest, scalars, mfu, peak]


def _step(value: object) -> int | None:
    try:
        return int(float(str(value)))
    except (ValueError, OverflowError):
        return None


def _peak(context: PluginContext) -> peak_flops.Peak | None:
    configured = context.config.get("peak_tflops")
    if isinstance(configured, (int, float)) and not isinstance(configured, bool) and configured > 0:
        return peak_flops.Peak("spec", float(configured))
    return peak_flops.node_peak(gpu.model_names())


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _tensorboard_dir(run_dir: Path | None) -> Path | None:
    """Where MaxText writes events for an mxc run by default (the exporter is told the place when
    the bundle's ``checkpoint.dir`` moves it: ``--tensorboard-dir``, from mxc/runtime/runpaths.py).
    Never a path read from record.json: that file is not trusted as a path."""
    if run_dir is None:
        return None
    from mxc.runtime.rundir import RunDir
    from mxc.runtime.runpaths import RunPaths

    return RunPaths(RunDir(run_dir)).tensorboard


def create(context: PluginContext) -> TrainingMetricsPlugin:
    return TrainingMetricsPlugin(context)
