"""What a deprecated, renamed or removed XLA flag became, per jaxlib, and did-you-mean that never
points at a deprecated flag when a current one fits.

Derived from the shipped catalogs' history (``data/xla_flags/jaxlib-*.json``), not kept by hand: a
flag that is deprecated in the pinned jaxlib, or gone from it, has a successor when its
documentation (in the newest catalog that has the flag) says so and names a flag the pinned
jaxlib has, live:

- ``[Deprecated] True maps to --xla_gpu_pipeline_all_gather=on ...`` (0.11+, the pipelined booleans);
- ``The legacy flag for setting GPU graph level. Use xla_gpu_enable_command_buffer in new use cases``
  (``xla_gpu_graph_level``, 0.6.2; gone from 0.8.2);
- ``DEPRECATED: Use --xla_gpu_experimental_use_collective_kernels=ALL_REDUCE instead``.

A plain edit distance is not enough: ``xla_gpu_enable_async_all_gather`` is closest to
``xla_gpu_enable_pipelined_all_gather``, which the same catalog marks deprecated, and
``xla_gpu_graph_level`` is closest to ``xla_gpu_autotune_level``, an unrelated flag.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from functools import cache

from mxc.compiler.check.catalogs import xla_catalog, xla_catalog_versions

# A flag named in documentation, with the value it names (``--xla_x=on``), if any.
_NAMED = re.compile(r"(?<![A-Za-z0-9_])-{0,2}(xla_[a-z0-9_]+)(?:=([A-Za-z0-9_.,-]*))?")
# Words that make a named flag the replacement, not a mere cross-reference.
_REPLACED = re.compile(r"deprecated|legacy|\binstead\b|\bmaps to\b|new use cases|replaced by|no longer", re.I)
_DOC_SHOWN = 160  # characters of the documentation quoted in a hint


@dataclass(frozen=True)
class Successor:
    name: str  # the flag to set instead: a live flag of the pinned jaxlib
    value: str | None  # the value the documentation names for it ("on", "ALL_REDUCE"), if any
    said_by: str  # the jaxlib whose documentation of the old flag says so
    doc: str  # that documentation

    @property
    def setting(self) -> str:
        return f"--{self.name}={self.value}" if self.value else f"--{self.name}"

    def hint(self, old: str) -> str:
        setting = self.setting
        doc = " ".join(self.doc.split())
        doc = doc if len(doc) <= _DOC_SHOWN else doc[: _DOC_SHOWN - 1] + "…"
        return f"use {setting} instead; jaxlib {self.said_by} documents '{old}': \"{doc}\""


@cache
def successors(version: str) -> dict[str, Successor]:
    """Old flag name -> its successor among the live flags of jaxlib ``version``'s catalog: flags
    this jaxlib deprecates (its own documentation) and flags older jaxlibs had (their newest
    documentation); a flag only newer jaxlibs have is an addition, not a rename."""
    current = xla_catalog(version).flags
    shipped = xla_catalog_versions()
    out: dict[str, Successor] = {}
    for said_by in reversed(shipped[: shipped.index(version) + 1]):  # the newest documentation first
        for name, flag in xla_catalog(said_by).flags.items():
            if name in out or (name in current and not current[name].deprecated):
                continue  # a live flag of this jaxlib needs no successor
            if not _REPLACED.search(flag.doc):
                continue
            for m in _NAMED.finditer(flag.doc):
                target = current.get(m[1])
                if m[1] != name and target is not None and not target.deprecated:
                    out[name] = Successor(m[1], m[2] or None, said_by, flag.doc)
                    break
    return out


def suggest(name: str, version: str) -> str:
    """The hint for a flag ``name`` that jaxlib ``version`` lacks: its successor when the catalogs'
    history names one, else the closest live flag (a close but deprecated flag is replaced by its
    successor, or skipped); empty when nothing fits."""
    table = successors(version)
    if name in table:
        return table[name].hint(name)
    flags = xla_catalog(version).flags
    deprecated_match = ""
    for close in difflib.get_close_matches(name, sorted({*flags, *table}), n=6, cutoff=0.6):
        if close in table:  # deprecated here, or an older jaxlib's: its successor is what fits
            return f"did you mean '{table[close].name}'? the current form of '{close}'"
        if not flags[close].deprecated:
            return f"did you mean '{close}'?"
        deprecated_match = deprecated_match or close
    if deprecated_match:
        return f"did you mean '{deprecated_match}'? it is deprecated in jaxlib {version} and may do nothing"
    return ""
