"""mxc/node/checkpoints.py: the one checkpoint scan, on recorded MaxText checkpoints, on saves the
pinned orbax made and left unfinished, and on the odd things a shared file system holds."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mxc.node import checkpoints
from tests.conftest import REPO

FIXTURES = REPO / "tests" / "fixtures" / "checkpoints"

# Saves made by the installed orbax (the pinned 0.12.8): steps 1 and 2 finished, step 3 cut short
# before finalize() (what a crash or a kill mid-save leaves), in both atomicity modes; then what
# orbax itself lists, and the same after step 2 loses its commit_success.txt (a save by an orbax
# that did not write that file on rename).
ORBAX_SCRIPT = r'''
import json, os, sys
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint._src.path import atomicity

async def cut_short(self):
    return None

root, out = sys.argv[1], {}
for mode, cls in (("ATOMIC_RENAME", atomicity.AtomicRenameTemporaryPath),
                  ("COMMIT_FILE", atomicity.CommitFileTemporaryPath)):
    directory = os.path.join(root, mode)
    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=False,
        atomicity_options=ocp.options.AtomicityOptions(mode=getattr(ocp.options.AtomicityMode, mode)))
    manager = ocp.CheckpointManager(directory, options=options)
    for step in (1, 2):
        manager.save(step, args=ocp.args.StandardSave({"w": np.arange(4)}))
    finalize, cls.finalize = cls.finalize, cut_short
    manager.save(3, args=ocp.args.StandardSave({"w": np.arange(4)}), force=True)
    manager.wait_until_finished()
    cls.finalize = finalize
    manager.close()
    listed = ocp.CheckpointManager(directory, options=options)
    out[mode] = {"dir": directory, "entries": sorted(os.listdir(directory)), "orbax": listed.all_steps()}
    listed.close()
os.remove(os.path.join(root, "ATOMIC_RENAME", "2", "commit_success.txt"))
legacy = ocp.CheckpointManager(os.path.join(root, "ATOMIC_RENAME"), options=ocp.CheckpointManagerOptions(
    atomicity_options=ocp.options.AtomicityOptions(allow_legacy_atomic_rename=True)))
out["legacy"] = {"dir": os.path.join(root, "ATOMIC_RENAME"), "orbax": legacy.all_steps()}
print(json.dumps(out))
'''


def test_checkpoints_dir_is_maxtexts_layout() -> None:
    assert checkpoints.checkpoints_dir(Path("/ckpt"), "run-1") == Path("/ckpt/run-1/checkpoints")


def test_recorded_maxtext_checkpoints() -> None:
    root = FIXTURES / "maxtext-tiny"
    assert checkpoints.finished_steps(root) == [0, 5, 10]
    assert checkpoints.latest_checkpoint(root) == 10


def test_unfinished_saves_never_count(tmp_path: Path) -> None:
    root = shutil.copytree(FIXTURES / "maxtext-tiny", tmp_path / "checkpoints")
    unfinished = FIXTURES / "orbax-0.12.8-unfinished"
    shutil.copytree(unfinished / "atomic-rename" / "3.orbax-checkpoint-tmp", root / "15.orbax-checkpoint-tmp")
    shutil.copytree(unfinished / "commit-file" / "3", root / "20")  # COMMIT_FILE: final name, no marker yet
    (root / "25.orbax-checkpoint-tmp-1712345678").mkdir()  # older orbax: timestamped temporary name
    assert checkpoints.latest_checkpoint(root) == 10
    assert not checkpoints.is_finished(root / "20") and not checkpoints.is_finished(root / "15.orbax-checkpoint-tmp")
    # the commit marker finishes it, as orbax's finalize() does
    (root / "20" / checkpoints.COMMIT_MARKER).write_text("Checkpoint commit was successful")
    assert checkpoints.latest_checkpoint(root) == 20


def write_metadata(step_dir: Path, content: bytes) -> Path:
    step_dir.mkdir(parents=True)
    (step_dir / checkpoints.STEP_METADATA).write_bytes(content)
    return step_dir


def test_a_commit_timestamp_marks_a_save_of_an_older_orbax(tmp_path: Path) -> None:
    recorded = (FIXTURES / "maxtext-tiny" / "5" / checkpoints.STEP_METADATA).read_bytes()
    assert checkpoints.is_finished(write_metadata(tmp_path / "5", recorded))
    null = json.loads(recorded)
    null["commit_timestamp_nsecs"] = None
    assert not checkpoints.is_finished(write_metadata(tmp_path / "6", json.dumps(null).encode()))
    null["commit_timestamp_nsecs"] = True
    assert not checkpoints.is_finished(write_metadata(tmp_path / "7", json.dumps(null).encode()))


@pytest.mark.parametrize("content", [b"", b"\x00\xff\xfe binary", b"[" * 100000, b"{" + b" " * (2 << 20) + b"}",
                                     b'{"commit_timestamp_nsecs": 1' + b"0" * 5000 + b"}", b'"a string"'],
                         ids=["empty", "binary", "deep", "huge", "long-int", "not-a-dict"])
def test_broken_metadata_is_not_a_finished_save(tmp_path: Path, content: bytes) -> None:
    assert not checkpoints.is_finished(write_metadata(tmp_path / "8", content))


def test_odd_entries(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    assert checkpoints.latest_checkpoint(root) is None  # no directory yet
    root.write_text("a file where the directory should be")
    assert checkpoints.latest_checkpoint(root) is None
    root.unlink()
    for name in ("3", "٤٥"):  # a finished save, and a name of non-ASCII digits (int() would take it)
        (root / name).mkdir(parents=True)
        (root / name / checkpoints.COMMIT_MARKER).write_text("done")
    (root / "50").write_text("a file named like a step")
    (root / "60").symlink_to(root / "60")  # a symlink loop
    (root / "70").symlink_to(tmp_path / "gone")  # dangling
    (root / "80").symlink_to(root / "3")  # a link to a finished save counts, as orbax's is_dir follows it
    assert checkpoints.finished_steps(root) == [3, 80]
    (root / "lost+found").mkdir()
    assert checkpoints.latest_checkpoint(root) == 80


def test_permission_errors_are_tolerated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Root reads everything, so the refusals of a shared file system are injected."""
    root = shutil.copytree(FIXTURES / "maxtext-tiny", tmp_path / "checkpoints")
    real_stat, real_open = os.stat, open

    def stat(path: object, *args: object, **kwargs: object) -> os.stat_result:
        if "10" in Path(str(path)).parts:
            raise PermissionError(13, "Permission denied", str(path))
        return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

    def refuse_open(path: object, *args: object, **kwargs: object) -> object:
        if "10" in Path(str(path)).parts:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(os, "stat", stat)
    monkeypatch.setattr("builtins.open", refuse_open)
    assert checkpoints.latest_checkpoint(root) == 5
    monkeypatch.setattr(os, "listdir", lambda path: (_ for _ in ()).throw(PermissionError(13, "denied")))
    assert checkpoints.latest_checkpoint(root) is None


def test_agrees_with_orbax_on_saves_it_made_and_left_unfinished(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", ORBAX_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0, done.stderr[-3000:]
    made = json.loads(done.stdout.strip().splitlines()[-1])
    assert made["ATOMIC_RENAME"]["entries"] == ["1", "2", "3.orbax-checkpoint-tmp"]
    assert made["COMMIT_FILE"]["entries"] == ["1", "2", "3"]
    for mode in ("ATOMIC_RENAME", "COMMIT_FILE", "legacy"):
        assert made[mode]["orbax"] == [1, 2], mode
        assert checkpoints.finished_steps(Path(made[mode]["dir"])) == [1, 2], mode
    assert not (Path(made["legacy"]["dir"]) / "2" / checkpoints.COMMIT_MARKER).exists()
