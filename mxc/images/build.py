"""``mxc image build``: assemble a target's build context and build it with Podman or Apptainer.

The context is a temporary directory: the Containerfile and .def, ``requirements.txt`` (the
target's hashed lock), ``wheels/`` (exactly the files the lock names, downloaded once into a
cache and checked against their sha256 before use) and, for ``FROM scratch`` targets,
``rootfs.tar``. Nothing else is visible to the build, and nothing is fetched during it. A
registry base is resolved to a digest first and passed as ``BASE_IMAGE=REF@sha256:...``.
Podman builds with ``--timestamp 0`` so the same inputs can give the same layers.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mxc.errors import UserError
from mxc.images.recipes import BASE_ARG, Target, check_target
from mxc.lock.requirements import parse, sha256_file


@dataclass(frozen=True)
class Built:
    name: str
    builder: str
    tag: str
    digest: str
    base: str | None
    rootfs_sha256: str | None
    requirements_sha256: str
    pushed: str | None = None
    pushed_digest: str | None = None


def wheel_cache() -> Path:
    base = os.environ.get("MXC_WHEEL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "mxc", "wheels")
    return Path(base)


def fetch_wheels(requirements: Path, dest: Path, cache: Path | None = None) -> int:
    """Put the exact wheels ``requirements`` names into ``dest`` (hash-checked); returns how many."""
    cache = cache or wheel_cache()
    cache.mkdir(parents=True, exist_ok=True)
    reqs, problems = parse(requirements.read_text("utf-8"))
    if problems:
        raise UserError(f"{requirements}: not a hashed lock ({problems[0][1]})")
    have = {sha256_file(p): p for p in cache.glob("*.whl")}
    if not all(any(h in have for h in r.hashes) for r in reqs):
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--require-hashes",
               "--only-binary=:all:", "--no-deps", "-d", str(cache), "-r", str(requirements)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            errors = [ln for ln in proc.stderr.splitlines() if "ERROR" in ln or "THESE PACKAGES" in ln]
            raise UserError(f"pip download of {requirements.name} failed: {(errors or ['?'])[-1].strip()}")
        have = {sha256_file(p): p for p in cache.glob("*.whl")}
    dest.mkdir(parents=True, exist_ok=True)
    count = 0
    for req in reqs:
        match = next((have[h] for h in req.hashes if h in have), None)
        if match is None:
            raise UserError(f"no wheel of {req.name}=={req.version} with a pinned hash in {cache}")
        target = dest / match.name
        try:
            os.link(match, target)
        except OSError:
            shutil.copyfile(match, target)
        count += 1
    return count


def prepare_context(target: Target, context: Path) -> str | None:
    """Fill ``context`` for ``target``; returns the rootfs tar's sha256 (FROM scratch targets)."""
    from mxc.images.rootfs import build_rootfs

    shutil.copyfile(target.containerfile, context / "Containerfile")
    shutil.copyfile(target.definition, context / target.definition.name)
    shutil.copyfile(target.requirements, context / "requirements.txt")
    fetch_wheels(target.requirements, context / "wheels")
    if target.rootfs == "python":
        return build_rootfs(context / "rootfs.tar")
    return None


def resolve_base(target: Target, base: str | None, insecure: frozenset[str]) -> str | None:
    """``REF@sha256:...`` of the target's base image (None for FROM scratch)."""
    from mxc.lock.reference import parse_ref
    from mxc.lock.registry import resolve

    if target.rootfs is not None:
        if base:
            raise UserError(f"{target.name} is built FROM scratch; --base does not apply")
        return None
    text = base or target.base or ""
    ref = parse_ref(text)
    if ref.digest:
        return text  # already pinned; podman and apptainer verify the digest when they pull
    return f"{text}@{resolve(ref, insecure=insecure).digest}"


def _run(cmd: list[str], what: str, cwd: Path | None = None, timeout: float = 3600) -> str:
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise UserError(f"{cmd[0]} is not installed here", f"{what} needs it") from None
    except subprocess.TimeoutExpired:
        raise UserError(f"{what} took longer than {timeout:.0f}s") from None
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        last = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or ["?"])[-1]
        raise UserError(f"{what} failed (exit {proc.returncode}): {last.strip()[:300]}")
    return proc.stdout


def podman_build(target: Target, context: Path, tag: str, base: str | None) -> str:
    cmd = ["podman", "build", "--timestamp", "0", "--tag", tag, "--file", str(context / "Containerfile")]
    if base:
        cmd += ["--build-arg", f"{BASE_ARG}={base}"]
    _run([*cmd, str(context)], f"podman build of {target.name}", timeout=3600)
    digest = _run(["podman", "image", "inspect", "--format", "{{.Digest}}", tag], "podman image inspect").strip()
    if not digest.startswith("sha256:"):
        raise UserError(f"podman reported no digest for {tag}")
    return digest


def podman_push(tag: str, dest: str, insecure: bool) -> str:
    """Push to ``dest`` (REGISTRY/NAME:TAG); returns the manifest digest the registry stored."""
    with tempfile.TemporaryDirectory(prefix="mxc-push-") as tmp:
        digestfile = Path(tmp) / "digest"
        cmd = ["podman", "push", "--quiet", "--digestfile", str(digestfile)]
        if insecure:
            cmd.append("--tls-verify=false")
        _run([*cmd, tag, f"docker://{dest}"], f"podman push to {dest}", timeout=3600)
        return digestfile.read_text().strip()


def apptainer_build(target: Target, context: Path, out: Path, base: str | None) -> str:
    cmd = ["apptainer", "build", "--force"]
    if base:
        cmd += ["--build-arg", f"{BASE_ARG}={base}"]
    _run([*cmd, str(out.resolve()), target.definition.name], f"apptainer build of {target.name}", cwd=context)
    return "sha256:" + sha256_file(out)


def build_image(target: Target, *, builder: str = "podman", tag: str | None = None, base: str | None = None,
                output: Path | None = None, push: str | None = None,
                insecure: frozenset[str] = frozenset()) -> Built:
    problems = check_target(target)
    if problems:
        for problem in problems:
            print(f"mxc: {problem}", file=sys.stderr)
        raise UserError(f"{target.directory}: {len(problems)} problem(s); not building", "mxc image check shows them")
    pinned_base = resolve_base(target, base, insecure)
    tag = tag or f"localhost/mxc/{target.name}:latest"
    with tempfile.TemporaryDirectory(prefix=f"mxc-image-{target.name}-") as tmp:
        context = Path(tmp)
        rootfs = prepare_context(target, context)
        if builder == "podman":
            digest = podman_build(target, context, tag, pinned_base)
        else:
            out = output or Path(f"{target.name}.sif")
            digest = apptainer_build(target, context, out, pinned_base)
            tag = str(out)
    pushed_digest = None
    if push:
        from mxc.lock.reference import parse_ref

        if builder != "podman":
            raise UserError("--push works with the podman builder (push a .sif with `apptainer push`)")
        ref = parse_ref(push)
        pushed_digest = podman_push(tag, push, ref.is_loopback or ref.registry in insecure)
    req_sha = hashlib.sha256(target.requirements.read_bytes()).hexdigest()
    return Built(target.name, builder, tag, digest, pinned_base, rootfs, req_sha, push, pushed_digest)
