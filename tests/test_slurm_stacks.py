"""`mxc stacks` on a live 2-node Slurm run: the tiny MaxText model held at step 2 on both emulated
nodes (tests/gates.py); `srun --jobid --overlap` runs the bundle's node program on each node, and
each rank's trainer is dumped once, from its own node, into the shared run directory. Released,
the run goes on and succeeds; then it is not live any more (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import Mxc
from tests.gates import PASS_VALUE, PauseGate
from tests.slurm_cluster import SlurmCluster
from tests.slurm_jobs import build, record, run_dir, slurm_of, slurm_sets, submit, wait_final, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.training, pytest.mark.usefixtures("slurm_env")]


def test_stacks_of_a_held_two_node_run(mxc: Mxc, mxc_home: Path, slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    gate = PauseGate(tmp_path, {0: 2})
    bundle = build(mxc, *slurm_sets(slurm_cluster, nodes=2, **{"checkpoint.period": 0, "env.pass": PASS_VALUE}))
    run_id = submit(mxc, bundle, env=gate.env())
    run = run_dir(mxc_home, run_id)
    try:
        paused = gate.wait_paused(0, ranks=2)
        wait_for(lambda: record(mxc_home, run_id).status == "running", 60, "the job to be seen running")

        out = mxc("stacks", run_id)
        assert out.returncode == 0, out.stderr
        [dump] = [p for p in run.stacks.iterdir() if p.is_dir()]
        index = json.loads((dump / "index.json").read_text())
        assert index["backend"] == "slurm" and index["job_id"] == str(slurm_of(record(mxc_home, run_id))["job_id"])
        trainers = {e["rank"]: e for e in index["dumps"] if e["pid"] == paused.get(e["rank"])}
        assert sorted(trainers) == [0, 1]  # each rank's own trainer, once
        assert sorted(e["node"] for e in trainers.values()) == ["node1", "node2"]  # each read on its node
        assert len({(e["rank"], e["pid"]) for e in index["dumps"]}) == len(index["dumps"])
        for rank, entry in trainers.items():
            assert entry["ok"] and entry["method"].startswith("py-spy") and entry["attempt"] == 0
            assert entry["file"] == f"rank-{rank}-pid{paused[rank]}.txt"
            assert "handle (sitecustomize.py" in (dump / entry["file"]).read_text()
            assert f"==> rank {rank} on {entry['node']}, pid {paused[rank]}, attempt 0" in out.stdout
        assert sorted(p.name for p in dump.iterdir()) == sorted(["index.json", *(e["file"] for e in index["dumps"])])
    finally:
        gate.release(0)
    final = wait_final(mxc_home, run_id, timeout=600)
    assert final.status == "succeeded", final.message

    ended = mxc("stacks", run_id)
    assert ended.returncode == 2 and f"run {run_id} is not live (succeeded)" in ended.stderr
