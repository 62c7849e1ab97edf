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


RANKS_SPEC = """\
extends: specs/tiny.yaml
name: ranks
env:
  vars:
    SITE_TAG: "{run_id}-a{attempt}"
  ranks:
    "0":
      xla_flags:
        xla_dump_to: "{run_dir}/xla-dump/rank-{rank}"
model:
  overrides:
    steps: 5
    dataset_name: "ds-{rank}-{{literal}}"
runtime:
  preflight:
    stale_processes: false
"""


def test_placeholders_and_a_rank_0_xla_dump_on_a_real_tiny_run(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    """The node program fills {run_dir}, {rank}, {run_id}... into variables, XLA flags and overrides;
    env.ranks.0 gives rank 0 alone an XLA dump inside its run directory."""
    copy_specs(tmp_path)
    spec = tmp_path / "ranks.yaml"
    spec.write_text(RANKS_SPEC)
    built = _built(mxc, mxc_home, spec, "env.pass=[XLA_FLAGS]")
    assert "dataset_name=ds-{rank}-{{literal}}" in built["run"]["train"]["args"]  # the bundle keeps the template
    # The node's own XLA_FLAGS, passed (env.pass; natively the node is the image), stays: the spec's are appended.
    out = mxc("run", "-q", cwd=tmp_path, env={"XLA_FLAGS": "--xla_dump_hlo_as_text"})
    assert out.returncode == 0, out.stderr
    run = mxc_home / "runs" / out.stdout.strip()
    dumps = list((run / "xla-dump" / "rank-0").glob("module_*"))
    assert dumps, f"no XLA dump in {run / 'xla-dump'}"
    assert list((run / "xla-dump" / "rank-0").glob("module_*.txt")), "the node's --xla_dump_hlo_as_text was dropped"
    log = (run / "train.log").read_text()
    assert "Config param dataset_name: ds-0-{literal}\n" in log
    # The record shows the environment training saw on rank 0, joined and filled in.
    training = json.loads((run / "record.json").read_text())["training"]
    assert training["environment"]["XLA_FLAGS"] == f"--xla_dump_hlo_as_text --xla_dump_to={run}/xla-dump/rank-0"
    assert training["environment"]["SITE_TAG"] == f"{run.name}-a0" and training["container"] == "native"


def test_rank_environments_replace_the_shared_one_on_their_rank_only(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    from mxc.node.contract import parse

    copy_specs(tmp_path)
    spec = tmp_path / "two.yaml"
    spec.write_text(RANKS_SPEC.replace("runtime:\n", "runtime:\n  backend: slurm\n") + "resources:\n  nodes: 2\n"
                    + "  gpus_per_node: 0\n")
    contract = parse(json.dumps(_built(mxc, mxc_home, spec)["run"]))
    rank0, rank1 = dict(contract.env_of(0)), dict(contract.env_of(1))
    assert rank0["XLA_FLAGS"] == "--xla_dump_to={run_dir}/xla-dump/rank-{rank}"
    assert "XLA_FLAGS" not in rank1 and rank1 == dict(contract.env)
    assert rank0["SITE_TAG"] == rank1["SITE_TAG"] == "{run_id}-a{attempt}"


def test_placeholder_and_rank_mistakes_fail_at_their_line(mxc: Mxc, tmp_path: Path) -> None:
    copy_specs(tmp_path)
    cases = {
        "unknown": (RANKS_SPEC.replace("ds-{rank}", "ds-{rnk}"),
                    "unknown.yaml:13: model.overrides.dataset_name: '{rnk}' is not a run-time placeholder"),
        "lone": (RANKS_SPEC.replace('"{run_id}-a{attempt}"', '"a}"'),
                 "lone.yaml:5: env.vars.SITE_TAG: a lone '}' at character 2: write '}}' for a literal brace"),
        "rank": (RANKS_SPEC.replace('"0":', '"1":'),
                 "rank.yaml:7: env.ranks.1: no rank 1: resources.nodes is 1 (one rank per node: 0..0)"),
        "dangerous": (RANKS_SPEC.replace("      xla_flags:", "      vars:\n        LD_PRELOAD: x.so\n      xla_flags:"),
                      "dangerous.yaml:9: env.ranks.0.vars.LD_PRELOAD: LD_PRELOAD makes the loader"),
    }
    for name, (text, expected) in cases.items():
        (tmp_path / f"{name}.yaml").write_text(text)
        out = mxc("build", f"{name}.yaml", cwd=tmp_path)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert out.stderr.startswith(expected), (name, out.stderr)


def test_fill_and_names() -> None:
    import pytest

    from mxc.node.placeholders import PlaceholderError, fill, names

    values = {"run_dir": "/r/a b", "rank": "3"}
    assert fill("{run_dir}/d-{rank}/{{x}}", values) == "/r/a b/d-3/{x}"
    assert fill("$(touch x) {rank}", values) == "$(touch x) 3"  # text, never a shell: nothing to escape
    assert names("{run_dir}{rank}{{") == ["run_dir", "rank"]
    for bad in ("{", "}", "{x}", "{ rank}", "{rank"):
        with pytest.raises(PlaceholderError):
            names(bad)
