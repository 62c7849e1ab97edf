"""`mxc gc` and `mxc rm` through the real CLI: what goes, what never goes, and removal of read-only trees.

Runs here are record-only run directories (no training): what gc judges is the record, the run
directory's name and the liveness of the supervisor it names, which these tests control with real
processes (a live `sleep`, one that has exited, one carrying the run's MXC_RUN_DIR).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mxc.runtime.processes.procfs import ProcessId
from mxc.runtime.record import RunRecord
from tests.conftest import REPO, Mxc, store_snapshot
from tests.processes import dead_identity

TINY = str(REPO / "specs/tiny.yaml")
OLD = "2020-01-01T00:00:00.000Z"
NODE = os.uname().nodename


def one_line_error(out: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("mxc: error: ") and out.stderr.count("\n") == 1, out.stderr
    for fragment in fragments:
        assert fragment in out.stderr, out.stderr


def build(mxc: Mxc, *sets: str) -> str:
    args = [arg for setting in sets for arg in ("--set", setting)]
    out = mxc("build", "-q", TINY, *args)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def make_run(home: Path, tag: str, digest: str, status: str = "succeeded", started: str = OLD,
             final: bool = True, size: int = 1000, **fields: Any) -> Path:
    run_id = f"{started[:4]}0101-000000-{tag}-{digest[:8]}"
    run = home / "runs" / run_id
    (run / "output" / run_id / "checkpoints" / "10").mkdir(parents=True)
    (run / "output" / run_id / "checkpoints" / "10" / "state").write_bytes(b"x" * size)
    record = RunRecord(run_id=run_id, bundle=digest, spec_name="tiny", status=status, final=final, started=started,
                       ended=started if final else None, **{"backend": "local", **fields})
    record.save(run / "record.json")
    return run


def age_bundle(home: Path, digest: str) -> None:
    """As if the bundle had been built long ago (gc judges a bundle by its build and last use)."""
    os.utime(home / "bundles" / digest, (1577836800, 1577836800))


@pytest.fixture
def sleeper() -> Iterator[ProcessId]:
    proc = subprocess.Popen(["sleep", "600"])
    identity = ProcessId.capture(proc.pid)
    assert identity is not None
    yield identity
    proc.kill()
    proc.wait()




def gc_json(mxc: Mxc, *args: str) -> dict[str, Any]:
    out = mxc("gc", *args, "--json")
    assert out.returncode == 0, out.stderr
    data: dict[str, Any] = json.loads(out.stdout)
    return data


def names(data: dict[str, Any], kind: str) -> set[str]:
    return {i["name"] for i in data["items"] if i["kind"] == kind}


# ---- bad input


def test_gc_refuses_without_a_filter_and_on_bad_values(mxc: Mxc, mxc_home: Path) -> None:
    one_line_error(mxc("gc"), "say what to remove", "--older-than")
    one_line_error(mxc("gc", "--older-than", "30 days"), "not an age", "30d")
    one_line_error(mxc("gc", "--status", "failed,exploded"), "unknown status 'exploded'", "cancelled")
    one_line_error(mxc("gc", "--keep-last", "-1"), "negative")
    one_line_error(mxc("rm", "nosuchrun"), "no run or bundle matches 'nosuchrun'")
    assert store_snapshot(mxc_home) == []


# ---- what goes


def test_gc_lists_by_default_and_removes_only_with_yes(mxc: Mxc, mxc_home: Path) -> None:
    a = build(mxc)
    b = build(mxc, "model.overrides.steps=5")
    old_failed = make_run(mxc_home, "aaaa", a, "failed")
    recent = make_run(mxc_home, "bbbb", a, started="2099-01-01T00:00:00.000Z")
    old_b = make_run(mxc_home, "cccc", b, "cancelled", size=5000)
    age_bundle(mxc_home, a)
    age_bundle(mxc_home, b)
    before = store_snapshot(mxc_home)

    data = gc_json(mxc, "--older-than", "30d")
    assert data["removed"] is False
    assert names(data, "run") == {old_failed.name, old_b.name}
    assert names(data, "bundle") == {b}  # a: a kept run (the recent one) used it
    assert data["bytes"] == sum(i["bytes"] for i in data["items"]) and data["bytes"] >= 6000
    text = mxc("gc", "--older-than", "30d")
    assert text.returncode == 0 and "would free" in text.stderr and "--yes" in text.stderr
    assert old_failed.name in text.stdout and b[:12] in text.stdout and recent.name not in text.stdout
    assert store_snapshot(mxc_home) == before  # a dry run removes nothing

    done = mxc("gc", "--older-than", "30d", "--yes")
    assert done.returncode == 0, done.stderr
    assert "removed 3 of 3" in done.stderr
    assert not old_failed.exists() and not old_b.exists() and not (mxc_home / "bundles" / b).exists()
    assert recent.exists() and (mxc_home / "bundles" / a).exists()
    assert not [p for p in (mxc_home / "runs").iterdir() if p.name.startswith(".")]  # nothing left aside
    assert not [p for p in (mxc_home / "bundles").iterdir() if p.name.startswith(".")]
    assert [r["run_id"] for r in json.loads(mxc("runs", "--json").stdout)] == [recent.name]
    assert mxc("verify", a).returncode == 0
    # b was the last built; it is gone, so @ (what `mxc run` runs) is a, the last built of those left.
    assert json.loads(mxc("show", "@", "--json").stdout)["hash"] == a
    assert a in mxc("run", "--dry-run").stdout


def test_gc_by_status_and_keep_last(mxc: Mxc, mxc_home: Path) -> None:
    a = build(mxc)
    failed = [make_run(mxc_home, tag, a, "failed") for tag in ("aaa1", "aaa2", "aaa3")]
    ok = make_run(mxc_home, "bbb1", a)
    data = gc_json(mxc, "--status", "failed", "--keep-last", "1")
    assert names(data, "run") == {failed[0].name, failed[1].name}  # the newest failed run stays, and ok
    assert names(data, "bundle") == set()  # the kept runs use it
    data = gc_json(mxc, "--status", "failed,succeeded")
    assert names(data, "run") == {*(f.name for f in failed), ok.name}
    assert names(data, "bundle") == set()  # without an age or --keep-last, gc judges runs only
    data = gc_json(mxc, "--status", "failed,succeeded", "--keep-last", "0")
    assert names(data, "bundle") == {a}  # nothing keeps it any more


def test_gc_removes_code_exports_and_images_nothing_uses(mxc: Mxc, mxc_home: Path) -> None:
    build(mxc)
    commit = "c0de" * 10
    export = mxc_home / "code" / commit
    (export / "src").mkdir(parents=True)
    (export / "src" / "x.py").write_text("print(1)\n")
    for path in (export / "src" / "x.py", export / "src", export):
        path.chmod(0o555 if path.is_dir() else 0o444)
    images = mxc_home / "images"
    images.mkdir()
    (images / ("ab" * 32 + ".sif")).write_bytes(b"i" * 300)
    (images / "maxtext-cpu.json").write_text("{}")  # what `mxc image build` wrote: not an image
    for path in (export, images / ("ab" * 32 + ".sif")):
        os.utime(path, (1577836800, 1577836800))
    data = gc_json(mxc, "--older-than", "30d")
    assert names(data, "code") == {commit} and names(data, "image") == {"ab" * 32 + ".sif"}
    assert mxc("gc", "--older-than", "30d", "--yes").returncode == 0
    assert not export.exists() and not (images / ("ab" * 32 + ".sif")).exists()
    assert (images / "maxtext-cpu.json").exists()


# ---- what never goes


def test_gc_never_removes_a_live_run_nor_the_bundle_it_uses(mxc: Mxc, mxc_home: Path, sleeper: ProcessId) -> None:
    live_bundle = build(mxc)
    lost_bundle = build(mxc, "model.overrides.steps=5")
    hidden_bundle = build(mxc, "model.overrides.steps=6")
    for digest in (live_bundle, lost_bundle, hidden_bundle):
        age_bundle(mxc_home, digest)
    live = make_run(mxc_home, "aaaa", live_bundle, "running", final=False,
                    supervisor={"host": NODE, **sleeper.as_record()})
    lost = make_run(mxc_home, "bbbb", lost_bundle, "running", final=False,
                    supervisor={"host": NODE, **dead_identity().as_record()})
    # A lost run with a process still running (the death watch has not ended it yet): still live.
    leftover_run = make_run(mxc_home, "cccc", lost_bundle, "running", final=False,
                            supervisor={"host": NODE, **dead_identity().as_record()})
    leftover = subprocess.Popen(["sleep", "600"], env={**os.environ, "MXC_RUN_DIR": str(leftover_run)})
    # A Slurm run whose record is not final: its job may still be queued or running.
    slurm = make_run(mxc_home, "eeee", lost_bundle, "queued", final=False, backend="slurm")
    # A run whose record cannot be read (torn, or being written): its bundle is protected by its name.
    unreadable = mxc_home / "runs" / f"20200101-000000-dddd-{hidden_bundle[:8]}"
    unreadable.mkdir()
    (unreadable / "record.json").write_text("{torn")
    os.utime(unreadable, (1577836800, 1577836800))  # its age is its directory's: old, whatever the machine's speed
    try:
        data = gc_json(mxc, "--older-than", "30d", "--include-used-bundles")
        assert names(data, "run") == {lost.name}
        assert names(data, "bundle") == set()  # live_bundle: a live run; lost_bundle: the leftover; hidden: by name
        out = mxc("gc", "--older-than", "30d", "--include-used-bundles", "--yes")
        assert out.returncode == 0, out.stderr
        assert live.exists() and leftover_run.exists() and unreadable.exists() and slurm.exists()
        assert not lost.exists()
        for digest in (live_bundle, lost_bundle, hidden_bundle):
            assert (mxc_home / "bundles" / digest).exists()
        # Asked for by status, the unreadable run can go; its bundle then follows.
        data = gc_json(mxc, "--status", "unreadable", "--older-than", "30d")
        assert names(data, "run") == {unreadable.name} and names(data, "bundle") == {hidden_bundle}

        one_line_error(mxc("rm", live.name), f"run {live.name} is live (running): cancel it first",
                       f"mxc cancel {live.name}")
        one_line_error(mxc("rm", live_bundle[:10]), f"bundle {live_bundle[:12]} is used by live run {live.name}")
        one_line_error(mxc("rm", leftover_run.name[:24]), "cancel it first")
    finally:
        leftover.kill()
        leftover.wait()
    assert live.exists() and (mxc_home / "bundles" / live_bundle).exists()


def test_rm_checks_every_name_before_removing_any(mxc: Mxc, mxc_home: Path) -> None:
    a = build(mxc)
    b = build(mxc, "model.overrides.steps=5")
    run = make_run(mxc_home, "aaaa", a, "failed")
    before = store_snapshot(mxc_home)
    one_line_error(mxc("rm", run.name, b[:8], "nosuch"), "no run or bundle matches 'nosuch'")
    assert store_snapshot(mxc_home) == before
    out = mxc("rm", run.name[:22], b[:8], "--json")
    assert out.returncode == 0, out.stderr
    removed = json.loads(out.stdout)["removed"]
    assert {(r["kind"], r["name"]) for r in removed} == {("run", run.name), ("bundle", b)}
    assert not run.exists() and not (mxc_home / "bundles" / b).exists() and (mxc_home / "bundles" / a).exists()
    dry = mxc("run", "--dry-run")  # b, the last built, is gone: @ is a now
    assert dry.returncode == 0 and a in dry.stdout and b not in dry.stdout, dry.stderr


def test_a_runs_checkpoints_outside_its_directory_go_with_it(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    """With `checkpoint.dir`, a run's output is <dir>/<run-id>: removing the run removes that too,
    and nothing else in <dir>. Where it is comes from the bundle's contract, not from the record."""
    shared = tmp_path / "shared-checkpoints"
    digest = build(mxc, f"checkpoint.dir={shared}")
    run_id = f"20200101-000000-aaaa-{digest[:8]}"
    outside = shared / run_id
    (outside / "checkpoints" / "10").mkdir(parents=True)
    (outside / "checkpoints" / "10" / "state").write_bytes(b"c" * 4000)
    neighbour = shared / f"20200101-000000-bbbb-{digest[:8]}"
    neighbour.mkdir()
    run = make_run(mxc_home, "aaaa", digest)
    data = gc_json(mxc, "--status", "succeeded")
    assert [i["paths"] for i in data["items"]] == [[str(run), str(outside)]] and data["bytes"] >= 5000
    out = mxc("rm", run.name)
    assert out.returncode == 0, out.stderr
    assert not run.exists() and not outside.exists() and neighbour.exists()


# ---- read-only trees


def test_read_only_bundle_defeats_rm_rf_but_not_mxc(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    """Bundles are stored read-only: their owner's `rm -rf` fails on them; mxc's removal restores
    write permission first. Both run as an unprivileged user (nobody, when the tests run as root)."""
    digest = build(mxc)
    stored = mxc_home / "bundles" / digest
    assert [d for d in [stored, *stored.rglob("*")] if d.is_dir() and os.stat(d).st_mode & 0o222]  == []
    # As root, somewhere nobody can reach (/tmp itself, not a private temporary directory).
    place = (Path("/tmp") if os.geteuid() == 0 else tmp_path) / f"mxc-gc-test-{os.getpid()}"
    place.mkdir(mode=0o755)
    try:
        copies = [place / "plain", place / "mxc"]
        for copy in copies:
            shutil.copytree(stored, copy)  # modes kept: read-only directories
        # The module under test, where that user can read it (the checkout may be in root's home).
        lib = place / "lib"
        lib.mkdir()
        shutil.copy(REPO / "mxc" / "tempdirs.py", lib / "tempdirs.py")
        as_user: list[str] = []
        if os.geteuid() == 0:
            setpriv = shutil.which("setpriv")
            assert setpriv, "util-linux's setpriv runs the removal as nobody"
            for path in [place, *place.rglob("*")]:
                os.chown(path, 65534, 65534, follow_symlinks=False)
            as_user = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
        plain = subprocess.run([*as_user, "rm", "-rf", str(copies[0])], capture_output=True, text=True)
        assert plain.returncode != 0 and "Permission denied" in plain.stderr
        assert (copies[0] / "manifest.json").exists() or any(copies[0].iterdir())
        # The removal mxc gc/rm use, in the system interpreter (the module is stdlib only) as that user.
        code = f"import sys; sys.path.insert(0, {str(lib)!r}); from pathlib import Path; " \
               f"import tempdirs; tempdirs.discard(Path({str(copies[1])!r}))"
        python = "/usr/bin/python3" if os.geteuid() == 0 and os.path.exists("/usr/bin/python3") else sys.executable
        ours = subprocess.run([*as_user, python, "-c", code], capture_output=True, text=True)
        assert ours.returncode == 0, ours.stderr
        assert not copies[1].exists() and sorted(p.name for p in place.iterdir()) == ["lib", "plain"]
    finally:
        for dirpath, dirnames, _ in os.walk(place):
            for name in dirnames:
                os.chmod(os.path.join(dirpath, name), 0o700)
        shutil.rmtree(place)


@pytest.mark.parametrize("command", ["gc", "rm"])
def test_help_has_an_example(mxc: Mxc, command: str) -> None:
    out = mxc(command, "--help")
    assert out.returncode == 0 and "example:\n  mxc " in out.stdout
