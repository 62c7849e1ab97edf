"""``extends`` and ``--set``: turn a spec file and its parents into one document.

Merge rule (the only one): mappings merge key by key, recursively, later wins; lists and
scalars are replaced whole. ``extends`` paths are relative to the file that names them;
parents merge in the order listed, then the file itself, then ``--set`` overrides.

``extends: base:NAME`` names a shared base instead of a path: the Reader finds it (its ``find_base``;
mxc/specfiles.py looks on ``MXC_SPEC_PATH``), and its own relative ``extends`` are relative to it.

Which files ``extends`` may reach is the Reader's decision (the filesystem edge, mxc/specfiles.py,
confines it to the spec's repository): a Reader refuses with ``ReadRefused``, reported at the
``extends`` line that named the file. Here, without any I/O: absolute paths are refused and at
most ``limits.MAX_EXTENDS_FILES`` reads happen per spec (a list naming one file a thousand times,
each naming another a thousand times, would otherwise read a million).
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from typing import Any

from mxc.compiler import limits
from mxc.compiler.errors import SpecError, SpecErrors
from mxc.compiler.loader import Loaded, Path, check_key, decode, load_yaml, parse_value

Reader = Callable[[str], bytes]
"""Returns a file's bytes; raises OSError (FileNotFoundError, ...) when it cannot, ReadRefused when it may not."""

SET_SOURCE = "--set"
BASE_PREFIX = "base:"


class ReadRefused(Exception):
    """A Reader's refusal to read a file (outside the spec's repository, not a regular file, too large)."""

    def __init__(self, message: str, suggestion: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.suggestion = suggestion


def resolve(path: str, read: Reader, overrides: tuple[str, ...] = ()) -> Loaded:
    """Load ``path`` with its ``extends`` chain merged and ``overrides`` applied. ``read`` may have a
    ``find_base(name) -> path`` (raising ReadRefused): without one, ``extends: base:NAME`` is refused."""
    find_base: Callable[[str], str] | None = getattr(read, "find_base", None)
    merged = _load_tree(posixpath.normpath(path), _counted(read), chain=(), referrer=None, find_base=find_base)
    apply_overrides(merged, overrides)
    return merged


def apply_overrides(doc: Loaded, overrides: tuple[str, ...]) -> None:
    """``--set KEY.PATH=VALUE`` on a loaded document (every problem reported at once)."""
    errors: list[SpecError] = []
    for expr in overrides:
        try:
            _apply_override(doc, expr)
        except SpecErrors as exc:
            errors.extend(exc.errors)
    if errors:
        raise SpecErrors(errors)


def _counted(read: Reader) -> Reader:
    reads = 0

    def read_one(path: str) -> bytes:
        nonlocal reads
        reads += 1
        if reads > limits.MAX_EXTENDS_FILES:
            raise ReadRefused(f"more than {limits.MAX_EXTENDS_FILES} files read through extends",
                              "name each base spec once")
        return read(path)

    return read_one


def load_file(path: str, read: Reader, referrer: tuple[str, int] | None = None) -> Loaded:
    """One file, read and parsed (its ``extends`` left as data); a problem reading it is a SpecError
    at ``referrer`` (the ``extends`` line that named it) or at the file itself."""
    file, line = referrer if referrer else (path, None)
    key = "extends" if referrer else ""
    try:
        raw = read(path)
    except ReadRefused as exc:
        raise SpecErrors.one(file, line, key, f"{path}: {exc.message}" if referrer else exc.message,
                             exc.suggestion) from None
    except FileNotFoundError:
        raise SpecErrors.one(
            file, line, key, f"file not found: {path}",
            "paths in 'extends' are relative to the spec that names them; base:NAME names a shared base "
            "on MXC_SPEC_PATH" if referrer else "",
        ) from None
    except OSError as exc:
        what = f"cannot read {path}" if referrer else "cannot read"
        raise SpecErrors.one(file, line, key, f"{what}: {exc.strerror or exc}") from None
    return load_yaml(path, decode(path, raw))


def _parent_path(parent: str, path: str, where: int | None, find_base: Callable[[str], str] | None) -> str:
    """Where an ``extends`` entry of ``path`` points: a shared base found by the Reader, or a path
    relative to ``path``."""
    if parent.startswith(BASE_PREFIX):
        if find_base is None:
            raise SpecErrors.one(path, where, "extends", f"{parent[:120]}: shared bases cannot be read here")
        try:
            return posixpath.normpath(find_base(parent[len(BASE_PREFIX):]))
        except ReadRefused as exc:
            raise SpecErrors.one(path, where, "extends", exc.message, exc.suggestion) from None
    if parent.startswith("/"):
        raise SpecErrors.one(path, where, "extends", f"{parent}: an absolute path",
                             "extends takes paths relative to the spec, inside its repository, or base:NAME "
                             "(a shared base on MXC_SPEC_PATH)")
    return posixpath.normpath(posixpath.join(posixpath.dirname(path), parent))


def _load_tree(path: str, read: Reader, chain: tuple[str, ...], referrer: tuple[str, int] | None,
               find_base: Callable[[str], str] | None = None) -> Loaded:
    if path in chain:
        cycle = " -> ".join((*chain[chain.index(path):], path))
        file, line = referrer or (path, 1)
        raise SpecErrors.one(file, line, "extends", f"extends cycle: {cycle}", "remove one of the links")
    doc = load_file(path, read, referrer)
    parents = doc.data.pop("extends", None)
    if parents is None:
        return doc
    ext_line = doc.lines.get(("extends",), (path, 1))
    listed = isinstance(parents, list)
    if isinstance(parents, str):
        parents = [parents]
    if not isinstance(parents, list) or not all(isinstance(p, str) for p in parents):
        raise SpecErrors.one(path, ext_line[1], "extends", "expected a path or a list of paths")
    base = Loaded({}, {})
    for index, parent in enumerate(parents):
        where = doc.lines.get(("extends", index), ext_line) if listed else ext_line
        target = _parent_path(parent, path, where[1], find_base)
        _merge_into(base, _load_tree(target, read, (*chain, path), where, find_base))
    _merge_into(base, doc)
    return base


def _merge_into(base: Loaded, top: Loaded) -> None:
    base.data = _merge(base.data, top.data)
    for key, where in top.lines.items():
        base.lines[key] = where


def _merge(a: Any, b: Any) -> Any:
    """``b`` (the extending spec) over ``a``. A key ``b`` sets to null removes what ``a`` set (as
    Helm values do): the only way to drop an inherited override or variable."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = dict(a)
        for key, value in b.items():
            if value is None and key in a:
                del out[key]
            else:
                out[key] = _merge(a[key], value) if key in a else value
        return out
    return b


def _apply_override(doc: Loaded, expr: str) -> None:
    key, sep, text = expr.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(parts):
        raise SpecErrors.one(SET_SOURCE, None, key, f"expected KEY.PATH=VALUE, got {expr!r}",
                             "for example --set model.overrides.steps=20")
    if len(parts) > limits.MAX_DEPTH:
        raise SpecErrors.one(SET_SOURCE, None, "", f"a key path deeper than {limits.MAX_DEPTH} levels")
    for part in parts:
        check_key(SET_SOURCE, part)
    value = parse_value(SET_SOURCE, text, tuple(parts))
    node: Any = doc.data
    for depth, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            where = ".".join(parts[: depth + 1])
            raise SpecErrors.one(SET_SOURCE, None, key, f"{where} is a {type(child).__name__}, not a mapping")
        node = child
    if value is None and parts[-1] in node:
        del node[parts[-1]]  # --set KEY=null removes KEY, as null does in an extending spec
        return
    node[parts[-1]] = value
    doc.lines[tuple(parts)] = (SET_SOURCE, 0)


def line_of(doc: Loaded, path: Path) -> tuple[str, int | None]:
    """The file and line of the closest key on ``path`` (the key itself, else its parents)."""
    for end in range(len(path), -1, -1):
        where = doc.lines.get(tuple(path[:end]))
        if where is not None:
            return where[0], (where[1] or None)
    return "", None
