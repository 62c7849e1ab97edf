"""Lockfiles: `mxc lock` against a real registry and git repository, `mxc build --locked` refusals."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mxc.errors import UserError
from mxc.lock.reference import parse_ref
from mxc.lock.registry import DOCKER_MANIFEST, OCI_INDEX, OCI_MANIFEST, resolve
from mxc.lock.requirements import parse, pin, sha256_file
from tests.conftest import REPO, Mxc, store_snapshot
from tests.registry_support import TokenIssuer, free_port, manifest_digest, push, registry, token_registry

__all__ = ["registry", "token_registry"]  # the fixtures, imported for the tests below

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_SYSTEM": "/dev/null"}


def git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                         env={**os.environ, **GIT_ENV})
    return out.stdout.strip()


def code_repo(path: Path) -> Path:
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    (path / "train.py").write_text("print('v1')\n")
    git(path, "add", ".")
    git(path, "commit", "-q", "-m", "v1")
    git(path, "tag", "-a", "v1", "-m", "release v1")
    return path


def project(tmp: Path, image_ref: str, repo: Path, container: str = "podman") -> Path:
    """A project checkout: specs/job.yaml (image by tag, code by branch) and lockfiles/ with the train lock."""
    root = tmp / "proj"
    (root / "specs").mkdir(parents=True)
    (root / "lockfiles").mkdir()
    shutil.copyfile(REPO / "lockfiles" / "requirements-train.txt", root / "lockfiles" / "requirements-train.txt")
    (root / "specs" / "job.yaml").write_text(
        "schema: mxc/v1\n"
        "name: job\n"
        "image:\n"
        f"  ref: {image_ref}\n"
        "code:\n"
        f"  repo: {repo}\n"
        "  ref: main\n"
        "model:\n"
        "  model_name: default\n"
        "  overrides:\n"
        "    steps: 2\n"
        "runtime:\n"
        "  backend: local\n"
        f"  container: {container}\n"
    )
    return root


def lock_json(root: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((root / "lockfiles" / "job.lock.json").read_text())
    return data


def last_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


# ---- the registry API ----------------------------------------------------------------------


def test_resolves_oci_docker_and_index_manifests_to_verified_digests(registry: str, tmp_path: Path) -> None:
    cases = {"oci": OCI_MANIFEST, "docker": DOCKER_MANIFEST, "index": OCI_INDEX}
    seen = set()
    for kind, media_type in cases.items():
        push(registry, "ml/kinds", kind, {"hello.txt": kind.encode()}, tmp_path, kind=kind)
        got = resolve(parse_ref(f"{registry}/ml/kinds:{kind}"))
        expected, served_type = manifest_digest(registry, "ml/kinds", kind, media_type)
        assert (got.digest, got.media_type) == (expected, media_type) == (expected, served_type), kind
        seen.add(got.digest)
        # By digest: the same manifest, verified against the digest asked for.
        again = resolve(parse_ref(f"{registry}/ml/kinds@{got.digest}"))
        assert again.digest == got.digest and again.media_type == media_type
    assert len(seen) == 3
    with pytest.raises(UserError, match=r"answered 404 .*MANIFEST_UNKNOWN.*is the tag pushed"):
        resolve(parse_ref(f"{registry}/ml/kinds:nope"))
    with pytest.raises(UserError, match="answered 404"):
        resolve(parse_ref(f"{registry}/ml/kinds@sha256:{'0' * 64}"))
    with pytest.raises(UserError, match="cannot reach registry"):
        resolve(parse_ref(f"127.0.0.1:{free_port()}/ml/kinds:oci"))


def test_bearer_token_challenge_is_answered(token_registry: tuple[str, TokenIssuer], tmp_path: Path) -> None:
    """A registry with token auth (like Docker Hub): 401 + WWW-Authenticate, then an anonymous token."""
    import requests

    address, issuer = token_registry
    push(address, "ml/auth", "v1", {"a": b"token"}, tmp_path)
    challenge = requests.get(f"http://{address}/v2/ml/auth/manifests/v1", timeout=10)
    assert challenge.status_code == 401 and challenge.headers["WWW-Authenticate"].startswith("Bearer realm=")
    before = issuer.issued
    got = resolve(parse_ref(f"{address}/ml/auth:v1"))
    assert issuer.issued == before + 1
    token = issuer.token(["repository:ml/auth:pull"])
    expected = requests.get(f"http://{address}/v2/ml/auth/manifests/v1", timeout=10,
                            headers={"Accept": OCI_MANIFEST, "Authorization": f"Bearer {token}"})
    assert got.digest == "sha256:" + hashlib.sha256(expected.content).hexdigest()


def test_reference_parsing() -> None:
    hub = parse_ref("docker.io/rocm/jax-training:maxtext-v25.9")
    assert (hub.registry, hub.api_host, hub.name, hub.tag) == ("docker.io", "registry-1.docker.io", "rocm/jax-training",
                                                               "maxtext-v25.9")
    assert parse_ref("ubuntu").name == "library/ubuntu" and parse_ref("ubuntu").tag == "latest"
    local = parse_ref("127.0.0.1:5000/ml/tiny@sha256:" + "a" * 64)
    assert (local.registry, local.name, local.tag, local.is_loopback) == ("127.0.0.1:5000", "ml/tiny", None, True)
    assert parse_ref("ghcr.io/nvidia/jax:maxtext").is_loopback is False
    for bad in ("Docker.io/UPPER/case:x", "host:5000/ml/x@sha256:short", "oras://x/y:z"):
        with pytest.raises(UserError):
            parse_ref(bad)


# ---- mxc lock / mxc build --locked, end to end -------------------------------------------------


def test_tag_or_branch_moved_changes_the_lock_and_the_bundle_hash(registry: str, tmp_path: Path, mxc: Mxc,
                                                                  mxc_home: Path) -> None:
    repo = code_repo(tmp_path / "code")
    push(registry, "ml/job", "v1", {"model.txt": b"first"}, tmp_path, kind="oci")
    first_digest, _ = manifest_digest(registry, "ml/job", "v1", OCI_MANIFEST)
    root = project(tmp_path, f"{registry}/ml/job:v1", repo)
    spec = "specs/job.yaml"

    # Unlocked, the spec is not pinned: a plain build refuses it.
    plain = mxc("build", spec, cwd=root)
    assert plain.returncode == 2 and "image.digest" in plain.stderr and "code.commit" in plain.stderr

    locked = mxc("lock", spec, "--json", cwd=root)
    assert locked.returncode == 0, locked.stderr
    report = json.loads(locked.stdout)
    assert report["changed"] and report["lockfile"] == "lockfiles/job.lock.json"
    lock = lock_json(root)
    assert lock["image"] == {"ref": f"{registry}/ml/job:v1", "digest": first_digest, "media_type": OCI_MANIFEST,
                             "source": "registry"}
    assert lock["code"] == {"repo": str(repo), "ref": "main", "commit": git(repo, "rev-parse", "HEAD")}
    assert lock["spec"] == "specs/job.yaml" and lock["format"] == "mxc-lock/v1"
    assert lock["python"]["requirements"] == "lockfiles/requirements-train.txt"  # type: ignore[index]
    assert lock["python"]["sha256"] == sha256_file(root / "lockfiles" / "requirements-train.txt")  # type: ignore[index]
    text = (root / "lockfiles" / "job.lock.json").read_text()
    assert text == json.dumps(lock, indent=2, sort_keys=True) + "\n"  # canonical: sorted keys, stable diff

    first = last_line(mxc("build", "--locked", spec, cwd=root))
    assert first == report["bundle"]
    bundle = mxc_home / "bundles" / first
    assert json.loads((bundle / "spec.json").read_text())["image"]["digest"] == first_digest
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["files"]["lock.json"] == hashlib.sha256(text.encode()).hexdigest()
    assert mxc("verify", first).returncode == 0

    # Re-locking an unchanged world changes nothing; --check agrees.
    assert mxc("lock", spec, cwd=root).returncode == 0 and (root / "lockfiles" / "job.lock.json").read_text() == text
    assert mxc("lock", "--check", spec, cwd=root).returncode == 0

    # The tag moves to a new image: --check notices, lock follows, the bundle hash changes.
    push(registry, "ml/job", "v1", {"model.txt": b"second"}, tmp_path, kind="docker")
    second_digest, _ = manifest_digest(registry, "ml/job", "v1", DOCKER_MANIFEST)
    assert second_digest != first_digest
    stale = mxc("lock", "--check", spec, cwd=root)
    assert stale.returncode == 1 and f"(was {first_digest})" in stale.stdout and "out of date" in stale.stdout
    assert (root / "lockfiles" / "job.lock.json").read_text() == text  # --check writes nothing
    # Until re-locked, --locked builds the old pin, exactly.
    assert last_line(mxc("build", "--locked", spec, cwd=root)) == first
    relock = mxc("lock", spec, cwd=root)
    assert relock.returncode == 0 and f"-> {second_digest} (was {first_digest})" in relock.stdout
    assert lock_json(root)["image"]["media_type"] == DOCKER_MANIFEST  # type: ignore[index]
    second = last_line(mxc("build", "--locked", spec, cwd=root))
    assert second != first

    # The branch moves: a new commit is locked, and the hash changes again.
    (repo / "train.py").write_text("print('v2')\n")
    git(repo, "commit", "-qam", "v2")
    assert mxc("lock", spec, cwd=root).returncode == 0
    assert lock_json(root)["code"]["commit"] == git(repo, "rev-parse", "HEAD")  # type: ignore[index]
    third = last_line(mxc("build", "--locked", spec, cwd=root))
    assert third not in (first, second)

    # An annotated tag resolves to its commit, not the tag object.
    spec_path = root / spec
    spec_path.write_text(spec_path.read_text().replace("ref: main", "ref: v1"))
    assert mxc("lock", spec, cwd=root).returncode == 0
    assert lock_json(root)["code"]["commit"] == git(repo, "rev-parse", "v1^{commit}")  # type: ignore[index]


def test_locked_refuses_each_unpinned_or_mismatching_item(registry: str, tmp_path: Path, mxc: Mxc,
                                                          mxc_home: Path) -> None:
    repo = code_repo(tmp_path / "code")
    push(registry, "ml/refuse", "v1", {"a": b"1"}, tmp_path)
    root = project(tmp_path, f"{registry}/ml/refuse:v1", repo)
    spec = "specs/job.yaml"

    missing = mxc("build", "--locked", spec, cwd=root)
    assert missing.returncode == 2
    assert missing.stderr.strip() == ("mxc: error: --locked: no lockfile lockfiles/job.lock.json for specs/job.yaml "
                                      "(create it: mxc lock specs/job.yaml)")
    assert mxc("lock", spec, cwd=root).returncode == 0
    assert mxc("build", "--locked", spec, cwd=root).returncode == 0
    snapshot = store_snapshot(mxc_home)

    # Edit the spec after locking (a different digest and commit), the requirements, and the lock itself.
    spec_path, lock_path = root / spec, root / "lockfiles" / "job.lock.json"
    spec_path.write_text(spec_path.read_text().replace("  ref: main\n", f"  ref: main\n  commit: {'b' * 40}\n")
                         .replace("image:\n", f"image:\n  digest: sha256:{'c' * 64}\n"))
    reqs = root / "lockfiles" / "requirements-train.txt"
    reqs.write_text(reqs.read_text() + "numpy>=2\n")
    lock = json.loads(lock_path.read_text())
    lock["mxc_version"] = "0.0.1"
    lock_path.write_text(json.dumps(lock))
    result = mxc("build", "--locked", spec, cwd=root)
    assert result.returncode == 2, result.stdout
    lines = result.stderr.strip().splitlines()
    problems, summary = lines[:-1], lines[-1]
    assert summary.startswith("mxc: 5 problems") and "nothing was written" in summary
    n_reqs = len(reqs.read_text().splitlines())
    expected = [
        "lockfiles/job.lock.json: mxc_version: locked with mxc 0.0.1",
        "lockfiles/job.lock.json: python.sha256: lockfiles/requirements-train.txt changed since it was locked",
        f"lockfiles/requirements-train.txt:{n_reqs}: python: 'numpy>=2' is not pinned with ==version",
        f"specs/job.yaml:4: image.digest: sha256:{'c' * 64} disagrees with lockfiles/job.lock.json, which pins sha256:",
        f"specs/job.yaml:9: code.commit: {'b' * 40} disagrees with lockfiles/job.lock.json, which pins",
    ]
    for want in expected:
        assert sum(p.startswith(want) for p in problems) == 1, (want, problems)
    assert store_snapshot(mxc_home) == snapshot
    assert "Traceback" not in result.stderr

    # A lock that is itself unpinned or malformed is refused before anything else.
    del lock["code"]["commit"]
    lock_path.write_text(json.dumps(lock))
    broken = mxc("build", "--locked", spec, cwd=root)
    assert broken.returncode == 2
    assert "lockfiles/job.lock.json: code: code.commit: a locked repository needs its commit" in broken.stderr
    lock_path.write_text("{not json")
    assert "lockfiles/job.lock.json:1: not valid JSON" in mxc("build", "--locked", spec, cwd=root).stderr


def test_lock_reports_unreachable_registry_unknown_tag_and_branch_in_one_line(registry: str, tmp_path: Path,
                                                                               mxc: Mxc) -> None:
    repo = code_repo(tmp_path / "code")
    push(registry, "ml/err", "v1", {"a": b"1"}, tmp_path)
    cases = {
        f"127.0.0.1:{free_port()}/ml/err:v1": "cannot reach registry",
        f"{registry}/ml/err:v9": "answered 404",
    }
    for ref, message in cases.items():
        root = project(tmp_path / ref.replace("/", "_").replace(":", "_"), ref, repo)
        result = mxc("lock", "specs/job.yaml", cwd=root)
        assert result.returncode == 2 and message in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("mxc: error: ")
        assert not (root / "lockfiles" / "job.lock.json").exists()
    root = project(tmp_path / "branch", f"{registry}/ml/err:v1", repo)
    spec_path = root / "specs" / "job.yaml"
    spec_path.write_text(spec_path.read_text().replace("ref: main", "ref: no-such-branch"))
    result = mxc("lock", "specs/job.yaml", cwd=root)
    assert result.returncode == 2
    assert result.stderr.strip() == (f"mxc: error: code.ref 'no-such-branch' is not a branch or tag of {repo} "
                                     "(branches: main)")


def test_sif_images_are_pinned_by_file_hash(tmp_path: Path, mxc: Mxc) -> None:
    repo = code_repo(tmp_path / "code")
    sif = tmp_path / "images" / "maxtext.sif"
    sif.parent.mkdir()
    sif.write_bytes(b"SIF image bytes v1")
    root = project(tmp_path, str(sif), repo, container="apptainer")
    assert mxc("lock", "specs/job.yaml", cwd=root).returncode == 0
    image = lock_json(root)["image"]
    assert image == {"ref": str(sif), "digest": "sha256:" + hashlib.sha256(b"SIF image bytes v1").hexdigest(),
                     "media_type": "application/x-apptainer-sif", "source": "file"}
    first = last_line(mxc("build", "--locked", "specs/job.yaml", cwd=root))
    sif.write_bytes(b"SIF image bytes v2")
    assert mxc("lock", "--check", "specs/job.yaml", cwd=root).returncode == 1
    assert mxc("lock", "specs/job.yaml", cwd=root).returncode == 0
    assert lock_json(root)["image"]["digest"] == "sha256:" + hashlib.sha256(b"SIF image bytes v2").hexdigest()  # type: ignore[index]
    assert last_line(mxc("build", "--locked", "specs/job.yaml", cwd=root)) != first
    sif.unlink()
    gone = mxc("lock", "specs/job.yaml", cwd=root)
    assert gone.returncode == 2 and "no such .sif file" in gone.stderr


# ---- the shipped locks -------------------------------------------------------------------------


def test_shipped_requirements_are_complete_hashed_locks_of_their_inputs() -> None:
    # The run-environment locks (what specs' lock.json hash); the set-up locks: tests/test_setup_lock.py.
    for txt in sorted((REPO / "lockfiles").glob("requirements-*.txt")):
        if txt.stem.removeprefix("requirements-") in ("mxc", "dev", "bootstrap"):
            continue
        reqs, problems = parse(txt.read_text())
        assert problems == [], txt
        assert len(reqs) > 100 and all(len(h) == 64 for r in reqs for h in r.hashes)
        pinned = {r.name: r.version for r in reqs}
        source = txt.with_suffix(".in")
        lines = [ln for ln in source.read_text().splitlines() if ln and not ln.startswith(("#", "-r"))]
        for line in lines:
            name, version = line.split("==")
            assert pinned.get(name) == version, (txt.name, name)
    train = {r.name for r in parse((REPO / "lockfiles" / "requirements-train.txt").read_text())[0]}
    assert {"jax-cuda12-plugin", "jax-cuda12-pjrt"} < {r.name for r in parse(
        (REPO / "lockfiles" / "requirements-cuda.txt").read_text())[0]}
    assert "jax-rocm7-plugin" in {r.name for r in parse((REPO / "lockfiles" / "requirements-rocm.txt").read_text())[0]}
    assert not any("cuda" in n or "rocm" in n for n in train)


def test_requirement_parser_names_every_unpinned_line() -> None:
    text = ("# comment\nsix==1.17.0 \\\n    --hash=sha256:" + "a" * 64 + "\n"
            "numpy>=2\nrequests==2.0\n-e git+https://x/y\nsix==1.16 --hash=sha256:" + "b" * 64 + "\n")
    reqs, problems = parse(text)
    assert [(r.name, r.version, r.line) for r in reqs] == [("six", "1.17.0", 2)]
    assert problems == [
        (4, "'numpy>=2' is not pinned with ==version"),
        (5, "requests==2.0 has no --hash=sha256:..."),
        (6, "option '-e' is not allowed in a hashed lock (every package must be listed here, pinned)"),
        (7, "six is listed twice (first on line 2)"),
    ]


def test_pin_asks_pips_resolver_for_exact_files_and_hashes(tmp_path: Path) -> None:
    source = tmp_path / "requirements-small.in"
    source.write_text("six==1.17.0\n")
    text = pin(source)
    reqs, problems = parse(text)
    assert problems == [] and [(r.name, r.version) for r in reqs] == [("six", "1.17.0")]
    # The hash is the real file's: pip download --require-hashes accepts it.
    wheels = tmp_path / "wheels"
    (tmp_path / "requirements-small.txt").write_text(text)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet",
                    "--require-hashes", "--no-deps", "--only-binary=:all:", "-d", str(wheels), "-r",
                    str(tmp_path / "requirements-small.txt")], check=True, capture_output=True, timeout=300)
    (wheel,) = wheels.glob("six-1.17.0-*.whl")
    assert sha256_file(wheel) in reqs[0].hashes


def test_shipped_tiny_lock_is_current_and_joins_the_bundle(mxc: Mxc, mxc_home: Path) -> None:
    check = mxc("lock", "--check", "specs/tiny.yaml")
    assert check.returncode == 0, check.stdout + check.stderr
    plain = last_line(mxc("build", "specs/tiny.yaml"))
    locked = last_line(mxc("build", "--locked", "specs/tiny.yaml"))
    assert plain != locked
    files = json.loads((mxc_home / "bundles" / locked / "manifest.json").read_text())["files"]
    assert "lock.json" in files and "lock.json" not in json.loads(
        (mxc_home / "bundles" / plain / "manifest.json").read_text())["files"]
    lock = json.loads((mxc_home / "bundles" / locked / "lock.json").read_text())
    assert lock["python"]["packages"]["maxtext"] == "0.2.5" == lock["code"]["maxtext_version"]
    # A spec pin that disagrees with the requirements is refused (maxtext 0.2.4 is not what the lock installs).
    wrong = mxc("build", "--locked", "specs/tiny.yaml", "--set", "code.maxtext_version=0.2.4")
    assert wrong.returncode == 2 and "code.maxtext_version: 0.2.4 disagrees with" in wrong.stderr
