"""The batch side's own report (mxc/node/jobreport.py), without Slurm: a failed alert never fails
the job, the end reaches record.json (never a final one), the secret's variable is kept from the
ranks, and nothing written holds the secret. (End to end on Slurm: tests/test_slurm_alerts.py.)"""

from __future__ import annotations

import dataclasses
import json
import socket
from pathlib import Path

from mxc.node import jobreport
from mxc.node.contract import Notify, RunContract, parse
from tests.conftest import REPO
from tests.webhook_server import serve

KEY = "jobreportunitk3y0123456789"


def contract(secret_env: str | None = "CHAT_HOOK", secret_file: str | None = None) -> RunContract:
    base = parse((REPO / "tests" / "golden" / "tiny" / "run.json").read_text())
    return dataclasses.replace(base, notify=Notify(format="mattermost", secret_env=secret_env, secret_file=secret_file,
                                                   chat_id=None, api_url="https://api.telegram.org",
                                                   events=["start", "finish", "failure", "hang", "restart"],
                                                   timeout_s=2.0))


def run_dir(tmp_path: Path, **fields: object) -> Path:
    run = tmp_path / "runs" / "20990101-000000-aaaa-12345678"
    run.mkdir(parents=True)
    record = {"run_id": run.name, "bundle": "1" * 64, "spec_name": "tiny", "backend": "slurm", "status": "running",
              "final": False, "started": "2099-01-01T00:00:00.000Z", **fields}
    (run / "record.json").write_text(json.dumps(record, indent=2) + "\n")
    return run


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_dead_webhook_never_fails_the_end_and_the_record_says_it_ended(tmp_path: Path) -> None:
    run = run_dir(tmp_path)
    port = closed_port()
    secret = f"http://127.0.0.1:{port}/hooks/{KEY}"
    env = {"CHAT_HOOK": secret, "MXC_NOTIFY_ALLOWED_URLS": f"http://127.0.0.1:{port}", "MXC_RUN_ID": run.name,
           "KEEP": "1"}
    report = jobreport.JobReport(run, tmp_path / ("b" * 64), contract(), env, "42", 0)
    assert report.rank_env(env) == {k: v for k, v in env.items() if k != "CHAT_HOOK"}
    report.started("node1")
    report.ended("failed", 1, "application_error (rank 0 on node1): boom; not requeued", cause="application_error",
                 rank=0, node="node1", detail=f"ValueError: boom (could not post to {secret})", step=4)
    record = json.loads((run / "record.json").read_text())
    assert (record["status"], record["exit_code"], record["final"]) == ("failed", 1, False)
    assert record["ended"].endswith("Z") and record["message"].startswith("application_error")
    end = json.loads((run / "end.json").read_text())
    assert (end["cause"], end["node"], end["step"]) == ("application_error", "node1", 4)
    assert end["detail"] == "ValueError: boom (could not post to ***)"  # the job's own secret, redacted
    log = (run / "notify.log").read_text()
    assert "start: mattermost via $CHAT_HOOK: failed: " in log and "failure: mattermost via $CHAT_HOOK: failed: " in log
    assert (run / "notify.sent").read_text().split() == ["start", "end"]
    for path in run.iterdir():
        assert KEY not in path.read_text(), path


def test_a_final_record_is_left_alone_and_an_unsafe_secret_file_is_not_read(tmp_path: Path) -> None:
    run = run_dir(tmp_path, status="cancelled", final=True, ended="2099-01-01T00:01:00.000Z")
    before = (run / "record.json").read_bytes()
    secret_file = tmp_path / "webhook"
    with serve() as hook:
        secret_file.write_text(hook.url("/hooks/" + KEY))
        secret_file.chmod(0o644)
        report = jobreport.JobReport(run, tmp_path / ("b" * 64), contract(None, str(secret_file)),
                                     {"MXC_RUN_ID": run.name, **hook.allow()}, "42", 0)
        report.ended("succeeded", 0, "")
        assert hook.posts == []
    assert (run / "record.json").read_bytes() == before
    assert f"chmod 600 {secret_file}" in (run / "notify.log").read_text()
    secret_file.chmod(0o600)
    with serve() as hook:
        secret_file.write_text(hook.url("/hooks/" + KEY))
        report = jobreport.JobReport(run, tmp_path / ("b" * 64), contract(None, str(secret_file)),
                                     {"MXC_RUN_ID": run.name, **hook.allow()}, "42", 1)
        report.hung(0, "node1", None, "no output for 5s", "requeue", "hang: restart 2 of at most 2")
        report.hung(0, "node1", None, "no output for 5s", "requeue", "hang: restart 2 of at most 2")  # once per attempt
        [text] = [b["text"] for b in hook.bodies()]
    assert text.startswith(f"mxc: run {run.name}: hung, attempt 2\n") and "bundle bbbbbbbbbbbb" in text
    assert "cause: hang on rank 0 (node node1), before the first step" in text
