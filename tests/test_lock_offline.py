"""Digests offline (issue 29): `mxc lock` asks no registry when the spec already pins everything, and a
build that lacks a digest says how to get one.

"No registry reachable" is made real: the image names a loopback port nothing listens on (a
connection is refused at once) or a `.invalid` host (RFC 6761: never resolves); the shipped 70b spec
pins a digest that no registry holds, so any request for it would fail too.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from tests.conftest import REPO, Mxc, store_snapshot
from tests.registry_support import free_port

DIGEST = "sha256:" + "4e" * 32


def _project(tmp_path: Path, ref: str, digest: str | None) -> Path:
    root = tmp_path / "proj"
    (root / "specs").mkdir(parents=True)
    pin = f"  digest: {digest}\n" if digest else ""
    (root / "specs" / "job.yaml").write_text(
        "schema: mxc/v1\nname: job\n"
        f"image:\n  ref: {ref}\n{pin}"
        "code:\n  from_image: true\n  jaxlib_version: 0.12.0.1\n"
        "model:\n  model_name: default\n"
        "runtime:\n  backend: local\n  container: podman\n")
    return root


def test_lock_of_a_fully_pinned_spec_asks_no_registry(mxc: Mxc, tmp_path: Path) -> None:
    for ref in (f"127.0.0.1:{free_port()}/ml/job:v1", "registry.invalid/ml/job:v1"):
        root = _project(tmp_path / ref.split("/")[0].replace(":", "_"), ref, DIGEST)
        out = mxc("lock", "specs/job.yaml", cwd=root)
        assert out.returncode == 0, out.stderr
        assert f"image   {ref} -> {DIGEST} (pinned in the spec: no registry asked)" in out.stdout
        lock = json.loads((root / "lockfiles" / "job.lock.json").read_text())
        assert lock["image"] == {"ref": ref, "digest": DIGEST, "source": "spec"}
        assert mxc("lock", "--check", "specs/job.yaml", cwd=root).returncode == 0  # up to date, still offline
        built = mxc("build", "--locked", "specs/job.yaml", cwd=root)
        assert built.returncode == 0, built.stderr


def test_lock_of_the_shipped_70b_spec_works_offline(mxc: Mxc, tmp_path: Path) -> None:
    """specs/70b.yaml pins its image digest and code commit: `mxc lock` went to docker.io anyway."""
    lockfile = tmp_path / "70b.lock.json"
    out = mxc("lock", "specs/70b.yaml", "--lockfile", str(lockfile))
    assert out.returncode == 0, out.stderr
    lock = json.loads(lockfile.read_text())
    assert lock["image"]["source"] == "spec" and lock["code"]["commit"].startswith("0f3a6d1c")


def test_a_tag_without_a_digest_still_needs_the_registry(mxc: Mxc, tmp_path: Path) -> None:
    ref = f"127.0.0.1:{free_port()}/ml/job:v1"
    root = _project(tmp_path, ref, None)
    out = mxc("lock", "specs/job.yaml", cwd=root)
    assert out.returncode == 2 and "cannot reach registry" in out.stderr
    assert not (root / "lockfiles").exists()


def test_a_missing_digest_says_how_to_get_one(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    """`image.digest: required key is missing` offered no way out."""
    ref = "nvcr.io/nvidia/jax:26.03-maxtext-py3"
    root = _project(tmp_path, ref, None)
    out = mxc("build", "specs/job.yaml", cwd=root)
    assert out.returncode == 2
    first = out.stderr.splitlines()[0]
    assert first.startswith("specs/job.yaml:3: image.digest: required key is missing (pin it: mxc lock specs/job.yaml "
                            "&& mxc build --locked specs/job.yaml; ")
    assert f"skopeo inspect --format '{{{{.Digest}}}}' docker://{ref}" in first
    assert f"podman images --digests {ref}" in first
    assert store_snapshot(mxc_home) == []
    hostile = mxc("build", "specs/job.yaml", "--set", "image.ref=x$(id)", cwd=root)  # a ref is anyone's text
    assert f"skopeo inspect --format '{{{{.Digest}}}}' {shlex.quote('docker://x$(id)')}," in hostile.stderr


def test_the_shipped_lock_keeps_its_registry_resolution(mxc: Mxc) -> None:
    """A lock resolved at a registry is kept as it is when the spec pins the same digest (no churn)."""
    text = (REPO / "lockfiles" / "tiny.lock.json").read_text()
    assert mxc("lock", "--check", "specs/tiny.yaml").returncode == 0
    assert (REPO / "lockfiles" / "tiny.lock.json").read_text() == text
