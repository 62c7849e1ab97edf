"""`mxc run` of the tiny model with observability on: real MaxText, real Ray, real Prometheus.

One run is shared by the module (CPU is scarce): its training is SIGKILLed after a
checkpoint, while it waits at step 12 (tests/gates.py), so it also restarts once. Everything else is asked afterwards, when every
process of the run has exited, through the CLI (`mxc metrics`, `mxc report`, `mxc dashboard`).
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mxc.runtime.processes import scratch
from mxc.runtime.processes.procfs import ProcessId, pid_alive, session_processes
from tests.browser import open_page, screenshot
from tests.conftest import REPO, Home
from tests.gates import PASS_SET, PauseGate
from tests.processes import run_processes, trainer_pids

pytestmark = pytest.mark.training

STEPS = 30
BUILD_SETS = (
    "observability.enabled=true",
    "observability.ray=true",  # off by default: this run covers Ray too
    "observability.scrape_interval=1",
    "model.overrides.per_device_batch_size=32",
    "checkpoint.period=5",
    "runtime.preflight.stale_processes=false",  # other trainings on a shared machine
    PASS_SET,  # the pause gate's variables reach the trainer
)


def wait_for(what: str, check: Callable[[], Any], proc: subprocess.Popen[str], timeout: float = 600) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        if proc.poll() is not None:
            _, err = proc.communicate()
            pytest.fail(f"mxc exited ({proc.returncode}) while waiting for {what}\n{err[-3000:]}")
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Home:
    return Home(tmp_path_factory.mktemp("observe-home") / "mxc")


@pytest.fixture(scope="module")
def run(home: Home) -> Path:
    gate = PauseGate(home.path.parent / "gate", {0: 12})
    gate.directory.mkdir(parents=True)
    proc = home.start("run", home.build(REPO / "specs/tiny.yaml", BUILD_SETS), "-q", env=gate.env())
    runs = home.path / "runs"
    run: Path = wait_for("the run directory", lambda: next(iter(runs.iterdir()), None) if runs.is_dir() else None, proc)
    checkpoints = run / "output" / run.name / "checkpoints"

    def checkpoint() -> int | None:
        done = [int(p.name) for p in checkpoints.iterdir() if p.name.isdigit()] if checkpoints.is_dir() else []
        return max((s for s in done if 5 <= s < STEPS - 1), default=None)

    pid = gate.wait_paused(0, alive=lambda: proc.poll() is None)[0]
    wait_for("a checkpoint at step >= 5", checkpoint, proc)
    assert pid in trainer_pids(run), "the trainer runs under the Ray actor with the run's environment"
    os.kill(pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err
    return run


def record_of(run: Path) -> dict[str, Any]:
    record: dict[str, Any] = json.loads((run / "record.json").read_text())
    return record


def merged_losses(run: Path) -> dict[int, float]:
    return {int(m["step"]): m["learning/loss"] for m in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}


def query(home: Home, run: Path, expr: str) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = home.json("metrics", run.name, "--query", expr, "--step", "1")["result"]
    return result


def test_the_run_trained_restarted_and_recorded_its_observability(run: Path) -> None:
    record = record_of(run)
    assert record["status"] == "succeeded" and record["restarts"] == 1
    assert record["attempts"][0]["signal"] == "SIGKILL"
    obs = record["observability"]
    assert obs["errors"] == []
    assert obs["exporter"]["url"].startswith("http://127.0.0.1:") and obs["exporter"]["bind"] == "127.0.0.1"
    assert obs["prometheus"]["url"].startswith("http://127.0.0.1:")
    ray = obs["ray"]
    assert ray["address"].startswith("127.0.0.1:") and ray["metrics_port"] > 0
    assert len(set(ray["ports"].values())) == len(ray["ports"])  # every Ray server on its own picked port
    targets = sorted(p.name for p in (run / "prometheus/targets").iterdir())
    node = os.uname().nodename
    assert targets == [f"alert-receiver-{node}.json", f"exporter-{node}.json", f"ray-{node}.json"]
    # Every process of the run has exited: exporter, Prometheus, the Ray head and all of its session.
    # Recorded as identities (pid, start time, boot id), not bare pids.
    helpers = [ProcessId.from_record(obs["exporter"]), ProcessId.from_record(obs["prometheus"]),
               ProcessId.from_record(ray["head"])]
    assert all(h is not None and not h.is_alive() for h in helpers), helpers
    assert not pid_alive(ray["head"]["pid"]) and session_processes(ray["head"]["pid"]) == []
    assert run_processes(run) == []
    assert Path(ray["temp_dir"]).parent == scratch.root()  # the run's own, not /tmp/ray
    assert not Path(ray["temp_dir"]).exists() and (run / "ray/logs").is_dir()
    assert (run / "observability/summary.json").is_file()


def test_loss_and_step_series_in_the_tsdb_match_metrics_jsonl(home: Home, run: Path) -> None:
    losses = merged_losses(run)
    assert sorted(losses) == list(range(STEPS))
    [steps] = query(home, run, "mxc_train_last_step")  # one series for the run, across the restart
    [loss] = query(home, run, "mxc_train_loss")
    assert steps["metric"]["run"] == run.name and "attempt" not in steps["metric"]
    at_step = {t: int(v) for t, v in steps["values"]}
    pairs = [(at_step[t], v) for t, v in loss["values"] if t in at_step]
    assert len(pairs) >= 3
    for step, value in pairs:
        assert value == losses[step], f"step {step}: TSDB {value!r} != metrics.jsonl {losses[step]!r}"  # exact
    assert steps["values"][-1][1] == STEPS - 1 and loss["values"][-1][1] == losses[STEPS - 1]  # the final step is in


def test_restarts_are_annotations_on_one_run(home: Home, run: Path) -> None:
    series = {s["series"].split("{")[0]: s for s in home.json("metrics", run.name)["series"]}
    assert series["mxc_run_restarts_total"]["last"] == 1
    assert series["mxc_train_attempt"]["last"] == 1
    started = query(home, run, "mxc_run_attempt_start_timestamp_seconds")
    assert sorted(s["metric"]["attempt"] for s in started) == ["0", "1"]
    [total] = query(home, run, "mxc_train_step_total")
    assert total["values"][-1][1] >= STEPS  # recomputed steps after the restart count as work


def test_host_and_ray_series_are_in_the_tsdb(home: Home, run: Path) -> None:
    everything = home.json("metrics", run.name, "--all")
    names = {s["metric"]["__name__"] for s in everything["series"]}
    assert {"mxc_host_cpu_seconds_total", "mxc_host_memory_available_bytes", "mxc_host_network_received_bytes_total",
            "mxc_host_disk_read_bytes_total", "mxc_host_filesystem_free_bytes"} <= names
    ray_series = [s for s in everything["series"] if s["metric"].get("job") == "ray"]
    assert ray_series, "Ray's own metrics are scraped into the same TSDB"
    assert everything["live"] is False  # reopened after the run, read-only
    text = home.cli("metrics", run.name)
    assert text.returncode == 0 and "mxc_train_loss" in text.stdout and "reopened read-only" in text.stdout


def test_report_renders_one_run_and_two_side_by_side(home: Home, run: Path, tmp_path: Path) -> None:
    png = tmp_path / "report.png"
    out = home.cli("report", run.name, "-o", str(png))
    assert out.returncode == 0, out.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 50_000
    # a second run of the same bundle to compare with: the same data under a new id, its record its own
    twin = run.parent / f"{run.name[:16]}{'ffff' if run.name[16:20] != 'ffff' else 'eeee'}{run.name[20:]}"
    shutil.copytree(run, twin, symlinks=True)
    record = json.loads((twin / "record.json").read_text())
    (twin / "record.json").write_text(json.dumps({**record, "run_id": twin.name}))
    try:
        page = tmp_path / "compare.html"
        summary = home.json("report", run.name, twin.name, "-o", str(page))
        first, second = summary["runs"]
        assert first["final_loss"] == merged_losses(run)[STEPS - 1] and first["restarts"] == 1
        assert first["steps"] == second["steps"] == STEPS
        assert first["outcome"]["headline"] == "run succeeded after 1 failed attempt(s)"
        [comparison] = summary["comparisons"]
        assert comparison["losses"]["first_diverging_exact"] is None and comparison["spec_changes"] == []
        opened = open_page(page)  # headless Chromium: the inlined uPlot draws every panel, with no error
        assert opened.console == [] and opened.attribute("data-mxc-errors") is None
        drawn = re.findall(r'id="panel-(\w+)"[^>]*data-state="drawn"', opened.dom)
        assert drawn == ["loss", "step_time", "throughput", "learning_rate", "host_cpu", "host_memory"]
        assert opened.attribute("data-mxc-rendered") == str(len(drawn)) and opened.dom.count("<canvas") == len(drawn)
        text = html.unescape(re.sub(r"<[^>]+>", " ", opened.dom))
        assert "losses bit-identical at every common step" in text and "Spec: identical" in text
        assert "Shaded: while training ran." in text  # the attempts, from the run's events, on the host panels
        if os.environ.get("MXC_REPORT_COPY"):  # to look at the pictures: MXC_REPORT_COPY=/some/dir
            keep = Path(os.environ["MXC_REPORT_COPY"])
            shutil.copy(png, keep / "report.png")
            shutil.copy(page, keep / "compare.html")
            screenshot(page, keep / "compare-html.png", size=(1400, 2600))
            assert home.cli("report", run.name, twin.name, "-o", str(keep / "compare.png")).returncode == 0
    finally:
        shutil.rmtree(twin)


def test_dashboard_serves_prometheus_and_tensorboard_until_ctrl_c(home: Home, run: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "mxc", "dashboard", run.name, "--json"], cwd=REPO, env=home.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        while True:
            line = proc.stdout.readline() if proc.stdout else ""
            assert line, f"dashboard exited: {proc.stderr.read() if proc.stderr else ''}"
            lines.append(line)
            if line.rstrip() == "}":
                break
        urls = json.loads("".join(lines))
        assert urls["prometheus"].startswith("http://127.0.0.1:") and urls["tensorboard"].startswith("http://127.0.0.1:")
        base = urls["prometheus"].split("/graph")[0]
        params = urllib.parse.urlencode({"query": "max_over_time(mxc_train_last_step[1h])",
                                         "time": str(time.time() - 1)})
        # the reopened TSDB answers with the run's history
        with urllib.request.urlopen(f"{base}/api/v1/query?{params}", timeout=30) as resp:
            answer = json.loads(resp.read())
        assert answer["status"] == "success"
        with urllib.request.urlopen(urls["tensorboard"], timeout=30) as resp:
            assert resp.status == 200
        with urllib.request.urlopen(urls["tensorboard"] + "data/runs", timeout=30) as resp:
            assert json.loads(resp.read()), "TensorBoard sees the run's event files"
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    with pytest.raises(OSError):
        urllib.request.urlopen(urls["tensorboard"], timeout=5)
