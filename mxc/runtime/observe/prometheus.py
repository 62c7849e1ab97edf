"""A real Prometheus (Debian's ``/usr/bin/prometheus``) per run, and a small client for its API.

Layout under ``<run>/prometheus/``: ``prometheus.yml`` (the bundle's, copied), ``targets/``
(file_sd target files the run writes: ``exporter-<node>.json``, ``ray-<node>.json``) and
``data/`` (the TSDB). Retention is set to 100 years: the default (15 days) would delete a
run's history the first time it is reopened after two weeks.

Ports: Prometheus binds by itself, so a port is first probed free, then tried; if the
process exits with "address already in use" (someone took it meanwhile) the next port is
tried. Ready means ``/-/ready`` answers 200.

No ``--web.enable-lifecycle``: its ``/-/quit`` and ``/-/reload`` take no authentication, so anyone
on the host could stop or reconfigure a run's Prometheus. mxc stops it by signal instead
(SIGTERM to the process it started, which it alone can reap, so the pid cannot have been reused).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mxc.errors import UserError
from mxc.runtime.processes.lifetime import tied_to_caller

RETENTION = "100y"
READY_TIMEOUT = 60.0
PORT_TRIES = 50


def prometheus_binary() -> str:
    found = shutil.which("prometheus") or ("/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None)
    if not found:
        raise UserError("prometheus is not installed", "Debian: apt-get install prometheus (scripts/setup.sh does)")
    return found


def promtool_check(config: Path) -> subprocess.CompletedProcess[str]:
    """``promtool check config`` (also checks the file_sd target files it can see)."""
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    return subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True, check=False)


def port_is_free(bind: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((bind, port))
        except OSError:
            return False
    return True


def free_ports(bind: str, first: int, tries: int = PORT_TRIES) -> list[int]:
    return [p for p in range(first, min(first + tries * 4, 65536)) if port_is_free(bind, p)][:tries]


class PrometheusAPI:
    """The HTTP API calls mxc needs; results are the ``data`` member of the JSON answer."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        query = "?" + urllib.parse.urlencode(params, doseq=True) if params else ""
        try:
            with urllib.request.urlopen(self.url + path + query, timeout=self.timeout) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            try:
                body = json.loads(exc.read())
            except ValueError:
                raise UserError(f"Prometheus answered HTTP {exc.code} for {path}") from None
        if body.get("status") != "success":
            raise UserError(f"Prometheus: {body.get('errorType', 'error')}: {body.get('error', body)}")
        return body["data"]

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as resp:
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._get("/api/v1/query", params)
        result: list[dict[str, Any]] = data["result"] if data["resultType"] in ("vector", "matrix") else [
            {"metric": {}, "value": data["result"]}]
        return result

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        data = self._get("/api/v1/query_range",
                         {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{max(step, 0.001):.3f}"})
        result: list[dict[str, Any]] = data["result"]
        return result

    def label_values(self, label: str, start: float | None = None, end: float | None = None,
                     match: str | None = None) -> list[str]:
        params: dict[str, Any] = {}
        if start is not None:
            params["start"] = f"{start:.3f}"
        if end is not None:
            params["end"] = f"{end:.3f}"
        if match:
            params["match[]"] = match
        values: list[str] = self._get(f"/api/v1/label/{label}/values", params)
        return values

    def targets(self) -> list[dict[str, Any]]:
        active: list[dict[str, Any]] = self._get("/api/v1/targets")["activeTargets"]
        return active


@dataclass
class PrometheusServer:
    """A Prometheus process this mxc started (and only that one is ever stopped)."""

    process: subprocess.Popen[bytes]
    bind: str
    port: int
    config: Path
    data: Path

    @property
    def url(self) -> str:
        return f"http://{self.bind}:{self.port}"

    @property
    def api(self) -> PrometheusAPI:
        return PrometheusAPI(self.url)

    @classmethod
    def start(cls, config: Path, data: Path, bind: str = "127.0.0.1", first_port: int = 9190,
              log_path: Path | None = None, extra_args: tuple[str, ...] = (),
              env: dict[str, str] | None = None, nice: int = 0) -> PrometheusServer:
        binary = prometheus_binary()
        data.mkdir(parents=True, exist_ok=True)
        log_path = log_path or config.parent / "prometheus.log"
        last_error = ""
        for port in free_ports(bind, first_port):
            argv = [binary, f"--config.file={config}", f"--storage.tsdb.path={data}",
                    f"--web.listen-address={bind}:{port}", f"--storage.tsdb.retention.time={RETENTION}", *extra_args]
            with open(log_path, "ab") as log:
                process = subprocess.Popen(tied_to_caller(argv), stdin=subprocess.DEVNULL, stdout=log,
                                           stderr=subprocess.STDOUT, cwd=config.parent, start_new_session=True,
                                           env=env)
            lower_priority(process.pid, nice)
            server = cls(process, bind, port, config, data)
            deadline = time.monotonic() + READY_TIMEOUT
            while time.monotonic() < deadline:
                if process.poll() is not None:
                    break
                if server.api.ready():
                    return server
                time.sleep(0.05)
            if process.poll() is None:
                server.stop()
                raise RuntimeError(f"prometheus did not become ready in {READY_TIMEOUT:.0f}s (log: {log_path})")
            last_error = _tail(log_path)
            if "address already in use" not in last_error:
                break
        raise RuntimeError(f"prometheus failed to start: {last_error.strip()[-500:]} (log: {log_path})")

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (Prometheus flushes and closes the TSDB), SIGKILL after ``timeout``; to our own
        unreaped child only (``Popen`` signals nothing once it has reaped it)."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    self.process.kill()
                self.process.wait()
        return self.process.returncode


def lower_priority(pid: int, nice: int) -> None:
    """Raise ``pid``'s nice value by ``nice`` (0: leave it): a helper started beside the training
    yields the CPU to it (on a busy node its start-up would otherwise slow the training's)."""
    if nice > 0:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, pid, min(19, os.getpriority(os.PRIO_PROCESS, pid) + nice))


def _tail(path: Path, size: int = 4000) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, path.stat().st_size - size))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def readonly_copy(tsdb: Path, dest: Path) -> None:
    """A copy of a TSDB that a second Prometheus may open, compact and lock without touching
    the original: immutable block files (``chunks/*``, ``index``) are hard-linked (no space,
    no time), everything Prometheus may rewrite (WAL, head chunks, meta, tombstones) is copied."""
    dest.mkdir(parents=True, exist_ok=True)
    for root, dirs, files in os.walk(tsdb):
        rel = Path(root).relative_to(tsdb)
        if rel.parts and rel.parts[0] in ("lock",):
            continue
        target = dest / rel
        target.mkdir(parents=True, exist_ok=True)
        for name in files:
            if name == "lock":
                continue
            src = Path(root) / name
            immutable = (len(rel.parts) >= 1 and rel.parts[-1] == "chunks" and rel.parts[0] != "chunks_head"
                         and rel.parts[0] != "wal") or (name == "index" and len(rel.parts) == 1)
            if immutable:
                try:
                    os.link(src, target / name)
                    continue
                except OSError:
                    pass
            shutil.copy2(src, target / name)
        dirs[:] = [d for d in dirs if not d.endswith(".tmp")]


def write_targets(targets_dir: Path, name: str, addresses: list[str], labels: dict[str, str]) -> Path:
    """A file_sd target file, written atomically (Prometheus may read it at any moment)."""
    from mxc.fsutil import write_atomic

    path = targets_dir / f"{name}.json"
    write_atomic(path, json.dumps([{"targets": addresses, "labels": labels}], indent=2) + "\n")
    return path
