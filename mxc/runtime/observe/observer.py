"""Observability for one run: the exporter, a Prometheus TSDB in the run directory, Ray.

``extensions(contract)`` is what the local backend calls (``mxc.runtime.backends.extensions``)
when the bundle has ``observability.enabled``: it returns the Ray launcher and the
``Observability`` observer. The observer

* on start: starts, in a background thread so the training does not wait for any of it, the
  exporter (``python -m mxc.runtime.observe.exporter``) and Prometheus on the run's TSDB
  (``<run>/prometheus/data``), writes their file_sd targets, and records URLs, ports and process
  identities (pid, start time, boot id) in ``record.observability``; with ``observability.ray``
  it has the launcher bring up Ray (its metrics become a target too; the training then runs in a
  Ray actor, so it does wait for Ray);
  every helper carries ``MXC_RUN_DIR`` in its environment, like the training;
* per attempt: appends to the run's event file (restarts and hangs become annotations; hangs
  are found by the node program's hang watch on every rank, mxc/node/trainer.py);
* at the end: waits (bounded) until Prometheus has scraped once after training ended, so
  the TSDB holds the final step, then stops what it started. The TSDB stays in the run
  directory; ``mxc metrics`` / ``mxc dashboard`` reopen it later.

It never fails the run: anything that cannot start is recorded in
``record.observability["errors"]`` and training goes on without it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from mxc.compiler.alert_rules import ALERT_RULES
from mxc.fsutil import read_json, write_json_atomic
from mxc.node.contract import Observability as ObservabilitySettings
from mxc.node.contract import RunContract
from mxc.runtime.hooks import TrainingProcess
from mxc.runtime.observe import alert_notify, run_events, scrape_token, site_exporters
from mxc.runtime.observe.alert_receiver import FILE as ALERTS_FILE
from mxc.runtime.observe.alert_receiver import AlertLog, AlertReceiver
from mxc.runtime.observe.prometheus import PrometheusServer, lower_priority, write_targets
from mxc.runtime.observe.ray_launcher import RayHead, RayLauncher
from mxc.runtime.processes.lifetime import tied_to_caller
from mxc.runtime.processes.procfs import ProcessId
from mxc.runtime.record import RunRecord
from mxc.runtime.rundir import RunDir

EXPORTER_READY_TIMEOUT = 60.0
STARTED_KEYS = ("exporter", "prometheus", "alerts")  # what start_services records
HELPER_NICE = 10  # exporter and Prometheus yield the CPU to the training (benchmarks/observe_overhead.py)


def extensions(contract: RunContract) -> tuple[RayLauncher | None, list[Observability]]:
    """The Ray launcher (only with ``observability.ray``; without it the supervisor starts the
    training itself) and the observer."""
    launcher = RayLauncher(dashboard=contract.observability.ray_dashboard) if contract.observability.ray else None
    return launcher, [Observability(contract.observability, contract.name, launcher)]


def observability_dir(run: RunDir) -> Path:
    return run.path / "observability"


def prometheus_dir(run: RunDir) -> Path:
    return run.tsdb


def tsdb_data(run: RunDir) -> Path:
    return run.tsdb / "data"


class Observability:
    """A ``RunObserver``; see the module docstring."""

    def __init__(self, settings: ObservabilitySettings, name: str, launcher: RayLauncher | None = None,
                 bundle_dir: Path | None = None) -> None:
        self.name = name
        self.settings = settings
        self.launcher = launcher
        self.bundle_dir = bundle_dir
        self.node = socket.gethostname()
        self.exporter: subprocess.Popen[bytes] | None = None
        self.prometheus: PrometheusServer | None = None
        self.receiver: AlertReceiver | None = None
        self.starting: threading.Thread | None = None  # the local run's start-up thread (on_start)
        self.started = threading.Event()
        self.finished = threading.Event()
        self.info: dict[str, Any] = {}
        self.errors: list[str] = []
        self.hangs = 0
        self.run: RunDir | None = None
        self.exporter_args: list[str] = []

    # ---- RunObserver

    def on_start(self, run: RunDir, record: RunRecord) -> None:
        self.run = run
        obs_dir = observability_dir(run)
        obs_dir.mkdir(parents=True, exist_ok=True)
        run_events.append(obs_dir / run_events.EVENTS, "run_start", run=run.run_id)
        if self.launcher is not None:
            self.launcher.on_ready.append(self._ray_ready)
            self.launcher.prepare(run.path)
        bundle = self._bundle_dir(run, record)
        # Every key the start-up thread sets exists already: the supervisor saves the record (this
        # dict) from its own thread meanwhile, and a dict may have values replaced, never keys added,
        # while another thread iterates it. Keys left empty are dropped at the end.
        self.info = {"scrape_interval": self.settings.scrape_interval, "events": str(obs_dir / run_events.EVENTS),
                     "tsdb": str(tsdb_data(run)), "errors": self.errors, **{key: {} for key in STARTED_KEYS}}
        record.observability = self.info
        self.starting = threading.Thread(target=self._start_in_background, args=(run, bundle),
                                         name="mxc-observability", daemon=True)
        self.starting.start()

    def _start_in_background(self, run: RunDir, bundle: Path | None) -> None:
        try:
            self.start_services(run, bundle)
        finally:
            self.started.set()
        # The helpers die with the thread that started them (setpriv --pdeathsig: mxc/runtime/processes/lifetime.py),
        # so this one lives until on_end has stopped them.
        self.finished.wait()

    def _wait_started(self) -> None:
        """Once the training has ended (attempt end, run end): wait until the start-up is done
        (bounded by each piece's own timeout), then drop what did not start from the record."""
        if self.starting is None:
            return
        self.started.wait()
        for key in STARTED_KEYS:
            if self.info.get(key) == {}:
                del self.info[key]

    def on_attempt(self, run: RunDir, record: RunRecord, process: TrainingProcess) -> None:
        number = record.attempts[-1].number if record.attempts else 0
        run_events.append(observability_dir(run) / run_events.EVENTS, "attempt_start", attempt=number,
                          resumed_from_step=record.attempts[-1].resumed_from_step if record.attempts else None)
        if self.launcher is not None:
            self.info["ray"] = self.launcher.describe()
            if "error" in self.info["ray"] and not any(e.startswith("ray:") for e in self.errors):
                self.errors.append(f"ray: {self.info['ray']['error']}")

    def on_attempt_end(self, run: RunDir, record: RunRecord, exit_code: int) -> None:
        self._wait_started()  # before the supervisor's final save of the record
        number = record.attempts[-1].number if record.attempts else 0
        attempt = record.attempts[-1] if record.attempts else None
        if attempt is not None and attempt.hung:  # the supervisor read the rank's hang event
            self.hangs += 1
            run_events.append(observability_dir(run) / run_events.EVENTS, "hang", attempt=number,
                              idle_seconds=attempt.idle_seconds)
        run_events.append(observability_dir(run) / run_events.EVENTS, "attempt_end", attempt=number, exit_code=exit_code)
        self.info["hangs"] = self.hangs

    def on_end(self, run: RunDir, record: RunRecord) -> None:
        ended = time.time()
        self._wait_started()
        run_events.append(observability_dir(run) / run_events.EVENTS, "run_end", status=record.status)
        try:
            if self.prometheus is not None and self.exporter is not None:
                self.wait_for_scrape_after(ended)
            self.stop()
        finally:
            self.finished.set()
        summary = {**self.info, "ended": ended, "status": record.status}
        with contextlib.suppress(OSError):
            write_json_atomic(observability_dir(run) / "summary.json", summary)

    # ---- parts (also used by mxc.runtime.observe.node_observer on Slurm nodes)

    def start_services(self, run: RunDir, bundle: Path | None, exporter_name: str = "exporter",
                       with_prometheus: bool = True) -> None:
        """The exporter, Prometheus (started while the exporter comes up), then the exporter's target.

        ``exporter_name`` names its files in ``observability/`` (``<name>.log``, ``<name>-ready.json``):
        one per node when several nodes share the run directory.
        """
        ready = observability_dir(run) / f"{exporter_name}-ready.json"
        try:
            self._start_exporter(run, bundle, ready, observability_dir(run) / f"{exporter_name}.log")
        except Exception as exc:
            self._error(f"exporter: {exc}")
        if with_prometheus:
            try:
                self._start_prometheus(run, bundle)
            except Exception as exc:
                self._error(f"prometheus: {exc}")
        try:
            self._exporter_target(run, ready)
        except Exception as exc:
            self._error(f"exporter: {exc}")

    def _bundle_dir(self, run: RunDir, record: RunRecord) -> Path | None:
        """The bundle the run runs: given (the Slurm node observer), else the run's own copy or the
        store's, verified against the record's hash (mxc/runtime/kept_bundle.py)."""
        if self.bundle_dir is not None:
            return self.bundle_dir
        from mxc.runtime import kept_bundle
        from mxc.runtime.runpaths import Roots

        bundle = kept_bundle.bundle_of(run, record, Roots.current().store())
        return bundle.path if bundle is not None else None

    def _start_exporter(self, run: RunDir, bundle: Path | None, ready: Path, log_path: Path) -> None:
        obs_dir = observability_dir(run)
        config = bundle / "exporter.json" if bundle else None
        if config is None or not config.exists():
            config = obs_dir / "exporter.json"
            write_json_atomic(config, {"bind": self.settings.bind, "port": self.settings.exporter_port,
                                       "plugins": self.settings.plugins})
        ready.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "mxc.runtime.observe.exporter", "--config", str(config), "--run-dir", str(run.path),
                "--ready-file", str(ready), *self.exporter_args]
        if bundle is not None:  # where the contract puts TensorBoard's events (checkpoint.dir or the run directory)
            from mxc.node.contract import load as load_contract
            from mxc.runtime import runpaths

            argv += ["--tensorboard-dir", str(runpaths.for_contract(run, load_contract(bundle)).tensorboard)]
        if sends_token(bundle):
            token = scrape_token.path_in(prometheus_dir(run))
            scrape_token.ensure(token)  # before Prometheus starts: it reads the token for its first scrape
            argv += ["--token-file", str(token)]
        with open(log_path, "ab") as log:
            self.exporter = subprocess.Popen(tied_to_caller(argv), stdin=subprocess.DEVNULL, stdout=log,
                                             stderr=subprocess.STDOUT, start_new_session=True, env=_marked(run))
        lower_priority(self.exporter.pid, HELPER_NICE)
        self.info["exporter"] = {**_identity(self.exporter.pid), "log": str(log_path)}

    def _exporter_target(self, run: RunDir, ready: Path) -> None:
        """Wait for the exporter's ready file, then point Prometheus at it."""
        if self.exporter is None:
            return
        deadline = time.monotonic() + EXPORTER_READY_TIMEOUT
        while not ready.exists():
            if self.exporter.poll() is not None:
                raise RuntimeError(f"exited {self.exporter.returncode} (log: {self.info['exporter']['log']})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"not ready in {EXPORTER_READY_TIMEOUT:.0f}s")
            time.sleep(0.02)
        info = json.loads(ready.read_text())
        # Bound to every interface (multi-node Slurm): Prometheus on another node reaches it by name.
        host = self.node if info["bind"] in ("0.0.0.0", "::") else info["bind"]
        address = f"{host}:{info['port']}"
        exporter = {**self.info["exporter"], "url": f"http://{address}/metrics", "port": info["port"],
                    "bind": info["bind"], "plugins": info.get("plugins", {})}
        write_targets(prometheus_dir(run) / "targets", f"exporter-{self.node}", [address],
                      {"run": run.run_id, "node": self.node})
        site = info.get("site_exporters") or {}
        if isinstance(site, dict) and site:  # node_exporter, dcgm-exporter: scraped where Prometheus reaches this node
            exporter["site_exporters"] = site
            site_exporters.write_site_targets(prometheus_dir(run) / "targets", self.node, host, site,
                                              {"run": run.run_id, "node": self.node})
        self.info["exporter"] = exporter  # one assignment (see on_start)

    def _start_prometheus(self, run: RunDir, bundle: Path | None) -> None:
        home = prometheus_dir(run)
        (home / "targets").mkdir(parents=True, exist_ok=True)
        config = home / "prometheus.yml"
        source = bundle / "prometheus.yml" if bundle else None
        if source is not None and source.exists():
            shutil.copyfile(source, config)
            config.chmod(0o644)
        else:
            config.write_text(default_config(self.settings.scrape_interval, self.name))
        if self.settings.alerts and bundle is not None and (bundle / ALERT_RULES).exists():
            self._start_alert_receiver(run, bundle)
        # Always loopback, whatever observability.bind says (that moves exporters only): Prometheus has no
        # authentication, and its API would hand the run's series to anyone on the network (docs/security.md).
        self.prometheus = PrometheusServer.start(config, tsdb_data(run), "127.0.0.1",
                                                 self.settings.prometheus_port, home / "prometheus.log",
                                                 env=_marked(run), nice=HELPER_NICE)
        self.info["prometheus"] = {"url": self.prometheus.url, "port": self.prometheus.port,
                                   **_identity(self.prometheus.process.pid), "config": str(config),
                                   "log": str(home / "prometheus.log")}

    def _start_alert_receiver(self, run: RunDir, bundle: Path) -> None:
        """The bundle's rules beside the run's prometheus.yml, and the receiver Prometheus sends their
        alerts to (alert_receiver.py), on loopback behind the run's scrape token, before Prometheus
        starts (it reads both at start)."""
        home = prometheus_dir(run)
        shutil.copyfile(bundle / ALERT_RULES, home / ALERT_RULES)
        (home / ALERT_RULES).chmod(0o644)
        token = scrape_token.ensure(scrape_token.path_in(home))
        spec = read_json(bundle / "spec.json")
        log = AlertLog(observability_dir(run) / ALERTS_FILE, on_event=alert_notify.sender(spec, run.run_id))
        self.receiver = AlertReceiver(log, token)
        port = self.receiver.start("127.0.0.1", 0)
        write_targets(home / "targets", f"alert-receiver-{self.node}", [f"127.0.0.1:{port}"], {})
        self.info["alerts"] = {"rules": str(home / ALERT_RULES), "receiver": f"http://127.0.0.1:{port}",
                               "log": str(log.path)}

    def _ray_ready(self, head: RayHead) -> None:
        if self.run is None:
            return
        write_targets(prometheus_dir(self.run) / "targets", f"ray-{self.node}", [f"{head.bind}:{head.metrics_port}"],
                      {"run": self.run.run_id, "node": self.node})

    def wait_for_scrape_after(self, when: float) -> None:
        """Until Prometheus holds a sample scraped after ``when`` (so it has the final step), bounded."""
        assert self.prometheus is not None
        deadline = time.monotonic() + 2 * self.settings.scrape_interval + 5
        expr = 'timestamp(mxc_exporter_plugin_up{plugin="run"})'
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                result = self.prometheus.api.query(expr)
                if result and float(result[0]["value"][1]) >= when:
                    return
            time.sleep(0.2)
        self._error("no scrape after the end of training was seen; the TSDB may miss the last steps")

    def stop(self) -> None:
        if self.exporter is not None and self.exporter.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.exporter.send_signal(signal.SIGTERM)
            try:
                self.exporter.wait(10)
            except subprocess.TimeoutExpired:
                self.exporter.kill()
                self.exporter.wait()
        if self.prometheus is not None:
            self.prometheus.stop()
        if self.receiver is not None:
            self.receiver.stop()

    def _error(self, text: str) -> None:
        self.errors.append(text)
        print(f"mxc: warning: observability: {text}", file=sys.stderr)


def sends_token(bundle: Path | None) -> bool:
    """Whether the run's Prometheus will send the scrape token: the default config and every bundle
    built since tokens exist do (``credentials_file``); a bundle built before does not, and its
    exporter then serves without one, as it did (on its configured bind, loopback by default)."""
    source = bundle / "prometheus.yml" if bundle else None
    if source is None or not source.exists():
        return True
    try:
        return "credentials_file: scrape-token" in source.read_text("utf-8")
    except OSError:
        return True


def default_config(scrape_interval: int, job: str) -> str:
    """The bundle's prometheus.yml when a bundle has none (same shape as the template)."""
    return (f"global:\n  scrape_interval: {scrape_interval}s\n  evaluation_interval: {scrape_interval}s\n"
            f"  external_labels:\n    mxc_job: {json.dumps(job)}\nscrape_configs:\n"
            "  - job_name: mxc-exporter\n    authorization:\n      credentials_file: scrape-token\n"
            "    file_sd_configs:\n      - files: ['targets/exporter-*.json']\n"
            f"  - job_name: ray\n    scrape_interval: {max(scrape_interval, 15)}s\n"
            f"    scrape_timeout: {max(scrape_interval, 15)}s\n"
            "    file_sd_configs:\n      - files: ['targets/ray-*.json']\n")


def _marked(run: RunDir) -> dict[str, str]:
    """This environment plus ``MXC_RUN_DIR``: what is left of a killed run is found by it (``leftovers``)."""
    return {**os.environ, "MXC_RUN_DIR": str(run.path)}


def _identity(pid: int) -> dict[str, Any]:
    """A helper's pid with its start time and boot id (``procfs.ProcessId``): a later look at the
    record can tell it from an unrelated process that got the same pid."""
    found = ProcessId.capture(pid)
    return found.as_record() if found else {"pid": pid}


def _log_line(run: RunDir, text: str) -> None:
    with contextlib.suppress(OSError), open(run.log, "a", encoding="utf-8") as fh:
        fh.write(text + "\n")
