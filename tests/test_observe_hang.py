"""Hang detection in a local run, through the real supervisor and the bundle's node program: a
stand-in trainer (tests/standins/trainer.py, ``stall``) logs three steps and then waits in a
function; the node program's hang watch dumps its Python stack, kills it, the restart policy
restarts it once, and the run ends ``hung``. Exporter and Prometheus are real and record the hangs
as annotations."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from mxc.compiler import compile_spec
from mxc.node.contract import RunContract
from mxc.runtime import contract as contracts
from mxc.runtime.local.launcher import LocalLauncher
from mxc.runtime.local.supervisor import Supervisor, SupervisorConfig
from mxc.runtime.observe.observer import Observability
from mxc.runtime.observe.tsdb import last_values, open_tsdb
from mxc.runtime.processes.procfs import pid_alive
from mxc.runtime.record import RunRecord, now_iso
from mxc.runtime.rundir import RunDir
from mxc.store import Store
from tests.conftest import REPO

STANDIN = REPO / "tests" / "standins" / "trainer.py"
STEP_TIMEOUT = 2
SETS = ("observability.enabled=true", "observability.scrape_interval=1", "observability.exporter_port=19400",
        "observability.prometheus_port=19190", "observability.plugins=[host, tensorboard]",
        f"runtime.hang.step_timeout={STEP_TIMEOUT}", "runtime.preflight.stale_processes=false", "checkpoint.period=0")


def supervise(tmp_path: Path, restarts: int, py_spy: bool = True, trainer: str = "stall") -> tuple[RunDir, RunRecord]:
    bundle = compile_spec(str(REPO / "specs" / "tiny.yaml"), lambda p: Path(p).read_bytes(),
                          (*SETS, f"restart.max={restarts}"), mxc_version="test")
    stored, _ = Store(tmp_path / "home").put(bundle.files, bundle.hash)
    contract: RunContract = contracts.load(stored)
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text(f'#!/bin/bash\nif [ "$1" = -m ]; then exec {sys.executable} {STANDIN} "$@"; fi\nexit 0\n')
    python.chmod(0o755)
    path = os.environ["PATH"].split(os.pathsep)
    if py_spy:
        path.insert(0, str(Path(sys.executable).parent))  # where the venv's py-spy is
    else:
        path = [p for p in path if not (Path(p) / "py-spy").exists()]
    run = RunDir(tmp_path / "home" / "runs" / "20260101-000000-beef-00000000")
    run.path.mkdir(parents=True)
    argv = ["bash", str(stored.path / "entrypoint.sh")]
    record = RunRecord(run_id=run.run_id, bundle=stored.hash, spec_name="tiny", backend="local", status="starting",
                       started=now_iso(), command=argv)
    record.save(run.record)
    env = {**os.environ, "PATH": os.pathsep.join(path), "MXC_RUN_DIR": str(run.path), "MXC_BUNDLE_DIR": str(stored.path),
           "MXC_PYTHON": str(python), "MXCTEST_TRAINER": f"*={trainer}"}
    config = SupervisorConfig(argv=argv, env=env, cwd=run.path, restart=contract.restart, total_steps=None,
                              checkpoints=run.output / run.run_id / "checkpoints", grace_seconds=5)
    observer = Observability(contract.observability, contract.name)
    final = Supervisor(run, record, config, LocalLauncher(), [observer]).run_to_end()
    assert not pid_alive(observer.prometheus.process.pid if observer.prometheus else None)
    assert observer.exporter is not None and observer.exporter.poll() is not None
    return run, final


def standin_pid(run: RunDir, attempt: int) -> int:
    return int((run.path / f"standin.attempt-{attempt}.rank-0").read_text())


def test_hang_is_detected_stacks_dumped_training_killed_and_restarted(tmp_path: Path) -> None:
    run, record = supervise(tmp_path, restarts=1)
    assert record.status == "hung" and record.final
    assert record.restarts == 1 and len(record.attempts) == 2  # the policy restarted after the first hang
    for attempt in record.attempts:
        extra = attempt.model_dump(mode="json", exclude_none=True)
        assert extra.get("hung") is True and extra.get("cause") == "hang"
        assert attempt.signal == "SIGKILL" and attempt.last_step == 2
        assert attempt.reason and attempt.reason.startswith("hung: no training step for")
        [dump] = extra["stacks"]
        text = Path(dump).read_text()
        assert text.startswith("# ") and "py-spy dump" in text.splitlines()[0] and "stuck_in_collective" in text
        assert not pid_alive(standin_pid(run, attempt.number))
    assert (record.message or "").startswith("no training step for")
    assert "not restarted: restart.max (1) reached" in (record.message or "")
    assert sorted(p.name for p in run.stacks.iterdir())[0].startswith("hang.rank-0.attempt-0-pid")
    log = run.log.read_text()
    assert sum(f"(runtime.hang.step_timeout {STEP_TIMEOUT}s): hung; dumping stacks" in line
               for line in log.splitlines()) == 2
    assert "[mxc] run hung: no training step for" in log
    events = [json.loads(line)["event"] for line in (run.path / "observability/events.jsonl").read_text().splitlines()]
    assert events.count("hang") == 2 and events.count("attempt_start") == 2
    # The annotations are in the run's TSDB, readable after every process has exited.
    with open_tsdb(run, record) as tsdb:
        found = {s["metric"]["__name__"]: s["last"] for s in last_values(tsdb, '{__name__=~"mxc_run_.+"}')}
    assert found["mxc_run_hangs_total"] == 2 and found["mxc_run_restarts_total"] == 1


def test_without_py_spy_faulthandler_writes_the_stacks(tmp_path: Path) -> None:
    _, record = supervise(tmp_path, restarts=0, py_spy=False)
    assert record.status == "hung"
    [attempt] = record.attempts
    [dump] = attempt.model_dump(mode="json", exclude_none=True)["stacks"]
    text = Path(dump).read_text()
    assert text.startswith("# faulthandler") and "Fatal Python error: Aborted" in text and "stuck_in_collective" in text


def test_metrics_cli_errors_are_one_line(tmp_path: Path) -> None:
    """Bad input to `mxc metrics` is one `mxc: error:` line and exit 2, never a traceback."""
    run, _ = supervise(tmp_path, restarts=0)
    env = {**os.environ, "MXC_HOME": str(tmp_path / "home")}

    def mxc(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "mxc", *args], env=env, capture_output=True, text=True, timeout=300)

    bad = mxc("metrics", run.run_id, "--query", "rate((")
    assert bad.returncode == 2 and bad.stderr.startswith("mxc: error: Prometheus: bad_data")
    assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    missing = mxc("metrics", "19990101")
    assert missing.returncode == 2 and missing.stderr.startswith("mxc: error: no run matches '19990101'")
    ok = mxc("metrics", run.run_id, "--query", "mxc_run_hangs_total", "--json")
    assert ok.returncode == 0, ok.stderr
    [series] = json.loads(ok.stdout)["result"]
    assert series["values"][-1][1] == 1.0
    shutil.rmtree(run.tsdb)
    gone = mxc("metrics", run.run_id)
    assert gone.returncode == 2 and "has no Prometheus TSDB" in gone.stderr
