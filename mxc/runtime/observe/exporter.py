"""The per-node metrics exporter: prometheus-client serving plugin metrics.

Run as ``python -m mxc.runtime.observe.exporter --config <bundle>/exporter.json --run-dir RUN``.
It binds ``--bind`` (else the config's ``bind``, 127.0.0.1 unless the spec says otherwise; the
node observer of a job spanning nodes passes the node's cluster address) on the first free port from
the configured one upward, trying the bind itself (no check-then-bind race), and writes a
ready file (JSON: pid, bind, port, plugin states, the site's own exporters found on this node:
``site_exporters.py``) atomically once it serves, which is how the run learns the port.
With ``--token-file`` it answers only requests bearing the run's scrape token
(``metrics_server.py``; the run's observers pass it). SIGTERM/SIGINT stop it cleanly. It
never imports jax, ray or maxtext, so it starts in a fraction of a second.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from mxc.fsutil import mxc_home, write_json_atomic
from mxc.plugins.api import PluginContext
from mxc.runtime.observe import metrics_server, scrape_token, site_exporters
from mxc.runtime.observe.plugin_host import PluginHost
from mxc.runtime.observe.run_events import EVENTS, RunEventsCollector

log = logging.getLogger("mxc.exporter")
PORT_TRIES = 200


def serve(registry: CollectorRegistry, bind: str, first_port: int, tries: int = PORT_TRIES,
          token: str | None = None) -> tuple[Any, int]:
    """Start the HTTP server on the first port that binds; returns (server, port)."""
    last: OSError | None = None
    for port in range(first_port, min(first_port + tries, 65536)):
        try:
            return metrics_server.start(registry, bind, port, token), port
        except OSError as exc:
            last = exc
    raise OSError(f"no free port in {first_port}..{first_port + tries - 1} on {bind}: {last}")


def build_registry(config: dict[str, Any], run_dir: Path | None, plugin_dirs: Sequence[Path],
                   ranks: tuple[int, ...] | None, tensorboard_dir: Path | None,
                   site: dict[str, int] | None = None) -> tuple[CollectorRegistry, PluginHost]:
    context = PluginContext(run_dir=run_dir, config=config, node=socket.gethostname(), ranks=ranks,
                            tensorboard_dir=tensorboard_dir, site_exporters=site or {}, log=log)
    extra = []
    if run_dir is not None:
        extra.append(("run", RunEventsCollector(run_dir / "observability" / EVENTS)))
    host = PluginHost(context, list(config.get("plugins", [])), plugin_dirs, extra)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(host)
    return registry, host


def default_plugin_dirs() -> list[Path]:
    return [mxc_home() / "plugins"]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m mxc.runtime.observe.exporter", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, help="the bundle's exporter.json (plugins, bind, port)")
    p.add_argument("--run-dir", type=Path, help="the run directory (training metrics, events)")
    p.add_argument("--bind", help="address to listen on (default: the config's, else 127.0.0.1)")
    p.add_argument("--port", type=int, help="first port to try (default: the config's, else 9400)")
    p.add_argument("--plugins-dir", type=Path, action="append", default=[], help="extra plugin directory (repeatable)")
    p.add_argument("--plugins", help="comma-separated plugin names (default: the config's)")
    p.add_argument("--rank", type=int, action="append", help="training rank(s) on this node (default: all found)")
    p.add_argument("--tensorboard-dir", type=Path, help="TensorBoard event files, when there is no metrics file")
    p.add_argument("--ready-file", type=Path, help="write {pid, bind, port, plugins} here once serving")
    p.add_argument("--token-file", type=Path, help="answer only requests with this bearer token (the run's scrape "
                   "token, <run>/prometheus/scrape-token); made (mode 0600) if missing")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s exporter %(levelname)s %(message)s", stream=sys.stderr)
    config: dict[str, Any] = json.loads(args.config.read_text()) if args.config else {}
    if args.plugins is not None:
        config["plugins"] = [p for p in args.plugins.split(",") if p]
    bind = args.bind or config.get("bind") or "127.0.0.1"
    first_port = args.port or int(config.get("port") or 9400)
    plugin_dirs = [*args.plugins_dir, *default_plugin_dirs()]
    site = site_exporters.detect()
    if site:
        log.info("exporters the site runs here: %s", ", ".join(f"{n} on port {p}" for n, p in sorted(site.items())))
    registry, host = build_registry(config, args.run_dir, plugin_dirs, tuple(args.rank) if args.rank else None,
                                    args.tensorboard_dir, site)
    token = scrape_token.ensure(args.token_file) if args.token_file else None
    server, port = serve(registry, bind, first_port, token=token)
    log.info("serving http://%s:%d/metrics (pid %d%s)", bind, port, os.getpid(),
             ", the run's scrape token required" if token else "")
    if args.ready_file:
        write_json_atomic(args.ready_file, {"pid": os.getpid(), "bind": bind, "port": port, "plugins": host.status(),
                                            "site_exporters": site, "token": token is not None})

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.shutdown()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
