"""Resolve an image reference to its manifest digest through the OCI distribution API.

``GET /v2/NAME/manifests/REFERENCE`` with every manifest type we accept (OCI index and
manifest, Docker manifest list and schema 2), then trust nothing: the digest pinned is the
sha256 of the bytes received, and it must equal the registry's ``Docker-Content-Digest`` (and
the digest asked for, when the reference already has one). A multi-platform index is pinned
as the index: pulling it by digest works on every platform it lists. Registries that answer
401 with a Bearer challenge (Docker Hub, GHCR) get the anonymous token flow.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from mxc.errors import UserError
from mxc.lock.reference import ImageRef

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MANIFEST_TYPES = (OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST)
ACCEPT = ", ".join(MANIFEST_TYPES)


@dataclass(frozen=True)
class Resolved:
    digest: str
    media_type: str
    size: int


def _scheme(ref: ImageRef, insecure: frozenset[str]) -> str:
    """Plain HTTP only for loopback registries and those named with --insecure-registry."""
    return "http" if ref.is_loopback or ref.registry in insecure else "https"


def _bearer_token(session: Any, challenge: str, timeout: float) -> str | None:
    """Anonymous token for a ``WWW-Authenticate: Bearer realm=...,service=...,scope=...`` challenge."""
    if not challenge.lower().startswith("bearer "):
        return None
    params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    realm = params.pop("realm", None)
    if not realm:
        return None
    resp = session.get(realm, params=params, timeout=timeout)
    if resp.status_code != 200:
        return None
    body = resp.json()
    token = body.get("token") or body.get("access_token")
    return str(token) if token else None


def resolve(ref: ImageRef, *, insecure: frozenset[str] = frozenset(), timeout: float = 20) -> Resolved:
    """The verified manifest digest and media type of ``ref`` at its registry."""
    import requests

    url = f"{_scheme(ref, insecure)}://{ref.api_host}/v2/{ref.name}/manifests/{ref.reference}"
    headers = {"Accept": ACCEPT}
    session = requests.Session()
    try:
        resp = session.get(url, headers=headers, timeout=timeout)
        if resp.status_code == 401:
            token = _bearer_token(session, resp.headers.get("WWW-Authenticate", ""), timeout)
            if token:
                resp = session.get(url, headers={**headers, "Authorization": f"Bearer {token}"}, timeout=timeout)
    except requests.RequestException as exc:
        reason = _reason(exc)
        raise UserError(f"image {ref}: cannot reach registry {ref.api_host}: {reason}",
                        "is it up? a plain-HTTP registry needs --insecure-registry HOST") from None
    if resp.status_code != 200:
        raise UserError(f"image {ref}: registry {ref.api_host} answered {resp.status_code} {_registry_error(resp)}",
                        "is the tag pushed, and the name right?" if resp.status_code == 404 else "")
    body = resp.content
    computed = "sha256:" + hashlib.sha256(body).hexdigest()
    claimed = resp.headers.get("Docker-Content-Digest")
    if claimed and claimed != computed:
        raise UserError(f"image {ref}: registry says digest {claimed} but the manifest it sent hashes to {computed}; "
                        "refusing to pin it")
    if ref.digest and ref.digest != computed:
        raise UserError(f"image {ref}: the manifest received hashes to {computed}, not the digest asked for")
    media_type = resp.headers.get("Content-Type", "").split(";")[0].strip()
    try:
        manifest = json.loads(body)
    except ValueError:
        raise UserError(f"image {ref}: the registry sent a manifest that is not JSON") from None
    declared = manifest.get("mediaType") if isinstance(manifest, dict) else None
    media_type = media_type if media_type in MANIFEST_TYPES else (declared or media_type)
    if media_type not in MANIFEST_TYPES:
        raise UserError(f"image {ref}: unsupported manifest type {media_type!r}",
                        "push it as an OCI or Docker schema 2 image")
    if declared and declared != media_type:
        raise UserError(f"image {ref}: Content-Type {media_type} disagrees with the manifest's mediaType {declared}")
    return Resolved(computed, media_type, len(body))


def _reason(exc: Exception) -> str:
    """The useful part of a requests error: its last cause, without the urllib3 pool wrapping."""
    text = str(exc)
    for needle, short in (("Name or service not known", "name resolution failed"),
                          ("NameResolution", "name resolution failed"), ("Connection refused", "connection refused"),
                          ("timed out", "timed out"), ("CERTIFICATE_VERIFY_FAILED", "TLS certificate not trusted"),
                          ("WRONG_VERSION_NUMBER", "it does not speak TLS (plain HTTP?)")):
        if needle in text:
            return short
    return type(exc).__name__


def _registry_error(resp: Any) -> str:
    """The registry's own error code and message, if it sent the standard JSON body."""
    try:
        errors = resp.json().get("errors") or []
        return "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors)[:200]
    except ValueError:
        return resp.reason or ""
