"""Set-up installs exactly the locks: the project's .venv equals lockfiles/requirements-dev.txt.

scripts/setup.sh syncs the venv to a hashed lock with uv (tools/lock_setup.sh makes the locks), so
the embedded default trains with the same packages on every machine, the day a dependency releases
or not. These tests read the locks and the venv setup.sh made; they need no network.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from tests.conftest import REPO

LOCKS = REPO / "lockfiles"
VENV_PYTHON = REPO / ".venv" / "bin" / "python"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name.split("[")[0]).lower()


def pins(path: Path) -> dict[str, str]:
    """name -> version of every ``name==version`` line of a lock (every one carries a hash)."""
    out: dict[str, str] = {}
    text = path.read_text()
    for block in re.split(r"\n(?=\S)", text):
        match = re.match(r"^([A-Za-z0-9_.\-\[\],]+)==(\S+)", block)
        if match:
            assert "--hash=sha256:" in block, f"{path.name}: {match[1]} has no hash"
            out[canonical(match[1])] = match[2]
    return out


def test_the_venv_is_exactly_the_dev_lock() -> None:
    assert VENV_PYTHON.exists(), "run scripts/setup.sh --test first (it makes .venv from the lock)"
    code = ("import importlib.metadata as m, json; "
            "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))")
    out = subprocess.run([str(VENV_PYTHON), "-c", code], capture_output=True, text=True, check=True)
    installed = {canonical(k): v for k, v in json.loads(out.stdout).items()}
    assert installed.pop("mxc") == "0.1.0"  # the project itself, installed without dependencies
    locked = pins(LOCKS / "requirements-dev.txt")
    assert installed == locked, {
        "not locked": sorted(set(installed) - set(locked)),
        "missing": sorted(set(locked) - set(installed)),
        "other version": sorted((k, installed[k], v) for k, v in locked.items() if k in installed and installed[k] != v),
    }


def test_the_locks_agree_with_each_other_and_with_their_inputs() -> None:
    train, tool, dev = (pins(LOCKS / f"requirements-{n}.txt") for n in ("train", "mxc", "dev"))
    # The training lock (which specs' lock.json files hash) is a subset of the set-up locks, same versions.
    assert {k: tool.get(k) for k in train} == train
    assert {k: dev.get(k) for k in tool} == tool
    # Every top-level pin of an .in file is in its lock at that version.
    for name in ("mxc", "dev"):
        lock = pins(LOCKS / f"requirements-{name}.txt")
        for line in (LOCKS / f"requirements-{name}.in").read_text().splitlines():
            match = re.match(r"^([A-Za-z0-9_.\-\[\]]+)==(\S+)$", line.strip())
            if match:
                assert lock.get(canonical(match[1])) == match[2], f"requirements-{name}.txt is stale: {line}"
    # uv is bootstrapped from its own lock, at the version the locks pin.
    assert pins(LOCKS / "requirements-bootstrap.txt") == {"uv": dev["uv"]}
