"""What reaches a real training from the caller's shell, and ``mxc rerun --verify`` (issue 23).

The tiny MaxText model on this machine's CPU is bit-identical from run to run;
``XLA_FLAGS=--xla_cpu_enable_fast_math=true`` changed its loss from step 0 (6.1232171058654785
against 6.122978210449219) while the caller's shell still reached the training (c388a5b). These
tests use only the CLI, so they run against any mxc.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO, Home

FAST_MATH = {"XLA_FLAGS": "--xla_cpu_enable_fast_math=true"}


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Home:
    return Home(tmp_path_factory.mktemp("boundary-home") / "mxc")


SETS = ("runtime.preflight.stale_processes=false", "checkpoint.period=0")


def _losses(run: Path) -> list[str]:
    """Each step's loss exactly as MaxText wrote it."""
    lines = (run / "metrics" / "attempt-0.rank-0.jsonl").read_text().splitlines()
    return [f'{json.loads(line)["step"]}:{json.loads(line)["learning/loss"]!r}' for line in lines]


def _run(home: Home, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str, Path | None]:
    before = home.runs()
    proc = home.start(*args, env=env)
    out, err = proc.communicate(timeout=900)
    new = home.runs() - before
    return proc.returncode, out, err, (new.pop() if new else None)


@pytest.mark.training
def test_a_shell_xla_flags_changes_neither_a_run_nor_a_verified_rerun(home: Home) -> None:
    bundle = home.build(REPO / "specs" / "tiny.yaml", SETS)
    rc, _, err, plain = _run(home, "run", bundle, "-q")
    assert rc == 0 and plain is not None, err
    rc, _, err, shelled = _run(home, "run", bundle, "-q", env=FAST_MATH)
    assert rc == 0 and shelled is not None, err
    trained = json.loads((shelled / "ranks" / "0" / "environment.json").read_text())
    assert "XLA_FLAGS" not in trained["environment"] and trained["environment"]["PATH"]
    assert _losses(shelled) == _losses(plain) and len(_losses(plain)) == 30
    record = json.loads((shelled / "record.json").read_text())
    assert "XLA_FLAGS" not in record["environment"] and "XLA_FLAGS" not in record["training"]["environment"]
    # The same shell variable reaches no rerun either, and --verify proves it as the rerun trains.
    rc, out, err, rerun = _run(home, "rerun", plain.name, "--verify", env=FAST_MATH)
    assert rc == 0 and rerun is not None and out.strip() == rerun.name, err
    assert f"all 30 steps of run {rerun.name} match run {plain.name} bit for bit" in err, err
    assert "drift" not in err.replace("no drift", ""), err
    assert _losses(rerun) == _losses(plain)


@pytest.mark.training
def test_verify_stops_a_rerun_at_the_first_step_whose_loss_differs(home: Home) -> None:
    """A bundle that passes XLA_FLAGS: the original ran with fast math, the rerun without. The rerun
    names the difference (and --strict refuses it); --verify cancels it at step 0, printing both losses."""
    bundle = home.build(REPO / "specs" / "tiny.yaml", (*SETS, "env.pass=[XLA_FLAGS]"))
    rc, _, err, original = _run(home, "run", bundle, "-q", env=FAST_MATH)
    assert rc == 0 and original is not None, err
    record = json.loads((original / "record.json").read_text())
    assert record["training"]["passed"] == ["XLA_FLAGS"]
    assert record["training"]["caller"]["XLA_FLAGS"] == FAST_MATH["XLA_FLAGS"]
    rc, _, err, refused = _run(home, "rerun", original.name, "--strict")
    assert rc == 2 and refused is None, err
    assert f"training env XLA_FLAGS: {FAST_MATH['XLA_FLAGS']} -> unset" in err, err
    rc, out, err, rerun = _run(home, "rerun", original.name, "--verify")
    assert rerun is not None and out.strip() == rerun.name
    assert rc == 1 and rerun is not None, err
    first = json.loads((original / "metrics" / "attempt-0.rank-0.jsonl").read_text().splitlines()[0])["learning/loss"]
    assert (f"mxc: verify: step 0 differs: loss {first!r} in run {original.name}, " in err
            and "; the rerun was cancelled" in err), err
    shown = err.split(f"in run {original.name}, ", 1)[1].split(" in run ", 1)[0]
    assert float(shown) != first  # both values at full precision: each reads back as the float logged
    final = json.loads((rerun / "record.json").read_text())
    assert final["status"] == "cancelled" and final["final"] and final["rerun_of"] == original.name
