"""Short-lived directories of live runs (Ray's temp dir), under one directory mxc owns.

Ray needs a temp dir with a short path (its unix sockets must fit in 107 bytes), so it cannot
live in the run directory. Each run's lives in ``/tmp/mxc-<uid>/<random>/`` instead: the
parent is this user's alone (mode 0700, checked, never a link), so other users can neither
read Ray's sockets nor plant a directory there. Each one holds ``owner.json``: the run
directory and the identity (``procfs.ProcessId``) of the process that made it.

The local supervisor of every run makes one too, as its registration: ``mxc cancel`` signals a
record's supervisor only when this user's directory vouches that this very process supervises that
run (``vouches``): a record is a file in a runs root others may write, this directory is not.

A run removes its own when it ends. When its owner was killed without that chance, the
death watch of the run (``mxc.runtime.local.deathwatch``), ``mxc cancel`` of the lost run, or
the next ``mxc run`` removes it: ``sweep`` removes a directory only when its owner is verifiably
gone and no process of its run is left, so a live run's is never touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

from mxc.fsutil import read_json, write_atomic
from mxc.runtime.processes.procfs import ProcessId, processes_with_env

OWNER = "owner.json"


def root(base: Path = Path("/tmp")) -> Path:
    """``/tmp/mxc-<uid>``, created 0700; refused when it is not a directory this user owns (a link,
    a file, another user's). Not ``$TMPDIR``: a long path would not leave Ray room for its sockets."""
    path = base / f"mxc-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise RuntimeError(f"{path} is not a directory of this user: refusing to put run files there")
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(path, 0o700)
    return path


def create(run_dir: Path, owner: ProcessId | None = None) -> Path:
    """A fresh directory for the run in ``run_dir``, owned by ``owner`` (default: this process)."""
    path = Path(tempfile.mkdtemp(prefix="", dir=root()))
    record = {"run_dir": str(run_dir), "owner": (owner or ProcessId.this_process()).as_record()}
    write_atomic(path / OWNER, json.dumps(record) + "\n", 0o600)
    return path


def vouches(run_dir: Path, process: ProcessId) -> bool:
    """Whether a directory of this user's (``root``: only this user writes there) was made by
    ``process`` for the run in ``run_dir``: proof that the process is the run's."""
    try:
        base = root()
        entries = sorted(base.iterdir())
    except (OSError, RuntimeError):
        return False
    for path in entries:
        data = read_json(path / OWNER) if path.is_dir() and not path.is_symlink() else None
        if data and data.get("run_dir") == str(run_dir) and ProcessId.from_record(data.get("owner")) == process:
            return True
    return False


def remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def abandoned(path: Path) -> bool:
    """Whether a scratch directory's owner is gone and nothing of its run still runs."""
    data = read_json(path / OWNER)
    if data is None:
        return False  # being created (or not ours to judge)
    owner = ProcessId.from_record(data.get("owner"))
    if owner is None or owner.is_alive():
        return False
    run_dir = data.get("run_dir")
    return isinstance(run_dir, str) and not processes_with_env("MXC_RUN_DIR", run_dir)


def sweep(run_dir: Path | None = None) -> list[Path]:
    """Remove abandoned directories (only those of ``run_dir`` when given); returns what went."""
    try:
        base = root()
    except (OSError, RuntimeError):
        return []
    removed = []
    for path in sorted(base.iterdir()):
        if run_dir is not None and (read_json(path / OWNER) or {}).get("run_dir") != str(run_dir):
            continue
        if path.is_dir() and not path.is_symlink() and abandoned(path):
            remove(path)
            removed.append(path)
    return removed
