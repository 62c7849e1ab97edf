"""A real OCI registry for tests: Debian's docker-registry on a free loopback port, fed by skopeo.

Images are written as OCI layouts by hand (one small layer), so no image has to be pulled;
``push`` copies one to the registry as an OCI manifest, a Docker schema 2 manifest, or an
OCI index (multi-platform shape), the manifest types ``mxc lock`` must resolve.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import hashlib
import io
import json
import shutil
import socket
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

REGISTRY_BIN = "/usr/bin/docker-registry"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def _registry_process(root: Path, extra_config: str = "") -> Iterator[str]:
    """Start docker-registry on a free loopback port with its data under ``root``; stop it by pid."""
    if not Path(REGISTRY_BIN).exists():
        pytest.fail(f"{REGISTRY_BIN} is missing: scripts/setup.sh --test installs docker-registry")
    for _ in range(5):
        port = free_port()
        config = root / "config.yml"
        config.write_text(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
            f"    rootdirectory: {root / 'data'}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: 127.0.0.1:{port}\n" + extra_config
        )
        log = (root / "registry.log").open("w")
        proc = subprocess.Popen([REGISTRY_BIN, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                requests.get(f"http://127.0.0.1:{port}/v2/", timeout=1)
                break
            except requests.RequestException:
                time.sleep(0.1)
        if proc.poll() is None:
            break
        log.close()  # lost the port race: try another
    else:
        pytest.fail("docker-registry did not start: " + (root / "registry.log").read_text()[-500:])
    try:
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``127.0.0.1:PORT`` of a registry started for this module (and stopped by its pid)."""
    with _registry_process(tmp_path_factory.mktemp("registry")) as address:
        yield address


class TokenIssuer:
    """A token server for the registry's ``auth: token`` mode: grants any scope asked for, anonymously.

    It signs RS256 JWTs with a self-signed certificate that the registry trusts
    (``rootcertbundle``) and names in the token header (``x5c``), as Docker Hub's auth does.
    """

    def __init__(self, root: Path, service: str, issuer: str) -> None:
        import datetime

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
        from cryptography.x509.oid import NameOID

        self.service, self.issuer = service, issuer
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)])
        now = datetime.datetime.now(datetime.UTC)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(self.key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .sign(self.key, hashes.SHA256()))
        self.cert_pem = root / "token-cert.pem"
        self.cert_pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        self.cert_der = base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()
        self.issued = 0

    def token(self, scopes: list[str]) -> str:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding

        def b64(data: bytes) -> str:
            return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

        access = []
        for scope in scopes:
            kind, _, rest = scope.partition(":")
            name, _, actions = rest.rpartition(":")
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
        now = int(time.time())
        header = {"typ": "JWT", "alg": "RS256", "x5c": [self.cert_der]}
        claims = {"iss": self.issuer, "sub": "", "aud": self.service, "exp": now + 600, "nbf": now - 10,
                  "iat": now, "jti": f"t{now}-{self.issued}", "access": access}
        signing = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"
        signature = self.key.sign(signing.encode(), padding.PKCS1v15(), hashes.SHA256())
        self.issued += 1
        return f"{signing}.{b64(signature)}"


@pytest.fixture(scope="module")
def token_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, TokenIssuer]]:
    """A registry that answers 401 with a Bearer challenge, and its token server (both on loopback)."""
    import http.server
    import threading
    import urllib.parse

    root = tmp_path_factory.mktemp("token-registry")
    issuer = TokenIssuer(root, "mxc-test-registry", "mxc-test-issuer")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
            body = json.dumps({"token": issuer.token(query.get("scope", []))}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    auth = (f"auth:\n  token:\n    realm: http://127.0.0.1:{server.server_address[1]}/token\n"
            f"    service: {issuer.service}\n    issuer: {issuer.issuer}\n    rootcertbundle: {issuer.cert_pem}\n")
    try:
        with _registry_process(root, auth) as address:
            yield address, issuer
    finally:
        server.shutdown()
        server.server_close()


def _blob(layout: Path, data: bytes) -> tuple[str, int]:
    digest = hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    (layout / "blobs" / "sha256" / digest).write_bytes(data)
    return f"sha256:{digest}", len(data)


def oci_layout(layout: Path, tag: str, files: dict[str, bytes], *, index: bool = False) -> None:
    """Write a one-layer image (``files`` at /) as an OCI layout; optionally wrapped in an index."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    layer = gzip.compress(raw.getvalue(), mtime=0)
    layer_digest, layer_size = _blob(layout, layer)
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                         "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(raw.getvalue()).hexdigest()]}},
                        sort_keys=True).encode()
    config_digest, config_size = _blob(layout, config)
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config_size},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": layer_digest, "size": layer_size}],
    }, sort_keys=True).encode()
    top_type, (top_digest, top_size) = OCI_MANIFEST, _blob(layout, manifest)
    if index:
        idx = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
            {"mediaType": OCI_MANIFEST, "digest": top_digest, "size": top_size,
             "platform": {"architecture": "amd64", "os": "linux"}}]}, sort_keys=True).encode()
        top_type, (top_digest, top_size) = OCI_INDEX, _blob(layout, idx)
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": top_type, "digest": top_digest, "size": top_size,
         "annotations": {"org.opencontainers.image.ref.name": tag}}]}))


def push(registry: str, repo: str, tag: str, files: dict[str, bytes], work: Path, *,
         kind: str = "oci") -> None:
    """Push a fresh image with ``files`` to ``registry/repo:tag`` as kind oci, docker or index."""
    content = hashlib.sha256(repr(sorted(files.items())).encode()).hexdigest()[:8]
    layout = work / f"layout-{repo.replace('/', '_')}-{tag}-{kind}-{content}"
    if layout.exists():
        shutil.rmtree(layout)
    oci_layout(layout, tag, files, index=(kind == "index"))
    cmd = ["skopeo", "copy", "--quiet", "--dest-tls-verify=false"]
    if kind == "docker":
        cmd += ["--format", "v2s2"]
    elif kind == "oci":
        cmd += ["--format", "oci"]
    else:
        cmd += ["--all"]
    subprocess.run([*cmd, f"oci:{layout}:{tag}", f"docker://{registry}/{repo}:{tag}"], check=True,
                   capture_output=True, text=True, timeout=120)


def manifest_digest(registry: str, repo: str, tag: str, accept: str) -> tuple[str, str]:
    """What the registry itself serves for a tag: (sha256 of the bytes, content type)."""
    resp = requests.get(f"http://{registry}/v2/{repo}/manifests/{tag}", headers={"Accept": accept}, timeout=10)
    resp.raise_for_status()
    return "sha256:" + hashlib.sha256(resp.content).hexdigest(), resp.headers["Content-Type"]
