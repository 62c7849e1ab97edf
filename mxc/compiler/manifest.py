"""Hash what you render, render what you hash.

The manifest lists every bundle file with its sha256; the bundle hash is the sha256 of the
canonical manifest, so one changed byte anywhere changes the hash.
"""

from __future__ import annotations

import hashlib
import json

from mxc.compiler.render import TEMPLATE_VERSION, canonical_json

MANIFEST = "manifest.json"


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def build_manifest(files: dict[str, str], mxc_version: str) -> str:
    return canonical_json(
        {
            "format": "mxc-bundle/v1",
            "mxc_version": mxc_version,
            "template_version": TEMPLATE_VERSION,
            "files": {name: sha256_text(text) for name, text in sorted(files.items())},
        }
    )


def bundle_hash(manifest_text: str) -> str:
    return sha256_text(manifest_text)


def manifest_files(manifest_text: str) -> dict[str, str]:
    files: dict[str, str] = json.loads(manifest_text)["files"]
    return files
