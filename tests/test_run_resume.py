"""Runs outside $MXC_HOME (`MXC_RUNS_DIR`) and `mxc run --resume-from`, with real MaxText on CPU.

One module home whose runs live in a separate "scratch" directory: a straight-through run of the
tiny model (checkpoints at 0, 10, 20 and the last step), then a second run resumed from its
checkpoint at step 10, which must continue at step 11 with exactly the first run's values.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mxc.node.checkpoints import finished_steps
from tests.conftest import REPO, Home

pytestmark = pytest.mark.training

STEPS = 30
BUILD_SETS = ("runtime.preflight.stale_processes=false",)  # other trainings on a shared machine must not fail it


@dataclass(frozen=True)
class ScratchHome(Home):
    """A home whose runs live elsewhere, as on a cluster with $SCRATCH."""

    runs_dir: Path = Path()

    def env(self) -> dict[str, str]:
        return {**super().env(), "MXC_RUNS_DIR": str(self.runs_dir)}

    def runs(self) -> set[Path]:
        return set(self.runs_dir.iterdir()) if self.runs_dir.is_dir() else set()


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> ScratchHome:
    base = tmp_path_factory.mktemp("resume")
    return ScratchHome(base / "home", runs_dir=base / "scratch" / "runs")


@pytest.fixture(scope="module")
def bundle(home: ScratchHome) -> str:
    return home.build(REPO / "specs/tiny.yaml", BUILD_SETS)


@pytest.fixture(scope="module")
def first(home: ScratchHome, bundle: str) -> Path:
    out = home.cli("run", "-q")
    assert out.returncode == 0, out.stderr
    return home.runs_dir / out.stdout.strip()


def record_of(run: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run / "record.json").read_text())
    return data


def metrics_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def learning(metrics: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    return {int(m["step"]): {k: v for k, v in m.items() if k.startswith("learning/")} for m in metrics}


def one_line_error(out: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("mxc: error: ") and out.stderr.count("\n") == 1, out.stderr
    for fragment in fragments:
        assert fragment in out.stderr, out.stderr


# ---- MXC_RUNS_DIR


def test_a_run_and_its_checkpoints_live_in_the_runs_dir(home: ScratchHome, bundle: str, first: Path) -> None:
    assert first.parent == home.runs_dir and not (home.path / "runs").exists()
    record = record_of(first)
    assert record["status"] == "succeeded" and record["bundle"] == bundle and record["resumed_from"] is None
    checkpoints = first / "output" / first.name / "checkpoints"
    assert finished_steps(checkpoints) == [0, 10, 20, STEPS - 1]
    assert record["tensorboard"].startswith(str(first))
    listed = home.json("runs")
    assert [(r["run_id"], r["path"]) for r in listed] == [(first.name, str(first))]
    found = home.json("gc", "--status", "succeeded")
    assert [(i["kind"], i["paths"]) for i in found["items"]] == [("run", [str(first)])]
    assert found["removed"] is False and first.exists()
    plan = home.json("run", "--dry-run")
    assert Path(plan["run_dir"]).parent == home.runs_dir
    assert plan["env"]["MXC_IMAGE_CACHE"] == str(home.path / "images")  # images stay in the home


# ---- --resume-from


def test_resume_from_a_step_continues_there_in_a_new_run(home: ScratchHome, bundle: str, first: Path) -> None:
    before = finished_steps(first / "output" / first.name / "checkpoints")
    out = home.cli("run", "--resume-from", f"{first.name[:20]}@10")
    assert out.returncode == 0, out.stderr
    assert f"resuming from run {first.name} at step 10: checkpoint linked into" in out.stderr
    second = home.runs_dir / out.stdout.strip()
    assert second != first and second.is_dir()

    record = record_of(second)
    assert record["status"] == "succeeded" and record["bundle"] == bundle and record["final"]
    assert record["resumed_from"] == {"run": first.name, "step": 10,
                                      "path": str(first / "output" / first.name / "checkpoints" / "10")}
    assert record["attempts"][0]["resumed_from_step"] == 10 and record["restarts"] == 0
    assert "[mxc] attempt 0: start (resuming from checkpoint 10)" in (second / "train.log").read_text()
    attempt0 = metrics_of(second / "metrics" / "attempt-0.rank-0.jsonl")
    assert attempt0[0]["step"] == 11  # MaxText continued after the checkpoint, not from step 0
    merged = metrics_of(second / "metrics.jsonl")
    assert [m["step"] for m in merged] == [float(s) for s in range(11, STEPS)]
    original = learning(metrics_of(first / "metrics.jsonl"))
    assert learning(merged) == {s: original[s] for s in range(11, STEPS)}  # the same training, bit for bit
    # Its own checkpoints, and the source run untouched.
    assert finished_steps(second / "output" / second.name / "checkpoints")[-1] == STEPS - 1
    assert finished_steps(first / "output" / first.name / "checkpoints") == before
    rows = {r["run_id"]: r for r in home.json("runs")}
    assert rows[second.name]["resumed_from"]["run"] == first.name


def test_a_rerun_of_a_resumed_run_resumes_from_the_same_checkpoint(home: ScratchHome, first: Path) -> None:
    resumed = [r for r in home.json("runs") if r["resumed_from"]]
    assert resumed, "test_resume_from_a_step_continues_there_in_a_new_run runs first"
    plan = home.json("rerun", resumed[0]["run_id"], "--dry-run")
    assert any(f"resumes from run {first.name} at step 10" in note for note in plan["notes"])


def test_resume_from_a_run_takes_its_newest_checkpoint(home: ScratchHome, first: Path) -> None:
    plan = home.json("run", "--dry-run", "--resume-from", first.name)
    assert any(f"resumes from run {first.name} at step {STEPS - 1}" in note for note in plan["notes"])


def test_resume_from_bad_references_is_refused(home: ScratchHome, first: Path) -> None:
    before = home.runs()
    one_line_error(home.cli("run", "--resume-from", "20010101-nosuch"), "no run matches '20010101-nosuch'")
    one_line_error(home.cli("run", "--resume-from", f"{first.name}@7"),
                   f"run {first.name} has no checkpoint at step 7", f"its checkpoints: 0, 10, 20, {STEPS - 1}")
    one_line_error(home.cli("run", "--resume-from", f"{first.name}@ten"), "expected RUN or RUN@STEP")
    empty = home.runs_dir / f"20010101-000000-aaaa-{first.name[-8:]}"
    empty.mkdir()
    try:
        (empty / "record.json").write_text(json.dumps({**record_of(first), "run_id": empty.name, "tensorboard": None}))
        one_line_error(home.cli("run", "--resume-from", empty.name),
                       f"run {empty.name} has no finished checkpoint to resume from")
        no_checkpoints = home.build(REPO / "specs/tiny.yaml", (*BUILD_SETS, "checkpoint.period=0"))
        one_line_error(home.cli("run", no_checkpoints, "--resume-from", first.name),
                       f"bundle {no_checkpoints[:12]} has checkpointing off")
        gone = {"run": first.name, "step": 12, "path": str(first / "output" / first.name / "checkpoints" / "12")}
        (empty / "record.json").write_text(json.dumps({**record_of(first), "run_id": empty.name, "resumed_from": gone}))
        one_line_error(home.cli("rerun", empty.name), f"run {empty.name} started from run {first.name}'s checkpoint "
                       "at step 12, which is gone", "mxc run --resume-from")
        assert home.runs() == before | {empty}  # nothing started, nothing written
    finally:
        (empty / "record.json").unlink()
        empty.rmdir()
    assert os.path.isdir(first)
