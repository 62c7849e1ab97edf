"""The tiny MaxText model trained through sbatch on 2 emulated nodes: two JAX processes (one per
node) that agree on the coordinator, a forced ``scontrol requeue`` that resumes from the last
checkpoint, then a stop before the time limit (USR2) that checkpoints and requeues itself; then
observability on the nodes (an exporter per node, Prometheus on the first) and a hung rank.

One training run covers each chain, because every MaxText start costs ~30 s of shared CPU.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from mxc.runtime.logs.metrics_merge import read_lines
from tests.conftest import Mxc
from tests.gates import PASS_VALUE, PauseGate
from tests.slurm_cluster import SlurmCluster
from tests.slurm_jobs import (
    batch_events,
    build,
    checkpoints,
    leave_little_time,
    processes_of,
    rank_events,
    record,
    run_dir,
    slurm_of,
    slurm_sets,
    submit,
    wait_final,
    wait_for,
)

pytestmark = [pytest.mark.slurm, pytest.mark.training, pytest.mark.usefixtures("slurm_env")]


def test_two_node_training_requeue_and_time_limit_stop(mxc: Mxc, mxc_home: Path, slurm_cluster: SlurmCluster,
                                                       tmp_path: Path) -> None:
    # The trainers wait at known steps while the test acts (tests/gates.py): attempt 0 after step 7
    # (checkpoint 5 is due), attempt 1 after step 12 (its own checkpoint 10 is due).
    gate = PauseGate(tmp_path, {0: 7, 1: 12})
    bundle = build(mxc, *slurm_sets(slurm_cluster, nodes=2, **{
        "checkpoint.period": 5, "restart.max": 2, "runtime.signal_seconds": 10,
        "model.overrides.per_device_batch_size": 8, "model.overrides.max_target_length": 256, "env.pass": PASS_VALUE,
    }))
    run_id = submit(mxc, bundle, env=gate.env())
    run = run_dir(mxc_home, run_id)
    job_id = str(slurm_of(record(mxc_home, run_id))["job_id"])

    # 1. A forced requeue while both ranks wait after step 7, the first periodic checkpoint done.
    gate.wait_paused(0, ranks=2)
    wait_for(lambda: 5 in checkpoints(mxc_home, run_id), 240, "checkpoint 5")
    slurm_cluster.run("scontrol", "requeue", job_id)
    wait_for(lambda: record(mxc_home, run_id).restarts == 1, 120, "restart 1 to start")

    # 2. Restart 1 resumes and waits after step 12 with its checkpoint 10 done; then the time limit
    #    comes close (lowered so that little time is left) and USR2 arrives, as --signal=B:USR2@N sends
    #    it. The trainers go on only once JAX has taken the SIGTERM that follows (its preemption sync
    #    point is set), so they checkpoint on it instead of finishing first.
    def resumed_step() -> int | None:
        found = re.findall(r"restoring from this run's directory step (\d+)", run.log.read_text(errors="replace"))
        return int(found[-1]) if found else None

    gate.wait_paused(1, ranks=2)
    first_resume = wait_for(resumed_step, 240, "restart 1 to restore a checkpoint")
    wait_for(lambda: any(c > first_resume + 1 for c in checkpoints(mxc_home, run_id)), 240,
             "a checkpoint written by restart 1")
    leave_little_time(slurm_cluster, job_id)
    slurm_cluster.run("scancel", "--signal=USR2", "--batch", job_id)
    wait_for(lambda: "Preemption sync counter is set" in run.log.read_text(errors="replace"), 120,
             "JAX to take the SIGTERM (preemption sync point set)")
    gate.release(1)
    wait_for(lambda: record(mxc_home, run_id).restarts == 2, 120, "restart 2 to start")
    slurm_cluster.run("scontrol", "update", f"JobId={job_id}", "TimeLimit=30:00", check=False)

    final = wait_final(mxc_home, run_id, timeout=300)
    log = run.log.read_text(errors="replace")
    assert final.status == "succeeded", (final.message, log[-3000:])
    assert final.exit_code == 0 and final.final

    # Every step once after merging the attempts, 0..29, except the steps MaxText checkpointed on
    # SIGTERM: it stops before writing such a step's metrics (its state is in the checkpoint, and
    # the next attempt starts after it). The record agrees.
    on_signal = {int(s) for s in re.findall(r"^0: .*Saving checkpoint at step (\d+) due to preemption", log, re.M)}
    saved = int(final.attempts[1].model_dump(mode="json", exclude_none=True)["requeue"]["checkpoint"])
    assert saved in on_signal, "MaxText did not checkpoint on SIGTERM before the time limit"
    steps = [step for step, _, _ in read_lines(run.metrics)]
    assert steps == [s for s in range(30) if s not in on_signal]
    assert final.steps == 30 - len(on_signal) and final.last_loss is not None

    # Slurm facts in the record.
    slurm = slurm_of(final)
    assert slurm["job_id"] == job_id and slurm["partition"] == slurm_cluster.partition
    assert slurm["node_list"] == "node[1-2]" and slurm["num_nodes"] == 2
    assert final.restarts == 2 and slurm["restart_count"] == 2  # SLURM_RESTART_COUNT of the last start

    # Attempts: forced requeue, then a time-limit stop after a checkpoint, then the finish.
    a0, a1, a2 = final.attempts
    assert [a.number for a in final.attempts] == [0, 1, 2]
    assert "Slurm requeued the job" in (a0.reason or ""), a0
    assert a1.resumed_from_step == first_resume >= 5
    assert a1.cause == "time_limit" and a1.signal == "USR2"
    requeue = a1.model_dump(mode="json", exclude_none=True)["requeue"]
    assert requeue["action"] == "requeued" and requeue["cause"] == "time_limit"
    assert saved > first_resume
    assert a2.resumed_from_step == saved and a2.exit_code == 0
    assert slurm["requeues"] == [{"job_id": job_id, "restart": 1, "cause": "time_limit", "action": "requeued",
                                   "why": f"time limit: restart 2 of at most 2, from checkpoint {saved}",
                                   "checkpoint": saved}]

    # Two JAX processes, one per node, that agree on the coordinator, in every attempt.
    starts = [e for e in batch_events(mxc_home, run_id) if e["event"] == "start"]
    assert len(starts) == 3
    for start in starts:
        for rank, node in ((0, "node1"), (1, "node2")):
            mine = [e for e in rank_events(mxc_home, run_id, rank) if e["event"] == "start"
                    and e["attempt"] == start["attempt"]]
            assert len(mine) == 1 and mine[0]["node"] == node and mine[0]["nprocs"] == 2
            assert mine[0]["coordinator"] == start["coordinator"]
    coordinators = {m[1] for m in re.findall(r"^(\d): .*Connecting to JAX distributed service on (\S+)", log, re.M)}
    assert coordinators == {s["coordinator"] for s in starts}
    assert {m for m in re.findall(r"^(\d): .*Num_devices: 2,", log, re.M)} == {"0", "1"}

    # The CLI shows the same: runs (Slurm's view of the record) and logs (both ranks' lines, labelled).
    listed = json.loads(mxc("runs", "--json").stdout)
    assert [(r["run_id"], r["status"], r["restarts"]) for r in listed] == [(run_id, "succeeded", 2)]
    logs = mxc("logs", run_id)
    assert logs.returncode == 0 and "completed step: 29" in logs.stdout
    assert "[mxc batch" in logs.stdout and "1: [mxc node2 rank 1]" in logs.stdout
    on_disk = json.loads(run.record.read_text())
    assert on_disk["final"] is False  # reads show; they write no record
    assert on_disk["status"] == "succeeded"  # the job wrote its own end (mxc/node/jobreport.py)
    watched = mxc("watch", "--once", run_id)
    assert watched.returncode == 0 and f"run {run_id}: succeeded -> succeeded" in watched.stderr, watched.stderr
    assert json.loads(run.record.read_text())["final"] is True


def test_observability_on_two_nodes(mxc: Mxc, mxc_home: Path, slurm_cluster: SlurmCluster) -> None:
    """Each node serves its exporter, node rank 0 runs Prometheus on the run's TSDB, and after the
    job the TSDB answers like a local run's: the loss of every rank, host series of both nodes."""
    bundle = build(mxc, *slurm_sets(slurm_cluster, nodes=2, **{
        "observability.enabled": "true", "observability.ray": "true", "observability.scrape_interval": 1,
        "checkpoint.period": 0,
    }))
    run_id = submit(mxc, bundle)
    run = run_dir(mxc_home, run_id)
    final = wait_final(mxc_home, run_id, timeout=300)
    assert final.status == "succeeded", (final.message, run.log.read_text(errors="replace")[-3000:])

    obs = final.observability or {}
    assert sorted(obs["nodes"]) == ["node1", "node2"] and obs["errors"] == []
    assert obs["prometheus"]["url"].startswith("http://127.0.0.1:") and "prometheus" not in obs["nodes"]["node2"]
    # A job spanning nodes: each exporter on the node's cluster address (both emulated nodes are this
    # machine here; tests/test_observe_multinode.py has them on distinct addresses), behind the token.
    assert all(n["exporter"]["bind"] != "127.0.0.1" and "ended" in n for n in obs["nodes"].values())
    assert (run.tsdb / "scrape-token").stat().st_mode & 0o777 == 0o600
    # One Ray cluster for the job: the head on node1, node2 joined it; each rank trained in an actor.
    assert obs["nodes"]["node1"]["ray"]["head"] and not obs["nodes"]["node2"]["ray"]["head"]
    assert obs["nodes"]["node2"]["ray"]["address"] == obs["nodes"]["node1"]["ray"]["address"]
    log = run.log.read_text(errors="replace")
    for rank, node in ((0, "node1"), (1, "node2")):
        assert re.search(rf"\[mxc {node} rank {rank}\] training pid \d+ in Ray actor on node", log), log[-3000:]
    assert not list(run.path.glob("observability/ray-cluster*")), "the run's Ray token is removed with the cluster"
    targets = sorted(p.name for p in (run.tsdb / "targets").iterdir())
    assert targets == ["alert-receiver-node1.json", "exporter-node1.json", "exporter-node2.json", "ray-node1.json",
                       "ray-node2.json"]
    assert processes_of(run) == [], "no exporter, Prometheus or Ray process outlives the job"

    def series(expr: str) -> list[dict[str, Any]]:
        out = mxc("metrics", run_id, "--query", expr, "--step", "1", "--json")
        assert out.returncode == 0, out.stderr
        result: list[dict[str, Any]] = json.loads(out.stdout)["result"]
        return result

    losses = {step: metrics["learning/loss"] for step, _, metrics in read_lines(run.metrics)}
    by_node = {s["metric"]["node"]: s for s in series("mxc_train_loss")}
    assert sorted(by_node) == ["node1", "node2"]  # one exporter per node, each reading its own rank
    assert {s["metric"]["rank"] for s in by_node.values()} == {"0", "1"}
    [steps] = series('mxc_train_last_step{node="node1"}')
    at_step = {t: int(v) for t, v in steps["values"]}
    pairs = [(at_step[t], v) for t, v in by_node["node1"]["values"] if t in at_step]
    assert len(pairs) >= 3 and all(value == losses[step] for step, value in pairs)  # exact, as in metrics.jsonl
    assert steps["values"][-1][1] == 29  # the final step made it into the TSDB before Prometheus stopped
    assert {s["metric"]["node"] for s in series("mxc_host_memory_available_bytes")} == {"node1", "node2"}
    # Both Ray nodes are Prometheus targets, each under its node label. (Whether node2's Ray was also
    # scraped before it stopped is up to timing: Ray is scraped every 15 s and node2's stops with its
    # rank, so a loaded machine can end the job first; the test asserts only what is decided.)
    for node in ("node1", "node2"):
        [target] = json.loads((run.tsdb / "targets" / f"ray-{node}.json").read_text())
        assert target["labels"] == {"run": run_id, "node": node}
        assert [t.rsplit(":", 1)[1] for t in target["targets"]] == [str(obs["nodes"][node]["ray"]["metrics_port"])]
    text = mxc("metrics", run_id).stdout  # the table names the node once series differ by it
    assert 'mxc_host_memory_available_bytes{node="node1"}' in text and 'node="node2"' in text


def test_a_hung_rank_is_detected_killed_and_the_job_requeued(mxc: Mxc, mxc_home: Path, slurm_cluster: SlurmCluster,
                                                             tmp_path: Path) -> None:
    """Rank 1's trainer is stopped (SIGSTOP) after the first checkpoint (both wait after step 7, then
    rank 0 goes on): rank 0 then waits in a collective for ever, a real hang, with observability on
    (each rank trains in a Ray actor). The node program's hang watch sees no step for
    runtime.hang.step_timeout; every rank dumps its trainer's stacks and kills it; the batch side
    requeues and the restart resumes and completes."""
    gate = PauseGate(tmp_path, {0: 7})
    bundle = build(mxc, *slurm_sets(slurm_cluster, nodes=2, **{
        "observability.enabled": "true", "observability.ray": "true", "observability.scrape_interval": 1,
        "runtime.hang.step_timeout": 10, "env.pass": PASS_VALUE,
        "checkpoint.period": 5, "restart.max": 1,
    }))
    run_id = submit(mxc, bundle, env=gate.env())
    run = run_dir(mxc_home, run_id)
    victim = gate.wait_paused(0, ranks=2)[1]
    wait_for(lambda: 5 in checkpoints(mxc_home, run_id), 240, "checkpoint 5")
    os.kill(victim, signal.SIGSTOP)
    gate.release(0)

    final = wait_final(mxc_home, run_id, timeout=300)
    log = run.log.read_text(errors="replace")
    assert final.status == "succeeded" and final.restarts == 1, (final.message, log[-3000:])
    hangs = [e for rank in (0, 1) for e in rank_events(mxc_home, run_id, rank) if e["event"] == "hang"]
    assert sorted(h["rank"] for h in hangs) == [0, 1], "every rank stops its trainer"
    assert all(h["attempt"] == 0 and h["phase"] == "step" for h in hangs)
    detector = next(h for h in hangs if h["detected_by"] == h["rank"])
    assert detector["idle_seconds"] >= 10 and detector["limit_s"] == 10
    assert re.search(r"no training step for \d+s \(runtime\.hang\.step_timeout 10s\): hung", log)
    for hang in hangs:  # a stack file of each of the rank's trainer processes, named by pid
        assert hang["stacks"] and all(Path(s).parent == run.stacks for s in hang["stacks"])
        assert all(Path(s).name.startswith(f"hang.rank-{hang['rank']}.attempt-0-pid") for s in hang["stacks"])
    # Rank 0, waiting in a collective for the stopped rank, shows where MaxText was stuck (the stopped
    # process itself cannot answer py-spy or faulthandler while it is stopped).
    assert any("train_loop" in Path(s).read_text() for h in hangs if h["rank"] == 0 for s in h["stacks"])
    decisions = [e for e in batch_events(mxc_home, run_id) if e["event"] == "decision"]
    assert [(e["cause"], e["action"]) for e in decisions] == [("hang", "requeue"), ("completed", "done")]
    assert re.search(r"restoring from this run's directory step (5|10|15|20|25)", log), "the restart resumed"
