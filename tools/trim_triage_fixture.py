#!/usr/bin/env python3
"""Turn a real failed run directory into a small triage fixture (tests/fixtures/triage/<case>/).

Keeps what `mxc triage` reads and drops the bulk: MaxText's ~900 "Config param" lines, the
middle of long tracebacks, other threads' faulthandler stacks, all but a few step lines, cores
(hundreds of MB; the crash note still names them) and checkpoints. Lines are copied verbatim
(only cut at 1500 characters), so the fixture is real output, trimmed.

usage: tools/trim_triage_fixture.py RUN_DIR CASE_DIR
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MAX_LINE = 1500
LABEL = re.compile(r"^(\s*\d+: )")
FRAME = re.compile(r'^\s+File "')
KEEP = re.compile(
    r"^\[mxc|^srun|slurmstepd|restoring from this run|No existing checkpoints|Fatal Python error|^Current thread 0x"
    r"|During handling of the above|The above exception was|Training stopped|^F\d{4} |^E\d{4} .*(rror|ailed)|"
    r"Killed|core dumped|Aborting training"
)


def _strip(line: str) -> tuple[str, str]:
    m = LABEL.match(line)
    return (m[1], line[m.end():]) if m else ("", line)


def trim_log(lines: list[str], prefilter: re.Pattern[str]) -> list[str]:
    keep: set[int] = set()
    steps: list[int] = []
    i = 0
    while i < len(lines):
        _, text = _strip(lines[i])
        if "Config param " in text:
            i += 1
            continue
        if "completed step" in text:
            steps.append(i)
        if text.startswith("Traceback (most recent call last):"):
            end = i + 1
            while end < len(lines) and (_strip(lines[end])[1].startswith((" ", "\t")) or not _strip(lines[end])[1]):
                end += 1
            frames = [j for j in range(i + 1, end) if FRAME.match(_strip(lines[j])[1])]
            start = frames[-6] if len(frames) > 6 else i + 1
            keep.add(i)
            keep.update(range(start, min(end + 1, len(lines))))
            i = end + 1
            continue
        if text.startswith("Current thread 0x"):
            keep.update(range(i, min(i + 9, len(lines))))
        if KEEP.search(text) or prefilter.search(text):
            keep.add(i)
            keep.update(j for j in (i - 2, i - 1) if j >= 0 and "Config param" not in lines[j])
        i += 1
    # the first and last steps of each stretch of training
    for group in _runs(steps):
        keep.update(group[:2] + group[-3:])
    out = []
    for j in sorted(keep):
        line = lines[j]
        out.append(line if len(line) <= MAX_LINE else line[:MAX_LINE])
    return out


def _runs(indices: list[int]) -> list[list[int]]:
    groups: list[list[int]] = []
    for i in indices:
        if groups and i - groups[-1][-1] < 200:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def trim_native(text: str) -> str:
    lines = text.splitlines()
    current = next((m[1] for ln in lines if (m := re.match(r"^\[Current thread is (\d+) ", ln))), None)
    out = [ln for ln in lines if ln.startswith(("Core was generated", "Program terminated", "[Current thread is", "#0 "))]
    inside = False
    for ln in lines:
        if ln.startswith("Thread "):
            inside = current is not None and ln.startswith(f"Thread {current} (")
            if inside:
                out.append(ln)
            continue
        if inside and ln.startswith("#") and len(out) < 40:
            out.append(ln[:400])
    return "\n".join(out) + "\n"


def main(src: Path, dst: Path) -> None:
    from mxc.runtime.triage import catalog

    prefilter = catalog.load().prefilter
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("record.json", "batch.jsonl"):
        if (src / name).is_file():
            shutil.copy(src / name, dst / name)
    for log in [*src.glob("*.log"), *src.glob("*.out")]:
        lines = log.read_text("utf-8", errors="replace").splitlines()
        (dst / log.name).write_text("\n".join(trim_log(lines, prefilter)) + "\n", "utf-8")
    metrics = src / "metrics.jsonl"
    if metrics.is_file():
        rows = metrics.read_text("utf-8").splitlines()
        nan = [r for r in rows if "NaN" in r or "Infinity" in r]
        kept = rows[:3] + nan[:2] + rows[-3:] if len(rows) > 8 else rows
        (dst / "metrics.jsonl").write_text("\n".join(dict.fromkeys(kept)) + ("\n" if kept else ""), "utf-8")
    for rank_dir in sorted((src / "ranks").glob("*")):
        out = dst / "ranks" / rank_dir.name
        out.mkdir(parents=True, exist_ok=True)
        for f in rank_dir.iterdir():
            if f.is_file() and not f.name.startswith("."):
                shutil.copy(f, out / f.name)
    stacks = src / "stacks"
    if stacks.is_dir():
        (dst / "stacks").mkdir(exist_ok=True)
        for f in stacks.iterdir():
            text = f.read_text("utf-8", errors="replace")
            (dst / "stacks" / f.name).write_text(trim_native(text) if f.name.startswith("native.") else text, "utf-8")
    record = dst / "record.json"
    if record.is_file():  # the full package list is long and says nothing about the failure
        data = json.loads(record.read_text("utf-8"))
        python = (data.get("host") or {}).get("python") or {}
        python.pop("all_packages", None)
        record.write_text(json.dumps(data, indent=2) + "\n", "utf-8")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(Path(sys.argv[1]), Path(sys.argv[2]))
