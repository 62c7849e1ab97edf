"""Is this bundle, on this node, byte for byte what was built? Checked before every start.

The bundle's directory is named by its hash, the sha256 of ``manifest.json``; the manifest lists
the sha256 of every other file. A node recomputes all of it with hashlib before it starts anything
(the batch side and every rank), and refuses to start, naming the changed file. mxc's own check
(``mxc verify``, mxc/store.py) applies the same rules on the submitting side.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

MANIFEST = "manifest.json"
_HASH = re.compile(r"^[0-9a-f]{64}$")
# A bundle file name: a file, or a file in one subdirectory (mxc_node/x.py); never absolute, never "..".
_NAME = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)?$")


def name_allowed(name: str) -> bool:
    return bool(_NAME.match(name)) and ".." not in name.split("/") and "." not in name.split("/")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def problems(bundle_dir: Path) -> list[str]:
    """What differs from the manifest (empty when intact). The expected bundle hash is the
    directory's name when that is a hash (the store names bundles so)."""
    try:
        manifest_bytes = (bundle_dir / MANIFEST).read_bytes()
        files = json.loads(manifest_bytes.decode("utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [f"{MANIFEST}: unreadable ({exc})"]
    if not isinstance(files, dict):
        return [f"{MANIFEST}: 'files' is not a mapping"]
    found: list[str] = []
    if _HASH.match(bundle_dir.name) and hashlib.sha256(manifest_bytes).hexdigest() != bundle_dir.name:
        found.append(f"{MANIFEST}: changed (its sha256 is not the bundle's hash {bundle_dir.name[:12]})")
    for name, expected in sorted(files.items()):
        if not isinstance(name, str) or not name_allowed(name) or not isinstance(expected, str):
            found.append(f"{MANIFEST}: bad entry {name!r}")
            continue
        path = bundle_dir / name
        try:
            actual = sha256_file(path)
        except OSError:
            found.append(f"{name}: missing")
            continue
        if actual != expected:
            found.append(f"{name}: changed (sha256 differs from the manifest)")
    return found
