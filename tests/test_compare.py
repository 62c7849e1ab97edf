"""`mxc compare`: spec fields, environment drift, the first step where losses diverge, step time.

The real part trains the tiny model three times (10 steps each): twice from one bundle
(bit-identical losses, no drift) and once with another learning rate (a spec change and a
divergence at an early step).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from mxc.runtime.record import RunRecord
from mxc.runtime.rundir import RunDir
from mxc.runtime.triage.compare import Series, compare_runs, loss_diff, same
from mxc.store import Store
from tests.conftest import REPO, Mxc, copy_specs

TINY = REPO / "specs" / "tiny.yaml"


# ---- unit: the arithmetic of divergence


def series(losses: dict[int, float], times: dict[int, float] | None = None) -> Series:
    return Series(loss=dict(losses), step_time=dict(times or {}))


def test_exact_and_tolerant_divergence() -> None:
    a = series({0: 6.0, 1: 5.9, 2: 5.8, 3: 5.7})
    b = series({0: 6.0, 1: 5.9, 2: 5.8 + 1e-9, 3: 5.6})
    d = loss_diff(a, b, rtol=1e-6, atol=0.0)
    assert d.first_diverging_exact == 2  # not bit-identical from step 2
    assert d.first_diverging_tolerance == 3  # but within tolerance until step 3
    assert d.max_abs_diff_step == 3 and math.isclose(d.max_abs_diff or 0, 0.1, rel_tol=1e-9)
    assert d.common_steps == 4 and d.only_a == [] and d.only_b == []


def test_nan_and_missing_steps() -> None:
    a = series({0: 6.0, 1: math.nan, 2: 5.0})
    b = series({0: 6.0, 1: math.nan, 3: 4.0})
    d = loss_diff(a, b, rtol=1e-5, atol=1e-8)
    assert d.first_diverging_exact is None  # NaN at the same step is the same outcome
    assert d.only_a == [2] and d.only_b == [3]
    assert same(math.nan, math.nan) and not same(math.nan, 1.0) and same(1.0, 1.0 + 1e-12, rtol=1e-9)


def test_step_time_skips_warmup() -> None:
    s = series({}, {0: 9.0, 1: 5.0, 2: 0.1, 3: 0.3, 4: 0.2})
    assert s.median_step_time() == 0.2


def _fake_run(home: Path, stamp: str, spec: dict[str, Any], losses: list[float], host: dict[str, Any]) -> RunDir:
    """A run ``<stamp>-<bundle prefix>`` of a real bundle holding ``spec``, with a record and metrics."""
    from mxc.compiler.manifest import build_manifest, bundle_hash
    from mxc.store import Store

    files = {"spec.json": json.dumps(spec)}  # a real hash-addressed bundle: compare reads only verified specs
    manifest = build_manifest(files, "test")
    bundle = bundle_hash(manifest)
    Store(home).put({**files, "manifest.json": manifest}, bundle)
    run_id = f"{stamp}-{bundle[:8]}"
    run = RunDir(home / "runs" / run_id)
    run.path.mkdir(parents=True)
    RunRecord(run_id=run_id, bundle=bundle, spec_name="t", backend="local", status="succeeded", final=True,
              started="2026-01-01T00:00:00Z", host=host).save(run.record)
    run.metrics.write_text("".join(json.dumps({"learning/loss": v, "perf/step_time_seconds": 0.01 * (i + 1), "step": float(i)})
                                   + "\n" for i, v in enumerate(losses)))
    return run


def test_compare_runs_reports_spec_and_environment(tmp_path: Path) -> None:
    host_a = {"hostname": "n1", "cpu": {"model": "X", "count": 8}, "gpus": [],
              "python": {"version": "3.12.1", "all_packages": {"jax": "0.12.0", "numpy": "2.5"}}}
    host_b = {**host_a, "hostname": "n2", "python": {"version": "3.12.1", "all_packages": {"jax": "0.12.1", "numpy": "2.5"}}}
    a = _fake_run(tmp_path, "20260101-000000-0000", {"model": {"overrides": {"steps": 3}}}, [6.0, 5.0, 4.0], host_a)
    b = _fake_run(tmp_path, "20260101-000001-0000", {"model": {"overrides": {"steps": 4}}}, [6.0, 5.5, 4.0, 3.0],
                  host_b)
    result = compare_runs(Store(tmp_path), (a, RunRecord.load(a.record)), (b, RunRecord.load(b.record)))
    assert [(c.key, c.old, c.new) for c in result.spec_changes] == [("model.overrides.steps", 3, 4)]
    drift = {d.what: (d.recorded, d.now, d.significant) for d in result.drift}
    assert drift["jax"] == ("0.12.0", "0.12.1", True) and drift["hostname"] == ("n1", "n2", False)
    assert result.losses.first_diverging_exact == 1 and result.losses.only_b == [3]
    # medians after the 2 warm-up steps: a 0.03 (step 2), b 0.035 (steps 2 and 3)
    assert result.step_time_ratio is not None and math.isclose(result.step_time_ratio, 0.035 / 0.03)
    data = result.as_dict()
    assert data["losses"]["only_b_count"] == 1 and data["environment"][0]["what"] in ("hostname", "jax")


def test_compare_exits_1_when_runs_differ_as_diff_does(mxc: Mxc, mxc_home: Path) -> None:
    """`mxc diff` exits 1 on differences; `mxc compare` exited 0 whatever it found."""
    host = {"hostname": "n1", "python": {"version": "3.12.1", "all_packages": {"jax": "0.12.0"}}}
    a = _fake_run(mxc_home, "20260101-000000-0000", {"x": 1}, [6.0, 5.0, 4.0], host)
    same_run = _fake_run(mxc_home, "20260101-000001-0000", {"x": 1}, [6.0, 5.0, 4.0], {**host, "hostname": "n2"})
    other = _fake_run(mxc_home, "20260101-000002-0000", {"x": 1}, [6.0, 5.0, 3.0], host)
    out = mxc("compare", a.run_id, same_run.run_id)
    assert out.returncode == 0, out.stdout + out.stderr  # another host name is a note, not a difference
    out = mxc("compare", a.run_id, other.run_id)
    assert out.returncode == 1 and "first step beyond rtol=1e-05 atol=1e-08: 2" in out.stdout, out.stdout
    out = mxc("compare", a.run_id, other.run_id, "--json")
    assert out.returncode == 1 and json.loads(out.stdout)["differs"] is True


# ---- real: three tiny trainings


def _train(home: Path, spec: Path | None, bundle: str | None = None) -> str:
    env = {**os.environ, "MXC_HOME": str(home), "MXC_JAX_CACHE": str(home.parent / "jax-cache")}
    if bundle is None:
        built = subprocess.run([sys.executable, "-m", "mxc", "build", "-q", str(spec)], cwd=REPO, env=env,
                               capture_output=True, text=True, timeout=120)
        assert built.returncode == 0, built.stderr
        bundle = built.stdout.strip()
    out = subprocess.run([sys.executable, "-m", "mxc", "run", "-q", bundle], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str, str]:
    root = tmp_path_factory.mktemp("compare")
    home = root / "mxc-home"
    copy_specs(root)
    base: dict[str, Any] = {
        "extends": "specs/tiny.yaml", "model": {"overrides": {"steps": 10, "learning_rate_schedule_steps": 10}},
        "checkpoint": {"period": 0}, "runtime": {"preflight": {"stale_processes": False}},
    }
    spec_a = root / "a.yaml"
    spec_a.write_text(yaml.safe_dump(base))
    spec_c = root / "c.yaml"
    spec_c.write_text(yaml.safe_dump({**base, "model": {"overrides": {**base["model"]["overrides"], "learning_rate": 1e-3}}}))
    run_a = _train(home, spec_a)
    bundle_a = json.loads((home / "runs" / run_a / "record.json").read_text())["bundle"]
    run_b = _train(home, None, bundle_a)
    run_c = _train(home, spec_c)
    return home, run_a, run_b, run_c


@pytest.mark.training
def test_same_bundle_twice_is_bit_identical(three_runs: tuple[Path, str, str, str], mxc: Mxc) -> None:
    home, a, b, _ = three_runs
    out = mxc("compare", a, b, env={"MXC_HOME": str(home)})
    assert out.returncode == 0, out.stderr  # nothing differs
    assert "spec: identical" in out.stdout
    assert "losses: 10 common steps (0..9)" in out.stdout and "bit-identical at every common step" in out.stdout
    assert "environment: 0 significant difference(s)" in out.stdout or "environment: identical" in out.stdout
    assert "b/a = " in out.stdout
    # a run that trained fine keeps no post-mortem leftovers (entrypoint.sh's marker, cores, stacks)
    for run_id in (a, b):
        run = home / "runs" / run_id
        assert not list(run.glob("ranks/*/.postmortem*")) and not (run / "cores").exists() and not (run / "stacks").exists()


@pytest.mark.training
def test_another_learning_rate_diverges(three_runs: tuple[Path, str, str, str], mxc: Mxc, tmp_path: Path) -> None:
    home, a, _, c = three_runs
    png = tmp_path / "plots" / "compare.png"
    out = mxc("compare", a[:15], c, "--json", "-o", str(png), env={"MXC_HOME": str(home)})
    assert out.returncode == 1, out.stderr  # they differ: exit 1, as mxc diff
    data = json.loads(out.stdout)
    assert data["differs"] is True
    assert [ch["key"] for ch in data["spec_changes"]] == ["model.overrides.learning_rate"]
    assert data["spec_changes"][0]["kind"] == "added" and data["spec_changes"][0]["new"] == 0.001
    assert not [e for e in data["environment"] if e["significant"]]
    first = data["losses"]["first_diverging_exact"]
    # The same, computed here from the two metrics files: equal before, different at `first`.
    la = {int(json.loads(x)["step"]): json.loads(x)["learning/loss"] for x in (home / "runs" / a / "metrics.jsonl").open()}
    lc = {int(json.loads(x)["step"]): json.loads(x)["learning/loss"] for x in (home / "runs" / c / "metrics.jsonl").open()}
    assert first is not None and all(la[s] == lc[s] for s in range(first)) and la[first] != lc[first]
    assert data["losses"]["common_steps"] == 10
    assert data["step_time"]["ratio_b_over_a"] > 0
    assert data["plot"] == str(png) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_refuses_bad_input(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    a = _fake_run(mxc_home, "20260101-000000-0000", {"x": 1}, [1.0], {})
    out = mxc("compare", a.run_id, a.run_id)
    assert out.returncode == 2 and "name the same run" in out.stderr and len(out.stderr.splitlines()) == 1
    b = _fake_run(mxc_home, "20260101-000001-0000", {"x": 1}, [1.0], {})
    out = mxc("compare", a.run_id, b.run_id, "-o", str(tmp_path / "plot.svg"))
    assert out.returncode == 2 and "*.png" in out.stderr
    out = mxc("compare", a.run_id, "nosuch")
    assert out.returncode == 2 and out.stderr.startswith("mxc: error: no run matches 'nosuch'")
