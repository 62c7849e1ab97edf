"""Labels of bundles (``mxc build --label NAME``), kept by the store beside the bundles.

A bundle is named by its content and holds no metadata of this machine: a label is a note about
it, so it lives outside it, in ``$MXC_HOME/bundle-labels.jsonl``, one line per labelling
(``{"bundle", "label", "at"}``), appended (a short ``O_APPEND`` write: builds running at the same
time never lose each other's lines). Reading keeps every well-formed line, so a torn or edited
line costs only itself; ``label:NAME`` names the bundle most recently built with that label.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from pathlib import Path

from mxc.errors import cannot_write
from mxc.fsutil import read_jsonl

FILE = "bundle-labels.jsonl"
_HASH = re.compile(r"^[0-9a-f]{64}$")


def add(home: Path, digest: str, labels: Iterable[str]) -> None:
    import json

    lines = "".join(json.dumps({"bundle": digest, "label": label, "at": time.time()}, sort_keys=True) + "\n"
                    for label in labels)
    if not lines:
        return
    path = home / FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, lines.encode())
        finally:
            os.close(fd)
    except OSError as exc:
        raise cannot_write(str(path), exc) from None


def read(home: Path) -> dict[str, dict[str, float]]:
    """bundle hash -> {label: when it was last given}."""
    out: dict[str, dict[str, float]] = {}
    for entry in read_jsonl(home / FILE):
        digest, label, at = entry.get("bundle"), entry.get("label"), entry.get("at")
        if isinstance(digest, str) and _HASH.match(digest) and isinstance(label, str) and label \
                and isinstance(at, (int, float)):
            seen = out.setdefault(digest, {})
            seen[label] = max(float(at), seen.get(label, float(at)))
    return out
