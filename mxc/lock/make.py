"""``mxc lock``: resolve what a spec leaves open and write it down.

Image tag -> manifest digest at the registry (a ``.sif`` file -> sha256 of the file), code
branch -> commit, and the run environment's hashed requirements -> their file's sha256. A
pin the spec already writes is kept (and checked: a registry digest must exist there, a
``.sif`` must hash to it). The lock is validated by compiling the spec with it before a byte
is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from mxc import __version__
from mxc.compiler import Bundle, compile_spec
from mxc.compiler.lockfile import LOCK_FORMAT, Lock, LockedCode, LockedImage, LockedPython, lock_document
from mxc.compiler.resolve import ReadRefused, resolve
from mxc.errors import UserError
from mxc.lock.paths import LOCK_DIR, lock_path, project_root, relative, shown
from mxc.lock.requirements import describe, parse, sha256_file
from mxc.specfiles import SpecFiles

SIF_MEDIA_TYPE = "application/x-apptainer-sif"
# The requirements of the run environment per target: the same files the images/ install.
TARGET_REQUIREMENTS = {"cpu": "requirements-train.txt", "amd": "requirements-rocm.txt", "nvidia": "requirements-cuda.txt"}


@dataclass(frozen=True)
class Locked:
    lock: Lock
    text: str
    path: Path
    bundle: Bundle


def lock_image(image: dict[str, Any], insecure: frozenset[str], previous: LockedImage | None = None) -> LockedImage:
    """The image's digest: a ``.sif`` file hashed here, a digest the spec pins taken as written (no
    registry is asked: ``mxc lock`` of a fully pinned spec works offline; the pull verifies the
    digest), else the tag resolved at its registry."""
    from mxc.lock.reference import is_sif, parse_ref

    ref = str(image.get("ref", ""))
    if not ref:
        raise UserError("image.ref is empty; nothing to lock")
    if is_sif(ref):
        path = Path(ref)
        if not path.is_file():
            raise UserError(f"image.ref {ref}: no such .sif file here", "lock where the image file is (or copy it)")
        digest = "sha256:" + sha256_file(path)
        if image.get("digest") not in (None, digest):
            raise UserError(f"image.ref {ref}: the file hashes to {digest}, but the spec pins {image.get('digest')}",
                            "remove image.digest from the spec to let the lock pin the file, or restore the file")
        return LockedImage(ref=ref, digest=digest, media_type=SIF_MEDIA_TYPE, source="file")
    from mxc.lock.registry import resolve as resolve_manifest

    parsed = parse_ref(ref)
    pinned = image.get("digest")
    if isinstance(pinned, str) and parsed.digest is None:
        parsed = type(parsed)(parsed.registry, parsed.name, parsed.tag, pinned)
    if parsed.digest is not None and (pinned is None or pinned == parsed.digest):
        if previous is not None and (previous.ref, previous.digest) == (ref, parsed.digest):
            return previous  # resolved once already: the same pin, the same lock
        return LockedImage(ref=ref, digest=parsed.digest, source="spec")
    resolved = resolve_manifest(parsed, insecure=insecure)
    return LockedImage(ref=ref, digest=resolved.digest, media_type=resolved.media_type, source="registry")


def lock_code(code: dict[str, Any]) -> LockedCode:
    from mxc.lock.gitref import resolve_ref

    repo, ref, commit = code.get("repo"), code.get("ref"), code.get("commit")
    version = code.get("maxtext_version")
    if repo is not None and commit is None:
        if ref is None:
            raise UserError("code.repo has neither commit nor ref", "set code.ref to the branch to follow")
        commit = resolve_ref(str(repo), str(ref))
    return LockedCode(repo=repo, ref=ref, commit=commit, maxtext_version=None if version is None else str(version))


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def default_requirements(data: dict[str, Any], root: Path) -> Path:
    runtime = _mapping(data.get("runtime"))
    resources = _mapping(data.get("resources"))
    vendor = resources.get("gpu_vendor", "none") if runtime.get("container", "native") != "native" else "none"
    return root / LOCK_DIR / TARGET_REQUIREMENTS.get(str(vendor), TARGET_REQUIREMENTS["cpu"])


def lock_python(path: Path, root: Path) -> LockedPython:
    if not path.is_file():
        raise UserError(f"no requirements file {shown(path)}", "pass --requirements FILE (a hashed lock)")
    reqs, problems = parse(path.read_text("utf-8"))
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise UserError(f"{describe(shown(path), problems[0])}{more}", "regenerate it: python tools/pin_requirements.py")
    return LockedPython(requirements=relative(path, root), sha256=sha256_file(path),
                        packages={r.name: r.version for r in reqs})


def _python(data: dict[str, Any], root: Path, requirements: str | None, *, from_image: bool) -> LockedPython | None:
    """The run environment's hashed requirements. With code.from_image the image digest pins the whole
    environment, MaxText included, so there is none to name unless --requirements gives one."""
    if requirements:
        return lock_python(Path(requirements), root)
    return None if from_image else lock_python(default_requirements(data, root), root)


def _previous_image(path: Path) -> LockedImage | None:
    """The image of the lock already at ``path``, if it reads as one (a broken lock is rewritten)."""
    from mxc.compiler.errors import SpecErrors
    from mxc.compiler.lockfile import parse_lock
    from mxc.specfiles import read_spec

    try:
        return parse_lock(str(path), read_spec(str(path)).decode("utf-8")).image
    except (OSError, ValueError, SpecErrors, ReadRefused):
        return None


def make_lock(spec: str, *, requirements: str | None = None, lockfile: str | None = None,
              insecure: frozenset[str] = frozenset()) -> Locked:
    """Resolve ``spec``'s open pins; the lock, its canonical text, where it goes, and the bundle it makes."""
    spec_path = Path(spec)
    if not spec_path.is_file():
        raise UserError(f"no spec file {spec}")
    root = project_root(spec_path)
    doc = resolve(spec, SpecFiles.for_spec(spec))
    data = doc.data
    image = data.get("image")
    code = _mapping(data.get("code"))
    out = Path(lockfile) if lockfile else lock_path(spec_path)
    try:
        lock = Lock(
            format=LOCK_FORMAT,
            spec=relative(spec_path, root),
            mxc_version=__version__,
            image=lock_image(image, insecure, _previous_image(out)) if isinstance(image, dict) else None,
            code=lock_code(code),
            python=_python(data, root, requirements, from_image=code.get("from_image") is True),
        )
    except ValidationError as exc:  # a pin the spec wrote is malformed (e.g. a short commit)
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UserError(f"{spec}: cannot lock {where}: {first['msg']}", "run: mxc build " + spec + " to see why") from None
    bundle = compile_spec(spec, SpecFiles.for_spec(spec), mxc_version=__version__, lock=(shown(out), lock))
    return Locked(lock, lock_document(lock), out, bundle)
