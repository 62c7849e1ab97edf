"""The filesystem edge of the compiler: read spec files, compile, store."""

from __future__ import annotations

from mxc import __version__
from mxc.compiler import Bundle, compile_spec
from mxc.specfiles import SpecFiles


def compile_file(path: str, overrides: tuple[str, ...] = ()) -> Bundle:
    """Compile ``path``; ``extends`` reads only inside its repository (mxc/specfiles.py)."""
    return compile_spec(path, SpecFiles.for_spec(path), overrides, mxc_version=__version__)
