"""Observability start-up stays off the training's critical path: the training starts while the
run's Prometheus is still coming up, and a Prometheus that never comes up fails nothing.

The supervisor runs in-process with the stand-in trainer (tests/standins/trainer.py) and a
`prometheus` on PATH that starts and then waits, never ready, until the test releases it: an
event, not a duration. Had the supervisor waited for Prometheus before starting the training, the
trainer's start marker would only appear after that Prometheus had been given up and stopped.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from mxc.compiler import compile_spec
from mxc.node.contract import RunContract
from mxc.runtime import contract as contracts
from mxc.runtime.local.launcher import LocalLauncher
from mxc.runtime.local.supervisor import Supervisor, SupervisorConfig
from mxc.runtime.observe.observer import Observability
from mxc.runtime.record import RunRecord, now_iso
from mxc.runtime.rundir import RunDir
from mxc.runtime.runpaths import RunPaths
from mxc.store import Store
from tests.conftest import REPO

STANDIN = REPO / "tests" / "standins" / "trainer.py"
WAIT_S = 180.0  # a safety net only
SETS = ("observability.enabled=true", "observability.scrape_interval=1", "observability.plugins=[host, tensorboard]",
        "runtime.preflight.stale_processes=false", "checkpoint.period=0",
        "env.pass=[MXCTEST_TRAINER]")  # the stand-in trainer's behaviour (tests/standins/trainer.py)

SLOW_PROMETHEUS = """#!/bin/bash
# Starts, never answers /-/ready, and waits until the test releases it (or it is stopped).
echo $$ > "{gate}/started"
trap 'touch "{gate}/stopped"; exit 0' TERM
while [ ! -e "{gate}/release" ]; do sleep 0.05; done
touch "{gate}/released"
"""


def wait_for(what: str, check: object) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.05)
    pytest.fail(f"{what}: not seen in {WAIT_S:.0f}s")


def test_training_starts_while_prometheus_is_still_starting(tmp_path: Path) -> None:
    bundle = compile_spec(str(REPO / "specs" / "tiny.yaml"), lambda p: Path(p).read_bytes(), SETS, mxc_version="test")
    stored, _ = Store(tmp_path / "home").put(bundle.files, bundle.hash)
    contract: RunContract = contracts.load(stored)
    assert not contract.observability.ray  # Ray is off unless a spec asks for it
    bin_dir, gate = tmp_path / "bin", tmp_path / "gate"
    bin_dir.mkdir()
    gate.mkdir()
    python = bin_dir / "python"
    python.write_text(f'#!/bin/bash\nif [ "$1" = -m ]; then exec {sys.executable} {STANDIN} "$@"; fi\nexit 0\n')
    prometheus = bin_dir / "prometheus"
    prometheus.write_text(SLOW_PROMETHEUS.format(gate=gate))
    for tool in (python, prometheus):
        tool.chmod(0o755)
    run = RunDir(tmp_path / "home" / "runs" / f"20260101-000000-f00d-{stored.hash[:8]}")
    run.path.mkdir(parents=True)
    argv = ["bash", str(stored.path / "entrypoint.sh")]
    record = RunRecord(run_id=run.run_id, bundle=stored.hash, spec_name="tiny", backend="local", status="starting",
                       started=now_iso(), command=argv)
    record.save(run.record)
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    env = {**os.environ, "PATH": path, "MXC_RUN_DIR": str(run.path), "MXC_BUNDLE_DIR": str(stored.path),
           "MXC_PYTHON": str(python), "MXCTEST_TRAINER": "*=steps"}
    config = SupervisorConfig(argv=argv, env=env, cwd=run.path, restart=contract.restart, total_steps=None,
                              checkpoints=RunPaths(run).checkpoints, grace_seconds=5)
    observer = Observability(contract.observability, contract.name, bundle_dir=stored.path)
    finals: list[RunRecord] = []
    old_path = os.environ["PATH"]
    os.environ["PATH"] = path  # the observer finds `prometheus` on this process's PATH
    try:
        supervisor = threading.Thread(target=lambda: finals.append(
            Supervisor(run, record, config, LocalLauncher(), [observer]).run_to_end()), daemon=True)
        supervisor.start()
        wait_for("the training's start", lambda: (run.path / "standin.attempt-0.rank-0").exists())
        assert (gate / "started").exists() and not (gate / "stopped").exists(), \
            "the training started only after the run's Prometheus had been given up"
        # Both helpers yield the CPU to the training (their start-up would slow its on a busy node).
        wait_for("the exporter's start", lambda: observer.exporter is not None)
        assert observer.exporter is not None
        ours = os.getpriority(os.PRIO_PROCESS, 0)
        for pid in (observer.exporter.pid, int((gate / "started").read_text())):
            assert os.getpriority(os.PRIO_PROCESS, pid) == min(19, ours + 10)
        (gate / "release").touch()  # this Prometheus now exits without ever being ready
        supervisor.join(WAIT_S)
        assert not supervisor.is_alive()
    finally:
        os.environ["PATH"] = old_path
        (gate / "release").touch()
    [final] = finals
    assert final.status == "succeeded" and final.final  # observability never fails the run
    obs = final.observability or {}
    assert any(e.startswith("prometheus: ") for e in obs["errors"]), obs
    assert obs["exporter"]["url"].startswith("http://127.0.0.1:") and "prometheus" not in obs
    assert observer.exporter is not None and observer.exporter.poll() is not None  # stopped at the end
