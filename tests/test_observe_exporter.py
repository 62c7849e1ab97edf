"""The exporter process and a real Prometheus: ports, a plugin that raises, the bundle's
config checked by promtool, a TSDB that answers after every process has exited."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mxc.runtime.observe import scrape_token
from mxc.runtime.observe.prometheus import PrometheusServer, promtool_check, write_targets
from mxc.runtime.observe.tsdb import last_values, open_tsdb, range_series
from mxc.runtime.record import RunRecord
from mxc.runtime.rundir import RunDir
from tests.conftest import REPO, Mxc

# The exporter under test, its ready-file contents and its log.
Exporter = tuple[subprocess.Popen[bytes], dict[str, Any], Path]

RAISING_PLUGIN = '''
from prometheus_client.core import GaugeMetricFamily

class Raising:
    name = "raising"
    calls = 0

    def collect(self):
        self.calls += 1
        if self.calls > 1:
            raise OSError("device unplugged")
        return [GaugeMetricFamily("raising_value", "works once", value=7)]

def create(context):
    return Raising()
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def wait_file(path: Path, proc: subprocess.Popen[bytes], timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            data: dict[str, Any] = json.loads(path.read_text())
            return data
        assert proc.poll() is None, f"exporter exited {proc.returncode}"
        time.sleep(0.05)
    raise AssertionError(f"no {path}")


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "runs" / "20260101-000000-abcd-12345678"
    (run / "metrics").mkdir(parents=True)
    lines = [{"step": float(s), "learning/loss": 6.0 - s / 7, "perf/step_time_seconds": 0.01,
              "learning/current_learning_rate": 1e-4, "perf/per_device_tokens_per_sec": 6400.0} for s in range(5)]
    (run / "metrics/attempt-0.rank-0.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run


@pytest.fixture
def exporter(tmp_path: Path, run_dir: Path) -> Iterator[Exporter]:
    """An exporter whose configured first port is taken: it must move on to the next free one."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "raising.py").write_text(RAISING_PLUGIN)
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    taken = blocker.getsockname()[1]
    config = tmp_path / "exporter.json"
    config.write_text(json.dumps({"bind": "127.0.0.1", "port": taken, "plugins": ["host", "gpu", "tensorboard"]}))
    ready = tmp_path / "ready.json"
    log = open(tmp_path / "exporter.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "mxc.runtime.observe.exporter", "--config", str(config), "--run-dir",
                             str(run_dir), "--plugins-dir", str(plugins), "--ready-file", str(ready)],
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "MXC_HOME": str(tmp_path / "h")})
    try:
        info = wait_file(ready, proc)
        assert info["port"] != taken and info["bind"] == "127.0.0.1"
        yield proc, info, tmp_path / "exporter.log"
    finally:
        blocker.close()
        if proc.poll() is None:
            proc.terminate()
            proc.wait(10)
        log.close()


def test_a_raising_plugin_is_disabled_and_the_others_keep_serving(exporter: Exporter) -> None:
    proc, info, log = exporter
    assert info["plugins"]["raising"]["status"] == "up"
    assert info["plugins"]["gpu"]["status"] == "unavailable"  # no GPU here: a reason, not an error
    first = scrape(info["port"])
    assert first["raising_value{}"] == 7
    second = scrape(info["port"])
    third = scrape(info["port"])
    assert "raising_value{}" not in second and "raising_value{}" not in third
    assert third["mxc_exporter_plugin_up{plugin=raising}"] == 0
    assert third["mxc_exporter_plugin_info{plugin=raising,reason=OSError: device unplugged,status=failed}"] == 1
    assert third["mxc_exporter_plugin_up{plugin=host}"] == 1
    assert third["mxc_host_cpus{}"] >= 1  # host series keep coming
    assert third["mxc_train_last_step{rank=0}"] == 4
    assert third["mxc_train_loss{rank=0}"] == 6.0 - 4 / 7
    assert proc.poll() is None, "the exporter must survive its plugins"
    assert "plugin raising: disabled, collect() raised OSError: device unplugged" in log.read_text()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0


def test_exporter_reads_new_steps_on_each_scrape(exporter: Exporter, run_dir: Path) -> None:
    _, info, _ = exporter
    assert scrape(info["port"])["mxc_train_step_total{rank=0}"] == 5
    with open(run_dir / "metrics/attempt-0.rank-0.jsonl", "a") as fh:
        fh.write(json.dumps({"step": 5.0, "learning/loss": 1.25}) + "\n")
    after = scrape(info["port"])
    assert after["mxc_train_step_total{rank=0}"] == 6 and after["mxc_train_loss{rank=0}"] == 1.25


def test_bundle_prometheus_config_passes_promtool(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    out = mxc("build", str(REPO / "specs/tiny.yaml"), "-q", "--set", "observability.enabled=true",
              "--set", "observability.scrape_interval=2")
    assert out.returncode == 0, out.stderr
    bundle = mxc_home / "bundles" / out.stdout.strip()
    config = tmp_path / "prometheus.yml"
    config.write_text((bundle / "prometheus.yml").read_text())
    (tmp_path / "alerts.rules.yml").write_text((bundle / "alerts.rules.yml").read_text())  # as the run copies it
    write_targets(tmp_path / "targets", "exporter-node1", ["127.0.0.1:9400"], {"run": "r", "node": "node1"})
    write_targets(tmp_path / "targets", "ray-node1", ["127.0.0.1:9401"], {"run": "r", "node": "node1"})
    write_targets(tmp_path / "targets", "site-node1-node_exporter", ["127.0.0.1:9100"],
                  {"run": "r", "node": "node1", "exporter": "node_exporter"})
    missing_token = promtool_check(config)  # the run makes the scrape token before Prometheus starts
    assert missing_token.returncode != 0 and "scrape-token" in missing_token.stdout + missing_token.stderr
    scrape_token.ensure(tmp_path / "scrape-token")
    assert (tmp_path / "scrape-token").stat().st_mode & 0o777 == 0o600
    checked = promtool_check(config)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout + checked.stderr
    exporter_json = json.loads((bundle / "exporter.json").read_text())
    assert exporter_json["bind"] == "127.0.0.1" and exporter_json["plugins"] == ["host", "network", "gpu", "tensorboard"]
    broken = tmp_path / "broken.yml"
    broken.write_text(config.read_text().replace("scrape_interval: 2s", "scrape_interval: two"))
    assert promtool_check(broken).returncode != 0  # the check is real


def tree_digest(path: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        h.update(str(p.relative_to(path)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def test_tsdb_answers_after_every_process_exited(exporter: Exporter, run_dir: Path) -> None:
    """Prometheus scrapes the exporter into the run's TSDB; both stop; a reopened copy answers
    with history (query_range / last_over_time), and the run's TSDB is left untouched."""
    proc, info, _ = exporter
    home = run_dir / "prometheus"
    config = home / "prometheus.yml"
    config.parent.mkdir(parents=True)
    config.write_text("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: mxc-exporter\n"
                      "    file_sd_configs:\n      - files: ['targets/exporter-*.json']\n")
    write_targets(home / "targets", "exporter-n", [f"127.0.0.1:{info['port']}"], {"run": run_dir.name, "node": "n"})
    server = PrometheusServer.start(config, home / "data", "127.0.0.1", free_port())
    started = time.time()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            got = server.api.query("mxc_train_last_step")
            if got and len(server.api.query("mxc_host_cpus[1m]")[0]["values"]) >= 3:
                break
            time.sleep(0.3)
        else:
            pytest.fail("Prometheus did not scrape the exporter")
    finally:
        server.stop()
        proc.terminate()
        proc.wait(10)
    assert server.process.poll() is not None and proc.poll() is not None
    before = tree_digest(home / "data")
    record = RunRecord(run_id=run_dir.name, bundle="0" * 64, spec_name="t", backend="local", status="succeeded",
                       final=True, started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
                       ended=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 1)),
                       observability={"scrape_interval": 1})
    run = RunDir(run_dir)
    with open_tsdb(run, record) as tsdb:
        assert not tsdb.live
        # An instant query at "now" is the stale-series pitfall; history is in the window.
        series = {s["series"]: s for s in last_values(tsdb, '{__name__=~"mxc_.+"}')}
        loss = next(s for name, s in series.items() if name.startswith("mxc_train_loss{"))
        assert loss["last"] == 6.0 - 4 / 7 and loss["samples"] >= 3
        assert loss["metric"]["run"] == run_dir.name  # the target label names the run
        assert any(name.startswith("mxc_host_cpu_seconds_total{") for name in series)
        cpu = range_series(tsdb, "mxc_host_cpus", 1)
        assert cpu and len(cpu[0]["values"]) >= 3
    assert tree_digest(home / "data") == before, "reopening must not write to the run's TSDB"


HOLDER = '''
import json, sys, time
from pathlib import Path
from mxc.node.contract import Observability as Settings
from mxc.runtime.observe.observer import Observability
from mxc.runtime.record import RunRecord
from mxc.runtime.rundir import RunDir
from mxc.runtime.record import now_iso


run = RunDir(Path(sys.argv[1]))
run.path.mkdir(parents=True)
record = RunRecord(run_id=run.run_id, bundle="0" * 64, spec_name="t", backend="local", status="running",
                   started=now_iso())
observer = Observability(Settings(enabled=True, bind=sys.argv[2], exporter_port=19400, prometheus_port=19190,
                                  tensorboard_port=6006, scrape_interval=1, plugins=["host"]), "t")
observer.on_start(run, record)
observer.started.wait()  # the start-up runs beside the training, in the background
print(json.dumps(record.observability), flush=True)
time.sleep(600)
'''


def _holder(tmp_path: Path, run: Path, bind: str) -> subprocess.Popen[str]:
    """A process that starts a run's observability (exporter on ``bind``) and prints its record, then waits."""
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    return subprocess.Popen([sys.executable, str(script), str(run), bind], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "MXC_HOME": str(tmp_path / "h")})


def test_helpers_do_not_outlive_a_killed_supervisor(tmp_path: Path) -> None:
    """SIGKILL gives mxc no chance to stop anything: the kernel stops exporter and Prometheus."""
    from mxc.runtime.processes.procfs import pid_alive

    run = tmp_path / "runs" / "20260101-000000-abcd-87654321"
    holder = _holder(tmp_path, run, "127.0.0.1")
    try:
        info = json.loads(holder.stdout.readline() if holder.stdout else "{}")
        pids = [info["exporter"]["pid"], info["prometheus"]["pid"]]
        assert all(pid_alive(p) for p in pids) and info["errors"] == []
    finally:
        holder.kill()
        holder.wait()
    _wait_gone(pids)
    assert RunDir(run).tsdb.joinpath("data").is_dir()


def _wait_gone(pids: list[int]) -> None:
    from mxc.runtime.processes.procfs import pid_alive

    deadline = time.monotonic() + 30
    while any(pid_alive(p) for p in pids):
        assert time.monotonic() < deadline, "a helper outlived the supervisor"
        time.sleep(0.1)


def test_prometheus_listens_on_loopback_whatever_observability_bind_says(tmp_path: Path) -> None:
    """``observability.bind: 0.0.0.0`` moves the exporter (behind the scrape token), never the run's
    Prometheus: it has no authentication, so it listens on 127.0.0.1 only (docs/security.md)."""
    run = tmp_path / "runs" / "20260101-000000-abcd-87654322"
    holder = _holder(tmp_path, run, "0.0.0.0")
    try:
        info = json.loads(holder.stdout.readline() if holder.stdout else "{}")
        pids = [info["exporter"]["pid"], info["prometheus"]["pid"]]
        assert info["errors"] == [] and info["exporter"]["bind"] == "0.0.0.0"
        prometheus = info["prometheus"]
        assert prometheus["url"] == f"http://127.0.0.1:{prometheus['port']}"
        argv = Path(f"/proc/{prometheus['pid']}/cmdline").read_bytes().split(b"\0")
        listen = [a for a in argv if a.startswith(b"--web.listen-address=")]
        assert listen == [f"--web.listen-address=127.0.0.1:{prometheus['port']}".encode()], argv
    finally:
        holder.kill()
        holder.wait()
    _wait_gone(pids)
