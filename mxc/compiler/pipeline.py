"""load -> resolve -> validate -> render -> hash, as one pure function."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mxc.compiler.check.build_gate import build_gate, invalid_spec_errors
from mxc.compiler.check.findings import Finding
from mxc.compiler.check.subject import NO_LOCK
from mxc.compiler.check.subject import Lock as CheckLock
from mxc.compiler.config_file import read_config
from mxc.compiler.errors import SpecErrors
from mxc.compiler.loader import Loaded
from mxc.compiler.lockfile import LOCK_FILE, Lock, apply_lock, lock_document
from mxc.compiler.manifest import MANIFEST, build_manifest, bundle_hash
from mxc.compiler.render import canonical_json, render
from mxc.compiler.resolve import Reader, apply_overrides, resolve
from mxc.compiler.schema import JobSpec
from mxc.compiler.validate import validate


@dataclass(frozen=True)
class Bundle:
    """A compiled bundle: its files (manifest included) and its hash. Nothing is written yet."""

    spec: JobSpec
    files: dict[str, str]
    hash: str
    # What `mxc check` warns about in the spec (build_gate.py): printed by `mxc build`, never in the bundle.
    warnings: tuple[Finding, ...] = field(default=(), compare=False)

    @property
    def short(self) -> str:
        return self.hash[:12]


def resolve_spec(path: str, read: Reader, overrides: tuple[str, ...] = ()) -> tuple[JobSpec, Loaded]:
    doc = resolve(path, read, overrides)
    return validate(doc, path), doc


def spec_document(spec: JobSpec) -> str:
    return canonical_json(spec.model_dump(mode="json", by_alias=True))


def compile_spec(
    path: str, read: Reader, overrides: tuple[str, ...] = (), *, mxc_version: str, lock: tuple[str, Lock] | None = None,
    check_lock: CheckLock = NO_LOCK,
) -> Bundle:
    """Compile ``path``; with ``lock`` (its name and content), pins come from the lockfile and it joins the bundle."""
    return compile_document(resolve(path, read), path, overrides, mxc_version=mxc_version, lock=lock, read=read,
                            check_lock=check_lock)


def compile_document(
    doc: Loaded, path: str, overrides: tuple[str, ...] = (), *, mxc_version: str, lock: tuple[str, Lock] | None = None,
    read: Reader | None = None, check_lock: CheckLock = NO_LOCK,
) -> Bundle:
    """Compile a loaded document: a YAML spec resolved here, or a .cue spec exported by CUE (mxc/checking.py),
    so both front ends share every later stage. ``read`` reads the files a spec names besides itself
    (model.config_file); without it, a spec naming one is refused. ``check_lock``: the jaxlib of the spec's
    lockfile, which ``mxc check`` judges its XLA flags by (a ``lock`` given here is that lockfile)."""
    apply_overrides(doc, overrides)
    extra: dict[str, str] = {}
    if lock is not None:
        lock_name, locked = lock
        errors = apply_lock(doc, locked, lock_name, path)
        if errors:
            raise SpecErrors(errors)
        extra[LOCK_FILE] = lock_document(locked)
        check_lock = CheckLock(lock_name, locked.python.packages.get("jaxlib") if locked.python else None)
    try:
        spec = validate(doc, path)
    except SpecErrors:
        raise SpecErrors(invalid_spec_errors(doc, path, check_lock)) from None
    gate = build_gate(doc, path, spec, check_lock)
    if gate.errors:
        raise SpecErrors(gate.errors)
    config_keys: dict[str, Any] = {}
    if spec.model.config_file:
        if read is None:
            raise SpecErrors.one(path, None, "model.config_file", "this spec's files cannot be read from here")
        config = read_config(doc, path, spec.model.config_file, spec.model.model_name, read, spec.checkpoint.period)
        extra[config.name] = config.text
        config_keys = config.keys
    files = render(spec, spec_document(spec), extra, config_keys)
    manifest = build_manifest(files, mxc_version)
    return Bundle(spec, {**files, MANIFEST: manifest}, bundle_hash(manifest), tuple(gate.warnings))
