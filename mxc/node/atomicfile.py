"""Writing a file that others read at any moment: a temporary file beside it, then a rename.

mxc on the submitting host and the batch side on another node read what the ranks write
(``preflight.json``, crash notes) over a shared file system while they are being written; a
rename is atomic there, a write is not, so a reader sees the old file or the whole new one.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from pathlib import Path
from typing import Any


def write_text(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically (creating its directory); the temp file never stays behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    # os.open with 0o666 honours the umask, as the shell's ">" did (mkstemp would make it 0600)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_json(path: Path, data: Any) -> None:
    """``data`` as one line of JSON, atomically."""
    write_text(path, json.dumps(data) + "\n")
