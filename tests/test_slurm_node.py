"""The node program on the 2-node test Slurm, with a stand-in trainer (tests/standins/trainer.py) so
that each case takes seconds: a hang before the first step, XLA's collective termination (an
infrastructure failure, requeued) then an application error (not requeued), a slow image stage that
holds the other rank at the barrier, and two nodes fetching one image into the shared cache.

Everything else is real: sbatch, srun, the batch side's policy and requeue, each rank's stages.
Assertions read the events the node program wrote (their order and content), never the clock.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import git
import pytest

from mxc.node import layout
from tests.conftest import REPO, Mxc
from tests.slurm_cluster import SlurmCluster
from tests.slurm_jobs import batch_events, build, rank_events, run_dir, slurm_of, slurm_sets, submit, wait_final

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_env")]
STANDIN = REPO / "tests" / "standins" / "trainer.py"
VENV_BIN = Path(sys.executable).parent  # py-spy lives there


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.fixture
def standin_bin(tmp_path: Path) -> Iterator[Path]:
    """bin/ with ``python`` (the native interpreter: its image check passes, ``-m ...`` runs the stand-in),
    ``podman`` and ``apptainer`` that run the stand-in as the container's ``python3``."""
    bin_dir = tmp_path / "bin"
    # The container's first program is mxc's envmerge.py (REQUEST -- python3 -m ...): run it with this
    # Python, and the stand-in trainer as the container's python3.
    run_standin = (f'while [ $# -gt 0 ] && [ "$1" != python3 ]; do shift; done\nshift\n'
                   f'merge=$1 request=$2\nshift 4\n'
                   f'exec {sys.executable} "$merge" "$request" -- {sys.executable} {STANDIN} "$@"\n')
    executable(bin_dir / "python", f'#!/bin/bash\nif [ "$1" = -m ]; then exec {sys.executable} {STANDIN} "$@"; fi\nexit 0\n')
    executable(bin_dir / "podman", (
        "#!/bin/bash\n"
        "# image exists: node2 is slow, and deterministically the slower one: it finishes its image stage only\n"
        "# after node1 has finished its own (its stage_end event is written)\n"
        'if [ "$1" = image ]; then\n'
        '  if [ "$SLURMD_NODENAME" = node2 ]; then\n'
        '    until grep -qs \'"stage_end".*"stage": "image"\' "$MXC_RUN_DIR/ranks/0/events.jsonl"; do sleep 0.1; done\n'
        "    sleep 1\n"
        "  fi\n"
        "  exit 0\n"
        "fi\n"
        'if [ "$1" = run ]; then\n' + run_standin + "fi\nexit 0\n"))
    executable(bin_dir / "apptainer", (
        "#!/bin/bash\n"
        'if [ "$1" = pull ]; then\n'
        '  echo "$SLURMD_NODENAME $2" >> "$MXCTEST_PULLS"\n'
        "  sleep 2\n"
        '  printf "a sif image" > "$2"\n'
        "  exit 0\n"
        "fi\n"
        'if [ "$1" = exec ]; then\n' + run_standin + "fi\nexit 2\n"))
    yield bin_dir


def job_env(bin_dir: Path, trainer: str = "", **extra: str) -> dict[str, str]:
    return {"PATH": f"{bin_dir}:{VENV_BIN}:{os.environ['PATH']}", "MXC_PYTHON": str(bin_dir / "python"),
            "MXCTEST_TRAINER": trainer, **extra}


def decisions(home: Path, run_id: str) -> list[tuple[str, str]]:
    return [(e["cause"], e["action"]) for e in batch_events(home, run_id) if e["event"] == "decision"]


def events_of(home: Path, run_id: str, rank: int, kind: str, attempt: int = 0, stage: str | None = None) -> list[dict[str, Any]]:
    return [e for e in rank_events(home, run_id, rank) if e["event"] == kind and e["attempt"] == attempt
            and (stage is None or e.get("stage") == stage)]


def code_repo(path: Path) -> str:
    repo = git.Repo.init(path)
    (path / "README").write_text("training code stand-in\n")
    repo.index.add(["README"])
    return repo.index.commit("pin me").hexsha


def test_a_hang_before_the_first_step_is_caught_and_requeued(mxc: Mxc, mxc_home: Path, slurm_cluster: SlurmCluster,
                                                             standin_bin: Path) -> None:
    """Attempt 0 prints nothing on either rank (an RCCL initialisation hang): the hang watch's init
    limit catches it, every rank keeps its trainer's stacks and kills it, the batch side requeues,
    and attempt 1 trains to the end."""
    bundle = build(mxc, *slurm_sets(slurm_cluster, nodes=2, **{"runtime.hang.init_timeout": 5, "restart.max": 1}))
    run_id = submit(mxc, bundle, env=job_env(standin_bin, "0:*=silent"))
    final = wait_final(mxc_home, run_id, timeout=240)
    run = run_dir(mxc_home, run_id)
    assert final.status == "succeeded" and final.restarts == 1, (final.message, run.log.read_text()[-3000:])
    assert decisions(mxc_home, run_id) == [("hang", "requeue"), ("completed", "done")]
    for rank in (0, 1):
        [hang] = events_of(mxc_home, run_id, rank, "hang")
        assert hang["phase"] == "init" and hang["limit_s"] == 5
        [exit_event] = events_of(mxc_home, run_id, rank, "exit")
        assert exit_event["cause"] == "hang"
        assert hang["stacks"] and all(Path(s).name.startswith(f"hang.rank-{rank}.attempt-0-pid") for s in hang["stacks"])
        assert any("never_prints" in Path(s).read_text() for s in hang["stacks"]), "the stack shows where it waited"
        [resumed] = events_of(mxc_home, run_id, rank, "exit", attempt=1)
        assert resumed["cause"] == "completed" and resumed["last_step"] == 2
    detector = next(h for r in (0, 1) for h in events_of(mxc_home, run_id, r, "hang") if h["detected_by"] == r)
    assert detector["idle_seconds"] >= 5
    assert "before the first step (runtime.hang.init_timeout 5s): hung" in run.log.read_text()
    assert final.attempts[0].reason == "hang: requeued after checkpoint none"


def test_collective_termination_is_requeued_and_an_application_error_is_not(
        mxc: Mxc, mxc_home: Path, slurm_cluster: SlurmCluster, standin_bin: Path) -> None:
    """Attempt 0: rank 1 dies with XLA's NCCL termination message (a line the triage catalog blames on
    the network, compiled into run.json): requeued as an infrastructure failure. Attempt 1: rank 1
    raises an exception after its first step: an application error, not requeued."""
    bundle = build(mxc, *slurm_sets(slurm_cluster, nodes=2, **{"restart.max": 2}))
    run_id = submit(mxc, bundle, env=job_env(standin_bin, "0:1=nccl,1:1=error,*:0=silent"))
    final = wait_final(mxc_home, run_id, timeout=240)
    assert final.status == "failed" and final.restarts == 1, final.message
    assert decisions(mxc_home, run_id) == [("infrastructure", "requeue"), ("application_error", "stop")]
    infra, app = [e for e in batch_events(mxc_home, run_id) if e["event"] == "decision"]
    assert (infra["rank"], infra["node"]) == (1, "node2")
    assert infra["detail"].startswith("nccl_error: ") and "Termination timeout for `acquire clique" in infra["detail"]
    assert (app["rank"], app["node"]) == (1, "node2") and "fails the same way again" in app["reason"]
    first = final.attempts[0]
    assert first.model_dump(mode="json", exclude_none=True)["requeue"]["action"] == "requeued"
    assert final.exit_code == 1 and final.message is not None
    assert final.message.startswith("rank 1 (node2) failed first: stage train failed with exit 1; not requeued: ")
    assert [r["cause"] for r in slurm_of(final)["requeues"]] == ["infrastructure"]


def test_the_end_of_training_is_not_a_hang(mxc: Mxc, mxc_home: Path, slurm_cluster: SlurmCluster,
                                            standin_bin: Path) -> None:
    """Three steps, checkpointing off (as in every imported config): after the last step, rank 0's
    trainer stalls (JAX/PjRt can take minutes to shut down) and rank 1's exits 1. Neither is a hang
    or an application error: once both ranks logged the final step, rank 0's trainer is ended after
    runtime.exit_grace, and the run succeeds in its first attempt with a note; nothing is requeued,
    nothing trained again from step 0."""
    bundle = build(mxc, *slurm_sets(slurm_cluster, nodes=2, **{
        "model.overrides.steps": 3, "checkpoint.period": 0, "runtime.exit_grace": 2, "restart.max": 1}))
    run_id = submit(mxc, bundle, env=job_env(standin_bin, "*:0=stall,*:1=exit1"))
    final = wait_final(mxc_home, run_id, timeout=240)
    run = run_dir(mxc_home, run_id)
    assert final.status == "succeeded" and final.restarts == 0, (final.message, run.log.read_text()[-3000:])
    assert decisions(mxc_home, run_id) == [("completed", "done")]
    stalled = "training completed; the trainer had not exited 2s after the final step 2 (runtime.exit_grace): mxc ended it"
    failed = "training completed; the trainer exited 1 after the final step 2"
    assert final.message == f"rank 0: {stalled}; rank 1: {failed}"
    assert [(e["rc"], e["cause"], e["detail"]) for r in (0, 1) for e in events_of(mxc_home, run_id, r, "exit")] == [
        (0, "completed", stalled), (0, "completed", failed)]
    assert not events_of(mxc_home, run_id, 0, "hang") and not (run.path / "hang").exists()
    assert sorted(p.name for p in run.path.glob("standin.attempt-*")) == ["standin.attempt-0.rank-0",
                                                                         "standin.attempt-0.rank-1"]


def test_a_slow_image_stage_holds_the_other_rank_at_the_barrier(mxc: Mxc, mxc_home: Path, slurm_cluster: SlurmCluster,
                                                                standin_bin: Path, tmp_path: Path) -> None:
    """node2's image stage ends only after node1's (the stand-in podman waits for node1's event):
    node1 waits at the barrier, and neither rank starts training before node2's image is ready."""
    commit = code_repo(tmp_path / "code")
    bundle = build(mxc, *slurm_sets(slurm_cluster, nodes=2, **{
        "runtime.container": "podman", "image.ref": "registry.example/maxtext:test", "image.digest": "sha256:" + "cd" * 32,
        "code.repo": str(tmp_path / "code"), "code.commit": commit}))
    run_id = submit(mxc, bundle, env=job_env(standin_bin))
    final = wait_final(mxc_home, run_id, timeout=240)
    assert final.status == "succeeded", final.message
    image_end = {r: events_of(mxc_home, run_id, r, "stage_end", stage="image")[0]["time"] for r in (0, 1)}
    train_start = {r: events_of(mxc_home, run_id, r, "stage_start", stage="train")[0]["time"] for r in (0, 1)}
    barrier = {r: events_of(mxc_home, run_id, r, "barrier")[0] for r in (0, 1)}
    assert image_end[0] < image_end[1]  # node2 was the slow one
    assert barrier[0]["ranks"] == 2 and barrier[0]["time"] >= image_end[1] and barrier[0]["waited_s"] > 0
    assert min(train_start.values()) >= image_end[1], "a rank started training before every image was ready"
    # The record shows rank 0's environment as training saw it inside the (stand-in) container.
    training = final.training or {}
    assert training["container"] == "podman" and training["environment"]["JAX_NUM_PROCESSES"] == "2", training


def test_two_nodes_fetching_one_image_leave_one_file(mxc: Mxc, mxc_home: Path, slurm_cluster: SlurmCluster,
                                                     standin_bin: Path, tmp_path: Path) -> None:
    """Both ranks need the same Apptainer image from a registry: one fetches it (under the cache's
    lock, into a temporary name of its own, then renamed), the other uses the cached file."""
    commit = code_repo(tmp_path / "code")
    digest = "ef" * 32
    bundle = build(mxc, *slurm_sets(slurm_cluster, nodes=2, **{
        "runtime.container": "apptainer", "image.ref": "registry.example/maxtext:test", "image.digest": f"sha256:{digest}",
        "code.repo": str(tmp_path / "code"), "code.commit": commit}))
    pulls = tmp_path / "pulls.log"
    run_id = submit(mxc, bundle, env=job_env(standin_bin, MXCTEST_PULLS=str(pulls)))
    final = wait_final(mxc_home, run_id, timeout=240)
    assert final.status == "succeeded", final.message
    assert len(pulls.read_text().splitlines()) == 1, pulls.read_text()
    cache = mxc_home / "images"
    assert sorted(p.name for p in cache.iterdir()) == [f"{digest}.sif", f"{digest}.sif.lock"]
    assert (cache / f"{digest}.sif").read_text() == "a sif image"
    actions = sorted(events_of(mxc_home, run_id, r, "image")[0]["action"] for r in (0, 1))
    assert actions == ["cached", "fetched"]
    assert all(events_of(mxc_home, run_id, r, "image")[0]["image"] == str(cache / f"{digest}.sif") for r in (0, 1))


def test_each_node_detects_its_settings_and_the_container_gets_them(mxc: Mxc, mxc_home: Path,
                                                                    slurm_cluster: SlurmCluster, standin_bin: Path,
                                                                    tmp_path: Path) -> None:
    """env.detect on both nodes of a Podman job (docs/detectors.md): each rank reads the recorded RoCE
    tree of NVIDIA/nccl#1131 (MXC_DETECT_ROOT), the spec's NCCL_DMABUF_ENABLE=1 is lowered by the guard
    (no kernel config there), training in the container sees the detected values (envmerge.py joins them
    like the spec's), and the record has both ranks."""
    commit = code_repo(tmp_path / "code")
    root = tmp_path / "root"
    shutil.copytree(REPO / "tests/fixtures/sys/infiniband-roce-nccl1131", root / "sys/class/infiniband")
    (root / "proc/sys/kernel").mkdir(parents=True)
    (root / "proc/sys/kernel/osrelease").write_text("6.8.0-107-generic\n")
    calls = tmp_path / "podman-runs"
    wrapper = executable(tmp_path / "wrap" / "podman", (
        f'#!/bin/bash\nif [ "$1" = run ]; then echo "$SLURMD_NODENAME $*" >> {calls}; fi\n'
        f'exec {standin_bin / "podman"} "$@"\n'))
    bundle = build(mxc, *slurm_sets(slurm_cluster, nodes=2, **{
        "runtime.container": "podman", "image.ref": "registry.example/maxtext:test", "image.digest": "sha256:" + "cd" * 32,
        "code.repo": str(tmp_path / "code"), "code.commit": commit,
        "env.detect": "[gid_index, ib_hca, dmabuf]", "env.vars.NCCL_DMABUF_ENABLE": "1"}))
    env = job_env(standin_bin, MXC_DETECT_ROOT=str(root))
    env["PATH"] = f"{wrapper.parent}:{env['PATH']}"
    run_id = submit(mxc, bundle, env=env)
    final = wait_final(mxc_home, run_id, timeout=240)
    assert final.status == "succeeded", final.message
    detected = final.detected or {}
    assert sorted((rank, entry["node"]) for rank, entry in detected.items()) == [("0", "node1"), ("1", "node2")]
    for entry in detected.values():
        results = entry["detectors"]
        assert results["gid_index"]["variables"]["NCCL_IB_GID_INDEX"]["value"] == "3"
        assert results["ib_hca"]["variables"]["NCCL_IB_HCA"]["value"] == "=mlx5_0:1,mlx5_1:1"
        assert results["dmabuf"]["variables"]["NCCL_DMABUF_ENABLE"] == {"value": "0", "how": "guard", "was": "1"}
    runs = calls.read_text().splitlines()
    assert sorted(line.split()[0] for line in runs) == ["node1", "node2"]
    for rank in (0, 1):  # what training saw in the container, as envmerge.py wrote it there
        seen = json.loads(layout.environment(mxc_home / "runs" / run_id, rank).read_text())["environment"]
        assert (seen["NCCL_IB_GID_INDEX"], seen["NCCL_IB_HCA"], seen["NCCL_DMABUF_ENABLE"]) == (
            "3", "=mlx5_0:1,mlx5_1:1", "0"), rank
