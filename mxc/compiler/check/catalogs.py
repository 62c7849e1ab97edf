"""The data ``mxc check`` judges against, shipped with the compiler (see tools/ and docs/check.md).

- XLA flags, one catalog per jaxlib version (``data/xla_flags/jaxlib-<v>.json``), generated
  from that jaxlib by tools/gen_xla_flag_catalog.py. Flags appear and vanish between releases,
  so a spec is checked against the jaxlib it pins, never the one on the reviewer's laptop.
- MaxText config keys and model configs, per maxtext release and per named tree (a fork at a
  commit, the MaxText inside an image), made by tools/gen_maxtext_catalog.py: the types of
  MaxText's pydantic config, and for a free-form string the code dispatches on
  (``remat_policy``, ``attention``) the values that dispatch accepts (tools/maxtext_dispatch.py).
- NCCL/RCCL/NVTE/HSA/CUDA variables: curated by hand (``data/env_vars.json``), each with its
  allowed values, vendor and documentation source.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

_CATALOG_FILE = re.compile(r"^jaxlib-(.+)\.json$")


def _data(*parts: str) -> Any:
    return resources.files("mxc.compiler").joinpath("data", *parts)


@dataclass(frozen=True)
class XlaFlag:
    name: str
    type: str  # bool | int32 | int64 | float | string
    default: Any
    doc: str
    proto_enum: tuple[str, ...] = ()
    is_list: bool = False

    @property
    def deprecated(self) -> bool:
        head = self.doc[:40].lower()
        return "deprecated" in head or "no longer supported" in self.doc.lower()


@dataclass(frozen=True)
class XlaCatalog:
    jaxlib_version: str
    flags: dict[str, XlaFlag] = field(repr=False)


@cache
def xla_catalog_versions() -> tuple[str, ...]:
    """jaxlib versions with a shipped catalog, oldest first."""
    versions = []
    for entry in _data("xla_flags").iterdir():
        m = _CATALOG_FILE.match(entry.name)
        if m:
            versions.append(m.group(1))
    return tuple(sorted(versions, key=_version_key))


def _version_key(v: str) -> tuple[int | str, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"[.+-]", v))


@cache
def xla_catalog(version: str) -> XlaCatalog:
    raw = json.loads(_data("xla_flags", f"jaxlib-{version}.json").read_text("utf-8"))
    flags = {
        name: XlaFlag(name, f["type"], f.get("default"), f.get("doc", ""), tuple(f.get("proto_enum", ())), bool(f.get("list")))
        for name, f in raw["flags"].items()
    }
    return XlaCatalog(raw["jaxlib_version"], flags)


@cache
def xla_index() -> dict[str, Any]:
    """Which jaxlib a maxtext release runs with, and the default catalog."""
    data: dict[str, Any] = json.loads(_data("xla_flags", "index.json").read_text("utf-8"))
    return data


@cache
def all_flag_versions() -> dict[str, tuple[str, ...]]:
    """flag name -> the shipped jaxlib versions that have it (for 'not in this version')."""
    out: dict[str, list[str]] = {}
    for version in xla_catalog_versions():
        for name in xla_catalog(version).flags:
            out.setdefault(name, []).append(version)
    return {k: tuple(v) for k, v in out.items()}


@dataclass(frozen=True)
class EnvVar:
    name: str
    vendor: str  # nvidia | amd | any
    kind: str  # enum | bool01 | int | float | string | tokens | pattern
    doc: str
    source: str
    values: tuple[str, ...] = ()
    case_insensitive: bool = False
    minimum: float | None = None
    maximum: float | None = None
    pattern: str = ""
    items: tuple[str, ...] = ()
    # A vendor-specific variable in the other vendor's spec: why that is harmless (a warning) or a
    # real conflict (an error). Every vendor-specific entry says one of the two.
    harmless_on_other_vendor: str = ""
    conflict_on_other_vendor: str = ""
    deprecated: str = ""  # why setting it no longer does anything (a note)


@dataclass(frozen=True)
class EnvCatalog:
    variables: dict[str, EnvVar]
    prefixes: dict[str, str]  # governed prefix -> vendor

    def vendor_of(self, name: str) -> str | None:
        known = self.variables.get(name)
        if known is not None:
            return known.vendor
        for prefix, vendor in self.prefixes.items():
            if name.startswith(prefix):
                return vendor
        return None

    def governed(self, name: str) -> bool:
        return any(name.startswith(p) for p in self.prefixes)


@cache
def env_catalog() -> EnvCatalog:
    raw = json.loads(_data("env_vars.json").read_text("utf-8"))
    sources = raw["sources"]
    variables = {}
    for name, v in raw["variables"].items():
        variables[name] = EnvVar(
            name=name,
            vendor=v["vendor"],
            kind=v["kind"],
            doc=v["doc"],
            source=sources.get(v["source"], v["source"]),
            values=tuple(str(x) for x in v.get("values", ())),
            case_insensitive=bool(v.get("case_insensitive")),
            minimum=v.get("min"),
            maximum=v.get("max"),
            pattern=v.get("pattern", ""),
            items=tuple(v.get("items", ())),
            harmless_on_other_vendor=v.get("harmless_on_other_vendor", ""),
            conflict_on_other_vendor=v.get("conflict_on_other_vendor", ""),
            deprecated=v.get("deprecated", ""),
        )
    return EnvCatalog(variables, dict(raw["governed_prefixes"]))


@dataclass(frozen=True)
class MaxTextKey:
    name: str
    type: str  # int | float | number | bool | str | enum | list | dict | any
    optional: bool
    choices: tuple[str, ...] = ()
    default: Any = None
    # Where a free-form string's choices were read (``layers/nnx_decoders.py:get_remat_policy``):
    # MaxText's types accept any string there, the code then fails on all but these.
    choices_from: str = ""


@dataclass(frozen=True)
class MaxTextCatalog:
    version: str  # how findings name this MaxText: "0.2.5", or a fork's or image's catalog name
    keys: dict[str, MaxTextKey] = field(repr=False)
    models: dict[str, dict[str, Any]] = field(repr=False)
    _defaults: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False, compare=False)
    name: str = ""  # the file's name, what code.maxtext_catalog says
    source: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def value(self, key: str, model_name: str, overrides: dict[str, Any]) -> Any:
        """What MaxText would use for ``key``: the override, else the model config, else base.yml."""
        if key in overrides:
            return overrides[key]
        return self.defaults(model_name).get(key)

    def defaults(self, model_name: str) -> dict[str, Any]:
        """base.yml's values with the model config's on top (computed once per model)."""
        cached = self._defaults.get(model_name)
        if cached is None:
            cached = {k: v.default for k, v in self.keys.items()}
            cached.update({k: v for k, v in self.models.get(model_name, {}).items() if k != "keys"})
            self._defaults[model_name] = cached
        return cached


_RELEASE = re.compile(r"^maxtext-(\d.*)$")


@cache
def maxtext_catalog_names() -> tuple[str, ...]:
    """Every shipped MaxText key catalog: releases (``maxtext-<version>``) and named trees (a fork at
    a commit, an image's MaxText), as tools/gen_maxtext_catalog.py writes them."""
    names = [e.name[:-len(".json")] for e in _data("maxtext").iterdir() if e.name.endswith(".json")]
    return tuple(sorted(names))


@cache
def maxtext_catalog_versions() -> tuple[str, ...]:
    """maxtext releases with a shipped catalog, oldest first."""
    versions = [m.group(1) for n in maxtext_catalog_names() if (m := _RELEASE.match(n))]
    return tuple(sorted(versions, key=_version_key))


def _catalog_file(name_or_version: str) -> str:
    return name_or_version if name_or_version in maxtext_catalog_names() else f"maxtext-{name_or_version}"


@cache
def maxtext_catalog(name_or_version: str) -> MaxTextCatalog:
    """A catalog by its name (``amd-maxtext-...``) or by maxtext release (``0.2.5``)."""
    name = _catalog_file(name_or_version)
    raw = json.loads(_data("maxtext", f"{name}.json").read_text("utf-8"))
    keys = {
        key: MaxTextKey(key, k["type"], bool(k.get("optional")), tuple(k.get("choices", ())), k.get("default"),
                        k.get("choices_from", ""))
        for key, k in raw["keys"].items()
    }
    label = raw.get("maxtext_version") or raw.get("label") or name
    return MaxTextCatalog(label, keys, raw["models"], name=name, source=dict(raw.get("source", {})))


def same_repository(a: str, b: str) -> bool:
    """Two spellings of one git repository (https/ssh, with or without .git, any case)."""

    def norm(url: str) -> str:
        url = url.strip().lower().removesuffix("/").removesuffix(".git")
        url = re.sub(r"^(https?://|ssh://|git://)", "", url)
        url = re.sub(r"^git@([^:/]+):", r"\1/", url)
        return url.split("@", 1)[-1] if "@" in url.split("/", 1)[0] else url

    return norm(a) == norm(b)


@cache
def maxtext_catalogs_with_key(key: str) -> tuple[str, ...]:
    """The shipped catalogs whose MaxText accepts ``key`` (to point a fork's key to its catalog)."""
    return tuple(n for n in maxtext_catalog_names() if key in maxtext_catalog(n).keys)
