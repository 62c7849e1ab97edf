"""The filesystem edge of the compiler: read spec files, compile, store."""

from __future__ import annotations

from pathlib import Path

from mxc import __version__
from mxc.compiler import Bundle, compile_spec
from mxc.fsutil import mxc_home


def read_file(path: str) -> bytes:
    return Path(path).read_bytes()


def compile_file(path: str, overrides: tuple[str, ...] = ()) -> Bundle:
    from mxc.compiler.render import cache_templates

    cache_templates(str(mxc_home() / "cache" / f"templates-{__version__}"))
    return compile_spec(path, read_file, overrides, mxc_version=__version__)
