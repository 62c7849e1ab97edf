"""Spec mechanics MaxText-Slurm's configurations need: empty strings that stay strings, and
removing what a parent spec sets (null in the extending spec, or ``--set KEY=null``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.conftest import Mxc, copy_specs


def _built(mxc: Mxc, mxc_home: Path, spec: Path, *sets: str) -> dict[str, Any]:
    args = [a for s in sets for a in ("--set", s)]
    out = mxc("build", str(spec), "-q", *args, cwd=spec.parent)
    assert out.returncode == 0, out.stderr
    bundle = mxc_home / "bundles" / out.stdout.strip().splitlines()[-1]
    return {"run": json.loads((bundle / "run.json").read_text()), "spec": json.loads((bundle / "spec.json").read_text())}


def test_null_in_an_extending_spec_removes_the_inherited_key(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    copy_specs(tmp_path)
    child = tmp_path / "child.yaml"
    child.write_text("extends: specs/tiny.yaml\nname: child\n"
                     "model:\n  overrides:\n    learning_rate_schedule_steps: null\n    profiler: ''\n"
                     "env:\n  vars:\n    SITE_EMPTY_VALUE: ''\n")
    parent = _built(mxc, mxc_home, tmp_path / "specs" / "tiny.yaml")
    built = _built(mxc, mxc_home, child)
    assert "learning_rate_schedule_steps" in parent["spec"]["model"]["overrides"]
    assert "learning_rate_schedule_steps" not in built["spec"]["model"]["overrides"]
    args = built["run"]["train"]["args"]
    assert not any(a.startswith("learning_rate_schedule_steps=") for a in args)
    assert "profiler=''" in args  # OmegaConf reads `profiler=` as None, `profiler=''` as ""
    assert built["spec"]["env"]["vars"]["SITE_EMPTY_VALUE"] == ""
    # Everything else the parent set is still there.
    assert {k: v for k, v in parent["spec"]["model"]["overrides"].items() if k != "learning_rate_schedule_steps"} \
        .items() <= built["spec"]["model"]["overrides"].items()


def test_set_null_removes_a_key_and_words_yaml_reads_as_null_stay_strings(mxc: Mxc, mxc_home: Path,
                                                                            tmp_path: Path) -> None:
    copy_specs(tmp_path)
    built = _built(mxc, mxc_home, tmp_path / "specs" / "tiny.yaml",
                   "model.overrides.learning_rate_schedule_steps=null", "model.overrides.profiler=")
    args = built["run"]["train"]["args"]
    assert "profiler=''" in args and not any(a.startswith("learning_rate_schedule_steps=") for a in args)
    spec = tmp_path / "specs" / "tiny.yaml"
    spec.write_text(spec.read_text().replace("    steps: 30\n", "    steps: 30\n    dataset_name: 'null'\n"))
    args = _built(mxc, mxc_home, spec)["run"]["train"]["args"]
    assert "dataset_name='null'" in args  # the text "null", not YAML's null


def test_null_for_a_key_nothing_sets_is_still_an_error(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    copy_specs(tmp_path)
    child = tmp_path / "child.yaml"
    child.write_text("extends: specs/tiny.yaml\nname: child\nenv:\n  vars:\n    NOT_INHERITED: null\n")
    out = mxc("build", str(child), cwd=tmp_path)
    assert out.returncode == 2
    assert "child.yaml:5: env.vars.NOT_INHERITED: expected true or false, an integer, a number or a string, got null" \
        in out.stderr, out.stderr
    out = mxc("build", "specs/tiny.yaml", "--set", "model.overrides.stepz=null", cwd=tmp_path)
    assert out.returncode == 2 and "--set: model.overrides.stepz" in out.stderr, out.stderr
