"""One batched Slurm poll: `mxc runs` asks Slurm the same number of times for 1 live run as for
many (one squeue, at most one sacct), and still shows each run's own state.

Runs are synthesised (tests/slurm_poll.py): records of held jobs and of jobs that completed
while nobody looked, on the session's test cluster; calls are counted by wrappers on PATH.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.slurm_cluster import SlurmCluster
from tests.slurm_poll import calls, counting_path, make_run, submit


@pytest.fixture
def held(slurm_cluster: SlurmCluster) -> Iterator[list[str]]:
    """Held jobs, cancelled at the end (by id) so they never occupy the test cluster."""
    jobs: list[str] = []
    yield jobs
    if jobs:
        slurm_cluster.run("scancel", *jobs, check=False)


def _mxc_runs(home: Path, cluster: SlurmCluster, path: str) -> list[dict[str, object]]:
    env = cluster.environ({"MXC_HOME": str(home), "PATH": path})
    out = subprocess.run([sys.executable, "-m", "mxc", "runs", "--json"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "warning" not in out.stderr, out.stderr
    rows: list[dict[str, object]] = json.loads(out.stdout)
    return rows


def test_mxc_runs_asks_slurm_a_constant_number_of_times(tmp_path: Path, slurm_cluster: SlurmCluster,
                                                       held: list[str]) -> None:
    home, log = tmp_path / "home", tmp_path / "slurm-calls.log"
    path = counting_path(tmp_path / "bin", log)
    held.append(submit(slurm_cluster))
    make_run(home, 0, held[0])
    assert [r["status"] for r in _mxc_runs(home, slurm_cluster, path)] == ["queued"]
    one = calls(log)
    assert one == {"squeue": 1}  # a pending job: squeue alone answers, no history needed

    # Many more: held jobs, jobs that ended unseen (their history comes from sacct), and a job
    # Slurm no longer knows (sacct is asked about it, with the others, in the same one call).
    done = [submit(slurm_cluster, held=False) for _ in range(3)]
    for job in done:
        slurm_cluster.wait_state(job)
    held += [submit(slurm_cluster) for _ in range(8)]
    for i, job in enumerate([*held[1:], *done, "999999"], start=1):
        make_run(home, i, job)
    _mxc_runs(home, slurm_cluster, path)  # the first look learns which sacct answers on this cluster
    calls(log)
    rows = _mxc_runs(home, slurm_cluster, path)
    many = calls(log)
    assert many == {"squeue": 1, "sacct": 1}, many
    assert len(rows) == 13
    status = {str(r["run_id"]): r["status"] for r in rows}
    by_job = dict(zip([*held, *done, "999999"], sorted(status), strict=True))
    assert {status[by_job[j]] for j in held} == {"queued"}
    assert {status[by_job[j]] for j in done} == {"succeeded"}  # each run gets its own job's state
    assert status[by_job["999999"]] == "queued"  # unknown to Slurm just now: what the record said

    held += [submit(slurm_cluster) for _ in range(10)]
    for i, job in enumerate(held[-10:], start=13):
        make_run(home, i, job)
    _mxc_runs(home, slurm_cluster, path)
    assert calls(log) == many  # 23 live runs, the same calls as 13


def test_a_read_writes_no_record(tmp_path: Path, slurm_cluster: SlurmCluster, held: list[str]) -> None:
    """The batched view is a read: a completed job shows as succeeded, record.json keeps its bytes."""
    home = tmp_path / "home"
    job = submit(slurm_cluster, held=False)
    slurm_cluster.wait_state(job)
    record = make_run(home, 0, job) / "record.json"
    before = record.read_bytes()
    rows = _mxc_runs(home, slurm_cluster, counting_path(tmp_path / "bin", tmp_path / "calls.log"))
    assert rows[0]["status"] == "succeeded"
    assert record.read_bytes() == before


def test_the_log_cursor_lives_beside_the_record(tmp_path: Path, slurm_cluster: SlurmCluster, held: list[str]) -> None:
    """train.log's read cursor is the run directory's private state (.log-cursor.json), never a field
    of record.json: a read keeps it, and `mxc watch --once` saves a v2 record without it."""
    home = tmp_path / "home"
    held.append(submit(slurm_cluster))
    run = make_run(home, 0, held[0])
    log = b"[mxc batch 1] nodes node1 restart 0 of at most 1\ncompleted step: 3, seconds: 0.1\n"
    (run / "train.log").write_bytes(log)
    env = slurm_cluster.environ({"MXC_HOME": str(home)})
    before = (run / "record.json").read_bytes()
    rows = _mxc_runs(home, slurm_cluster, env["PATH"])
    assert rows[0]["status"] == "queued"
    assert (run / "record.json").read_bytes() == before
    cursor = json.loads((run / ".log-cursor.json").read_text())
    assert cursor["offset"] == len(log)
    assert (run / ".log-cursor.json").stat().st_mode & 0o077 == 0  # private
    out = subprocess.run([sys.executable, "-m", "mxc", "watch", "--once"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    saved = json.loads((run / "record.json").read_text())
    assert saved["format"] == "mxc-run/v2"
    assert saved["slurm"]["state"] == "PENDING" and "log" not in saved["slurm"]
