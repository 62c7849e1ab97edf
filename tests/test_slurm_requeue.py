"""Requeue by cause, bounded by restart.max, on real Slurm daemons.

Node failure, preemption and a time limit reached after a checkpoint requeue; an application
error does not; a time limit without a checkpoint does not; restart.max stops all of them; and
where compute nodes have no scontrol, the job asks and ``mxc`` resubmits. (The requeue that
resumes MaxText from its checkpoint is in test_slurm_train.py.) Each job here is stopped while
MaxText starts up, so no test trains for long.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from mxc.runtime.record import Attempt
from mxc.runtime.rundir import RunDir
from tests.conftest import Mxc
from tests.processes import trainer_pids
from tests.slurm_cluster import SlurmCluster
from tests.slurm_jobs import (
    batch_events,
    build,
    leave_little_time,
    path_without_scontrol,
    processes_of,
    record,
    run_dir,
    slurm_of,
    slurm_sets,
    stage_started,
    submit,
    wait_final,
    wait_for,
)

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_env")]


def trainer_of(run: RunDir, rank: int) -> int | None:
    """The pid of rank ``rank``'s training process (MaxText's Python), once it runs."""
    return next(iter(trainer_pids(run.path, rank)), None)


def requeue_of(attempt: object) -> dict[str, str]:
    requeue = attempt.requeue if isinstance(attempt, Attempt) else None
    return requeue.model_dump(mode="json", exclude_none=True) if requeue is not None else {}


def training_started(home: Path, run_id: str, ranks: range = range(1)) -> None:
    wait_for(lambda: stage_started(home, run_id, "train", ranks), 120, "the train stage to start")


def test_dead_rank_ends_the_job_and_the_record_names_it(mxc: Mxc, mxc_home: Path, slurm_cluster: SlurmCluster) -> None:
    """A rank killed from outside (SIGKILL) brings every rank down (--kill-on-bad-exit); the policy
    requeues a kill, bounded by restart.max (0 here), and the record names the rank that died first.
    (An application error, which is never requeued, is in test_slurm_node.py.)"""
    run_id = submit(mxc, build(mxc, *slurm_sets(slurm_cluster, nodes=2, **{"restart.max": 0})))
    run = run_dir(mxc_home, run_id)
    victim = wait_for(lambda: trainer_of(run, 1), 120, "rank 1's training process")
    os.kill(victim, signal.SIGKILL)
    final = wait_final(mxc_home, run_id, timeout=120)
    assert final.status == "failed" and final.exit_code == 137
    assert final.restarts == 0 and len(final.attempts) == 1
    first = slurm_of(final)["first_failure"]
    assert (first["rank"], first["node"], first["stage"], first["rc"], first["cause"]) == (1, "node2", "train", 137, "killed")
    assert final.message == ("rank 1 (node2) failed first: stage train failed with exit 137 (SIGKILL); "
                             "not requeued: restart.max (0) reached")
    requeue = requeue_of(final.attempts[0])
    requeue.pop("checkpoint", None)  # whether MaxText had written step 0's checkpoint yet does not matter here
    assert requeue == {"cause": "killed", "action": "refused", "why": "restart.max (0) reached"}
    assert slurm_cluster.job(slurm_of(final)["job_id"])["JobState"] == "FAILED"
    wait_for(lambda: not processes_of(run), 30, "rank 0 to be brought down too")


def test_preemption_past_restart_max_is_not_requeued(mxc: Mxc, mxc_home: Path, slurm_cluster: SlurmCluster) -> None:
    bundle = build(mxc, *slurm_sets(slurm_cluster, nodes=1, **{"restart.max": 0}))
    run_id = submit(mxc, bundle)
    training_started(mxc_home, run_id)
    job_id = str(slurm_of(record(mxc_home, run_id))["job_id"])
    slurm_cluster.run("scancel", "--signal=USR2", "--batch", job_id)  # what --signal=B:USR2@N sends
    final = wait_final(mxc_home, run_id, timeout=120)
    assert final.status == "failed" and final.restarts == 0
    (attempt,) = final.attempts
    assert attempt.signal == "USR2" and attempt.cause == "preemption"
    assert requeue_of(attempt) == {"cause": "preemption", "action": "refused", "why": "restart.max (0) reached"}
    assert final.message == "preemption: not requeued (restart.max (0) reached)"
    assert slurm_cluster.job(job_id)["Restarts"] == "0"


def test_time_limit_without_a_checkpoint_is_not_requeued(mxc: Mxc, mxc_home: Path, slurm_cluster: SlurmCluster) -> None:
    bundle = build(mxc, *slurm_sets(slurm_cluster, nodes=1, **{"checkpoint.period": 0, "runtime.signal_seconds": 10}))
    run_id = submit(mxc, bundle)
    training_started(mxc_home, run_id)
    job_id = str(slurm_of(record(mxc_home, run_id))["job_id"])
    leave_little_time(slurm_cluster, job_id)
    slurm_cluster.run("scancel", "--signal=USR2", "--batch", job_id)
    final = wait_final(mxc_home, run_id, timeout=120)
    assert final.status == "failed" and final.restarts == 0
    (attempt,) = final.attempts
    assert attempt.cause == "time_limit"
    requeue = requeue_of(attempt)
    assert requeue["action"] == "refused" and "time limit reached without a checkpoint" in requeue["why"]
    assert "not requeued (time limit reached without a checkpoint (checkpointing: off)" in (final.message or "")


def test_node_failure_requeues_until_restart_max(mxc: Mxc, mxc_home: Path, slurm_cluster: SlurmCluster) -> None:
    """Slurm requeues a --requeue job whose node fails; the next start is past restart.max (0)
    and ends at once instead of training again."""
    run_id = submit(mxc, build(mxc, *slurm_sets(slurm_cluster, nodes=2, **{"restart.max": 0})))
    training_started(mxc_home, run_id, range(2))
    job_id = str(slurm_of(record(mxc_home, run_id))["job_id"])
    slurm_cluster.run("scontrol", "update", "NodeName=node2", "State=DOWN", "Reason=mxc-test")
    try:
        wait_for(lambda: slurm_cluster.job(job_id)["Restarts"] == "1", 60, "Slurm to requeue the job")
    finally:
        slurm_cluster.run("scontrol", "update", "NodeName=node2", "State=RESUME", check=False)
    final = wait_final(mxc_home, run_id, timeout=120)
    assert final.status == "failed" and final.restarts == 1
    assert slurm_of(final)["restart_count"] == 1
    first, second = final.attempts
    assert first.reason == "Slurm requeued the job: node failure"
    assert first.slurm_state == "NODE_FAIL"
    assert second.number == 1 and second.reason == "restart 1 is past restart.max (0)"
    assert final.message == "restart 1 is past restart.max (0)"
    assert [e["event"] for e in batch_events(mxc_home, run_id)][-1] == "refused"
    assert "stage" not in run_dir(mxc_home, run_id).log.read_text().split("restart 1 is past")[-1]


def test_without_scontrol_on_the_nodes_mxc_resubmits(mxc: Mxc, mxc_home: Path, slurm_cluster: SlurmCluster,
                                                      tmp_path: Path) -> None:
    """A PATH without scontrol and scancel (the job inherits it): USR2 reaches training through
    srun, the job leaves resubmit.request; reads only show the request, `mxc watch --once`
    resubmits into the same run."""
    path = path_without_scontrol(tmp_path)
    run_id = submit(mxc, build(mxc, *slurm_sets(slurm_cluster, nodes=1, **{"restart.max": 1})), env={"PATH": path})
    run = run_dir(mxc_home, run_id)
    training_started(mxc_home, run_id)
    first_job = str(slurm_of(record(mxc_home, run_id))["job_id"])
    slurm_cluster.run("scancel", "--signal=USR2", "--batch", first_job)
    pending = wait_for(lambda: "asked to be resubmitted" in (record(mxc_home, run_id).message or ""), 120,
                       "the job to end asking for a resubmission")
    assert pending and len(json.loads(run.record.read_text())["slurm"]["jobs"]) == 1  # a read submitted nothing
    watched = mxc("watch", "--once", run_id, env={"PATH": path})
    assert watched.returncode == 0, watched.stderr
    jobs = slurm_of(record(mxc_home, run_id))["jobs"]
    assert len(jobs) == 2, watched.stderr
    second_job = str(jobs[-1]["job_id"])
    assert f"resubmitted as Slurm job {second_job}" in watched.stderr
    assert second_job != first_job
    assert slurm_cluster.job(first_job)["JobState"] == "FAILED"  # exit 75: not a success
    wait_for(lambda: any(e["event"] == "start" and e["job_id"] == second_job for e in batch_events(mxc_home, run_id)),
             60, "the resubmitted job to start")
    rec = record(mxc_home, run_id)
    assert rec.restarts == 1 and slurm_of(rec)["resubmits"] == 1
    jobs = slurm_of(rec)["jobs"]
    assert jobs[1]["resubmit_of"] == first_job and jobs[1]["cause"] == "preemption"
    assert jobs[1]["why"].startswith("scontrol is not available on ")
    assert requeue_of(rec.attempts[0])["action"] == "resubmit_requested"
    assert (run.path / f"resubmit.request.{first_job}").exists() and not (run.path / "resubmit.request").exists()
    assert "USR2: asking training to checkpoint and stop" in run.log.read_text()  # srun passed it on
    cancelled = mxc("cancel", run_id, "--json")
    assert cancelled.returncode == 0, cancelled.stderr
    final = wait_final(mxc_home, run_id, timeout=60)
    assert final.status == "cancelled" and slurm_of(final)["job_id"] == second_job
    assert slurm_cluster.job(second_job)["JobState"] == "CANCELLED"
