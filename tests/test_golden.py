"""Golden bundles: every file of the bundle of every shipped spec, committed under tests/golden/<spec>/.

A change to any rendered byte (a template, the contract, the node program) shows up here as a
diff to review. Refresh after an intended change, then read the diff before committing:

    MXC_UPDATE_GOLDEN=1 pytest tests/test_golden.py && git diff tests/golden

Bundles are compiled in-process with fixed inputs: the shipped spec and ``GOLDEN_VERSION`` as
mxc's version (so a version bump alone does not churn the files). Files under ``mxc_node/`` are
copied verbatim from ``mxc/node/``; the golden manifest holds their hashes, so they are compared
through it instead of being stored once more per spec.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from mxc.compiler import compile_spec
from tests.conftest import REPO, RUNNABLE_SPECS

GOLDEN = REPO / "tests" / "golden"
GOLDEN_VERSION = "golden"
VERBATIM_PREFIX = "mxc_node/"  # the node program's own files, covered by the manifest's hashes
REFRESH = "MXC_UPDATE_GOLDEN=1 pytest tests/test_golden.py, then review `git diff tests/golden`"


def rendered(spec: Path) -> dict[str, str]:
    bundle = compile_spec(str(spec), lambda path: Path(path).read_bytes(), mxc_version=GOLDEN_VERSION)
    return {name: text for name, text in bundle.files.items() if not name.startswith(VERBATIM_PREFIX)}


def stored(directory: Path) -> dict[str, str]:
    if not directory.is_dir():
        return {}
    return {str(p.relative_to(directory)): p.read_text("utf-8") for p in sorted(directory.rglob("*")) if p.is_file()}


def first_difference(old: str, new: str) -> str:
    for number, (a, b) in enumerate(zip(old.splitlines(), new.splitlines(), strict=False), 1):
        if a != b:
            return f"line {number}: golden {a!r}, now {b!r}"
    return f"length: golden {len(old.splitlines())} lines, now {len(new.splitlines())}"


@pytest.mark.parametrize("spec", RUNNABLE_SPECS, ids=lambda p: p.stem)
def test_bundle_matches_its_golden_files(spec: Path) -> None:
    directory = GOLDEN / spec.stem
    now = rendered(spec)
    if os.environ.get("MXC_UPDATE_GOLDEN") == "1":
        shutil.rmtree(directory, ignore_errors=True)
        for name, text in now.items():
            (directory / name).parent.mkdir(parents=True, exist_ok=True)
            (directory / name).write_text(text, "utf-8")
    golden = stored(directory)
    problems = [f"{name}: new file" for name in sorted(set(now) - set(golden))]
    problems += [f"{name}: no longer rendered" for name in sorted(set(golden) - set(now))]
    problems += [f"{name}: {first_difference(golden[name], now[name])}"
                 for name in sorted(set(now) & set(golden)) if golden[name] != now[name]]
    assert not problems, (f"the bundle of specs/{spec.name} differs from tests/golden/{spec.stem}/:\n  "
                          + "\n  ".join(problems) + f"\nIf the change is intended, refresh: {REFRESH}")


def test_every_shipped_spec_has_golden_files() -> None:
    assert sorted(p.name for p in GOLDEN.iterdir() if p.is_dir()) == sorted(s.stem for s in RUNNABLE_SPECS), REFRESH
