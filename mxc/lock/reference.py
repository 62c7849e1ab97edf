"""Image references: ``[registry/]name[:tag][@sha256:...]`` and local ``.sif`` files.

Follows the distribution reference grammar closely enough for pinning: the first path
component is a registry when it has a dot or a port or is ``localhost``; otherwise the image
lives on Docker Hub, whose API host is ``registry-1.docker.io`` and whose one-word names
are ``library/NAME``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mxc.errors import UserError

DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"
_NAME = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
LOOPBACK = ("127.0.0.1", "localhost", "[::1]")


@dataclass(frozen=True)
class ImageRef:
    registry: str
    name: str
    tag: str | None
    digest: str | None

    @property
    def api_host(self) -> str:
        return DOCKER_HUB_API if self.registry == DOCKER_HUB else self.registry

    @property
    def reference(self) -> str:
        """What to ask the manifests endpoint for: the digest if pinned, else the tag."""
        return self.digest or self.tag or "latest"

    @property
    def is_loopback(self) -> bool:
        return self.registry.rsplit(":", 1)[0] in LOOPBACK or self.registry in LOOPBACK

    def __str__(self) -> str:
        text = f"{self.registry}/{self.name}"
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text


def is_sif(ref: str) -> bool:
    """A local Apptainer image file rather than a registry reference."""
    return ref.endswith(".sif") or ref.startswith(("/", "./", "../"))


def parse_ref(ref: str) -> ImageRef:
    text = ref.strip()
    if "://" in text:
        scheme = text.split("://", 1)[0]
        if scheme != "docker":
            raise UserError(f"image.ref {ref!r}: only registry references (or .sif files) can be locked")
        text = text.split("://", 1)[1]
    digest = None
    if "@" in text:
        text, digest = text.split("@", 1)
        if not _DIGEST.match(digest):
            raise UserError(f"image.ref {ref!r}: digest must be sha256:<64 hex>")
    first, _, rest = text.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        registry, path = first, rest
    else:
        registry, path = DOCKER_HUB, text
    tag = None
    last = path.rsplit("/", 1)[-1]
    if ":" in last:
        path, tag = path.rsplit(":", 1)
        if not _TAG.match(tag):
            raise UserError(f"image.ref {ref!r}: {tag!r} is not a valid tag")
    if registry == DOCKER_HUB and "/" not in path:
        path = f"library/{path}"
    if not _NAME.match(path):
        raise UserError(f"image.ref {ref!r}: {path!r} is not a valid repository name (lower-case, digits, . _ - /)")
    if tag is None and digest is None:
        tag = "latest"
    return ImageRef(registry, path, tag, digest)
