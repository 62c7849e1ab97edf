"""The alerting rules shipped with the bundle: rendered by `mxc build`, checked by promtool, fired
against a synthetic TSDB (`promtool test rules`), and live: the run's Prometheus evaluates them,
its alert receiver keeps them and sends them through the run's notify webhook."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from mxc.compiler.alert_rules import ALERT_NAMES, ALERT_RULES, MEDIAN_RECORD
from mxc.node.contract import FILE as CONTRACT_FILE
from mxc.runtime.contract import parse as parse_contract
from mxc.runtime.observe import scrape_token
from mxc.runtime.observe.observer import Observability
from mxc.runtime.observe.prometheus import promtool_check
from mxc.runtime.rundir import RunDir
from tests import webhook_server
from tests.conftest import REPO, Mxc

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
WAIT_S = 180.0  # a safety net only: the waits below end on events


def build(mxc: Mxc, mxc_home: Path, *sets: str) -> Path:
    args = ["build", "-q", str(REPO / "specs/tiny.yaml"), "--set", "observability.enabled=true"]
    for setting in sets:
        args += ["--set", setting]
    out = mxc(*args)
    assert out.returncode == 0, out.stderr
    return mxc_home / "bundles" / out.stdout.strip()


def test_bundle_rules_pass_promtool_and_follow_the_spec(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    bundle = build(mxc, mxc_home, "observability.alerts.stall_after=120", "observability.alerts.step_time_ratio=2.5")
    rules = bundle / ALERT_RULES
    checked = subprocess.run([PROMTOOL, "check", "rules", str(rules)], capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 6 rules found" in checked.stdout
    groups = yaml.safe_load(rules.read_text())["groups"]
    by_name = {r.get("alert") or r.get("record"): r for g in groups for r in g["rules"]}
    assert set(ALERT_NAMES) | {MEDIAN_RECORD} == set(by_name)
    assert "[120s]" in by_name["MxcTrainingStalled"]["expr"]
    assert "> 2.5 * " in by_name["MxcStepTimeRegression"]["expr"]
    # The config names the rules and the receiver; promtool checks both together (token made by the run).
    home = tmp_path / "prometheus"
    home.mkdir()
    for name in ("prometheus.yml", ALERT_RULES):
        shutil.copyfile(bundle / name, home / name)
    scrape_token.ensure(home / "scrape-token")
    config = promtool_check(home / "prometheus.yml")
    assert config.returncode == 0 and "SUCCESS: 6 rules found" in config.stdout, config.stdout + config.stderr
    broken = home / ALERT_RULES
    broken.write_text(broken.read_text().replace("quantile_over_time(0.5,", "quantile_over_time(0.5"))
    assert subprocess.run([PROMTOOL, "check", "rules", str(broken)], capture_output=True, check=False).returncode != 0
    # Turned off: no rules, and the config names none.
    off = build(mxc, mxc_home, "observability.alerts.enabled=false")
    assert not (off / ALERT_RULES).exists() and "rule_files" not in (off / "prometheus.yml").read_text()


def _alert(labels: dict[str, str], summary: str, description: str) -> dict[str, Any]:
    return {"exp_labels": labels, "exp_annotations": {"summary": summary, "description": description}}


def test_rules_fire_on_a_synthetic_tsdb(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    """Each rule fires on the series that should fire it and stays quiet on its near miss
    (`promtool test rules`: series given as values every 10 s, alerts expected at given times)."""
    bundle = build(mxc, mxc_home)
    shutil.copyfile(bundle / ALERT_RULES, tmp_path / ALERT_RULES)
    port = {"run": "r", "node": "a", "device": "mlx5_0", "port": "1"}

    def series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
        return {"series": name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}",
                "values": values}

    stalled, steady = {"run": "r", "node": "a", "rank": "0"}, {"run": "r", "node": "b", "rank": "1"}
    tests = {
        "rule_files": [ALERT_RULES],
        "evaluation_interval": "10s",
        "tests": [{
            "interval": "10s",
            "input_series": [
                series("mxc_train_last_step", stalled, "1 2 3 4 5x200"),  # no new step after 40 s
                series("mxc_train_last_step", steady, "1+1x200"),
                series("mxc_train_step_time_seconds", stalled, "1x80 3x60"),  # 3x slower after 800 s
                series("mxc_train_step_time_seconds", steady, "1x80 1.2x60"),  # 1.2x: within 1.5x
                series("mxc_gpu_throttled_seconds_total", {"run": "r", "node": "a", "gpu": "0",
                                                           "reason": "hw_thermal_slowdown"}, "0+5x100"),  # 50 %
                series("mxc_gpu_throttled_seconds_total", {"run": "r", "node": "a", "gpu": "1",
                                                           "reason": "sw_power_cap"}, "0+5x100"),  # not heat
                series("mxc_rdma_ack_timeouts_total", port, "0+60x100"),  # 6/s
                series("mxc_rdma_retransmitted_packets_total", port, "0+40x100"),  # + 4/s
                series("mxc_rdma_ack_timeouts_total", {**port, "device": "mlx5_1"}, "0+5x100"),  # 0.5/s
                series("mxc_rdma_retry_exceeded_total", port, "0x30 1x70"),  # one, at 310 s
            ],
            "alert_rule_test": [
                {"eval_time": "5m", "alertname": "MxcTrainingStalled", "exp_alerts": []},  # 260 s < 600 s
                {"eval_time": "15m", "alertname": "MxcTrainingStalled", "exp_alerts": [_alert(
                    {**stalled, "severity": "warning"}, "training stalled on rank 0 (a)",
                    "no new training step for 600s after step 5: look at its stacks with `mxc stacks RUN`")]},
                {"eval_time": "16m", "alertname": "MxcStepTimeRegression", "exp_alerts": [_alert(
                    {**stalled, "severity": "warning"}, "step time regression on rank 0 (a)",
                    "step time 3s, above 1.5x the run's median")]},
                {"eval_time": "10m", "alertname": "MxcStepTimeRegression", "exp_alerts": []},
                {"eval_time": "5m", "alertname": "MxcGpuThermalThrottling", "exp_alerts": [_alert(
                    {"run": "r", "node": "a", "gpu": "0", "severity": "warning"},
                    "GPU 0 on a is thermally throttled", "clocks held down for heat 50% of the time")]},
                {"eval_time": "1m", "alertname": "MxcGpuThermalThrottling", "exp_alerts": []},  # not for 2m yet
                {"eval_time": "5m", "alertname": "MxcRdmaRetryBurst", "exp_alerts": [_alert(
                    {**port, "severity": "warning"}, "RDMA retry burst on a mlx5_0 port 1",
                    "10 retries/s (ACK timeouts, retransmits, sequence NAKs)")]},
                {"eval_time": "6m", "alertname": "MxcRdmaRetryExceeded", "exp_alerts": [_alert(
                    {**port, "severity": "critical"}, "RDMA retries exhausted on a mlx5_0 port 1",
                    "a queue pair ran out of retries: the collective on it fails")]},
                {"eval_time": "12m", "alertname": "MxcRdmaRetryExceeded", "exp_alerts": []},
            ],
        }],
    }
    (tmp_path / "rules_test.yml").write_text(yaml.safe_dump(tests, sort_keys=False))
    out = subprocess.run([PROMTOOL, "test", "rules", "rules_test.yml"], cwd=tmp_path, capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout + out.stderr


def test_the_runs_prometheus_delivers_a_stall_through_the_webhook(mxc: Mxc, mxc_home: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A real exporter reads a run whose training logged two steps and then nothing; the run's
    Prometheus evaluates the bundle's rules, the receiver keeps the alert and posts it to the webhook;
    a new step resolves it, and that is posted too."""
    bundle = build(mxc, mxc_home, "observability.ray=false", "observability.scrape_interval=1",
                   "observability.alerts.stall_after=3", "notify.format=slack", "notify.secret_env=CHAT_HOOK")
    contract = parse_contract((bundle / CONTRACT_FILE).read_text())
    run = RunDir(tmp_path / "20260101-000000-alerts")
    metrics = run.path / "metrics" / "attempt-0.rank-0.jsonl"
    metrics.parent.mkdir(parents=True)
    (run.path / "observability").mkdir()  # as on_start makes it
    metrics.write_text("".join(json.dumps({"step": float(s), "learning/loss": 5.0 - s,
                                           "perf/step_time_seconds": 0.5}) + "\n" for s in (0, 1)))
    with webhook_server.serve() as hook:
        monkeypatch.setenv("CHAT_HOOK", hook.url("/services/T0/B0/alerts"))
        for key, value in hook.allow().items():
            monkeypatch.setenv(key, value)
        observer = Observability(contract.observability, contract.name, bundle_dir=bundle)
        try:
            observer.start_services(run, bundle)
            assert not observer.errors, observer.errors
            receiver = observer.info["alerts"]["receiver"]
            forged = urllib.request.Request(receiver + "/api/v2/alerts", data=b"[]", method="POST")
            with pytest.raises(urllib.error.HTTPError) as refused:  # any local user reaches the port: not the chat
                urllib.request.urlopen(forged, timeout=10)
            assert refused.value.code == 401

            def posted(state: str) -> str | None:
                texts = [b["text"] for b in hook.bodies()]
                return next((t for t in texts if f"MxcTrainingStalled (warning) {state}" in t), None)

            fired = wait_for("the stall alert posted", lambda: posted("firing"))
            assert fired.startswith(f"mxc: run {run.run_id}: MxcTrainingStalled (warning) firing: training stalled "
                                    "on rank 0 (")
            assert "no new training step for 3s after step 1" in fired
            with open(metrics, "a") as fh:  # training goes on: the alert resolves
                fh.write(json.dumps({"step": 2.0, "learning/loss": 3.0, "perf/step_time_seconds": 0.5}) + "\n")
            wait_for("the resolution posted", lambda: posted("resolved"))
        finally:
            observer.stop()
    lines = [json.loads(line) for line in (run.path / "observability" / "alerts.jsonl").read_text().splitlines()]
    stall = [line for line in lines if line["alertname"] == "MxcTrainingStalled"]
    assert [line["state"] for line in stall][:2] == ["firing", "resolved"]
    assert all(line["sent"] == "sent (HTTP 200)" for line in stall), stall
    assert stall[0]["labels"]["rank"] == "0" and stall[0]["labels"]["run"] == run.run_id


def wait_for(what: str, check: Any) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.2)
    pytest.fail(f"{what}: not seen in {WAIT_S:.0f}s")
