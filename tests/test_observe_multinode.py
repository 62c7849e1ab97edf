"""A job spanning nodes gets every node scraped by default: two emulated nodes on distinct
addresses, the run's Prometheus on node 0 scraping both through the run's scrape token.

Node 0 is this machine's network namespace, node 1 a network namespace of its own joined to it
by a veth pair (10.x.y.1 / 10.x.y.2): node 1's loopback is its own, so an exporter left on
127.0.0.1 there would be out of Prometheus' reach, exactly as on a real cluster. Each node runs
the real node observer (``python -m mxc.runtime.observe.node_observer``) as the node program
starts it, with ``MXC_NET_IFACE`` naming its side of the pair (entrypoint.sh exports the
interface chosen for NCCL the same way). Needs root (``ip netns``); skipped elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mxc.runtime.observe import scrape_token
from mxc.runtime.observe.node_observer import exporter_bind
from mxc.runtime.observe.prometheus import PrometheusAPI
from tests.conftest import REPO, Mxc

WAIT_S = 180.0  # a safety net only: every wait below ends on an event


@dataclass(frozen=True)
class Pair:
    """Two "nodes": this namespace (``outer`` on ``outer_ip``) and ``namespace`` (``inner`` on ``inner_ip``)."""

    namespace: str
    outer: str
    inner: str
    outer_ip: str
    inner_ip: str


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("needs root and iproute2 (a network namespace per emulated node)")
    tag = f"{os.getpid() % 100000}"
    subnet = f"10.251.{os.getpid() % 250}"
    found = Pair(f"mxc-node1-{tag}", f"mxa{tag}", f"mxb{tag}", f"{subnet}.1", f"{subnet}.2")
    try:
        _ip("netns", "add", found.namespace)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"no network namespaces here: {exc.stderr.strip()}")
    try:
        _ip("link", "add", found.outer, "type", "veth", "peer", "name", found.inner)
        _ip("link", "set", found.inner, "netns", found.namespace)
        _ip("addr", "add", f"{found.outer_ip}/24", "dev", found.outer)
        _ip("link", "set", found.outer, "up")
        _ip("-n", found.namespace, "addr", "add", f"{found.inner_ip}/24", "dev", found.inner)
        _ip("-n", found.namespace, "link", "set", found.inner, "up")
        _ip("-n", found.namespace, "link", "set", "lo", "up")
        yield found
    finally:
        subprocess.run(["ip", "link", "del", found.outer], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", found.namespace], capture_output=True, check=False)


def wait_until(what: str, check: Any, procs: list[subprocess.Popen[bytes]], logs: list[Path]) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        for proc in procs:
            if proc.poll() is not None:
                pytest.fail(f"a node observer exited {proc.returncode} before {what}:\n"
                            + "\n".join(p.read_text(errors="replace")[-3000:] for p in logs if p.exists()))
        time.sleep(0.2)
    pytest.fail(f"{what}: not seen in {WAIT_S:.0f}s\n"
                + "\n".join(p.read_text(errors="replace")[-3000:] for p in logs if p.exists()))


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data


def test_exporter_bind_policy() -> None:
    """Loopback stays loopback on one node; across nodes it becomes the cluster address; an explicit
    address or wildcard is the spec's to choose."""
    address = lambda: "10.0.0.7"  # noqa: E731
    assert exporter_bind("127.0.0.1", 1, address) == "127.0.0.1"
    assert exporter_bind("127.0.0.1", 2, address) == "10.0.0.7"
    assert exporter_bind("localhost", 8, address) == "10.0.0.7"
    assert exporter_bind("::1", 2, address) == "10.0.0.7"
    assert exporter_bind("0.0.0.0", 2, address) == "0.0.0.0"
    assert exporter_bind("192.168.1.5", 2, address) == "192.168.1.5"


def test_two_nodes_on_distinct_addresses_are_both_scraped(pair: Pair, mxc: Mxc, mxc_home: Path,
                                                            tmp_path: Path) -> None:
    out = mxc("build", "-q", str(REPO / "specs/tiny.yaml"), "--set", "runtime.backend=slurm",
              "--set", "resources.nodes=2", "--set", "observability.enabled=true",
              "--set", "observability.ray=false", "--set", "observability.scrape_interval=1")
    assert out.returncode == 0, out.stderr
    bundle = mxc_home / "bundles" / out.stdout.strip()
    run = tmp_path / "run"
    obs = run / "observability"
    base = [sys.executable, "-m", "mxc.runtime.observe.node_observer", "--run-dir", str(run), "--bundle-dir",
            str(bundle)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "MXC_HOME": str(mxc_home)}
    logs = [tmp_path / "node-a.log", tmp_path / "node-b.log"]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with open(logs[0], "wb") as log:
            procs.append(subprocess.Popen([*base, "--node", "node-a", "--rank", "0", "--head"], stdout=log,
                                          stderr=subprocess.STDOUT, env={**env, "MXC_NET_IFACE": pair.outer}))
        with open(logs[1], "wb") as log:
            procs.append(subprocess.Popen(["ip", "netns", "exec", pair.namespace, *base, "--node", "node-b",
                                           "--rank", "1"], stdout=log, stderr=subprocess.STDOUT,
                                          env={**env, "MXC_NET_IFACE": pair.inner}))
        status = {node: wait_until(f"{node}'s status", lambda node=node: read_json(obs / f"node-{node}.json"),
                                   procs, logs) for node in ("node-a", "node-b")}
        # Each exporter on its node's cluster address (not loopback), behind the run's token.
        assert status["node-a"]["exporter"]["bind"] == pair.outer_ip, status["node-a"]
        assert status["node-b"]["exporter"]["bind"] == pair.inner_ip, status["node-b"]
        assert not status["node-a"]["errors"] and not status["node-b"]["errors"], status
        token = run / "prometheus" / "scrape-token"
        assert token.stat().st_mode & 0o777 == 0o600
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(status["node-b"]["exporter"]["url"], timeout=10)
        assert refused.value.code == 401 and b"mxc_" not in refused.value.read()
        request = urllib.request.Request(status["node-b"]["exporter"]["url"],
                                         headers={"Authorization": f"Bearer {token.read_text().strip()}"})
        with urllib.request.urlopen(request, timeout=10) as resp:
            assert b"mxc_exporter_plugin_up" in resp.read()
        assert token.read_text().strip() not in "".join(p.read_text(errors="replace") for p in logs)

        # Prometheus (node 0, loopback) scrapes both nodes: distinct node labels and addresses.
        prometheus = status["node-a"]["prometheus"]
        assert prometheus["url"].startswith("http://127.0.0.1:")
        api = PrometheusAPI(prometheus["url"])

        def both_up() -> list[dict[str, Any]] | None:
            got = api.query('up{job="mxc-exporter"} == 1')
            return got if len(got) == 2 else None

        up = wait_until("both exporters scraped", both_up, procs, logs)
        assert {s["metric"]["node"]: s["metric"]["instance"].rsplit(":", 1)[0] for s in up} == {
            "node-a": pair.outer_ip, "node-b": pair.inner_ip}
        hosts = wait_until("host series of both nodes", lambda: {
            s["metric"]["node"] for s in api.query("mxc_host_cpus")} >= {"node-a", "node-b"} or None, procs, logs)
        assert hosts
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_nodes_starting_at_once_agree_on_one_private_token(tmp_path: Path) -> None:
    """The nodes of a job make the token at the same moment on a shared file system: one wins, all
    read the same 0600 file; a link planted at its name is never followed."""
    path = tmp_path / "prometheus" / "scrape-token"
    code = ("import sys; from pathlib import Path; from mxc.runtime.observe import scrape_token; "
            "print(scrape_token.ensure(Path(sys.argv[1])))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)}) for _ in range(6)]
    tokens = {proc.communicate(timeout=120)[0].strip() for proc in procs}
    assert len(tokens) == 1 and len(tokens.pop()) == 64
    assert path.stat().st_mode & 0o777 == 0o600
    planted = tmp_path / "elsewhere" / "scrape-token"
    (tmp_path / "other").write_text("0123abcd\n")
    planted.parent.mkdir()
    planted.symlink_to(tmp_path / "other")
    with pytest.raises(OSError):
        scrape_token.ensure(planted)
