"""Run directories for report tests, made from the real runs saved as triage fixtures.

``succeeded_after_kill`` is a real 30-step tiny training that was SIGKILLed and resumed from its
step-10 checkpoint (its metrics were trimmed to steps 0-2 and 27-29: the steps between are filled
in here, on the line between them); ``config_error`` a real run that MaxText refused before its
first step. A second succeeded run is derived from the first: another learning rate in its spec,
another jax in its environment, and losses that leave the first run's from ``DIVERGES_AT``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from mxc.compiler.manifest import MANIFEST, build_manifest, bundle_hash
from mxc.store import Store

FIXTURES = Path(__file__).parent / "fixtures" / "triage"
DIVERGES_AT = 12
# The start of each run's id: the rest is the short hash of the bundle made for it (``_spec``), as a
# run id names its bundle. Unique prefixes: `mxc report BASE` and ``runs.find_run`` take them.
BASE = "20261123-101240-5e8d"  # the fixture's own run started then
OTHER = "20261123-111240-5e8d"
FAILED = "20261123-100533-2df4"


def run_path(home: Path, stamp: str) -> Path:
    """The run directory whose id starts with ``stamp``."""
    (path,) = (home / "runs").glob(f"{stamp}-*")
    return path


def _spec(home: Path, run: Path, spec: dict[str, Any]) -> Path:
    """Store a real hash-addressed bundle holding ``spec`` (reports and compare read only verified
    specs), make the run's record name it, and name the run after it; returns the run's new path."""
    files = {"spec.json": json.dumps(spec)}
    manifest = build_manifest(files, "test")
    bundle = bundle_hash(manifest)
    Store(home).put({**files, MANIFEST: manifest}, bundle)
    named = run.with_name(f"{run.name}-{bundle[:8]}")
    run.rename(named)
    record = _record(named)
    record["bundle"], record["run_id"] = bundle, named.name
    (named / "record.json").write_text(json.dumps(record))
    return named


def _record(run: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run / "record.json").read_text())
    return data


def _fill_steps(run: Path) -> None:
    """Every step 0-29: the kept rows, and between steps 2 and 27 rows on the line between them."""
    rows = {int(r["step"]): r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    low, high = rows[2], rows[27]
    for step in range(3, 27):
        f = (step - 2) / 25
        rows[step] = {**low, "step": float(step), **{k: low[k] + f * (high[k] - low[k]) for k in low
                                                     if k.startswith(("learning/", "perf/"))}}
    (run / "metrics.jsonl").write_text("".join(json.dumps(rows[s]) + "\n" for s in sorted(rows)))


def base_run(home: Path) -> Path:
    run = home / "runs" / BASE
    shutil.copytree(FIXTURES / "succeeded_after_kill", run)
    _fill_steps(run)
    spec = {"name": "triage-probe", "model": {"overrides": {"learning_rate": 1e-4, "steps": 30}}}
    return _spec(home, run, spec)


def other_run(home: Path, spec_note: str = "") -> Path:
    """Like the base run, with learning_rate 2e-4, jax 0.12.1, and losses that diverge."""
    run = home / "runs" / OTHER
    shutil.copytree(FIXTURES / "succeeded_after_kill", run)
    _fill_steps(run)
    record = _record(run)
    record["host"]["python"]["packages"]["jax"] = "0.12.1"
    (run / "record.json").write_text(json.dumps(record))
    spec = {"name": "triage-probe", "model": {"overrides": {"learning_rate": 2e-4, "steps": 30}}, "note": spec_note}
    run = _spec(home, run, spec)
    lines = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["step"] >= DIVERGES_AT:
            row["learning/loss"] *= 1 - 0.004 * (row["step"] - DIVERGES_AT + 1)
            row["perf/step_time_seconds"] *= 1.25
        lines.append(json.dumps(row))
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return run


def failed_run(home: Path) -> Path:
    """A real run that failed before its first step: MaxText refused an unknown override."""
    run = home / "runs" / FAILED
    shutil.copytree(FIXTURES / "config_error", run)
    return _spec(home, run, {"name": "triage-probe", "model": {"overrides": {"foo_bar": 1}}})


def record_jax(run: Path) -> str:
    return str(_record(run)["host"]["python"]["packages"]["jax"])
