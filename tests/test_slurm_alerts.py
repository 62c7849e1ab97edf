"""A Slurm job reports for itself (mxc/node/jobreport.py), on the 2-node test Slurm with the stand-in
trainer and a real webhook receiver on 127.0.0.1 (tests/webhook_server.py).

Nobody runs an mxc command while the job runs: its start, hang, restart, failure and finish alerts
come from the batch side, and its end lands in record.json by itself. Reads afterwards change
nothing (record.json's bytes, the posts), ``mxc watch`` does not alert twice, and the webhook secret
is in no file of the run directory and not in training's environment.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO, Mxc
from tests.slurm_cluster import SlurmCluster
from tests.slurm_jobs import build, run_dir, slurm_sets, submit, wait_for
from tests.test_slurm_node import job_env, standin_bin  # noqa: F401 (standin_bin: a fixture used here)
from tests.webhook_server import Hook, encodings, serve

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_env")]
HOOK_KEY = "h14jobalertsk3y0123456789"


def notify_spec(tmp_path: Path, notify: dict[str, Any]) -> str:
    """specs/tiny.yaml with a ``notify`` section (extends reaches only the spec's own directory)."""
    (tmp_path / "tiny.yaml").write_text((REPO / "specs" / "tiny.yaml").read_text())
    path = tmp_path / "alerting.yaml"
    path.write_text(yaml.safe_dump({"extends": "tiny.yaml", "notify": notify}))
    return str(path)


def texts(hook: Hook) -> list[str]:
    return [str(b["text"]) for b in hook.bodies()]


def alert(hook: Hook, fragment: str, what: str) -> str:
    return wait_for(lambda: next((t for t in texts(hook) if fragment in t), None), 240, what)


def assert_secret_nowhere(run: Path, secret: str) -> None:
    """Neither the webhook URL nor its key, in any encoding, in any file of the run directory."""
    forms = {f"{name} of the URL": text for name, text in encodings(secret).items()} | {"the key": HOOK_KEY}
    files = [p for p in run.rglob("*") if p.is_file()]
    assert files
    for path in files:
        data = path.read_bytes().decode("utf-8", errors="replace")
        for name, text in forms.items():
            assert text not in data, f"{name} in {path}"


def test_a_failed_run_alerts_and_records_its_end_with_nobody_reading_it(
        mxc: Mxc, mxc_home: Path, slurm_cluster: SlurmCluster, standin_bin: Path, tmp_path: Path) -> None:  # noqa: F811
    with serve() as hook:
        secret = hook.url("/hooks/" + HOOK_KEY)
        spec = notify_spec(tmp_path, {"format": "mattermost", "secret_env": "CHAT_HOOK"})
        bundle = build(mxc, *slurm_sets(slurm_cluster, nodes=1, **{"restart.max": 1}), spec=spec)
        env = job_env(standin_bin, "*=error", CHAT_HOOK=secret, MXCTEST_ENV_DUMP="1", **hook.allow())
        run_id = submit(mxc, bundle, env=env)
        run = run_dir(mxc_home, run_id)
        # From here on no mxc command runs until the failure alert is in: the job alone reports.
        failure = alert(hook, f"run {run_id}: failed", "the job's failure alert")
        record = json.loads(run.record.read_text())
        assert record["status"] == "failed" and record["ended"] and record["exit_code"] == 1, record
        assert "application_error" in record["message"] and "not requeued" in record["message"]
        end = json.loads((run.path / "end.json").read_text())
        assert (end["status"], end["cause"], end["rank"], end["node"], end["step"]) == \
            ("failed", "application_error", 0, "node1", 0)
        [start] = [t for t in texts(hook) if "started" in t]
        for text in (start, failure):
            assert run_id in text and "spec tiny" in text and f"bundle {bundle[:12]}" in text, text
        assert failure.splitlines()[0] == f"mxc: run {run_id}: failed, exit 1", failure  # as `mxc triage` starts
        assert "cause: application_error on rank 0 (node node1), step 0" in failure, failure
        assert "first error:" in failure and f"mxc triage {run_id}" in failure
        assert len(hook.posts) == 2 and {p["path"] for p in hook.posts} == {"/hooks/" + HOOK_KEY}

        # Reads are pure: record.json keeps its bytes, nothing is posted, notify.sent is unchanged.
        before, sent = run.record.read_bytes(), (run.path / "notify.sent").read_bytes()
        for read, code in ((("runs",), 0), (("runs", "--json"), 0), (("logs", run_id), 0), (("triage", run_id), None),
                           (("show", bundle[:12]), 0), (("wait", run_id, "--interval", "0.5"), 1)):
            out = mxc(*read, env=hook.allow())
            assert code is None or out.returncode == code, (read, out.stderr)
            assert run.record.read_bytes() == before, f"mxc {' '.join(read)} changed record.json"
        assert (run.path / "notify.sent").read_bytes() == sent and len(hook.posts) == 2

    # mxc watch saves the final record and alerts nothing the job already alerted (the same keys).
    with serve() as late:
        assert mxc("watch", "--once", run_id, env={"CHAT_HOOK": late.url("/hooks/" + HOOK_KEY), **late.allow()}
                   ).returncode == 0
        final = json.loads(run.record.read_text())
        assert final["final"] is True and final["status"] == "failed"
        assert late.posts == []

    dumps = sorted(run.path.glob("environment.attempt-*.rank-*.json"))
    assert dumps and all("CHAT_HOOK" not in json.loads(p.read_text()) for p in dumps)
    assert_secret_nowhere(run.path, secret)


def test_a_hang_is_alerted_by_the_job_and_run_wait_ends_with_the_run(
        mxc: Mxc, mxc_home: Path, slurm_cluster: SlurmCluster, standin_bin: Path, tmp_path: Path) -> None:  # noqa: F811
    """Attempt 0 hangs before its first step (runtime.hang.init_timeout 5 s): the job posts its hang
    alert, requeues, posts the restart and, when attempt 1 trains to the end, the finish; the secret
    comes from a file (mode 600), and `mxc run --wait` returns with the run, exit 0."""
    with serve() as hook:
        secret = hook.url("/hooks/" + HOOK_KEY)
        secret_file = tmp_path / "webhook"
        secret_file.write_text(secret + "\n")
        secret_file.chmod(0o600)
        spec = notify_spec(tmp_path, {"format": "mattermost", "secret_file": str(secret_file)})
        bundle = build(mxc, *slurm_sets(slurm_cluster, nodes=1, **{"runtime.hang.init_timeout": 5,
                                                                    "restart.max": 1}), spec=spec)
        out = mxc("run", "-y", "--wait", "--interval", "0.5", bundle,
                  env=job_env(standin_bin, "0:*=silent", MXCTEST_ENV_DUMP="1", **hook.allow()))
        assert out.returncode == 0, out.stderr
        run_id = out.stdout.strip().splitlines()[0]
        assert f"mxc: run {run_id} succeeded" in out.stderr
        finish = alert(hook, f"run {run_id}: succeeded", "the finish alert")
        hang = next(t for t in texts(hook) if f"run {run_id}: hung" in t)
        restart = next(t for t in texts(hook) if "restarting (restart 1 of at most 1) after hang" in t)
    assert "cause: hang on rank 0 (node node1), before the first step" in hang, hang
    assert "requeue: hang: restart 1 of at most 1" in hang, hang
    assert all(f"bundle {bundle[:12]}" in t for t in (hang, restart, finish))
    assert "3 steps" in finish and "last loss 4.8000" in finish, finish
    sent = texts(hook)
    assert len(sent) == 4 and all(f"run {run_id}" in t for t in sent)
    assert [sent.index(t) for t in (hang, restart, finish)] == [1, 2, 3] and "started" in sent[0]
    run = run_dir(mxc_home, run_id)
    record = json.loads(run.record.read_text())
    assert record["status"] == "succeeded" and record["ended"] and record["steps"] == 3
    assert_secret_nowhere(run.path, secret)
