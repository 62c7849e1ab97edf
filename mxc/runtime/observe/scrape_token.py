"""The run's scrape token: what the run's Prometheus shows its exporters (``metrics_server.py``).

One per run directory, ``<run>/prometheus/scrape-token`` (beside the copied prometheus.yml,
whose ``credentials_file: scrape-token`` Prometheus resolves relative to itself), mode 0600:
only the run's user reads it, also on the shared file system every node of a Slurm job sees.
It lives in the run directory, never in the bundle: bundles are content-addressed, shared and
reviewed, a token is a per-run secret. The first process that needs it makes it, exclusively (a
private temporary file, then a hard link to the name, which fails if another node won the race),
so the nodes of a job that start at once agree on one token; the others read it. It is never
printed, recorded or logged; a requeued job keeps it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from mxc.fsutil import open_regular

FILE = "scrape-token"
_BYTES = 32


def path_in(tsdb_home: Path) -> Path:
    """Where the token of a run whose Prometheus home (``<run>/prometheus``) is ``tsdb_home`` lives."""
    return tsdb_home / FILE


def ensure(path: Path) -> str:
    """The token in ``path``, made first if there is none (0600; one winner when several race)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    existing = read(path)
    if existing:
        return existing
    token = secrets.token_hex(_BYTES)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(token + "\n")
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    found = read(path)
    if not found:
        raise OSError(f"cannot read the run's scrape token {path}")
    return found


def read(path: Path) -> str | None:
    """The token, or None when there is none: a regular file, never through a link (someone who
    planted one would choose the token), bounded, hex only."""
    try:
        with open_regular(path, follow_symlinks=False) as fh:
            text = fh.read(4 * _BYTES).decode("ascii", "replace").strip()
    except OSError:
        return None
    if len(text) != 2 * _BYTES or any(c not in "0123456789abcdef" for c in text):
        return None
    return text
