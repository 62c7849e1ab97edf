"""YAML text -> plain data plus the line of every key.

PyYAML alone is not strict enough for reviewed specs: it keeps the last of two duplicate
keys (a reviewer reads one value, the run uses another), expands aliases without limit
(alias bombs) and reads ``time: 02:00:00`` as the integer 7200. This loader composes the
node tree, rejects duplicates and aliases, keeps sexagesimal and date-like scalars as
strings, and remembers where each key stood so later errors can say ``file:line``.

It also treats the text as hostile: every way PyYAML (or Python below it) could crash, hang
or be fooled ends as a ``SpecError`` instead. Sizes are bounded (``limits.py``: file, depth,
number of values, string and key length, integer digits); tags are refused (``!x``,
``!!python/...``: only ``!!str`` is plain YAML a reviewer can read); so are control
characters in values (tab and newline excepted) and keys, lone surrogates, non-finite numbers,
and characters that make YAML see a line break where an editor or a diff view shows none
(a lone CR, NEL, U+2028/U+2029) or that reorder what a reviewer sees (bidi controls).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from mxc.compiler import limits
from mxc.compiler.errors import SpecError, SpecErrors

Path = tuple[str | int, ...]

STR_TAG = "tag:yaml.org,2002:str"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_VALUE_TAG = "tag:yaml.org,2002:value"
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
# Longer numbers are refused before PyYAML converts them (a 5,000-digit integer breaks int(),
# and a long sexagesimal 1:2:3:... builds a huge integer by repeated multiplication).
_MAX_NUMBER_CHARS = 80

# In the text itself: what PyYAML refuses anyway (C0 but tab/LF/CR, DEL, C1, surrogates,
# U+FFFE/U+FFFF), what it reads as a line break but editors and diffs do not (NEL, U+2028,
# U+2029, a CR not followed by LF), and bidi controls ("Trojan Source").
_BAD_TEXT = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff\u2028\u2029\u202a-\u202e\u2066-\u2069]|\r(?!\n)"
)
# In a string value: control characters but tab and newline, and lone surrogates.
_BAD_VALUE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
# In a key: any control character.
_BAD_KEY = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


@dataclass
class Loaded:
    """A parsed document: ``data`` and, for each key path, the file and line it came from."""

    data: dict[str, Any]
    lines: dict[Path, tuple[str, int]] = field(default_factory=dict)


class _BadValue(Exception):
    """A scalar the loader will not take; becomes a SpecError at its line."""

    def __init__(self, message: str, suggestion: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.suggestion = suggestion


class _RefusedYAML(yaml.MarkedYAMLError):
    """Valid YAML that mxc refuses (aliases, tags, too deep, too many values), told apart from a
    syntax error: a ``--set`` value that is not YAML is taken literally, a refused one is an error."""


def _problem(mark: Any, problem: str) -> yaml.MarkedYAMLError:
    return _RefusedYAML(problem=problem, problem_mark=mark)


class _StrictLoader(yaml.SafeLoader):
    """Composes nodes with aliases and tags refused and depth and size bounded (the composer
    recurses once per level: 5,000 brackets would overflow Python's stack)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0
        self.values = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent):
            raise _problem(event.start_mark, "YAML aliases (*name) are not allowed in mxc specs")
        tag = getattr(event, "tag", None)
        if tag is not None and tag != STR_TAG:
            shown = tag.replace("tag:yaml.org,2002:", "!!")
            raise _problem(event.start_mark, f"tags such as '{shown[:40]}' are not allowed in mxc specs")
        self.values += 1
        if self.values > limits.MAX_VALUES:
            raise _problem(event.start_mark, f"more than {limits.MAX_VALUES:,} keys, items and values in one file")
        self.depth += 1
        try:
            if self.depth > limits.MAX_DEPTH:
                raise _problem(event.start_mark, f"nested deeper than {limits.MAX_DEPTH} levels")
            node: yaml.Node | None = super().compose_node(parent, index)
        finally:
            self.depth -= 1
        assert node is not None
        return node


def _line_at(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def _char_name(char: str) -> str:
    return f"U+{ord(char):04X}"


def decode(name: str, raw: bytes) -> str:
    """Strict UTF-8 with a line number, so a stray Latin-1 byte is not silently mangled."""
    if len(raw) > limits.MAX_FILE_BYTES:
        raise SpecErrors.one(name, None, "", f"larger than {limits.MAX_FILE_BYTES:,} bytes ({len(raw):,})",
                             "a spec is a few kilobytes; see limits in docs/spec-reference.md")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise SpecErrors.one(
            name, line, "", f"not valid UTF-8 (byte 0x{raw[exc.start]:02x})", "save the file as UTF-8"
        ) from None


def check_text(name: str, text: str) -> None:
    """Refuse text whose size or characters the YAML reader should never see (see the module doc)."""
    if len(text) > limits.MAX_FILE_BYTES:
        raise SpecErrors.one(name, None, "", f"longer than {limits.MAX_FILE_BYTES:,} characters",
                             "a spec is a few kilobytes; see limits in docs/spec-reference.md")
    bad = _BAD_TEXT.search(text)
    if bad is None:
        return
    char = bad.group()[0]
    if char in "\r\x85\u2028\u2029":
        what, hint = f"a line break YAML sees but editors may not ({_char_name(char)})", "use plain newlines (LF or CRLF)"
    elif "\u202a" <= char <= "\u2069":
        what, hint = f"a bidirectional control character ({_char_name(char)})", "it reorders what a reviewer sees"
    else:
        what, hint = f"control character {_char_name(char)}", "a spec is plain text: remove it"
    raise SpecErrors.one(name, _line_at(text, bad.start()), "", f"{what} is not allowed in a spec", hint)


# Constructs PyYAML reports where it gave up looking for their end, a line or more after the
# mistake: the error is shown where they start (the context mark), with where the parser stopped.
_UNCLOSED = {
    "while scanning a simple key": ("a key without ':' (or a line that is not 'key: value')",
                                    "add ': VALUE', or quote the line"),
    "while scanning a quoted scalar": ("a quoted string that is never closed", "close the quote"),
    "while parsing a flow mapping": ("a '{' mapping that is never closed", "close it with '}', or write it as a block"),
    "while parsing a flow sequence": ("a '[' list that is never closed", "close it with ']', or write it as a block"),
    "while scanning a block scalar": ("a '|' or '>' text block that cannot be read", "indent its lines under the key"),
}


def yaml_error(name: str, exc: yaml.MarkedYAMLError) -> SpecErrors:
    """A YAML syntax error as one SpecError with line and column (1-based) where the mistake is."""
    problem = exc.problem or exc.context or "invalid YAML"
    mark, context = exc.problem_mark, exc.context_mark
    unclosed = _UNCLOSED.get(exc.context or "")
    if unclosed and context is not None and mark is not None and (context.line, context.column) < (mark.line, mark.column):
        what, hint = unclosed
        return SpecErrors.one(name, context.line + 1, "", f"YAML: {what} ({problem} at line {mark.line + 1}, column "
                              f"{mark.column + 1})", hint, column=context.column + 1)
    mark = mark or context
    hint = "use 'extends' to share settings between specs" if "alias" in problem else ""
    if problem.startswith("tags such as"):
        hint = "quote the value to make it a string"
    elif "cannot start any token" in problem and "\\t" in problem:
        hint = "indent with spaces, not tabs"
    elif problem == "mapping values are not allowed here":
        hint = "a ': ' inside a value: quote the value, or fix the indentation of this key"
    line = mark.line + 1 if mark is not None else None
    return SpecErrors.one(name, line, "", f"YAML: {problem}", hint, column=mark.column + 1 if mark is not None else None)


def load_yaml(name: str, text: str) -> Loaded:
    """Parse one YAML document that must be a mapping."""
    check_text(name, text)
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        raise yaml_error(name, exc) from None
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


def _dotted(path: Path) -> str:
    return ".".join(str(p) for p in path)


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
            line = key_node.start_mark.line + 1
            try:
                key = _key(key_node, loader)
            except _BadValue as exc:
                errors.append(SpecError(name, line, _dotted(path), exc.message, exc.suggestion))
                continue
            dotted = _dotted((*path, key))
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
    try:
        return _scalar(node, loader)
    except _BadValue as exc:
        errors.append(SpecError(name, node.start_mark.line + 1, _dotted(path), exc.message, exc.suggestion))
        return None


def _key(node: yaml.Node, loader: _StrictLoader) -> str:
    if not isinstance(node, yaml.ScalarNode):
        raise _BadValue("keys must be strings, got a mapping or list as a key")
    if node.tag == _MERGE_TAG:
        raise _BadValue("YAML merge keys (<<) are not allowed in mxc specs", "use 'extends' to share settings")
    key = _scalar(node, loader, check=False)
    if not isinstance(key, str):
        raise _BadValue(f"keys must be strings, got {key!r}", "quote the key")
    _check_key(key)
    return key


def _check_key(key: str) -> None:
    if len(key) > limits.MAX_KEY_CHARS:
        raise _BadValue(f"a key longer than {limits.MAX_KEY_CHARS} characters")
    bad = _BAD_KEY.search(key)
    if bad:
        raise _BadValue(f"a key with control character {_char_name(bad.group())}: {key!r}")


def _scalar(node: yaml.Node, loader: _StrictLoader, check: bool = True) -> Any:
    assert isinstance(node, yaml.ScalarNode)
    if len(node.value) > limits.MAX_STRING_CHARS:
        raise _BadValue(f"a value longer than {limits.MAX_STRING_CHARS:,} characters")
    if node.tag in (_VALUE_TAG, _TIMESTAMP_TAG):  # "=" (YAML 1.1's value key) and dates stay the text they are
        return check_scalar(node.value)
    if node.tag in (_INT_TAG, _FLOAT_TAG) and len(node.value) > _MAX_NUMBER_CHARS:
        raise _BadValue(f"a number written with more than {_MAX_NUMBER_CHARS} characters",
                       f"integers have at most {limits.MAX_INT_DIGITS} digits")
    try:
        value = loader.construct_object(node, deep=True)
    except (yaml.YAMLError, ValueError, KeyError, TypeError, OverflowError):
        raise _BadValue("YAML: a value that cannot be read", "quote it to make it a string") from None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and ":" in node.value:
        return node.value  # YAML 1.1 sexagesimal: "02:00:00" is a time, not 7200
    return check_scalar(value) if check else value


def check_scalar(value: Any) -> Any:
    """``value`` when a spec may hold it, else ``_BadValue``; shared by YAML, ``--set`` and JSON input."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        if value.bit_length() > 4 * limits.MAX_INT_DIGITS or len(str(abs(value))) > limits.MAX_INT_DIGITS:
            raise _BadValue(f"an integer with more than {limits.MAX_INT_DIGITS} digits")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _BadValue(f"expected a finite number, got {value!r}")
        return value
    if isinstance(value, str):
        if len(value) > limits.MAX_STRING_CHARS:
            raise _BadValue(f"a value longer than {limits.MAX_STRING_CHARS:,} characters")
        bad = _BAD_VALUE.search(value)
        if bad:
            what = "a lone surrogate" if "\ud800" <= bad.group() <= "\udfff" else "control character"
            raise _BadValue(f"{what} {_char_name(bad.group())} in a value: {value[:80]!r}",
                           "only tab and newline may appear in text")
        return value
    raise _BadValue(f"unsupported value of type {type(value).__name__}")


def parse_value(name: str, text: str, path: Path = ()) -> Any:
    """A ``--set`` value, read with the same rules as a spec (so ``20`` is an int, ``a b`` a string);
    errors name ``path`` (the key being set) and no line."""
    if text.strip() == "":
        return ""
    errors: list[SpecError] = []
    value: Any = text  # not YAML: take it literally
    loader = _StrictLoader(text) if _BAD_TEXT.search(text) is None else None
    try:
        node = loader.get_single_node() if loader is not None else None
        if loader is not None:
            value = None if node is None else _build(node, path, name, {}, errors, loader)
        else:
            value = check_scalar(text)
    except _RefusedYAML as exc:
        errors.append(SpecError(name, None, _dotted(path), exc.problem or "invalid YAML"))
    except _BadValue as exc:
        errors.append(SpecError(name, None, _dotted(path), exc.message, exc.suggestion))
    except yaml.YAMLError:
        try:
            value = check_scalar(text)
        except _BadValue as exc:
            errors.append(SpecError(name, None, _dotted(path), exc.message, exc.suggestion))
    finally:
        if loader is not None:
            loader.dispose()
    if errors:
        raise SpecErrors(SpecError(name, None, e.key, e.message, e.suggestion) for e in errors)
    return value


def check_key(name: str, key: str) -> None:
    """A key that did not come through YAML (a ``--set`` path part) obeys the same rules."""
    try:
        _check_key(key)
    except _BadValue as exc:
        raise SpecErrors.one(name, None, "", exc.message, exc.suggestion) from None


def load_json(name: str, text: str, lines: dict[Path, tuple[str, int]] | None = None) -> Loaded:
    """A JSON object (CUE's export of a .cue spec, a lockfile) under the limits and character rules of YAML specs."""
    check_text(name, text)

    def bounded_int(literal: str) -> int:
        if len(literal.lstrip("-")) > limits.MAX_INT_DIGITS:
            raise ValueError(f"an integer with more than {limits.MAX_INT_DIGITS} digits")
        return int(literal)

    def no_constant(literal: str) -> float:
        raise ValueError(f"expected a finite number, got {literal}")

    try:
        data = json.loads(text, parse_int=bounded_int, parse_constant=no_constant)
    except json.JSONDecodeError as exc:
        raise SpecErrors.one(name, exc.lineno, "", f"not valid JSON: {exc.msg}") from None
    except RecursionError:
        raise SpecErrors.one(name, None, "", f"nested deeper than {limits.MAX_DEPTH} levels") from None
    except ValueError as exc:
        raise SpecErrors.one(name, None, "", f"JSON: {exc}") from None
    if not isinstance(data, dict):
        raise SpecErrors.one(name, 1, "", "expected a mapping of keys at the top level")
    known = lines or {}
    errors: list[SpecError] = []
    counter = [0]
    _check_data(data, (), 1, name, known, errors, counter)
    if errors:
        raise SpecErrors(errors)
    return Loaded(data, dict(known))


def _check_data(value: Any, path: Path, depth: int, name: str, lines: dict[Path, tuple[str, int]],
                errors: list[SpecError], counter: list[int]) -> None:
    counter[0] += 1
    line = next((lines[path[:end]][1] for end in range(len(path), -1, -1) if path[:end] in lines), None)
    if counter[0] > limits.MAX_VALUES:
        if counter[0] == limits.MAX_VALUES + 1:
            errors.append(SpecError(name, line, _dotted(path), f"more than {limits.MAX_VALUES:,} keys, items and values"))
        return
    if depth > limits.MAX_DEPTH:
        errors.append(SpecError(name, line, _dotted(path), f"nested deeper than {limits.MAX_DEPTH} levels"))
        return
    if isinstance(value, dict):
        for key, item in value.items():
            try:
                _check_key(key)
            except _BadValue as exc:
                errors.append(SpecError(name, line, _dotted(path), exc.message, exc.suggestion))
                continue
            _check_data(item, (*path, key), depth + 1, name, lines, errors, counter)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_data(item, (*path, index), depth + 1, name, lines, errors, counter)
    else:
        try:
            check_scalar(value)
        except _BadValue as exc:
            errors.append(SpecError(name, line, _dotted(path), exc.message, exc.suggestion))
