"""The filesystem edge of the compiler: read spec files, compile, store."""

from __future__ import annotations

from mxc import __version__
from mxc.compiler import Bundle, compile_document, compile_spec
from mxc.specfiles import SpecFiles


def compile_file(path: str, overrides: tuple[str, ...] = ()) -> Bundle:
    """Compile ``path``; ``extends`` reads only inside its repository (mxc/specfiles.py). A ``.cue``
    spec goes through the front end ``mxc check`` uses (CUE unifies it with its schema, then the
    same validation), so what check accepts, build builds."""
    if path.endswith(".cue"):
        from mxc.checking import load_cue

        return compile_document(load_cue(path), path, overrides, mxc_version=__version__, read=SpecFiles.for_spec(path))
    return compile_spec(path, SpecFiles.for_spec(path), overrides, mxc_version=__version__)
