"""load -> resolve -> validate -> render -> hash, as one pure function."""

from __future__ import annotations

from dataclasses import dataclass

from mxc.compiler.loader import Loaded
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


def compile_spec(path: str, read: Reader, overrides: tuple[str, ...] = (), *, mxc_version: str) -> Bundle:
    spec, _ = resolve_spec(path, read, overrides)
    files = render(spec, spec_document(spec))
    manifest = build_manifest(files, mxc_version)
    return Bundle(spec, {**files, MANIFEST: manifest}, bundle_hash(manifest))
