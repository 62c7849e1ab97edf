"""What is inside one run directory: ``<runs root>/<run-id>/``.

One place names every path in it, so the supervisor, the backends, observability and triage
agree on the layout without passing strings around; what the node program writes is named by
mxc/node/layout.py (shipped in every bundle), which these properties use. Where the run directory
is, and the trees a run has outside it (``checkpoint.dir``), is mxc/runtime/runpaths.py's to say.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from mxc.node import layout

_RUN_ID = re.compile(r"^\d{8}-\d{6}-[0-9a-f]{4}-[0-9a-f]{8}$")


def new_run_id(bundle_hash: str) -> str:
    """Sortable by start time, unique (random suffix), and tied to its bundle (short hash)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return f"{stamp}-{os.urandom(2).hex()}-{bundle_hash[:8]}"


def is_run_id(text: str) -> bool:
    return bool(_RUN_ID.match(text))


@dataclass(frozen=True)
class RunDir:
    path: Path

    @property
    def run_id(self) -> str:
        return self.path.name

    @property
    def record(self) -> Path:
        return self.path / "record.json"

    @property
    def log(self) -> Path:
        """Everything the training printed (all attempts, all ranks on this node)."""
        return self.path / "train.log"

    @property
    def log_cursor(self) -> Path:
        """Private: how far the Slurm backend has read train.log, and what it found (not the record)."""
        return self.path / ".log-cursor.json"

    @property
    def metrics(self) -> Path:
        """MaxText's per-step metrics, merged over attempts: one line per step, no duplicates."""
        return self.path / "metrics.jsonl"

    @property
    def metrics_parts(self) -> Path:
        """Raw per-attempt, per-rank metrics files written by MaxText (metrics_file=...)."""
        return self.path / "metrics"

    @property
    def bundle(self) -> Path:
        """The run's own copy of the bundle it ran (mxc/runtime/kept_bundle.py)."""
        return self.path / "bundle"

    def rank_dir(self, rank: int) -> Path:
        """Per-rank files from the node program: events.jsonl, preflight.json, kernel.<attempt>.log."""
        return layout.rank_dir(self.path, rank)

    @property
    def tsdb(self) -> Path:
        return self.path / "prometheus"

    @property
    def stacks(self) -> Path:
        """Python/native stack dumps (hangs, fatal signals)."""
        return layout.stacks(self.path)
