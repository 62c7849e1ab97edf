"""Merge MaxText's per-attempt metrics files into one line per step.

Each attempt writes ``metrics/attempt-N.rank-R.jsonl`` (MaxText's ``metrics_file``). An
attempt that resumes from checkpoint C starts at step C+1, but the attempt before it may
already have written steps past C before it died: those were recomputed, so the later
attempt's lines replace the earlier attempt's from the later attempt's first step on.
Lines are copied verbatim, so floats keep MaxText's full precision. A torn last line
(the process was killed mid-write) is ignored.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mxc.fsutil import iter_lines, loads, open_regular, write_atomic

PART = re.compile(r"^attempt-(?P<attempt>\d+)\.rank-(?P<rank>\d+)\.jsonl$")
LOSS_KEY = "learning/loss"


@dataclass(frozen=True)
class MergeResult:
    steps: int  # distinct steps in the merged file
    last_step: int | None
    last_loss: float | None
    replaced: int  # lines of earlier attempts replaced by a later attempt


def attempt_files(parts: Path, rank: int = 0) -> list[tuple[int, Path]]:
    if not parts.is_dir():
        return []
    found = []
    for path in parts.iterdir():
        match = PART.match(path.name)
        if match and int(match["rank"]) == rank:
            found.append((int(match["attempt"]), path))
    return sorted(found)


def read_lines(path: Path) -> list[tuple[int, str, dict[str, Any]]]:
    """(step, raw line, parsed) for every complete, valid line."""
    out = []
    for line in iter_lines(path):  # a FIFO or directory in a metrics file's place reads as empty
        raw = line.decode("utf-8", "replace")
        try:
            data = loads(raw)
            step = int(data["step"])
        except (ValueError, KeyError, TypeError, OverflowError):  # OverflowError: "step": 1e999 (inf)
            continue
        out.append((step, raw, data))
    return out


def merge(parts: Path, rank: int = 0) -> tuple[list[str], int]:
    """The merged raw lines in step order, and how many earlier lines were replaced."""
    merged: dict[int, str] = {}
    replaced = 0
    for _, path in attempt_files(parts, rank):
        lines = read_lines(path)
        if not lines:
            continue
        first = lines[0][0]
        stale = [s for s in merged if s >= first]
        replaced += len(stale)
        for s in stale:
            del merged[s]
        for step, raw, _ in lines:
            if step in merged:
                replaced += 1
            merged[step] = raw
    return [merged[s] for s in sorted(merged)], replaced


def write_merged(parts: Path, target: Path, rank: int = 0) -> MergeResult:
    """Merge into ``target``, written only when its content changes: every look at a live Slurm
    run merges (``mxc runs`` over 200 runs), and a rewrite of unchanged bytes costs an fsync each."""
    lines, replaced = merge(parts, rank)
    content = "".join(line + "\n" for line in lines).encode("utf-8")
    if _content(target, len(content)) != content:
        write_atomic(target, content)
    if not lines:
        return MergeResult(0, None, None, replaced)
    last = loads(lines[-1])
    loss = last.get(LOSS_KEY)
    last_loss = float(loss) if isinstance(loss, (int, float)) and math.isfinite(loss) else None
    return MergeResult(len(lines), int(last["step"]), last_loss, replaced)


def _content(path: Path, size: int) -> bytes | None:
    """The file's bytes when it is a regular file of exactly ``size`` bytes, else None."""
    try:
        if path.stat().st_size != size:
            return None
        with open_regular(path) as fh:
            return fh.read(size + 1)
    except OSError:
        return None


def losses(path: Path) -> dict[int, float]:
    """step -> loss of a merged metrics.jsonl (exact floats, for comparing runs)."""
    out: dict[int, float] = {}
    if not path.is_file():
        return out
    for step, _, data in read_lines(path):
        loss = data.get(LOSS_KEY)
        if isinstance(loss, (int, float)) and not isinstance(loss, bool):
            out[step] = float(loss)
    return out
