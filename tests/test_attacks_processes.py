"""Attacks on how mxc names, signals and cleans up processes, and on reads that act (issue 12, part D).

Each test reproduces one attack: a supervisor pid that now belongs to someone else, a
SIGKILLed `mxc run` whose training and Ray temp dirs must not survive it, a record.json
doctored to make `mxc runs` submit another script, Prometheus' unauthenticated lifecycle
API, and a plugin name that walks out of the plugin directory. Only
``test_sigkill_of_mxc_run_takes_its_training_along`` trains (MaxText on CPU); the rest are fast.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mxc.runtime.processes import scratch
from mxc.runtime.processes.procfs import ProcessId
from mxc.runtime.record import RunRecord, SlurmJob, SlurmState
from tests.conftest import REPO, Mxc
from tests.processes import dead_identity, run_processes, stand_ins, trainer_pids

TINY = str(REPO / "specs" / "tiny.yaml")
NODE = os.uname().nodename

# A process that keeps every catchable stop signal pending instead of dying, and on each line
# of input answers with the signals pending: proof of what was (not) sent to it.
BYSTANDER = r"""
import signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1,
                                          signal.SIGUSR2, signal.SIGQUIT, signal.SIGABRT})
print("ready", flush=True)
for line in sys.stdin:
    print(",".join(s.name for s in sorted(signal.sigpending())) or "none", flush=True)
"""


class Bystander:
    """An unrelated process of this user (what a reused pid may belong to)."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", BYSTANDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, start_new_session=True, env=env)
        assert self.proc.stdout is not None and self.proc.stdout.readline() == "ready\n"
        self.pid = self.proc.pid

    def pending(self) -> str:
        """The signals sent to it so far (they stay pending: it blocks them all but SIGKILL)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        assert self.proc.poll() is None, f"the bystander died ({self.proc.returncode})"
        self.proc.stdin.write("?\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def bystander() -> Iterator[Bystander]:
    one = Bystander()
    yield one
    one.close()


def wait_until(what: str, check: Callable[[], Any], timeout: float = 120) -> Any:
    """Poll for an event; the timeout is generous and only turns a hang into a failure."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")




def build(mxc: Mxc, *sets: str) -> str:
    args = [arg for setting in sets for arg in ("--set", setting)]
    out = mxc("build", "-q", TINY, *args)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def live_local_run(home: Path, digest: str, supervisor: dict[str, Any], tag: str = "aaaa") -> Path:
    """A run directory whose record says a local supervisor is training it."""
    run_id = f"20990101-000000-{tag}-{digest[:8]}"
    run = home / "runs" / run_id
    run.mkdir(parents=True)
    record = RunRecord(run_id=run_id, bundle=digest, spec_name="tiny", backend="local", status="running",
                       started="2099-01-01T00:00:00.000Z", supervisor=supervisor)
    record.save(run / "record.json")
    (run / "train.log").write_text(f"log of {run_id}\n")
    return run


def statuses(mxc: Mxc) -> dict[str, str]:
    out = mxc("runs", "--json")
    assert out.returncode == 0, out.stderr
    return {r["run_id"]: r["status"] for r in json.loads(out.stdout)}


# ---- 1. liveness by identity, not by pid


def test_process_identity_signals_only_the_process_it_names(bystander: Bystander) -> None:
    real = ProcessId.capture(bystander.pid)
    assert real is not None and real.is_alive() and real == ProcessId.from_record(real.as_record())
    forged = ProcessId(bystander.pid, real.start_ticks + 1, real.boot_id)  # same pid, another process
    other_boot = ProcessId(bystander.pid, real.start_ticks, "another-boot")
    assert not forged.is_alive() and not other_boot.is_alive()
    assert forged.send(signal.SIGTERM) is False and other_boot.send(signal.SIGTERM) is False
    assert bystander.pending() == "none"
    assert real.send(signal.SIGUSR1) is True
    assert bystander.pending() == "SIGUSR1"
    assert dead_identity().send(signal.SIGTERM) is False
    for malformed in (None, {}, {"pid": 5}, {"pid": True, "start_ticks": 1, "boot_id": "b"},
                      {"pid": "5", "start_ticks": 1, "boot_id": "b"}, {"pid": 5, "start_ticks": -1, "boot_id": "b"},
                      {"pid": 5, "start_ticks": 1, "boot_id": ""}):
        assert ProcessId.from_record(malformed) is None


def test_a_reused_supervisor_pid_makes_the_run_lost_and_is_never_signalled(mxc: Mxc, mxc_home: Path,
                                                                            bystander: Bystander) -> None:
    """The supervisor died; its pid now belongs to an unrelated process (the bystander)."""
    digest = build(mxc)
    real = ProcessId.capture(bystander.pid)
    assert real is not None
    reused = {"host": NODE, "pid": bystander.pid, "start_ticks": real.start_ticks - 1, "boot_id": real.boot_id}
    run = live_local_run(mxc_home, digest, reused)
    assert statuses(mxc)[run.name] == "lost"
    follow = mxc("logs", run.name, "-f", timeout=120)  # ends: the run is lost, nothing will write more
    assert follow.returncode == 0 and follow.stdout == f"log of {run.name}\n", follow.stderr
    cancel = mxc("cancel", run.name)
    assert cancel.returncode == 0, cancel.stderr
    assert f"was lost: its supervisor (pid {bystander.pid}) is gone (that pid now belongs to another process)" \
        in cancel.stderr
    assert bystander.pending() == "none"  # not even a SIGTERM reached it
    record = json.loads((run / "record.json").read_text())
    assert record["final"] is True and record["status"] == "cancelled"
    assert record["message"].endswith("mxc cancel: no process of it was left")


def test_a_record_without_start_time_is_never_signalled(mxc: Mxc, mxc_home: Path, bystander: Bystander) -> None:
    """A bare pid (a record from before identities) that is alive cannot be verified: no signal."""
    digest = build(mxc)
    run = live_local_run(mxc_home, digest, {"host": NODE, "pid": bystander.pid})
    before = (run / "record.json").read_bytes()
    assert statuses(mxc)[run.name] == "running"
    out = mxc("cancel", run.name)
    assert out.returncode == 2 and out.stderr == (f"mxc: error: run {run.name} is not running on this machine "
                                                   "(its supervisor cannot be verified here)\n")
    assert bystander.pending() == "none" and (run / "record.json").read_bytes() == before


# ---- 2. and 3. what a dead supervisor leaves: processes and temp dirs


def test_cancel_of_a_lost_run_ends_what_is_left_and_nothing_else(mxc: Mxc, mxc_home: Path) -> None:
    digest = build(mxc)
    supervisor = dead_identity()
    run = live_local_run(mxc_home, digest, {"host": NODE, **supervisor.as_record()})
    other = live_local_run(mxc_home, digest, {"host": NODE, **ProcessId.this_process().as_record()}, tag="bbbb")
    leftover = subprocess.Popen(["sleep", "600"], env={**os.environ, "MXC_RUN_DIR": str(run)}, start_new_session=True)
    of_other_run = Bystander({**os.environ, "MXC_RUN_DIR": str(other)})
    unrelated = Bystander()
    abandoned = scratch.create(run, owner=supervisor)
    live_owner = scratch.create(other)  # this test process owns it: alive
    try:
        wait_until("the leftover to carry its marker", lambda: ProcessId.capture(leftover.pid) and
                   f"MXC_RUN_DIR={run}".encode() in Path(f"/proc/{leftover.pid}/environ").read_bytes().split(b"\0"))
        assert statuses(mxc)[run.name] == "lost" and statuses(mxc)[other.name] == "running"
        out = mxc("cancel", run.name, "--json")
        assert out.returncode == 0, out.stderr
        assert f"stopped 1 leftover process(es): {leftover.pid} (sleep 600)" in out.stderr
        assert f"removed {abandoned}" in out.stderr
        assert leftover.wait(timeout=60) == -signal.SIGTERM
        assert of_other_run.pending() == "none" and unrelated.pending() == "none"
        assert not abandoned.exists() and live_owner.is_dir()  # a live run's scratch dir is never removed
        record = json.loads(out.stdout)
        assert record["status"] == "cancelled" and record["final"] is True and record["cancelled_by"] == "mxc cancel"
        assert statuses(mxc)[run.name] == "cancelled"
    finally:
        leftover.kill()
        leftover.wait()
        of_other_run.close()
        unrelated.close()
        scratch.remove(live_owner)
        scratch.remove(abandoned)


HOLDER = r"""
import json, os, subprocess, sys
from pathlib import Path
from mxc.runtime.processes import scratch
from mxc.runtime.local.deathwatch import DeathWatch

run = Path(sys.argv[1])
run.mkdir(parents=True, exist_ok=True)
temp = scratch.create(run)  # what the Ray launcher does
watch = DeathWatch.start(run)
child = subprocess.Popen(["bash", "-c", "sleep 600 & wait"], env={**os.environ, "MXC_RUN_DIR": str(run)},
                         start_new_session=True)
print(json.dumps({"temp": str(temp), "child": child.pid}), flush=True)
for line in sys.stdin:
    watch.release()
    print("released", flush=True)
"""


def start_holder(tmp_path: Path, run: Path) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """A stand-in supervisor (no MaxText): a scratch dir, its death watch, and a process tree of the run."""
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    holder = subprocess.Popen([sys.executable, str(script), str(run)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert holder.stdout is not None
    info = json.loads(holder.stdout.readline())
    info["processes"] = wait_until("the run's two processes", lambda: [p for p, _ in run_processes(run)]
                                   if len(run_processes(run)) == 2 else None, timeout=60)
    return holder, info


def test_a_killed_supervisors_processes_and_temp_dir_go_with_it(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "20990101-000000-cccc-12345678"
    holder, info = start_holder(tmp_path, run)
    identities = [ProcessId.capture(pid) for pid in info["processes"]]
    assert Path(info["temp"]).parent == scratch.root() and Path(info["temp"]).is_dir()
    holder.kill()
    holder.wait()
    wait_until("the run's processes to end", lambda: not any(p and p.is_alive() for p in identities))
    wait_until("the scratch dir to go", lambda: not Path(info["temp"]).exists())
    assert run_processes(run) == []
    log = wait_until("the death watch's log line", lambda: "[mxc] the supervisor" in (run / "train.log").read_text()
                     if (run / "train.log").exists() else None)
    assert log


def test_a_released_death_watch_touches_nothing(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "20990101-000000-dddd-12345678"
    holder, info = start_holder(tmp_path, run)
    assert holder.stdin is not None and holder.stdout is not None
    holder.stdin.write("end\n")
    holder.stdin.flush()
    assert holder.stdout.readline() == "released\n"  # the watch has exited: the run ended normally
    holder.kill()
    holder.wait()
    try:
        assert sorted(p for p, _ in run_processes(run)) == sorted(info["processes"])
        assert not (run / "train.log").exists()
    finally:
        for pid in info["processes"]:
            found = ProcessId.capture(pid)
            if found:
                found.send(signal.SIGKILL)
        scratch.remove(Path(info["temp"]))


def test_the_scratch_root_is_this_users_alone(tmp_path: Path) -> None:
    made = scratch.root(tmp_path)
    assert made == tmp_path / f"mxc-{os.getuid()}" and (made.stat().st_mode & 0o777) == 0o700
    made.chmod(0o777)
    assert (scratch.root(tmp_path).stat().st_mode & 0o777) == 0o700
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link_base = tmp_path / "links"
    link_base.mkdir()
    (link_base / f"mxc-{os.getuid()}").symlink_to(elsewhere)
    with pytest.raises(RuntimeError, match="is not a directory of this user"):
        scratch.root(link_base)


def test_without_a_scratch_dir_training_runs_without_ray(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """/tmp/mxc-<uid> taken by someone else: no Ray (its temp dir would be theirs), but training runs."""
    from mxc.runtime.observe.ray_launcher import RayLauncher

    def refuse(run_dir: Path, owner: object = None) -> Path:
        raise RuntimeError("/tmp/mxc-0 is not a directory of this user: refusing to put run files there")

    monkeypatch.setattr(scratch, "create", refuse)
    launcher = RayLauncher()
    launcher.prepare(tmp_path)
    process = launcher.start(["bash", "-c", "exit 3"], dict(os.environ), tmp_path, tmp_path / "train.log")
    assert process.wait(60) == 3
    assert "is not a directory of this user" in launcher.describe()["error"]
    launcher.close()


@pytest.mark.training
def test_sigkill_of_mxc_run_takes_its_training_along(mxc: Mxc, mxc_home: Path) -> None:
    """SIGKILL leaves `mxc run` no chance; its death watch ends the training, the run shows
    lost, and `mxc cancel` closes it saying what it found."""
    build(mxc, "model.overrides.steps=100000", "runtime.preflight.stale_processes=false")
    proc = subprocess.Popen([sys.executable, "-m", "mxc", "run", "-q"], cwd=REPO, env={**os.environ,
                            "MXC_HOME": str(mxc_home)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        run = wait_until("the run directory", lambda: next(iter((mxc_home / "runs").glob("*/record.json")), None)).parent
        trainer = wait_until("the trainer process", lambda: next(iter(trainer_pids(run)), None), timeout=300)
        wait_until("the first step", lambda: "completed step: 0," in (run / "train.log").read_text(errors="replace"),
                   timeout=300)  # mid-training
        started = [ProcessId.capture(pid) for pid, _ in run_processes(run)]
        assert trainer in [p.pid for p in started if p]
    finally:
        proc.kill()
        proc.communicate()
    wait_until("every process of the run to end", lambda: run_processes(run) == [])
    assert not any(p and p.is_alive() for p in started)
    assert statuses(mxc)[run.name] == "lost"
    assert "[mxc] the supervisor (mxc run) died without ending the run: stopped" in (run / "train.log").read_text()
    out = mxc("cancel", run.name)
    assert out.returncode == 0, out.stderr
    assert "was lost" in out.stderr and "no process of it was left" in out.stderr
    assert statuses(mxc)[run.name] == "cancelled"


# ---- 4. reads never act


FAKE_SQUEUE = """#!/bin/bash
# squeue -h -t all -j ID -O ...: job 101 ended asking to be resubmitted; any other job is pending.
while [ $# -gt 0 ]; do [ "$1" = -j ] && job=$2; shift; done
if [ "$job" = 101 ]; then state=FAILED; else state=PENDING; fi
echo "$job|$state|None|node1|debug|0|75:0|2099-01-01T00:00:00|2099-01-01T00:05:00|node1|0:00|"
"""
FAKE_SBATCH = """#!/bin/bash
printf '%s\\n' "$@" > "${0%/*}/sbatch.$$.argv"
echo 202
"""


@pytest.fixture
def fake_slurm(tmp_path: Path) -> Path:
    """squeue and sbatch stand-ins on a PATH of their own; sbatch records each call."""
    return stand_ins(tmp_path, {"squeue": FAKE_SQUEUE, "sbatch": FAKE_SBATCH})


def sbatch_calls(bin_dir: Path) -> list[list[str]]:
    return [p.read_text().splitlines() for p in sorted(bin_dir.glob("sbatch.*.argv"))]


def doctored_slurm_run(mxc: Mxc, home: Path, tmp_path: Path) -> tuple[Path, str]:
    """A Slurm run whose job 101 ended asking for resubmission, with a record.json whose exports
    point at another script and preload a library."""
    digest = build(mxc, "runtime.backend=slurm")
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "job.sbatch").write_text("#!/bin/bash\ntouch /tmp/pwned\n")
    run_id = f"20990101-000000-eeee-{digest[:8]}"
    run = home / "runs" / run_id
    run.mkdir(parents=True)
    exports = {"MXC_BUNDLE_DIR": str(evil), "MXC_RUN_DIR": str(run), "MXC_RUN_ID": run_id, "MXC_RESUBMITS": "0",
               "MXC_JAX_CACHE": str(home / "cache" / "jax"), "LD_PRELOAD": str(evil / "x.so")}
    record = RunRecord(run_id=run_id, bundle=digest, spec_name="tiny", backend="slurm", status="running",
                       started="2099-01-01T00:00:00.000Z",
                       slurm=SlurmState(job_id="101", exports=exports,
                                        jobs=[SlurmJob(job_id="101", submitted="2099-01-01T00:00:00.000Z")]))
    record.save(run / "record.json")
    (run / "train.log").write_text("[mxc batch 101] USR2: asking training to checkpoint and stop\n")
    (run / "resubmit.request").write_text(json.dumps({"job_id": "101", "why": "no scontrol", "cause": "preemption"}))
    return run, digest


def test_reads_of_a_doctored_record_submit_nothing_and_write_no_record(mxc: Mxc, mxc_home: Path, tmp_path: Path,
                                                                        fake_slurm: Path) -> None:
    run, _digest = doctored_slurm_run(mxc, mxc_home, tmp_path)
    before = (run / "record.json").read_bytes()
    env = {"PATH": str(fake_slurm)}
    listed = mxc("runs", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    assert row["status"] == "running"  # the job asked for a resubmission nobody has made yet
    for args in (("logs", run.name), ("logs", run.name, "--attempts"), ("triage", run.name),
                 ("show", row["bundle"][:12])):
        out = mxc(*args, env=env)
        assert "Traceback" not in out.stderr, (args, out.stderr)
    assert sbatch_calls(fake_slurm) == []
    assert (run / "record.json").read_bytes() == before
    assert (run / "resubmit.request").exists() and not (run / ".slurm.lock").exists()


def test_watch_resubmits_the_verified_bundle_with_recomputed_exports(mxc: Mxc, mxc_home: Path, tmp_path: Path,
                                                                      fake_slurm: Path) -> None:
    run, digest = doctored_slurm_run(mxc, mxc_home, tmp_path)
    out = mxc("watch", "--once", run.name, env={"PATH": str(fake_slurm)})
    assert out.returncode == 0, out.stderr
    (warning,) = [line for line in out.stderr.splitlines() if "exports differ from what its bundle gives here" in line]
    assert "LD_PRELOAD" in warning and "MXC_BUNDLE_DIR" in warning and "recomputed" in warning
    assert f"run {run.name}: resubmitted as Slurm job 202 (no scontrol)" in out.stderr
    (argv,) = sbatch_calls(fake_slurm)
    bundle_dir = mxc_home / "bundles" / digest
    assert argv[-1] == str(bundle_dir / "job.sbatch")
    export = next(a for a in argv if a.startswith("--export="))
    assert "LD_PRELOAD" not in export and str(tmp_path / "evil") not in export
    assert f"MXC_BUNDLE_DIR={bundle_dir}" in export and "MXC_RESUBMITS=1" in export
    record = RunRecord.load(run / "record.json")
    assert record.slurm and record.slurm.job_id == "202" and record.status == "queued"
    assert "LD_PRELOAD" not in record.slurm.exports
    assert (run / "resubmit.request.101").exists() and not (run / "resubmit.request").exists()


def test_watch_without_live_slurm_runs_and_with_bad_input(mxc: Mxc, mxc_home: Path) -> None:
    for command in ("watch", "cancel"):
        helped = mxc(command, "--help")
        assert helped.returncode == 0 and "example:\n  mxc " in helped.stdout
    out = mxc("watch")
    assert out.returncode == 0 and out.stderr == "mxc: no live Slurm run to watch\n"
    for args, message in ((("nope",), "mxc: error: no run matches 'nope'"),
                          (("--interval", "0"), "mxc: error: --interval 0: expected a number of seconds above 0")):
        out = mxc("watch", *args)
        assert out.returncode == 2 and out.stderr.startswith(message) and out.stderr.count("\n") == 1, out.stderr


def test_watch_refuses_to_resubmit_a_damaged_bundle(mxc: Mxc, mxc_home: Path, tmp_path: Path,
                                                    fake_slurm: Path) -> None:
    run, digest = doctored_slurm_run(mxc, mxc_home, tmp_path)
    job = mxc_home / "bundles" / digest / "job.sbatch"
    job.chmod(0o755)
    job.write_text(job.read_text() + "\ntouch /tmp/pwned\n")
    before = (run / "record.json").read_bytes()
    out = mxc("watch", "--once", run.name, env={"PATH": str(fake_slurm)})
    assert out.returncode == 1
    assert f"mxc: error: run {run.name}: bundle {digest[:12]} is damaged: job.sbatch: changed" in out.stderr
    assert sbatch_calls(fake_slurm) == [] and (run / "record.json").read_bytes() == before


# ---- 5. Prometheus: no unauthenticated lifecycle API


def test_prometheus_refuses_quit_and_reload(tmp_path: Path) -> None:
    from mxc.runtime.observe.prometheus import PrometheusServer

    config = tmp_path / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1h\nscrape_configs: []\n")
    server = PrometheusServer.start(config, tmp_path / "data", "127.0.0.1", 29190, tmp_path / "prometheus.log")
    try:
        for path in ("/-/quit", "/-/reload"):
            request = urllib.request.Request(server.url + path, method="POST", data=b"")
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=30)
            assert refused.value.code == 403, path
        assert server.api.ready() and server.process.poll() is None
    finally:
        assert server.stop() == 0  # stopped by SIGTERM to its own process


# ---- 6. plugin names


def test_a_path_like_plugin_name_is_refused_by_the_spec(mxc: Mxc, mxc_home: Path) -> None:
    for bad in ("../x", "a.b", "", "/etc/passwd"):
        out = mxc("build", "-q", TINY, "--set", f"observability.plugins=[{json.dumps(bad)}]")
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert out.stderr.startswith("--set: observability.plugins.0: does not match"), out.stderr
    assert not (mxc_home / "bundles").exists() or not any((mxc_home / "bundles").iterdir())


def test_the_exporter_survives_path_like_plugin_names(tmp_path: Path) -> None:
    ready = tmp_path / "ready.json"
    log = tmp_path / "exporter.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "mxc.runtime.observe.exporter", "--plugins", "../x,a.b,host",
                                 "--port", "29400", "--ready-file", str(ready), "--plugins-dir", str(tmp_path)],
                                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "MXC_HOME": str(tmp_path)})
    try:
        wait_until("the exporter to serve", lambda: ready.exists() or proc.poll() is not None, timeout=60)
        assert ready.exists(), log.read_text()
        info = json.loads(ready.read_text())
        plugins = info["plugins"]
        assert plugins["../x"]["status"] == "not found" and plugins["a.b"]["status"] == "not found"
        assert plugins["host"]["status"] == "up"
        with urllib.request.urlopen(f"http://127.0.0.1:{info['port']}/metrics", timeout=30) as resp:
            assert b'mxc_exporter_plugin_up{plugin="host"} 1.0' in resp.read()
    finally:
        proc.terminate()
        proc.wait(30)
