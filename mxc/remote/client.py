"""The laptop's side: calls of the login node's ``mxc remote-agent``, each one quoted command over ssh."""

from __future__ import annotations

import io
import json
import shlex
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from typing import Any

from mxc import __version__
from mxc.errors import UserError
from mxc.remote import ssh
from mxc.remote.profiles import Cluster
from mxc.remote.sync import MARK, Transfer, frame, pack

PROBE_TIMEOUT = 120.0  # the remote mxc's start and a look at one bundle
MAX_REPORT_BYTES = 512 << 20


def agent_command(cluster: Cluster, action: str, *args: str, check_version: bool = True) -> str:
    """``<mxc> remote-agent [--expect-version V] [--home H] [--runs-dir R] ACTION ARGS``, every word
    quoted for the login shell (values are only ever data there)."""
    words = [*cluster.mxc, "remote-agent"]
    if check_version:
        words += ["--expect-version", __version__]
    if cluster.home is not None:
        words += ["--home", cluster.home]
    if cluster.runs_dir is not None:
        words += ["--runs-dir", cluster.runs_dir]
    return shlex.join([*words, action, *args])


def _json_answer(cluster: Cluster, code: int, out: bytes, what: str) -> dict[str, Any]:
    if code != 0:
        raise SystemExit(code)  # the remote mxc said why, in one line on stderr (passed on)
    lines = [line for line in out.decode("utf-8", "replace").splitlines() if line.strip()]
    try:
        data = json.loads(lines[-1]) if lines else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise UserError(f"cluster {cluster.name}: {what}: the mxc on {cluster.login} gave no answer mxc can read",
                        "does a login shell start-up file print on non-interactive logins? (scp breaks too)", code=1)
    return data


def probe(cluster: Cluster, bundle: str | None = None, check_version: bool = True) -> dict[str, Any]:
    """What the login node's mxc says of itself (version, sbatch, store) and of ``bundle``."""
    args = ["--bundle", bundle] if bundle is not None else []
    code, out = ssh.run(cluster, agent_command(cluster, "probe", *args, check_version=check_version),
                        timeout=PROBE_TIMEOUT)
    return _json_answer(cluster, code, out, "probe")


def push(cluster: Cluster, bundle: Any) -> Transfer:
    """Copy ``bundle`` (a verified StoredBundle) to the login node's store unless it holds it intact."""
    started = time.monotonic()
    found = probe(cluster, bundle.hash).get("bundle") or {}
    if found.get("intact"):
        return Transfer(cluster.name, bundle.hash, copied=False, seconds=time.monotonic() - started)
    data, files = pack(bundle.path, bundle.hash)
    code, out = ssh.run(cluster, agent_command(cluster, "receive", bundle.hash), input=data,
                        timeout=PROBE_TIMEOUT + len(data) / 100_000)
    answer = _json_answer(cluster, code, out, f"copying bundle {bundle.hash[:12]}")
    if answer.get("bundle") != bundle.hash:
        raise UserError(f"cluster {cluster.name}: the login node stored {answer.get('bundle')!r}, "
                        f"not bundle {bundle.hash[:12]}", code=1)
    return Transfer(cluster.name, bundle.hash, copied=True, files=files, bytes=len(data),
                    seconds=time.monotonic() - started)


def submit(cluster: Cluster, bundle: Any, argv: list[str], told: Callable[[Transfer], None]) -> int:
    """``argv`` (an ``mxc run HASH ...``) there in one call: the login node's mxc says whether its store
    holds ``bundle``; if not, it is sent (``sync.frame``) and stored there, verified, before the run
    starts. ``told`` hears what was copied; the command's output streams on; its exit status."""
    started = time.monotonic()
    transfer: Transfer | None = None
    with ssh.opened(cluster, agent_command(cluster, "submit", bundle.hash, *argv), stdout=subprocess.PIPE) as process:
        assert process.stdin is not None and isinstance(process.stdout, io.BufferedReader)  # Popen's, buffered
        sent = (0, 0)
        said = f"{MARK} {bundle.hash} "
        while transfer is None and (line := process.stdout.readline(1 << 16)):
            text = line.decode("utf-8", "replace").strip()
            if not text.startswith(said):
                continue  # what a login shell's start-up files printed before the agent spoke
            state = text[len(said):]
            if state == "wanted":
                data, files = pack(bundle.path, bundle.hash)
                process.stdin.write(frame(data))
                process.stdin.flush()
                sent = (files, len(data))
            elif state == "stored":
                transfer = Transfer(cluster.name, bundle.hash, True, *sent, time.monotonic() - started)
            elif state == "present":
                transfer = Transfer(cluster.name, bundle.hash, False, seconds=time.monotonic() - started)
        if transfer is not None:
            told(transfer)
        out = sys.stdout.buffer
        while chunk := process.stdout.read1(1 << 16):
            out.write(chunk)
            out.flush()
        process.wait()
    return ssh.exit_status(cluster, process.returncode)


def forward(cluster: Cluster, argv: list[str]) -> int:
    """An ordinary mxc command run there (``remote-agent run ARGV``), output streamed; its exit status."""
    return ssh.stream(cluster, agent_command(cluster, "run", *argv))


def report(cluster: Cluster, refs: list[str], suffix: str, no_tsdb: bool) -> tuple[bytes, dict[str, Any]]:
    """The report made on the login node: (the file's bytes, the summary ``mxc report --json`` prints)."""
    args = ["--suffix", suffix, *(["--no-tsdb"] if no_tsdb else []), *refs]
    code, out = ssh.run(cluster, agent_command(cluster, "report", *args), limit=MAX_REPORT_BYTES)
    if code != 0:
        raise SystemExit(code)  # the remote mxc said why (passed on)
    content: bytes | None = None
    summary: dict[str, Any] | None = None
    try:
        with tarfile.open(fileobj=io.BytesIO(out), mode="r:") as tar:
            for member in tar:
                reader = tar.extractfile(member) if member.isreg() else None
                if reader is None:
                    continue
                if member.name == f"report{suffix}":
                    content = reader.read()
                elif member.name == "report.json":
                    summary = json.loads(reader.read())
    except (tarfile.TarError, ValueError):
        content = None
    if content is None or not isinstance(summary, dict):
        raise UserError(f"cluster {cluster.name}: the report from {cluster.login} did not arrive whole", code=1)
    return content, summary
