"""Run commands without training: bad input, drift, lookups, and the runtime's small parts.

Everything here is fast: bundles are built but never trained (the training paths are in
test_run_local.py and test_run_pinned.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mxc.runtime.backends import Plan
from mxc.runtime.local.launcher import LocalLauncher
from mxc.runtime.local.progress import ProgressBar
from mxc.runtime.local.supervisor import signal_of
from mxc.runtime.logs.metrics_merge import merge, write_merged
from mxc.runtime.logs.trainlog import LogFollower, parse_step
from mxc.runtime.provenance.hostfacts import collect, compare
from mxc.runtime.rundir import RunDir
from tests.conftest import REPO, Mxc, store_snapshot

TINY = str(REPO / "specs/tiny.yaml")


def one_line_error(out: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("mxc: error: ") and out.stderr.count("\n") == 1, out.stderr
    assert "Traceback" not in out.stderr
    for fragment in fragments:
        assert fragment in out.stderr, out.stderr


def fake_run(home: Path, run_id: str, bundle: str, **fields: object) -> Path:
    run = home / "runs" / run_id
    run.mkdir(parents=True)
    record = {"run_id": run_id, "bundle": bundle, "spec_name": "tiny", "backend": "local", "status": "succeeded",
              "final": True, "started": "2099-01-01T00:00:00.000Z", "ended": "2099-01-01T00:01:00.000Z",
              "exit_code": 0, "steps": 30, "last_loss": 5.5, **fields}
    (run / "record.json").write_text(json.dumps(record))
    (run / "train.log").write_text(f"log of {run_id}\n")
    return run


# ---- bad input: one line, exit 2, nothing written


def test_run_without_any_build(mxc: Mxc, mxc_home: Path) -> None:
    one_line_error(mxc("run"), "no bundle has been built yet", "mxc build specs/tiny.yaml")
    assert store_snapshot(mxc_home) == []


def test_run_unknown_bundle(mxc: Mxc, mxc_home: Path) -> None:
    assert mxc("build", TINY, "-q").returncode == 0
    before = store_snapshot(mxc_home)
    one_line_error(mxc("run", "ffffff"), "no bundle matches 'ffffff'")
    one_line_error(mxc("run", "xyz"), "not a bundle hash")
    assert store_snapshot(mxc_home) == before


def test_run_refuses_set_because_bundles_are_immutable(mxc: Mxc, mxc_home: Path) -> None:
    digest = mxc("build", TINY, "-q").stdout.strip()
    before = store_snapshot(mxc_home)
    out = mxc("run", digest[:6], "--set", "model.overrides.steps=5")
    one_line_error(out, "a bundle is immutable", "mxc build SPEC --set KEY=VALUE")
    assert store_snapshot(mxc_home) == before


def test_unknown_and_ambiguous_run_ids(mxc: Mxc, mxc_home: Path) -> None:
    digest = mxc("build", TINY, "-q").stdout.strip()
    fake_run(mxc_home, "20990101-000000-aaaa-" + digest[:8], digest)
    fake_run(mxc_home, "20990101-000001-bbbb-" + digest[:8], digest)
    before = store_snapshot(mxc_home)
    one_line_error(mxc("logs", "20990101"), "'20990101' is ambiguous: 2 runs match")
    one_line_error(mxc("rerun", "20990101"), "ambiguous")
    one_line_error(mxc("rerun", "zz-no-such-run"), "no run or bundle matches 'zz-no-such-run'")
    one_line_error(mxc("logs", "zz-no-such-run"), "no run or bundle matches")
    assert store_snapshot(mxc_home) == before
    # A unique prefix works, and a bundle prefix means its latest run.
    assert mxc("logs", "20990101-000000").stdout == f"log of 20990101-000000-aaaa-{digest[:8]}\n"
    assert mxc("logs", digest[:10]).stdout == f"log of 20990101-000001-bbbb-{digest[:8]}\n"
    assert mxc("logs").stdout == f"log of 20990101-000001-bbbb-{digest[:8]}\n"


def test_rerun_of_a_run_whose_bundle_is_gone(mxc: Mxc, mxc_home: Path) -> None:
    gone = "ab" * 32
    fake_run(mxc_home, "20990101-000000-aaaa-abababab", gone)
    before = store_snapshot(mxc_home)
    one_line_error(mxc("rerun", "20990101-000000-aaaa-abababab"), f"bundle {gone[:12]}", "is not in the store")
    assert store_snapshot(mxc_home) == before


def test_damaged_bundle_is_not_run(mxc: Mxc, mxc_home: Path) -> None:
    digest = mxc("build", TINY, "-q").stdout.strip()
    env_sh = mxc_home / "bundles" / digest / "env.sh"
    env_sh.chmod(0o644)
    env_sh.write_text(env_sh.read_text() + "export SNEAKY=1\n")
    one_line_error(mxc("run"), f"bundle {digest[:12]} is damaged: env.sh: changed", f"mxc verify {digest[:12]}")
    assert not (mxc_home / "runs").exists()


def test_the_run_id_a_detached_parent_chooses_must_be_of_its_bundle(mxc: Mxc, mxc_home: Path) -> None:
    digest = mxc("build", TINY, "-q").stdout.strip()
    one_line_error(mxc("run", "--as-run-id", "../../x", "--dry-run"), f"is not a run id of bundle {digest[:12]}")
    one_line_error(mxc("run", "--as-run-id", "20990101-000000-abcd-ffffffff", "--dry-run"), "is not a run id")
    chosen = f"20990101-000000-abcd-{digest[:8]}"
    out = mxc("run", "--as-run-id", chosen, "--dry-run")
    assert out.returncode == 0 and str(mxc_home / "runs" / chosen) in out.stdout
    assert not (mxc_home / "runs").exists()


def test_local_run_of_a_multi_node_bundle_is_refused(mxc: Mxc, mxc_home: Path) -> None:
    out = mxc("build", TINY, "-q", "--set", "runtime.backend=slurm", "--set", "resources.nodes=2")
    assert out.returncode == 0, out.stderr
    one_line_error(mxc("run", "--local", "--dry-run"), "asks for 2 nodes; the local backend runs one")


# ---- drift before a rerun


def test_rerun_warns_on_drift_and_strict_refuses(mxc: Mxc, mxc_home: Path) -> None:
    digest = mxc("build", TINY, "-q").stdout.strip()
    host = collect(sys.executable)
    host["python"]["packages"]["jax"] = "0.0.1"
    host["python"]["all_packages"]["jax"] = "0.0.1"
    run_id = "20990101-000000-aaaa-" + digest[:8]
    fake_run(mxc_home, run_id, digest, host=host, image={"container": "native"},
             code={"maxtext_version": "0.2.5", "maxtext_installed": "0.2.5"})
    before = store_snapshot(mxc_home)

    strict = mxc("rerun", run_id, "--strict")
    assert strict.returncode == 2
    assert f"mxc: drift: jax: 0.0.1 -> {host['python']['all_packages'].get('jax') or ''}" not in strict.stderr
    assert "mxc: drift: jax: 0.0.1 -> " in strict.stderr
    assert f"mxc: error: refusing to rerun {run_id}" in strict.stderr
    assert store_snapshot(mxc_home) == before

    dry = mxc("rerun", run_id, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "mxc: warning: the environment drifted" in dry.stderr and "--strict refuses" in dry.stderr
    assert "entrypoint.sh" in dry.stdout
    assert store_snapshot(mxc_home) == before


def test_compare_flags_versions_hardware_and_code_but_not_paths() -> None:
    old = {"host": {"hostname": "a", "cpu": {"model": "X", "count": 8}, "gpus": [],
                    "python": {"version": "3.12.1", "all_packages": {"jax": "0.12", "numpy": "2.0"}}},
           "image": {"container": "native", "environment_digest": "sha256:1"},
           "code": {"commit": "c1", "dir": "/old/place"}}
    same = json.loads(json.dumps(old))
    same["code"]["dir"] = "/new/place"
    assert compare(old, same) == []
    new = json.loads(json.dumps(old))
    new["host"].update(hostname="b", cpu={"model": "Y", "count": 8})
    new["host"]["python"]["all_packages"] = {"jax": "0.13", "numpy": "2.0", "extra": "1"}
    new["image"]["environment_digest"] = "sha256:2"
    drift = {d.what: d for d in compare(old, new)}
    assert set(drift) == {"hostname", "cpu model", "jax", "extra", "image environment_digest"}
    assert not drift["hostname"].significant and drift["jax"].significant
    assert str(drift["extra"]) == "extra: not installed -> 1"


# ---- runs listing


def test_runs_lists_and_marks_lost_runs(mxc: Mxc, mxc_home: Path) -> None:
    digest = mxc("build", TINY, "-q").stdout.strip()
    dead = subprocess.Popen(["true"])
    dead.wait()
    fake_run(mxc_home, "20990101-000000-aaaa-" + digest[:8], digest)
    fake_run(mxc_home, "20990101-000001-bbbb-" + digest[:8], digest, status="running", final=False, ended=None,
             steps=None, supervisor={"pid": dead.pid, "host": os.uname().nodename})
    rows = json.loads(mxc("runs", "--json").stdout)
    assert [r["status"] for r in rows] == ["succeeded", "lost"]
    assert rows[0]["duration_s"] == 60 and rows[0]["steps"] == 30
    text = mxc("runs").stdout.splitlines()
    assert text[0].split() == ["RUN", "BUNDLE", "SPEC", "STATUS", "STEPS", "LAST", "LOSS", "STARTED", "DURATION",
                               "FIRST", "STEP", "LABELS"]
    assert "1m00s" in text[1] and "lost" in text[2]
    assert len(json.loads(mxc("runs", "--json", "-n", "1").stdout)) == 1
    assert len(json.loads(mxc("runs", "--json", "--bundle", digest[:8]).stdout)) == 2


def test_wait_exits_with_the_status_of_an_ended_or_lost_run(mxc: Mxc, mxc_home: Path) -> None:
    """`mxc wait` returns at once for a run that ended (its exit status: 0, the training's code,
    128+signal when cancelled) or was lost, and refuses a bad interval."""
    digest = mxc("build", TINY, "-q").stdout.strip()
    dead = subprocess.Popen(["true"])
    dead.wait()
    cases: dict[str, tuple[dict[str, object], int, str]] = {
        "20990102-000000-aaaa": ({}, 0, "succeeded"),
        "20990102-000001-bbbb": ({"status": "failed", "exit_code": 3, "message": "it broke"}, 3, "failed (exit 3): it broke"),
        "20990102-000002-cccc": ({"status": "cancelled", "exit_code": None, "cancelled_by": "SIGTERM"}, 143, "cancelled"),
        "20990102-000003-dddd": ({"status": "running", "final": False, "ended": None,
                                  "supervisor": {"pid": dead.pid, "host": os.uname().nodename}}, 1, "lost"),
    }
    for prefix, (fields, code, said) in cases.items():
        run = fake_run(mxc_home, f"{prefix}-{digest[:8]}", digest, **fields)
        before = (run / "record.json").read_bytes()
        out = mxc("wait", run.name)
        assert out.returncode == code and f"mxc: run {run.name} {said}" in out.stderr, (prefix, out.stderr)
        assert (run / "record.json").read_bytes() == before  # a read
    out = mxc("wait", "20990102-000001", "--json", "-q")
    assert out.returncode == 3 and json.loads(out.stdout)["exit_status"] == 3 and out.stderr == ""
    one_line_error(mxc("wait", "20990102-000000", "--interval", "0"), "--interval 0: expected a number of seconds above 0")
    one_line_error(mxc("run", "--wait", "--interval", "-1"), "--interval -1: expected a number of seconds above 0")
    one_line_error(mxc("wait", "nosuchrun"), "no run matches 'nosuchrun'")


# ---- metrics merge


def _write_attempt(parts: Path, attempt: int, steps: range, tag: str, torn: bool = False) -> None:
    parts.mkdir(exist_ok=True)
    lines = [json.dumps({"learning/loss": 1.0 / (s + 1), "step": float(s), "from": tag}) for s in steps]
    text = "\n".join(lines) + "\n"
    if torn:
        text += '{"learning/loss": 0.1, "st'
    (parts / f"attempt-{attempt}.rank-0.jsonl").write_text(text)


def test_merge_replaces_recomputed_steps_and_keeps_each_step_once(tmp_path: Path) -> None:
    parts = tmp_path / "metrics"
    # What MaxText leaves after a kill at step 13 with checkpoints every 5: 0..12, then 6..19.
    _write_attempt(parts, 0, range(0, 13), "a0", torn=True)
    _write_attempt(parts, 1, range(6, 20), "a1")
    (parts / "attempt-1.rank-1.jsonl").write_text("ignored: other rank\n")
    lines, replaced = merge(parts)
    rows = [json.loads(line) for line in lines]
    assert [r["step"] for r in rows] == [float(s) for s in range(20)]
    assert [r["from"] for r in rows] == ["a0"] * 6 + ["a1"] * 14
    assert replaced == 7
    result = write_merged(parts, tmp_path / "metrics.jsonl")
    assert (result.steps, result.last_step, result.last_loss) == (20, 19, 1.0 / 20)
    # Verbatim lines: full float precision survives.
    assert (tmp_path / "metrics.jsonl").read_text().splitlines()[3] == lines[3]


def test_merge_of_a_restart_from_scratch_and_of_nothing(tmp_path: Path) -> None:
    parts = tmp_path / "metrics"
    _write_attempt(parts, 0, range(0, 4), "a0")
    _write_attempt(parts, 1, range(0, 3), "a1")  # no checkpoint: the restart began again at 0
    rows = [json.loads(line) for line in merge(parts)[0]]
    assert [(r["step"], r["from"]) for r in rows] == [(0.0, "a1"), (1.0, "a1"), (2.0, "a1")]
    assert write_merged(tmp_path / "none", tmp_path / "empty.jsonl").steps == 0
    assert (tmp_path / "empty.jsonl").read_text() == ""


# ---- log parsing, progress, checkpoints, signals


STEP_LINE = ("I1123 09:34:01.295239 139821459602304 metric_logger.py:265] completed step: 2, seconds: 0.007, "
             "TFLOP/s/device: 0.006, Tokens/s/device: 9843.125, total_weights: 64, loss: 6.105, lm_loss: 6.105, "
             "perplexity: 448.175")


def test_parse_step_lines() -> None:
    event = parse_step(STEP_LINE)
    assert event is not None and (event.step, event.loss, event.seconds) == (2, 6.105, 0.007)
    rampup = "I1 x.py:1] [Rampup Batch Size Phase] completed step: 7, seconds: 0.1, total_weights: 8, loss: nan"
    event = parse_step(rampup)
    assert event is not None and event.step == 7 and event.loss != event.loss
    assert parse_step("completed profiler activation step: 3") is None


def test_log_follower_reads_increments_and_partial_lines(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("[mxc] attempt 0: start\n" + STEP_LINE + "\n" + STEP_LINE.replace("step: 2", "step: 3")[:40])
    follower = LogFollower(log)
    assert [e.step for e in follower.poll()] == [2]
    with open(log, "a") as fh:
        fh.write(STEP_LINE.replace("step: 2", "step: 3")[40:] + "\nrestoring from this run's directory step 5\n")
    assert [e.step for e in follower.poll()] == [3]
    assert follower.restored_step == 5 and follower.steps_seen == 2
    follower.start_at_end()
    with open(log, "a") as fh:
        fh.write("preflight failed: disk: 0.1 GB free\n[mxc n rank 0] stage preflight failed (exit 3)\n")
    assert follower.failure_reason() == "preflight failed: disk: 0.1 GB free"


def test_progress_bar_line_and_tty_only(tmp_path: Path) -> None:
    import io

    from mxc.runtime.logs.trainlog import StepEvent

    stream = io.StringIO()
    now = [100.0]
    bar = ProgressBar(30, stream, clock=lambda: now[0])
    assert bar.enabled is False  # not a terminal
    now[0] = 165.0
    bar.set_status("compile")  # before the first step: the phase and the elapsed time
    assert bar.line() == "[........................] 0/30  compile  1m05s"
    bar.update([StepEvent(0, 6.1, 0.1)], now=10.0)
    bar.update([StepEvent(9, 5.9, 0.1)], now=11.0)
    assert bar.line() == "[########................] 10/30  loss 5.900  9.0 steps/s  1m05s"
    bar.close()
    assert stream.getvalue() == ""
    shown = ProgressBar(None, stream, enabled=True, min_interval=0, clock=lambda: now[0])
    shown.update([StepEvent(4, 2.0, 0.1)], now=1.0)
    drawn = stream.getvalue()
    shown.tick()  # less than a second later: nothing redrawn
    assert stream.getvalue() == drawn
    now[0] += 7200
    shown.tick()  # the elapsed time moves on while nothing is logged
    assert stream.getvalue().endswith("step 5  loss 2.000  2h00m")
    shown.close()
    assert stream.getvalue().startswith("\r\x1b[Kstep 5  loss 2.000") and stream.getvalue().endswith("\n")


def test_log_follower_reports_the_phases_before_the_first_step(tmp_path: Path) -> None:
    from mxc.runtime.local.startup import StartupTimes
    from mxc.runtime.record import RunRecord, now_iso

    log = tmp_path / "train.log"
    log.write_text("[mxc n rank 0] stage preflight: start (limit 900s)\n[mxc n rank 0] stage image: start\n")
    follower = LogFollower(log)
    follower.poll()
    assert follower.take_phases() == ["preflight", "image"] and follower.take_phases() == []
    clock = [50.0]
    startup = StartupTimes(clock=lambda: clock[0])
    record = RunRecord(run_id="r", bundle="0" * 64, spec_name="t", backend="local", status="running",
                       started=now_iso())
    with open(log, "a") as fh:
        fh.write("[mxc n rank 0] stage train: start\nI1 c.py:803] No existing checkpoints found, not restoring "
                 "checkpoint.\n")
    follower.poll()
    for phase in follower.take_phases():
        startup.phase(phase, record)
    clock[0] = 62.5
    with open(log, "a") as fh:
        fh.write("I1 m.py:823] [train] Total estimated memory size: 0.0 GB\n" + STEP_LINE + "\n")
    events = follower.poll()
    assert follower.take_phases() == ["first step"]  # read in the same poll as the step: still reported
    startup.phase("first step", record)
    assert [e.step for e in events] == [2] and startup.first_step(record) is True
    assert record.compile_s == 12.5 and record.time_to_first_step_s is not None
    assert startup.first_step(record) is False  # only the run's first step counts
    with open(log, "a") as fh:
        fh.write("[mxc n rank 0] stage train: start\n")
    follower.poll()
    assert follower.take_phases() == []  # after the first step of an attempt, no phases


def test_signal_of_exit_codes() -> None:
    assert signal_of(-9) == "SIGKILL" and signal_of(137) == "SIGKILL" and signal_of(143) == "SIGTERM"
    assert signal_of(0) is None and signal_of(1) is None and signal_of(124) is None


def test_plan_renders_a_runnable_command(tmp_path: Path) -> None:
    plan = Plan("local", RunDir(tmp_path / "r"), ["bash", "/b/entry point.sh"], {"MXC_RUN_DIR": "/x y"}, tmp_path,
                unset=["SLURM_JOB_ID"], notes=["a note"])
    text = plan.render()
    assert text.splitlines()[1] == "# a note"
    assert text.splitlines()[-1] == f"cd {tmp_path} && env -u SLURM_JOB_ID 'MXC_RUN_DIR=/x y' bash '/b/entry point.sh'"


# ---- the launcher: process groups, no orphans


def _alive(pid: int, settle: float = 5.0) -> bool:
    """Whether pid still runs (not a zombie), allowing a just-sent SIGKILL time to land."""
    deadline = time.monotonic() + settle
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        if state == "Z" or time.monotonic() > deadline:
            return state != "Z"
        time.sleep(0.02)


def test_launcher_signals_the_whole_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    script = f"sleep 300 & echo $! > {pidfile}; wait"
    proc = LocalLauncher().start(["bash", "-c", script], dict(os.environ), tmp_path, tmp_path / "log")
    deadline = time.monotonic() + 30
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    child = int(pidfile.read_text())
    assert proc.poll() is None and _alive(child, settle=0)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM
    assert not _alive(child)


def test_launcher_kills_stragglers_when_the_leader_exits(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    script = f"sleep 300 & echo $! > {pidfile}; exit 3"
    proc = LocalLauncher().start(["bash", "-c", script], dict(os.environ), tmp_path, tmp_path / "log")
    assert proc.wait(timeout=30) == 3
    assert not _alive(int(pidfile.read_text()))
    assert proc.poll() == 3


@pytest.mark.parametrize("command", ["run", "rerun", "runs", "logs", "wait"])
def test_help_has_an_example(mxc: Mxc, command: str) -> None:
    out = mxc(command, "--help")
    assert out.returncode == 0 and "example:\n  mxc " in out.stdout
