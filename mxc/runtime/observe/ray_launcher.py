"""The Ray launcher: one Ray head per run on loopback, training as a subprocess of a Ray actor.

Why Ray at all for one node: the actor is the piece that multi-node jobs grow from (workers
join the head from the other nodes and each runs its node's training the same way), and
Ray's own metrics (``--metrics-export-port``) land in the run's Prometheus next to ours.

* The head is ``ray start --head --block`` in its own session, so every Ray process this
  run started (gcs, raylet, dashboard agent, workers) shares that session id, and ``stop``
  ends exactly those: SIGTERM to ``ray start`` (it stops its children), then SIGKILL to any
  process of that session still alive. ``ray stop`` is never used: it kills every Ray on
  the machine, other users' included.
* Everything listens on 127.0.0.1: ``--node-ip-address``, ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``
  (without it the driver resolves 127.0.0.1 to the host's address and cannot connect), and
  explicit free ports for every Ray server (its defaults, 8265/10001/..., collide between
  runs on one machine).
* Ray's unix sockets must fit in 107 bytes, so its temp dir is short: the run's own under
  ``/tmp/mxc-<uid>/`` (``mxc.runtime.processes.scratch``: this user's alone, never Ray's shared ``/tmp/ray``);
  the logs are copied to ``<run>/ray/logs`` when the run ends and the temp dir is removed. A
  run killed before that leaves it to its death watch, ``mxc cancel`` or the next ``mxc run``.
* Every Ray process of the run carries ``MXC_RUN_DIR`` in its environment, so what is left of
  a killed run can be found (``mxc.runtime.processes.leftovers``).
* The training subprocess runs in its own process group inside the actor (the same
  ``LocalLauncher`` as without Ray), its output appended to the run's log; exit codes and
  signals flow back through the actor. If the actor dies, the training is killed by its
  process group directly (same machine), never left behind.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mxc.fsutil import write_atomic
from mxc.runtime.local.launcher import LocalLauncher, LocalProcess
from mxc.runtime.observe.prometheus import free_ports
from mxc.runtime.processes import scratch
from mxc.runtime.processes.lifetime import tied_to_caller
from mxc.runtime.processes.procfs import ProcessId, session_processes

HEAD_TIMEOUT = 120.0
# Ray runs workers at nice 15 by default; the training inherits its actor's priority, and at
# nice 15 it loses every CPU contest on a shared node (measured: half the steps/s).
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_worker_niceness": "0"}
LOG_COPY_LIMIT = 20 * 1024 * 1024  # bytes of Ray logs kept in the run directory
DASHBOARD_TOKEN = "ray-dashboard-token"


def cluster_environment(token: str, multi_node: bool = False) -> dict[str, str]:
    """Ray's environment for one run's cluster. Single-node: ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``
    keeps 127.0.0.1 as is (else Ray resolves it to the host's address and cannot connect); a
    multi-node cluster needs it on, and is reachable on the nodes' network address instead."""
    return {**RAY_ENV, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1" if multi_node else "0",
            "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}


@dataclass
class RayHead:
    """A Ray node this run started: the head, or (``join`` = the head's address) a worker node
    of a multi-node job; knows its ports and how to stop only its own processes."""

    temp_dir: Path
    log_path: Path
    run_dir: Path | None = None  # marks every Ray process of the run (MXC_RUN_DIR in their environment)
    bind: str = "127.0.0.1"
    join: str | None = None
    multi_node: bool = False  # a cluster spanning nodes (Slurm), on the nodes' network address
    dashboard: bool = False  # the head serves Ray's dashboard (observability.ray_dashboard), on 127.0.0.1 only
    # Token authentication with a fresh token per run: only this run's driver and workers use
    # its cluster (and a ~/.ray/auth_token left by someone else cannot get in the way).
    token: str = field(default_factory=lambda: secrets.token_hex(32))
    process: subprocess.Popen[bytes] | None = None
    identity: ProcessId | None = None  # of ``ray start``, taken at launch
    gcs_port: int = 0
    metrics_port: int = 0
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return self.join or f"{self.bind}:{self.gcs_port}"

    @property
    def dashboard_url(self) -> str | None:
        return f"http://127.0.0.1:{self.ports['dashboard']}" if self.dashboard and not self.join else None

    @property
    def dashboard_token_file(self) -> Path | None:
        """Where the dashboard's user finds the run's Ray token, which it asks for (token authentication,
        like every Ray server of the run): ``<run>/observability/ray-dashboard-token``, 0600, removed
        with the head."""
        return self.run_dir / "observability" / DASHBOARD_TOKEN if self.dashboard_url and self.run_dir else None

    def environment(self) -> dict[str, str]:
        """What the head, the driver and every worker need in their environment."""
        return cluster_environment(self.token, multi_node=self.multi_node)

    def start(self, num_cpus: int = 1) -> None:
        self.launch(num_cpus)
        self.wait_ready()

    def launch(self, num_cpus: int = 1) -> None:
        """Start ``ray start --head --block``; ``wait_ready`` waits for it (overlap work in between)."""
        names = ["gcs", "metrics", "client", "agent_http", "agent_grpc", "runtime_env", "node_manager",
                 "object_manager", "dashboard"]
        ports = dict(zip(names, free_ports(self.bind, 20000 + os.getpid() % 20000, len(names)), strict=True))
        self.ports, self.gcs_port, self.metrics_port = ports, ports["gcs"], ports["metrics"]
        ray_bin = str(Path(sys.executable).with_name("ray"))
        node = [f"--node-ip-address={self.bind}", f"--metrics-export-port={ports['metrics']}",
                f"--dashboard-agent-listen-port={ports['agent_http']}", f"--dashboard-agent-grpc-port={ports['agent_grpc']}",
                f"--runtime-env-agent-port={ports['runtime_env']}", f"--node-manager-port={ports['node_manager']}",
                f"--object-manager-port={ports['object_manager']}", f"--num-cpus={num_cpus}", f"--temp-dir={self.temp_dir}",
                "--disable-usage-stats", "--include-log-monitor=false"]  # no log streaming: idle CPU stays near zero
        if self.join:
            role = [f"--address={self.join}"]
        else:  # no autoscaler monitor; the dashboard (no authentication of its own) only if asked, on loopback
            role = ["--head", f"--port={ports['gcs']}", f"--ray-client-server-port={ports['client']}",
                    f"--dashboard-port={ports['dashboard']}",
                    f"--dashboard-host={'127.0.0.1' if self.dashboard else self.bind}",
                    f"--include-dashboard={'true' if self.dashboard else 'false'}", "--no-monitor"]
        argv = [ray_bin if Path(ray_bin).exists() else "ray", "start", "--block", *role, *node]
        env = {**os.environ, **self.environment(), **({"MXC_RUN_DIR": str(self.run_dir)} if self.run_dir else {})}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(tied_to_caller(argv), stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.identity = ProcessId.capture(self.process.pid)
        if self.dashboard_token_file is not None:
            write_atomic(self.dashboard_token_file, self.token + "\n", 0o600)

    def wait_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + HEAD_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"ray start exited {self.process.returncode} (log: {self.log_path})")
            if "Ray runtime started" in self.log_path.read_text(errors="replace"):
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"the Ray head did not start in {HEAD_TIMEOUT:.0f}s (log: {self.log_path})")

    def stop(self, grace: float = 10.0) -> None:
        if self.dashboard_token_file is not None:
            self.dashboard_token_file.unlink(missing_ok=True)
        if self.process is None:
            return
        sid = self.process.pid
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(grace)
        for pid in session_processes(sid):  # the session id is ours while ray start is unreaped
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if self.process.poll() is None:
            self.process.kill()
        deadline = time.monotonic() + grace
        while session_processes(sid) and time.monotonic() < deadline:
            time.sleep(0.05)  # SIGKILLed: only the kernel's exit path is left
        self.process.wait()

    def keep_logs(self, dest: Path) -> None:
        """Copy Ray's session logs (bounded in size) to the run directory."""
        logs = self.temp_dir / "session_latest" / "logs"
        if not logs.is_dir():
            return
        kept = 0
        for path in sorted(logs.rglob("*")):
            if not path.is_file() or path.stat().st_size == 0:
                continue
            size = path.stat().st_size
            if kept + size > LOG_COPY_LIMIT:
                continue
            target = dest / path.relative_to(logs)
            target.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError):
                shutil.copy2(path, target)
                kept += size


class TrainingActor:
    """Runs inside a Ray worker: one training subprocess at a time (decorated with ray.remote lazily)."""

    def __init__(self) -> None:
        self._process: LocalProcess | None = None

    def start(self, argv: list[str], env: dict[str, str], cwd: str, log_path: str) -> int:
        # Ray's executor threads block SIGINT, and a child inherits its forking thread's mask:
        # start the training with nothing blocked, as a shell would.
        blocked = signal.pthread_sigmask(signal.SIG_SETMASK, set())
        try:
            self._process = LocalLauncher().start(argv, env, Path(cwd), Path(log_path))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        assert self._process.pid is not None
        return self._process.pid

    def wait(self) -> int:
        assert self._process is not None
        return self._process.wait()

    def send_signal(self, signum: int) -> None:
        if self._process is not None:
            self._process.send_signal(signum)

    def node(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "host": os.uname().nodename}


class RayTrainingProcess:
    """The supervisor's handle (a ``TrainingProcess``) on a training run by the actor."""

    def __init__(self, ray: Any, actor: Any, pid: int) -> None:
        self._ray = ray
        self._actor = actor
        self.pid: int | None = pid
        self._done = actor.wait.remote()
        self._code: int | None = None

    def poll(self) -> int | None:
        if self._code is None:
            ready, _ = self._ray.wait([self._done], timeout=0)
            if ready:
                self._code = self._result()
        return self._code

    def wait(self, timeout: float | None = None) -> int:
        if self._code is None:
            ready, _ = self._ray.wait([self._done], timeout=timeout)
            if not ready:
                raise subprocess.TimeoutExpired("ray actor", timeout or 0)
            self._code = self._result()
        return self._code

    def _result(self) -> int:
        try:
            return int(self._ray.get(self._done))
        except Exception as exc:  # the actor died: kill the training ourselves, report a SIGKILL
            print(f"mxc: warning: the Ray actor running training died ({type(exc).__name__}); "
                  "killing the training process group", file=sys.stderr)
            self._kill_group(signal.SIGKILL)
            return -signal.SIGKILL

    def send_signal(self, signum: int) -> None:
        if self._code is not None:
            return
        try:
            self._ray.get(self._actor.send_signal.remote(signum), timeout=10)
        except Exception:
            self._kill_group(signum)

    def _kill_group(self, signum: int) -> None:
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signum)


class RayLauncher:
    """A ``Launcher``: ``prepare`` starts the head in the background (overlapping the rest of
    the run's set-up); ``start`` waits for it and runs the training through the actor."""

    def __init__(self, num_cpus: int = 1, dashboard: bool = False) -> None:
        self.num_cpus = num_cpus
        self.dashboard = dashboard
        self.head: RayHead | None = None
        self.run_dir: Path | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._ray: Any = None
        self._actor: Any = None
        self.on_ready: list[Callable[[RayHead], None]] = []
        self.fallback: str | None = None  # why training runs without Ray, if it does

    # ---- set-up

    def prepare(self, run_dir: Path) -> None:
        if self._thread is not None:
            return
        self.run_dir = run_dir
        try:  # a scratch dir that cannot be made (/tmp/mxc-<uid> not ours) means no Ray, not no training
            self.head = RayHead(temp_dir=scratch.create(run_dir), log_path=run_dir / "ray" / "head.log",
                                run_dir=run_dir, dashboard=self.dashboard)
            self.head.launch(self.num_cpus)  # in the caller's thread: the head dies with it (lifetime.py)
        except Exception as exc:
            self._error = exc
        self._thread = threading.Thread(target=self._bring_up, name="mxc-ray-head", daemon=True)
        self._thread.start()

    def _bring_up(self) -> None:
        try:
            if self._error is not None:
                return
            assert self.head is not None
            os.environ.update(self.head.environment())  # read by ray at import: keep 127.0.0.1, use the run's token
            import ray  # noqa: F401  # while the head starts (an import takes about a second)

            self.head.wait_ready()
            for callback in self.on_ready:
                callback(self.head)
            self._connect()
        except BaseException as exc:
            self._error = exc

    def _connect(self) -> None:
        """ray.init in this (non-main) thread: Ray then leaves the supervisor's signal handlers alone."""
        assert self.head is not None
        import ray

        ray.init(address=self.head.address, _node_ip_address=self.head.bind, logging_level=logging.ERROR,
                 log_to_driver=False, namespace=f"mxc-{self.run_dir.name if self.run_dir else 'run'}")
        # max_concurrency: wait() blocks in one actor thread while send_signal() runs in another.
        self._actor = ray.remote(TrainingActor).options(num_cpus=0, max_concurrency=4, name="mxc-training").remote()
        ray.get(self._actor.node.remote(), timeout=HEAD_TIMEOUT)
        self._ray = ray

    def ready(self, timeout: float = HEAD_TIMEOUT) -> None:
        if self._thread is None:
            raise RuntimeError("RayLauncher.prepare(run_dir) was not called")
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError(f"the Ray head was not ready in {timeout:.0f}s")
        if self._error is not None:
            raise RuntimeError(f"could not start Ray: {self._error}") from self._error

    # ---- Launcher

    def start(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path,
              log_path: Path) -> RayTrainingProcess | LocalProcess:
        """Through the actor; if Ray could not start, as a plain subprocess (training matters more)."""
        if self._thread is None:
            self.prepare(log_path.parent)
        try:
            self.ready()
        except RuntimeError as exc:
            if self.fallback is None:
                self.fallback = str(exc)
                print(f"mxc: warning: {exc}; training runs without Ray", file=sys.stderr)
            return LocalLauncher().start(argv, env, cwd, log_path)
        # faulthandler: a SIGABRT (the hang watchdog's fallback when py-spy is missing) prints
        # every thread's Python stack into the log before the process dies.
        full_env = {**env, "PYTHONFAULTHANDLER": env.get("PYTHONFAULTHANDLER", "1")}
        pid = self._ray.get(self._actor.start.remote(list(argv), full_env, str(cwd), str(log_path)), timeout=60)
        return RayTrainingProcess(self._ray, self._actor, int(pid))

    def close(self) -> None:
        if self._thread is not None:
            self._thread.join(HEAD_TIMEOUT)
        if self._ray is not None:
            with contextlib.suppress(Exception):
                self._ray.kill(self._actor)
            with contextlib.suppress(Exception):
                self._ray.shutdown()
        if self.head is not None:
            self.head.stop()
            if self.run_dir is not None:
                self.head.keep_logs(self.run_dir / "ray" / "logs")
            scratch.remove(self.head.temp_dir)

    def describe(self) -> dict[str, Any]:
        if self.fallback is not None:
            return {"error": self.fallback, **({"log": str(self.head.log_path)} if self.head else {})}
        if self.head is None:
            return {}
        identity = self.head.identity
        return {"address": self.head.address, "metrics_port": self.head.metrics_port, "ports": self.head.ports,
                "head": identity.as_record() if identity else None, "temp_dir": str(self.head.temp_dir),
                "logs": str(self.run_dir / "ray") if self.run_dir else None,
                **({"dashboard": self.head.dashboard_url} if self.head.dashboard_url else {})}
