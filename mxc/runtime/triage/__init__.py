"""Failure triage: why did a run fail, on which rank and node, and what to try (``mxc triage``).

``classify(run_dir)`` reads every rank's logs, the record, per-rank stage/event/preflight files,
the kernel lines and crash notes the entrypoint kept, and the metrics, and matches them against
the catalog in ``patterns.yaml`` (docs/triage.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mxc.runtime.triage.classify import Verdict, classify

__all__ = ["Verdict", "classify"]


def __getattr__(name: str) -> Any:
    """``classify`` and ``Verdict`` load on first use: `mxc build` reads the catalog (catalog.py)
    without importing the classifier and everything it reads with."""
    if name in __all__:
        import importlib

        # By its full name (`from mxc.runtime.triage import classify` would ask this function again);
        # importing the submodule binds its name here, so the function is bound over it, once.
        value = getattr(importlib.import_module("mxc.runtime.triage.classify"), name)
        globals().update(classify=importlib.import_module("mxc.runtime.triage.classify").classify)
        return value
    raise AttributeError(name)
