"""A requeued Slurm job's new head never scrapes (nor alerts to) the nodes an earlier start had
(mxc/runtime/observe/job_targets.py): their target files are removed before Prometheus starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from mxc.runtime.observe.job_targets import expand_hostlist, job_nodes, stale_targets
from mxc.runtime.observe.prometheus import write_targets
from tests.conftest import REPO, Mxc
from tests.test_observe_multinode import read_json, wait_until


@pytest.mark.parametrize("text, names", [
    ("nodeA", ["nodeA"]),
    ("nodeA,nodeC", ["nodeA", "nodeC"]),
    ("node[01-03,07],gpu5", ["node01", "node02", "node03", "node07", "gpu5"]),
    ("gpu[8-10]-ib", ["gpu8-ib", "gpu9-ib", "gpu10-ib"]),
    ("rack[1-2]-n[0-1]", ["rack1-n0", "rack1-n1", "rack2-n0", "rack2-n1"]),
])
def test_slurm_hostlists_expand(text: str, names: list[str]) -> None:
    assert expand_hostlist(text) == names


@pytest.mark.parametrize("text", ["node[1-", "node]1", "node[a-b]", "node[3-1]", "n[[1]]"])
def test_a_hostlist_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        expand_hostlist(text)


def test_no_node_list_is_none_and_a_bad_one_too() -> None:
    env = {"PATH": "/nonexistent"}  # no scontrol: mxc expands the list itself
    assert job_nodes(env) is None
    assert job_nodes({**env, "SLURM_JOB_NODELIST": "n[1-2],m"}) == {"n1", "n2", "m"}
    assert job_nodes({**env, "SLURM_JOB_NODELIST": "n[1-"}) is None


def _stale_layout(targets: Path) -> None:
    """What an earlier start on nodeA (head) and node-b left, beside files of this start's nodes."""
    targets.mkdir(parents=True, exist_ok=True)
    for name, address in [("exporter-nodeA", "127.0.0.1:9"), ("ray-nodeA", "127.0.0.1:9"),
                          ("exporter-node-b", "10.9.9.9:9400"), ("ray-node-b", "10.9.9.9:8080"),
                          ("site-node-b-dcgm", "10.9.9.9:9401"), ("alert-receiver-nodeA", "127.0.0.1:9"),
                          ("exporter-nodeC-1", "10.9.9.8:9400"),  # a node named like a suffix of another
                          ("exporter-nodeC", "10.9.9.7:9400"), ("site-nodeC-node", "10.9.9.7:9100")]:
        write_targets(targets, name, [address], {"node": name})
    (targets / "notes.json").write_text("[]")  # not a per-node target: left alone


def test_stale_targets_are_those_of_nodes_outside_this_start(tmp_path: Path) -> None:
    _stale_layout(tmp_path)
    write_targets(tmp_path, "alert-receiver-nodeC", ["127.0.0.1:1"], {})
    stale = {p.name for p in stale_targets(tmp_path, "nodeC", {"nodeC", "nodeD"})}
    assert stale == {"exporter-nodeA.json", "ray-nodeA.json", "exporter-node-b.json", "ray-node-b.json",
                     "site-node-b-dcgm.json", "alert-receiver-nodeA.json", "exporter-nodeC-1.json"}
    # No node list: only another head's receiver (a receiver listens on its own head's loopback).
    assert {p.name for p in stale_targets(tmp_path, "nodeC", None)} == {"alert-receiver-nodeA.json"}


def test_a_requeued_jobs_head_starts_prometheus_without_the_earlier_nodes(mxc: Mxc, mxc_home: Path,
                                                                        tmp_path: Path) -> None:
    """The real node observer as node rank 0 of a start on nodeC: the earlier start's target files are
    gone before its Prometheus reads the directory, which discovers only this start's targets."""
    out = mxc("build", "-q", str(REPO / "specs/tiny.yaml"), "--set", "runtime.backend=slurm",
              "--set", "observability.enabled=true", "--set", "observability.ray=false",
              "--set", "observability.scrape_interval=1")
    assert out.returncode == 0, out.stderr
    bundle = mxc_home / "bundles" / out.stdout.strip()
    run = tmp_path / "run"
    targets = run / "prometheus" / "targets"
    _stale_layout(targets)
    log_path = tmp_path / "node.log"
    env = {**os.environ, "PYTHONPATH": str(REPO), "MXC_HOME": str(mxc_home), "SLURM_JOB_NODELIST": "nodeC",
           "PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "mxc.runtime.observe.node_observer", "--run-dir", str(run),
                                 "--bundle-dir", str(bundle), "--node", "nodeC", "--rank", "0", "--head"],
                                stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        def wait(what: str, check: Any) -> Any:
            return wait_until(what, check, [proc], [log_path])

        status = wait("the node's status", lambda: read_json(run / "observability" / "node-nodeC.json"))
        assert status["errors"] == [], status
        assert sorted(status["stale_targets_removed"]) == [
            "alert-receiver-nodeA.json", "exporter-node-b.json", "exporter-nodeA.json", "exporter-nodeC-1.json",
            "ray-node-b.json", "ray-nodeA.json", "site-node-b-dcgm.json"]
        left = {p.name for p in targets.glob("*.json")}
        assert left >= {"exporter-nodeC.json", "site-nodeC-node.json", "notes.json"}
        assert not left & set(status["stale_targets_removed"])

        def active() -> list[dict[str, Any]] | None:
            url = status["prometheus"]["url"] + "/api/v1/targets"
            with urllib.request.urlopen(url, timeout=10) as resp:
                found: list[dict[str, Any]] = json.loads(resp.read())["data"]["activeTargets"]
            own = status["exporter"]["url"].split("//", 1)[1].split("/", 1)[0]
            return found if any(t["labels"].get("instance") == own for t in found) else None

        instances = {t["labels"].get("instance") for t in wait("this node's exporter discovered", active)}
        assert not instances & {"127.0.0.1:9", "10.9.9.9:9400", "10.9.9.9:8080", "10.9.9.9:9401", "10.9.9.8:9400"}
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
