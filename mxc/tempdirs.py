"""Temporary directories that are filled, then renamed into place (bundles, code exports).

A killed writer leaves its temporary directory behind. Each one is named after its creator,
``.tmp-<host>-<pid>-<random>``, so the next writer can tell an abandoned one (its process is
gone from this host, or it is older than any write takes) from one a concurrent writer is
still filling, and remove only the former.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import tempfile
import time
from pathlib import Path

PREFIX = ".tmp-"
STALE_SECONDS = 3600.0  # a bundle or code export is written in seconds: an hour-old one is abandoned


def _host() -> str:
    return socket.gethostname().replace("-", "_") or "localhost"


def make(parent: Path) -> Path:
    """A fresh temporary directory in ``parent`` (which must exist), named after this process."""
    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{_host()}-{os.getpid()}-", dir=parent))


def _abandoned(name: str, mtime: float, now: float) -> bool:
    if now - mtime > STALE_SECONDS:
        return True
    owner = name[len(PREFIX):].rsplit("-", 2)
    if len(owner) != 3 or owner[0] != _host() or not owner[1].isdigit():
        return False  # another host's (or an old-style name): only its age tells
    from mxc.runtime.processes.procfs import pid_alive

    return not pid_alive(int(owner[1]))


def remove(path: Path) -> None:
    """Remove a file, link or a whole (possibly read-only) tree, never following a link."""
    if not stat.S_ISDIR(os.lstat(path).st_mode):
        path.unlink()
        return
    os.chmod(path, 0o700)  # first: a directory without read or write permission can be neither listed nor emptied
    for dirpath, dirnames, _ in os.walk(path):
        for name in dirnames:
            inner = os.path.join(dirpath, name)
            if not os.path.islink(inner):
                os.chmod(inner, 0o700)
    import shutil

    shutil.rmtree(path)


def discard(path: Path) -> None:
    """Remove ``path`` (a bundle, run or code export, possibly a read-only tree) as a whole: renamed
    to a temporary name beside it first, so a reader finds it complete or not at all, then deleted.
    A removal cut short leaves a temporary directory that ``sweep`` removes later.

    The rename replaces the empty directory ``make`` created, in the same parent: moving a directory
    into another one needs write permission on it (its ``..`` changes), which a read-only bundle does
    not give even its owner."""
    if not stat.S_ISDIR(os.lstat(path).st_mode):
        path.unlink()
        return
    aside = make(path.parent)
    try:
        os.rename(path, aside)
    except OSError:
        os.rmdir(aside)
        raise
    with contextlib.suppress(FileNotFoundError):  # a concurrent sweep may finish it first
        remove(aside)


def sweep(parent: Path) -> list[str]:
    """Remove the abandoned temporary directories in ``parent``; returns their names."""
    removed: list[str] = []
    now = time.time()
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(PREFIX):
            continue
        with contextlib.suppress(OSError):
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode) and _abandoned(entry.name, info.st_mtime, now):
                remove(Path(entry.path))
                removed.append(entry.name)
    return removed
