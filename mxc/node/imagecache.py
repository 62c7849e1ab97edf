"""The image cache: each image fetched once into ``<cache>/<name>``, never two writers on one file.

``ensure`` takes ``<name>.lock`` (``flock``; NFS and most cluster file systems honour it across
clients), and under the lock: an existing ``<name>`` is used as is; otherwise the fetch command
writes a temporary name unique to this process (``.<name>.<host>.<pid>.tmp``), the result is
verified, and renamed into place. A failed or interrupted fetch leaves no ``<name>`` behind (its
temporary file is removed; one left by a killed node is never read and is swept by the next
fetch once it is older than a day), so a partial file is never used. Others wait on the lock, up
to the stage's deadline. Today every Apptainer node pulled into the same shared ``<digest>.sif.tmp``.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

STALE_TMP_S = 86400


class ImageError(RuntimeError):
    """The image could not be fetched or verified (the message says why)."""


@dataclass(frozen=True)
class Ready:
    path: Path
    action: str  # cached (already there) | fetched (by this process)
    waited_s: float  # on another node's fetch


def ensure(cache: Path, name: str, fetch: Callable[[Path, float], None], verify: Callable[[Path], None],
           deadline: float, clock: Callable[[], float] = time.monotonic, poll_s: float = 0.5) -> Ready:
    """``<cache>/<name>``, fetched with ``fetch(tmp_path, seconds_left)`` if missing and checked
    with ``verify(tmp_path)`` (both raise ImageError), before the monotonic ``deadline``."""
    cache.mkdir(parents=True, exist_ok=True)
    final = cache / name
    started = clock()
    with open(cache / f"{name}.lock", "a") as lock:
        while True:
            try:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
            if clock() >= deadline:
                raise ImageError(f"another node has held {cache / (name + '.lock')} for {clock() - started:.0f}s "
                                 "(still fetching the image); the image stage's time is up")
            time.sleep(poll_s)
        waited = clock() - started
        try:
            if final.exists():
                return Ready(final, "cached", waited)
            _sweep(cache, name)
            tmp = cache / f".{name}.{socket.gethostname()}.{os.getpid()}.tmp"
            try:
                fetch(tmp, deadline - clock())
                if not tmp.is_file() or tmp.stat().st_size == 0:
                    raise ImageError(f"the fetch left no image at {tmp}")
                verify(tmp)
                os.replace(tmp, final)
            finally:
                if tmp.exists():
                    tmp.unlink()
            return Ready(final, "fetched", waited)
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def _sweep(cache: Path, name: str) -> None:
    """Temporary files of fetches killed long ago (their process cannot be asked: it may be on another node)."""
    for path in cache.glob(f".{name}.*.tmp"):
        try:
            if time.time() - path.stat().st_mtime > STALE_TMP_S:
                path.unlink()
        except OSError:
            pass


def run_fetch(argv: list[str], seconds_left: float) -> None:
    """Run a fetch command (``apptainer pull ...``) within the time left; ImageError if it fails."""
    if seconds_left <= 0:
        raise ImageError("no time left in the image stage to fetch the image")
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, timeout=seconds_left, check=False)
    except subprocess.TimeoutExpired:
        raise ImageError(f"{argv[0]} {argv[1] if len(argv) > 1 else ''} ran past the image stage's time") from None
    except OSError as exc:
        raise ImageError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
    if done.returncode != 0:
        raise ImageError(f"{' '.join(argv[:2])} failed (exit {done.returncode})")
