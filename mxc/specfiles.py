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

Shared bases: ``extends: base:cuda.yaml`` names a file on the search path the user sets outside any
spec, ``MXC_SPEC_PATH`` (directories separated by ``:``, searched in order, like ``PATH``), so a team's
bases serve specs in every repository. Each directory on it is a root like the repository: a file
is read only when its real path is inside one (a symlink out of the directory is refused), regular,
bounded. The name itself is relative, without ``..``, a ``.yaml``/``.yml`` file. What a base holds
is merged into the resolved spec, so it is part of the bundle (``spec.json``) and of its hash; where
it was found is not (a bundle holds no build-machine path).
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from mxc.compiler.limits import MAX_FILE_BYTES
from mxc.compiler.resolve import ReadRefused

SPEC_PATH_VARIABLE = "MXC_SPEC_PATH"
BASE_PREFIX = "base:"
_BASE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*\.ya?ml$")
CONFINEMENT_HINT = ("extends, model.config_file and a sweep's spec: reach only files of the spec's git work tree "
                    "(else of its directory) and of the directories of MXC_SPEC_PATH")


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


def spec_path() -> tuple[Path, ...]:
    """The directories of ``MXC_SPEC_PATH``, in order (empty entries skipped), as real paths."""
    value = os.environ.get(SPEC_PATH_VARIABLE, "")
    return tuple(Path(os.path.realpath(os.path.expanduser(d))) for d in value.split(os.pathsep) if d.strip())


class SpecFiles:
    """A compiler Reader confined to ``root`` (``repository_of`` the file whose references it reads)
    and to the directories of the shared-base search path ``bases``."""

    def __init__(self, root: Path, bases: tuple[Path, ...] = ()) -> None:
        self.root = Path(os.path.realpath(root))
        self.bases = tuple(Path(os.path.realpath(b)) for b in bases)

    @classmethod
    def for_spec(cls, path: str | Path) -> SpecFiles:
        return cls(repository_of(path), spec_path())

    def find_base(self, name: str) -> str:
        """``extends: base:NAME``: the path of NAME in the first directory of MXC_SPEC_PATH that has it."""
        shown = name[:120]
        if not _BASE_NAME.match(name) or ".." in name.split("/"):
            raise ReadRefused(f"'{BASE_PREFIX}{shown}' is not a base name",
                              "a .yaml file name relative to a directory of MXC_SPEC_PATH, without '..', "
                              "e.g. base:cuda.yaml or base:team/cuda.yaml")
        if not self.bases:
            raise ReadRefused(f"'{BASE_PREFIX}{shown}': {SPEC_PATH_VARIABLE} is not set",
                              f"export {SPEC_PATH_VARIABLE}=/path/to/shared/specs (directories, ':' between them; "
                              "docs/spec-reference.md#shared-bases)")
        for directory in self.bases:
            candidate = directory / name
            if os.path.lexists(candidate):
                return str(candidate)
        raise ReadRefused(f"'{BASE_PREFIX}{shown}' is in no directory of {SPEC_PATH_VARIABLE} "
                          f"({os.pathsep.join(str(b) for b in self.bases)})",
                          "check the name, or add the directory that holds it to MXC_SPEC_PATH")

    def __call__(self, path: str) -> bytes:
        real = os.path.realpath(path)
        if not any(_within(real, str(root)) for root in (self.root, *self.bases)):
            where = f" or {SPEC_PATH_VARIABLE}" if self.bases else ""
            raise ReadRefused(f"outside the spec's repository {self.root}{where}", CONFINEMENT_HINT)
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
