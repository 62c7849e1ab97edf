"""YAML text -> plain data plus the line of every key.

PyYAML alone is not strict enough for reviewed specs: it keeps the last of two duplicate
keys (a reviewer reads one value, the run uses another), expands aliases without limit
(alias bombs) and reads ``time: 02:00:00`` as the integer 7200. This loader composes the
node tree, rejects duplicates and aliases, keeps sexagesimal and date-like scalars as
strings, and remembers where each key stood so later errors can say ``file:line``.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Any

import yaml

from mxc.compiler.errors import SpecError, SpecErrors

Path = tuple[str | int, ...]


@dataclass
class Loaded:
    """A parsed document: ``data`` and, for each key path, the file and line it came from."""

    data: dict[str, Any]
    lines: dict[Path, tuple[str, int]] = field(default_factory=dict)


class _StrictLoader(yaml.SafeLoader):
    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.MarkedYAMLError(
                problem="YAML aliases (*name) are not allowed in mxc specs", problem_mark=event.start_mark
            )
        node: yaml.Node | None = super().compose_node(parent, index)
        assert node is not None
        return node


def decode(name: str, raw: bytes) -> str:
    """Strict UTF-8 with a line number, so a stray Latin-1 byte is not silently mangled."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise SpecErrors.one(
            name, line, "", f"not valid UTF-8 (byte 0x{raw[exc.start]:02x})", "save the file as UTF-8"
        ) from None


def load_yaml(name: str, text: str) -> Loaded:
    """Parse one YAML document that must be a mapping."""
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = exc.problem or exc.context or "invalid YAML"
        hint = "use 'extends' to share settings between specs" if "alias" in problem else ""
        raise SpecErrors.one(name, line, "", f"YAML: {problem}", hint) from None
    except yaml.YAMLError as exc:
        raise SpecErrors.one(name, None, "", f"YAML: {exc}") from None
    finally:
        loader.dispose()
    if node is None:
        raise SpecErrors.one(name, 1, "", "the spec is empty", "start with 'schema: mxc/v1'")
    if not isinstance(node, yaml.MappingNode):
        raise SpecErrors.one(name, node.start_mark.line + 1, "", "expected a mapping of keys at the top level")
    lines: dict[Path, tuple[str, int]] = {}
    errors: list[SpecError] = []
    data = _build(node, (), name, lines, errors, loader)
    if errors:
        raise SpecErrors(errors)
    assert isinstance(data, dict)
    return Loaded(data, lines)


def _build(
    node: yaml.Node,
    path: Path,
    name: str,
    lines: dict[Path, tuple[str, int]],
    errors: list[SpecError],
    loader: _StrictLoader,
) -> Any:
    lines[path] = (name, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = _scalar(key_node, loader)
            line = key_node.start_mark.line + 1
            dotted = ".".join(str(p) for p in (*path, key))
            if not isinstance(key, str):
                errors.append(SpecError(name, line, dotted, f"keys must be strings, got {key!r}"))
                continue
            if key in out:
                first = lines[(*path, key)][1]
                errors.append(
                    SpecError(name, line, dotted, f"duplicate key (first defined on line {first})",
                              "keep one of them")
                )
                continue
            out[key] = _build(value_node, (*path, key), name, lines, errors, loader)
            lines[(*path, key)] = (name, line)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_build(item, (*path, i), name, lines, errors, loader) for i, item in enumerate(node.value)]
    return _scalar(node, loader)


def _scalar(node: yaml.Node, loader: _StrictLoader) -> Any:
    if not isinstance(node, yaml.ScalarNode):
        return None  # complex keys; reported by the caller as non-string
    value = loader.construct_object(node, deep=True)
    if isinstance(value, (_dt.date, _dt.datetime)):
        return node.value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and ":" in node.value:
        return node.value  # YAML 1.1 sexagesimal: "02:00:00" is a time, not 7200
    return value


def parse_value(name: str, text: str) -> Any:
    """A ``--set`` value, read with the same rules as a spec (so ``20`` is an int, ``a b`` a string)."""
    if text.strip() == "":
        return ""
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
    except yaml.YAMLError:
        return text  # not YAML: take it literally
    finally:
        loader.dispose()
    if node is None:
        return None
    errors: list[SpecError] = []
    value = _build(node, (), name, {}, errors, loader)
    if errors:
        raise SpecErrors(errors)
    return value
