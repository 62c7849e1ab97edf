"""Attacks through a shared runs root (issue [3/7], "nothing under a runs root is trusted as a path").

The attacker can write into the runs root (a shared cluster file system, docs/security.md#a-shared-runs-root):
plant directories and records, forge fields. Each test reproduces one finding of c388a5b through the
real CLI and asserts what must hold now: a run is a directory named like a run id whose record is its
own; every path mxc removes, reads checkpoints from or serves comes from the run's location and its
bundle's contract (mxc/runtime/runpaths.py), never from the record; another user's runs are read-only;
`mxc cancel` signals only a process it can prove is the run's; record fields reach the terminal with
their control characters made visible.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mxc.node import checkpoints
from mxc.runtime.processes.procfs import ProcessId
from tests.conftest import REPO, Mxc
from tests.slurm_cluster import SlurmCluster
from tests.test_attacks_processes import Bystander

TINY = str(REPO / "specs" / "tiny.yaml")
NODE = os.uname().nodename
NOBODY = 65534
OLD = "2020-01-01T00:00:00.000Z"


def build(mxc: Mxc, *sets: str) -> str:
    out = mxc("build", "-q", TINY, *(arg for setting in sets for arg in ("--set", setting)))
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def plant(home: Path, name: str, **fields: Any) -> Path:
    """A directory under the runs root with a record.json of the attacker's choosing."""
    run = home / "runs" / name
    run.mkdir(parents=True)
    record = {"format": "mxc-run/v2", "run_id": name, "spec_name": "tiny", "backend": "local", "status": "succeeded",
              "final": True, "started": OLD, "ended": OLD, **fields}
    (run / "record.json").write_text(json.dumps(record))
    return run


def victim(tmp_path: Path, name: str) -> Path:
    """A directory outside mxc's home with something worth keeping in it."""
    path = tmp_path / "elsewhere" / name
    path.mkdir(parents=True)
    (path / "thesis.tex").write_text("years of work\n")
    return path


def gc_json(mxc: Mxc, *args: str) -> dict[str, Any]:
    out = mxc("gc", *args, "--json")
    assert out.returncode == 0, out.stderr
    data: dict[str, Any] = json.loads(out.stdout)
    return data


# ---- a run is a directory named like a run id, with its own record


def test_a_planted_directory_is_not_a_run_and_gc_removes_nothing_elsewhere(mxc: Mxc, mxc_home: Path,
                                                                          tmp_path: Path) -> None:
    """c388a5b: `runs/projects/record.json` naming `<elsewhere>/projects/tensorboard/projects` made gc
    remove <elsewhere>/projects, and its dry run showed only "run projects 7.5 KiB"."""
    digest = build(mxc)
    target = victim(tmp_path, "projects")
    plant(mxc_home, "projects", bundle=digest, tensorboard=str(target / "tensorboard" / "projects"))
    assert gc_json(mxc, "--older-than", "1d")["items"] == []
    done = mxc("gc", "--older-than", "1d", "--yes")
    assert done.returncode == 0, done.stderr
    assert (target / "thesis.tex").read_text() == "years of work\n" and (mxc_home / "runs" / "projects").is_dir()
    removed = mxc("rm", "projects")
    assert removed.returncode == 2 and "no run or bundle matches 'projects'" in removed.stderr
    assert (target / "thesis.tex").exists()
    listed = json.loads(mxc("runs", "--json").stdout)
    assert listed == []  # not a run: not listed either


def test_a_run_shaped_record_cannot_point_gc_or_rm_outside(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    """A real-looking run whose record names a TensorBoard directory elsewhere, under a directory
    named like the run: only the run directory goes; the record's path is never followed."""
    digest = build(mxc)
    run_id = f"20200101-000000-aaaa-{digest[:8]}"
    target = victim(tmp_path, run_id)
    run = plant(mxc_home, run_id, bundle=digest, tensorboard=str(target / "tensorboard" / run_id))
    (item,) = gc_json(mxc, "--older-than", "1d")["items"]
    assert item["paths"] == [str(run)]
    table = mxc("gc", "--older-than", "1d")
    assert f"{run_id}" in table.stdout and str(run) in table.stdout and str(target) not in table.stdout
    out = mxc("rm", run_id)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"removed run {run_id} (") and out.stdout.endswith(f"): {run}\n"), out.stdout
    assert not run.exists() and (target / "thesis.tex").exists()


def test_a_record_of_another_run_is_not_this_runs(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    """A record copied from another run is unreadable; one naming a bundle its id does not gets that
    bundle's files nowhere (no contract, so no tree under its checkpoint.dir; no rerun of it)."""
    digest = build(mxc)
    copied = plant(mxc_home, f"20200101-000000-aaaa-{digest[:8]}", run_id=f"20200101-000000-bbbb-{digest[:8]}",
                   bundle=digest)
    elsewhere = tmp_path / "shared"
    other = build(mxc, f"checkpoint.dir={elsewhere}")
    misnamed = plant(mxc_home, f"20200101-000000-cccc-{digest[:8]}", bundle=other)
    target = elsewhere / misnamed.name  # what a run of `other` would own there
    target.mkdir(parents=True)
    (target / "thesis.tex").write_text("years of work\n")
    rows = json.loads(mxc("runs", "--json").stdout)
    assert [(r["run_id"], r["status"]) for r in rows] == [(copied.name, "unreadable"), (misnamed.name, "succeeded")]
    assert "record.json is unreadable (run_id: " in rows[0]["error"] and "is not this run's" in rows[0]["error"]
    paths = [i["paths"] for i in gc_json(mxc, "--older-than", "1d")["items"] if i["kind"] == "run"]
    assert paths == [[str(misnamed)]]  # the copied record's run is unreadable: kept unless asked
    out = mxc("rerun", misnamed.name, "--dry-run")
    assert out.returncode == 2 and f"not the one run {misnamed.name} ran" in out.stderr, out.stderr
    assert (target / "thesis.tex").exists()


def test_a_link_planted_as_a_run_is_not_followed(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    digest = build(mxc)
    target = victim(tmp_path, "target")
    run_id = f"20200101-000000-aaaa-{digest[:8]}"
    (target / "record.json").write_text(json.dumps({"format": "mxc-run/v2", "run_id": run_id, "bundle": digest,
                                                    "spec_name": "x", "backend": "local", "status": "failed",
                                                    "final": True, "started": OLD}))
    (mxc_home / "runs").mkdir(parents=True)
    (mxc_home / "runs" / run_id).symlink_to(target)
    assert gc_json(mxc, "--older-than", "1d")["items"] == []
    assert mxc("gc", "--older-than", "1d", "--yes").returncode == 0
    assert mxc("rm", run_id).returncode == 2
    assert (target / "thesis.tex").exists()


# ---- checkpoints: from the run's trees, not from its record


def finished_checkpoint(directory: Path, step: int) -> Path:
    path = directory / str(step)
    path.mkdir(parents=True)
    (path / checkpoints.COMMIT_MARKER).write_text("")
    (path / "secret.key").write_text("not for the new run\n")
    return path


def test_resume_from_reads_checkpoints_only_from_the_runs_own_trees(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    """c388a5b: a record's `tensorboard` field named where --resume-from looked for checkpoints, so a
    planted record made a new run seed (copy) files from anywhere into its own directory."""
    digest = build(mxc)
    run_id = f"20200101-000000-aaaa-{digest[:8]}"
    elsewhere = tmp_path / "elsewhere" / run_id
    finished_checkpoint(elsewhere / "checkpoints", 10)
    plant(mxc_home, run_id, bundle=digest, tensorboard=str(elsewhere / "tensorboard" / run_id))
    out = mxc("run", digest, "--resume-from", run_id, "--dry-run")
    assert out.returncode == 2 and "has no finished checkpoint to resume from" in out.stderr, out.stderr
    assert str(mxc_home / "runs" / run_id / "output" / run_id / "checkpoints") in out.stderr
    assert str(elsewhere) not in out.stdout + out.stderr


def test_rerun_of_a_resumed_run_does_not_follow_its_recorded_path(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    """`resumed_from.path` names a checkpoint elsewhere: the rerun looks where the source run's own
    checkpoint is, finds none, and refuses (c388a5b seeded from the recorded path)."""
    digest = build(mxc)
    source = f"20200101-000000-aaaa-{digest[:8]}"
    plant(mxc_home, source, bundle=digest)
    elsewhere = finished_checkpoint(tmp_path / "elsewhere", 10)
    resumed = f"20200101-000001-bbbb-{digest[:8]}"
    plant(mxc_home, resumed, bundle=digest, resumed_from={"run": source, "step": 10, "path": str(elsewhere)})
    out = mxc("rerun", resumed, "--dry-run")
    assert out.returncode == 2 and f"started from run {source}'s checkpoint at step 10, which is gone" in out.stderr


# ---- runs of another user are read-only


@pytest.fixture
def others_run(mxc: Mxc, mxc_home: Path) -> Iterator[Path]:
    """A finished run whose directory and record belong to another user (nobody), as in a runs root
    several users write."""
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root (the test suite runs as root)")
    digest = build(mxc)
    run = plant(mxc_home, f"20200101-000000-aaaa-{digest[:8]}", bundle=digest)
    for path in (run, run / "record.json"):
        os.chown(path, NOBODY, NOBODY)
    yield run
    if run.exists():
        shutil.rmtree(run)


def test_another_users_run_is_never_removed(mxc: Mxc, others_run: Path) -> None:
    out = mxc("rm", others_run.name)
    assert out.returncode == 2 and out.stderr == (
        f"mxc: error: run {others_run.name} belongs to user nobody (uid {NOBODY}): mxc does not remove another "
        "user's run (its owner can; reads (mxc runs, show, logs) still work)\n")
    data = gc_json(mxc, "--older-than", "1d")
    assert data["items"] == [] and data["other_users_runs"] == [others_run.name]
    swept = mxc("gc", "--older-than", "1d", "--yes")
    assert swept.returncode == 0 and "1 run(s) of other users left alone" in swept.stderr
    assert (others_run / "record.json").is_file()
    assert [r["run_id"] for r in json.loads(mxc("runs", "--json").stdout)] == [others_run.name]  # reads still see it


def test_another_users_live_run_is_neither_cancelled_nor_watched(mxc: Mxc, others_run: Path) -> None:
    record = json.loads((others_run / "record.json").read_text())
    record.update(backend="slurm", status="running", final=False, ended=None, slurm={"job_id": "1"})
    (others_run / "record.json").write_text(json.dumps(record))
    before = (others_run / "record.json").read_bytes()
    for command in ("cancel", "watch"):
        out = mxc(command, others_run.name)
        assert out.returncode in (1, 2) and f"belongs to user nobody (uid {NOBODY})" in out.stderr, out.stderr
    assert (others_run / "record.json").read_bytes() == before
    assert not (others_run / "cancel.request").exists() and not (others_run / ".slurm.lock").exists()


# ---- cancel signals only what it can prove is the run's


def test_cancel_does_not_signal_the_process_a_forged_record_names(mxc: Mxc, mxc_home: Path) -> None:
    """c388a5b: a record forged with a live process's full identity (pid, start time, boot id) made
    `mxc cancel` SIGTERM it. The supervisor a record names is signalled only when it registered itself
    for that run where only this user writes (/tmp/mxc-<uid>)."""
    digest = build(mxc)
    bystander = Bystander()
    try:
        identity = ProcessId.capture(bystander.pid)
        assert identity is not None
        run_id = f"20990101-000000-aaaa-{digest[:8]}"
        run = plant(mxc_home, run_id, bundle=digest, status="running", final=False, ended=None,
                    supervisor={"host": NODE, **identity.as_record()})
        before = (run / "record.json").read_bytes()
        out = mxc("cancel", run_id)
        assert out.returncode == 2, out.stderr
        assert f"process {bystander.pid}, which its record names, is not registered as its supervisor" in out.stderr
        assert bystander.pending() == "none" and (run / "record.json").read_bytes() == before
    finally:
        bystander.close()


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_env")
def test_cancel_scancels_only_a_job_that_runs_in_the_run_directory(mxc: Mxc, mxc_home: Path, tmp_path: Path,
                                                                   slurm_cluster: SlurmCluster) -> None:
    """A Slurm record forged to name someone else's job: c388a5b scancelled it. mxc submits every job
    with `--chdir` its run directory, and cancels a job only when Slurm says it runs there."""
    digest = build(mxc, "runtime.backend=slurm")
    theirs = slurm_cluster.run("sbatch", "--parsable", "--hold", f"--partition={slurm_cluster.partition}",
                               f"--chdir={tmp_path}", "--wrap", "true").stdout.strip()
    try:
        run_id = f"20990101-000000-aaaa-{digest[:8]}"
        run = plant(mxc_home, run_id, bundle=digest, backend="slurm", status="queued", final=False, ended=None,
                    slurm={"job_id": theirs, "jobs": [{"job_id": theirs, "submitted": OLD}]})
        out = mxc("cancel", run_id)
        assert out.returncode == 2, out.stderr
        assert f"Slurm job {theirs}, which its record names, runs in {tmp_path}: not cancelling it" in out.stderr
        assert slurm_cluster.job(theirs)["JobState"] == "PENDING" and not (run / "cancel.request").exists()
    finally:
        slurm_cluster.run("scancel", theirs, check=False)


# ---- what a record says reaches the terminal visibly


def test_runs_shows_control_characters_of_a_record_visibly(mxc: Mxc, mxc_home: Path) -> None:
    """c388a5b printed spec_name and labels raw: a forged record could retitle the terminal, clear it
    or hide a line (OSC, CSI, a carriage return)."""
    digest = build(mxc)
    run_id = f"20200101-000000-aaaa-{digest[:8]}"
    plant(mxc_home, run_id, bundle=digest, status="failed", spec_name="tiny\x1b]0;owned\x07",
          labels=["a\x1b[2Jb", "c\rd", "e\u202ef"], message="over\x9b31m")
    for args in (("runs",), ("wait", run_id)):
        out = mxc(*args)
        shown = out.stdout + out.stderr
        assert not any(c in shown for c in "\x1b\x07\r\u202e\x9b"), shown
        assert args == ("runs",) or "over\\x9b31m" in shown
    listed = mxc("runs").stdout
    assert "tiny\\x1b]0;owned\\x07" in listed and "a\\x1b[2Jb,c\\rd,e\\u202ef" in listed
    assert json.loads(mxc("runs", "--json").stdout)[0]["spec"] == "tiny\x1b]0;owned\x07"  # JSON keeps the data


# ---- what is served: TensorBoard's events from where the contract puts them


def test_tensorboard_is_read_and_served_from_the_contracts_place_not_the_records(mxc: Mxc, mxc_home: Path,
                                                                                 tmp_path: Path) -> None:
    """c388a5b: the exporter's TensorBoard plugin read event files from the record's `tensorboard`
    path, and `mxc dashboard` served that directory."""
    from mxc.plugins import tensorboard
    from mxc.plugins.api import PluginContext
    from mxc.runtime import runs
    from tests.test_observe_parsers import write_events

    shared = tmp_path / "checkpoints"
    digest = build(mxc, f"checkpoint.dir={shared}")
    run_id = f"20200101-000000-aaaa-{digest[:8]}"
    elsewhere = tmp_path / "elsewhere" / "events"
    write_events(elsewhere, range(4))
    run = plant(mxc_home, run_id, bundle=digest, tensorboard=str(elsewhere))
    plugin = tensorboard.create(PluginContext(run_dir=run))
    assert plugin.tensorboard_dir != elsewhere and list(plugin.collect()) and plugin.source == "none"
    from mxc.cli.observe import _tensorboard_dir  # what `mxc dashboard` serves

    found = runs.find_run(mxc_home, run_id)
    assert _tensorboard_dir(found, runs.load(found)) == shared / run_id / "tensorboard" / run_id
