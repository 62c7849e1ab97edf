"""What the rules can still judge in a spec that does not validate.

A spec with a missing image digest used to show that one error; fixed, it showed the inconsistency
behind it (``code.entry.workdir``); fixed again, its XLA flags. Pydantic stops at a section's field
errors before its model checks, and the rules need a validated spec. Here each value an error is
about is set aside (dropped where the schema has a default, an unknown key dropped, a required
value replaced by a stand-in), the rest is validated again without the cross-section checks (they
are listed on their own, all at once, by ``consistency_problems``), and so on until the rest
validates. The rules then run on it, except those that read a value set aside: those say so
(``Checked.not_run``), instead of passing silently.

A problem found on the rest is reported only when it does not touch a value set aside (a missing
``image`` is not news when the image was set aside for its digest), nor comes from a check of a
section holding one (``code`` without ``repo`` is not news when its repo was set aside): a stand-in
must never cause an error of its own.
"""

from __future__ import annotations

import copy
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from mxc.compiler.errors import SpecError
from mxc.compiler.loader import Loaded, Path
from mxc.compiler.resolve import line_of
from mxc.compiler.schema import SECTIONS_ONLY, JobSpec, consistency_problems
from mxc.compiler.validate import Located, located_errors

# Stand-ins for values in error, so that the rest of a spec can be judged: every required field's
# (or an ancestor's), and those whose absence a section's own check refuses (code.repo without
# code.commit). A rule that reads one does not run. tests/test_check_partial.py proves every
# required field has one or an ancestor with a default, and each is valid where it stands.
STAND_INS: dict[Path, Any] = {
    ("schema",): "mxc/v1",
    ("name",): "spec",
    ("image", "ref"): "image",
    ("image", "digest"): "sha256:" + "0" * 64,
    ("code",): {"maxtext_version": "0"},
    ("code", "repo"): "maxtext",
    ("code", "commit"): "0" * 40,
    ("model",): {"model_name": "default"},
    ("model", "model_name"): "default",
}
_ROUNDS = 8  # each round sets aside at least one more value; a spec has few nested levels of checks


@dataclass
class Partial:
    spec: JobSpec | None  # what is left, validated; None when no value could be set aside to get there
    set_aside: list[Path] = field(default_factory=list)
    errors: list[SpecError] = field(default_factory=list)  # problems the full validation could not reach


def validate_sections(data: dict[str, Any]) -> JobSpec:
    """The spec with each section validated and the cross-section check left out (listed apart)."""
    return JobSpec.model_validate(data, context={SECTIONS_ONLY: True})


def touches(a: Path, b: Path) -> bool:
    """One path is the other or inside it."""
    n = min(len(a), len(b))
    return tuple(map(str, a[:n])) == tuple(map(str, b[:n]))


def judge_rest(doc: Loaded, file: str, first: list[Located]) -> Partial:
    """The spec with every erroneous value set aside, and what else is wrong with what is left.
    ``first``: the full validation's errors (already reported)."""
    data = copy.deepcopy(doc.data)
    out = Partial(None)
    seen = {(e.error.key, e.error.message) for e in first}
    errors = first
    for _ in range(_ROUNDS):
        try:
            out.spec = validate_sections(data)
        except ValidationError as exc:
            errors = located_errors(Loaded(data, doc.lines), exc, file)
            _report(out, errors, seen)
        else:
            problems = [_keyed(doc, file, text) for text in consistency_problems(out.spec)]
            _report(out, problems, seen)
            return out
        moved = [p for p in (_set_aside(data, e.path) for e in errors) if p is not None and p not in out.set_aside]
        if not moved:
            return out
        out.set_aside.extend(dict.fromkeys(moved))
    return out


def _report(out: Partial, errors: list[Located], seen: set[tuple[str, str]]) -> None:
    for path, error, checked in errors:
        if (error.key, error.message) in seen or any(touches(path, p) for p in out.set_aside):
            continue
        if checked and any(touches(checked, p) for p in out.set_aside):
            continue
        seen.add((error.key, error.message))
        out.errors.append(error)


def _keyed(doc: Loaded, file: str, text: str) -> Located:
    key, _, message = text.partition(": ")
    path: Path = tuple(key.split("."))
    where, line = line_of(doc, path)
    return Located(path, SpecError(where or file, line, key, message))


# ---------------------------------------------------------------- setting a value aside

def _set_aside(data: dict[str, Any], path: Path) -> Path | None:
    """Drop or stand in for the value at ``path`` (or the nearest enclosing one that can be): the path
    set aside, or None when nothing could be."""
    kinds = _kinds(path)
    for end in range(len(path), 0, -1):
        prefix, kind = path[:end], kinds[end - 1]
        parent = _node(data, prefix[:-1])
        if not isinstance(parent, dict):
            continue
        last = str(prefix[-1])
        stand_in = STAND_INS.get(tuple(map(str, prefix)))
        if stand_in is not None:
            if parent.get(last) != stand_in:
                parent[last] = copy.deepcopy(stand_in)
                return prefix
        elif kind not in ("required", "index") and last in parent:
            del parent[last]
            return prefix
    return None


def _node(data: Any, path: Path) -> Any:
    for part in path:
        if isinstance(data, dict):
            data = data.get(str(part))
        elif isinstance(data, list) and str(part).isdigit() and int(part) < len(data):
            data = data[int(part)]
        else:
            return None
    return data


def _kinds(path: Path) -> list[str]:
    """What each step of ``path`` is in the schema: a field with a default ("optional"), a field without
    ("required"), an entry of a mapping ("key"), an item of a list ("index"), or no field ("unknown")."""
    out: list[str] = []
    annotation: Any = JobSpec
    for part in path:
        model = _model_in(annotation)
        container = _container(annotation)
        if model is not None:
            info = _field(model, str(part))
            if info is None:
                out.append("unknown")
                annotation = None
                continue
            out.append("required" if info.is_required() else "optional")
            annotation = info.annotation
        elif container is not None:
            out.append(container[0])
            annotation = container[1]
        else:
            out.append("unknown")
            annotation = None
    return out


def _field(model: type[BaseModel], name: str) -> FieldInfo | None:
    info = model.model_fields.get(name)
    if info is None:
        info = next((f for f in model.model_fields.values() if f.alias == name), None)
    return info


def _members(annotation: Any) -> list[Any]:
    """``X | None``, ``Optional[X]`` and ``Annotated[X, ...]`` unwrapped to their members."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _members(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for a in typing.get_args(annotation) for m in _members(a)]
    return [annotation]


def _model_in(annotation: Any) -> type[BaseModel] | None:
    return next((m for m in _members(annotation) if isinstance(m, type) and issubclass(m, BaseModel)), None)


def _container(annotation: Any) -> tuple[str, Any] | None:
    for member in _members(annotation):
        origin = typing.get_origin(member)
        if origin is dict:
            return "key", typing.get_args(member)[1]
        if origin is list:
            return "index", typing.get_args(member)[0]
    return None
