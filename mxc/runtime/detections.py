"""The node-computed settings of a run (``env.detect``, mxc/node/detect.py) in its record, and
what changed between two runs.

Each rank writes ``ranks/<rank>/detected.json`` before training; the record carries them all
under ``detected`` (by rank: node, attempt, and per detector what it found, why, what it read and
what reached training), so a record alone says which NCCL_IB_HCA or GID index a run trained
with, and ``mxc compare`` lists a rerun that detected something else next to the other drift.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mxc.fsutil import read_json
from mxc.node import layout
from mxc.node.detect import FORMAT
from mxc.runtime.provenance.hostfacts import Drift


def collect(run: Path) -> dict[str, Any] | None:
    """``{rank: {node, attempt, detectors: {name: {found, reason, inputs, variables}}}}``; None when no rank wrote one."""
    root = run / "ranks"
    if not root.is_dir():
        return None
    out: dict[str, Any] = {}
    for rank in sorted((int(d.name) for d in root.iterdir() if d.name.isdigit()), key=int):
        data = read_json(layout.detected(run, rank))
        if not data or data.get("format") != FORMAT or not isinstance(data.get("detectors"), list):
            continue
        out[str(rank)] = {
            "node": data.get("node"), "attempt": data.get("attempt"),
            "detectors": {e["detector"]: {k: v for k, v in e.items() if k != "detector"}
                          for e in data["detectors"] if isinstance(e, dict) and isinstance(e.get("detector"), str)},
        }
    return out or None


def _outcomes(detected: dict[str, Any] | None) -> dict[tuple[str, str], str]:
    """(rank, variable) -> what training got from detection, as words: the value, or why none."""
    out = {}
    for rank, entry in (detected or {}).items():
        for name, result in (entry.get("detectors") or {}).items():
            for variable, outcome in (result.get("variables") or {}).items():
                how = outcome.get("how")
                if how in ("detected", "guard"):
                    text = str(outcome.get("value"))
                elif how == "kept":
                    text = f"kept {outcome.get('was')!r}"
                else:
                    text = f"unset ({result.get('reason')})"
                out[(rank, variable)] = f"{text} [{name}]"
    return out


def drift(a: dict[str, Any] | None, b: dict[str, Any] | None) -> list[Drift]:
    """Each variable whose detection differs between two runs' records, rank by rank."""
    old, new = _outcomes(a), _outcomes(b)
    keys = sorted(set(old) | set(new), key=lambda k: (int(k[0]) if k[0].isdigit() else 0, k[1]))
    return [Drift(f"detected {variable} (rank {rank})", old.get((rank, variable), "not detected"),
                  new.get((rank, variable), "not detected"))
            for rank, variable in keys if old.get((rank, variable)) != new.get((rank, variable))]
