"""record.training: what rank 0's training started with, read back from the run directory.

The node program (natively) or envmerge.py (inside the container) writes the environment the
trainer was started with, after the spec's variables met the image's (mxc/node/envmerge.py); the
node program writes which optional mounts it skipped. The record keeps the environment through
the same allow-list and redaction as ``record.environment`` (environment.py): only known names,
no secret-named variable, secret-shaped values masked.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mxc.fsutil import read_json
from mxc.node import layout
from mxc.runtime.provenance.environment import recorded_environment


def rank0(run: Path, spec: Mapping[str, Any]) -> dict[str, Any] | None:
    """{environment, skipped_mounts, container, attempt} of rank 0's latest start; None before it started."""
    env = read_json(layout.environment(run, 0))
    launch = read_json(layout.launch(run, 0))
    if not isinstance(env, dict) and not isinstance(launch, dict):
        return None
    out: dict[str, Any] = {}
    if isinstance(launch, dict):
        out.update(attempt=launch.get("attempt"), container=launch.get("container"),
                   skipped_mounts=[str(m) for m in launch.get("skipped_mounts") or []])
    values = env.get("environment") if isinstance(env, dict) else None
    if isinstance(values, dict):
        out["environment"] = recorded_environment({str(k): str(v) for k, v in values.items()}, spec)
    return out
