"""What the rules look at: one validated spec with its line map and the catalogs chosen for it.

Everything a rule derives more than once (the XLA flag tokens, MaxText's effective values)
is computed here once, lazily, so a matrix of thousands of combinations stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from mxc.compiler.check.catalogs import (
    MaxTextCatalog,
    XlaCatalog,
    maxtext_catalog,
    maxtext_catalog_names,
    maxtext_catalog_versions,
    same_repository,
    xla_catalog,
    xla_catalog_versions,
    xla_index,
)
from mxc.compiler.check.findings import Severity
from mxc.compiler.check.xla_tokens import render_problem, split_flags
from mxc.compiler.contract_build import scalar_text
from mxc.compiler.loader import Path
from mxc.compiler.schema import JobSpec

Locate = Callable[[Path], tuple[str, int | None]]
_UNSET = object()


@dataclass(frozen=True)
class Issue:
    """A rule's report before it becomes a Finding: where (a key path) and what."""

    path: Path
    message: str
    suggestion: str = ""
    severity: Severity | None = None  # None: the rule's own severity


@dataclass(frozen=True)
class Lock:
    """What the checker needs from a spec's lockfile (read by the caller)."""

    name: str = ""
    jaxlib: str | None = None


NO_LOCK = Lock()


@dataclass(frozen=True)
class Pin:
    """Which catalog a spec is checked against, and why that one."""

    version: str | None  # catalog used (None: no catalog at all)
    requested: str | None  # the version the spec pins, if any
    how: str  # human text: "code.jaxlib_version", "lockfile ...", "maxtext 0.2.5", "default"
    path: Path = ()


@dataclass(frozen=True)
class FlagUse:
    """One XLA flag as it reaches XLA_FLAGS: from env.xla_flags or a raw env.vars.XLA_FLAGS token."""

    name: str
    value: str | None
    raw: bool  # True: a token of env.vars.XLA_FLAGS
    path: Path
    text: str
    problem: str = ""
    yaml_bool: bool = False  # the spec wrote a YAML boolean (true/false/on/off/yes/no)


def choose_jaxlib(spec: JobSpec, lock_jaxlib: str | None, lock_name: str = "") -> Pin:
    """The jaxlib a spec runs with: code.jaxlib_version, else its lockfile, else the jaxlib of its
    image (index.json ``images``, known images only), else its maxtext pin, else the default."""
    shipped = xla_catalog_versions()
    index = xla_index()
    pinned = spec.code.jaxlib_version
    if pinned is not None:
        return Pin(_catalog_for(pinned, shipped), pinned, "code.jaxlib_version", ("code", "jaxlib_version"))
    if lock_jaxlib is not None:
        return Pin(_catalog_for(lock_jaxlib, shipped), lock_jaxlib, f"jaxlib in {lock_name or 'the lockfile'}")
    if spec.image is not None:
        ref = image_name(spec.image.ref)
        version = index.get("images", {}).get(ref, {}).get("jaxlib")
        if version is not None:
            return Pin(_catalog_for(version, shipped), version, f"the jaxlib of {ref}", ("image", "ref"))
    mt = spec.code.maxtext_version
    if mt is not None and mt in index.get("maxtext", {}):
        version = index["maxtext"][mt]
        return Pin(version if version in shipped else None, version, f"maxtext {mt}'s jaxlib", ("code", "maxtext_version"))
    default = index.get("default")
    return Pin(default if default in shipped else (shipped[-1] if shipped else None), None, "default")


def _catalog_for(version: str, shipped: tuple[str, ...]) -> str | None:
    """The catalog for a jaxlib version. A local build (``0.8.2+selfbuilt``, ``0.11.0+rocm7``) is
    judged by its public release's catalog; the jaxlib-catalog rule notes the difference."""
    if version in shipped:
        return version
    public = version.split("+", 1)[0]
    return public if public != version and public in shipped else None


def image_name(ref: str) -> str:
    """An image reference without its registry's default prefix, tag kept, digest dropped:
    ``docker.io/rocm/jax-training:maxtext-v26.2@sha256:...`` -> ``rocm/jax-training:maxtext-v26.2``."""
    ref = ref.split("@", 1)[0]
    for prefix in ("docker.io/library/", "docker.io/", "index.docker.io/", "registry-1.docker.io/"):
        if ref.startswith(prefix):
            return ref[len(prefix):]
    return ref


def choose_maxtext(spec: JobSpec) -> Pin:
    """The MaxText key catalog a spec is judged against: the one code.maxtext_catalog names, else
    the one generated from code.repo at code.commit, else its maxtext release's, else the newest release's."""
    names = maxtext_catalog_names()
    named = spec.code.maxtext_catalog
    if named is not None:
        return Pin(named if named in names else None, named, "code.maxtext_catalog", ("code", "maxtext_catalog"))
    if spec.code.repo is not None and spec.code.commit is not None:
        for name in names:
            source = maxtext_catalog(name).source
            if source.get("commit") == spec.code.commit and same_repository(source.get("repo", ""), spec.code.repo):
                return Pin(name, name, f"code.repo at {spec.code.commit[:12]}", ("code", "commit"))
    mt = spec.code.maxtext_version
    if mt is not None and f"maxtext-{mt}" in names:
        return Pin(f"maxtext-{mt}", mt, "code.maxtext_version", ("code", "maxtext_version"))
    releases = maxtext_catalog_versions()
    return Pin(f"maxtext-{releases[-1]}" if releases else None, mt, "newest shipped", ("code",))


@dataclass
class Subject:
    file: str
    spec: JobSpec
    locate: Locate
    jaxlib: Pin
    maxtext_pin: Pin
    combination: int | None = None
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @cached_property
    def xla(self) -> XlaCatalog | None:
        return xla_catalog(self.jaxlib.version) if self.jaxlib.version else None

    @cached_property
    def maxtext(self) -> MaxTextCatalog | None:
        return maxtext_catalog(self.maxtext_pin.version) if self.maxtext_pin.version else None

    @cached_property
    def flag_uses(self) -> list[FlagUse]:
        """Every XLA flag in the order XLA_FLAGS gets them: env.xla_flags first, then the raw string."""
        uses = []
        for name, value in sorted(self.spec.env.xla_flags.items()):
            text = scalar_text(value)
            uses.append(FlagUse(name, text, False, ("env", "xla_flags", name), f"--{name}={text}", render_problem(text),
                                isinstance(value, bool)))
        raw = self.spec.env.vars.get("XLA_FLAGS")
        if raw is not None:
            for tok in split_flags(scalar_text(raw)):
                uses.append(FlagUse(tok.name, tok.value, True, ("env", "vars", "XLA_FLAGS"), tok.text, tok.problem))
        return uses

    @cached_property
    def overrides(self) -> dict[str, Any]:
        return self.spec.model.overrides

    @cached_property
    def _mt_defaults(self) -> dict[str, Any]:
        return self.maxtext.defaults(self.spec.model.model_name) if self.maxtext is not None else {}

    def mt(self, key: str) -> Any:
        """MaxText's effective value of ``key`` (override, model config, base.yml)."""
        value = self.overrides.get(key, _UNSET)
        return self._mt_defaults.get(key) if value is _UNSET else value

    @cached_property
    def devices_per_node(self) -> int:
        """GPUs per node, or for CPU specs the host devices XLA is told to fake (default 1)."""
        if self.spec.resources.gpus_per_node:
            return self.spec.resources.gpus_per_node
        count = 1
        for use in self.flag_uses:  # the last one wins, as in XLA
            if use.name == "xla_force_host_platform_device_count" and use.value and use.value.isdigit():
                count = max(int(use.value), 1)
        return count

    @cached_property
    def devices(self) -> int:
        return self.spec.resources.nodes * self.devices_per_node
