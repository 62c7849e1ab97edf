"""load -> resolve -> validate -> render -> hash, as one pure function."""

from __future__ import annotations

from dataclasses import dataclass

from mxc.compiler.errors import SpecErrors
from mxc.compiler.loader import Loaded
from mxc.compiler.lockfile import LOCK_FILE, Lock, apply_lock, lock_document
from mxc.compiler.manifest import MANIFEST, build_manifest, bundle_hash
from mxc.compiler.render import canonical_json, render
from mxc.compiler.resolve import Reader, resolve
from mxc.compiler.schema import JobSpec
from mxc.compiler.validate import validate


@dataclass(frozen=True)
class Bundle:
    """A compiled bundle: its files (manifest included) and its hash. Nothing is written yet."""

    spec: JobSpec
    files: dict[str, str]
    hash: str

    @property
    def short(self) -> str:
        return self.hash[:12]


def resolve_spec(path: str, read: Reader, overrides: tuple[str, ...] = ()) -> tuple[JobSpec, Loaded]:
    doc = resolve(path, read, overrides)
    return validate(doc, path), doc


def spec_document(spec: JobSpec) -> str:
    return canonical_json(spec.model_dump(mode="json", by_alias=True))


def compile_spec(
    path: str, read: Reader, overrides: tuple[str, ...] = (), *, mxc_version: str, lock: tuple[str, Lock] | None = None
) -> Bundle:
    """Compile ``path``; with ``lock`` (its name and content), pins come from the lockfile and it joins the bundle."""
    if lock is None:
        spec, _ = resolve_spec(path, read, overrides)
        files = render(spec, spec_document(spec))
    else:
        lock_name, locked = lock
        doc = resolve(path, read, overrides)
        errors = apply_lock(doc, locked, lock_name, path)
        if errors:
            raise SpecErrors(errors)
        spec = validate(doc, path)
        files = render(spec, spec_document(spec), {LOCK_FILE: lock_document(locked)})
    manifest = build_manifest(files, mxc_version)
    return Bundle(spec, {**files, MANIFEST: manifest}, bundle_hash(manifest))
