"""The bundle's Prometheus rules (``alerts.rules.yml``): what the run's own Prometheus evaluates.

Generated from the spec's ``observability.alerts`` thresholds (so they are reviewed and hashed
with the rest of the bundle), as data dumped to YAML rather than a jinja template: the
annotations use Prometheus' own ``{{ $labels.x }}`` templating, which jinja would eat.

Every expression reads only series mxc's exporter serves (docs/metrics.md), so a rule whose
series a node does not have (no GPU, no RDMA port) never fires there; none compares an absolute
counter (counters count since a driver loaded): always ``rate``/``increase``.

* ``MxcTrainingStalled``: no new step for ``stall_after`` seconds on a rank that had logged steps
  ``stall_after`` seconds ago (the ``offset``: a run that just logged its first step is not
  "stalled" for lack of history). The hang watch (runtime.hang) ends a hung trainer later; this
  says it earlier, while someone can still look (``mxc stacks``).
* ``MxcStepTimeRegression``: the newest step time above ``step_time_ratio`` x the run's own
  median (a recording rule over the last 6 h of samples, evaluated once a minute), for a
  minute: one slow step (a checkpoint) is not a regression, a slower cluster is.
* ``MxcGpuThermalThrottling``: a GPU's clocks held down for heat (NVIDIA's throttle-reason
  counters) more than ``throttle_ratio`` of the last two minutes.
* ``MxcRdmaRetryBurst``: RDMA transport retries (ACK timeouts, retransmitted packets, sequence
  error NAKs) per second on one port above ``rdma_retries_per_second`` for a minute: a lossy link
  or congestion the collectives pay for. ``MxcRdmaRetryExceeded``: a queue pair ran out of
  retries (the collective on it fails): critical at once.
"""

from __future__ import annotations

from typing import Any

import yaml

from mxc.compiler.schema import Observability

ALERT_RULES = "alerts.rules.yml"
MEDIAN_RECORD = "mxc:train_step_time_seconds:median_6h"
MEDIAN_INTERVAL_S = 60
RDMA_RETRIES = ("ack_timeouts", "retransmitted_packets", "sequence_errors")
THERMAL_REASONS = "hw_thermal_slowdown|sw_thermal_slowdown"
ALERT_NAMES = ("MxcTrainingStalled", "MxcStepTimeRegression", "MxcGpuThermalThrottling", "MxcRdmaRetryBurst",
               "MxcRdmaRetryExceeded")


def _number(value: float) -> str:
    """A threshold as PromQL writes it (1.5, 10, 0.1), never in exponent notation."""
    text = f"{value:.6f}".rstrip("0").rstrip(".")
    return text or "0"


def _rdma_retries_per_second() -> str:
    """The retry counters' rates summed per port. Each rate is tagged with its counter first: ``rate``
    drops the metric name, and two counters of one port would otherwise have the same labels (which
    Prometheus refuses); ``or`` keeps every counter the port's driver has (one without some is fine)."""
    terms = " or ".join(f'label_replace(rate(mxc_rdma_{name}_total[1m]), "counter", "{name}", "", "")'
                        for name in RDMA_RETRIES)
    return f"sum by (run, node, device, port) ({terms})"


def rule_groups(observability: Observability) -> dict[str, Any]:
    """The rule file's content (``groups``), from the spec's thresholds."""
    alerts = observability.alerts
    stall = f"{alerts.stall_after}s"
    sustained = f"{max(60, 3 * observability.scrape_interval)}s"
    ratio = _number(alerts.step_time_ratio)
    median = {
        "name": "mxc-step-time-median",
        "interval": f"{max(MEDIAN_INTERVAL_S, observability.scrape_interval)}s",
        "rules": [{"record": MEDIAN_RECORD, "expr": "quantile_over_time(0.5, mxc_train_step_time_seconds[6h])"}],
    }
    rules = [
        {
            "alert": "MxcTrainingStalled",
            "expr": (f"mxc_train_last_step and changes(mxc_train_last_step[{stall}]) == 0 "
                     f"and (mxc_train_last_step offset {stall})"),
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "training stalled on rank {{ $labels.rank }} ({{ $labels.node }})",
                "description": (f"no new training step for {alerts.stall_after}s after step {{{{ $value }}}}: "
                                "look at its stacks with `mxc stacks RUN`"),
            },
        },
        {
            "alert": "MxcStepTimeRegression",
            "expr": f"mxc_train_step_time_seconds > {ratio} * {MEDIAN_RECORD}",
            "for": sustained,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "step time regression on rank {{ $labels.rank }} ({{ $labels.node }})",
                "description": f"step time {{{{ $value | humanizeDuration }}}}, above {ratio}x the run's median",
            },
        },
        {
            "alert": "MxcGpuThermalThrottling",
            "expr": (f'sum without (reason) (rate(mxc_gpu_throttled_seconds_total{{reason=~"{THERMAL_REASONS}"}}[2m])) '
                     f"> {_number(alerts.throttle_ratio)}"),
            "for": "2m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "GPU {{ $labels.gpu }} on {{ $labels.node }} is thermally throttled",
                "description": "clocks held down for heat {{ $value | humanizePercentage }} of the time",
            },
        },
        {
            "alert": "MxcRdmaRetryBurst",
            "expr": f"{_rdma_retries_per_second()} > {_number(alerts.rdma_retries_per_second)}",
            "for": "1m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "RDMA retry burst on {{ $labels.node }} {{ $labels.device }} port {{ $labels.port }}",
                "description": "{{ $value | humanize }} retries/s (ACK timeouts, retransmits, sequence NAKs)",
            },
        },
        {
            "alert": "MxcRdmaRetryExceeded",
            "expr": "increase(mxc_rdma_retry_exceeded_total[5m]) > 0",
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "RDMA retries exhausted on {{ $labels.node }} {{ $labels.device }} port {{ $labels.port }}",
                "description": "a queue pair ran out of retries: the collective on it fails",
            },
        },
    ]
    return {"groups": [median, {"name": "mxc-alerts", "rules": rules}]}


def render_rules(observability: Observability) -> str:
    """``alerts.rules.yml``: a header comment, then the groups (block style, keys in order)."""
    header = ("# Prometheus rules for this run, evaluated by its own Prometheus; generated by `mxc build` from\n"
              "# observability.alerts (mxc/compiler/alert_rules.py). Firing alerts: <run>/observability/alerts.jsonl\n"
              "# and the notify webhook (docs/alerts.md).\n")
    body = yaml.safe_dump(rule_groups(observability), sort_keys=False, default_flow_style=False, width=1000,
                          allow_unicode=True)
    return header + body
