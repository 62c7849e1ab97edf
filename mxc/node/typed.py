"""JSON data -> the node program's dataclasses, checked, without pydantic.

mxc validates the same files with pydantic (``TypeAdapter`` over these very dataclasses); the node
program has only the standard library, so this reads the dataclasses' own annotations (strings,
thanks to ``from __future__ import annotations``) and checks every value against them. It knows
exactly the annotation forms the package uses: ``str``, ``int``, ``float``, ``bool``, ``Any``,
``X | None``, ``list[X]``, ``tuple[X, Y]``, ``Literal['a', 'b']`` and dataclasses of the same module.
Unknown keys, missing keys and wrong types are errors: a file that does not match is never guessed at.
"""

from __future__ import annotations

import ast
import dataclasses
import sys
from typing import Any, TypeVar

T = TypeVar("T")


class InvalidData(ValueError):
    """The data does not match the dataclass; the message names the key path."""


def from_dict(cls: type[T], data: Any, where: str = "") -> T:
    """An instance of dataclass ``cls`` built from ``data`` (a dict from JSON), checked."""
    if not isinstance(data, dict):
        raise InvalidData(f"{where or cls.__name__}: expected an object, got {type(data).__name__}")
    names = _dataclass_names(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    extra = sorted(set(data) - set(known))
    if extra:
        raise InvalidData(f"{_join(where, extra[0])}: unknown key")
    values: dict[str, Any] = {}
    for name, f in known.items():
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise InvalidData(f"{_join(where, name)}: missing")
            continue
        values[name] = _convert(str(f.type), data[name], _join(where, name), names)
    return cls(**values)


def to_dict(value: Any) -> dict[str, Any]:
    """The JSON-ready form of a dataclass instance (tuples become lists, as JSON has them)."""
    data: dict[str, Any] = dataclasses.asdict(value)
    return data


def to_compact_dict(value: Any) -> dict[str, Any]:
    """``to_dict``, leaving out each field at its plain default (``x: str | None = None``): a field
    added to a format with a default then changes no existing document (run.json, and so no bundle
    hash); ``from_dict`` fills it back in. Fields with a default_factory are always written."""
    out: dict[str, Any] = _compact(value)
    return out


def _compact(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _compact(getattr(value, f.name)) for f in dataclasses.fields(value)
                if f.default is dataclasses.MISSING or getattr(value, f.name) != f.default}
    if isinstance(value, (list, tuple)):
        return [_compact(v) for v in value]
    if isinstance(value, dict):
        return {k: _compact(v) for k, v in value.items()}
    return value


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _dataclass_names(cls: type) -> dict[str, type]:
    module = sys.modules[cls.__module__]
    return {name: obj for name, obj in vars(module).items() if isinstance(obj, type) and dataclasses.is_dataclass(obj)}


def _split_top(text: str) -> list[str]:
    """``a, b[c, d], e`` -> ``['a', 'b[c, d]', 'e']`` (commas at bracket depth 0 only)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return [p for p in parts if p]


def _convert(hint: str, value: Any, where: str, names: dict[str, type]) -> Any:
    hint = hint.strip()
    alternatives = _split_union(hint)
    if len(alternatives) > 1:
        if value is None and "None" in alternatives:
            return None
        errors = []
        for alternative in alternatives:
            if alternative == "None":
                continue
            try:
                return _convert(alternative, value, where, names)
            except InvalidData as exc:
                errors.append(str(exc))
        raise InvalidData(errors[0] if len(errors) == 1 else f"{where}: expected {hint}, got {value!r:.80}")
    if hint == "Any":
        return value
    if hint == "None":
        if value is not None:
            raise InvalidData(f"{where}: expected null")
        return None
    if hint in _SCALARS:
        return _scalar(hint, value, where)
    if hint.startswith("list[") and hint.endswith("]"):
        if not isinstance(value, list):
            raise InvalidData(f"{where}: expected a list, got {type(value).__name__}")
        inner = hint[5:-1]
        return [_convert(inner, item, f"{where}[{i}]", names) for i, item in enumerate(value)]
    if hint.startswith("tuple[") and hint.endswith("]"):
        items = _split_top(hint[6:-1])
        if not isinstance(value, (list, tuple)) or len(value) != len(items):
            raise InvalidData(f"{where}: expected a list of {len(items)} items")
        return tuple(_convert(h, v, f"{where}[{i}]", names) for i, (h, v) in enumerate(zip(items, value)))
    if hint.startswith("Literal[") and hint.endswith("]"):
        allowed = [ast.literal_eval(p) for p in _split_top(hint[8:-1])]
        if value not in allowed or type(value) is not type(allowed[0]):
            raise InvalidData(f"{where}: expected one of {allowed}, got {value!r:.80}")
        return value
    if hint in names:
        return from_dict(names[hint], value, where)
    raise InvalidData(f"{where}: annotation {hint!r} is not one this reader knows")  # a bug in the package


def _split_union(hint: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(hint):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "|" and depth == 0:
            parts.append(hint[start:i].strip())
            start = i + 1
    parts.append(hint[start:].strip())
    return parts


_SCALARS = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,)}


def _scalar(hint: str, value: Any, where: str) -> Any:
    wanted = _SCALARS[hint]
    if isinstance(value, bool) and hint != "bool":  # JSON true is not a number here
        raise InvalidData(f"{where}: expected {hint}, got a boolean")
    checked: Any = value
    if not isinstance(checked, wanted):
        raise InvalidData(f"{where}: expected {hint}, got {type(value).__name__}")
    return float(value) if hint == "float" else value
