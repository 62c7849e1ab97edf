"""Observability on the nodes of a Slurm job: one exporter per node, the run's Prometheus on the first.

On the local backend the supervisor's ``Observability`` observer starts everything. A Slurm
job has no supervisor on the nodes, so each rank of the node program (mxc/node/rank.py) starts
this module in the background before training (the batch side sets ``MXC_OBSERVE_NODES=1`` when
the bundle has observability on) and sends it SIGTERM when training ends:

* every node serves its exporter (this rank's metrics file, host and GPU plugins) and writes
  its file_sd target into ``<run>/prometheus/targets/exporter-<node>.json``; when the job spans
  nodes it listens on the node's cluster address (``exporter_bind``), behind the run's scrape
  token, so Prometheus on node rank 0 scrapes every node by default;
* the nodes form the job's Ray cluster: the head on node rank 0 (its address and the run's
  token in ``observability/ray-cluster.json``, mode 0600, removed at the end), every other
  node joins it; each node's Ray metrics become a Prometheus target, and the rank
  runs its training as a subprocess of a Ray actor on its node
  (``mxc.runtime.observe.ray_node_launch``);
* node rank 0 first removes the target files of nodes this start of the job does not have (a
  requeued job may run elsewhere: ``job_targets.py``), then runs Prometheus on the run's TSDB
  (``<run>/prometheus/data``, a shared file system on a cluster), so ``mxc metrics`` / ``mxc report`` / ``mxc dashboard`` read a
  Slurm run exactly like a local one; a requeued job reopens the same TSDB;
* on SIGTERM, rank 0 waits (bounded) for one scrape after the end of training, then all stop.

Each node writes ``<run>/observability/node-<node>.json`` (ports, URLs, errors), which the
submitting side folds into ``record.observability``. Like the local observer it never fails
the training: whatever cannot start is recorded and training goes on.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import ipaddress
import json
import os
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mxc.fsutil import write_atomic, write_json_atomic
from mxc.node.contract import FILE as CONTRACT_FILE
from mxc.runtime.contract import parse as parse_contract
from mxc.runtime.observe import job_targets
from mxc.runtime.observe.observer import Observability, observability_dir
from mxc.runtime.observe.prometheus import write_targets
from mxc.runtime.observe.ray_launcher import HEAD_TIMEOUT, RayHead
from mxc.runtime.observe.ray_node_launch import CLUSTER_FILE, NODE_FILE
from mxc.runtime.processes import scratch
from mxc.runtime.rundir import RunDir
from mxc.runtime.slurm.events import NODE_STATUS

SIOCGIFADDR = 0x8915


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m mxc.runtime.observe.node_observer", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--bundle-dir", type=Path, required=True)
    p.add_argument("--node", required=True, help="this node's name (labels its series)")
    p.add_argument("--rank", type=int, required=True, help="the training rank on this node")
    p.add_argument("--attempt", type=int, default=0, help="the job's restart count (MXC_ATTEMPT)")
    p.add_argument("--head", action="store_true", help="node rank 0: the Ray head, and Prometheus on the run's TSDB")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    run = RunDir(args.run_dir)
    contract = parse_contract((args.bundle_dir / CONTRACT_FILE).read_text("utf-8"))
    observer = Observability(contract.observability, contract.name, bundle_dir=args.bundle_dir)
    observer.node = args.node
    observer.exporter_args = ["--rank", str(args.rank)]
    bind = exporter_bind(contract.observability.bind, contract.nodes,
                         lambda: node_address(os.environ.get("MXC_NET_IFACE", "")))
    if bind != contract.observability.bind:
        observer.exporter_args += ["--bind", bind]
    obs_dir = observability_dir(run)
    obs_dir.mkdir(parents=True, exist_ok=True)
    status = obs_dir / NODE_STATUS.format(node=args.node)
    stop = _stop_requested()
    observer.info = {"node": args.node, "rank": args.rank, "scrape_interval": observer.settings.scrape_interval,
                     "errors": observer.errors}
    ray_node: RayHead | None = None
    try:  # Ray starts in this thread (its processes die with it); the head while the rest comes up
        if args.head and observer.settings.ray:
            ray_node = launch_ray(run, args.node, cluster=None, dashboard=observer.settings.ray_dashboard)
    except Exception as exc:
        _ray_failed(run, args, observer, exc)
    if args.head:  # before Prometheus reads the targets: none of a node an earlier start of the job had
        try:
            removed = job_targets.remove_stale_targets(run.tsdb / "targets", args.node, os.environ)
            if removed:
                observer.info["stale_targets_removed"] = removed
        except Exception as exc:
            observer._error(f"stale targets: {exc}")
    observer.start_services(run, args.bundle_dir, f"exporter-{args.node}", with_prometheus=args.head)
    try:
        if not args.head and observer.settings.ray:
            cluster = _wait_json(observability_dir(run) / CLUSTER_FILE.format(attempt=args.attempt), HEAD_TIMEOUT,
                                 "the Ray head of node rank 0")
            ray_node = launch_ray(run, args.node, cluster)
        if ray_node is not None:
            ray_ready(run, args.node, args.attempt, ray_node)
            observer.info["ray"] = {"address": ray_node.address, "metrics_port": ray_node.metrics_port,
                                    "process": ray_node.identity.as_record() if ray_node.identity else None,
                                    "head": args.head,
                                    **({"dashboard": ray_node.dashboard_url} if ray_node.dashboard_url else {})}
    except Exception as exc:
        _ray_failed(run, args, observer, exc)
    write_json_atomic(status, observer.info)
    while not stop():
        time.sleep(0.2)
    if args.head and observer.prometheus is not None and observer.exporter is not None:
        observer.wait_for_scrape_after(time.time())
    observer.stop()
    if ray_node is not None:
        stop_ray(run, args.node, args.attempt, ray_node)
    write_json_atomic(status, {**observer.info, "ended": time.time()})
    return 0


def _ray_failed(run: RunDir, args: argparse.Namespace, observer: Observability, exc: Exception) -> None:
    """Recorded, and said to this rank's training wrapper, which then runs training without Ray."""
    observer._error(f"ray: {exc}")
    obs_dir = observability_dir(run)
    write_json_atomic(obs_dir / NODE_FILE.format(node=args.node, attempt=args.attempt), {"error": str(exc)})
    if args.head:  # the other nodes stop waiting for a head that will not come
        write_json_atomic(obs_dir / CLUSTER_FILE.format(attempt=args.attempt), {"error": str(exc)})


def launch_ray(run: RunDir, node: str, cluster: dict[str, Any] | None, dashboard: bool = False) -> RayHead:
    """Start this node's part of the job's Ray cluster: the head, or a node joining ``cluster``."""
    temp = scratch.create(run.path)  # unix sockets: a short path, this user's alone (mxc.runtime.processes.scratch)
    # A Ray cluster spanning nodes cannot live on loopback: it listens on the nodes' network address.
    bind = node_address(os.environ.get("MXC_NET_IFACE", ""))
    log = run.path / "ray" / f"{node}.log"
    if cluster is None:
        ray_node = RayHead(temp_dir=temp, log_path=log, run_dir=run.path, bind=bind, multi_node=True, dashboard=dashboard)
    else:
        ray_node = RayHead(temp_dir=temp, log_path=log, run_dir=run.path, bind=bind, join=cluster["address"],
                           token=cluster["token"], multi_node=True)
    ray_node.launch()
    return ray_node


def exporter_bind(bind: str, nodes: int, cluster_address: Callable[[], str]) -> str:
    """Where this node's exporter listens: ``observability.bind``, except that a job spanning nodes
    with a loopback ``bind`` (the default) listens on the node's cluster address, so the run's
    Prometheus on node rank 0 reaches every node (it, and the dashboards, stay on loopback). The
    exporter then answers only with the run's scrape token (``metrics_server.py``)."""
    if nodes > 1 and _is_loopback(bind):
        return cluster_address()
    return bind


def _is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def node_address(interface: str) -> str:
    """IPv4 address of the interface entrypoint.sh chose for NCCL/Gloo (MXC_NET_IFACE); without
    one (or loopback), the address this node would reach other hosts from."""
    if interface and interface != "lo":
        with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            packed = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, struct.pack("256s", interface[:15].encode()))
            return socket.inet_ntoa(packed[20:24])
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect(("10.255.255.255", 1))  # UDP: no packet is sent, the kernel only picks a route
        address: str = sock.getsockname()[0]
        return address
    return "127.0.0.1"


def ray_ready(run: RunDir, node: str, attempt: int, ray_node: RayHead) -> None:
    """Once the raylet is up: the cluster file (head), the metrics target, this node's ready file."""
    ray_node.wait_ready()
    obs_dir = observability_dir(run)
    if not ray_node.join:
        cluster = {"address": ray_node.address, "token": ray_node.token}
        write_atomic(obs_dir / CLUSTER_FILE.format(attempt=attempt), json.dumps(cluster), 0o600)
    write_targets(run.tsdb / "targets", f"ray-{node}", [f"{ray_node.bind}:{ray_node.metrics_port}"],
                  {"run": run.run_id, "node": node})
    write_json_atomic(obs_dir / NODE_FILE.format(node=node, attempt=attempt), {"address": ray_node.address, "bind": ray_node.bind,
                                                              "node_manager_port": ray_node.ports["node_manager"]})


def stop_ray(run: RunDir, node: str, attempt: int, ray_node: RayHead) -> None:
    obs_dir = observability_dir(run)
    (obs_dir / NODE_FILE.format(node=node, attempt=attempt)).unlink(missing_ok=True)
    if not ray_node.join:
        (obs_dir / CLUSTER_FILE.format(attempt=attempt)).unlink(missing_ok=True)  # the token goes with the cluster
    ray_node.stop()
    ray_node.keep_logs(run.path / "ray" / node / "logs")
    scratch.remove(ray_node.temp_dir)


def _wait_json(path: Path, seconds: float, what: str) -> dict[str, Any]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            data: dict[str, Any] = json.loads(path.read_text())
            if "error" in data:
                raise RuntimeError(f"{what} failed: {data['error']}")
            return data
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not come up in {seconds:.0f}s ({path} missing)")


def _stop_requested() -> Any:
    """SIGTERM/SIGINT set a flag (the entrypoint's stop, or the kernel's pdeathsig)."""
    flag = {"stop": False}

    def handler(signum: int, frame: object) -> None:
        flag["stop"] = True

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return lambda: flag["stop"]


if __name__ == "__main__":
    sys.exit(main())
