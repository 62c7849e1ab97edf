"""``mxc build --locked``: compile with the lockfile, refusing anything unpinned or disagreeing.

Every problem is one line naming the item (``file[:line]: key: message``) and all of them
are reported together, with exit 2 and nothing written: a missing or stale lock, a lock of
another spec or another mxc version, a requirements file changed since it was locked or
holding an unpinned line, and every spec pin that disagrees with the lock.
"""

from __future__ import annotations

from pathlib import Path

from mxc import __version__
from mxc.compiler import Bundle, compile_spec
from mxc.compiler.errors import SpecError, SpecErrors
from mxc.compiler.loader import decode
from mxc.compiler.lockfile import Lock, parse_lock
from mxc.compiler.resolve import ReadRefused
from mxc.errors import UserError
from mxc.lock.paths import lock_path, project_root, relative, shown
from mxc.lock.requirements import parse, sha256_file
from mxc.specfiles import SpecFiles, read_spec

RELOCK = "run: mxc lock {spec}, then review the lockfile diff"


def environment_problems(spec: Path, lock: Lock, name: str, from_image: bool = False) -> list[SpecError]:
    """What the lock says about the world outside the spec, checked against this checkout and this mxc.
    ``from_image`` (code.from_image): the image digest pins the Python environment, so a lock may name none."""
    hint = RELOCK.format(spec=spec)
    root = project_root(spec)
    problems: list[SpecError] = []
    if lock.spec != relative(spec, root):
        problems.append(SpecError(name, None, "spec", f"this lock belongs to {lock.spec}, not {relative(spec, root)}",
                                  "each spec has its own lock (by file name)"))
    if lock.mxc_version != __version__:
        problems.append(SpecError(name, None, "mxc_version", f"locked with mxc {lock.mxc_version}, this is mxc "
                                  f"{__version__} (bundles it renders differ)", hint))
    if lock.python is None:
        if from_image:
            return problems
        problems.append(SpecError(name, None, "python", "not pinned: the lock has no Python requirements", hint))
        return problems
    req = root / lock.python.requirements
    if not req.is_file():
        problems.append(SpecError(name, None, "python.requirements", f"{lock.python.requirements} does not exist", hint))
        return problems
    actual = sha256_file(req)
    if actual != lock.python.sha256:
        problems.append(SpecError(name, None, "python.sha256",
                                  f"{lock.python.requirements} changed since it was locked (sha256 {actual[:12]}..., "
                                  f"the lock has {lock.python.sha256[:12]}...)", hint))
    _, unpinned = parse(req.read_text("utf-8"))
    for line, message in unpinned:
        problems.append(SpecError(shown(req), line, "python", message, "pin it: python tools/pin_requirements.py"))
    return problems


def load_lock(spec: Path, lockfile: Path | None = None) -> tuple[Path, Lock]:
    path = lockfile or lock_path(spec)
    try:
        raw = read_spec(str(path))  # a regular file, bounded, like a spec
    except FileNotFoundError:
        raise UserError(f"--locked: no lockfile {shown(path)} for {spec}", f"create it: mxc lock {spec}") from None
    except ReadRefused as exc:
        raise SpecErrors.one(shown(path), None, "", exc.message, exc.suggestion) from None
    return path, parse_lock(shown(path), decode(shown(path), raw))


def compile_locked(spec: str, overrides: tuple[str, ...] = (), lockfile: str | None = None) -> Bundle:
    """The bundle of ``spec`` with its lock applied; SpecErrors listing every unpinned or mismatching item."""
    spec_path = Path(spec)
    path, lock = load_lock(spec_path, Path(lockfile) if lockfile else None)
    try:
        bundle = compile_spec(spec, SpecFiles.for_spec(spec), overrides, mxc_version=__version__, lock=(shown(path), lock))
    except SpecErrors as exc:
        raise SpecErrors([*environment_problems(spec_path, lock, shown(path)), *exc.errors]) from None
    problems = environment_problems(spec_path, lock, shown(path), from_image=bundle.spec.code.from_image)
    if problems:
        raise SpecErrors(problems)
    return bundle
