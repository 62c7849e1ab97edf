"""`mxc stacks RUN`: every rank's stacks of a live local run, read by py-spy while the real tiny
MaxText trainer waits at a known step (tests/gates.py), so the frame it waits in is known; the
training then goes on and succeeds. Runs that are not live are refused with exit 2."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mxc.runtime.processes.procfs import boot_id
from tests.conftest import REPO, Home, Mxc
from tests.gates import PASS_SET, PauseGate
from tests.test_run_local import new_run, record_of

SETS = ("runtime.preflight.stale_processes=false", "checkpoint.period=0", PASS_SET)


@pytest.mark.training
def test_stacks_of_a_live_run_then_it_goes_on(tmp_path: Path) -> None:
    home = Home(tmp_path / "mxc")
    bundle = home.build(REPO / "specs/tiny.yaml", SETS)
    gate = PauseGate(tmp_path / "gate", {0: 2})
    gate.directory.mkdir()
    before = home.runs()
    proc = home.start("run", bundle, "-q", env=gate.env())
    try:
        run = new_run(home, before, proc)
        pid = gate.wait_paused(0, alive=lambda: proc.poll() is None)[0]

        out = home.cli("stacks", run.name)
        assert out.returncode == 0, out.stderr
        [dump] = [p for p in (run / "stacks").iterdir()]
        assert not dump.name.startswith(".")  # complete: the hidden directory was renamed
        index = json.loads((dump / "index.json").read_text())
        assert index["run_id"] == run.name and index["backend"] == "local" and index["time"] == dump.name
        trainer = next(e for e in index["dumps"] if e["pid"] == pid)  # the paused MaxText process itself
        assert trainer["rank"] == 0 and trainer["attempt"] == 0 and trainer["ok"] is True
        assert trainer["method"] in ("py-spy --native", "py-spy") and trainer["file"] == f"rank-0-pid{pid}.txt"
        text = (dump / trainer["file"]).read_text()
        assert "handle (sitecustomize.py" in text  # where the gate holds it: tests/faults/sitecustomize.py
        assert "MainThread" in text
        assert f"==> rank 0 on {index['dumps'][0]['node']}, pid {pid}, attempt 0 ({trainer['method']}) <==" in out.stdout
        assert "handle (sitecustomize.py" in out.stdout
        assert f"rank(s): {dump}" in out.stderr

        listed = json.loads(home.cli("stacks", run.name[:15], "--json").stdout)
        assert listed["run_id"] == run.name and Path(listed["index"]).parent == Path(listed["directory"])
        assert Path(listed["directory"]).parent == run / "stacks" and Path(listed["directory"]) != dump
        assert {d["pid"] for d in listed["dumps"]} >= {pid}
        assert all(Path(d["file"]).is_file() and d["method"].startswith("py-spy") for d in listed["dumps"])
        assert proc.poll() is None  # read, not disturbed
    finally:
        gate.release(0)
    _out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err
    assert record_of(run)["status"] == "succeeded" and record_of(run)["restarts"] == 0

    ended = home.cli("stacks", run.name)
    assert ended.returncode == 2 and ended.stdout == ""
    assert ended.stderr == (f"mxc: error: run {run.name} is not live (succeeded): there is no training to read "
                            "stacks from (stacks are read from a running training only)\n")


def _fake_run(home: Path, run_id: str, **record: object) -> Path:
    run = home / "runs" / run_id
    run.mkdir(parents=True)
    # the bundle its id names (a record naming another one is not this run's)
    data = {"run_id": run_id, "bundle": run_id[-8:] * 8, "spec_name": "tiny", "backend": "local", "status": "running",
            "started": "2026-01-01T00:00:00.000Z", **record}
    (run / "record.json").write_text(json.dumps(data))
    return run


def test_a_hung_run_points_at_its_saved_stacks(mxc: Mxc, mxc_home: Path) -> None:
    run = _fake_run(mxc_home, "20260101-000000-beef-abababab", status="hung", final=True)
    (run / "stacks").mkdir()
    (run / "stacks" / "hang.rank-0.attempt-1-pid4242.txt").write_text("# py-spy dump\n")
    out = mxc("stacks", "20260101")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == (f"mxc: error: run {run.name} is not live (hung): there is no training to read stacks from "
                          f"(stacks saved when it hung or crashed: {run / 'stacks'}/ (1 file(s), e.g. "
                          "hang.rank-0.attempt-1-pid4242.txt))\n")
    assert sorted(p.name for p in (run / "stacks").iterdir()) == ["hang.rank-0.attempt-1-pid4242.txt"]


def test_a_lost_run_and_no_runs(mxc: Mxc, mxc_home: Path) -> None:
    assert mxc("stacks").stderr == "mxc: error: no runs yet (mxc build specs/tiny.yaml && mxc run)\n"
    gone = {"host": os.uname().nodename, "pid": 2**22 + 1, "start_ticks": 1, "boot_id": boot_id()}
    run = _fake_run(mxc_home, "20260101-000000-beef-cdcdcdcd", supervisor=gone)
    out = mxc("stacks")
    assert out.returncode == 2
    assert out.stderr.startswith(f"mxc: error: run {run.name} is not live (lost: its supervisor is gone)")
    assert not (run / "stacks").exists()  # nothing written
    elsewhere = _fake_run(mxc_home, "20260101-000001-beef-efefefef",
                          supervisor={**gone, "host": "another-host"})
    out = mxc("stacks", elsewhere.name)
    assert out.returncode == 2 and "runs on another-host" in out.stderr and len(out.stderr.splitlines()) == 1


def test_help_has_an_example(mxc: Mxc) -> None:
    out = mxc("stacks", "--help")
    assert out.returncode == 0 and "example:\n  mxc stacks " in out.stdout and "--json" in out.stdout
    assert "mxc stacks [RUN-ID]" in mxc("--help").stdout


FAKE_SQUEUE = """#!/bin/bash
while [ $# -gt 0 ]; do [ "$1" = -j ] && job=$2; shift; done
echo "$job|RUNNING|None|node[1-2]|debug|0|0:0|2099-01-01T00:00:00|2099-01-01T01:00:00|node1|0:00|"
"""
# Only node1 answers: it runs the command it was given as that node; node2's task fails.
FAKE_SRUN = """#!/bin/bash
printf '%s\\n' "$@" > "${0%/*}/srun.argv"
while [ "${1#-}" != "$1" ]; do shift; done
SLURMD_NODENAME=node1 "$@" || exit 9
echo "srun: error: node2: task 1: Exited with exit code 1" >&2
exit 1
"""


def _slurm_run_with_stand_ins(mxc: Mxc, home: Path, tmp_path: Path, job_id: str, srun: str) -> tuple[Path, Path]:
    """A two-node Slurm run whose job ``job_id`` squeue says is running, and a bin dir with the
    stand-in squeue and ``srun`` to put first on PATH."""
    bundle = mxc("build", "-q", str(REPO / "specs/tiny.yaml"), "--set", "runtime.backend=slurm",
                 "--set", "resources.nodes=2").stdout.strip()
    run = _fake_run(home, f"20990101-000000-{job_id:0>4}-{bundle[:8]}", bundle=bundle, backend="slurm",
                    slurm={"job_id": job_id, "jobs": [{"job_id": job_id, "submitted": "2099-01-01T00:00:00.000Z"}]})
    fake = tmp_path / "bin"
    fake.mkdir()
    for name, text in (("squeue", FAKE_SQUEUE), ("srun", srun)):
        (fake / name).write_text(text)
        (fake / name).chmod(0o755)
    return run, fake


def test_slurm_nodes_that_do_not_answer_are_reported(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    """srun and squeue are stand-ins: the node program really runs (as node1) on a real stuck process."""
    import subprocess
    import sys

    from mxc.node import livestacks, stacks

    run, fake = _slurm_run_with_stand_ins(mxc, mxc_home, tmp_path, "303", FAKE_SRUN)
    child = subprocess.Popen([sys.executable, "-c", "import time\ndef waits_here():\n  time.sleep(3600)\nwaits_here()"],
                             env={**os.environ, "MXC_RUN_DIR": str(run), "MXC_RANK": "0", "MXC_ATTEMPT": "0"})
    try:
        livestacks.record_trainer(run, 0, "node1", 0, child.pid, [], stacks.find_py_spy())
        livestacks.record_trainer(run, 1, "node2", 0, child.pid, [], stacks.find_py_spy())
        path = f"{fake}{os.pathsep}{os.environ['PATH']}"
        out = mxc("stacks", run.name, "--json", env={"PATH": path, "MXC_NODE_PYTHON": sys.executable})
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()
    assert out.returncode == 1, out.stderr
    argv = (fake / "srun.argv").read_text().splitlines()
    bundle = json.loads((run / "record.json").read_text())["bundle"]
    assert argv[:6] == ["--jobid=303", "--overlap", "--ntasks-per-node=1", "--nodes=2", "--ntasks=2", "--export=ALL"]
    assert argv[6:] == [sys.executable, "-E", "-s", "-B", str(mxc_home / "bundles" / bundle / "mxc_node" / "__main__.py"),
                        "stacks", str(run), argv[-1]]
    shown = json.loads(out.stdout)
    [entry] = shown["dumps"]  # node1's rank only: rank 1 lives on node2, which did not answer
    assert entry["rank"] == 0 and entry["node"] == "node1" and entry["pid"] == child.pid and entry["ok"]
    assert "waits_here" in Path(entry["file"]).read_text()
    assert shown["problems"] == ["1 of 2 node(s) answered (srun: srun: error: node2: task 1: Exited with exit code 1)"]
    assert json.loads(Path(shown["index"]).read_text())["problems"] == shown["problems"]
    assert [p.name for p in (run / "stacks").iterdir()] == [Path(shown["directory"]).name]  # no temporary left


# node1 answers as itself; "node2" writes a list the node program never writes: a file name that
# climbs out of the dump directory and a rank that is not a number (a node file comes from another machine).
FORGED_SRUN = """#!/bin/bash
while [ "${1#-}" != "$1" ]; do shift; done
SLURMD_NODENAME=node1 "$@" || exit 9
out="${@: -1}"
printf '[{"rank": 1, "pid": 7, "file": "../../record.json", "ok": true}, {"rank": "x", "pid": 8, "file": "a.txt"}]' \\
  > "$out/node-node2.json"
"""


def test_forged_node_lists_are_skipped_and_said(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    from mxc.node import livestacks, stacks

    run, fake = _slurm_run_with_stand_ins(mxc, mxc_home, tmp_path, "304", FORGED_SRUN)
    child = subprocess.Popen([sys.executable, "-c", "import time\ndef waits_here():\n  time.sleep(3600)\nwaits_here()"],
                             env={**os.environ, "MXC_RUN_DIR": str(run), "MXC_RANK": "0", "MXC_ATTEMPT": "0"})
    try:
        livestacks.record_trainer(run, 0, "node1", 0, child.pid, [], stacks.find_py_spy())
        out = mxc("stacks", run.name, env={"PATH": f"{fake}{os.pathsep}{os.environ['PATH']}",
                                           "MXC_NODE_PYTHON": sys.executable})
    finally:
        child.kill()
        child.wait()
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert "==> rank 0 on node1" in out.stdout and "waits_here" in out.stdout
    assert '"run_id"' not in out.stdout  # record.json was not shown as a stack
    assert "mxc: warning: node-node2.json: 2 entr(ies) not of the node program's shape, skipped" in out.stderr
