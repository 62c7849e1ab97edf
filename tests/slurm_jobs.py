"""Helpers for the Slurm backend tests: build bundles that fit the test cluster, submit them
with the real CLI, and watch runs (records are viewed in-process through ``runs.load``, the same
call ``mxc runs`` makes: Slurm's state folded in, nothing written or submitted)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from mxc.runtime import runs
from mxc.runtime.record import RunRecord
from mxc.runtime.rundir import RunDir
from mxc.runtime.runpaths import RunPaths
from mxc.runtime.slurm.events import BATCH_ADAPTER, RANK_ADAPTER, read_events
from tests.conftest import REPO, Mxc
from tests.processes import run_processes
from tests.slurm_cluster import SlurmCluster

TINY = str(REPO / "specs" / "tiny.yaml")


# What the stand-in trainer reads from the environment `mxc run` is given.
STANDIN_PASS = "[MXCTEST_TRAINER, MXCTEST_ENV_DUMP]"


def slurm_sets(cluster: SlurmCluster, nodes: int = 2, **fields: Any) -> list[str]:
    """``--set`` flags for the tiny spec on the test cluster. The stale-process check is off:
    other tests on this machine train MaxText at the same time, outside any Slurm job. The stand-in
    trainer's settings (tests/standins/trainer.py) are passed to the training (env.pass)."""
    values: dict[str, Any] = {
        "runtime.backend": "slurm",
        "resources.partition": cluster.partition,
        "resources.nodes": nodes,
        "runtime.preflight.stale_processes": "false",
        "env.pass": STANDIN_PASS,
        **fields,
    }
    return [arg for key, value in values.items() for arg in ("--set", f"{key}={value}")]


def build(mxc: Mxc, *sets: str, spec: str = TINY) -> str:
    out = mxc("build", "-q", spec, *sets)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def submit(mxc: Mxc, bundle: str, env: dict[str, str] | None = None) -> str:
    out = mxc("run", "-q", "-y", bundle, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def run_dir(home: Path, run_id: str) -> RunDir:
    return RunDir(home / "runs" / run_id)


def record(home: Path, run_id: str) -> RunRecord:
    return runs.load(run_dir(home, run_id))


def slurm_of(rec: RunRecord) -> dict[str, Any]:
    """The record's typed Slurm state as plain JSON data (what record.json holds), for assertions."""
    return rec.slurm.model_dump(mode="json") if rec.slurm is not None else {}


def wait_for[T](check: Callable[[], T | None], timeout: float, what: str, poll: float = 0.2) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def wait_final(home: Path, run_id: str, timeout: float = 240) -> RunRecord:
    def final() -> RunRecord | None:
        rec = record(home, run_id)
        return rec if rec.final else None

    try:
        return wait_for(final, timeout, f"run {run_id} to end", poll=0.5)
    except AssertionError:
        log = run_dir(home, run_id).log
        tail = log.read_text(errors="replace").splitlines()[-40:] if log.exists() else []
        raise AssertionError(f"run {run_id} did not end in {timeout}s; log tail:\n" + "\n".join(tail)) from None


def events(path: Path) -> list[dict[str, Any]]:
    """Every line of an event file, each checked against its schema (mxc/node/events.py): a line
    the node program wrote that does not validate fails the test that reads it."""
    if not path.exists():
        return []
    adapter = BATCH_ADAPTER if path.name == "batch.jsonl" else RANK_ADAPTER
    found, problems = read_events(path, adapter)
    assert problems == [], problems
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert len(lines) == len(found)
    return lines


def rank_events(home: Path, run_id: str, rank: int) -> list[dict[str, Any]]:
    return events(run_dir(home, run_id).path / "ranks" / str(rank) / "events.jsonl")


def batch_events(home: Path, run_id: str) -> list[dict[str, Any]]:
    return events(run_dir(home, run_id).path / "batch.jsonl")


def stage_started(home: Path, run_id: str, stage: str, ranks: range = range(1)) -> bool:
    """Every given rank logged the start of ``stage`` (entrypoint's ``stage NAME: start``)."""
    log = run_dir(home, run_id).log
    if not log.exists():
        return False
    text = log.read_text(errors="replace")
    return all(f"rank {r}] stage {stage}: start" in text for r in ranks)


def checkpoints(home: Path, run_id: str) -> set[int]:
    """The steps checkpointed so far by a run of a bundle without checkpoint.dir."""
    root = RunPaths(run_dir(home, run_id)).checkpoints
    if not root.is_dir():
        return set()
    return {int(p.name) for p in root.iterdir() if p.name.isdigit()}


def processes_of(run: RunDir) -> list[int]:
    """Pids of processes started for this run (their environment names its run directory)."""
    return [pid for pid, _ in run_processes(run.path)]


def path_without_scontrol(tmp_path: Path) -> str:
    """A PATH (this venv, then every system tool but scontrol and scancel) for a job on compute nodes
    that cannot requeue themselves: the job inherits it, leaves resubmit.request, and mxc resubmits."""
    bare = tmp_path / "bin-without-scontrol"
    bare.mkdir()
    for directory in ("/usr/local/bin", "/usr/bin", "/bin"):
        for tool in Path(directory).iterdir():
            if tool.name not in ("scontrol", "scancel") and not (bare / tool.name).exists():
                (bare / tool.name).symlink_to(tool)
    return f"{Path(sys.executable).parent}:{bare}"


def leave_little_time(cluster: SlurmCluster, job_id: str) -> int:
    """Lower the running job's time limit so that 30 to 90 s are left (Slurm counts limits in
    whole minutes, from the start of the current run); returns the seconds left."""
    started = cluster.run("squeue", "-h", "-j", job_id, "-o", "%S").stdout.strip()
    elapsed = int(time.time() - datetime.fromisoformat(started).timestamp())
    minutes = (elapsed + 30) // 60 + 1
    cluster.run("scontrol", "update", f"JobId={job_id}", f"TimeLimit={minutes}")
    return minutes * 60 - elapsed
