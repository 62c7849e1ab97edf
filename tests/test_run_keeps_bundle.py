"""Runs keep what they ran (issue [1/7]): every run directory holds its bundle (``<run>/bundle``: hard
links into the store on one file system, a copy on another, verified against the bundle's hash), so
``mxc rerun``, ``compare`` and ``report`` work after ``mxc rm BUNDLE``. On c388a5b the run kept nothing:
rerun failed ("not in the store") and compare/report said "spec: not compared".
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from mxc.errors import UserError
from mxc.node import integrity
from mxc.runtime.rundir import RunDir
from mxc.store import Store
from tests.conftest import REPO, Mxc

TINY = str(REPO / "specs" / "tiny.yaml")


def build(mxc: Mxc, *sets: str) -> str:
    out = mxc("build", "-q", TINY, *(arg for setting in sets for arg in ("--set", setting)))
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.training
def test_rerun_compare_and_report_survive_rm_of_the_bundle(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    digest = build(mxc, "model.overrides.steps=5", "checkpoint.period=0", "runtime.preflight.stale_processes=false")
    stored = mxc_home / "bundles" / digest
    out = mxc("run", "-q", digest)
    assert out.returncode == 0, out.stderr
    first = out.stdout.strip()
    names = [integrity.MANIFEST, *integrity.read_manifest(stored, digest)]
    inodes = {name: os.stat(stored / name).st_ino for name in names}

    removed = mxc("rm", digest[:12])
    assert removed.returncode == 0, removed.stderr
    assert not stored.exists()

    again = mxc("rerun", first)
    assert again.returncode == 0, again.stderr
    assert f"mxc: bundle {digest[:12]} was not in the store: put back from run {first}'s copy" in again.stderr
    second = again.stdout.strip()
    assert mxc("verify", digest).returncode == 0
    assert json.loads((mxc_home / "runs" / second / "record.json").read_text())["rerun_of"] == first

    assert mxc("rm", digest[:12]).returncode == 0  # gone again: compare and report read the runs' copies
    compared = mxc("compare", first, second)
    assert compared.returncode == 0, compared.stderr
    assert "spec: identical" in compared.stdout and "not compared" not in compared.stdout, compared.stdout
    assert "losses: 5 common steps (0..4)\n  bit-identical at every common step" in compared.stdout
    reported = mxc("report", first, second, "--no-tsdb", "-o", str(tmp_path / "report.html"), "--json")
    assert reported.returncode == 0, reported.stderr
    (comparison,) = json.loads(reported.stdout)["comparisons"]
    assert comparison["spec_changes"] == [] and not [n for n in comparison["notes"] if "spec" in n], comparison

    kept = mxc_home / "runs" / first / "bundle"  # what the first run kept: hard links to the very files it ran
    assert integrity.check(kept, digest) == []
    assert {name: os.stat(kept / name).st_ino for name in names} == inodes


def test_a_run_on_another_file_system_keeps_a_verified_copy(tmp_path: Path) -> None:
    """No hard link across file systems (MXC_RUNS_DIR on scratch): a copy, checked against the hash;
    a store file changed meanwhile leaves no run directory copy behind and says so."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs a second file system (/dev/shm)")
    from mxc.compiler import compile_spec
    from mxc.runtime import kept_bundle

    bundle = compile_spec(TINY, lambda p: Path(p).read_bytes(), (), mxc_version="test")
    stored, _ = Store(tmp_path / "home").put(bundle.files, bundle.hash)
    run = RunDir(Path(f"/dev/shm/mxc-test-{os.getpid()}") / f"20260101-000000-aaaa-{bundle.hash[:8]}")
    run.path.mkdir(parents=True)
    try:
        assert kept_bundle.keep(stored, run) == "copied"
        assert integrity.check(run.bundle, bundle.hash) == []
        assert stat.S_IMODE(os.stat(run.bundle).st_mode) == 0o755  # removable by its owner (`rm -rf RUN`)
        assert all(not os.stat(run.bundle / name).st_mode & 0o222 for name in bundle.files)  # the files read-only

        second = RunDir(run.path.parent / f"20260101-000001-aaaa-{bundle.hash[:8]}")
        second.path.mkdir()
        env_sh = stored.path / "env.sh"
        os.chmod(stored.path, 0o755)
        env_sh.chmod(0o644)
        env_sh.write_text(env_sh.read_text() + "export SNEAKY=1\n")
        with pytest.raises(UserError, match="changed while it was copied into run"):
            kept_bundle.keep(stored, second)
        assert sorted(p.name for p in second.path.iterdir()) == []
    finally:
        import shutil

        shutil.rmtree(run.path.parent)
