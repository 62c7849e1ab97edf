"""The lockfile, ``mxc-lock/v1``: the pins a spec leaves open, resolved once and reviewed in git.

A spec may name its image by tag and its code by branch; ``mxc lock`` resolves those to a
manifest digest and a commit and writes them here, with the hashed Python requirements of the
run environment and the mxc version. ``mxc build --locked`` fills the spec's open pins from the
lock, refuses any disagreement, and renders the lock into the bundle (``lock.json``), so the
bundle hash covers it. This module is pure: parsing, checking and applying, no I/O.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator

from mxc.compiler.errors import SpecError, SpecErrors
from mxc.compiler.loader import Loaded, load_json
from mxc.compiler.render import canonical_json
from mxc.compiler.resolve import line_of
from mxc.compiler.schema import Commit, Digest

LOCK_FORMAT = "mxc-lock/v1"
LOCK_FILE = "lock.json"
Sha256Hex = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LockedImage(_Strict):
    """The image as resolved: the reference the spec names and the digest it pointed to."""

    ref: str = Field(min_length=1, description="the spec's image.ref, verbatim")
    digest: Digest = Field(description="manifest digest at the registry (or sha256 of the .sif file)")
    media_type: str | None = Field(None, description="manifest media type (OCI/Docker manifest or index), or "
                                   "application/x-apptainer-sif; none when the spec pinned the digest and no registry "
                                   "was asked")
    source: Literal["registry", "file", "spec"] = Field(
        description="registry: resolved through the OCI API; file: a local .sif; spec: the digest the spec pins, "
                    "taken as written (mxc lock asks no registry when everything is pinned; the pull verifies it)")


class LockedCode(_Strict):
    """The training code: a repository pinned to a commit, or the pinned maxtext release."""

    repo: str | None = None
    ref: str | None = Field(None, description="the branch or tag the commit was resolved from")
    commit: Commit | None = None
    maxtext_version: str | None = None

    @model_validator(mode="after")
    def _pinned(self) -> Self:
        if self.repo is not None and self.commit is None:
            raise ValueError("code.commit: a locked repository needs its commit")
        return self


class LockedPython(_Strict):
    """The run environment's Python packages: a hashed requirements file, pinned by its sha256."""

    requirements: str = Field(description="path of the requirements file, relative to the project root")
    sha256: Sha256Hex = Field(description="sha256 of that file")
    packages: dict[str, str] = Field(description="package -> version, as pinned in the file (for review)")


class Lock(_Strict):
    format: Literal["mxc-lock/v1"]
    spec: str = Field(description="the spec this lock belongs to, relative to the project root")
    mxc_version: str
    image: LockedImage | None = None
    code: LockedCode
    python: LockedPython | None = None


def parse_lock(name: str, text: str) -> Lock:
    """Read a lockfile's text; problems become SpecErrors naming the file."""
    try:
        data = load_json(name, text).data  # bounded: a lock arrives through review like a spec
    except SpecErrors as exc:
        raise SpecErrors(replace(e, suggestion="rewrite it with mxc lock") for e in exc.errors) from None
    try:
        return Lock.model_validate(data)
    except ValidationError as exc:
        errors = [
            SpecError(name, None, ".".join(str(p) for p in err["loc"]), err["msg"].removeprefix("Value error, "),
                      "rewrite it with mxc lock")
            for err in exc.errors()
        ]
        raise SpecErrors(errors) from None


def lock_document(lock: Lock) -> str:
    """The canonical text of a lock: sorted keys, two-space indent, no nulls; what is written and hashed."""
    return canonical_json(lock.model_dump(mode="json", exclude_none=True))


def _get(data: dict[str, Any], *path: str) -> Any:
    node: Any = data
    for part in path:
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def apply_lock(doc: Loaded, lock: Lock, lock_name: str, main_file: str) -> list[SpecError]:
    """Fill the pins the spec leaves open from ``lock``; return every disagreement (one error each).

    A pin written in the spec wins over nothing: if the spec and the lock both say something,
    they must say the same thing, else the lock is stale (or the spec was edited after locking).
    """
    errors: list[SpecError] = []
    hint = f"run: mxc lock {main_file}, then review the lockfile diff"

    def err(path: tuple[str, ...], message: str) -> None:
        file, line = line_of(doc, path)
        errors.append(SpecError(file or main_file, line, ".".join(path), message, hint))

    data = doc.data
    image = _get(data, "image")
    if isinstance(image, dict):
        if lock.image is None:
            err(("image",), f"not pinned: {lock_name} has no image")
        else:
            if image.get("ref") != lock.image.ref:
                err(("image", "ref"), f"{image.get('ref')!r} disagrees with {lock_name}, which pins {lock.image.ref!r}")
            digest = image.get("digest")
            if digest is None:
                image["digest"] = lock.image.digest
            elif digest != lock.image.digest:
                err(("image", "digest"), f"{digest} disagrees with {lock_name}, which pins {lock.image.digest}")
    elif lock.image is not None:
        err(("image",), f"the spec has no image but {lock_name} pins {lock.image.ref}")

    code = _get(data, "code")
    if isinstance(code, dict):
        for key in ("repo", "ref"):
            if code.get(key) != getattr(lock.code, key):
                err(("code", key), f"{code.get(key)!r} disagrees with {lock_name}, which has {getattr(lock.code, key)!r}")
        for key in ("commit", "maxtext_version"):
            locked = getattr(lock.code, key)
            if code.get(key) is None:
                if locked is not None:
                    code[key] = locked
            elif code.get(key) != locked:
                err(("code", key), f"{code.get(key)} disagrees with {lock_name}, which pins {locked}")
        if code.get("repo") is not None and code.get("commit") is None:
            err(("code", "commit"), f"not pinned: {lock_name} has no commit for {code.get('repo')}")
        pinned = lock.python.packages.get("maxtext") if lock.python else None
        version = code.get("maxtext_version")
        if pinned is not None and version is not None and str(version) != pinned:
            err(("code", "maxtext_version"), f"{version} disagrees with {lock.python.requirements if lock.python else ''}, "
                                             f"which pins maxtext=={pinned}")
    return errors
