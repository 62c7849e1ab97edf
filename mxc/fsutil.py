"""Files: atomic writes (a reader sees the old file or the new one, never half of either), and
reads that a hostile directory cannot crash or hang.

Run directories and the store are shared, long-lived and writable by others (a colleague, a
job, a full disk): every reader goes through ``open_regular`` (a FIFO, device or directory in
a file's place is refused at once, never waited on), reads a bounded number of bytes, and
parses JSON with bounded nesting (``json.loads`` alone raises ``RecursionError`` on deep input).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

MAX_JSON_BYTES = 64 << 20  # a record, a preflight or status file: far beyond any real one
MAX_JSON_LINE_BYTES = 1 << 20  # one line of a JSON-lines file
MAX_TEXT_BYTES = 64 << 20  # a stack dump, a crash note, a stage table
MAX_JSON_DEPTH = 64  # nesting of arrays and objects; mxc's own files nest fewer than 10 levels


class UnreadableFile(OSError):
    """A path that is not a regular file, or a file larger than a reader accepts."""


def write_atomic(path: Path, content: str | bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(content.encode() if isinstance(content, str) else content)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def open_regular(path: Path, follow_symlinks: bool = True) -> BinaryIO:
    """``path`` opened for binary reading, if it is a regular file; else ``UnreadableFile``.

    Opening is non-blocking, so a FIFO put where a log or record belongs cannot hang the
    reader; a directory or device is refused before a byte is read.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY | (0 if follow_symlinks else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UnreadableFile(errno.EINVAL, "not a regular file", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded(path: Path, limit: int = MAX_JSON_BYTES) -> bytes:
    """The whole of a regular file of at most ``limit`` bytes; ``UnreadableFile`` when larger."""
    with open_regular(path) as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise UnreadableFile(errno.EFBIG, f"larger than {limit} bytes", str(path))
    return data


def read_text(path: Path, limit: int = MAX_TEXT_BYTES) -> str:
    """A regular file's text, at most its first ``limit`` bytes, invalid UTF-8 replaced."""
    with open_regular(path) as fh:
        return fh.read(limit).decode("utf-8", "replace")


def read_tail(path: Path, limit: int) -> tuple[bytes, int]:
    """The last ``limit`` bytes of a regular file and the offset they start at."""
    with open_regular(path) as fh:
        size = fh.seek(0, os.SEEK_END)
        start = max(0, size - limit)
        fh.seek(start)
        return fh.read(limit), start


def _check_shape(data: Any, max_depth: int) -> None:
    """ValueError when ``data`` nests deeper than ``max_depth`` or holds a string that is not
    valid Unicode (a lone surrogate from ``\\ud800``: printing it would raise later)."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            value.encode("utf-8")  # UnicodeEncodeError is a ValueError
        elif isinstance(value, (dict, list)):
            if depth > max_depth:
                raise ValueError(f"nested deeper than {max_depth} levels")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                if isinstance(key, str):
                    key.encode("utf-8")
                stack.append((item, depth + 1))


def loads(text: str | bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` that fails only with ValueError: also for nesting deeper than ``max_depth``
    (never RecursionError), lone surrogates and integers too long to convert."""
    try:
        data = json.loads(text, strict=False)
    except RecursionError:
        raise ValueError(f"nested deeper than {max_depth} levels") from None
    _check_shape(data, max_depth)
    return data


def read_json(path: Path, limit: int = MAX_JSON_BYTES) -> dict[str, Any] | None:
    """A JSON object, or None where the file is missing, unreadable, too big, too deep or not one."""
    try:
        data = loads(read_bounded(path, limit))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def iter_lines(path: Path, limit: int = MAX_JSON_LINE_BYTES) -> Iterator[bytes]:
    """The lines of a regular file without their newline; a line longer than ``limit`` bytes is
    skipped. Nothing when the path is not a regular file."""
    try:
        fh = open_regular(path)
    except OSError:
        return
    with fh:
        while True:
            line = fh.readline(limit + 1)
            if not line.endswith(b"\n"):
                if len(line) <= limit:  # end of file: a last line without its newline may be whole or torn
                    if line:
                        yield line
                    return
                while line and not line.endswith(b"\n"):  # an overlong line: skip the rest of it
                    line = fh.readline(limit)
                continue
            yield line[:-1]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every complete, valid line of a JSON-lines file another process may be appending to
    (a line being written, a torn, overlong, too deep or binary one is skipped)."""
    out = []
    for line in iter_lines(path):
        try:
            data = loads(line.decode("utf-8", "replace"))
        except ValueError:
            continue
        if isinstance(data, dict):
            out.append(data)
    return out


def mxc_home() -> Path:
    return Path(os.environ.get("MXC_HOME") or Path.home() / ".mxc")
