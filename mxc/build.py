"""The filesystem edge of the compiler: read spec files (and the lockfile beside them), compile, store."""

from __future__ import annotations

import json
import os
from pathlib import Path

from mxc import __version__
from mxc.compiler import Bundle, compile_document, compile_spec
from mxc.compiler.check.subject import Lock
from mxc.errors import UserError
from mxc.specfiles import SpecFiles


def compile_file(path: str, overrides: tuple[str, ...] = ()) -> Bundle:
    """Compile ``path``; ``extends`` reads only inside its repository (mxc/specfiles.py). A ``.cue``
    spec goes through the front end ``mxc check`` uses (CUE unifies it with its schema, then the
    same validation), so what check accepts, build builds; both judge XLA flags by the jaxlib of
    the spec's lockfile (``find_lock``)."""
    require_spec_file(path)
    if path.endswith(".cue"):
        from mxc.checking import load_cue

        return compile_document(load_cue(path), path, overrides, mxc_version=__version__, read=SpecFiles.for_spec(path),
                                check_lock=find_lock(path))
    return compile_spec(path, SpecFiles.for_spec(path), overrides, mxc_version=__version__, check_lock=find_lock(path))


def require_spec_file(path: str) -> None:
    """The spec named on the command line is a file: a missing one is one line saying so (exit 2),
    not a problem "in the spec" (there is no spec to have one)."""
    if os.path.isdir(path):
        raise UserError(f"{path} is a directory, not a spec file",
                        "name one spec (mxc build specs/tiny.yaml); mxc check takes directories")
    if not os.path.lexists(path):
        raise UserError(f"no spec file {path}", "write one with: mxc init -o " + path
                        if path.endswith((".yaml", ".yml")) else "mxc init writes a first spec")


def find_lock(spec: str) -> Lock:
    """jaxlib pinned in the spec's lockfile (``lockfiles/<stem>.lock.json`` in a parent directory)."""
    path = Path(spec).resolve()
    name = path.name.split(".")[0]
    for parent in path.parents:
        lock = parent / "lockfiles" / f"{name}.lock.json"
        if lock.is_file():
            try:
                data = json.loads(lock.read_text(encoding="utf-8"))
            except (OSError, ValueError, RecursionError):
                return Lock(str(lock), None)
            packages = (data.get("python") or {}).get("packages") or {}
            version = packages.get("jaxlib") if isinstance(packages, dict) else None
            return Lock(str(lock), version if isinstance(version, str) else None)
    return Lock()
