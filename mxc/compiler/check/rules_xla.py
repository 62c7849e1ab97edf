"""Rules about XLA flags: syntax, existence in the pinned jaxlib, values, conflicts."""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache

from mxc.compiler.check.catalogs import all_flag_versions, xla_catalog_versions
from mxc.compiler.check.subject import FlagUse, Issue, Subject
from mxc.compiler.check.xla_successors import successors, suggest
from mxc.compiler.check.xla_tokens import value_problem


@lru_cache(maxsize=4096)
def _suggest_flag(name: str, version: str) -> str:
    return suggest(name, version)  # the successor of a renamed flag, never a deprecated one when a live one fits


def _where(use: FlagUse) -> str:
    return f"'{use.text}' in XLA_FLAGS" if use.raw else f"'{use.name}'"


def jaxlib_catalog(s: Subject) -> Iterator[Issue]:
    """The spec's jaxlib has a shipped XLA flag catalog.

    Flags are judged against the jaxlib the spec runs with (code.jaxlib_version, the lockfile,
    the known jaxlib of its image, or its maxtext pin). A pinned version without a catalog is an
    error: nothing could be judged. A local build (``0.8.2+selfbuilt``) is judged by its release's
    catalog, and an unpinned spec by the default catalog, each with a note.
    """
    pin = s.jaxlib
    if pin.requested is not None and pin.version is None:
        yield Issue(pin.path or ("code",), f"no XLA flag catalog for jaxlib {pin.requested} ({pin.how}); "
                    f"shipped: {', '.join(xla_catalog_versions()) or 'none'}",
                    "generate one with tools/gen_xla_flag_catalog.py --python <python with that jaxlib>")
    elif pin.requested is not None and pin.version != pin.requested and s.flag_uses:
        yield Issue(pin.path or ("code",), f"jaxlib {pin.requested} ({pin.how}) is a local build: XLA flags checked "
                    f"against jaxlib {pin.version}'s catalog; a vendor's build may register other flags",
                    "--probe --probe-python <the image's python> asks that jaxlib itself", severity="note")
    elif pin.requested is None and s.flag_uses and pin.version is not None:
        yield Issue(("code",), f"jaxlib is not pinned: XLA flags checked against jaxlib {pin.version} (the default)",
                    "set code.jaxlib_version to the jaxlib in the image", severity="note")


def xla_flag_syntax(s: Subject) -> Iterator[Issue]:
    """Every XLA_FLAGS token is ``--name`` or ``--name=value`` and survives XLA's splitting.

    XLA reads a value that does not start with '-' as a file name, silently stops at the first
    token without '-', and splits on whitespace: an env.xla_flags value with a space becomes
    two flags.
    """
    for use in s.flag_uses:
        if use.problem:
            yield Issue(use.path, use.problem)


def xla_flag_unknown(s: Subject) -> Iterator[Issue]:
    """Every flag exists in some jaxlib: jaxlib aborts at start-up on an unknown flag."""
    if s.xla is None:
        return
    for use in s.flag_uses:  # the other jaxlibs' catalogs are loaded only for a flag the pinned one lacks
        if use.problem or use.name in s.xla.flags or use.name in all_flag_versions():
            continue
        yield Issue(use.path, f"{_where(use)}: unknown XLA flag (not in jaxlib {s.xla.jaxlib_version}; jaxlib aborts on it)",
                    _suggest_flag(use.name, s.xla.jaxlib_version) or "list flags with: mxc flags --search WORD")


def xla_flag_version(s: Subject) -> Iterator[Issue]:
    """A flag known to another jaxlib but not to the one the spec pins (added or removed upstream)."""
    if s.xla is None:
        return
    for use in s.flag_uses:
        if use.problem or use.name in s.xla.flags or use.name not in (known := all_flag_versions()):
            continue
        yield Issue(use.path, f"{_where(use)} is not a flag of jaxlib {s.xla.jaxlib_version} ({s.jaxlib.how}); "
                    f"it exists in jaxlib {', '.join(known[use.name])}",
                    _suggest_flag(use.name, s.xla.jaxlib_version) or "remove it, or pin the jaxlib that has it")


def xla_flag_value(s: Subject) -> Iterator[Issue]:
    """A flag's value parses as its type (bool: true/false/1/0; integers: decimal, in range), and a
    string flag did not get a YAML boolean (unquoted on/off/yes/no become true/false)."""
    if s.xla is None:
        return
    for use in s.flag_uses:
        flag = s.xla.flags.get(use.name)
        if use.problem or flag is None:
            continue
        problem = value_problem(flag.type, use.value)
        if not problem and use.yaml_bool and flag.type == "string":
            problem = (f"YAML read the value as a boolean, so XLA gets {use.value!r}; "
                       "quote it (e.g. \"on\") if a word was meant")
        if problem:
            yield Issue(use.path, f"{_where(use)}: {problem}", f"default: {flag.default!r}")


def xla_flag_deprecated(s: Subject) -> Iterator[Issue]:
    """A flag the pinned jaxlib documents as deprecated: it may do nothing or vanish next release."""
    if s.xla is None:
        return
    for use in s.flag_uses:
        flag = s.xla.flags.get(use.name)
        if flag is not None and flag.deprecated and not use.problem:
            successor = successors(s.xla.jaxlib_version).get(use.name)
            hint = f"use --{successor.name}" + (f"={successor.value}" if successor.value else "") if successor else ""
            yield Issue(use.path, f"{_where(use)} is deprecated in jaxlib {s.xla.jaxlib_version}: {flag.doc}", hint)


def xla_flag_conflict(s: Subject) -> Iterator[Issue]:
    """A flag set twice: with different values it is an error (the raw XLA_FLAGS token wins,
    silently), with the same value a warning."""
    seen: dict[str, list[FlagUse]] = {}
    for use in s.flag_uses:
        if use.name and not use.problem:
            seen.setdefault(use.name, []).append(use)
    for name, uses in seen.items():
        if len(uses) < 2:
            continue
        values = [u.value for u in uses]
        places = ", ".join(("XLA_FLAGS " if u.raw else "env.xla_flags ") + repr(u.value) for u in uses)
        last = uses[-1]
        if len(set(values)) > 1:
            yield Issue(last.path, f"--{name} is set {len(uses)} times with different values ({places}); "
                        f"XLA keeps the last, {last.value!r}", "set it in one place (env.xla_flags)")
        else:
            yield Issue(last.path, f"--{name} is set {len(uses)} times ({places})", "set it in one place",
                        severity="warning")
