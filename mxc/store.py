"""The content-addressed bundle store: ``$MXC_HOME/bundles/<sha256>/``.

Bundles are written to a temporary directory and renamed into place, then made read-only.
Nothing read from the store is trusted: every file is read through ``mxc.integrity`` (its
manifest must hash to the bundle's name, the file must hash to its manifest entry), and a
bundle is verified whole before each use. A rebuild verifies the stored copy too: a damaged
one is replaced atomically by the fresh build, which says so. A build that was killed leaves
a temporary directory that the next build removes (``mxc.tempdirs``). Lookups accept any
unique prefix.

The current bundle: each bundle directory's modification time is when this store last built it
(set when it enters, and again by a rebuild of the same spec). Bundles in that order are what
``mxc ls`` lists, what ``@``/``@~N`` count, and ``@`` is what ``mxc run`` without a bundle runs:
one order, one owner, no pointer file that could disagree with it.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from mxc import tempdirs
from mxc.errors import UserError, cannot_write
from mxc.fsutil import loads
from mxc.node import integrity
from mxc.node.integrity import MANIFEST

if TYPE_CHECKING:
    from mxc.refs import Relative

EXECUTABLES = frozenset({"entrypoint.sh", "job.sbatch"})
_HEX = re.compile(r"^[0-9a-f]+$")
_BUNDLE_HASH = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class StoredBundle:
    hash: str
    path: Path

    def damaged(self, problem: str) -> UserError:
        return UserError(f"bundle {self.hash[:12]} is damaged: {problem}", f"check it with: mxc verify {self.hash[:12]}")

    def files(self) -> dict[str, str]:
        """The verified manifest: every file's name and sha256."""
        try:
            return integrity.read_manifest(self.path, self.hash)
        except integrity.BundleError as exc:
            raise self.damaged(str(exc)) from None

    def read(self, name: str) -> str:
        """A file's text, only if the manifest lists it and its bytes are the ones listed."""
        if name != MANIFEST and name not in (files := self.files()):
            raise UserError(f"bundle {self.hash[:12]} has no file '{name}'", "files: " + ", ".join(sorted(files)))
        try:
            return integrity.read_file(self.path, self.hash, name).decode("utf-8")
        except integrity.BundleError as exc:
            raise self.damaged(str(exc)) from None
        except UnicodeDecodeError:
            raise self.damaged(f"{name}: not UTF-8 text") from None

    def spec(self) -> dict[str, Any]:
        try:
            data = loads(self.read("spec.json"))
        except ValueError as exc:
            raise self.damaged(f"spec.json: {str(exc).splitlines()[0][:100]}") from None
        if not isinstance(data, dict):
            raise self.damaged("spec.json: not a JSON object")
        return data


@dataclass(frozen=True)
class Stored:
    """What ``Store.put`` did: ``built`` a new bundle, found it ``unchanged``, or ``repaired`` a damaged copy."""

    state: Literal["built", "unchanged", "repaired"]
    problems: list[str] = field(default_factory=list)  # what was wrong with the copy that was repaired
    newest: bool = True  # it is now ``@``, what `mxc run` runs (False: an unchanged bundle whose time it could not set)

    @property
    def created(self) -> bool:
        return self.state != "unchanged"


class Store:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.bundles = home / "bundles"

    def put(self, files: dict[str, str], digest: str) -> tuple[StoredBundle, Stored]:
        """Store a compiled bundle, or check the stored copy and replace it if it was damaged."""
        bad = sorted(name for name in files if name != MANIFEST and not integrity.valid_name(name))
        if bad or not _BUNDLE_HASH.match(digest):
            raise ValueError(f"not a storable bundle: {digest!r}, names {bad}")  # a bug in the compiler, not input
        final = self.bundles / digest
        tempdirs.sweep(self.bundles)  # what killed builds left behind, whether or not this one writes
        problems = integrity.check(final, digest) if os.path.lexists(final) else []
        if os.path.lexists(final) and not problems:
            return StoredBundle(digest, final), Stored("unchanged", newest=self._built_now(final))
        try:
            self.bundles.mkdir(parents=True, exist_ok=True)
            tmp = tempdirs.make(self.bundles)
        except OSError as exc:
            raise cannot_write(f"the bundle store {self.bundles}", exc) from None
        try:
            _write_files(tmp, files)
            if problems:
                _exchange(tmp, final)  # tmp now holds the damaged copy, removed below
            else:
                try:
                    os.rename(tmp, final)
                except OSError:
                    if integrity.check(final, digest):  # another build won the race with the same content: fine
                        raise
        except OSError as exc:
            raise cannot_write(f"bundle {digest[:12]} into {self.bundles}", exc) from None
        finally:
            if os.path.lexists(tmp):
                tempdirs.remove(tmp)
        return StoredBundle(digest, final), Stored("repaired" if problems else "built", problems)

    @staticmethod
    def _built_now(path: Path) -> bool:
        """A rebuild of a stored bundle makes it the newest (``@``, what ``mxc run`` runs); False where
        it cannot (another user's bundle in a shared store: only its owner may set its time)."""
        try:
            os.utime(path)
        except OSError:
            return False
        return True

    def current(self) -> StoredBundle:
        """``@``: the bundle built last, what ``mxc run`` without a bundle runs."""
        if not self.hashes():
            raise UserError("no bundle has been built yet", "run: mxc build specs/tiny.yaml")
        return self.get("@")

    def hashes(self) -> list[str]:
        """Every entry named like a bundle, damaged ones included (``verify`` says what is wrong)."""
        try:
            return sorted(name for name in os.listdir(self.bundles) if _BUNDLE_HASH.match(name))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def built(self, digest: str) -> float | None:
        """When this store last built the bundle (its directory's modification time: the bundle holds no time)."""
        try:
            return os.stat(self.bundles / digest).st_mtime
        except OSError:
            return None

    def by_age(self) -> list[str]:
        """Every bundle hash, least recently built first (as ``mxc ls`` lists them and ``@``/``@~N`` count)."""
        return sorted(self.hashes(), key=lambda h: (self.built(h) or 0.0, h))

    def labels(self) -> dict[str, dict[str, float]]:
        """bundle hash -> {label: when it was last given} (``mxc build --label``; kept outside the bundles)."""
        from mxc import bundle_labels

        return bundle_labels.read(self.home)

    def add_labels(self, digest: str, labels: list[str]) -> None:
        from mxc import bundle_labels

        bundle_labels.add(self.home, digest, labels)

    def get(self, prefix: str) -> StoredBundle:
        from mxc import refs

        relative = refs.parse(prefix)
        if relative is not None:
            return self._relative(relative)
        prefix = prefix.strip().lower()
        if not prefix or not _HEX.match(prefix):
            raise UserError(f"'{prefix[:80]}' is not a bundle hash or prefix (hex digits)")
        matches = [h for h in self.hashes() if h.startswith(prefix)]
        if not matches:
            raise UserError(f"no bundle matches '{prefix}' in {self.bundles}", "list bundles with: mxc ls")
        if len(matches) > 1:
            listed = ", ".join(m[:12] for m in matches[:5])
            raise UserError(f"'{prefix}' is ambiguous: {len(matches)} bundles match ({listed})", "give more digits")
        return StoredBundle(matches[0], self.bundles / matches[0])

    def _relative(self, ref: Relative) -> StoredBundle:
        """``@``, ``@~N`` (by the time each was last built), ``label:NAME`` (the one most recently labelled so)."""
        from mxc import refs

        labels = self.labels()
        ordered = self.by_age()
        if (label := ref.label) is not None:
            ordered = sorted(ordered, key=lambda h: (labels.get(h, {}).get(label, -1.0), self.built(h) or 0.0))
        digest = refs.pick(ref, ordered, "bundle", lambda h: labels.get(h, {}), "mxc ls")
        return StoredBundle(digest, self.bundles / digest)

    def verify(self, bundle: StoredBundle) -> list[str]:
        """Problems found by recomputing every hash; empty when the bundle is intact."""
        return integrity.check(bundle.path, bundle.hash)

    def require_intact(self, bundle: StoredBundle) -> None:
        """Refuse (exit 2, one line) to use a bundle whose files are not exactly the ones its hash names."""
        problems = self.verify(bundle)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise bundle.damaged(problems[0] + more)


def _write_files(root: Path, files: dict[str, str]) -> None:
    """The bundle's files, read-only (scripts executable), in a directory that becomes read-only too."""
    subdirs = sorted({name.split("/")[0] for name in files if "/" in name})
    for sub in subdirs:
        (root / sub).mkdir()
    for name, text in files.items():
        target = root / name
        with open(target, "x", encoding="utf-8") as fh:
            fh.write(text)
        target.chmod(0o555 if name in EXECUTABLES else 0o444)
    for sub in subdirs:
        (root / sub).chmod(0o555)
    root.chmod(0o555)


def _exchange(new: Path, old: Path) -> None:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE): a reader sees the old bundle
    or the new one, never none. Where the file system cannot exchange, two renames."""
    import ctypes  # only a repair needs it

    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    at_fdcwd, rename_exchange = -100, 2
    if renameat2 is not None:
        if renameat2(at_fdcwd, os.fsencode(new), at_fdcwd, os.fsencode(old), rename_exchange) == 0:
            return
        code = ctypes.get_errno()
        if code not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
            raise OSError(code, os.strerror(code), str(old))
    aside = tempdirs.make(old.parent)
    os.rename(old, aside / "damaged")
    os.rename(new, old)
    os.rename(aside, new)
