"""Sweep files: a cartesian product of spec changes, checked combination by combination.

Format (docs/check.md)::

    matrix: mxc/v1                  # marks the file as a sweep, not a spec
    spec: ../70b.yaml               # optional: the spec it sweeps (a path given to mxc check wins)
    axes:                           # key path -> values; every combination of values is checked
      env.xla_flags.xla_gpu_enable_latency_hiding_scheduler: [true, false]
      model.overrides.per_device_batch_size: [1, 2, 4]
      env.vars.NCCL_ALGO: [Ring, Tree, null]      # null removes the key
    exclude:                        # combinations matching all pairs of an entry are dropped
      - {model.overrides.per_device_batch_size: 4, env.vars.NCCL_ALGO: Tree}
    include:                        # extra combinations, checked as given
      - {model.overrides.quantization: fp8}

Combinations are numbered from 1 in product order (the first axis varies slowest), then
the ``include`` entries.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from mxc.compiler.errors import SpecError, SpecErrors
from mxc.compiler.loader import Loaded, Path
from mxc.compiler.resolve import line_of

MATRIX_MARK = "mxc/v1"
_TOP = {"matrix", "spec", "axes", "exclude", "include", "description"}


@dataclass(frozen=True)
class Combination:
    number: int
    changes: tuple[tuple[Path, Any], ...]  # key path -> value (None removes the key)
    lines: dict[Path, tuple[str, int]]  # where each changed key is written in the matrix file

    def label(self) -> str:
        return ", ".join(f"{'.'.join(map(str, k))}={_show(v)}" for k, v in self.changes)


def _show(value: Any) -> str:
    if value is None:
        return "(removed)"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass(frozen=True)
class Matrix:
    file: str
    spec: str | None
    axes: tuple[tuple[Path, tuple[Any, ...], int], ...]  # path, values, line
    exclude: tuple[dict[Path, Any], ...]
    include: tuple[tuple[dict[Path, Any], int], ...]

    @property
    def size(self) -> int:
        return len(expand(self))


def is_matrix(doc: Loaded) -> bool:
    return "matrix" in doc.data and "schema" not in doc.data


def parse_matrix(doc: Loaded, file: str) -> Matrix:
    """Structure check of a loaded sweep file; errors name its lines."""
    errors: list[SpecError] = []
    data = doc.data

    def err(path: Path, message: str, hint: str = "") -> None:
        errors.append(SpecError(file, line_of(doc, path)[1], ".".join(map(str, path)), message, hint))

    if data.get("matrix") != MATRIX_MARK:
        err(("matrix",), f"expected 'matrix: {MATRIX_MARK}'")
    for key in data:
        if key not in _TOP:
            err((key,), "unknown key", f"allowed: {', '.join(sorted(_TOP))}")
    spec = data.get("spec")
    if spec is not None and not isinstance(spec, str):
        err(("spec",), "expected a path")
    axes_raw = data.get("axes") or {}
    axes: list[tuple[Path, tuple[Any, ...], int]] = []
    if not isinstance(axes_raw, dict):
        err(("axes",), "expected a mapping of key.path: [values]")
        axes_raw = {}
    for key, values in axes_raw.items():
        path = _path(key)
        if not path:
            err(("axes", key), "expected a dotted key path such as env.xla_flags.xla_foo")
        elif not isinstance(values, list) or not values:
            err(("axes", key), "expected a non-empty list of values")
        elif not all(_scalar(v) for v in values):
            err(("axes", key), "values must be scalars (or null to remove the key)")
        else:
            axes.append((path, tuple(values), doc.lines[("axes", key)][1]))
    entries: dict[str, list[tuple[dict[Path, Any], int]]] = {"exclude": [], "include": []}
    for section in entries:
        raw = data.get(section) or []
        if not isinstance(raw, list):
            err((section,), "expected a list of {key.path: value} mappings")
            continue
        for i, entry in enumerate(raw):
            if not isinstance(entry, dict) or not entry or not all(_path(k) and _scalar(v) for k, v in entry.items()):
                err((section, i), "expected a mapping of key.path: scalar")
                continue
            entries[section].append(({_path(k): v for k, v in entry.items()}, doc.lines[(section, i)][1]))
    if not axes and not entries["include"]:
        err(("axes",), "the matrix has no combinations", "add axes or include entries")
    if errors:
        raise SpecErrors(errors)
    return Matrix(file, spec, tuple(axes), tuple(e for e, _ in entries["exclude"]), tuple(entries["include"]))


def _path(key: object) -> Path:
    if not isinstance(key, str) or not key or any(not part for part in key.split(".")):
        return ()
    return tuple(key.split("."))


def _scalar(value: object) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def expand(m: Matrix) -> list[Combination]:
    combos: list[Combination] = []
    number = 0
    values = [vals for _, vals, _ in m.axes]
    for chosen in itertools.product(*values) if m.axes else ():
        changes = tuple((path, v) for (path, _, _), v in zip(m.axes, chosen, strict=True))
        if any(all(dict(changes).get(k, _MISSING) == v for k, v in ex.items()) for ex in m.exclude):
            continue
        number += 1
        lines = {path: (m.file, line) for path, _, line in m.axes}
        combos.append(Combination(number, changes, lines))
    for entry, line in m.include:
        number += 1
        combos.append(Combination(number, tuple(entry.items()), {p: (m.file, line) for p in entry}))
    return combos


_MISSING = object()


def apply_changes(data: dict[str, Any], changes: tuple[tuple[Path, Any], ...]) -> dict[str, Any]:
    """A copy of ``data`` with ``changes`` applied; only the mappings on changed paths are copied
    (each once), the rest is shared with ``data``, which is never modified."""
    root = dict(data)
    copied: dict[Path, dict[str, Any]] = {(): root}
    for path, value in changes:
        node = root
        for depth in range(1, len(path)):
            prefix = path[:depth]
            child = copied.get(prefix)
            if child is None:
                old = node.get(str(path[depth - 1]))
                child = dict(old) if isinstance(old, dict) else {}
                node[str(path[depth - 1])] = child
                copied[prefix] = child
            node = child
        if value is None:
            node.pop(str(path[-1]), None)
        else:
            node[str(path[-1])] = value
    return root
