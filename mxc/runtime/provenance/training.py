"""record.training: what rank 0's training started with, read back from the run directory; and
how two runs differ in it (``mxc compare``).

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
from mxc.runtime.provenance.environment import recorded_caller, recorded_environment
from mxc.runtime.provenance.hostfacts import Drift
from mxc.runtime.record import RunRecord


def rank0(run: Path, spec: Mapping[str, Any]) -> dict[str, Any] | None:
    """{environment, passed, modules, caller, skipped_mounts, container, attempt} of rank 0's latest start;
    None before it started. ``caller``: what of the caller's shell reached the training (``mxc rerun``
    compares it with its own, mxc/runtime/replay.py)."""
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
    for why in CROSSED:  # names only (envboundary.crossed): a passed variable may hold a secret
        names = env.get(why) if isinstance(env, dict) else None
        if isinstance(names, list):
            out[why] = sorted(str(n) for n in names if isinstance(n, str))[:1000]
    caller = env.get("caller") if isinstance(env, dict) else None
    if isinstance(caller, dict):
        out["caller"] = recorded_caller({str(k): str(v) for k, v in caller.items()}, spec)
    return out


# What crossed from the node's environment besides the base, recorded by name (mxc/node/envboundary.py).
CROSSED = ("passed", "modules")


# Per-run values (where the run lives, who coordinates it) that differ between any two runs.
_PER_RUN_PREFIXES = ("MXC_", "JAX_COORDINATOR_")


def drift(a: RunRecord, b: RunRecord) -> list[Drift]:
    """The variables rank 0's training saw differently in two runs (``mxc compare``): the image's
    own values, what the spec joined to them, what the node decided. Each run's directory is read
    as ``{run_dir}`` first, so a dump path inside it is no difference; mxc's per-run variables are
    left out."""
    env_a, env_b = (_environment(r) for r in (a, b))
    if env_a is None or env_b is None:
        return []
    out = []
    for name in sorted(set(env_a) | set(env_b)):
        if name.startswith(_PER_RUN_PREFIXES):
            continue
        old, new = env_a.get(name), env_b.get(name)
        if old != new:
            out.append(Drift(f"training env {name}", "unset" if old is None else old, "unset" if new is None else new))
    return out


def _environment(record: RunRecord) -> dict[str, str] | None:
    values = (record.training or {}).get("environment")
    if not isinstance(values, dict):
        return None
    run_dir = str(values.get("MXC_RUN_DIR") or "")
    return {str(k): str(v).replace(run_dir, "{run_dir}") if run_dir else str(v) for k, v in values.items()}
