"""`mxc ls` with each bundle's build time and labels, `--label` on build and run, and the
relative references `@`, `@~N`, `label:NAME` wherever a bundle or a run is named.

A label is store-side (bundles) or record-side (runs) and never enters a bundle: the same spec
built with and without labels is the same hash, and the bundle verifies. The real `mxc run
--label` is in tests/test_run_local.py (its shared training run is labelled).
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.conftest import REPO, Mxc, store_snapshot

TINY = str(REPO / "specs/tiny.yaml")


def build(mxc: Mxc, *args: str) -> str:
    out = mxc("build", TINY, "-q", *args)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def entered(home: Path, digest: str, when: float) -> None:
    """Say when a bundle was last built into the store (its directory's time), so order never rests on timing."""
    os.utime(home / "bundles" / digest, (when, when))


def add_run(home: Path, run_id: str, bundle: str, labels: list[str]) -> Path:
    run = home / "runs" / run_id
    run.mkdir(parents=True)
    record = {"run_id": run_id, "bundle": bundle, "spec_name": "tiny", "backend": "local", "status": "succeeded",
              "final": True, "started": "2026-01-01T00:00:00.000Z", "ended": "2026-01-01T00:01:00.000Z",
              "labels": labels}
    (run / "record.json").write_text(json.dumps(record))
    (run / "train.log").write_text(f"log of {run_id}\n")
    return run


def test_labels_stay_outside_the_bundle(mxc: Mxc, mxc_home: Path) -> None:
    plain = build(mxc)
    labelled = build(mxc, "--label", "baseline", "--label", "v1")
    assert labelled == plain  # same spec, same bundle: a label is no part of it
    assert mxc("verify", plain).returncode == 0
    for path in (mxc_home / "bundles" / plain).rglob("*"):
        assert not path.is_file() or b"baseline" not in path.read_bytes()
    out = mxc("build", TINY, "--label", "again", "--json")
    assert json.loads(out.stdout)["labels"] == ["again"] and json.loads(out.stdout)["hash"] == plain


def test_ls_shows_when_each_bundle_was_built_and_its_labels(mxc: Mxc, mxc_home: Path) -> None:
    first = build(mxc, "--label", "base")
    second = build(mxc, "--set", "model.overrides.steps=5", "--label", "short")
    entered(mxc_home, first, datetime(2026, 3, 1, 12, 0, tzinfo=UTC).timestamp())
    entered(mxc_home, second, datetime(2026, 2, 1, 12, 0, tzinfo=UTC).timestamp())  # older: listed first
    rows = json.loads(mxc("ls", "--json").stdout)
    assert [r["hash"] for r in rows] == [second, first]
    assert [r["built"] for r in rows] == ["2026-02-01T12:00:00.000Z", "2026-03-01T12:00:00.000Z"]
    assert [r["labels"] for r in rows] == [["short"], ["base"]]
    table = mxc("ls", env={"TZ": "UTC"}).stdout.splitlines()
    assert table[0].split() == ["HASH", "BUILT", "NAME", "MODEL", "BACKEND", "CONTAINER", "NODES", "LABELS"]
    assert table[1].startswith(second[:12]) and "2026-02-01 12:00" in table[1] and table[1].endswith("short")
    assert table[2].startswith(first[:12]) and "2026-03-01 12:00" in table[2] and table[2].endswith("base")
    assert mxc("ls", "--ids").stdout.split() == [second[:12], first[:12]]


def test_relative_references_to_bundles(mxc: Mxc, mxc_home: Path) -> None:
    old = build(mxc, "--label", "base")
    new = build(mxc, "--set", "model.overrides.steps=5", "--label", "exp")
    entered(mxc_home, old, 1_700_000_000)
    entered(mxc_home, new, 1_700_000_100)

    def shown(ref: str) -> str:
        out = mxc("show", ref, "--json")
        assert out.returncode == 0, out.stderr
        return str(json.loads(out.stdout)["hash"])

    assert shown("@") == new and shown("@~0") == new and shown("@~1") == old
    assert shown("label:base") == old and shown("label:exp") == new
    build(mxc, "--set", "model.overrides.steps=5", "--label", "base")  # labelled again, later: it is now label:base
    assert shown("label:base") == new
    assert mxc("verify", "@~1").stdout.startswith(old[:12])
    diff = mxc("diff", "@~1", "@")
    assert diff.returncode == 1 and "steps" in diff.stdout
    dry = mxc("run", "label:exp", "--dry-run", "--local")
    assert dry.returncode == 0, dry.stderr
    assert new in dry.stdout


def test_at_is_what_run_runs_after_an_unchanged_rebuild(mxc: Mxc, mxc_home: Path) -> None:
    """Build A, build B, build A again (unchanged): A is the current bundle everywhere. `mxc run` used to
    run A (the last build) while `@` was B (the newest to enter the store)."""
    a = build(mxc)
    b = build(mxc, "--set", "model.overrides.steps=5")
    entered(mxc_home, a, 1_700_000_000)  # built long before B, whatever the clock's resolution
    entered(mxc_home, b, 1_700_000_100)
    again = mxc("build", TINY)
    assert again.returncode == 0 and again.stdout.strip() == a and "unchanged" in again.stderr
    shown = json.loads(mxc("show", "@", "--json").stdout)["hash"]
    dry = mxc("run", "--dry-run", "--local")
    assert dry.returncode == 0, dry.stderr
    assert shown == a and a in dry.stdout and b not in dry.stdout
    assert mxc("ls", "--ids").stdout.split() == [b[:12], a[:12]]  # the last line is @; completion lists the same
    assert [r["hash"] for r in json.loads(mxc("ls", "--json").stdout)] == [b, a]
    diff = mxc("diff", "@~1", "@", "--json")
    assert json.loads(diff.stdout)["old"] == b[:12] and json.loads(diff.stdout)["new"] == a[:12]
    assert mxc("verify", "@~1").stdout.startswith(b[:12])


def test_a_rebuild_that_cannot_set_the_build_time_says_it_is_not_the_newest(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Another user's bundle in a shared store: only its owner may set its time, so it stays where it was
    in the order (and `mxc build` says which bundle `mxc run` runs instead)."""
    from mxc.build import compile_file
    from mxc.store import Store

    store, bundle = Store(tmp_path), compile_file(TINY)
    assert store.put(bundle.files, bundle.hash)[1].state == "built"

    def refuse(*_: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr("mxc.store.os.utime", refuse)
    outcome = store.put(bundle.files, bundle.hash)[1]
    assert outcome.state == "unchanged" and outcome.newest is False


@pytest.mark.parametrize(("ref", "message"), [
    ("label:bsae", "mxc: error: no bundle has the label 'bsae' (did you mean 'base'?)"),
    ("label:zzz", "mxc: error: no bundle has the label 'zzz' (labels: base)"),
    ("@~2", "mxc: error: '@~2' names nothing: only 1 bundle (list them with: mxc ls)"),
    ("@x", "mxc: error: '@x' is not a reference (@ is the newest, @~1 the one before, label:NAME)"),
    ("label:", "mxc: error: --label: '' is not a label"),
])
def test_a_reference_to_no_bundle_is_one_line(mxc: Mxc, mxc_home: Path, ref: str, message: str) -> None:
    build(mxc, "--label", "base")
    before = store_snapshot(mxc_home)
    out = mxc("show", ref)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith(message) and out.stderr.count("\n") == 1
    assert store_snapshot(mxc_home) == before


def test_no_bundles_and_bad_labels(mxc: Mxc, mxc_home: Path) -> None:
    out = mxc("show", "@")
    assert out.returncode == 2 and out.stderr == "mxc: error: '@' names nothing: no bundles yet (list them with: mxc ls)\n"
    out = mxc("show", "label:x")
    assert out.returncode == 2 and "no bundle has a label yet (--label NAME)" in out.stderr
    for bad in ("a:b", "@x", "-x", "x" * 65, ""):
        out = mxc("build", TINY, f"--label={bad}")
        assert out.returncode == 2 and out.stderr.startswith(f"mxc: error: --label: '{bad}' is not a label"), out.stderr
        assert store_snapshot(mxc_home) == []  # refused before anything is compiled or written
    out = mxc("run", "--label", "no good")
    assert out.returncode == 2 and "is not a label" in out.stderr


def test_relative_references_to_runs(mxc: Mxc, mxc_home: Path) -> None:
    digest = build(mxc)
    first = add_run(mxc_home, f"20260101-000000-aaaa-{digest[:8]}", digest, ["baseline"])
    second = add_run(mxc_home, f"20260102-000000-bbbb-{digest[:8]}", digest, ["exp", "lr-sweep"])
    third = add_run(mxc_home, f"20260103-000000-cccc-{digest[:8]}", digest, [])
    assert mxc("logs", "@").stdout == f"log of {third.name}\n"
    assert mxc("logs", "@~2").stdout == f"log of {first.name}\n"
    assert mxc("logs", "label:lr-sweep").stdout == f"log of {second.name}\n"
    assert mxc("triage", "label:baseline", "--json").returncode in (0, 1)  # triage names runs the same way
    rows = json.loads(mxc("runs", "--json").stdout)
    assert [r["labels"] for r in rows] == [["baseline"], ["exp", "lr-sweep"], []]
    assert mxc("runs", "--ids").stdout.split() == [first.name, second.name, third.name]
    wrong = mxc("logs", "label:lr-swep")
    assert wrong.returncode == 2 and wrong.stderr == "mxc: error: no run has the label 'lr-swep' (did you mean 'lr-sweep'?)\n"
    far = mxc("logs", "@~3")
    assert far.returncode == 2 and far.stderr == "mxc: error: '@~3' names nothing: only 3 runs (list them with: mxc runs)\n"
