"""Alerts (mxc/runtime/notify.py, `mxc notify test`) against a real HTTP server on 127.0.0.1.

The webhook URL / bot token is a secret: it must never reach the bundle, the record, a log or
mxc's output, and a failed alert must never fail the run. The end-to-end tests train the tiny
model for real through the local backend with the notify observer plugged in.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from mxc.node.notify_policy import ALLOWED_URLS_ENV
from mxc.runtime import notify
from mxc.runtime.notify import NotifyConfig, send
from tests.check_support import STALE_FLAG_TOKEN, STALE_JAXLIB_FLAG
from tests.conftest import REPO, Mxc
from tests.gates import PASSED, PauseGate
from tests.webhook_server import Hook, encodings, serve

TINY = REPO / "specs" / "tiny.yaml"
TOKEN = "123456789:AAH-s3cr3t-T0ken-abcdefghijklmnopqrstu"


@pytest.fixture
def hook() -> Iterator[Hook]:
    with serve() as state:
        yield state


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---- formats and failure handling


def test_slack_and_mattermost_post_json_text_to_the_secret_url(hook: Hook) -> None:
    secret = hook.url("/hooks/abcdefghijklmnopqrstuvwxyz")
    for fmt in ("slack", "mattermost"):
        result = send(NotifyConfig(format=fmt, secret_env="CHAT_HOOK"), "hello", env={"CHAT_HOOK": secret, **hook.allow()})
        assert result.ok and result.status == 200, result
    slack, mattermost = hook.bodies()
    assert slack == {"text": "hello"}
    assert mattermost == {"text": "hello", "username": "mxc"}
    assert [p["path"] for p in hook.posts] == ["/hooks/abcdefghijklmnopqrstuvwxyz"] * 2
    assert hook.posts[0]["type"] == "application/json"


def test_telegram_uses_the_bot_api_with_the_token_from_a_file(hook: Hook, tmp_path: Path) -> None:
    token_file = tmp_path / "bot-token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    config = NotifyConfig(format="telegram", secret_file=str(token_file), chat_id="-1001234", api_url=hook.url(""))
    hook.reply = b'{"ok": true, "result": {}}'
    assert send(config, "training done", env=hook.allow()).ok
    assert hook.posts[0]["path"] == f"/bot{TOKEN}/sendMessage"
    assert hook.bodies()[0] == {"chat_id": "-1001234", "text": "training done", "disable_web_page_preview": True}
    hook.reply = b'{"ok": false, "description": "Bad Request: chat not found"}'
    result = send(config, "again", env=hook.allow())
    assert not result.ok and result.error == "Bad Request: chat not found"


@pytest.mark.parametrize("case", ["http500", "closed_port", "timeout", "missing_env", "missing_file", "not_a_url"])
def test_a_failed_alert_is_a_result_never_an_exception_and_never_shows_the_secret(hook: Hook, case: str,
                                                                                   tmp_path: Path) -> None:
    secret = hook.url("/hooks/zyxwvutsrqponmlkjihgfedcba")
    env = {"CHAT_HOOK": secret, **hook.allow()}
    config = NotifyConfig(format="slack", secret_env="CHAT_HOOK", timeout=0.5)
    if case == "http500":
        hook.status, hook.reply = 500, f"internal error for {secret}".encode()
    elif case == "closed_port":
        port = closed_port()
        env["CHAT_HOOK"] = secret = f"http://127.0.0.1:{port}/hooks/zyxwvutsrqponmlkjihgfedcba"
        env[ALLOWED_URLS_ENV] = f"http://127.0.0.1:{port}"
    elif case == "timeout":
        hook.hold = threading.Event()  # the server answers only after send() gave up: its timeout fired
    elif case == "missing_env":
        env = {}
    elif case == "missing_file":
        config = NotifyConfig(format="slack", secret_file=str(tmp_path / "nope"))
    elif case == "not_a_url":
        env["CHAT_HOOK"] = secret = "xoxb-not-a-url-0123456789"
    result = send(config, "hi", env=env)
    if hook.hold is not None:  # send gave up on its own: the server had not answered when it returned
        assert not hook.answered.is_set()
        assert hook.arrived.wait(60) and len(hook.posts) == 1
        hook.hold.set()
    assert not result.ok and result.error
    assert secret not in str(result) and "zyxwvutsrqponmlkjihgfedcba" not in str(result)
    if case == "http500":
        assert result.status == 500 and "***" in str(result)
    if case == "timeout":
        assert "timed out" in str(result)
    if case == "missing_env":
        assert str(result) == "failed: environment variable CHAT_HOOK (notify.secret_env) is not set"
    if case == "not_a_url":
        assert str(result) == "failed: the secret in $CHAT_HOOK was not sent: it is not a slack webhook URL " \
                              "(a plain http(s) URL)"
        assert not hook.posts


def test_each_event_is_sent_once(hook: Hook, tmp_path: Path) -> None:
    from mxc.runtime.record import RunRecord
    from mxc.runtime.rundir import RunDir

    run = RunDir(tmp_path / "20260101-000000-0000-00000000")
    run.path.mkdir()
    record = RunRecord(run_id=run.run_id, bundle="0" * 64, spec_name="t", backend="slurm", status="running",
                       started="2026-01-01T00:00:00Z")
    spec = {"name": "t", "notify": {"format": "slack", "secret_env": "CHAT_HOOK", "events": ["start", "finish"]}}
    os.environ["CHAT_HOOK"] = hook.url("/hooks/abcdefghijklmnopqrstuvwxyz")
    os.environ[ALLOWED_URLS_ENV] = hook.base
    try:
        notify.notify_transition(spec, run, None, record)
        notify.notify_transition(spec, run, None, record)  # a second refresh sees the same change
        done = record.model_copy(update={"status": "succeeded", "final": True, "ended": "2026-01-01T00:10:00Z"})
        notify.notify_transition(spec, run, record, done)
        failed = record.model_copy(update={"status": "failed", "final": True})
        notify.notify_transition(spec, run, record, failed)  # 'failure' is not in events, and the end went out
    finally:
        del os.environ["CHAT_HOOK"], os.environ[ALLOWED_URLS_ENV]
    texts = [b["text"] for b in hook.bodies()]
    assert len(texts) == 2 and "started on slurm" in texts[0] and "succeeded" in texts[1]
    assert (run.path / "notify.sent").read_text().split() == ["start", "end"]


# ---- the spec: names where the secret is, never holds it


def _spec(tmp_path: Path, extra: dict[str, Any]) -> Path:
    (tmp_path / "tiny.yaml").write_text(TINY.read_text())  # extends reaches only the spec's own directory
    data: dict[str, Any] = {"extends": "tiny.yaml", **extra}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("extra, message", [
    ({"env": {"vars": {"SLACK_URL": "https://hooks.slack.com/services/T0000/B0000/XXXXXXXXXXXXXXXXXXXXXXXX"}}},
     "env.vars: 'env.vars.SLACK_URL' looks like a Slack webhook URL"),
    ({"notify": {"format": "telegram", "secret_env": "BOT", "chat_id": "-100", "api_url": f"https://api.telegram.org/bot{TOKEN}"}},
     "looks like a Telegram"),
    ({"description": f"bot {TOKEN}"}, "description: 'description' looks like a Telegram bot token"),
    ({"code": {"maxtext_version": None, "repo": "https://user:hunter2pass@example.com/maxtext.git",
               "commit": "0" * 40}}, "looks like a URL with a password in it"),
    ({"notify": {"format": "slack", "secret_env": "MXC_SLACK"}}, "MXC_* variables belong to mxc itself"),
    ({"notify": {"format": "slack"}}, "name exactly one of notify.secret_env or notify.secret_file"),
    ({"notify": {"format": "slack", "secret_env": "A", "secret_file": "/x"}}, "name exactly one of"),
    ({"notify": {"format": "telegram", "secret_env": "BOT"}}, "chat_id: the telegram format needs notify.chat_id"),
    ({"notify": {"format": "slack", "url": "https://example.com"}}, "unknown key"),
])
def test_a_spec_holding_a_secret_or_a_bad_notify_section_is_refused(mxc: Mxc, mxc_home: Path, tmp_path: Path,
                                                                    extra: dict[str, Any], message: str) -> None:
    out = mxc("build", str(_spec(tmp_path, extra)))
    assert out.returncode == 2, out.stdout + out.stderr
    assert message in out.stderr
    assert "Traceback" not in out.stderr
    assert not (mxc_home / "bundles").exists() or not any((mxc_home / "bundles").iterdir())
    assert TOKEN not in out.stderr and "hunter2pass" not in out.stderr.replace("'code.repo'", "")


def test_notify_test_command(mxc: Mxc, hook: Hook, tmp_path: Path) -> None:
    secret = hook.url("/hooks/abcdefghijklmnopqrstuvwxyz")
    spec = _spec(tmp_path, {"notify": {"format": "mattermost", "secret_env": "CHAT_HOOK"}})
    out = mxc("notify", "test", "--spec", str(spec), env={"CHAT_HOOK": secret, **hook.allow()})
    assert out.returncode == 0, out.stderr
    assert "test alert sent (HTTP 200) to the mattermost webhook from $CHAT_HOOK" in out.stderr
    body = hook.bodies()[0]
    assert body["username"] == "mxc" and body["text"].startswith("mxc: test alert for spec tiny")
    assert secret not in out.stdout + out.stderr

    hook.status = 403
    out = mxc("notify", "test", "--spec", str(spec), "--json", env={"CHAT_HOOK": secret, **hook.allow()})
    assert out.returncode == 1
    data = json.loads(out.stdout)
    assert data["ok"] is False and data["status"] == 403 and data["secret_from"] == "$CHAT_HOOK"
    assert secret not in out.stdout + out.stderr

    out = mxc("notify", "test", "--spec", str(spec), env={"CHAT_HOOK": ""})
    assert out.returncode == 1 and "CHAT_HOOK (notify.secret_env) is not set" in out.stderr

    out = mxc("notify", "test", "--spec", str(TINY))
    assert out.returncode == 2 and out.stderr.startswith("mxc: error: ") and "has no notify section" in out.stderr


# ---- real runs: alerts from the supervisor, the secret nowhere


def _run_local(home: Path, spec_path: Path, env: dict[str, str]) -> tuple[Any, Path, Path, str]:
    """Build into ``home`` and run it as `mxc run` does (alerts come from the spec), in a subprocess
    (the supervisor installs signal handlers). Returns (record, run dir, bundle dir, its output)."""
    code = f"""
import json, sys
from mxc.build import compile_file
from mxc.store import Store
from mxc.runtime.backends import RunRequest
from mxc.runtime.local.backend import LocalBackend
from pathlib import Path
bundle = compile_file({str(spec_path)!r}, ())
store = Store(Path({str(home)!r}))
stored, _ = store.put(bundle.files, bundle.hash)
spec = stored.spec()
request = RunRequest(home=store.home, bundle=stored, spec=spec, quiet=True)
backend = LocalBackend()
record = backend.submit(request, backend.plan(request))
print(json.dumps({{"run": record.run_id, "bundle": str(stored.path)}}))
"""
    full_env = {**os.environ, "MXC_HOME": str(home), **env}
    full_env.setdefault("MXC_JAX_CACHE", str(home.parent / "jax-cache"))
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=full_env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    run = home / "runs" / out["run"]
    from mxc.runtime.record import RunRecord

    return RunRecord.load(run / "record.json"), run, Path(out["bundle"]), proc.stdout + proc.stderr


def _secret_nowhere(secrets: list[str], *places: Path, text: str = "") -> None:
    """No secret (nor its secret parts) in ``text`` or any file under ``places``, in any encoding a
    server or library could produce (tests/webhook_server.py encodings)."""
    forms = {f"{secret[:10]}... as {name}": form.encode() for secret in secrets
             for name, form in encodings(secret).items()}
    blobs = {"mxc's output": text.encode()}
    for place in places:
        files = [place] if place.is_file() else [p for p in place.rglob("*") if p.is_file()]
        blobs.update({str(f): f.read_bytes() for f in files})
    assert len(blobs) > 5
    leaks = [f"{what} in {where}" for where, blob in blobs.items() for what, form in forms.items()
             if form in blob or (what.endswith(("hex", "HEX")) and form.lower() in blob.lower())]
    assert leaks == []


def _webhook_secrets(url: str) -> list[str]:
    """The webhook URL and its parts that are secret on their own (the path, the key)."""
    path = url.split("://", 1)[1].split("/", 1)[1]
    return [url, "/" + path, path.rsplit("/", 1)[-1]]


LEAKY_ENV = {"TF_TOKEN_app_terraform_io": "abcdefghijklmnop.atlasv1.qrstuvwxyz0123456789",
             "TF_VAR_db_password": "hunter2hunter2", "HF_TOKEN": "hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567"}


@pytest.mark.training
def test_a_failing_run_alerts_start_and_failure_with_the_triage_cause(hook: Hook, mxc_home: Path, tmp_path: Path) -> None:
    """The webhook answers 400 echoing the request path in every encoding (so notify.log gets the echo, redacted);
    the environment holds other credentials too: none of it reaches the bundle, the run directory or the output.
    The secret's variable has a name no secret filter would guess (TEAM_ALERTS, as in docs/alerts.md): the
    supervisor sends the alerts itself, so the training never gets it (nor ranks/0/environment.json)."""
    secret = hook.url("/hooks/q7w3e9r1t5y2u8i4o6p0asdzxc")
    hook.echo, hook.status = "all", 400
    spec = _spec(tmp_path, {**STALE_JAXLIB_FLAG, "runtime": {"preflight": {"stale_processes": False}},
                            "notify": {"format": "slack", "secret_env": "TEAM_ALERTS"}})
    record, run, bundle, output = _run_local(mxc_home, spec, {"TEAM_ALERTS": secret, **hook.allow(), **LEAKY_ENV})
    assert record.status == "failed"
    texts = [b["text"] for b in hook.bodies()]
    assert len(texts) == 2, texts
    assert texts[0].startswith(f"mxc: run {record.run_id} (") and "started on local" in texts[0]
    assert f"run {record.run_id}" in texts[1] and "failed (exit 1)" in texts[1]
    assert "cause: unknown XLA flag on rank 0" in texts[1] and STALE_FLAG_TOKEN in texts[1]
    log = (run / "notify.log").read_text()
    assert "start: slack via $TEAM_ALERTS: failed: Bad Request: " in log and "failure: slack" in log
    assert "quote_plus: *** |" in log  # the echo was there, and redacted
    _secret_nowhere([*_webhook_secrets(secret), *LEAKY_ENV.values()], bundle, run, text=output)
    environment = json.loads((run / "record.json").read_text())["environment"]
    assert "TEAM_ALERTS" not in environment and not set(LEAKY_ENV) & set(environment)
    training_env = json.loads((run / "ranks" / "0" / "environment.json").read_text())  # what training started with
    assert "PATH" in json.dumps(training_env) and "TEAM_ALERTS" not in json.dumps(training_env)
    assert environment["MXC_RUN_DIR"] == str(run)


@pytest.mark.training
def test_a_dead_webhook_never_fails_a_run_and_restarts_are_alerted(hook: Hook, mxc_home: Path, tmp_path: Path) -> None:
    """The first attempt is killed at step 3 (SIGKILL) and restarts from checkpoint 0; the webhook
    answers 500 to everything: the run still succeeds, notify.log says why each alert failed."""
    secret = hook.url("/hooks/q7w3e9r1t5y2u8i4o6p0asdzxc")
    hook.status, hook.echo = 500, "all"
    spec = _spec(tmp_path, {"model": {"overrides": {"steps": 12, "learning_rate_schedule_steps": 12}},
                            "checkpoint": {"period": 5}, "restart": {"max": 1},
                            "runtime": {"preflight": {"stale_processes": False}}, "env": {"pass": list(PASSED)},
                            "notify": {"format": "slack", "secret_env": "CHAT_WEBHOOK_URL", "timeout": 2}})
    gate = PauseGate(tmp_path / "gate", {0: 3})  # attempt 0 waits after step 3 until it is killed
    gate.directory.mkdir()

    def kill_first_attempt() -> None:
        os.kill(gate.wait_paused(0)[0], signal.SIGKILL)

    killer = threading.Thread(target=kill_first_attempt, daemon=True)
    killer.start()
    record, run, bundle, output = _run_local(mxc_home, spec, {"CHAT_WEBHOOK_URL": secret, **hook.allow(), **gate.env()})
    killer.join(timeout=60)
    assert record.status == "succeeded" and record.restarts == 1, record.message
    texts = [b["text"] for b in hook.bodies()]
    words = [m[1] if (m := re.match(r"mxc: run \S+ \(tiny\) (\w+)", t)) else t for t in texts]
    assert words == ["started", "restarting", "succeeded"], texts
    assert "after exit 137 (SIGKILL)" in texts[1] and "resuming from checkpoint" in texts[1]
    log = (run / "notify.log").read_text().splitlines()
    assert len(log) == 3 and all("failed: Internal Server Error" in line and line.endswith("(HTTP 500)") for line in log), log
    _secret_nowhere(_webhook_secrets(secret), bundle, run, text=output)
