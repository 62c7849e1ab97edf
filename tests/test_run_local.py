"""`mxc run` / `mxc rerun` with real MaxText on CPU: records, replay, restart, cancellation.

One straight-through run of the tiny model is shared by the module (CPU is scarce); the
rerun, the SIGKILL restart and the cancellations each start one more short training.
The bundle is the tiny spec with a larger batch and checkpoints every 5 steps; a training is
broken mid-run while it waits at a known step (tests/gates.py), never by racing it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from mxc.cli.runs import human_seconds
from mxc.node import sysread
from tests.conftest import REPO, Home
from tests.gates import PASS_SET, PauseGate
from tests.processes import run_processes, trainer_pids

pytestmark = pytest.mark.training

STEPS = 30
BUILD_SETS = (
    "model.overrides.per_device_batch_size=32",
    "checkpoint.period=5",
    # Other trainings on a shared development machine must not fail this one's preflight.
    "runtime.preflight.stale_processes=false",
    # An empty string reaches MaxText as "" (`profiler=` alone would be None, which it refuses),
    # and null removes an override the spec inherits (MaxText's default then applies).
    "model.overrides.profiler=",
    "model.overrides.learning_rate_schedule_steps=null",
    # Node-computed settings over recorded RoCE trees (MXC_DETECT_ROOT, docs/detectors.md).
    "env.detect=[gid_index, ib_hca]",
    PASS_SET,  # the pause gate's variables reach the trainer (tests/gates.py)
)
SYS_FIXTURES = REPO / "tests/fixtures/sys"


def detect_root(base: Path, tree: str) -> dict[str, str]:
    """A filesystem root whose /sys/class/infiniband is a recorded tree, for the node detectors."""
    shutil.copytree(SYS_FIXTURES / tree, base / "sys/class/infiniband")
    return {"MXC_DETECT_ROOT": str(base)}


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Home:
    return Home(tmp_path_factory.mktemp("run-home") / "mxc")


@pytest.fixture(scope="module")
def bundle(home: Home) -> str:
    return home.build(REPO / "specs/tiny.yaml", BUILD_SETS)


@pytest.fixture(scope="module")
def base_run(home: Home, bundle: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared straight-through run (the last build, so `mxc run` takes no argument), its
    detectors reading the RoCE tree of NVIDIA/nccl#1131 (GID index 3)."""
    proc = home.start("run", "-q", "--label", "base",
                      env=detect_root(tmp_path_factory.mktemp("detect-root"), "infiniband-roce-nccl1131"))
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    run = home.path / "runs" / out.strip()
    assert run.is_dir()
    return run


def record_of(run: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run / "record.json").read_text())
    return data


def metrics_of(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def learning(metrics: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """step -> every learning/* value (exact floats; perf/* timings legitimately differ)."""
    return {int(m["step"]): {k: v for k, v in m.items() if k.startswith("learning/")} for m in metrics}


def wait_for(what: str, check: Callable[[], Any], timeout: float = 300,
             proc: subprocess.Popen[str] | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            _out, err = proc.communicate()
            pytest.fail(f"mxc exited ({proc.returncode}) while waiting for {what}\n{err[-3000:]}")
        time.sleep(0.02)
    pytest.fail(f"timed out waiting for {what}")


def new_run(home: Home, before: set[Path], proc: subprocess.Popen[str]) -> Path:
    def found() -> Path | None:
        fresh = home.runs() - before
        return next(iter(fresh)) if fresh else None

    run: Path = wait_for("the run directory", found, proc=proc)
    return run


def trainer_pid(run: Path) -> int | None:
    return next(iter(trainer_pids(run)), None)


# ---- the straight-through run


def test_run_trains_and_records_everything(home: Home, bundle: str, base_run: Path) -> None:
    from importlib.metadata import version

    record = record_of(base_run)
    assert record["format"] == "mxc-run/v2"
    assert record["run_id"] == base_run.name and record["bundle"] == bundle and record["spec_name"] == "tiny"
    assert record["status"] == "succeeded" and record["final"] is True and record["exit_code"] == 0
    assert record["restarts"] == 0 and len(record["attempts"]) == 1
    assert record["started"] < record["ended"]
    assert record["command"] == ["bash", str(home.path / "bundles" / bundle / "entrypoint.sh")]
    env = record["environment"]
    assert env["MXC_RUN_DIR"] == str(base_run) and env["MXC_BUNDLE_DIR"] == str(home.path / "bundles" / bundle)
    assert env["MXC_ATTEMPT"] == "0" and os.path.isabs(env["MXC_PYTHON"])
    host = record["host"]
    assert host["hostname"] and host["cpu"]["count"] == os.cpu_count()
    assert host["python"]["version"] == sys.version.split()[0]
    for package in ("jax", "jaxlib", "maxtext"):
        assert host["python"]["packages"][package] == version(package)
    assert record["image"]["environment_digest"].startswith("sha256:")
    assert record["code"] == {"maxtext_version": "0.2.5", "maxtext_installed": "0.2.5",
                              "maxtext_location": host["python"]["maxtext_location"]}

    metrics = metrics_of(base_run)
    assert [m["step"] for m in metrics] == [float(s) for s in range(STEPS)]
    assert record["steps"] == STEPS and record["last_loss"] == metrics[-1]["learning/loss"]
    assert "completed step: 29" in (base_run / "train.log").read_text()

    tensorboard = Path(record["tensorboard"])
    assert tensorboard == base_run / "output" / base_run.name / "tensorboard" / base_run.name
    events = list(tensorboard.glob("events.out.tfevents.*"))
    assert events, f"no TensorBoard event file in {tensorboard}"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # type: ignore[import-untyped]

    acc = EventAccumulator(str(tensorboard), size_guidance={"scalars": 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("learning/loss")] == list(range(STEPS))


def test_empty_string_and_removed_override_reach_maxtext_as_written(home: Home, bundle: str, base_run: Path) -> None:
    args = json.loads((home.path / "bundles" / bundle / "run.json").read_text())["train"]["args"]
    assert "profiler=''" in args
    assert not any(a.startswith("learning_rate_schedule_steps=") for a in args)
    log = (base_run / "train.log").read_text()
    assert "Config param profiler: ProfilerType.NONE\n" in log  # MaxText read "" (its 'no profiler'), and trained
    assert f"Config param learning_rate_schedule_steps: {STEPS}\n" in log  # its default (-1) follows steps
    assert record_of(base_run)["status"] == "succeeded"


def test_runs_and_logs_show_the_run(home: Home, base_run: Path) -> None:
    listed = json.loads(home.cli("runs", "--json").stdout)
    row = next(r for r in listed if r["run_id"] == base_run.name)
    assert row["status"] == "succeeded" and row["steps"] == STEPS and row["spec"] == "tiny"
    assert row["last_loss"] == record_of(base_run)["last_loss"] and row["duration_s"] > 0
    table = home.cli("runs").stdout
    assert base_run.name in table and "succeeded" in table
    logs = home.cli("logs", base_run.name[:18])
    assert logs.returncode == 0 and "completed step: 29" in logs.stdout
    follow = home.cli("logs", base_run.name, "-f", timeout=60)  # a finished run: prints and returns
    assert follow.returncode == 0 and follow.stdout == logs.stdout


def test_time_to_first_step_and_compile_time_are_recorded_and_shown(home: Home, base_run: Path,
                                                                      tmp_path: Path) -> None:
    record = record_of(base_run)
    first, compiled = record["time_to_first_step_s"], record["compile_s"]
    assert isinstance(first, float) and isinstance(compiled, float)
    assert 0 < compiled <= first  # compilation is part of the wait for the first step
    row = next(r for r in home.json("runs") if r["run_id"] == base_run.name)
    assert row["time_to_first_step_s"] == first and row["compile_s"] == compiled
    line = next(x for x in home.cli("runs").stdout.splitlines() if x.startswith(base_run.name))
    assert line.endswith(f"{human_seconds(first)} ({human_seconds(compiled)} compile)  base")
    report = tmp_path / "report.html"
    out = home.cli("report", base_run.name, "-o", str(report), "--no-tsdb")
    assert out.returncode == 0, out.stderr
    html = report.read_text()
    assert "time to first step" in html and "compile" in html


def test_a_run_label_is_recorded_and_names_the_run(home: Home, base_run: Path) -> None:
    assert record_of(base_run)["labels"] == ["base"]
    raw = (base_run / "train.log").read_text().splitlines()
    assert home.cli("logs", "label:base", "--tail", "1").stdout.splitlines() == raw[-1:]
    row = next(r for r in home.json("runs") if r["run_id"] == base_run.name)
    assert row["labels"] == ["base"]
    assert base_run.name in home.cli("runs", "--ids").stdout.split()


def test_logs_fold_the_config_dump_and_filter(home: Home, base_run: Path) -> None:
    raw = (base_run / "train.log").read_text().splitlines()
    config = [line for line in raw if "] Config param " in line]
    assert len(config) > 400  # MaxText logs every setting at start-up
    shown = home.cli("logs", base_run.name).stdout.splitlines()
    assert f"[... {len(config)} config lines folded; --config to show]" in shown
    notices = [line for line in raw if line.startswith("[NO-OP] ")]  # MaxText's stubbed optional modules
    assert [line for line in shown if "folded" not in line] == [line for line in raw if line not in config + notices]
    assert home.cli("logs", base_run.name, "--all").stdout.splitlines() == raw
    assert home.cli("logs", base_run.name, "--rank", "0", "--all").stdout.splitlines() == raw  # one rank locally
    assert home.cli("logs", base_run.name, "--rank", "1").returncode == 2
    steps = home.cli("logs", base_run.name, "--grep", r"completed step: \d+,", "--tail", "2").stdout.splitlines()
    assert [s.split("completed step: ")[1].split(",")[0] for s in steps] == [str(STEPS - 2), str(STEPS - 1)]
    follow = home.cli("logs", base_run.name, "-f", "--tail", "3", timeout=60)
    assert follow.returncode == 0 and follow.stdout.splitlines() == shown[-3:] == raw[-3:]
    # --since: from a step's logged time on, the lines before it are gone and the end is there
    middle = next(line for line in raw if "completed step: 15," in line)
    when = datetime.strptime(f"{record_of(base_run)['started'][:4]}{middle[1:21]}", "%Y%m%d %H:%M:%S.%f")
    late = home.cli("logs", base_run.name, "--since", when.isoformat()).stdout.splitlines()
    assert late and late[-1] == raw[-1] and not any("completed step: 14," in line for line in late)
    assert any("completed step: 15," in line for line in late)


def test_detected_settings_reach_training_the_record_and_compare(home: Home, bundle: str, base_run: Path,
                                                                  tmp_path: Path) -> None:
    """env.detect on a node whose GID table differs (the Kubernetes pod of NVIDIA/nccl#1573, index 7):
    the trainer's own environment has the values, the record has the detections, and `mxc compare`
    with the base run (index 3) shows the change."""
    before = home.runs()
    gate = PauseGate(tmp_path, {0: 0})  # the trainer waits after step 0, never released
    proc = home.start("run", bundle, "-q", env={**gate.env(), **detect_root(tmp_path / "root", "infiniband-roce-k8s-nccl1573")})
    run = new_run(home, before, proc)
    pid = gate.wait_paused(0, alive=lambda: proc.poll() is None)[0]
    environ = sysread.process_environ(Path("/proc"), pid) or {}
    assert environ.get("NCCL_IB_GID_INDEX") == "7"
    assert environ.get("NCCL_IB_HCA") == "=mlx5_0:1,mlx5_1:1"
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, err

    detected = record_of(run)["detected"]["0"]["detectors"]
    assert detected["gid_index"]["variables"]["NCCL_IB_GID_INDEX"] == {"value": "7", "how": "detected", "was": None}
    assert detected["gid_index"]["inputs"]["ports"]["mlx5_1:1"][2] == {
        "index": 6, "gid": "0000:0000:0000:0000:0000:ffff:0a98:040c", "type": "IB/RoCE v1"}
    assert record_of(base_run)["detected"]["0"]["detectors"]["gid_index"]["found"] == {"NCCL_IB_GID_INDEX": "3"}
    log = (run / "train.log").read_text()
    assert "detect gid_index: NCCL_IB_GID_INDEX=7 (routable RoCE v2 GID at index 7 on 2 ACTIVE RoCE port(s))" in log

    out = home.cli("compare", base_run.name, run.name)
    assert "  detected NCCL_IB_GID_INDEX (rank 0): 3 [gid_index] -> 7 [gid_index]" in out.stdout, out.stdout + out.stderr
    assert "NCCL_IB_HCA" not in out.stdout  # the same ports on both: no drift
    assert out.returncode == 1  # a detected variable differs: the runs differ
    listed = json.loads(home.cli("compare", base_run.name, run.name, "--json").stdout)["environment"]
    assert {"what": "detected NCCL_IB_GID_INDEX (rank 0)", "a": "3 [gid_index]", "b": "7 [gid_index]",
            "significant": True} in listed


# ---- replay


def test_rerun_gives_a_bit_identical_loss_curve(home: Home, base_run: Path) -> None:
    out = home.cli("rerun", base_run.name)
    assert out.returncode == 0, out.stderr
    assert f"no drift from run {base_run.name}" in out.stderr
    rerun = home.path / "runs" / out.stdout.strip()
    record = record_of(rerun)
    assert record["rerun_of"] == base_run.name and record["bundle"] == record_of(base_run)["bundle"]
    assert record["status"] == "succeeded"
    first, second = learning(metrics_of(base_run)), learning(metrics_of(rerun))
    assert sorted(second) == list(range(STEPS))
    assert second == first  # exact float equality, every step, every learning/* metric


# ---- restart from the last checkpoint


def test_sigkill_mid_run_resumes_from_the_checkpoint(home: Home, bundle: str, base_run: Path, tmp_path: Path) -> None:
    before = home.runs()
    gate = PauseGate(tmp_path, {0: 12})  # attempt 0 waits after step 12 (checkpoints 5 and 10 are due)
    proc = home.start("run", bundle, "-q", env=gate.env())
    run = new_run(home, before, proc)
    checkpoints = run / "output" / run.name / "checkpoints"

    def finished_checkpoint() -> int | None:
        if not checkpoints.is_dir():
            return None
        done = [int(p.name) for p in checkpoints.iterdir() if p.name.isdigit()]
        return max((s for s in done if 5 <= s < STEPS - 1), default=None)

    pid = gate.wait_paused(0, alive=lambda: proc.poll() is None)[0]
    saved = wait_for("a checkpoint at step >= 5", finished_checkpoint, proc=proc)
    os.kill(pid, signal.SIGKILL)
    _out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err

    record = record_of(run)
    assert record["status"] == "succeeded" and record["restarts"] == 1
    first, second = record["attempts"]
    assert first["signal"] == "SIGKILL" and first["exit_code"] == 137
    assert first["last_step"] is not None and first["last_step"] < STEPS - 1, "the kill came after the last step"
    resumed = second["resumed_from_step"]
    assert resumed is not None and resumed >= saved
    assert "resuming from checkpoint" in (run / "train.log").read_text()

    attempt1 = [json.loads(line) for line in (run / "metrics/attempt-1.rank-0.jsonl").read_text().splitlines()]
    assert attempt1[0]["step"] == resumed + 1  # MaxText continued after the checkpoint, not from 0
    merged = metrics_of(run)
    assert [m["step"] for m in merged] == [float(s) for s in range(STEPS)]  # each step exactly once
    assert learning(merged) == learning(metrics_of(base_run))  # bitwise equal to straight-through
    assert list(run_processes(run)) == []


# ---- cancellation


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_cancel_stops_training_and_leaves_no_process(home: Home, bundle: str, signum: int, tmp_path: Path) -> None:
    before = home.runs()
    gate = PauseGate(tmp_path, {0: 0})  # mid-training: the trainer waits after step 0 (never released)
    proc = home.start("run", bundle, env=gate.env())
    run = new_run(home, before, proc)
    if signum == signal.SIGINT:  # mid-training
        gate.wait_paused(0, alive=lambda: proc.poll() is None)
    else:  # while the trainer is still starting
        wait_for("the trainer process", lambda: trainer_pid(run), proc=proc)
    started = [pid for pid, _ in run_processes(run)]
    assert started
    proc.send_signal(signum)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, err
    record = record_of(run)
    assert record["status"] == "cancelled" and record["final"] is True
    assert record["cancelled_by"] == signal.Signals(signum).name
    assert record["ended"] and record["attempts"][-1]["exit_code"] is not None
    assert list(run_processes(run)) == []
    for pid in started:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][:3]
    listed = json.loads(home.cli("runs", "--json").stdout)
    assert next(r for r in listed if r["run_id"] == run.name)["status"] == "cancelled"


# ---- detached


def test_a_detached_run_outlives_its_parent_and_is_followed_and_cancelled(home: Home, bundle: str,
                                                                         tmp_path: Path) -> None:
    gate = PauseGate(tmp_path, {0: 1})  # holds the trainer after step 1 (never released): the run is surely live
    started = subprocess.run([sys.executable, "-m", "mxc", "run", bundle[:12], "--detach"], cwd=REPO,
                             env={**home.env(), **gate.env()}, capture_output=True, text=True, timeout=300)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    run = home.path / "runs" / run_id
    assert f"mxc: run {run_id} detached" in started.stderr and f"mxc logs {run_id} -f" in started.stderr
    # `mxc run` has exited; its training goes on and reaches a step
    wait_for("a step line", lambda: "completed step: 0," in (run / "train.log").read_text(errors="replace"))
    gate.wait_paused(0)
    supervisor = record_of(run)["supervisor"]
    assert os.getsid(supervisor["pid"]) == supervisor["pid"] != os.getsid(0)  # a session of its own: no terminal
    follow = home.start("logs", run_id, "-f")
    waiting = home.start("wait", run_id, "--interval", "0.2")  # like sbatch --wait: returns with the run's status
    assert waiting.stderr is not None
    first = waiting.stderr.readline()  # its progress line (one per change off a terminal): it is waiting
    assert first.startswith(f"mxc: run {run_id}: running, step "), first
    out = home.cli("cancel", run_id, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["status"] == "cancelled"
    logs, _ = follow.communicate(timeout=120)  # -f ends with the run
    assert follow.returncode == 0 and "completed step: 0," in logs and "[mxc] run cancelled" in logs
    _, said = waiting.communicate(timeout=120)
    assert waiting.returncode == 143 and f"mxc: run {run_id} cancelled" in said, said  # 128 + SIGTERM
    record = record_of(run)
    assert record["status"] == "cancelled" and record["final"] is True and record["cancelled_by"] == "mxc cancel"
    wait_for("the supervisor to exit", lambda: not Path(f"/proc/{supervisor['pid']}").exists()
             or "Z" in Path(f"/proc/{supervisor['pid']}/stat").read_text().rsplit(")", 1)[1][:3])
    assert list(run_processes(run)) == []
    assert f"mxc: run {run_id} cancelled" in (run / "mxc.log").read_text()  # the detached mxc's own output
    assert not list((home.path / "runs").glob(".*.detached.log"))
