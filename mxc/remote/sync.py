"""A bundle copied by content: packed here from its verified bytes, checked there before it is stored.

Bundles are addressed by their hash and never change, so "what the remote store lacks" is a
whole bundle or nothing: the login node's mxc says whether its store holds the hash intact
(``agent.probe`` for ``mxc cluster push``; for ``mxc run --cluster`` its ``submit`` asks, in the same
call as the run, with a ``MARK`` line, and the laptop answers with one ``frame``) and the laptop
sends only when it does not. The copy is one tar stream over the SSH
connection already open (no rsync needed on either side: a bundle is a few hundred kilobytes,
and there is nothing to patch in a file that cannot change). It is built from the bundle read
through ``mxc.node.integrity`` here, and on the login node ``unpack`` takes it in memory, refuses
anything but regular files with bundle names, checks that the manifest hashes to the name and
that each file hashes to its entry, then ``Store.put`` writes it the way a build does (temporary
directory, rename) and the store's own integrity check runs on the result before anything uses it.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from dataclasses import dataclass
from typing import IO, Any

from mxc.errors import UserError
from mxc.node import integrity
from mxc.node.integrity import MANIFEST

MAX_BUNDLE_BYTES = 64 << 20  # a bundle is kilobytes: spec, scripts, the node program
MAX_MEMBERS = 4096
MARK = "mxc-agent: bundle"  # the agent's lines about a bundle in ``submit``: "<MARK> HASH present|wanted|stored"


@dataclass(frozen=True)
class Transfer:
    """What a push did: ``copied`` the bundle (``files``, ``bytes`` of tar stream), or found it there."""

    cluster: str
    bundle: str
    copied: bool
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "bundle": self.bundle, "copied": self.copied, "files": self.files,
                "bytes": self.bytes, "seconds": round(self.seconds, 3)}

    def line(self) -> str:
        if not self.copied:
            return f"mxc: cluster {self.cluster}: bundle {self.bundle[:12]} is in its store already (nothing copied)"
        return (f"mxc: cluster {self.cluster}: bundle {self.bundle[:12]} copied ({self.files} files, "
                f"{self.bytes / 1024:.0f} KiB in {self.seconds:.1f}s; verified there)")


def pack(bundle_dir: Any, digest: str) -> tuple[bytes, int]:
    """The bundle as an uncompressed tar stream of exactly its manifest's files (read through the
    integrity check: what is sent is what the hash names); (bytes, number of files)."""
    try:
        files = integrity.read_manifest(bundle_dir, digest)
        names = [MANIFEST, *sorted(files)]
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name in names:
                data = integrity.read_file(bundle_dir, digest, name)
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(data), 0o444
                tar.addfile(info, io.BytesIO(data))
    except integrity.BundleError as exc:
        raise UserError(f"bundle {digest[:12]} is damaged: {exc}", f"check it with: mxc verify {digest[:12]}") from None
    return out.getvalue(), len(names)


def frame(data: bytes) -> bytes:
    """``data`` as sent after the agent asked for it: its length on a line, then the bytes."""
    return f"{len(data)}\n".encode() + data


def read_frame(fd: int) -> IO[bytes]:
    """The bytes of one ``frame`` read from descriptor ``fd``, exactly (nothing after it is consumed:
    the rest of stdin is the laptop holding the connection open)."""
    header = b""
    while not header.endswith(b"\n"):
        byte = os.read(fd, 1)
        if not byte or len(header) > 20:
            raise UserError("the bundle was not sent (no length line on stdin)")
        header += byte
    try:
        size = int(header)
    except ValueError:
        raise UserError("the bundle was not sent (no length line on stdin)") from None
    if not 0 < size <= MAX_BUNDLE_BYTES:
        raise UserError(f"the bundle sent is {size} bytes: refused (at most {MAX_BUNDLE_BYTES})")
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise UserError(f"the bundle sent ended after {size - left} of {size} bytes")
        chunks.append(chunk)
        left -= len(chunk)
    return io.BytesIO(b"".join(chunks))


def unpack(stream: IO[bytes], digest: str) -> dict[str, str]:
    """The files of the tar stream on stdin, proven to be bundle ``digest``; UserError (exit 2) otherwise."""
    if not integrity.valid_hash(digest):
        raise UserError(f"'{digest[:80]}' is not a bundle hash (64 hex digits)")
    data = stream.read(MAX_BUNDLE_BYTES + 1)
    if len(data) > MAX_BUNDLE_BYTES:
        raise UserError(f"the bundle sent is larger than {MAX_BUNDLE_BYTES} bytes: refused")
    files: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for count, member in enumerate(tar):
                if count >= MAX_MEMBERS:
                    raise UserError(f"the bundle sent has more than {MAX_MEMBERS} entries: refused")
                if member.isdir():
                    continue
                if not member.isreg() or (member.name != MANIFEST and not integrity.valid_name(member.name)):
                    raise UserError(f"the bundle sent holds {member.name[:100]!r}, not a bundle file: refused")
                if member.name in files:
                    raise UserError(f"the bundle sent holds {member.name[:100]!r} twice: refused")
                reader = tar.extractfile(member)
                assert reader is not None  # a regular file
                files[member.name] = reader.read()
    except tarfile.TarError as exc:
        raise UserError(f"the bundle sent is not a tar stream ({exc}): refused") from None
    _check(files, digest)
    try:
        return {name: content.decode("utf-8") for name, content in files.items()}
    except UnicodeDecodeError:
        raise UserError(f"bundle {digest[:12]} as sent holds a file that is not UTF-8 text: refused") from None


def _check(files: dict[str, bytes], digest: str) -> None:
    """Exactly the files the manifest lists, each with its sha256, and the manifest hashing to ``digest``."""
    manifest = files.get(MANIFEST)
    if manifest is None or hashlib.sha256(manifest).hexdigest() != digest:
        raise UserError(f"the bundle sent is not {digest[:12]}: its manifest does not hash to that name: refused")
    try:
        listed = integrity.parse_manifest(manifest)
    except integrity.BundleError as exc:
        raise UserError(f"the bundle sent has a bad manifest ({exc}): refused") from None
    sent = set(files) - {MANIFEST}
    if sent != set(listed):
        odd = sorted(sent ^ set(listed))
        raise UserError(f"the bundle sent does not hold exactly its manifest's files ({', '.join(odd[:5])}): refused")
    for name, expected in listed.items():
        if hashlib.sha256(files[name]).hexdigest() != expected:
            raise UserError(f"the bundle sent has {name} changed (its sha256 is not the manifest's): refused")
