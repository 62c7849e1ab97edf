"""Hang detection through the real supervisor: a fake trainer logs three steps and then sleeps
in a function; the watchdog dumps its Python stack, kills it, restart logic takes over, and
the run ends ``hung``. Exporter and Prometheus are real and record the hangs as annotations."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from mxc.runtime.local.launcher import LocalLauncher
from mxc.runtime.local.supervisor import Supervisor, SupervisorConfig
from mxc.runtime.observe import hang
from mxc.runtime.observe.observer import Observability
from mxc.runtime.observe.tsdb import last_values, open_tsdb
from mxc.runtime.procfs import pid_alive
from mxc.runtime.record import RunRecord, now_iso
from mxc.runtime.rundir import RunDir

FAKE_TRAINER = '''
import json, os, sys, time

run, attempt = os.environ["MXC_RUN_DIR"], os.environ.get("MXC_ATTEMPT", "0")
path = os.path.join(run, "metrics", f"attempt-{attempt}.rank-0.jsonl")
os.makedirs(os.path.dirname(path), exist_ok=True)
with open(os.path.join(run, f"pid-{attempt}"), "w") as fh:
    fh.write(str(os.getpid()))
for step in range(3):
    with open(path, "a") as fh:
        fh.write(json.dumps({"step": float(step), "learning/loss": 5.0 - step / 10}) + "\\n")
    print(f"completed step: {step}, seconds: 0.010, total_weights: 64, loss: {5.0 - step / 10:.3f}", flush=True)
    time.sleep(0.2)


def stuck_in_collective():
    while True:
        time.sleep(0.5)


stuck_in_collective()
'''

HANG_TIMEOUT = 2.0


def supervise(tmp_path: Path, restarts: int, env_extra: dict[str, str] | None = None) -> tuple[RunDir, RunRecord]:
    trainer = tmp_path / "fake_trainer.py"
    trainer.write_text(FAKE_TRAINER)
    run = RunDir(tmp_path / "runs" / "20260101-000000-beef-00000000")
    run.path.mkdir(parents=True)
    record = RunRecord(run_id=run.run_id, bundle="0" * 64, spec_name="fake", backend="local", status="starting",
                       started=now_iso(), command=[sys.executable, str(trainer)])
    record.save(run.record)
    spec = {"name": "fake", "observability": {"enabled": True, "scrape_interval": 1, "hang_timeout": HANG_TIMEOUT,
                                              "exporter_port": 19400, "prometheus_port": 19190,
                                              "plugins": ["host", "tensorboard"]}}
    env = {**os.environ, "MXC_RUN_DIR": str(run.path), **(env_extra or {})}
    config = SupervisorConfig(argv=[sys.executable, str(trainer)], env=env, cwd=tmp_path, max_restarts=restarts,
                              total_steps=None, checkpoints=tmp_path / "checkpoints", grace_seconds=5)
    observer = Observability(spec)
    final = Supervisor(run, record, config, LocalLauncher(), [observer]).run_to_end()
    assert not pid_alive(observer.prometheus.process.pid if observer.prometheus else None)
    assert observer.exporter is not None and observer.exporter.poll() is not None
    return run, final


def test_hang_is_detected_stacks_dumped_training_killed_and_restarted(tmp_path: Path) -> None:
    run, record = supervise(tmp_path, restarts=1)
    assert record.status == "hung" and record.final
    assert record.restarts == 1 and len(record.attempts) == 2  # restart logic took over after the first hang
    for attempt in record.attempts:
        extra = attempt.model_extra or {}
        assert extra.get("hung") is True
        assert attempt.signal == "SIGKILL" and attempt.last_step == 2
        assert attempt.reason and attempt.reason.startswith("hung: no training step for")
        [dump] = extra["stacks"]
        assert dump["ok"] and dump["method"].startswith("py-spy")
        text = Path(dump["file"]).read_text()
        assert "stuck_in_collective" in text  # the frame the trainer sleeps in
        assert not pid_alive(int((run.path / f"pid-{attempt.number}").read_text()))
    assert (record.message or "").startswith("no training step for")
    assert sorted(p.name for p in run.stacks.iterdir())[0].startswith("attempt-0-pid")
    log = run.log.read_text()
    assert sum("): hung; dumping stacks" in line for line in log.splitlines()) == 2
    assert "[mxc] run hung: no training step for" in log
    events = [json.loads(line)["event"] for line in (run.path / "observability/events.jsonl").read_text().splitlines()]
    assert events.count("hang") == 2 and events.count("attempt_start") == 2
    # The annotations are in the run's TSDB, readable after every process has exited.
    with open_tsdb(run, record) as tsdb:
        found = {s["metric"]["__name__"]: s["last"] for s in last_values(tsdb, '{__name__=~"mxc_run_.+"}')}
    assert found["mxc_run_hangs_total"] == 2 and found["mxc_run_restarts_total"] == 1


def test_without_py_spy_faulthandler_writes_the_stacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hang, "py_spy", lambda: None)
    _, record = supervise(tmp_path, restarts=0, env_extra={"PYTHONFAULTHANDLER": "1"})
    assert record.status == "hung"
    [attempt] = record.attempts
    [dump] = (attempt.model_extra or {})["stacks"]
    assert dump["method"] == "faulthandler" and dump["ok"]
    text = Path(dump["file"]).read_text()
    assert "Fatal Python error: Aborted" in text and "stuck_in_collective" in text


def test_metrics_cli_errors_are_one_line(tmp_path: Path) -> None:
    """Bad input to `mxc metrics` is one `mxc: error:` line and exit 2, never a traceback."""
    import subprocess

    run, _ = supervise(tmp_path, restarts=0)
    env = {**os.environ, "MXC_HOME": str(tmp_path)}  # supervise() put the run under <tmp>/runs

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
    import shutil

    shutil.rmtree(run.tsdb)
    gone = mxc("metrics", run.run_id)
    assert gone.returncode == 2 and "has no Prometheus TSDB" in gone.stderr
