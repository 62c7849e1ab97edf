"""Atomic writes: a reader sees the old file or the new one, never half of either."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_atomic(path: Path, content: str | bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(content.encode() if isinstance(content, str) else content)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object, or None where the file is missing, unreadable or not one."""
    try:
        data = json.loads(path.read_text("utf-8"), strict=False)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every complete, valid line of a JSON-lines file another process may be appending to
    (a line being written, or a torn one, is skipped)."""
    try:
        text = path.read_text("utf-8", errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            data = json.loads(line, strict=False)
        except ValueError:
            continue
        if isinstance(data, dict):
            out.append(data)
    return out


def mxc_home() -> Path:
    return Path(os.environ.get("MXC_HOME") or Path.home() / ".mxc")
