"""The Ray launcher with a real Ray head: exit codes, signals, logs and priority flow through the
actor; closing stops exactly this head's processes and nothing else."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mxc.runtime.observe.ray_launcher import RayLauncher
from mxc.runtime.processes.procfs import pid_alive, session_processes
from tests.conftest import REPO, Mxc


@pytest.fixture(scope="module")
def launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayLauncher]:
    run = tmp_path_factory.mktemp("ray-run")
    launcher = RayLauncher()
    launcher.prepare(run)
    launcher.ready()
    yield launcher
    head = launcher.head
    assert head is not None and head.process is not None
    sid = head.process.pid
    launcher.close()
    assert session_processes(sid) == [], "every process of this Ray head is gone"
    assert not head.temp_dir.exists()
    assert (run / "ray" / "logs").is_dir() and any((run / "ray" / "logs").iterdir())


def test_exit_code_and_output_come_back_through_the_actor(launcher: RayLauncher, tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    script = ("echo nice=$(ps -o ni= -p $$ | tr -d ' ') blocked=$(grep SigBlk /proc/self/status | cut -f2) "
              "marker=$MARKER; exit 7")
    process = launcher.start(["bash", "-c", script], {**os.environ, "MARKER": "abc"}, tmp_path, log)
    assert process.wait(60) == 7 and process.poll() == 7
    text = log.read_text()
    assert "marker=abc" in text  # the environment the supervisor passed, not the Ray worker's
    assert "nice=0 " in text  # not Ray's worker niceness (15)
    assert "blocked=0000000000000000" in text  # not the Ray executor thread's signal mask


def test_signals_reach_the_whole_process_group(launcher: RayLauncher, tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    process = launcher.start(["bash", "-c", "sleep 300 & echo child=$!; wait"], dict(os.environ), tmp_path, log)
    deadline = time.monotonic() + 30
    while "child=" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    child = int(log.read_text().split("child=")[1].split()[0])
    assert process.poll() is None
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == -signal.SIGTERM
    deadline = time.monotonic() + 10
    while pid_alive(child):  # the grandchild went with the group (a zombie at most)
        assert time.monotonic() < deadline, "a process of the training outlived it"
        time.sleep(0.05)


def test_ray_metrics_endpoint_is_on_loopback(launcher: RayLauncher) -> None:
    import urllib.request

    info = launcher.describe()
    assert info["address"].startswith("127.0.0.1:")
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{info['metrics_port']}/metrics", timeout=5) as resp:
                if b"ray_" in resp.read():
                    break
        except OSError:
            pass
        assert time.monotonic() < deadline, "Ray never served its metrics"
        time.sleep(0.5)


def test_the_ray_dashboard_is_off_unless_asked_and_then_on_loopback(launcher: RayLauncher, tmp_path: Path,
                                                                     mxc: Mxc) -> None:
    """The default head serves no dashboard (no authentication of its own); observability.ray_dashboard
    starts it, on 127.0.0.1 only, and names it in the record; asking for it without Ray is one line."""
    import socket
    import urllib.error
    import urllib.request

    from mxc.runtime.observe.ray_launcher import RayHead
    from mxc.runtime.processes import scratch

    assert launcher.head is not None and "dashboard" not in launcher.describe()
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", launcher.head.ports["dashboard"])) != 0  # nothing listens there
    head = RayHead(temp_dir=scratch.create(tmp_path), log_path=tmp_path / "ray" / "head.log", run_dir=tmp_path,
                   dashboard=True)
    head.start()
    try:
        assert head.dashboard_url == f"http://127.0.0.1:{head.ports['dashboard']}"
        token_file = tmp_path / "observability" / "ray-dashboard-token"
        assert token_file.stat().st_mode & 0o777 == 0o600 and token_file.read_text().strip() == head.token
        version = urllib.request.Request(f"{head.dashboard_url}/api/version",
                                         headers={"Authorization": f"Bearer {head.token}"})
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(version, timeout=5) as resp:
                    if b"ray_version" in resp.read():
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the Ray dashboard never answered"
            time.sleep(0.5)
        with pytest.raises(urllib.error.HTTPError) as refused:  # the run's token or nothing
            urllib.request.urlopen(f"{head.dashboard_url}/api/version", timeout=10)
        assert refused.value.code == 401
    finally:
        head.stop()
        scratch.remove(head.temp_dir)
    assert not token_file.exists()
    out = mxc("build", str(REPO / "specs/tiny.yaml"), "--set", "observability.enabled=true",
              "--set", "observability.ray_dashboard=true")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.splitlines()[0] == ("--set: observability.ray_dashboard: the Ray dashboard needs Ray "
                                          "(set observability.ray: true)")


def test_without_ray_the_training_still_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from mxc.runtime.local.launcher import LocalProcess
    from mxc.runtime.observe import ray_launcher

    def broken(self: object, num_cpus: int = 1) -> None:
        raise RuntimeError("ray start exited 1")

    monkeypatch.setattr(ray_launcher.RayHead, "launch", broken)
    launcher = RayLauncher()
    launcher.prepare(tmp_path)
    process = launcher.start(["bash", "-c", "exit 3"], dict(os.environ), tmp_path, tmp_path / "train.log")
    assert isinstance(process, LocalProcess) and process.wait(30) == 3
    assert "could not start Ray: ray start exited 1" in launcher.describe()["error"]
    assert "training runs without Ray" in capsys.readouterr().err
    launcher.close()


@pytest.mark.parametrize("node_file", [{"error": "ray start exited 1"}, None])
def test_slurm_training_wrapper_trains_without_ray_when_ray_is_not_up(tmp_path: Path, node_file: dict[str, str] | None) -> None:
    """ray_node_launch (the Slurm rank's training wrapper): when the node observer reports that Ray
    failed, or Ray is not up in time, the training still runs, in place, with its own exit code."""
    obs = tmp_path / "observability"
    obs.mkdir()
    if node_file is not None:
        (obs / "ray-node-node1.attempt-0.json").write_text(json.dumps(node_file))
    out = subprocess.run([sys.executable, "-m", "mxc.runtime.observe.ray_node_launch", "--run-dir", str(tmp_path),
                          "--node", "node1",
                          "--rank", "0", "--wait", "1", "--", sys.executable, "-c", "print('trained'); raise SystemExit(3)"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 3 and out.stdout == "trained\n"
    why = "Ray on node1 did not start: ray start exited 1" if node_file else "Ray on node1 is not up after 1s"
    assert out.stderr == f"mxc: warning: {why}; training runs without Ray\n"
