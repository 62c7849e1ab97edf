"""One owner of run paths (mxc/runtime/runpaths.py), on the real test Slurm: runs outside ``$MXC_HOME``
(``MXC_RUNS_DIR``) and MaxText's output outside the run directory (``checkpoint.dir``).

Each test reproduces a bug of c388a5b, where several modules derived these paths on their own:
``mxc watch`` took ``<run>/../..`` as the store (wrong with ``MXC_RUNS_DIR``: no resubmission, no
alerts), and the Slurm backend recorded the TensorBoard directory inside the run directory whatever
``checkpoint.dir`` said (``gc`` and ``--resume-from`` followed it: the run's checkpoints were neither
removed nor found).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mxc.node.checkpoints import finished_steps
from mxc.runtime import runs
from mxc.runtime.record import RunRecord
from mxc.runtime.rundir import RunDir
from tests.conftest import Mxc
from tests.slurm_cluster import SlurmCluster
from tests.slurm_jobs import (
    build,
    path_without_scontrol,
    slurm_of,
    slurm_sets,
    stage_started,
    submit,
    wait_for,
)
from tests.test_slurm_alerts import HOOK_KEY, notify_spec, texts
from tests.test_slurm_node import job_env, standin_bin  # noqa: F401 (standin_bin: a fixture used here)
from tests.webhook_server import serve

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_env")]


def scratch_runs(tmp_path: Path) -> Path:
    """A runs root outside $MXC_HOME, as `MXC_RUNS_DIR=$SCRATCH/mxc-runs` on a cluster."""
    return tmp_path / "scratch" / "runs"


def load(root: Path, run_id: str) -> RunRecord:
    """The record as `mxc runs` shows it (Slurm's state folded in, nothing written)."""
    return runs.load(RunDir(root / run_id))


def wait_final(root: Path, run_id: str, timeout: float = 240) -> RunRecord:
    return wait_for(lambda: (rec if (rec := load(root, run_id)).final else None), timeout, f"run {run_id} to end", 0.5)


def test_watch_resubmits_a_run_outside_the_home(mxc: Mxc, mxc_home: Path, slurm_cluster: SlurmCluster,
                                                standin_bin: Path, tmp_path: Path) -> None:  # noqa: F811
    """MXC_RUNS_DIR elsewhere and nodes without scontrol: the job asks to be resubmitted, and
    `mxc watch` resubmits the bundle from this mxc's store (c388a5b looked in <runs root>/.. and
    refused: "bundle ... is no longer in the store")."""
    root = scratch_runs(tmp_path)
    env = {**job_env(standin_bin, "0:*=silent"), "MXC_RUNS_DIR": str(root)}
    env["PATH"] = f"{standin_bin}:{path_without_scontrol(tmp_path)}"
    bundle = build(mxc, *slurm_sets(slurm_cluster, nodes=1, **{"restart.max": 1}))
    run_id = submit(mxc, bundle, env=env)
    assert (root / run_id / "record.json").is_file() and not (mxc_home / "runs").exists()
    wait_for(lambda: stage_started(root.parent, run_id, "train"), 120, "the train stage to start")
    first_job = str(slurm_of(load(root, run_id))["job_id"])
    slurm_cluster.run("scancel", "--signal=USR2", "--batch", first_job)
    wait_for(lambda: "asked to be resubmitted" in (load(root, run_id).message or ""), 120,
             "the job to end asking for a resubmission")

    watched = mxc("watch", "--once", run_id, env=env)
    assert watched.returncode == 0, watched.stderr
    jobs = slurm_of(load(root, run_id))["jobs"]
    assert len(jobs) == 2 and jobs[1]["resubmit_of"] == first_job, watched.stderr
    assert f"resubmitted as Slurm job {jobs[1]['job_id']}" in watched.stderr
    final = wait_final(root, run_id)
    assert final.status == "succeeded" and final.restarts == 1, final.message


def test_watch_alerts_for_a_run_outside_the_home(mxc: Mxc, mxc_home: Path, slurm_cluster: SlurmCluster,
                                                 tmp_path: Path) -> None:
    """A job cancelled while it was held never ran, so it could not alert: `mxc watch` does, with the
    notify settings of the run's bundle (c388a5b found no bundle under <runs root>/.. and sent nothing)."""
    root = scratch_runs(tmp_path)
    with serve() as hook:
        spec = notify_spec(tmp_path, {"format": "mattermost", "secret_env": "CHAT_HOOK"})
        bundle = build(mxc, *slurm_sets(slurm_cluster, nodes=1, **{"resources.sbatch_extra": "[--hold]"}), spec=spec)
        env = {"MXC_RUNS_DIR": str(root), "CHAT_HOOK": hook.url("/hooks/" + HOOK_KEY), **hook.allow()}
        run_id = submit(mxc, bundle, env=env)
        job_id = str(slurm_of(load(root, run_id))["job_id"])
        slurm_cluster.run("scancel", job_id)
        wait_for(lambda: load(root, run_id).status == "cancelled", 60, "Slurm to say the job was cancelled")
        assert hook.posts == []  # the job never ran: nobody has alerted yet

        watched = mxc("watch", "--once", run_id, env=env)
        assert watched.returncode == 0, watched.stderr
        saved = json.loads((root / run_id / "record.json").read_text())
        assert saved["final"] is True and saved["status"] == "cancelled"
        (text,) = texts(hook)
        assert text.startswith(f"mxc: run {run_id} (tiny) cancelled") and f"Slurm job {job_id} was cancelled" in text, text


@pytest.mark.training
def test_checkpoint_dir_on_slurm_is_where_record_gc_and_resume_look(mxc: Mxc, mxc_home: Path,
                                                                    slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """MaxText on Slurm with `checkpoint.dir`: its TensorBoard events and checkpoints are in
    <checkpoint.dir>/<run-id>. The record says so, `mxc gc` lists that tree with the run, and
    `--resume-from` finds the newest checkpoint there. c388a5b got all three wrong (it pointed them
    into the run directory); one training shows each, so every one of them is checked and reported."""
    shared = tmp_path / "checkpoints"
    bundle = build(mxc, *slurm_sets(slurm_cluster, nodes=1, **{"checkpoint.dir": str(shared)}))
    run_id = submit(mxc, bundle)
    final = wait_final(mxc_home / "runs", run_id, timeout=300)
    assert final.status == "succeeded", final.message
    tree = shared / run_id
    events = sorted(tree.rglob("events.out.tfevents.*"))
    assert events and {e.parent for e in events} == {tree / "tensorboard" / run_id}  # where MaxText wrote them
    assert finished_steps(tree / "checkpoints")[-1:] == [29]
    wrong = []

    if final.tensorboard != str(tree / "tensorboard" / run_id):  # 1. the record (dashboard, plugin, people follow it)
        wrong.append(f"record.tensorboard is {final.tensorboard}")

    assert mxc("watch", "--once", run_id).returncode == 0  # record.json final (gc never judges a live record)
    listed = mxc("gc", "--status", "succeeded", "--json")  # 2. gc removes the run's tree with it
    assert listed.returncode == 0, listed.stderr
    paths = [item["paths"] for item in json.loads(listed.stdout)["items"]]
    if paths != [[str(mxc_home / "runs" / run_id), str(tree)]]:
        wrong.append(f"gc would remove {paths}")

    planned = mxc("run", bundle, "--resume-from", run_id, "--dry-run", "--json")  # 3. resume finds its checkpoints
    seeded = f"resumes from run {run_id} at step 29: its checkpoint {tree / 'checkpoints' / '29'} is seeded"
    if planned.returncode != 0 or seeded not in " ".join(json.loads(planned.stdout)["notes"]):
        wrong.append(f"--resume-from: exit {planned.returncode}: {planned.stderr.strip()}")
    assert wrong == []

    removed = mxc("rm", run_id)
    assert removed.returncode == 0, removed.stderr
    assert not tree.exists() and shared.is_dir() and not (mxc_home / "runs" / run_id).exists()
