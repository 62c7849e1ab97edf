"""The secrets attack corpus (issue 12): alert exfiltration, echoed tokens, secrets in records,
secrets the scan missed. Each test reproduces an attack that worked on 704c317.

Webhooks are a real HTTP server on 127.0.0.1 (tests/webhook_server.py), reachable only through
the operator's ``$MXC_NOTIFY_ALLOWED_URLS``, never through the spec.
"""

from __future__ import annotations

import base64
import json
import os
import re
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from mxc.compiler.errors import SpecErrors
from mxc.compiler.pipeline import resolve_spec
from mxc.node import notify_policy
from mxc.node.notify_policy import ALLOWED_URLS_ENV
from mxc.node.secret_forms import Redactor
from mxc.node.secretscan import find_secrets, redact_secrets, secret_pair, secret_shape
from mxc.runtime import notify
from mxc.runtime.notify import NotifyConfig, send
from mxc.runtime.provenance.environment import recorded_environment
from mxc.runtime.record import RunRecord
from mxc.runtime.rundir import RunDir
from tests.check_support import CPU_SPEC, check, line_of, of_rule, spec
from tests.conftest import REPO, SPECS, Mxc
from tests.webhook_server import Hook, encodings, serve

TOKEN = "123456789:AAH-s3cr3t-T0ken-abcdefghijklmnopqrstu"
TOKEN_KEY = TOKEN.split(":", 1)[1]
HOOK_KEY = "zyxwvutsrqponmlkjihgfedcba"
HF = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz01234567"
PRIVATE_KEY = ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
               "-----END OPENSSH PRIVATE KEY-----\n")


@pytest.fixture
def hook() -> Iterator[Hook]:
    with serve() as state:
        yield state


def _leaks(text: str, *secrets: str) -> list[str]:
    """Which encodings of which secret occur in ``text`` (case-insensitively for the hex forms)."""
    found = []
    for secret in secrets:
        for name, form in encodings(secret).items():
            if form in text or (name.startswith("hex") and form.lower() in text.lower()):
                found.append(f"{secret[:12]}... as {name}")
    return found


def _secret_file(tmp_path: Path, content: str, mode: int = 0o600, name: str = "secret") -> Path:
    path = tmp_path / name
    path.write_text(content)
    path.chmod(mode)
    return path


# ---- 1. exfiltration: the spec chooses neither the destination nor an arbitrary credential


def test_a_spec_api_url_pointing_elsewhere_sends_nothing(hook: Hook) -> None:
    """notify.api_url: https://stranger + a bot token: the token would be in the request path."""
    config = NotifyConfig(format="telegram", secret_env="CHAT_BOT_TOKEN", chat_id="-100", api_url=hook.base)
    result = send(config, "hi", env={"CHAT_BOT_TOKEN": TOKEN})
    assert not result.ok and not hook.posts
    assert "is neither the official Telegram API" in str(result) and ALLOWED_URLS_ENV in str(result)
    # The operator, outside the spec, allows this server: then it is a destination.
    hook.reply = b'{"ok": true}'
    assert send(config, "hi", env={"CHAT_BOT_TOKEN": TOKEN, **hook.allow()}).ok
    assert hook.posts[0]["path"] == f"/bot{TOKEN}/sendMessage"


@pytest.mark.parametrize("fmt, value", [
    ("telegram", HF),  # notify.secret_env: HF_TOKEN
    ("slack", HF),
    ("mattermost", "https://user:hunter2pass@db.example.com/prod"),  # a DATABASE_URL
    ("telegram", "xoxb-123456789012-abcdefghijklmnopqrstuvwx"),
])
def test_a_credential_that_is_not_the_formats_secret_is_never_sent(hook: Hook, fmt: str, value: str) -> None:
    """Even past the schema (an old bundle), a value without the format's shape goes nowhere."""
    config = NotifyConfig(format=fmt, secret_env="CHAT_HOOK", chat_id="-100")
    result = send(config, "hi", env={"CHAT_HOOK": value, **hook.allow()})
    assert not result.ok and not hook.posts
    assert "was not sent" in str(result) or "not an allowed destination" in str(result)
    assert not _leaks(str(result), value) and "hunter2pass" not in str(result)


@pytest.mark.parametrize("url", [
    "https://hooks.slack.com@evil.example/services/T0/B0/XXXXXXXXXXXXXXXX",
    "https://hooks.slack.com.evil.example/services/T0/B0/XXXXXXXXXXXXXXXX",
    "https://evil.example/services/T0/B0/XXXXXXXXXXXXXXXX?next=https://hooks.slack.com/",
    "http://hooks.slack.com/services/T0/B0/XXXXXXXXXXXXXXXX",
    "https://hooks.slack.com:8443/services/T0/B0/XXXXXXXXXXXXXXXX",
    "https://hooks.slack.com/api/chat.postMessage",
    "https://hooks.slack.com/services/T0/B0/XXXX XXXX",
    "https://hooks.slack.com\\@evil.example/services/T0/B0/XXXXXXXXXXXXXXXX",
])
def test_slack_destinations_that_only_look_official_are_refused(url: str) -> None:
    assert notify_policy.destination_problem("slack", url, None)


def test_official_and_operator_destinations() -> None:
    assert notify_policy.destination_problem("slack", "https://hooks.slack.com/services/T0/B0/XXXXXXXXXXXX", None) is None
    assert notify_policy.destination_problem("telegram", f"https://api.telegram.org/bot{TOKEN}/sendMessage", None) is None
    assert notify_policy.destination_problem("mattermost", "https://chat.example.com/hooks/" + HOOK_KEY, None) is None
    assert notify_policy.destination_problem("mattermost", "https://chat.example.com/mm/hooks/" + HOOK_KEY, None) is None
    # Mattermost: https and the incoming-webhook path, or the operator's URL.
    for url in ("http://chat.example.com/hooks/" + HOOK_KEY, "https://db.example.com/prod",
                "https://chat.example.com/hooks/" + HOOK_KEY + "?x=1", "http://127.0.0.1:8065/hooks/" + HOOK_KEY):
        assert notify_policy.destination_problem("mattermost", url, None), url
    assert notify_policy.destination_problem("mattermost", "http://127.0.0.1:8065/hooks/" + HOOK_KEY,
                                             "http://127.0.0.1:8065") is None
    # An operator base allows its host and port, and its path at a segment boundary, nothing else.
    allowed = "https://alerts.example.com/relay http://127.0.0.1:8080"
    assert notify_policy.destination_problem("slack", "https://alerts.example.com/relay/x", allowed) is None
    assert notify_policy.destination_problem("slack", "http://127.0.0.1:8080/anything", allowed) is None
    for url in ("https://alerts.example.com/relayx", "https://alerts.example.com/other", "http://127.0.0.1:80800/x",
                "http://127.0.0.1:8080.evil.example/x", "https://alerts.example.com.evil.example/relay/x",
                "http://alerts.example.com/relay/x"):
        assert notify_policy.destination_problem("slack", url, allowed), url


@pytest.mark.parametrize("url", [
    "https://relay.example.com/team-a/../team-b",
    "https://relay.example.com/team-a/%2e%2e/team-b",
    "https://relay.example.com/team-a/%2E%2e/team-b",
    "https://relay.example.com/team-a/%252e%252e/team-b",  # encoded twice
    "https://relay.example.com/team-a%2f..%2fteam-b",  # the slash encoded
    "https://relay.example.com/team-a/..%5cteam-b",  # a backslash some servers take for a slash
    "https://relay.example.com/team-a/./../team-b",
])
def test_a_dot_segment_cannot_leave_the_operators_base(url: str) -> None:
    """The server resolves ``..``: a path that starts with the allowed base as text may leave it."""
    allowed = "https://relay.example.com/team-a"
    assert notify_policy.destination_problem("slack", "https://relay.example.com/team-a/x..y/z", allowed) is None
    problem = notify_policy.destination_problem("slack", url, allowed)
    assert problem is not None and ". or .. path segments" in problem
    assert notify_policy.destination_problem("mattermost", url.replace("team-b", "hooks/" + HOOK_KEY), None)
    assert notify_policy.api_url_problem(url, allowed)


@pytest.mark.parametrize("setting, message", [
    ("http://alerts.example.com", "plain http to another machine"),
    ("https://user:pw@alerts.example.com", "not a plain http(s) URL"),
    ("https://alerts.example.com/?q=1", "not a plain http(s) URL"),
    ("ftp://alerts.example.com", "not a plain http(s) URL"),
])
def test_a_bad_operator_setting_is_named(setting: str, message: str, hook: Hook) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        notify_policy.operator_bases(setting)
    result = send(NotifyConfig(format="slack", secret_env="CHAT_HOOK"), "hi",
                  env={"CHAT_HOOK": hook.url("/hooks/" + HOOK_KEY), ALLOWED_URLS_ENV: setting})
    assert not result.ok and ALLOWED_URLS_ENV in str(result) and not hook.posts
    assert "pw@" not in str(result)


def test_a_redirect_is_not_followed(hook: Hook) -> None:
    """An allowed server answering 307 to a stranger: the stranger gets nothing."""
    with serve() as stranger:
        hook.redirect = stranger.url("/collect")
        result = send(NotifyConfig(format="slack", secret_env="CHAT_HOOK"), "hi",
                      env={"CHAT_HOOK": hook.url("/hooks/" + HOOK_KEY), **hook.allow()})
        assert not result.ok and result.status == 307 and "not followed" in str(result)
        assert len(hook.posts) == 1 and not stranger.posts


@pytest.mark.parametrize("name", ["HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN", "WANDB_API_KEY", "MXC_HOOK"])
def test_secret_env_must_name_a_chat_secret(name: str) -> None:
    data = spec(CPU_SPEC, notify={"format": "slack", "secret_env": name})
    with pytest.raises(SpecErrors) as err:
        _validate(data)
    (line,) = str(err.value).splitlines()
    assert "notify.secret_env" in line and name in line
    assert ("MXC_* variables belong to mxc" if name.startswith("MXC_") else "does not say it holds a chat secret") in line
    for ok in ("CHAT_WEBHOOK_URL", "SLACK_WEBHOOK", "TELEGRAM_BOT_TOKEN", "MATTERMOST_URL", "TEAM_ALERTS"):
        _validate(spec(CPU_SPEC, notify={"format": "slack", "secret_env": ok}))


def test_secret_file_must_be_a_private_regular_file_of_the_user(hook: Hook, tmp_path: Path) -> None:
    """secret_file: ~/.ssh/id_rsa, /etc/shadow, a FIFO, /dev/zero: refused, each with one clear reason."""
    url = hook.url("/hooks/" + HOOK_KEY)

    def outcome(path: Path | str, fmt: str = "slack") -> str:
        config = NotifyConfig(format=fmt, secret_file=str(path), chat_id="-100")
        result = send(config, "hi", env=hook.allow())
        assert not result.ok and not hook.posts
        return str(result)

    assert "chmod 600" in outcome(_secret_file(tmp_path, url, 0o644, "world"))
    assert "mode 640" in outcome(_secret_file(tmp_path, url, 0o640, "group"))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    assert "is not a regular file" in outcome(fifo)  # returns at once: opened without blocking
    assert "is not a regular file" in outcome(tmp_path)
    assert "is not a regular file" in outcome("/dev/zero")
    foreign = _secret_file(tmp_path, url, 0o600, "foreign")
    if os.getuid() == 0:
        os.chown(foreign, 65534, 65534)
    else:
        foreign = Path("/etc/hostname")
    assert "is not owned by you" in outcome(foreign)
    assert "larger than 4096 bytes" in outcome(_secret_file(tmp_path, "x" * 5000, 0o600, "big"))
    # A private key is a private regular file: it is refused for not being a bot token, and not shown.
    key = _secret_file(tmp_path, PRIVATE_KEY, 0o600, "id_rsa")
    message = outcome(key, "telegram")
    assert "is not a Telegram bot token" in message and "b3BlbnNzaC1r" not in message
    # The right file, through a symlink, is fine.
    good = _secret_file(tmp_path, url + "\n", 0o600, "webhook")
    (tmp_path / "link").symlink_to(good)
    assert send(NotifyConfig(format="slack", secret_file=str(tmp_path / "link")), "hi", env=hook.allow()).ok


def test_mxc_check_reports_an_api_url_that_is_not_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ALLOWED_URLS_ENV, raising=False)
    data = spec(CPU_SPEC, notify={"format": "telegram", "secret_env": "CHAT_BOT", "chat_id": "-100",
                                  "api_url": "https://collector.example.net"})
    findings, text = check(data)
    (finding,) = of_rule(findings, "notify-destination")
    assert finding.severity == "error" and finding.key == "notify.api_url" and finding.line == line_of(text, "api_url")
    assert "neither the official Telegram API" in finding.message and ALLOWED_URLS_ENV in finding.suggestion
    monkeypatch.setenv(ALLOWED_URLS_ENV, "https://collector.example.net")
    assert not of_rule(check(data)[0], "notify-destination")
    monkeypatch.setenv(ALLOWED_URLS_ENV, "http://collector.example.net")
    (bad,) = of_rule(check(data)[0], "notify-destination")
    assert "plain http to another machine" in bad.message


# ---- 2. redaction: a server that echoes the request path, in every encoding


@pytest.mark.parametrize("fmt, where", [
    *((fmt, where) for fmt in ("slack", "mattermost", "telegram") for where in ("error-body", "reason")),
    ("telegram", "telegram-description"),  # a 200 with {"ok": false, "description": ...}
])
def test_an_echoed_secret_is_redacted_in_every_encoding(hook: Hook, fmt: str, where: str) -> None:
    """The server answers with the request path in one encoding at a time (so no shortening hides one)."""
    hook.status = 200 if where == "telegram-description" else 400
    hook.echo_in_reason = where == "reason"
    secret = TOKEN if fmt == "telegram" else hook.url(f"/hooks/{HOOK_KEY}?channel=ops-alerts-secret")
    parts = [TOKEN, TOKEN_KEY] if fmt == "telegram" else [secret, HOOK_KEY, f"/hooks/{HOOK_KEY}?channel=ops-alerts-secret"]
    config = NotifyConfig(format=fmt, secret_env="CHAT_HOOK", chat_id="-100", api_url=hook.base)
    leaks = {}
    for form in encodings("x"):
        hook.echo = form
        result = send(config, "hi", env={"CHAT_HOOK": secret, **hook.allow()})
        text = str(result) + json.dumps(result.__dict__)
        assert not result.ok and "***" in text, (form, text)
        if _leaks(text, *parts):
            leaks[form] = _leaks(text, *parts)
    assert len(hook.posts) == len(encodings("x"))
    assert leaks == {}


def test_redaction_reaches_notify_log_and_the_cli(hook: Hook, tmp_path: Path, mxc: Mxc) -> None:
    hook.echo, hook.status = "all", 403
    secret = hook.url(f"/hooks/{HOOK_KEY}")
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec(CPU_SPEC, notify={"format": "mattermost", "secret_env": "CHAT_HOOK"})))
    for args in (("notify", "test", "--spec", str(spec_path)), ("notify", "test", "--spec", str(spec_path), "--json")):
        out = mxc(*args, env={"CHAT_HOOK": secret, **hook.allow()})
        assert out.returncode == 1 and "***" in out.stdout + out.stderr
        assert not _leaks(out.stdout + out.stderr, secret, HOOK_KEY, f"/hooks/{HOOK_KEY}")
    run = RunDir(tmp_path / "20260101-000000-0000-00000000")
    run.path.mkdir()
    record = RunRecord(run_id=run.run_id, bundle="0" * 64, spec_name="t", backend="slurm", status="running",
                       started="2026-01-01T00:00:00Z")
    config = NotifyConfig(format="mattermost", secret_env="CHAT_HOOK")
    notify.deliver(config, "start", run, record, env={"CHAT_HOOK": secret, **hook.allow()})
    log = (run.path / "notify.log").read_text()
    assert "start: mattermost via $CHAT_HOOK: failed: Forbidden: " in log and "quote_plus: *** |" in log
    assert not _leaks(log, secret, HOOK_KEY, f"/hooks/{HOOK_KEY}")


def test_an_alert_text_never_carries_a_secret(hook: Hook, tmp_path: Path) -> None:
    """A failure message quoting a token (e.g. from a training log) is redacted before it is posted."""
    run = RunDir(tmp_path / "20260101-000000-0000-00000000")
    run.path.mkdir()
    record = RunRecord(run_id=run.run_id, bundle="0" * 64, spec_name="t", backend="local", status="failed",
                       final=True, started="2026-01-01T00:00:00Z", ended="2026-01-01T00:01:00Z",
                       message=f"401 for token {HF} at https://u:hunter2pass@hub.example.com/x")
    config = NotifyConfig(format="slack", secret_env="CHAT_HOOK")
    result = notify.deliver(config, "failure", run, record, env={"CHAT_HOOK": hook.url("/hooks/" + HOOK_KEY),
                                                                 **hook.allow()})
    assert result is not None and result.ok
    text = hook.bodies()[0]["text"]
    assert "401 for token *** at https://u:***@hub.example.com/x" in text
    assert HF not in text and "hunter2pass" not in text


# ---- 3. the recorded environment: exact names, never a prefix, no secret values


def test_record_keeps_an_allow_list_of_names_and_no_secret() -> None:
    env = {
        "TF_TOKEN_app_terraform_io": "abcdefghijklmnop.atlasv1.qrstuvwxyz0123456789",
        "TF_VAR_db_password": "hunter2hunter2",
        "HF_TOKEN": HF, "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "GITHUB_TOKEN": "x" * 40,
        "JAX_COORDINATOR_PASSWORD": "p4ssw0rd-not-real", "NCCL_SECRET_SAUCE": "1", "CHAT_WEBHOOK_URL": "https://x/hooks/y",
        "NCCL_DEBUG": "WARN", "NCCL_SOCKET_IFNAME": "eth0", "XLA_FLAGS": "--xla_dump_to=/tmp/x",
        "MXC_RUN_DIR": "/runs/r1", "PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "2",
        "NCCL_DEBUG_FILE": f"/logs/{HF}.txt", "MY_TUNING": "4", "MY_API_TOKEN": "abcdefgh12345678",
        "HOME": "/root", "SSH_AUTH_SOCK": "/tmp/ssh-agent",
    }
    spec_data = {"env": {"vars": {"MY_TUNING": 4, "MY_API_TOKEN": "x"}},
                 "notify": {"format": "slack", "secret_env": "CHAT_WEBHOOK_URL"}}
    recorded = recorded_environment(env, spec_data)
    assert recorded == {
        "MXC_RUN_DIR": "/runs/r1", "MY_TUNING": "4", "NCCL_DEBUG": "WARN", "NCCL_DEBUG_FILE": "/logs/***.txt",
        "NCCL_SOCKET_IFNAME": "eth0", "PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "2",
        "XLA_FLAGS": "--xla_dump_to=/tmp/x",
    }


def test_slurm_record_environment_and_exports_hold_no_secret(mxc_home: Path, monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    from mxc.build import compile_file
    from mxc.runtime.backends import RunRequest
    from mxc.runtime.slurm import backend as slurm_backend
    from mxc.runtime.slurm import query as slurm_query
    from mxc.store import Store

    spec_path = tmp_path / "slurm.yaml"
    spec_path.write_text(yaml.safe_dump(spec(CPU_SPEC, runtime={"backend": "slurm", "container": "native"})))
    bundle = compile_file(str(spec_path))
    stored, _ = Store(mxc_home).put(bundle.files, bundle.hash)
    request = RunRequest(home=mxc_home, bundle=stored, spec=stored.spec(), quiet=True)
    submitted: list[list[str]] = []

    def submit(argv: list[str]) -> str:
        submitted.append(list(argv))
        return "4242"

    monkeypatch.setattr(slurm_query, "require", lambda command: command)  # sbatch itself: tests/test_slurm_run.py
    monkeypatch.setattr(slurm_query, "submit", submit)
    monkeypatch.setenv("TF_TOKEN_app_terraform_io", "abcdefghijklmnop.atlasv1.qrstuvwxyz0123456789")
    monkeypatch.setenv("TF_VAR_db_password", "hunter2hunter2")
    cache = f"/scratch/cache-{HF}"
    monkeypatch.setenv("MXC_JAX_CACHE", cache)
    backend = slurm_backend.SlurmBackend()
    record = backend.submit(request, backend.plan(request))
    assert submitted and any(cache in arg for arg in submitted[0])  # the job itself gets the real value
    saved = (mxc_home / "runs" / record.run_id / "record.json").read_text()
    data = json.loads(saved)
    assert data["slurm"]["exports"]["MXC_JAX_CACHE"] == "/scratch/cache-***"
    assert data["environment"]["MXC_JAX_CACHE"] == "/scratch/cache-***"
    assert not any(k.startswith("TF_") for k in data["environment"])
    for leaked in (HF, "hunter2hunter2", "atlasv1"):
        assert leaked not in saved


# ---- 4. the secret scan: known token shapes, and never an ordinary value


SECRETS = {
    "Hugging Face": HF,
    "AWS access key": "AKIAIOSFODNN7EXAMPLE",
    "AWS session key": "ASIAY34FZKBOKMUTVV7A",
    "AWS secret in text": "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "W&B key in text": "WANDB_API_KEY=" + "0123456789abcdef" * 2 + "01234567",
    "OpenAI": "sk-" + "Ab1" * 16,
    "OpenAI project": "sk-proj-" + "Zx9_" * 20,
    "Anthropic": "sk-ant-api03-" + "Qw3-" * 20,
    "Google API": "AIza" + "SyD-" * 8 + "abc",
    "GitLab": "glpat-" + "xY7z" * 5,
    "npm": "npm_" + "a1B2" * 9,
    "PyPI": "pypi-AgEIcHlwaS5vcmc" + "CJ" * 20,
    "JWT": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "private key": "-----BEGIN RSA PRIVATE KEY-----",
    "OpenSSH private key": PRIVATE_KEY,
    "Azure connection string": "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=" + "Zm9v" * 10 + "==;",
    "password in a URL query": "https://db.example.com/x?user=me&password=hunter2hunter2",
    "SAS signature": "https://acct.blob.core.windows.net/c/b?sv=2022-11-02&sig=abcDEF123456%2Bxyz%3D",
    "password in a URL": "https://me:hunter2@example.com/repo.git",
    "GitHub": "ghp_" + "A1b2" * 9,
    "Slack webhook": "https://hooks.slack.com/services/T000/B000/" + "X" * 24,
    "Telegram": TOKEN,
}


@pytest.mark.parametrize("name", SECRETS)
def test_the_scan_finds_each_kind_of_secret_and_redaction_removes_it(name: str) -> None:
    value = SECRETS[name]
    assert secret_shape(f"before {value} after"), name
    redacted = redact_secrets(f"before {value} after")
    assert "***" in redacted and redacted.startswith("before ") and redacted.rstrip().endswith("after")
    assert secret_shape(redacted) is None, redacted


@pytest.mark.parametrize("key, value", [
    ("WANDB_API_KEY", "0123456789abcdef0123456789abcdef01234567"),
    ("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
    ("hf_access_token", "sometokenvalue123"),
    ("DB_PASSWORD", "hunter2hunter2"),
])
def test_a_value_under_a_secret_name_is_a_secret(key: str, value: str) -> None:
    assert secret_pair(key, value)
    data = spec(CPU_SPEC, env={"vars": {key: value}}) if key.isupper() else \
        spec(CPU_SPEC, model__overrides__hf_access_token=value)
    with pytest.raises(SpecErrors) as err:
        _validate(data)
    assert "a spec must not hold secrets" in str(err.value) and value not in str(err.value)


def _strings(data: Any, key: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(data, dict):
        for k, v in data.items():
            yield "", str(k)  # a key is judged by its shape alone (as find_secrets does)
            yield from _strings(v, str(k))
    elif isinstance(data, list):
        for v in data:
            yield from _strings(v, key)
    elif data is not None:
        yield key, str(data)


def _ordinary_values() -> list[tuple[str, str]]:
    """Every key and value of the shipped specs, MaxText's own configs and mxc's catalogs."""
    import importlib.util

    found = importlib.util.find_spec("maxtext")
    assert found is not None and found.submodule_search_locations
    files = [*SPECS.rglob("*.yaml"), *SPECS.rglob("*.yml")]
    files += sorted((Path(next(iter(found.submodule_search_locations))) / "configs").rglob("*.yml"))
    pairs: list[tuple[str, str]] = []
    for path in files:
        for doc in yaml.safe_load_all(path.read_text()):
            pairs += _strings(doc)
    for name in ("env_vars.json", "maxtext_models.json", "maxtext/maxtext-0.2.5.json"):
        pairs += _strings(json.loads((REPO / "mxc" / "compiler" / "data" / name).read_text()))
    return pairs


ORDINARY = [
    ("commit", "b" * 40), ("commit", "3d817af0c2f5e1d8a4b7c9e0f1a2b3c4d5e6f708"), ("digest", "sha256:" + "a" * 64),
    ("repo", "https://github.com/AI-Hypercomputer/maxtext.git"), ("ref", "docker.io/rocm/jax-training:maxtext-v25.9"),
    ("tokenizer_path", "assets/tokenizer.llama2"), ("hf_access_token", ""), ("base_output_directory", "gs://bkt/runs"),
    ("NCCL_IB_HCA", "mlx5_0:1,mlx5_1:1"), ("secret_env", "CHAT_WEBHOOK_URL"), ("secret_file", "~/.config/mxc/webhook"),
    ("description", "rotate the password weekly; token budget 4096"), ("TOKENIZERS_PARALLELISM", "false"),
    ("dataset_path", "https://storage.example.com/data?shard=00001&split=train"), ("HF_TOKEN", "$HF_TOKEN"),
    ("api_url", "https://api.telegram.org"), ("run_name", "sk-learn-baseline"), ("model", "eyJ-like-but-not"),
    ("reasoning_start_token", "<reasoning>"), ("pad_token", "[PAD]"), ("eos_token", "</s>"),
    ("max_num_batched_tokens", "8192"), ("GOOGLE_APPLICATION_CREDENTIALS", "/etc/gcp/sa.json"),
]


def test_no_ordinary_value_looks_like_a_secret() -> None:
    pairs = _ordinary_values()
    assert len(pairs) > 5000  # the corpus really was read
    flagged = [(k, v[:60]) for k, v in [*pairs, *ORDINARY] if secret_pair(k, v) or redact_secrets(v) != v]
    assert flagged == []


def test_no_shipped_spec_is_taken_for_a_secret() -> None:
    for path in sorted(SPECS.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        assert find_secrets(doc) == [], path


# ---- 5. a real run with alerts: the secret in no file of the bundle or the run, in any encoding
# (the end-to-end run is tests/test_notify.py::test_a_failing_run_alerts_start_and_failure_with_the_triage_cause)


def _validate(data: dict[str, Any]) -> None:
    text = yaml.safe_dump(data).encode()
    resolve_spec("spec.yaml", lambda _path: text)


def test_url_quoting_forms_of_a_webhook_are_all_redacted() -> None:
    secret = f"https://mm.example.com/hooks/{HOOK_KEY}"
    text = " | ".join(encodings(secret).values()) + " | " + urllib.parse.quote(HOOK_KEY.upper())
    redacted = notify.redact(text, secret, "mattermost")
    assert not _leaks(redacted, secret, HOOK_KEY, f"/hooks/{HOOK_KEY}")
    assert notify.redact("nothing secret here: hooks, services, sendMessage", secret) == \
        "nothing secret here: hooks, services, sendMessage"


# ---- 6. a secret the spec passes to the training (issue 25): MaxText's TensorBoard config dump


def _events(path: Path) -> list[Any]:
    """Every event of a TensorBoard file, read by TensorBoard's own loader (which checks each record's CRC)."""
    from tensorboard.backend.event_processing.event_file_loader import (  # type: ignore[import-untyped]
        LegacyEventFileLoader,
    )

    return list(LegacyEventFileLoader(str(path)).Load())


def test_a_secret_in_an_event_file_is_masked_and_the_file_stays_valid(tmp_path: Path) -> None:
    """What MaxText's add_config_to_summary_writer writes (tensorboardX's text summaries), masked in place:
    the token is gone in every form, every record still passes TensorBoard's CRC check, the other
    summaries are untouched, and records appended later are scrubbed on the next look."""
    from tensorboardX.event_file_writer import EventsWriter  # type: ignore[import-untyped]
    from tensorboardX.proto.event_pb2 import Event  # type: ignore[import-untyped]
    from tensorboardX.summary import scalar, text  # type: ignore[import-untyped]

    from mxc.node.eventscrub import EventScrubber, crc32c

    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value (RFC 3720, B.4)
    # add_text/add_scalar make these summaries and hand them to a thread that writes them with an
    # EventsWriter; written here directly, every record is in the file when write_event returns
    (tmp_path / "tensorboard" / "run").mkdir(parents=True)
    writer = EventsWriter(str(tmp_path / "tensorboard" / "run" / "events"))
    for summary in (text("hf_access_token", HF), text("base_emb_dim", "64"), scalar("learning/loss", 6.25)):
        writer.write_event(Event(summary=summary, step=0))
    writer.flush()
    [path] = (tmp_path / "tensorboard").rglob("*tfevents*")
    size = path.stat().st_size
    scrubber = EventScrubber(tmp_path / "tensorboard", [HF])
    assert scrubber.scan() == 1 and path.stat().st_size == size
    writer.write_event(Event(summary=text("hub_token_copy", f"Bearer {base64.b64encode(HF.encode()).decode()}"), step=0))
    writer.close()
    assert scrubber.scan() == 1 and scrubber.scan() == 0
    data = path.read_bytes().decode("latin-1")
    pattern = Redactor(HF).pattern
    assert pattern is not None and pattern.search(data) is None and not _leaks(data, HF)
    texts = {v.tag: v.tensor.string_val[0].decode() for e in _events(path) for v in e.summary.value if v.tensor.string_val}
    assert texts["hf_access_token/text_summary"] == "*" * len(HF) and texts["base_emb_dim/text_summary"] == "64"
    losses = [v.simple_value for e in _events(path) for v in e.summary.value if v.tag == "learning/loss"]
    assert losses == [6.25]


def _files_holding(run: Path, secret: str) -> list[str]:
    """Every file of a run directory with ``secret`` in any form secret_forms knows (and tests/webhook_server's)."""
    pattern = Redactor(secret).pattern
    assert pattern is not None
    found = []
    for path in sorted(p for p in run.rglob("*") if p.is_file() and not p.is_symlink()):
        text = path.read_bytes().decode("latin-1")
        if pattern.search(text) or _leaks(text, secret):
            found.append(str(path.relative_to(run)))
    return found


@pytest.mark.training
@pytest.mark.parametrize("passed", [False, True], ids=["in-the-shell", "passed"])
def test_an_hf_token_in_no_file_of_a_succeeding_run(passed: bool, mxc: Mxc, mxc_home: Path) -> None:
    """The token in the caller's shell: on c388a5b it reached the training unasked, MaxText read it
    into hf_access_token and its config dump put it in the clear in the run's TensorBoard file (0644,
    served by `mxc dashboard`). Now, unpassed, it does not reach MaxText; passed (env.pass: [HF_TOKEN]),
    MaxText reads it (the dump holds as many characters, masked). Either way the run succeeds and no
    file of the run (event files, logs, record, metrics, checkpoints) holds it in any encoding."""
    sets = ["model.overrides.steps=3", "checkpoint.period=2", "runtime.preflight.stale_processes=false"]
    sets += ["env.pass=[HF_TOKEN]"] if passed else []
    out = mxc("build", "-q", str(SPECS / "tiny.yaml"), *(a for s in sets for a in ("--set", s)))
    assert out.returncode == 0, out.stderr
    out = mxc("run", "-q", out.stdout.strip(), env={"HF_TOKEN": HF})
    assert out.returncode == 0, out.stderr
    run = mxc_home / "runs" / out.stdout.strip()
    assert list((run / "output").rglob("checkpoints/*")), "the run kept no checkpoint to search"
    assert _files_holding(run, HF) == []
    record = RunRecord.load(run / "record.json")
    assert record.status == "succeeded" and (record.training or {}).get("passed") == (["HF_TOKEN"] if passed else [])
    [events] = (run / "output").rglob("*tfevents*")
    texts = {v.tag: v.tensor.string_val[0].decode() for e in _events(events) for v in e.summary.value
             if v.tensor.string_val}
    # passed: MaxText had it and the file does not; in the shell only: MaxText never saw it
    assert texts["hf_access_token/text_summary"] == ("*" * len(HF) if passed else "None")
