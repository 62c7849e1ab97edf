"""Every spec's job.sbatch is accepted by a real slurmctld (``sbatch --test-only``), once its
resources are adapted to the test cluster with ``mxc build --set``; an impossible request is not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import RUNNABLE_SPECS, Mxc
from tests.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slurm


def build(mxc: Mxc, spec: Path, *sets: str) -> Path:
    out = mxc("build", "--json", str(spec), *sets)
    assert out.returncode == 0, out.stderr
    return Path(json.loads(out.stdout)["path"])


def resource_sets(mxc: Mxc, spec: Path, cluster: SlurmCluster, nodes: int) -> list[str]:
    """The spec's GPUs and CPUs capped at what a test node has, plus our partition and node count."""
    resolved = json.loads((build(mxc, spec, "--set", "runtime.backend=slurm") / "spec.json").read_text())
    res = resolved["resources"]
    flags = [f"resources.nodes={nodes}", f"resources.partition={cluster.partition}", "runtime.backend=slurm"]
    if res["gpus_per_node"] > cluster.gpus_per_node:
        flags.append(f"resources.gpus_per_node={cluster.gpus_per_node}")
    if (res.get("cpus_per_task") or 0) > cluster.cpus_per_node:
        flags.append(f"resources.cpus_per_task={cluster.cpus_per_node}")
    flags += mesh_that_fits(resolved["model"].get("overrides") or {})
    return [arg for flag in flags for arg in ("--set", flag)]


def mesh_that_fits(overrides: dict[str, object]) -> list[str]:
    """A mesh for the test cluster: ici_fsdp and dcn_data take what is there (-1, MaxText's own
    defaults), every other ici_*/dcn_* axis the spec sets becomes 1 (mxc build refuses a mesh that
    does not multiply to the devices)."""
    fill = {"ici_fsdp_parallelism": -1, "dcn_data_parallelism": -1}
    axes = {key: 1 for key in overrides if key.startswith(("ici_", "dcn_")) and key.endswith("_parallelism")}
    return [f"model.overrides.{axis}={size}" for axis, size in sorted((axes | fill).items())]


def test_cluster_has_two_nodes_with_fake_gpus(slurm_cluster: SlurmCluster) -> None:
    out = slurm_cluster.run("sinfo", "-h", "-N", "-o", "%N %T %G").stdout.split("\n")
    assert sorted(line.split()[0] for line in out if line) == ["node1", "node2"]
    assert all(line.split()[1] == "idle" and "gpu:4" in line for line in out if line)


@pytest.mark.parametrize("spec", RUNNABLE_SPECS, ids=lambda p: p.stem)
def test_sbatch_accepts_every_spec(spec: Path, mxc: Mxc, slurm_cluster: SlurmCluster) -> None:
    bundle = build(mxc, spec, *resource_sets(mxc, spec, slurm_cluster, nodes=2))
    out = slurm_cluster.run("sbatch", "--test-only", str(bundle / "job.sbatch"), check=False)
    assert out.returncode == 0, out.stderr
    assert "to start at" in out.stderr and "on nodes node[1-2]" in out.stderr, out.stderr


def test_sbatch_rejects_too_many_nodes(mxc: Mxc, slurm_cluster: SlurmCluster) -> None:
    spec = next(p for p in RUNNABLE_SPECS if p.stem == "tiny")
    bundle = build(mxc, spec, *resource_sets(mxc, spec, slurm_cluster, nodes=3))
    out = slurm_cluster.run("sbatch", "--test-only", str(bundle / "job.sbatch"), check=False)
    assert out.returncode != 0
    assert "Requested node configuration is not available" in out.stderr, out.stderr


def test_dry_run_prints_the_exact_sbatch_command_and_script(mxc: Mxc, mxc_home: Path, slurm_cluster: SlurmCluster,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    spec = next(p for p in RUNNABLE_SPECS if p.stem == "tiny")
    bundle = build(mxc, spec, *resource_sets(mxc, spec, slurm_cluster, nodes=2))
    jobs_before = slurm_cluster.run("squeue", "-h", "-t", "all", "-o", "%A").stdout.split()
    text = mxc("run", bundle.name[:10], "--dry-run")
    assert text.returncode == 0, text.stderr
    script = (bundle / "job.sbatch").read_text()
    assert text.stdout.rstrip("\n").endswith(script.rstrip("\n"))  # the script, as submitted
    command = next(line for line in text.stdout.splitlines() if line.startswith("sbatch "))
    assert f"--export=ALL,MXC_BUNDLE_DIR={bundle}," in command and command.endswith(f"{bundle}/job.sbatch")
    plan = json.loads(mxc("run", bundle.name[:10], "--dry-run", "--json").stdout)
    argv = plan["command"]
    assert argv[:2] == ["sbatch", "--parsable"] and argv[-1] == str(bundle / "job.sbatch")
    assert f"--output={plan['run_dir']}/train.log" in argv and plan["script"] == script
    # Nothing was submitted or written; the very command is one sbatch accepts.
    assert slurm_cluster.run("squeue", "-h", "-t", "all", "-o", "%A").stdout.split() == jobs_before
    assert not (mxc_home / "runs").exists()
    accepted = slurm_cluster.run("sbatch", "--test-only", *argv[2:], check=False)
    assert accepted.returncode == 0 and "to start at" in accepted.stderr, accepted.stderr


def test_run_reports_sbatch_refusal_and_missing_sbatch(mxc: Mxc, mxc_home: Path, slurm_cluster: SlurmCluster,
                                                       monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    spec = next(p for p in RUNNABLE_SPECS if p.stem == "tiny")
    bundle = build(mxc, spec, *resource_sets(mxc, spec, slurm_cluster, nodes=2), "--set", "resources.partition=nosuch")
    refused = mxc("run", bundle.name[:10], "-y")
    assert refused.returncode == 2
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith("mxc: error: sbatch refused the job: ") and "Invalid partition name specified" in last
    assert not list((mxc_home / "runs").glob("*"))  # no half-made run left behind
    (tmp_path / "bin").mkdir()
    missing = mxc("run", bundle.name[:10], "-y", env={"PATH": str(tmp_path / "bin")})
    assert missing.returncode == 2
    assert "mxc: error: 'sbatch' is not on PATH" in missing.stderr and "mxc run --local" in missing.stderr
    assert not list((mxc_home / "runs").glob("*"))
