"""Which MaxText checkpoints are finished: the one scan that the restart policy, the batch side
and the "training already complete" check all use.

MaxText saves with orbax (pinned: orbax-checkpoint 0.12.8, through its v1 ``training.Checkpointer``)
into ``<base_output_directory>/<run_name>/checkpoints/<step>/``. What marks a finished save in
that version (orbax/checkpoint/_src/path/atomicity.py):

- on a POSIX path orbax's default atomicity is ``ATOMIC_RENAME``: a save is written into
  ``<step>.orbax-checkpoint-tmp`` (older versions add ``-<timestamp>``), ``finalize()`` writes
  ``commit_success.txt`` into it and renames it to ``<step>``;
- in ``COMMIT_FILE`` mode (the default on GCS, or when configured) the save is written into
  ``<step>`` itself and ``finalize()`` writes ``commit_success.txt`` into it last;
- in both, ``finalize()`` first sets ``commit_timestamp_nsecs`` in ``<step>/_CHECKPOINT_METADATA``
  (``null`` until then).

So a checkpoint counts as finished when its directory is named by digits only and holds
``commit_success.txt``, or, for saves by orbax versions that did not write that file on rename,
a ``_CHECKPOINT_METADATA`` with a commit timestamp. A directory with neither (a save cut short in
COMMIT_FILE mode) is not finished; a temporary name is never a step. tests/test_node_checkpoints.py
checks this against saves that the pinned orbax itself made and left unfinished.

Everything here tolerates what a shared file system does: missing directories, files in the
way, unreadable entries, a metadata file that is huge or not JSON.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from . import sysread

COMMIT_MARKER = "commit_success.txt"
STEP_METADATA = "_CHECKPOINT_METADATA"
TMP_SUFFIX = ".orbax-checkpoint-tmp"
METADATA_LIMIT = 1 << 20  # bytes: orbax's step metadata is a few hundred bytes


def checkpoints_dir(checkpoint_root: Path, run_name: str) -> Path:
    """Where MaxText puts a run's checkpoints: ``<base_output_directory>/<run_name>/checkpoints``."""
    return checkpoint_root / run_name / "checkpoints"


def step_of(name: str) -> int | None:
    """The step a directory name stands for: ASCII digits only (``12``), else None (``12.orbax-checkpoint-tmp``)."""
    return int(name) if name.isascii() and name.isdigit() else None


def _exists(path: Path) -> bool:
    try:
        os.stat(path)
    except (OSError, ValueError):
        return False
    return True


def _is_dir(path: Path) -> bool:
    try:
        return os.path.isdir(path)
    except (OSError, ValueError):
        return False


def _committed_in_metadata(step_dir: Path) -> bool:
    data = sysread.read_bytes(step_dir / STEP_METADATA, METADATA_LIMIT)
    if not data:
        return False
    try:
        metadata = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        return False
    committed = metadata.get("commit_timestamp_nsecs") if isinstance(metadata, dict) else None
    return isinstance(committed, int) and not isinstance(committed, bool)


def is_finished(step_dir: Path) -> bool:
    """Whether ``step_dir`` holds a finished orbax save (see the module docstring)."""
    if step_of(step_dir.name) is None or not _is_dir(step_dir):
        return False
    return _exists(step_dir / COMMIT_MARKER) or _committed_in_metadata(step_dir)


def finished_steps(checkpoints: Path) -> list[int]:
    """Steps of the finished checkpoints in ``checkpoints``, ascending; empty when there is none or no directory."""
    steps = []
    for name in sysread.list_dir(checkpoints):
        step = step_of(name)
        if step is not None and is_finished(checkpoints / name):
            steps.append(step)
    return sorted(steps)


def latest_checkpoint(checkpoints_dir: Path) -> int | None:
    """The newest finished checkpoint's step (what MaxText resumes from), or None."""
    steps = finished_steps(checkpoints_dir)
    return steps[-1] if steps else None
