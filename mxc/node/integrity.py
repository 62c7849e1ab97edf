"""Bundle integrity: the one check that a bundle directory holds exactly what its hash names.

A bundle's hash is the sha256 of its ``manifest.json``, which lists every other file with its
sha256. Whoever can write the store (a colleague, a job on a shared file system) can change a
file after it was built, so every use checks again: ``mxc run``, ``mxc rerun``, the local
supervisor before each attempt, a Slurm resubmission, ``mxc show``, a rebuild, and the node
program on every compute node before each start.

Standard library only, Python >= 3.8 syntax, no import from mxc: the node program ships this
module verbatim in every bundle and runs it with the node's own ``python3``.

Names in a manifest are confined to the bundle directory: one or two path components
(``env.sh``, ``mxc_node/main.py``), each of letters, digits, ``_``, ``.``, ``-``, never starting
with a dot (so never ``.`` or ``..``). Files are opened without following symbolic links and
must be regular files; nothing in the directory may be missing or left unlisted.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat

MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 1 << 20
MAX_NAME_PARTS = 2
_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}\Z")
_SHA256 = re.compile(r"[0-9a-f]{64}\Z")
_CHUNK = 1 << 20


class BundleError(Exception):
    """A bundle that cannot be trusted; the message is one line naming what is wrong."""


def valid_name(name: object) -> bool:
    """Whether ``name`` may be listed in a manifest (a path confined to the bundle directory)."""
    if not isinstance(name, str) or name == MANIFEST:
        return False
    parts = name.split("/")
    return len(parts) <= MAX_NAME_PARTS and all(_PART.match(part) for part in parts)


def valid_hash(digest: object) -> bool:
    return isinstance(digest, str) and bool(_SHA256.match(digest))


def parse_manifest(data: bytes) -> dict[str, str]:
    """The ``files`` of a manifest (name -> sha256); BundleError for anything but the expected shape."""
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise BundleError("not JSON ({})".format(str(exc).splitlines()[0][:100] if str(exc) else "too deep")) from None
    if not isinstance(manifest, dict):
        raise BundleError("not a JSON object")
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise BundleError("no 'files' object")
    for name, digest in files.items():
        if not valid_name(name):
            raise BundleError(f"file name {name[:100]!r} is not allowed (a name inside the bundle directory)")
        if not valid_hash(digest):
            raise BundleError(f"file {name} has no sha256 (64 lower-case hex digits)")
    return dict(files)


def _open(path: str) -> int:
    """A read-only descriptor of a regular file, never through a symbolic link or onto a FIFO."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file")
    return fd


def _read(path: str, limit: int) -> bytes:
    fd = _open(path)
    try:
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = os.read(fd, min(_CHUNK, limit + 1 - size))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise OSError(errno.EFBIG, f"larger than {limit} bytes")
    finally:
        os.close(fd)


def file_sha256(path: str) -> str:
    fd = _open(path)
    try:
        digest = hashlib.sha256()
        while True:
            chunk = os.read(fd, _CHUNK)
            if not chunk:
                return digest.hexdigest()
            digest.update(chunk)
    finally:
        os.close(fd)


def _why(exc: OSError) -> str:
    if exc.errno == errno.ENOENT:
        return "missing"
    if exc.errno == errno.ELOOP:
        return "a symbolic link, not a file"
    return exc.strerror or str(exc)


def read_manifest(bundle_dir: str | os.PathLike[str], expected_hash: str) -> dict[str, str]:
    """The verified file list of the bundle whose hash is ``expected_hash``; BundleError when the
    directory is not a real directory, or its manifest is unreadable, malformed or changed."""
    return _verified_manifest(os.fspath(bundle_dir), expected_hash)[1]


def _verified_manifest(bundle_dir: str, expected_hash: str) -> tuple[bytes, dict[str, str]]:
    try:
        mode = os.lstat(bundle_dir).st_mode
    except OSError as exc:
        raise BundleError(f"{bundle_dir}: {_why(exc)}") from None
    if not stat.S_ISDIR(mode):
        raise BundleError(f"{bundle_dir}: not a directory (a bundle is one)")
    try:
        data = _read(os.path.join(bundle_dir, MANIFEST), MAX_MANIFEST_BYTES)
    except OSError as exc:
        raise BundleError(f"{MANIFEST}: {_why(exc)}") from None
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected_hash:
        raise BundleError(f"{MANIFEST}: changed (its hash is {actual[:12]}, not {expected_hash[:12]})")
    try:
        return data, parse_manifest(data)
    except BundleError as exc:
        raise BundleError(f"{MANIFEST}: malformed: {exc}") from None


def _shown(name: str) -> str:
    """A name from the directory as it may be printed: quoted when it holds anything but plain characters
    (an escape sequence in a file name must not reach a terminal)."""
    return name if all(part and _PART.match(part) for part in name.split("/")) else repr(name)


def _unlisted(bundle_dir: str, files: dict[str, str]) -> list[str]:
    """Entries of the bundle directory that its manifest does not list (one directory level deep)."""
    listed_dirs = {name.split("/")[0] for name in files if "/" in name}
    extra = []
    for entry in sorted(os.listdir(bundle_dir)):
        if entry == MANIFEST or entry in files:
            continue
        path = os.path.join(bundle_dir, entry)
        if entry in listed_dirs and stat.S_ISDIR(os.lstat(path).st_mode):
            extra += [_shown(f"{entry}/{inner}") for inner in sorted(os.listdir(path))
                      if f"{entry}/{inner}" not in files]
        else:
            extra.append(_shown(entry))
    return extra


def check(bundle_dir: str | os.PathLike[str], expected_hash: str) -> list[str]:
    """Every problem of a stored bundle, one line each; empty when it is intact.

    ``expected_hash`` is the hash the caller trusts (the name it looked the bundle up by).
    """
    bundle_dir = os.fspath(bundle_dir)
    try:
        files = read_manifest(bundle_dir, expected_hash)
    except BundleError as exc:
        return [str(exc)]
    problems = []
    for name, digest in sorted(files.items()):
        try:
            if file_sha256(os.path.join(bundle_dir, name)) != digest:
                problems.append(f"{name}: changed (sha256 differs from the manifest)")
        except OSError as exc:
            problems.append(f"{name}: {_why(exc)}")
    try:
        problems += [f"{name}: not in the manifest" for name in _unlisted(bundle_dir, files)]
    except OSError as exc:
        problems.append(f"{bundle_dir}: cannot be listed ({_why(exc)})")
    return problems


def read_file(bundle_dir: str | os.PathLike[str], expected_hash: str, name: str, limit: int = 64 << 20) -> bytes:
    """The content of one listed file, checked against the verified manifest; BundleError when the
    name is not listed or the bytes read are not the ones the manifest names."""
    manifest, files = _verified_manifest(os.fspath(bundle_dir), expected_hash)
    if name == MANIFEST:
        return manifest
    if name not in files:
        raise BundleError(f"no file {name[:100]!r} in the manifest")
    try:
        data = _read(os.path.join(os.fspath(bundle_dir), name), limit)
    except OSError as exc:
        raise BundleError(f"{name}: {_why(exc)}") from None
    if hashlib.sha256(data).hexdigest() != files[name]:
        raise BundleError(f"{name}: changed (sha256 differs from the manifest)")
    return data
