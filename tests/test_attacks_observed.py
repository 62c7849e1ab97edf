"""An observed run's listeners, two runs of one bundle at once, and Ray's temporary directories
(issue 25: not attacked before). Two real `mxc run` of one bundle with observability and Ray, side
by side; the trainer is the stand-in (tests/standins/trainer.py, ``silent``: it waits for ever), so
both runs are live while the test looks at them, and `mxc cancel` ends them.

What must hold (docs/security.md, docs/observability.md): every socket any process of a run listens
on (exporter, Prometheus, Ray's GCS, raylet, agents, workers) is on loopback; an exporter answers
only the run's own scrape token; the two runs have distinct run directories, ports, tokens and Ray
clusters, each Prometheus scraping its own exporter; after the end, no process of either run is
left and each Ray temporary directory under /tmp/mxc-<uid>/ is gone.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from mxc.node.procs import descendants
from tests.conftest import REPO, Home

STANDIN = REPO / "tests" / "standins" / "trainer.py"
SETS = ("observability.enabled=true", "observability.ray=true", "observability.scrape_interval=1",
        "runtime.preflight.stale_processes=false", "checkpoint.period=0",
        "env.pass=[MXCTEST_TRAINER]")  # the stand-in trainer's behaviour (tests/standins/trainer.py)
LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


def listening(pids: set[int]) -> dict[tuple[str, int], int]:
    """(address, port) -> pid of every TCP socket in LISTEN state that one of ``pids`` holds."""
    inodes: dict[str, tuple[str, int]] = {}
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A":  # LISTEN
                continue
            address, port = fields[1].split(":")
            raw = bytes.fromhex(address)
            if width == 8:
                host = ".".join(str(b) for b in raw[::-1])
            else:  # four little-endian 32-bit words
                words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                host = str(ipaddress.IPv6Address(words))
                mapped = ipaddress.IPv6Address(words).ipv4_mapped
                host = f"::ffff:{mapped}" if mapped else host
            inodes[fields[9]] = (host, int(port, 16))
    found = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in inodes:
                found[inodes[link[8:-1]]] = pid
    return found


def wait_for(what: str, check: Any, procs: list[subprocess.Popen[str]], timeout: float = 600) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        for proc in procs:
            assert proc.poll() is None, f"{what}: mxc run ended early: {proc.communicate()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def owned(proc: subprocess.Popen[str], runs: list[Path], procs: list[subprocess.Popen[str]]) -> Path:
    """Which of ``runs`` ``proc`` (an `mxc run`) runs: the one whose trainer is its descendant."""
    def mine() -> Path | None:
        for run in runs:
            started = run / "standin.attempt-0.rank-0"
            if started.exists() and started.read_text().strip().isdigit() and \
                    int(started.read_text()) in tree(proc):
                return run
        return None

    found: Path = wait_for("the trainer of each mxc run", mine, procs)
    return found


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def tree(proc: subprocess.Popen[str]) -> set[int]:
    return {proc.pid, *descendants(proc.pid)}


def services(proc: subprocess.Popen[str], run: Path, ray: bool) -> dict[str, Any] | None:
    """The run's exporter and Prometheus ports (and Ray's temporary directory) once all are up and the
    trainer runs; None before. Read from what the run writes and what its processes listen on."""
    try:
        exporter = json.loads((run / "observability" / "exporter-ready.json").read_text())["port"]
    except (OSError, ValueError, KeyError):
        return None
    sockets = listening(tree(proc))
    prometheus = [port for (_, port), pid in sockets.items() if comm(pid) == "prometheus"]
    heads = {comm(pid) for pid in sockets.values()} >= {"gcs_server", "raylet"}
    if not prometheus or not (run / "standin.attempt-0.rank-0").exists():
        return None
    if ray and not heads:  # the training starts once Ray is up, or without it when Ray could not start
        log = (run / "ray" / "head.log").read_text(errors="replace") if (run / "ray" / "head.log").exists() else ""
        raise AssertionError(f"Ray did not start, so its listeners cannot be looked at: {log[-600:]}")
    temp = [d for d in scratch_root().glob("*") if (d / "owner.json").exists()
            and json.loads((d / "owner.json").read_text())["run_dir"] == str(run)]
    return {"exporter": exporter, "prometheus": prometheus[0], "sockets": sockets, "temp": temp,
            "token": (run / "prometheus" / "scrape-token").read_text().strip()}


def scratch_root() -> Path:
    return Path("/tmp") / f"mxc-{os.getuid()}"


def get(url: str, token: str | None = None) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def get_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        return str(response.read().decode())


def start_runs(home: Home, tmp_path: Path, count: int, *sets: str) -> tuple[list[subprocess.Popen[str]], str]:
    bundle = home.build(REPO / "specs/tiny.yaml", (*SETS, *sets))
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text(f'#!/bin/bash\nif [ "$1" = -m ]; then exec {sys.executable} {STANDIN} "$@"; fi\nexit 0\n')
    python.chmod(0o755)
    env = {"MXC_PYTHON": str(python), "MXCTEST_TRAINER": "*=silent"}
    return [home.start("run", bundle, "-q", env=env) for _ in range(count)], bundle


def loopback_only(run: Path, sockets: dict[tuple[str, int], int]) -> None:
    exposed = {f"{host}:{port} (pid {pid}: {comm(pid)})" for (host, port), pid in sockets.items() if host not in LOOPBACK}
    assert exposed == set(), f"{run.name} listens beyond loopback"


def cancel_all(home: Home, runs: list[Path], procs: list[subprocess.Popen[str]]) -> set[int]:
    """Every process of the runs (as they are now), after `mxc cancel` of each and the end of `mxc run`."""
    everything = {pid for proc in procs for pid in tree(proc)}
    for run in runs:
        assert home.cli("cancel", run.name).returncode == 0
    for proc in procs:
        proc.communicate(timeout=600)
    return everything


def alive(pids: set[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                out.append(f"{pid} {comm(pid)}")
        except OSError:
            pass
    return out


def none_left(pids: set[int], timeout: float = 300) -> None:
    """Every process of the runs exits: `mxc run` returns once the record is final, while the run's
    supervisor still stops Prometheus and Ray and removes Ray's directory (waited for: their exits)."""
    deadline = time.monotonic() + timeout
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert alive(pids) == [], "no process of a run outlives it"


def test_two_observed_runs_of_one_bundle_listen_on_loopback_apart_and_leave_nothing(tmp_path: Path) -> None:
    home = Home(tmp_path / "mxc")
    procs, _ = start_runs(home, tmp_path, 2)
    try:
        runs = wait_for("two run directories", lambda: len(home.runs()) == 2 and sorted(home.runs()), procs)
        runs = [owned(proc, runs, procs) for proc in procs]
        found = [wait_for(f"{run.name} observed", lambda run=run, proc=proc: services(proc, run, ray=False), procs)
                 for proc, run in zip(procs, runs, strict=True)]
        for run, seen in zip(runs, found, strict=True):
            loopback_only(run, seen["sockets"])
            exporter, prometheus, token = seen["exporter"], seen["prometheus"], seen["token"]
            assert ("127.0.0.1", exporter) in seen["sockets"] and ("127.0.0.1", prometheus) in seen["sockets"]
            assert get(f"http://127.0.0.1:{exporter}/metrics") == 401
            assert get(f"http://127.0.0.1:{exporter}/metrics", "x" * len(token)) == 401
            assert get(f"http://127.0.0.1:{exporter}/metrics", token) == 200
            targets = json.loads(get_text(f"http://127.0.0.1:{prometheus}/api/v1/targets"))["data"]["activeTargets"]
            seen["targets"] = {t["scrapeUrl"] for t in targets}
            assert f"http://127.0.0.1:{exporter}/metrics" in seen["targets"], targets
        first, second = found
        for key in ("exporter", "prometheus", "token"):
            assert first[key] != second[key], key  # nothing shared between the two runs of one bundle
        assert get(f"http://127.0.0.1:{second['exporter']}/metrics", first["token"]) == 401
        assert f"http://127.0.0.1:{second['exporter']}/metrics" not in first["targets"]  # each scrapes its own
        assert f"http://127.0.0.1:{first['exporter']}/metrics" not in second["targets"]
        everything = cancel_all(home, runs, procs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    none_left(everything)


def test_an_observed_runs_ray_listens_on_loopback_and_its_temp_dir_goes_with_it(tmp_path: Path) -> None:
    home = Home(tmp_path / "mxc")
    procs, _ = start_runs(home, tmp_path, 1, "observability.ray=true")
    try:
        [run] = wait_for("the run directory", lambda: home.runs() and sorted(home.runs()), procs)
        seen = wait_for(f"{run.name} observed with Ray", lambda: services(procs[0], run, ray=True), procs)
        loopback_only(run, seen["sockets"])
        # Ray's temporary directory and the supervisor's registration, under this user's /tmp/mxc-<uid>/ (0700)
        temps = seen["temp"]
        ray_temps = [d for d in temps if {p.name for p in d.iterdir()} - {"owner.json"}]
        assert len(temps) == 2 and len(ray_temps) == 1, temps
        assert all(t.parent == scratch_root() for t in temps) and (scratch_root().stat().st_mode & 0o077) == 0
        everything = cancel_all(home, [run], procs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    none_left(everything)
    assert [t for t in temps if t.exists()] == [], "Ray's temporary directory and the registration go at the end"
