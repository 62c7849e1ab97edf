"""Where a MaxText's configuration lives: a git commit of a MaxText repository, or a directory.

tools/gen_maxtext_catalog.py reads MaxText's config files without installing or importing
MaxText, so a catalog can be made for any MaxText: a fork at a pinned commit (read straight
from the git objects, no work tree needed, so a bare mirror works) or the MaxText inside a
container image (copied out with ``podman cp``, or a path in an unpacked image rootfs).

MaxText moved its config three times; each layout is recognised by where ``base.yml`` is:

- ``src/maxtext/configs``  maxtext >= 0.2 (PyPI), ``python -m maxtext.trainers.pre_train.train``
- ``src/MaxText/configs``  2025 trees (AMD's ROCm images): ``from MaxText import train``
- ``MaxText/configs``      older trees (``MaxText/train.py``), keys checked against base.yml only
- ``configs``              an installed package directory (``site-packages/maxtext``)
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

LAYOUTS = ("src/maxtext/configs", "src/MaxText/configs", "MaxText/configs", "maxtext/configs", "configs")


class SourceError(Exception):
    """The given checkout or directory holds no MaxText configuration."""


class Tree:
    """Read-only access to the files of one MaxText tree (paths are POSIX, relative to its root)."""

    def read(self, path: str) -> str | None:
        raise NotImplementedError

    def listdir(self, path: str) -> list[str]:
        raise NotImplementedError

    def describe(self) -> dict[str, str]:
        raise NotImplementedError


@dataclass(frozen=True)
class DirTree(Tree):
    """A directory: an image's MaxText copied out of the image, or an unpacked rootfs path."""

    root: Path

    def read(self, path: str) -> str | None:
        target = self.root / path
        return target.read_text(encoding="utf-8") if target.is_file() else None

    def listdir(self, path: str) -> list[str]:
        target = self.root / path
        return sorted(p.name for p in target.iterdir()) if target.is_dir() else []

    def describe(self) -> dict[str, str]:
        out = {"kind": "directory", "path": str(self.root)}
        head = _git(self.root, "rev-parse", "HEAD")  # an image's /workspace/maxtext is often a clone
        if head:
            out["commit"] = head
        return out


@dataclass(frozen=True)
class GitTree(Tree):
    """One commit of a git repository (a clone, a worktree or a bare mirror)."""

    gitdir: Path
    commit: str
    repo_url: str = ""
    ref: str = ""  # what the commit was asked for as (a branch, tag or pull-request ref), recorded

    def read(self, path: str) -> str | None:
        return _git(self.gitdir, "show", f"{self.commit}:{path}", strip=False)

    def listdir(self, path: str) -> list[str]:
        out = _git(self.gitdir, "ls-tree", "--name-only", f"{self.commit}:{path}") or ""
        return sorted(out.splitlines())

    def describe(self) -> dict[str, str]:
        out = {"kind": "git", "commit": self.commit}
        if self.repo_url:
            out["repo"] = self.repo_url
        if self.ref and self.ref != self.commit:
            out["ref"] = self.ref
        date = _git(self.gitdir, "log", "-1", "--format=%cs", self.commit)
        if date:
            out["date"] = date
        return out


def git_tree(gitdir: Path, rev: str, repo_url: str = "") -> GitTree:
    """The commit ``rev`` names (a branch, tag, ref or hash), resolved to its full hash."""
    commit = _git(gitdir, "rev-parse", "--verify", f"{rev}^{{commit}}")
    if not commit:
        raise SourceError(f"{gitdir}: no commit {rev!r}")
    return GitTree(gitdir, commit, repo_url, rev)


def _git(where: Path, *args: str, strip: bool = True) -> str | None:
    proc = subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return None
    return proc.stdout.strip() if strip else proc.stdout


@dataclass(frozen=True)
class Layout:
    """Where base.yml, the pydantic types and the model configs are in one tree."""

    configs: str  # e.g. "src/MaxText/configs"

    @property
    def name(self) -> str:
        return self.configs

    def path(self, *parts: str) -> str:
        return str(PurePosixPath(self.configs, *parts))

    @property
    def package_root(self) -> str:
        """The directory that holds the top-level Python package (``src`` or the tree root)."""
        parts = PurePosixPath(self.configs).parts
        return str(PurePosixPath(*parts[:-2])) if len(parts) > 2 else ""


def find_layout(tree: Tree) -> Layout:
    for candidate in LAYOUTS:
        if tree.read(f"{candidate}/base.yml") is not None:
            return Layout(candidate)
    raise SourceError(f"no MaxText base.yml under any of {', '.join(LAYOUTS)}")
