"""One gate: `mxc build` refuses every error `mxc check` finds statically, with the same messages, and
writes nothing; warnings do not stop it. And `mxc check` lists every finding of a spec in one run.

The specs are the checker's own test specs (tests/check_support.py) with one mistake each, the
mistakes that used to pass build and fail a minute into the run (issue 23): an unknown XLA flag,
NCCL_DEBUG: 3, a YAML boolean for a string flag, remat_policy: fulll, JAX_PLATFORMS of the other
vendor, batch and mesh arithmetic, fp8 on hardware without it.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml

from mxc.compiler.check.findings import Finding
from tests.check_support import CPU_SPEC, GPU_SPEC, check, spec
from tests.conftest import Mxc, store_snapshot

CASES: dict[str, tuple[dict[str, Any], str]] = {
    "unknown XLA flag": (spec(CPU_SPEC, env__xla_flags={"xla_bogus_flag": 1}), "xla-flag-unknown"),
    "NCCL_DEBUG: 3": (spec(GPU_SPEC, env__vars__NCCL_DEBUG=3), "env-var-value"),
    "YAML boolean for a string flag": (spec(GPU_SPEC, env__xla_flags__xla_gpu_pipeline_all_gather=True), "xla-flag-value"),
    "remat_policy: fulll": (spec(CPU_SPEC, model__overrides__remat_policy="fulll"), "maxtext-override-value"),
    "attention typo": (spec(CPU_SPEC, model__overrides__attention="flsh"), "maxtext-override-value"),
    "JAX_PLATFORMS of the other vendor": (spec(GPU_SPEC, env__vars__JAX_PLATFORMS="rocm"), "jax-platforms"),
    "batch not a whole number": (spec(CPU_SPEC, model__overrides__per_device_batch_size=0.5), "batch-divisible"),
    "mesh does not cover the devices": (spec(GPU_SPEC, model__overrides__ici_fsdp_parallelism=4), "mesh-devices"),
    "fp8 on an A100": (spec(GPU_SPEC, resources__constraint="a100", model__overrides__quantization="fp8"), "fp8-hardware"),
    "jaxlib without a catalog": (spec(GPU_SPEC, code__jaxlib_version="9.9.9"), "jaxlib-catalog"),
}


def as_build_line(f: Finding) -> str:
    """A check finding as `mxc build` prints the same problem: file:line: key: message (suggestion)."""
    hint = f" ({f.suggestion})" if f.suggestion else ""
    return f"{f.where()}: {f.key}: {f.message}{hint}"


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("case", sorted(CASES))
def test_build_refuses_each_static_error_check_finds(case: str, mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    data, rule = CASES[case]
    findings, _ = check(data)  # the same text the build reads: yaml.safe_dump, file "spec.yaml"
    errors = [f for f in findings if f.severity == "error"]
    assert rule in {f.rule for f in errors}, findings
    assert mxc("build", "specs/tiny.yaml").returncode == 0  # a store with something in it
    before = store_snapshot(mxc_home)
    write(tmp_path, data)
    out = mxc("build", "spec.yaml", cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == "" and "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.splitlines()
    assert sorted(lines[:-1]) == sorted(as_build_line(f) for f in errors)  # every error, check's words
    assert lines[-1] == f"mxc: {len(errors)} problem{'s' if len(errors) > 1 else ''} in the spec; nothing was written"
    assert store_snapshot(mxc_home) == before


def test_the_base_specs_build() -> None:
    for base in (CPU_SPEC, GPU_SPEC):
        assert [f for f in check(base)[0] if f.fails] == []


def test_warnings_are_printed_and_do_not_stop_the_build(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    data = spec(GPU_SPEC, env__vars__NCCL_IB_QPS=4)  # not read by any library: env-var-unknown, a warning
    (warning,) = [f for f in check(data)[0] if f.fails]
    assert warning.severity == "warning" and warning.rule == "env-var-unknown"
    write(tmp_path, data)
    out = mxc("build", "spec.yaml", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert str(warning) in out.stderr.splitlines() and len(out.stdout.split()) == 1
    assert (mxc_home / "bundles" / out.stdout.strip()).is_dir()
    # Accepted on review (check.accept): a note, which the build does not print.
    accepted = spec(data, check={"accept": [{"rule": "env-var-unknown", "key": "env.vars.NCCL_IB_QPS", "why": "tested"}]})
    write(tmp_path, accepted)
    out = mxc("build", "spec.yaml", cwd=tmp_path)
    assert out.returncode == 0 and "NCCL_IB_QPS" not in out.stderr, out.stderr


def test_build_judges_flags_by_the_lockfiles_jaxlib_as_check_does(mxc: Mxc, tmp_path: Path) -> None:
    """xla_gpu_enable_custom_fusions is a flag of jaxlib 0.6.2, gone by 0.12.0.1 (the default for maxtext 0.2.5)."""
    data = spec(CPU_SPEC, env__xla_flags={"xla_gpu_enable_custom_fusions": True})
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "x.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    refused = mxc("build", "specs/x.yaml", cwd=tmp_path)
    assert refused.returncode == 2 and "is not a flag of jaxlib 0.12.0.1" in refused.stderr, refused.stderr
    (tmp_path / "lockfiles").mkdir()
    (tmp_path / "lockfiles" / "x.lock.json").write_text(json.dumps({"python": {"packages": {"jaxlib": "0.6.2"}}}))
    assert mxc("check", "specs/x.yaml", cwd=tmp_path).returncode == 0
    built = mxc("build", "specs/x.yaml", cwd=tmp_path)
    assert built.returncode == 0, built.stderr


# ---------------------------------------------------------------- check: every finding at once

MANY = """\
schema: mxc/v1
name: many
image:
  ref: docker.io/rocm/jax-training:maxtext-v26.2
code:
  from_image: true
model:
  model_name: default
  overrides:
    remat_policy: fulll
runtime:
  container: apptainer
env:
  xla_flags:
    xla_bogus_flag: 1
  vars:
    NCCL_DEBUG: 3
"""


def test_check_and_build_list_every_finding_of_a_spec_in_one_run(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    """A missing digest (schema), the workdir apptainer needs (a cross-section check pydantic never reached
    behind it), and the rules' errors: an unknown flag, NCCL_DEBUG: 3, remat_policy: fulll. It used to take
    four runs, fixing one round at a time."""
    (tmp_path / "spec.yaml").write_text(MANY)
    out = mxc("check", "spec.yaml", "--format", "json", cwd=tmp_path)
    assert out.returncode == 1, out.stderr
    errors = [f for f in json.loads(out.stdout)["findings"] if f["severity"] == "error"]
    assert {(f["line"], f["key"], f["rule"]) for f in errors} == {
        (3, "image.digest", "schema"), (5, "code.entry.workdir", "schema"),
        (10, "model.overrides.remat_policy", "maxtext-override-value"),
        (15, "env.xla_flags.xla_bogus_flag", "xla-flag-unknown"), (17, "env.vars.NCCL_DEBUG", "env-var-value")}
    assert json.loads(out.stdout)["targets"][0]["not_run"] == {}  # the digest is read by no rule
    built = mxc("build", "spec.yaml", cwd=tmp_path)
    assert built.returncode == 2 and store_snapshot(mxc_home) == []
    assert sorted(built.stderr.splitlines()[:-1]) == sorted(
        f"spec.yaml:{f['line']}: {f['key']}: {f['message']}" + (f" ({f['suggestion']})" if f["suggestion"] else "")
        for f in errors)


def test_every_cross_section_problem_at_once(mxc: Mxc, tmp_path: Path) -> None:
    data = spec(CPU_SPEC, resources__nodes=2, runtime__optional_mounts=["/a:/a"], env__ranks={"3": {"vars": {"A": 1}}})
    write(tmp_path, data)
    for command in ("check", "build"):
        out = mxc(command, "spec.yaml", cwd=tmp_path)
        text = out.stdout + out.stderr
        for key in ("resources.nodes", "runtime.optional_mounts", "env.ranks.3"):
            assert f": {key}: " in text, (command, text)


def test_rules_that_read_a_value_in_error_say_they_did_not_run(mxc: Mxc, tmp_path: Path) -> None:
    """env.vars.FOO holds a list: the rules reading env cannot judge it, and say so (text, JSON, JUnit
    skipped); the MaxText rules still run on the rest of the spec."""
    data = spec(CPU_SPEC, env__vars__FOO=[1, 2], env__xla_flags={"xla_bogus_flag": 1},
                model__overrides__remat_policy="fulll")
    write(tmp_path, data)
    text = mxc("check", "spec.yaml", cwd=tmp_path).stdout
    assert "env.vars.FOO: error[schema]" in text and "remat_policy: error[maxtext-override-value]" in text
    (line,) = [ln for ln in text.splitlines() if "not checked" in ln]
    assert "xla-flag-unknown" in line and "env-var-value" in line and "maxtext" not in line
    assert line.endswith("(env.vars.FOO has an error above)")
    not_run = json.loads(mxc("check", "spec.yaml", "--format", "json", cwd=tmp_path).stdout)["targets"][0]["not_run"]
    assert not_run["xla-flag-unknown"] == "env.vars.FOO has an error above" and "maxtext-override-value" not in not_run
    junit = ET.fromstring(mxc("check", "spec.yaml", "--format", "junit", cwd=tmp_path).stdout)
    skipped = {c.get("name") for c in junit.iter("testcase") if c.find("skipped") is not None}
    assert skipped == set(not_run)
