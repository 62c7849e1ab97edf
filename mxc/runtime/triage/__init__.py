"""Failure triage: why did a run fail, on which rank and node, and what to try (``mxc triage``).

``classify(run_dir)`` reads every rank's logs, the record, per-rank stage/event/preflight files,
the kernel lines and crash notes the entrypoint kept, and the metrics, and matches them against
the catalog in ``patterns.yaml`` (docs/triage.md).
"""

from mxc.runtime.triage.classify import Verdict, classify

__all__ = ["Verdict", "classify"]
