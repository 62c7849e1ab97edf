"""Shared fixtures: an isolated MXC_HOME per test and a way to run the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.slurm_cluster import SlurmCluster

REPO = Path(__file__).resolve().parents[1]
SPECS = REPO / "specs"
RUNNABLE_SPECS = sorted(p for p in SPECS.glob("*.yaml"))

Mxc = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def mxc_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "mxc-home"
    monkeypatch.setenv("MXC_HOME", str(home))
    return home


@pytest.fixture
def mxc(mxc_home: Path) -> Mxc:
    """Run ``python -m mxc ARGS`` in a subprocess (the real CLI, real exit codes)."""

    def run(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
            timeout: float = 600, input: str | None = None) -> subprocess.CompletedProcess[str]:
        full_env = {**os.environ, "MXC_HOME": str(mxc_home), **(env or {})}
        return subprocess.run(
            [sys.executable, "-m", "mxc", *args], cwd=cwd or REPO, env=full_env,
            capture_output=True, text=True, timeout=timeout, input=input,
        )

    return run


def store_snapshot(home: Path) -> list[str]:
    """Every path under MXC_HOME, to prove a failed command wrote nothing."""
    if not home.exists():
        return []
    return sorted(str(p.relative_to(home)) for p in home.rglob("*"))


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A real throw-away Slurm cluster for the whole session: munged, slurmctld and 2 slurmd
    emulating node1 and node2, 4 fake GPUs each (tests/slurm_cluster.py). Free ports, private
    directory; stopped (by pid) at the end. MXC_KEEP_SLURM=1 keeps its logs."""
    from tests.slurm_cluster import running_cluster

    with running_cluster(nodes=2, gpus=4) as cluster:
        yield cluster
