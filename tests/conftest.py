"""Shared fixtures: an isolated MXC_HOME per test and a way to run the real CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tests.remote_support import Sshd
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


@dataclass(frozen=True)
class Home:
    """One MXC_HOME shared by a module's tests (training is too slow to repeat per test)."""

    path: Path

    def env(self) -> dict[str, str]:
        return {**os.environ, "MXC_HOME": str(self.path)}

    def cli(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "mxc", *args], cwd=REPO, env=self.env(),
                              capture_output=True, text=True, timeout=timeout)

    def start(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "mxc", *args], cwd=REPO, env={**self.env(), **(env or {})},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def json(self, *args: str) -> Any:
        out = self.cli(*args, "--json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def runs(self) -> set[Path]:
        root = self.path / "runs"
        return set(root.iterdir()) if root.is_dir() else set()

    def build(self, spec: Path, sets: tuple[str, ...]) -> str:
        args = ["build", str(spec), "-q"]
        for setting in sets:
            args += ["--set", setting]
        out = self.cli(*args)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()


def copy_specs(directory: Path) -> Path:
    """The shipped specs/ copied into ``directory``, so a test spec written there can say
    ``extends: specs/tiny.yaml`` (extends reaches only the spec's own repository or directory)."""
    shutil.copytree(SPECS, directory / "specs", dirs_exist_ok=True)
    return directory / "specs"


@pytest.fixture(autouse=True)
def _release_paused_trainers() -> Iterator[None]:
    """Whatever a test did, no trainer it paused (tests/gates.py) stays paused after it."""
    yield
    from tests.gates import release_every_gate

    release_every_gate()


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


@pytest.fixture(scope="session")
def sshd() -> Iterator[Sshd]:
    """A throw-away OpenSSH server on 127.0.0.1 for the whole session (tests/remote_support.py): the
    remote tests' login node, one for both files (its start makes three keys)."""
    from tests.remote_support import running_sshd

    with running_sshd() as server:
        yield server


@pytest.fixture
def slurm_env(slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """This test's mxc talks to the test cluster, and all Slurm tests share one JAX compilation cache."""
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    monkeypatch.setenv("MXC_JAX_CACHE", str(tmp_path_factory.getbasetemp() / "jax-cache"))
