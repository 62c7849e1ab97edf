"""The chat message for an alert of the bundle's Prometheus rules, sent through the spec's ``notify``.

The alert receiver (``alert_receiver.py``) hands over each alert's first firing and its
resolution; this turns one into a line of text and posts it with ``mxc.runtime.notify.send``
(the same destinations, secret handling and redaction as every other alert of the run:
docs/alerts.md). It runs in whichever process runs the run's Prometheus: the local supervisor
(whose environment holds ``notify.secret_env``'s variable), or node rank 0's node observer of a
Slurm job, whose environment is the ranks': the batch side removes ``secret_env``'s variable from
it (mxc/node/jobreport.py ``rank_env``), so there only ``notify.secret_file`` can post rule alerts;
with ``secret_env`` each stays in ``alerts.jsonl`` with ``failed: environment variable ... is not set``.
``observability.alerts.notify: false`` keeps alerts in ``alerts.jsonl`` only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Sender = Callable[[dict[str, Any]], str | None]


def message(run_id: str, alert: Mapping[str, Any]) -> str:
    """``mxc: run R: MxcTrainingStalled (warning) firing: <summary>`` and the description below."""
    annotations = alert.get("annotations") or {}
    severity = f" ({alert['severity']})" if alert.get("severity") else ""
    summary = annotations.get("summary") or ""
    text = f"mxc: run {run_id}: {alert.get('alertname', 'alert')}{severity} {alert.get('state', 'firing')}"
    text += f": {summary}" if summary else ""
    description = annotations.get("description")
    return text + (f"\n{description}" if description and alert.get("state") == "firing" else "")


def sender(spec: Mapping[str, Any] | None, run_id: str) -> Sender | None:
    """What posts the run's alerts, or None when the spec has no ``notify`` or turned this off."""
    if not spec:
        return None
    alerts = ((spec.get("observability") or {}).get("alerts")) or {}
    if alerts.get("notify") is False:
        return None
    from mxc.runtime import notify

    config = notify.NotifyConfig.from_spec(spec)
    if config is None:
        return None

    def send(alert: dict[str, Any]) -> str:
        """How it went (``sent (HTTP 200)``, ``failed: ...``: redacted by notify), kept in alerts.jsonl."""
        return str(notify.send(config, message(run_id, alert)))

    return send
