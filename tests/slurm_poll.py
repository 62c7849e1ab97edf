"""Live Slurm runs made cheaply, and Slurm calls counted: for tests/test_slurm_poll.py and
benchmarks/slurm_poll.py, which look at many live runs without training any model.

A synthesised run is a run directory whose record says "queued" for a real job of the test
cluster: a held job (``sbatch --hold``, pending until released or cancelled), or one that ran
``true`` and completed while nobody looked. Counting goes through wrapper scripts named
``squeue`` and ``sacct`` first on PATH: each appends its name and arguments to a file, then
runs the real command.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from mxc.runtime.record import RunRecord
from tests.slurm_cluster import SlurmCluster

BUNDLE = "ab" * 32  # no bundle is needed to read a run


def submit(cluster: SlurmCluster, held: bool = True) -> str:
    """A job of the test cluster: held (pending) or ``true`` (completes at once)."""
    argv = ["sbatch", "--parsable", "--output=/dev/null", "--wrap", "true"]
    if held:
        argv.insert(2, "--hold")
    return cluster.run(*argv).stdout.strip().split(";")[0]


def make_run(home: Path, index: int, job_id: str) -> Path:
    """A run directory of a live Slurm run whose current job is ``job_id`` (record only)."""
    run_id = f"20260101-{index // 10000:02d}{index % 10000:04d}-{index % 65536:04x}-{BUNDLE[:8]}"
    path = home / "runs" / run_id
    path.mkdir(parents=True)
    now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    record = RunRecord.model_validate({
        "run_id": run_id, "bundle": BUNDLE, "spec_name": "poll", "backend": "slurm", "status": "queued",
        "started": now, "slurm": {"job_id": job_id, "jobs": [{"job_id": job_id, "submitted": now, "resubmits": 0}]},
    })
    record.save(path / "record.json")
    return path


def counting_path(directory: Path, log: Path) -> str:
    """A PATH whose ``squeue`` and ``sacct`` log each call into ``log``, then run the real ones."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("squeue", "sacct"):
        real = shutil.which(name)
        assert real is not None, f"{name} is not installed"
        wrapper = directory / name
        wrapper.write_text(f'#!/bin/sh\necho "{name} $*" >> "{log}"\nexec "{real}" "$@"\n')
        wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return f"{directory}{os.pathsep}{os.environ.get('PATH', '')}"


def calls(log: Path) -> Counter[str]:
    """How many times each wrapped command ran (and the log emptied for the next count)."""
    lines = log.read_text().splitlines() if log.exists() else []
    log.write_text("")
    return Counter(line.split()[0] for line in lines if line.strip())
