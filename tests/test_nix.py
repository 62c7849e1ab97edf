"""flake.nix: parses, its lock pins what it declares, and `nix flake check` passes against a stub nixpkgs.

The real nixpkgs cannot be fetched here (no GitHub), so the check overrides the input with
tests/nix/stub-nixpkgs, which has exactly the attributes the flake uses: it proves the flake
evaluates for every system with the right output schema, not that nixpkgs builds it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.skipif(shutil.which("nix-instantiate") is None or shutil.which("nix") is None,
                                reason="nix is not installed (scripts/setup.sh --test installs nix-bin)")
STUB = REPO / "tests" / "nix" / "stub-nixpkgs"
FLAKES = ["--extra-experimental-features", "nix-command flakes"]


def test_flake_and_stub_parse() -> None:
    for path in (REPO / "flake.nix", STUB / "flake.nix"):
        result = subprocess.run(["nix-instantiate", "--parse", str(path)], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr


def test_flake_lock_pins_the_declared_nixpkgs() -> None:
    lock = json.loads((REPO / "flake.lock").read_text())
    assert lock["version"] == 7 and lock["root"] == "root"
    assert lock["nodes"]["root"]["inputs"] == {"nixpkgs": "nixpkgs"}
    node = lock["nodes"]["nixpkgs"]
    declared = re.search(r'inputs\.nixpkgs\.url = "github:([^/]+)/([^/]+)/([^"]+)"', (REPO / "flake.nix").read_text())
    assert declared is not None
    assert (node["original"]["owner"], node["original"]["repo"], node["original"]["ref"]) == declared.groups()
    locked = node["locked"]
    assert re.fullmatch(r"[0-9a-f]{40}", locked["rev"]) and locked["narHash"].startswith("sha256-")
    assert locked["type"] == "github" and isinstance(locked["lastModified"], int)


def flake_check(tmp: Path, flake_text: str) -> subprocess.CompletedProcess[str]:
    flake = tmp / "flake"
    flake.mkdir(parents=True, exist_ok=True)
    (flake / "flake.nix").write_text(flake_text)
    for name in ("flake.lock", "pyproject.toml"):
        shutil.copyfile(REPO / name, flake / name)
    stub = tmp / "stub"
    if not stub.exists():
        shutil.copytree(STUB, stub)
    env = {**os.environ, "HOME": str(tmp), "XDG_CACHE_HOME": str(tmp / "cache"), "NIX_CONFIG": "build-users-group ="}
    return subprocess.run(
        ["nix", *FLAKES, "--store", str(tmp / "store"), "flake", "check", "--no-write-lock-file",
         "--override-input", "nixpkgs", f"path:{stub}", f"path:{flake}"],
        capture_output=True, text=True, timeout=300, env=env,
    )


def test_nix_flake_check_against_the_stub(tmp_path: Path) -> None:
    text = (REPO / "flake.nix").read_text()
    ok = flake_check(tmp_path / "ok", text)
    assert ok.returncode == 0, ok.stderr
    # The check is real: a misspelled package or a broken output fails it.
    typo = flake_check(tmp_path / "typo", text.replace("pkgs.shellcheck", "pkgs.shelcheck"))
    assert typo.returncode != 0 and "shelcheck" in typo.stderr
    bad = flake_check(tmp_path / "bad", text.replace('mainProgram = "mxc";', 'mainProgram = "other";'))
    assert bad.returncode != 0 and "assertion" in bad.stderr
