"""Triage verdicts on saved failures (tests/fixtures/triage/<case>/, described in case.yaml).

Most fixtures are real failed runs provoked on this machine through `mxc run` (and a 2-node job
on the test Slurm cluster), trimmed; GPU-only failures are synthetic runs around error texts
from public issue trackers (case.yaml names the source).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from mxc.runtime.triage import classify
from tests.conftest import Mxc

FIXTURES = Path(__file__).parent / "fixtures" / "triage"
NAMES = sorted(d.name for d in FIXTURES.iterdir() if d.is_dir())


def expect(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((FIXTURES / name / "case.yaml").read_text())["expect"]
    return data


@pytest.mark.parametrize("name", NAMES)
def test_verdict(name: str) -> None:
    want = expect(name)
    verdict = classify(FIXTURES / name)
    assert verdict.cause == want["cause"], (verdict.title, [h.text for h in verdict.evidence])
    if "rank" in want:
        assert verdict.rank == want["rank"]
    if "node" in want:
        assert verdict.node == want["node"]
    if "status" in want:
        assert verdict.status == want["status"]
    if "first" in want:
        assert verdict.first_error is not None and want["first"] in verdict.first_error.text
    if "evidence" in want:
        assert any(want["evidence"] in h.text for h in verdict.evidence), [h.text for h in verdict.evidence]
    if "title" in want:
        assert verdict.title.startswith(want["title"]), verdict.title
    if "attempt" in want:
        assert verdict.attempt == want["attempt"]
    if "try_contains" in want:
        assert any(want["try_contains"] in t for t in verdict.try_), verdict.try_
    if "earlier_cause" in want:
        assert [e["cause"] for e in verdict.earlier] == [want["earlier_cause"]]
    if want.get("record_names_the_verdict"):  # the run's own summary (record.json) names triage's cause
        message = json.loads((FIXTURES / name / "record.json").read_text())["message"]
        assert verdict.summary() in message, (verdict.summary(), message)
    if "blame" in want:
        assert verdict.blame == want["blame"]
    if "crash_signal" in want:
        assert verdict.crash is not None and verdict.crash["signal"] == want["crash_signal"]
        assert verdict.crash["core"].startswith("cores/core.rank-")
        assert verdict.crash["native_frames"][0].startswith("Program terminated with signal")
    if verdict.cause not in ("none", "startup_failure"):
        assert verdict.try_, "every verdict says what to try"
        assert not any("{" in t for t in verdict.try_), verdict.try_
    json.dumps(verdict.as_dict())  # --json must always serialise


def test_first_failing_rank_is_not_rank_zero() -> None:
    """Rank 1 died first (SIGSEGV); rank 0's Gloo error and Slurm's cancellation are consequences."""
    verdict = classify(FIXTURES / "slurm_segv_rank1")
    assert (verdict.rank, verdict.node) == (1, "node2")
    seen = {(a["cause"], a["rank"], a["role"]) for a in verdict.also}
    assert ("collective_timeout", 0, "consequence") in seen
    assert ("step_cancelled", 0, "consequence") in seen
    ranks = {r["rank"]: r for r in verdict.ranks}
    assert ranks[1]["cause"] == "native_crash" and ranks[0]["node"] == "node1"


def test_handled_exceptions_are_not_the_cause() -> None:
    """Rank 0 prints an ImportError it handled ('During handling of the above exception') before
    its real error; neither may make rank 0 look like the first failure."""
    verdict = classify(FIXTURES / "slurm_kill_rank1")
    assert verdict.rank == 1
    assert not any(a["cause"] == "python_exception" and a["role"] == "cause" and "transformer_engine" in a["first"]
                   for a in verdict.also)


def test_the_python_stack_and_core_of_a_crash_are_shown() -> None:
    verdict = classify(FIXTURES / "native_crash_segv")
    assert verdict.python_stack[0].startswith("Current thread 0x")
    assert any("File " in line for line in verdict.python_stack[1:])
    assert verdict.crash is not None and verdict.crash["backtrace"] == "stacks/native.rank-0.attempt-0.txt"
    assert any(f.startswith("#") for f in verdict.crash["native_frames"][1:])


def test_a_hang_is_told_from_a_slow_stage() -> None:
    hang, slow = classify(FIXTURES / "hang"), classify(FIXTURES / "stage_timeout")
    assert hang.cause == "hang" and "no step for" in (hang.first_error.text if hang.first_error else "")
    assert slow.cause == "stage_timeout" and slow.title.endswith("(train)")
    assert any(a["cause"] == "stage_timeout" for a in hang.also)


def _install(home: Path, name: str) -> str:
    """Copy a fixture into $MXC_HOME/runs under its run id; returns the id."""
    src = FIXTURES / name
    record = src / "record.json"
    run_id = json.loads(record.read_text())["run_id"] if record.exists() else "20261123-095000-0000-00000000"
    shutil.copytree(src, home / "runs" / run_id)
    return run_id


def test_cli_triage_human_and_json(mxc: Mxc, mxc_home: Path) -> None:
    run_id = _install(mxc_home, "host_oom_cgroup")
    out = mxc("triage", run_id[:15])
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == f"run {run_id}: failed, exit 137"
    assert lines[1].startswith("cause: host (CPU) out of memory") and "[host_oom; blame: node]" in lines[1]
    assert "where: rank 0 on node vm" in out.stdout
    assert "Memory cgroup out of memory: Killed process" in out.stdout
    assert "try:" in out.stdout
    data = json.loads(mxc("triage", run_id, "--json").stdout)
    assert data["cause"] == "host_oom" and data["rank"] == 0 and data["node"] == "vm"
    assert data["first_error"]["source"].startswith(("ranks/0/kernel.0.log", "train.log"))


def test_cli_triage_defaults_to_the_latest_run_and_shows_the_crash(mxc: Mxc, mxc_home: Path) -> None:
    _install(mxc_home, "unknown_xla_flag")
    _install(mxc_home, "slurm_segv_rank1")  # the later run id
    out = mxc("triage", "-v")
    assert out.returncode == 0, out.stderr
    assert "where: rank 1 on node node2 (first failing rank of 2)" in out.stdout
    assert "core dump: cores/core.rank-1.attempt-0" in out.stdout
    assert "Program terminated with signal SIGSEGV" in out.stdout
    assert "Python stack of the crashing thread" in out.stdout
    assert "also seen:" in out.stdout and "ranks:" in out.stdout


def test_cli_triage_unknown_run_is_one_line(mxc: Mxc, mxc_home: Path) -> None:
    _install(mxc_home, "killed")
    out = mxc("triage", "nosuchrun")
    assert out.returncode == 2
    assert out.stderr.startswith("mxc: error: no run matches 'nosuchrun'") and len(out.stderr.splitlines()) == 1


def test_faulthandler_without_a_current_thread(tmp_path: Path) -> None:
    """A signal that lands on a thread without Python state (an XLA worker) marks no thread as
    current: the last listed thread (the oldest: main) is shown instead."""
    (tmp_path / "train.log").write_text(
        "I1123 10:00:00.000000 1 metric_logger.py:265] completed step: 3, seconds: 0.010, total_weights: 64, loss: 6.0\n"
        "Fatal Python error: Segmentation fault\n\n"
        "Thread 0x00007f0000000002 (most recent call first):\n"
        '  File "/venv/lib/python3.12/site-packages/orbax/checkpoint/future.py", line 430 in join\n\n'
        "Thread 0x00007f0000000001 (most recent call first):\n"
        '  File "/venv/lib/python3.12/site-packages/maxtext/common/metric_logger.py", line 357 in write_metrics_locally\n'
        '  File "/venv/lib/python3.12/site-packages/maxtext/trainers/pre_train/train.py", line 1402 in train_loop\n\n'
        "Extension modules: numpy._core._multiarray_umath (total: 1)\n"
    )
    verdict = classify(tmp_path)
    assert verdict.cause == "native_crash"
    assert verdict.python_stack[0] == "Thread 0x00007f0000000001 (most recent call first):"
    assert "write_metrics_locally" in verdict.python_stack[1]
