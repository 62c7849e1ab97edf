"""Rules about ``model.overrides``, judged against the MaxText catalog of the pinned release.

These are the fast, static version of what ``--probe`` asks MaxText itself (pyconfig):
unknown keys, values MaxText's pydantic config rejects, and model-config keys MaxText
refuses to see overridden.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import lru_cache

from mxc.compiler.check.catalogs import MaxTextKey, maxtext_catalog, maxtext_catalog_names, maxtext_catalogs_with_key
from mxc.compiler.check.subject import Issue, Subject
from mxc.compiler.contract_build import scalar_text
from mxc.compiler.errors import did_you_mean
from mxc.compiler.schema import Scalar

_INT = re.compile(r"[+-]?[0-9][0-9_]*")
_BOOL_WORDS = frozenset({"0", "off", "f", "false", "n", "no", "1", "on", "t", "true", "y", "yes"})


@lru_cache(maxsize=4096)
def _suggest_key(key: str, version: str) -> str:
    return did_you_mean(key, maxtext_catalog(version).keys)


def maxtext_catalog_rule(s: Subject) -> Iterator[Issue]:
    """code.maxtext_catalog names a shipped MaxText key catalog: without it no override can be judged."""
    pin = s.maxtext_pin
    if pin.how == "code.maxtext_catalog" and pin.version is None:
        shipped = maxtext_catalog_names()
        yield Issue(pin.path, f"no MaxText key catalog named {pin.requested!r}; shipped: {', '.join(shipped) or 'none'}",
                    did_you_mean(pin.requested or "", shipped)
                    or "generate one with tools/gen_maxtext_catalog.py --git REPO --commit SHA (or --dir an image's MaxText)")


def maxtext_override_unknown(s: Subject) -> Iterator[Issue]:
    """Every override is a MaxText config key: MaxText refuses unknown keys at start-up."""
    if s.maxtext is None:
        return
    for key in s.overrides:
        if key not in s.maxtext.keys:
            yield Issue(("model", "overrides", key), f"'{key}' is not a MaxText {s.maxtext.version} config key",
                        _other_catalogs(key, s) or _suggest_key(key, s.maxtext.name) or "see maxtext/configs/base.yml")


def _other_catalogs(key: str, s: Subject) -> str:
    """A key another shipped MaxText (a fork's, an image's) has: the spec may be judged by the wrong one."""
    if s.maxtext_pin.how == "code.maxtext_catalog":
        return ""
    others = [n for n in maxtext_catalogs_with_key(key) if n != s.maxtext_pin.version]
    return f"'{key}' is a key of {', '.join(others)}: set code.maxtext_catalog to the MaxText this runs" if others else ""


def _value_problem(spec: MaxTextKey, value: Scalar) -> str:
    text = scalar_text(value)
    if spec.optional and text.lower() == "none":
        return ""
    if spec.type == "enum":
        if text in spec.choices:
            return ""
        where = f" (MaxText's {spec.choices_from} fails on any other)" if spec.choices_from else ""
        return f"expected one of {', '.join(map(repr, spec.choices))}{where}, got {text!r}"
    if spec.type == "int":
        if isinstance(value, float):
            return "" if value.is_integer() else f"expected an integer, got {value!r}"
        return "" if isinstance(value, int) or _INT.fullmatch(text) else f"expected an integer, got {text!r}"
    if spec.type in ("float", "number"):
        if isinstance(value, (int, float)):
            return ""
        try:
            float(text)
        except ValueError:
            return f"expected a number, got {text!r}"
        return ""
    if spec.type == "bool":
        if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
            return ""
        return "" if text.lower() in _BOOL_WORDS else f"expected true or false, got {text!r}"
    return ""


def maxtext_override_value(s: Subject) -> Iterator[Issue]:
    """An override's value has the type MaxText's config declares (an enum's values, an integer, a bool)."""
    if s.maxtext is None:
        return
    for key, value in s.overrides.items():
        spec = s.maxtext.keys.get(key)
        if spec is None:
            continue
        problem = _value_problem(spec, value)
        if problem:
            hint = did_you_mean(scalar_text(value), spec.choices) if spec.type == "enum" else ""
            yield Issue(("model", "overrides", key), problem, hint or f"default: {spec.default!r}")


def maxtext_model_key(s: Subject) -> Iterator[Issue]:
    """An override of a key the model's own config sets, with a different value: MaxText stops
    with 'overridden by both model config and CLI' unless override_model_config is true."""
    if s.maxtext is None:
        return
    model = s.maxtext.models.get(s.spec.model.model_name)
    if not model or str(s.overrides.get("override_model_config", "")).lower() == "true":
        return
    set_by_model = set(model.get("keys", ()))
    for key, value in s.overrides.items():
        if key in set_by_model and (key not in model or model[key] != value):
            shown = f" ({model[key]!r})" if key in model else ""
            yield Issue(("model", "overrides", key),
                        f"{key} is set by MaxText's {s.spec.model.model_name} config{shown}; MaxText refuses to override it",
                        "add override_model_config: true to model.overrides, or drop the key")
