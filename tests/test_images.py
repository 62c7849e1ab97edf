"""images/: spython checks and round-trips of every target, and a real Podman build of the CPU image."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mxc.images.recipes import check_target, load_target, parse_containerfile, parse_definition, pip_installs
from mxc.lock.requirements import canonical_name, parse
from tests.conftest import REPO, Mxc
from tests.registry_support import registry

__all__ = ["registry"]  # the fixture, imported for the tests below

TARGETS = sorted(p for p in (REPO / "images").iterdir() if (p / "image.toml").is_file())
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""
# The tiny MaxText model of specs/tiny.yaml, 5 steps, written as per-step JSON to argv[1]/m.jsonl.
TRAIN = """
import os, runpy, sys, maxtext
out = sys.argv[1]
base = os.path.join(os.path.dirname(maxtext.__file__), "configs", "base.yml")
sys.argv = ["train", base, "run_name=r", "base_output_directory=" + out, "dataset_type=synthetic",
            "skip_jax_distributed_system=true", "enable_checkpointing=false", "jax_cache_dir=",
            "base_emb_dim=64", "base_num_query_heads=2", "base_num_kv_heads=2", "base_mlp_dim=128",
            "base_num_decoder_layers=2", "head_dim=32", "vocab_size=256", "max_target_length=64",
            "per_device_batch_size=1", "steps=5", "metrics_file=" + out + "/m.jsonl"]
runpy.run_module("maxtext.trainers.pre_train.train", run_name="__main__")
"""


def test_three_targets_exist_with_a_containerfile_and_a_def() -> None:
    assert [t.name for t in TARGETS] == ["maxtext-cpu", "maxtext-cuda", "maxtext-rocm"]
    for directory in TARGETS:
        target = load_target(directory)
        assert target.containerfile.is_file() and target.definition.is_file()


@pytest.mark.parametrize("directory", TARGETS, ids=lambda p: p.name)
def test_every_target_is_pinned_and_its_two_recipes_agree(directory: Path) -> None:
    target = load_target(directory)
    assert check_target(target) == []
    cf, df = parse_containerfile(target.containerfile), parse_definition(target.definition)
    assert cf.environ == df.environ and cf.environ["JAX_PLATFORMS"] == directory.name.removeprefix("maxtext-")
    (install,) = pip_installs(cf)
    assert "--require-hashes" in install.split() and install.endswith("-r /opt/mxc/requirements.txt")
    assert pip_installs(df) == [install]
    # Nothing is installed when the container runs: the runscript only starts Python.
    assert df.runscript == ['exec python3 "$@"'] and cf.runscript == ["python3"]


def test_mxc_image_check_passes_and_names_what_breaks(tmp_path: Path, mxc: Mxc) -> None:
    ok = mxc("image", "check", *[str(t) for t in TARGETS])
    assert ok.returncode == 0 and ok.stdout.count(": ok") == 3, ok.stdout + ok.stderr
    shutil.copytree(REPO / "images" / "maxtext-rocm", tmp_path / "images" / "maxtext-rocm")
    shutil.copytree(REPO / "lockfiles", tmp_path / "lockfiles")
    target = tmp_path / "images" / "maxtext-rocm"
    cf, df = target / "Containerfile", target / "maxtext-rocm.def"
    cf.write_text(cf.read_text().replace("FROM ${BASE_IMAGE}", "FROM docker.io/rocm/dev-ubuntu-24.04:7.0-complete")
                  .replace("--require-hashes ", ""))
    df.write_text(df.read_text().replace("JAX_PLATFORMS=rocm", "JAX_PLATFORMS=cpu")
                  .replace('exec python3 "$@"', 'pip install -U jax && exec python3 "$@"')
                  .replace("--root-user-action=ignore -r", "--root-user-action=ignore numpy -r"))
    reqs = tmp_path / "lockfiles" / "requirements-rocm.txt"
    reqs.write_text(reqs.read_text() + "einops\n")
    bad = mxc("image", "check", str(target))
    assert bad.returncode == 1
    for message in ("base image 'docker.io/rocm/dev-ubuntu-24.04:7.0-complete' is not pinned",
                    "lacks --require-hashes", "the runscript installs packages at run time",
                    "must install only -r /opt/mxc/requirements.txt",
                    "Containerfile and .def set different environments: JAX_PLATFORMS",
                    "Containerfile and .def install differently",
                    "requirements-rocm.txt:" + str(len(reqs.read_text().splitlines())) + ": 'einops' is not pinned"):
        assert message in bad.stdout, (message, bad.stdout)
    # The build refuses such a target before doing anything.
    refused = mxc("image", "build", str(target))
    assert refused.returncode == 2 and "not building" in refused.stderr


@pytest.mark.parametrize("directory", TARGETS, ids=lambda p: p.name)
def test_def_round_trips_through_spython(directory: Path, tmp_path: Path) -> None:
    """def -> spython recipe -> SingularityWriter -> def -> recipe keeps what both sides model.

    spython 0.3.14's writer always writes ``Bootstrap: docker`` and drops ``%setup``, and its
    parser returns files/labels as strings one way and pairs the other (the normalisation here).
    """
    from spython.main.parse.writers import SingularityWriter  # type: ignore[import-untyped]

    from mxc.images.recipes import _def_parser

    target = load_target(directory)
    parser = _def_parser()(str(target.definition))
    (stage,) = parser.recipe.values()
    stage.files = [f.split(None, 1) if isinstance(f, str) else f for f in stage.files]
    stage.labels = [label.split(None, 1) if isinstance(label, str) else label for label in stage.labels]
    if isinstance(stage.cmd, str) and stage.entrypoint is None:  # the %runscript body lands in .cmd
        stage.entrypoint, stage.cmd = stage.cmd, None
    written = SingularityWriter({"main": stage}).convert()
    out = tmp_path / "roundtrip.def"
    out.write_text(written + "\n")
    again = parse_definition(out)
    first = parse_definition(target.definition)
    assert again.base == first.base
    assert again.files == first.files and again.labels == first.labels
    assert again.environ == first.environ and again.install == first.install
    assert pip_installs(again) == pip_installs(first)
    assert again.runscript == ['exec python3 "$@"']


# ---- real Podman builds --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def podman_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Podman with the settings this machine needs and a private image store, removed afterwards."""
    for tool in ("podman", "runc"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            pytest.fail(f"{tool} is missing: scripts/setup.sh --test installs it")
    root = tmp_path_factory.mktemp("podman")
    (root / "containers.conf").write_text(CONTAINERS_CONF)
    (root / "storage.conf").write_text(
        f'[storage]\ndriver = "overlay"\ngraphroot = "{root}/graph"\nrunroot = "{root}/run"\n')
    env = {"CONTAINERS_CONF": str(root / "containers.conf"), "CONTAINERS_STORAGE_CONF": str(root / "storage.conf")}
    try:
        yield env
    finally:
        subprocess.run(["podman", "rmi", "--all", "--force"], env={**os.environ, **env}, capture_output=True,
                       timeout=300)
        mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
        for mount in sorted((m for m in mounts if m.startswith(str(root))), reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def podman(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=timeout)


def losses(path: Path) -> list[float]:
    return [json.loads(line)["learning/loss"] for line in path.read_text().splitlines()]


@pytest.mark.training
def test_cpu_image_builds_with_podman_and_trains_like_the_host(podman_env: dict[str, str], mxc: Mxc,
                                                               mxc_home: Path, tmp_path: Path) -> None:
    tag = "localhost/mxc-test/maxtext-cpu:test"
    result = mxc("image", "build", "images/maxtext-cpu", "--tag", tag, "--json", env=podman_env, timeout=1500)
    assert result.returncode == 0, result.stderr[-3000:]
    built = json.loads(result.stdout)
    digest = built["digest"]
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest) and built["tag"] == tag
    assert built["rootfs_sha256"].startswith("sha256:") and built["base"] is None
    assert json.loads((mxc_home / "images" / "maxtext-cpu.json").read_text()) == built  # the digest, recorded
    by_digest = f"localhost/mxc-test/maxtext-cpu@{digest}"
    assert podman(podman_env, "image", "exists", by_digest).returncode == 0  # what a bundle's entrypoint asks for

    # The image's Python environment is exactly the lock: every pinned package at its version, nothing else.
    listing = podman(podman_env, "run", "--rm", "--network=none", by_digest, "python3", "-c",
                     "import importlib.metadata as m, json; "
                     "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))")
    assert listing.returncode == 0, listing.stderr
    installed = {canonical_name(k): v for k, v in json.loads(listing.stdout).items()}
    pinned = {r.name: r.version for r in parse((REPO / "lockfiles" / "requirements-train.txt").read_text())[0]}
    assert {k: v for k, v in installed.items() if k != "pip"} == pinned

    # A tiny training inside the image, offline, gives the host's losses bit for bit.
    inside = tmp_path / "inside"
    inside.mkdir()
    run = podman(podman_env, "run", "--rm", "--network=none", "--volume", f"{inside}:/out", by_digest,
                 "python3", "-c", TRAIN, "/out", timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    outside = tmp_path / "outside"
    host = subprocess.run([sys.executable, "-c", TRAIN, str(outside)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert host.returncode == 0, host.stderr[-3000:]
    assert len(losses(inside / "m.jsonl")) == 5
    assert losses(inside / "m.jsonl") == losses(outside / "m.jsonl")


def test_image_build_push_then_lock_pins_the_pushed_digest(podman_env: dict[str, str], registry: str, mxc: Mxc,
                                                           tmp_path: Path) -> None:
    """A small FROM-scratch target (Python + one pinned package), pushed to a registry and locked."""
    from tests.test_lock import code_repo, project

    target = tmp_path / "images" / "mini"
    target.mkdir(parents=True)
    six = next(r for r in parse((REPO / "lockfiles" / "requirements-train.txt").read_text())[0] if r.name == "six")
    (tmp_path / "requirements-mini.txt").write_text(f"six=={six.version} --hash=sha256:{six.hashes[0]}\n")
    source = REPO / "images" / "maxtext-cpu"
    (target / "Containerfile").write_text((source / "Containerfile").read_text().replace("maxtext-cpu", "mini"))
    (target / "mini.def").write_text((source / "maxtext-cpu.def").read_text().replace("maxtext-cpu", "mini"))
    (target / "image.toml").write_text('name = "mini"\nrequirements = "../../requirements-mini.txt"\nrootfs = "python"\n')
    dest = f"{registry}/ml/mini:v1"
    built = mxc("image", "build", str(target), "--tag", "localhost/mxc-test/mini:v1", "--push", dest,
                env=podman_env, timeout=900)
    assert built.returncode == 0, built.stderr[-3000:]
    pushed = built.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", pushed) and f"pushed  {dest}@{pushed}" in built.stderr
    ran = podman(podman_env, "run", "--rm", "--network=none", "localhost/mxc-test/mini:v1", "python3", "-c",
                 "import six, sys; print(six.__version__, sys.version_info[:2])")
    assert ran.stdout.strip() == f"{six.version} (3, 12)", ran.stderr

    root = project(tmp_path, dest, code_repo(tmp_path / "code"))
    locked = mxc("lock", "specs/job.yaml", "--json", cwd=root)
    assert locked.returncode == 0, locked.stderr
    assert json.loads(locked.stdout)["lock"]["image"]["digest"] == pushed
