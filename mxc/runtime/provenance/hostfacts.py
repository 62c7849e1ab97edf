"""What a run ran on, and how this machine differs from it (drift before a rerun).

Library versions are read from the *training* interpreter in a subprocess through
``importlib.metadata``: mxc never imports jax (slow, and possibly a different Python than
the one training uses). The full ``name==version`` list is hashed into an environment
digest, the native-run equivalent of an image digest or a lockfile hash.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mxc.fsutil import loads
from mxc.node.contract import RunContract

KEY_PACKAGES = ("jax", "jaxlib", "maxtext", "flax", "optax", "orbax-checkpoint", "numpy")

# Runs in the training interpreter; prints one JSON object on a line of its own after MARKER (a
# wrapper script or sitecustomize may print a banner around it). Never imports jax.
MARKER = "mxc-host-facts: "
_PROBE = "MARKER = " + repr(MARKER) + r"""
import importlib.metadata as md, json, sys, importlib.util
dists = {}
for d in md.distributions():
    name = (d.metadata["Name"] or "").lower().replace("_", "-")
    if name:
        dists[name] = d.version
spec = importlib.util.find_spec("maxtext")
print("\n" + MARKER + json.dumps({
    "executable": sys.executable,
    "version": sys.version.split()[0],
    "packages": dists,
    "maxtext_location": (list(spec.submodule_search_locations or []) or [spec.origin])[0] if spec else None,
}))
"""


def python_facts(python: str, timeout: float = 60.0) -> dict[str, Any]:
    """Version facts of an interpreter; ``{"error": ...}`` when it cannot be asked."""
    try:
        proc = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, errors="replace", timeout=timeout,
                              env={**os.environ, "PYTHONWARNINGS": "ignore"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"{python}: {exc}"}
    if proc.returncode != 0:
        return {"error": f"{python}: exit {proc.returncode}: {proc.stderr.strip()[-300:]}"}
    data = _facts_line(proc.stdout)
    if data is None:
        return {"error": f"{python}: printed no host facts (is it a Python interpreter?)"}
    packages: dict[str, str] = data.pop("packages")
    listing = "".join(f"{k}=={v}\n" for k, v in sorted(packages.items()))
    data["packages"] = {k: packages[k] for k in KEY_PACKAGES if k in packages}
    data["environment_digest"] = "sha256:" + hashlib.sha256(listing.encode()).hexdigest()
    data["all_packages"] = dict(sorted(packages.items()))
    return data


def _facts_line(stdout: str) -> dict[str, Any] | None:
    """The probe's JSON, whatever else the interpreter printed; None when it is missing or misshapen."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(MARKER):
            try:
                data = loads(line[len(MARKER):])
            except ValueError:
                return None
            packages = data.get("packages") if isinstance(data, dict) else None
            if not isinstance(packages, dict):
                return None
            facts = {k: v for k, v in data.items() if k in ("executable", "version", "maxtext_location")}
            return {**facts, "packages": {k: v for k, v in packages.items() if isinstance(v, str)}}
    return None


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpus(timeout: float = 10.0) -> list[str]:
    """GPU names from nvidia-smi or rocm-smi when present; [] on a CPU machine."""
    commands = []
    if shutil.which("nvidia-smi"):
        commands.append(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    if shutil.which("rocm-smi"):
        commands.append(["rocm-smi", "--showproductname", "--csv"])
    names: list[str] = []
    for cmd in commands:
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        names += [line.strip() for line in out.splitlines() if line.strip() and not line.startswith("device")]
    return names


def collect(python: str | None) -> dict[str, Any]:
    """Host facts for record.json; ``python`` is the training interpreter (None: inside a container)."""
    facts: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "os": platform.platform(),
        "cpu": {"model": cpu_model(), "count": os.cpu_count()},
        "gpus": gpus(),
    }
    if python:
        facts["python"] = python_facts(python)
    return facts


def lockfile_digest(bundle_dir: Path) -> str | None:
    """sha256 of the bundle's lock.json (``mxc build --locked``), if it has one."""
    try:
        return "sha256:" + hashlib.sha256((bundle_dir / "lock.json").read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def image_facts(contract: RunContract, host: Mapping[str, Any], lockfile: str | None = None) -> dict[str, Any]:
    """record.image: the container image pinned by digest, or for native runs the environment digest;
    plus the bundle's lockfile hash when it was built from one."""
    c = contract.container
    out: dict[str, Any] = {"container": c.kind}
    if c.image_ref:
        out.update(ref=c.image_ref, digest=c.image_digest)
    if lockfile:
        out["lockfile"] = lockfile
    digest = (host.get("python") or {}).get("environment_digest")
    if digest:
        out["environment_digest"] = digest
    return out


def code_facts(contract: RunContract, host: Mapping[str, Any], pinned: Mapping[str, Any] | None) -> dict[str, Any]:
    """record.code: the pinned commit's export, the image whose MaxText runs (code.from_image), or the
    maxtext release the spec pins and what is installed."""
    if pinned:
        return dict(pinned)
    if contract.code.from_image:
        c = contract.container
        return {"source": "image", "image_ref": c.image_ref, "image_digest": c.image_digest,
                "entry": contract.train.script or contract.train.module}
    wanted = contract.code.maxtext_version
    if not wanted:
        return {}
    python = host.get("python") or {}
    out: dict[str, Any] = {"maxtext_version": wanted}
    if python.get("packages", {}).get("maxtext"):
        out["maxtext_installed"] = python["packages"]["maxtext"]
        out["maxtext_location"] = python.get("maxtext_location")
    return out


def _section(facts: Mapping[str, Any], key: str) -> dict[str, Any]:
    """A mapping inside recorded facts; {} where a (damaged or hand-edited) record has anything else."""
    value = facts.get(key) if isinstance(facts, Mapping) else None
    return {str(k): v for k, v in value.items()} if isinstance(value, Mapping) else {}


@dataclass(frozen=True)
class Drift:
    what: str
    recorded: Any
    now: Any
    significant: bool = True

    def __str__(self) -> str:
        return f"{self.what}: {self.recorded} -> {self.now}"


def compare(recorded: dict[str, Any], current: dict[str, Any]) -> list[Drift]:
    """Differences that can change results (versions, CPU/GPU, image, code) plus the hostname (informational).

    Both arguments are ``{"host": ..., "image": ..., "code": ...}`` as in record.json.
    """
    drifts: list[Drift] = []
    rh, ch = _section(recorded, "host"), _section(current, "host")
    if rh.get("hostname") != ch.get("hostname"):
        drifts.append(Drift("hostname", rh.get("hostname"), ch.get("hostname"), significant=False))
    for key in ("model", "count"):
        old, new = _section(rh, "cpu").get(key), _section(ch, "cpu").get(key)
        if old != new:
            drifts.append(Drift(f"cpu {key}", old, new))
    if rh.get("gpus", []) != ch.get("gpus", []):
        drifts.append(Drift("gpus", rh.get("gpus") or "none", ch.get("gpus") or "none"))
    rp, cp = _section(rh, "python"), _section(ch, "python")
    if rp.get("version") != cp.get("version"):
        drifts.append(Drift("python", rp.get("version"), cp.get("version")))
    old_all = _section(rp, "all_packages") or _section(rp, "packages")
    new_all = _section(cp, "all_packages") or _section(cp, "packages")
    names = sorted(set(old_all) | set(new_all), key=lambda n: (n not in KEY_PACKAGES, n))  # jax & co. first
    for name in names:
        if old_all.get(name) != new_all.get(name):
            drifts.append(Drift(name, old_all.get(name, "not installed"), new_all.get(name, "not installed")))
    for section in ("image", "code"):
        old_s, new_s = _section(recorded, section), _section(current, section)
        for key in sorted(set(old_s) | set(new_s)):
            if key in ("dir", "maxtext_location"):
                continue  # where the code lives is not what it is
            if old_s.get(key) != new_s.get(key):
                drifts.append(Drift(f"{section} {key}", old_s.get(key), new_s.get(key)))
    other = (set(old_all) | set(new_all)) - set(KEY_PACKAGES)
    return sorted(drifts, key=lambda d: d.what in other)  # stable: everything else before other packages
