"""Errors the CLI prints as one line: the user's input (exit 2), or the machine's state (exit 1)."""

from __future__ import annotations

import errno

# A file system that cannot take more: full, out of inodes, over quota, a file size limit, read-only.
_NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})


class UserError(Exception):
    def __init__(self, message: str, suggestion: str = "", code: int = 2) -> None:
        self.suggestion = suggestion
        self.code = code
        super().__init__(message)

    def __str__(self) -> str:
        # Paths and names from the command line may hold anything: one line, no terminal escapes.
        # (Imported here: mxc.compiler loads pydantic and jinja2, and only an error needs it.)
        from mxc.compiler.errors import printable

        text = super().__str__()
        return printable(f"{text} ({self.suggestion})" if self.suggestion else text)



def no_room(exc: BaseException) -> bool:
    """Whether an error says the file system cannot take more (full disk, inodes, quota, size limit)."""
    return isinstance(exc, OSError) and exc.errno in _NO_ROOM


def cannot_write(what: str, exc: OSError) -> UserError:
    """A write that failed (full disk, no inodes left...) as one line and exit 1; the caller has
    already removed what it half wrote."""
    reason = exc.strerror or str(exc)
    hint = "free space or inodes there, then try again; nothing was left half-written" if exc.errno in _NO_ROOM else ""
    return UserError(f"cannot write {what}: {reason}", hint, code=1)
