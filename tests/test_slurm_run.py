"""``mxc run`` on the Slurm backend, against real daemons on 2 emulated nodes: cancel, a failed
preflight (recorded per rank, allocation released at once), a stage timeout naming the stage,
and containers that see only the GPUs Slurm allocated (fake GPUs, podman's command line)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import git
import pytest

from tests.conftest import Mxc
from tests.slurm_cluster import SlurmCluster
from tests.slurm_jobs import (
    batch_events,
    build,
    processes_of,
    rank_events,
    run_dir,
    slurm_of,
    slurm_sets,
    stage_started,
    submit,
    wait_final,
    wait_for,
)

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_env")]


def test_cancel_ends_the_job_and_every_process(mxc: Mxc, mxc_home: Path, slurm_cluster: SlurmCluster) -> None:
    run_id = submit(mxc, build(mxc, *slurm_sets(slurm_cluster, nodes=2)))
    run = run_dir(mxc_home, run_id)
    wait_for(lambda: stage_started(mxc_home, run_id, "train", range(2)), 120, "training to start on both nodes")
    assert processes_of(run), "no process of the run found while it trains"
    out = mxc("cancel", run_id, "--json")
    assert out.returncode == 0, out.stderr
    rec = json.loads(out.stdout)
    assert rec["status"] == "cancelled" and rec["final"] is True and rec["message"] == "cancelled with mxc cancel"
    job_id = rec["slurm"]["job_id"]
    assert slurm_cluster.job(job_id)["JobState"] == "CANCELLED"
    wait_for(lambda: not processes_of(run), 30, "the run's processes to end")
    again = mxc("cancel", run_id)
    assert again.returncode == 2 and "already ended (cancelled)" in again.stderr
    assert json.loads(mxc("runs", "--json").stdout)[0]["status"] == "cancelled"


def test_preflight_failure_stops_the_job_with_reasons_per_rank(mxc: Mxc, mxc_home: Path,
                                                               slurm_cluster: SlurmCluster) -> None:
    # A leftover "training" process from an earlier job (argv like MaxText's, another run).
    stale = subprocess.Popen(["bash", "-c", "exec -a 'python3 -m maxtext.trainers.pre_train.train stale' sleep 300"],
                             env={"PATH": os.environ["PATH"]})
    try:
        bundle = build(mxc, *slurm_sets(slurm_cluster, nodes=2, **{
            "runtime.preflight.min_free_gb": 1000000, "runtime.preflight.stale_processes": "true"}))
        run_id = submit(mxc, bundle)
        final = wait_final(mxc_home, run_id, timeout=120)
    finally:
        stale.send_signal(signal.SIGKILL)
        stale.wait()
    assert final.status == "failed" and final.exit_code == 3
    # The rank that failed first recorded its checks; the other may have been stopped mid-check
    # (srun --kill-on-bad-exit): whatever it recorded says the same.
    preflight = final.preflight
    first = slurm_of(final)["first_failure"]
    assert str(first["rank"]) in preflight and set(preflight) <= {"0", "1"}
    for rank_key, result in preflight.items():
        node = {"0": "node1", "1": "node2"}[rank_key]
        assert result["node"] == node and result["passed"] is False
        checks = {c["check"]: c for c in result["checks"]}
        assert checks["disk"]["status"] == "fail" and "need 1000000" in checks["disk"]["detail"]
        assert checks["stale_processes"]["status"] == "fail" and str(stale.pid) in checks["stale_processes"]["detail"]
        assert checks["network"]["status"] == "pass"
        assert json.loads((run_dir(mxc_home, run_id).path / "ranks" / rank_key / "preflight.json").read_text()) == \
            {k: v for k, v in result.items() if k != "failed"}
    assert first["stage"] == "preflight" and first["rc"] == 3 and first["rank"] in (0, 1)
    assert final.message is not None
    assert final.message.startswith(f"rank {first['rank']} ({first['node']}) failed first: preflight: stale_processes: ")
    assert "; disk: " in final.message and "need 1000000" in final.message
    # Never trained, and the allocation was given back at once (no rank waited for the other).
    log = run_dir(mxc_home, run_id).log.read_text()
    assert "stage train" not in log and "preflight failed: disk:" in log
    end = batch_events(mxc_home, run_id)[-1]
    assert end["event"] == "end" and end["rc"] != 0
    # No rank waited for the other: none reached the barrier or ran out a stage's limit; the one
    # that did not fail first was stopped (srun --kill-on-bad-exit), never timed out.
    for rank in (0, 1):
        ends = [e for e in rank_events(mxc_home, run_id, rank) if e["event"] in ("stage_end", "barrier")]
        assert all(e["event"] == "stage_end" and not e["timed_out"] for e in ends), ends
    assert final.restarts == 0 and not slurm_of(final).get("requeues")
    decision = [e for e in batch_events(mxc_home, run_id) if e["event"] == "decision"][-1]
    # Both ranks fail the same checks within milliseconds: the batch side decides on the rank whose
    # exit it saw first, the record names the rank whose event is earliest; either is a rank that
    # failed preflight (a proof run saw them differ once).
    assert (decision["cause"], decision["action"]) == ("stage_failed", "stop")
    assert str(decision["rank"]) in preflight or decision["rank"] == first["rank"]


def test_stage_timeout_fails_the_job_naming_the_stage(mxc: Mxc, mxc_home: Path, slurm_cluster: SlurmCluster) -> None:
    # MaxText cannot even import in 3 s: the train stage runs past runtime.timeouts.train.
    bundle = build(mxc, *slurm_sets(slurm_cluster, nodes=1, **{"runtime.timeouts.train": 3}))
    run_id = submit(mxc, bundle)
    final = wait_final(mxc_home, run_id, timeout=120)
    assert final.status == "failed" and final.exit_code == 124
    assert final.message == ("rank 0 (node1) failed first: stage train timed out (runtime.timeouts.train); not requeued: "
                             "the train stage ran past runtime.timeouts.train; a restart would meet the same limit")
    assert slurm_of(final)["first_failure"]["timed_out"] is True
    assert "stage train timed out after 3s (runtime.timeouts.train)" in run_dir(mxc_home, run_id).log.read_text()
    exit_event = [e for e in rank_events(mxc_home, run_id, 0) if e["event"] == "exit"][-1]
    assert exit_event["stage"] == "train" and exit_event["timed_out"] is True and exit_event["rc"] == 124
    stages = [(e["stage"], e["rc"]) for e in rank_events(mxc_home, run_id, 0) if e["event"] == "stage_end"]
    assert stages == [("preflight", 0), ("image", 0), ("train", 124)]
    decision = [e for e in batch_events(mxc_home, run_id) if e["event"] == "decision"][-1]
    assert (decision["cause"], decision["action"]) == ("train_timeout", "stop")


def _code_repo(path: Path) -> str:
    repo = git.Repo.init(path)
    (path / "README").write_text("training code stand-in\n")
    repo.index.add(["README"])
    return repo.index.commit("pin me").hexsha


@pytest.mark.parametrize(("vendor", "devices"), [
    ("nvidia", ["--device=nvidia.com/gpu=2", "--device=nvidia.com/gpu=3"]),
    ("amd", ["--device=/dev/kfd", "--device=/dev/dri/renderD130", "--device=/dev/dri/renderD131"]),
])
def test_container_sees_only_the_allocated_gpus(vendor: str, devices: list[str], mxc: Mxc, mxc_home: Path,
                                                slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """2 of each node's 4 fake GPUs are taken by another job; ours gets GPUs 2 and 3, and the
    podman command line passes exactly those. Podman cannot run GPU containers here, so a
    stand-in `podman` first on PATH records its arguments (the job inherits PATH)."""
    shim = tmp_path / "bin" / "podman"
    shim.parent.mkdir()
    shim.write_text('#!/bin/bash\nprintf "%s\\n" "$@" > "$MXC_RUN_DIR/podman.$SLURM_PROCID.$1"\nexit 0\n')
    shim.chmod(0o755)
    commit = _code_repo(tmp_path / "code")
    bundle = build(mxc, *slurm_sets(slurm_cluster, nodes=2, **{
        "runtime.container": "podman", "image.ref": "registry.example/maxtext:test",
        "image.digest": "sha256:" + "ab" * 32, "code.repo": str(tmp_path / "code"), "code.commit": commit,
        "resources.gpu_vendor": vendor, "resources.gpus_per_node": 2, "resources.exclusive": "false",
        # tiny's cpu on GPUs is refused by `mxc build` (jax-platforms); the stand-in podman runs no JAX
        "env.vars.JAX_PLATFORMS": {"nvidia": "cuda", "amd": "rocm"}[vendor]}))
    blocker = slurm_cluster.run("sbatch", "--parsable", "-N2", "--gpus-per-node=2", f"--output={tmp_path}/blocker.out",
                                "--wrap", "sleep 300").stdout.strip()
    try:
        slurm_cluster.wait_state(blocker, ["RUNNING"], timeout=30)
        run_id = submit(mxc, bundle, env={"PATH": f"{shim.parent}:{os.environ['PATH']}"})
        final = wait_final(mxc_home, run_id, timeout=120)
    finally:
        slurm_cluster.run("scancel", blocker, check=False)
    assert final.status == "succeeded", final.message
    run = run_dir(mxc_home, run_id).path
    for rank in (0, 1):
        argv = (run / f"podman.{rank}.run").read_text().splitlines()
        gpu_args = [a for a in argv if a.startswith("--device=")]
        assert gpu_args == devices, argv
        assert "CUDA_VISIBLE_DEVICES" not in argv and "ROCR_VISIBLE_DEVICES" not in argv
        assert f"registry.example/maxtext:test@sha256:{'ab' * 32}" in argv
        checks = {c["check"]: c for c in final.preflight[str(rank)]["checks"]}
        assert checks["gpus"]["status"] == "pass" and "visible 2 (2,3)" in checks["gpus"]["detail"]
    assert (run / "podman.0.image").read_text().splitlines()[:2] == ["image", "exists"]
