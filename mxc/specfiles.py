"""Reading spec files from disk: confined to the spec's repository, regular files only, bounded.

A spec under review can name other files (``extends``; a sweep's ``spec:``). Read as given,
``extends: /etc/shadow`` or ``../../home/x/.netrc`` echoed lines of those files into error
messages and CI annotations, ``/dev/zero`` exhausted memory and a FIFO hung the build. So the
filesystem edge gives the pure compiler a Reader (``SpecFiles``) that only reads

- files inside the spec's *repository*: the git work tree holding the spec, else the spec's own
  directory. The path is resolved first (symlinks followed), then checked, so a symlink cannot
  point outside; a file outside is refused before it is opened, so nothing of it is ever echoed;
- regular files (a FIFO, a device, a directory is refused; opened non-blocking, so a FIFO
  swapped in after the check cannot hang the read either);
- at most ``limits.MAX_FILE_BYTES`` bytes (never more is read).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from mxc.compiler.limits import MAX_FILE_BYTES
from mxc.compiler.resolve import ReadRefused

CONFINEMENT_HINT = ("extends, model.config_file and a sweep's spec: reach only files of the spec's git work tree "
                    "(else of its directory)")


def repository_of(path: str | Path) -> Path:
    """The git work tree holding ``path`` (a directory with ``.git``, a file in worktrees), else its directory.

    Found by looking for ``.git`` upwards, without running git (a spec outside any repository,
    or on a machine without git, still gets a root).
    """
    start = Path(os.path.realpath(os.path.dirname(os.path.abspath(path))))
    for directory in (start, *start.parents):
        if os.path.lexists(directory / ".git"):
            return directory
    return start


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


class SpecFiles:
    """A compiler Reader confined to ``root`` (``repository_of`` the file whose references it reads)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(os.path.realpath(root))

    @classmethod
    def for_spec(cls, path: str | Path) -> SpecFiles:
        return cls(repository_of(path))

    def __call__(self, path: str) -> bytes:
        real = os.path.realpath(path)
        if not _within(real, str(self.root)):
            raise ReadRefused(f"outside the spec's repository {self.root}", CONFINEMENT_HINT)
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | os.O_NOFOLLOW
        try:
            fd = os.open(real, flags)
        except OSError as exc:
            if exc.filename is None:
                exc.filename = path
            raise
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise ReadRefused("not a regular file", "a spec is a YAML file (not a FIFO, device or directory)")
            if info.st_size > MAX_FILE_BYTES:
                raise ReadRefused(f"larger than {MAX_FILE_BYTES:,} bytes",
                                  "a spec is a few kilobytes; see limits in docs/spec-reference.md")
            chunks: list[bytes] = []
            size = 0
            while size <= MAX_FILE_BYTES:
                chunk = os.read(fd, MAX_FILE_BYTES + 1 - size)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        finally:
            os.close(fd)
        data = b"".join(chunks)
        if len(data) > MAX_FILE_BYTES:  # grew since fstat; never read more than this
            raise ReadRefused(f"larger than {MAX_FILE_BYTES:,} bytes",
                              "a spec is a few kilobytes; see limits in docs/spec-reference.md")
        return data


def read_spec(path: str) -> bytes:
    """One spec file, confined to its own repository (the first file of a chain)."""
    return SpecFiles.for_spec(path)(path)
