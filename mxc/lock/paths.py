"""Where locks live: ``<project>/lockfiles/<spec stem>.lock.json``.

The project root is the nearest directory above the spec that has a ``lockfiles/`` folder
(else a ``.git``, else the current directory), so ``mxc lock specs/70b.yaml`` writes
``lockfiles/70b.lock.json`` next to ``specs/`` and paths inside a lock are relative to it:
the lock reads the same on every clone.
"""

from __future__ import annotations

import os
from pathlib import Path

LOCK_DIR = "lockfiles"


def project_root(spec: Path) -> Path:
    start = spec.resolve().parent
    for marker in (LOCK_DIR, ".git"):
        for directory in (start, *start.parents):
            if (directory / marker).exists():
                return directory
    return Path.cwd().resolve()


def lock_path(spec: Path) -> Path:
    return project_root(spec) / LOCK_DIR / f"{spec.name.rsplit('.', 1)[0]}.lock.json"


def relative(path: Path, root: Path) -> str:
    """``path`` relative to ``root`` with forward slashes (``..`` allowed), as stored in a lock."""
    return Path(os.path.relpath(path.resolve(), root)).as_posix()


def shown(path: Path) -> str:
    """A path as the user should read it: relative to the current directory when that is shorter."""
    rel = os.path.relpath(path.resolve(), Path.cwd())
    return rel if not rel.startswith("../..") else str(path)
