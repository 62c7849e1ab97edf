"""Pinned training code: one exact git commit, materialised once into the store.

``code.repo`` + ``code.commit`` in a spec name the code a run must use. The commit is
exported from the repository's object database (``git archive``), never from its working
tree, so uncommitted edits or another checked-out branch cannot leak into a run. The
export lands in ``$MXC_HOME/code/<commit>/`` (written to a temporary directory, then
renamed), read-only, with ``.mxc-code.json`` listing every file's sha256. Each run
re-checks that listing: a checkout someone edited (dirty) or one that holds another commit
(mismatching) is refused rather than silently run.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mxc import tempdirs
from mxc.compiler.gitrepo import git_env, last_line, repo_problem
from mxc.errors import UserError, cannot_write
from mxc.fsutil import loads, read_bounded

MANIFEST = ".mxc-code.json"
IGNORED_DIRS = frozenset({"__pycache__"})


@dataclass(frozen=True)
class PinnedCode:
    repo: str
    commit: str
    dir: Path
    tree: str
    files_digest: str

    def as_record(self) -> dict[str, Any]:
        return {"repo": self.repo, "commit": self.commit, "tree": self.tree, "files_digest": self.files_digest,
                "dir": str(self.dir)}


def store_dir(home: Path, commit: str) -> Path:
    return home / "code" / commit


def _is_url(repo: str) -> bool:
    return "://" in repo or repo.startswith("git@")


def _file_hashes(root: Path) -> dict[str, str]:
    hashes: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in IGNORED_DIRS)
        for name in sorted(filenames):
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if rel == MANIFEST:
                continue
            if path.is_symlink():
                hashes[rel] = "symlink:" + os.readlink(path)
            else:
                hashes[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return hashes


def _digest(hashes: dict[str, str]) -> str:
    return "sha256:" + hashlib.sha256(json.dumps(hashes, sort_keys=True).encode()).hexdigest()


def verify(target: Path, commit: str) -> PinnedCode:
    """The materialised checkout, if it holds exactly ``commit`` unmodified; else a UserError."""
    hint = f"remove it to re-create it: rm -rf {target}"
    try:
        manifest = loads(read_bounded(target / MANIFEST))
    except (OSError, ValueError):
        raise UserError(f"{target} is not a checkout made by mxc (no readable {MANIFEST})", hint) from None
    if not (isinstance(manifest, dict) and isinstance(manifest.get("files"), dict)
            and isinstance(manifest.get("repo"), str) and isinstance(manifest.get("tree"), str)):
        raise UserError(f"{target}/{MANIFEST} is malformed", hint)
    if manifest.get("commit") != commit:
        raise UserError(f"checkout {target} holds commit {str(manifest.get('commit'))[:12]}, not {commit[:12]}", hint)
    expected: dict[str, str] = manifest["files"]
    actual = _file_hashes(target)
    changed = sorted(k for k in expected if actual.get(k) != expected[k])
    added = sorted(set(actual) - set(expected))
    if changed or added:
        what = [f"{name} changed" if name in actual else f"{name} deleted" for name in changed]
        what += [f"{name} added" for name in added]
        shown = ", ".join(what[:3]) + (f" and {len(what) - 3} more" if len(what) > 3 else "")
        raise UserError(f"checkout {target} of commit {commit[:12]} is dirty: {shown}", hint)
    return PinnedCode(manifest["repo"], commit, target, manifest["tree"], _digest(expected))


def _open_repo(home: Path, repo: str) -> Any:
    """A git.Repo holding the commit's objects: the local repository, or a mirror of a remote one."""
    import git

    if problem := repo_problem(repo):
        raise UserError(f"code.repo {repo!r} {problem}", "give a path or an https/ssh URL of a git repository")
    if not _is_url(repo):
        path = Path(repo).expanduser()
        try:
            return git.Repo(path)
        except (git.NoSuchPathError, git.InvalidGitRepositoryError):
            raise UserError(f"code.repo '{repo}' is not a git repository") from None
    mirror = home / "code" / ".mirrors" / (hashlib.sha256(repo.encode()).hexdigest()[:16] + ".git")
    if mirror.is_dir():
        return git.Repo(mirror)
    try:
        mirror.parent.mkdir(parents=True, exist_ok=True)
        tempdirs.sweep(mirror.parent)
        tmp = tempdirs.make(mirror.parent)
    except OSError as exc:
        raise cannot_write(f"a mirror of code.repo into {mirror.parent}", exc) from None
    try:
        git.Repo.clone_from(repo, tmp, mirror=True, env=git_env(os.environ))
        os.rename(tmp, mirror)
    except git.GitError as exc:
        raise UserError(f"cannot clone code.repo {repo!r}: {last_line(str(getattr(exc, 'stderr', '') or exc))}") from None
    except OSError as exc:
        raise cannot_write(f"a mirror of code.repo into {mirror.parent}", exc) from None
    finally:
        if tmp.exists():
            tempdirs.remove(tmp)
    return git.Repo(mirror)


def _resolve_commit(source: Any, repo: str, commit: str) -> Any:
    """The commit object, fetched from the remote when a mirror lacks it; a UserError if it does not exist."""
    import git

    def lookup() -> Any:
        sha = source.git.rev_parse("--verify", "--quiet", commit + "^{commit}")
        return source.commit(sha)

    try:
        return lookup()
    except (git.GitCommandError, git.BadName, ValueError):
        pass
    if _is_url(repo):
        try:
            source.git.fetch("origin", commit, env=git_env(os.environ))
            return lookup()
        except (git.GitError, git.BadName, ValueError):
            pass
    raise UserError(f"commit {commit[:12]} is not in code.repo '{repo}'", "push or fetch it, or fix code.commit")


def _read_only(root: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath) / name
            if not path.is_symlink():
                path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
        for name in dirnames:
            path = Path(dirpath) / name
            path.chmod(0o555)
    root.chmod(0o555)


def _remove_tree(root: Path) -> None:
    for dirpath, dirnames, _ in os.walk(root):
        for name in dirnames:
            (Path(dirpath) / name).chmod(0o755)
    root.chmod(0o755)
    shutil.rmtree(root)


def materialise(home: Path, repo: str, commit: str) -> PinnedCode:
    """Export ``commit`` of ``repo`` into the store once; verify it on every later use."""
    target = store_dir(home, commit)
    if target.exists():
        return verify(target, commit)
    import git

    source = _open_repo(home, repo)
    resolved = _resolve_commit(source, repo, commit)
    if resolved.hexsha != commit:
        raise UserError(f"code.commit {commit[:12]} resolves to {resolved.hexsha[:12]}", "give the full 40-hex commit")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tempdirs.sweep(target.parent)
        tmp = tempdirs.make(target.parent)
    except OSError as exc:
        raise cannot_write(f"the code export into {target.parent}", exc) from None
    try:
        stream = io.BytesIO()
        try:
            source.archive(stream, treeish=commit, format="tar")
        except git.GitError as exc:
            raise UserError(f"cannot export commit {commit[:12]} of code.repo {repo!r}: {last_line(str(exc))}") from None
        stream.seek(0)
        with tarfile.open(fileobj=stream) as tar:
            tar.extractall(tmp, filter="data")
        hashes = _file_hashes(tmp)
        manifest = {"repo": repo, "commit": commit, "tree": resolved.tree.hexsha, "files": hashes}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        _read_only(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():  # another run materialised it first: use theirs (verified below)
                raise
    except OSError as exc:
        raise cannot_write(f"the export of commit {commit[:12]} into {target.parent}", exc) from None
    finally:
        if tmp.exists():
            _remove_tree(tmp)
    return verify(target, commit)
