"""The content-addressed bundle store: ``$MXC_HOME/bundles/<sha256>/``.

Bundles are written to a temporary directory and renamed into place, then made
read-only; a bundle that exists is never rewritten. Lookups accept any unique prefix.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mxc.compiler.manifest import MANIFEST, bundle_hash, manifest_files
from mxc.errors import UserError
from mxc.fsutil import write_atomic

EXECUTABLES = frozenset({"entrypoint.sh", "job.sbatch", "preflight.sh"})
_HEX = re.compile(r"^[0-9a-f]+$")


@dataclass(frozen=True)
class StoredBundle:
    hash: str
    path: Path

    def read(self, name: str) -> str:
        return (self.path / name).read_text("utf-8")

    def spec(self) -> dict[str, object]:
        data: dict[str, object] = json.loads(self.read("spec.json"))
        return data


class Store:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.bundles = home / "bundles"

    def put(self, files: dict[str, str], digest: str) -> tuple[StoredBundle, bool]:
        """Store a compiled bundle; returns it and whether it was new."""
        final = self.bundles / digest
        if final.is_dir():
            return StoredBundle(digest, final), False
        self.bundles.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=self.bundles))
        try:
            for name, text in files.items():
                target = tmp / name
                target.write_text(text, encoding="utf-8")
                target.chmod(0o555 if name in EXECUTABLES else 0o444)
            tmp.chmod(0o555)
            try:
                os.rename(tmp, final)
            except OSError:
                if not final.is_dir():  # another build won the race with the same content: fine
                    raise
        finally:
            if tmp.exists():
                tmp.chmod(0o755)
                shutil.rmtree(tmp)
        return StoredBundle(digest, final), True

    def set_last(self, digest: str) -> None:
        write_atomic(self.home / "last-build", digest + "\n")

    def last(self) -> StoredBundle:
        try:
            digest = (self.home / "last-build").read_text().strip()
        except FileNotFoundError:
            raise UserError("no bundle has been built yet", "run: mxc build specs/tiny.yaml") from None
        return self.get(digest)

    def hashes(self) -> list[str]:
        if not self.bundles.is_dir():
            return []
        return sorted(p.name for p in self.bundles.iterdir() if p.is_dir() and _HEX.match(p.name))

    def get(self, prefix: str) -> StoredBundle:
        prefix = prefix.strip().lower()
        if not prefix or not _HEX.match(prefix):
            raise UserError(f"'{prefix}' is not a bundle hash or prefix (hex digits)")
        matches = [h for h in self.hashes() if h.startswith(prefix)]
        if not matches:
            raise UserError(f"no bundle matches '{prefix}' in {self.bundles}", "list bundles with: mxc ls")
        if len(matches) > 1:
            listed = ", ".join(m[:12] for m in matches[:5])
            raise UserError(f"'{prefix}' is ambiguous: {len(matches)} bundles match ({listed})", "give more digits")
        return StoredBundle(matches[0], self.bundles / matches[0])

    def verify(self, bundle: StoredBundle) -> list[str]:
        """Problems found by recomputing every hash; empty when the bundle is intact."""
        problems: list[str] = []
        try:
            manifest = bundle.read(MANIFEST)
            listed = manifest_files(manifest)
        except (OSError, ValueError, KeyError) as exc:
            return [f"{MANIFEST}: unreadable ({exc})"]
        if bundle_hash(manifest) != bundle.hash:
            problems.append(f"{MANIFEST}: changed (its hash is {bundle_hash(manifest)[:12]}, not {bundle.hash[:12]})")
        for name, expected in sorted(listed.items()):
            path = bundle.path / name
            if not path.is_file():
                problems.append(f"{name}: missing")
            elif hashlib.sha256(path.read_bytes()).hexdigest() != expected:
                problems.append(f"{name}: changed (sha256 differs from the manifest)")
        extra = sorted(p.name for p in bundle.path.iterdir() if p.name not in listed and p.name != MANIFEST)
        problems += [f"{name}: not in the manifest" for name in extra]
        return problems
