"""Validate a resolved document once, against the pydantic schema, with file:line errors."""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

from pydantic import BaseModel, ValidationError

from mxc.compiler.errors import SpecError, SpecErrors, did_you_mean
from mxc.compiler.loader import Loaded, Path
from mxc.compiler.resolve import line_of
from mxc.compiler.schema import JobSpec

# "image: ...", "vars.LD_PRELOAD: ...", "ranks.0.vars.X: ..." (a field path, whose parts may be
# rank numbers and whose last part may be a variable name)
_KEYED_MESSAGE = re.compile(r"^([a-z_][a-z0-9_]*(?:\.(?:[a-z_][a-z0-9_]*|[0-9]+))*(?:\.[A-Za-z_][A-Za-z0-9_]*)?): (.*)$",
                            re.S)


def validate(doc: Loaded, main_file: str, model: type[JobSpec] = JobSpec) -> JobSpec:
    """The spec, or SpecErrors listing every problem pydantic found (``model``: JobSpec, or a variant
    of it that the checker uses to judge what is left of a spec with errors)."""
    try:
        return model.model_validate(doc.data)
    except ValidationError as exc:
        raise SpecErrors(e.error for e in located_errors(doc, exc, main_file)) from None


class Located(NamedTuple):
    """A problem, the key path it is about (what ``SpecError.key`` spells with dots) and, for a check of
    a whole section (a model validator), that section's path: what the check looked at."""

    path: Path
    error: SpecError
    checked: Path | None = None


def located_errors(doc: Loaded, exc: ValidationError, main_file: str) -> list[Located]:
    errors: list[Located] = []
    for group in _union_groups(exc.errors()):
        if len(group) == 1:
            errors.extend(_to_spec_errors(doc, group[0], main_file))
        else:
            errors.append(_union_error(doc, group, main_file))
    return errors


# What pydantic calls the members of a union (the last part of each member's error location),
# as a person would name the type. A union error is one line listing these, not one made-up key each.
_TYPE_NAMES = {"bool": "true or false", "int": "an integer", "float": "a number", "str": "a string",
               "none": "nothing (null)"}
_TYPE_ERROR = re.compile(r"^(bool|int|float|string|list|dict|model|none|literal)_(type|parsing|error)$|^missing$")


def _union_groups(errors: list[Any]) -> list[list[Any]]:
    """Pydantic reports a value no member of a union accepts once per member, each under a location
    ending with the member's name (``env.vars.X.bool``, ``.int``...): those consecutive errors for one
    value become one group; every other error is a group of its own."""
    groups: list[list[Any]] = []
    for err in errors:
        last = groups[-1] if groups else None
        if (last is not None and len(err["loc"]) > 1 and _TYPE_ERROR.match(err["type"])
                and all(_TYPE_ERROR.match(e["type"]) and e["loc"][:-1] == err["loc"][:-1] and len(e["loc"]) > 1
                        for e in last)
                and _same_input(last[0], err)):
            last.append(err)
        else:
            groups.append([err])
    return groups


def _same_input(a: Any, b: Any) -> bool:
    try:
        return bool(a.get("input") == b.get("input")) and type(a.get("input")) is type(b.get("input"))
    except Exception:  # an input that cannot be compared is not grouped
        return False


def _union_error(doc: Loaded, group: list[Any], main_file: str) -> Located:
    loc: Path = tuple(group[0]["loc"][:-1])
    names = [_TYPE_NAMES.get(str(e["loc"][-1]), f"a {e['loc'][-1]}") for e in group]
    expected = ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else names[0]
    value = group[0].get("input")
    suggestion = ""
    if isinstance(value, (list, dict)):
        suggestion = "one value only; to pass a list or mapping as text, quote it: '" + _flow(value) + "'"
    elif value is None:
        suggestion = "an empty value is null: write a value, or \"\" for an empty string"
    file, line = line_of(doc, loc)
    return Located(loc, SpecError(file or main_file, line, ".".join(str(p) for p in loc),
                                  f"expected {expected}, got {_shown(value)}", suggestion))


def _flow(value: Any) -> str:
    text = json.dumps(value, separators=(", ", ": "), default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _shown(value: Any) -> str:
    """The value as the spec's author wrote it (YAML/JSON spelling: null, true, [1, 2]), not Python's."""
    return repr(value) if isinstance(value, str) else _flow(value)


def _to_spec_errors(doc: Loaded, err: Any, main_file: str) -> list[Located]:
    loc: Path = tuple(p for p in err["loc"] if p not in ("function-after",))
    loc = tuple("schema" if p == "schema_" else p for p in loc)
    message: str = err["msg"]
    suggestion = ""
    kind = err["type"]
    if kind == "extra_forbidden":
        allowed = _fields_at(loc[:-1])
        suggestion = did_you_mean(str(loc[-1]), allowed) or f"allowed keys: {', '.join(sorted(allowed))}"
        message = "unknown key"
    elif kind == "missing":
        message = "required key is missing"
        if loc == ("image", "digest"):
            suggestion = digest_hint(doc, main_file)
    elif kind == "literal_error":
        expected = err.get("ctx", {}).get("expected", "")
        choices = re.findall(r"'([^']*)'", expected)
        suggestion = did_you_mean(str(err.get("input")), choices)
        message = f"expected one of {expected}, got {err.get('input')!r}"
    elif kind == "string_pattern_mismatch":
        field = next((str(p) for p in reversed(loc) if isinstance(p, str)), "")  # mounts.0 -> mounts
        hint = _PATTERN_HINTS.get(field, "does not match " + err["ctx"]["pattern"])
        message = f"{hint}, got {err.get('input')!r}"
    elif kind == "value_error":
        # A model-level check names the key it is about ("image: required ..."), one problem a line.
        return [_keyed(doc, loc, line, main_file)._replace(checked=loc)
                for line in message.removeprefix("Value error, ").split("\n")]
    elif "input" in err and not isinstance(err["input"], dict):
        message = f"{_lower_first(message)}, got {err['input']!r}"
    return [_located(doc, loc, _lower_first(message), suggestion, main_file)]


def _keyed(doc: Loaded, loc: Path, message: str, main_file: str) -> Located:
    keyed = _KEYED_MESSAGE.match(message)
    if keyed:
        loc = (*loc, *keyed.group(1).split("."))
        message = keyed.group(2)
    return _located(doc, loc, _lower_first(message), "", main_file)


def _located(doc: Loaded, loc: Path, message: str, suggestion: str, main_file: str) -> Located:
    file, line = line_of(doc, loc)
    return Located(loc, SpecError(file or main_file, line, ".".join(str(p) for p in loc), message, suggestion))


_PATTERN_HINTS = {
    "digest": "expected sha256:<64 lowercase hex digits>",
    "commit": "expected a full 40-hex git commit (git rev-parse HEAD)",
    "name": "expected letters, digits, '.', '_' or '-' (max 63, no spaces)",
    "time": "expected a Slurm time: MM, HH:MM:SS or D-HH:MM:SS",
    "mem": "expected a Slurm memory size such as 512G",
    "maxtext_version": "expected a version such as 0.2.5",
    "jaxlib_version": "expected a version such as 0.12.0.1",
    "mounts": "expected /host:/container or /host:/container:ro, absolute paths without ',', ':' or whitespace "
              "(Apptainer reads a ',' as the start of another, read-write mount)",
    "ref": "expected an image reference or .sif path: no whitespace, not starting with '-'",
    "dir": "expected an absolute path without ',', ':' or whitespace (it is bound into containers as is)",
}


def digest_hint(doc: Loaded, main_file: str) -> str:
    """How to get the digest a spec lacks: mxc lock (asks the registry once, writes it to the
    lockfile), or read it with skopeo or from a local Podman store and write it into the spec."""
    from shlex import quote  # the commands are for copying into a shell: a spec's ref is anyone's text

    image = doc.data.get("image")
    ref = str(image.get("ref", "")) if isinstance(image, dict) else ""
    spec = quote(main_file)
    if ref.endswith(".sif") or ref.startswith(("/", "./", "../")):
        return f"the sha256 of the file: mxc lock {spec} writes it (or: sha256sum {quote(ref)})"
    name = ref.removeprefix("docker://")
    return (f"pin it: mxc lock {spec} && mxc build --locked {spec}; or write the manifest digest into "
            f"image.digest: skopeo inspect --format '{{{{.Digest}}}}' {quote('docker://' + name)}, or the DIGEST "
            f"column of podman images --digests {quote(name)}")


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:] if text[:2] != text[:2].upper() else text


def _fields_at(path: Path) -> set[str]:
    """Names allowed at ``path``, for did-you-mean on unknown keys."""
    model: type[BaseModel] = JobSpec
    for part in path:
        field = model.model_fields.get(str(part))
        if field is None:
            field = next((f for f in model.model_fields.values() if f.alias == part), None)
        annotation = getattr(field, "annotation", None)
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        nested = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if nested is None:
            return set()
        model = nested
    return {f.alias or name for name, f in model.model_fields.items()}
