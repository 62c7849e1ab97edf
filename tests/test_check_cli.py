"""`mxc check` and `mxc flags` as users run them: exit codes, output formats, discovery."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import yaml

from tests.check_support import GPU_SPEC, spec
from tests.conftest import Mxc, store_snapshot


def write_project(root: Path) -> None:
    """A base spec, a child that breaks two rules through it, and a clean child."""
    (root / "specs" / "base").mkdir(parents=True)
    base = {"schema": "mxc/v1", "env": {"xla_flags": {"xla_gpu_enable_latency_hidding_scheduler": True},
                                         "vars": {"HIP_VISIBLE_DEVICES": "0,1"}}}
    (root / "specs" / "base" / "gpu.yaml").write_text(yaml.safe_dump(base, sort_keys=False))
    child = spec(GPU_SPEC, drop=("env",))
    child = {"extends": "base/gpu.yaml", **child}
    (root / "specs" / "bad.yaml").write_text(yaml.safe_dump(child, sort_keys=False))
    (root / "specs" / "good.yaml").write_text(yaml.safe_dump(GPU_SPEC, sort_keys=False))


def test_shipped_specs_pass(mxc: Mxc, mxc_home: Path) -> None:
    out = mxc("check", "specs/")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "note: specs/base/rocm.yaml: partial spec (extended by specs/70b.yaml)" in out.stdout
    assert out.stdout.rstrip().splitlines()[-1].startswith("mxc check: ok:")
    assert store_snapshot(mxc_home) == []  # checking writes nothing


def test_findings_name_the_base_file_line_and_rule(mxc: Mxc, tmp_path: Path) -> None:
    write_project(tmp_path)
    out = mxc("check", "specs", cwd=tmp_path)
    assert out.returncode == 1
    lines = out.stdout.splitlines()
    assert ("specs/base/gpu.yaml:4: env.xla_flags.xla_gpu_enable_latency_hidding_scheduler: error[xla-flag-unknown]: "
            "'xla_gpu_enable_latency_hidding_scheduler': unknown XLA flag (not in jaxlib 0.12.0.1; jaxlib aborts on it) "
            "(did you mean 'xla_gpu_enable_latency_hiding_scheduler'?)") in lines
    assert any(line.startswith("specs/base/gpu.yaml:6: env.vars.HIP_VISIBLE_DEVICES: error[env-var-vendor]")
               for line in lines)
    assert "note: specs/base/gpu.yaml: partial spec (extended by specs/bad.yaml); checked through it" in lines
    assert lines[-1] == "mxc check: FAILED: 2 specs: 2 error(s), 0 warning(s), 0 note(s)"
    assert mxc("check", "specs/good.yaml", cwd=tmp_path).returncode == 0


def test_usage_errors_exit_2(mxc: Mxc, tmp_path: Path) -> None:
    missing = mxc("check", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and missing.stderr.startswith("mxc: error: ") and "no such file" in missing.stderr
    nothing = mxc("check")
    assert nothing.returncode == 2 and "nothing to check" in nothing.stderr
    bad_format = mxc("check", "specs/", "--format", "xml")
    assert bad_format.returncode == 2


def test_yaml_syntax_error_is_a_finding(mxc: Mxc, tmp_path: Path) -> None:
    (tmp_path / "broken.yaml").write_text("schema: mxc/v1\nname: [x\n")
    out = mxc("check", str(tmp_path / "broken.yaml"))
    assert out.returncode == 1 and re.search(r"broken\.yaml:\d+: error\[schema\]: YAML", out.stdout), out.stdout


def test_github_annotations(mxc: Mxc, tmp_path: Path) -> None:
    write_project(tmp_path)
    out = mxc("check", "specs", "--format", "github", cwd=tmp_path)
    assert out.returncode == 1
    annotations = out.stdout.splitlines()
    pattern = re.compile(r"^::(error|warning|notice) file=([^,]+),line=(\d+),title=mxc check%3A ([a-z0-9-]+)::(.+)$")
    parsed = [pattern.match(a) for a in annotations]
    assert all(parsed), annotations
    assert {(m.group(1), m.group(2), m.group(3), m.group(4)) for m in parsed if m} == {
        ("error", "specs/base/gpu.yaml", "4", "xla-flag-unknown"),
        ("error", "specs/base/gpu.yaml", "6", "env-var-vendor"),
    }
    assert "mxc check: FAILED" in out.stderr


def test_junit_xml_parses_with_a_suite_per_spec_and_a_case_per_rule(mxc: Mxc, tmp_path: Path) -> None:
    write_project(tmp_path)
    report = tmp_path / "out" / "check.xml"
    out = mxc("check", "specs", "--format", "junit", "-o", str(report), cwd=tmp_path)
    assert out.returncode == 1 and out.stdout == ""
    root = ET.parse(report).getroot()
    assert root.tag == "testsuites" and root.get("failures") == "2"
    suites = {s.get("name"): s for s in root.iter("testsuite")}
    assert set(suites) == {"specs/bad.yaml", "specs/good.yaml"}
    bad = suites["specs/bad.yaml"]
    failed = {c.get("name"): c.find("failure") for c in bad.iter("testcase") if c.find("failure") is not None}
    assert set(failed) == {"xla-flag-unknown", "env-var-vendor"}
    assert failed["env-var-vendor"].get("type") == "error"  # type: ignore[union-attr]
    assert "specs/base/gpu.yaml:6" in (failed["env-var-vendor"].text or "")  # type: ignore[union-attr]
    names = [c.get("name") for c in suites["specs/good.yaml"].iter("testcase")]
    assert "schema" in names and "mesh-devices" in names and len(names) >= 20
    assert suites["specs/good.yaml"].get("failures") == "0"


def test_json_report(mxc: Mxc, tmp_path: Path) -> None:
    write_project(tmp_path)
    out = mxc("check", "specs", "--json", cwd=tmp_path)
    data = json.loads(out.stdout)
    assert data["ok"] is False and data["summary"]["error"] == 2 and data["summary"]["specs"] == 2
    rules = {f["rule"] for f in data["findings"]}
    assert rules == {"xla-flag-unknown", "env-var-vendor"}
    assert {r["name"] for r in data["rules"]} >= {"mesh-devices", "fp8-hardware", "checkpoint-time"}


def test_lockfile_pins_the_jaxlib(mxc: Mxc, tmp_path: Path) -> None:
    (tmp_path / "specs").mkdir()
    (tmp_path / "lockfiles").mkdir()
    job = spec(GPU_SPEC, drop=("code__jaxlib_version",), env__xla_flags={"xla_gpu_pipeline_all_gather": "on"})
    (tmp_path / "specs" / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    assert mxc("check", "specs/job.yaml", cwd=tmp_path).returncode == 0
    (tmp_path / "lockfiles" / "job.lock.json").write_text(json.dumps({"python": {"packages": {"jaxlib": "0.6.2"}}}))
    out = mxc("check", "specs/job.yaml", cwd=tmp_path)
    assert out.returncode == 1
    assert "is not a flag of jaxlib 0.6.2 (jaxlib in " in out.stdout and "job.lock.json" in out.stdout


def test_set_overrides_before_checking(mxc: Mxc) -> None:
    out = mxc("check", "specs/tiny.yaml", "--set", "model.overrides.per_device_batch_size=0.5")
    assert out.returncode == 1 and "error[batch-divisible]" in out.stdout


def test_flags_search_json_and_versions(mxc: Mxc) -> None:
    out = mxc("flags", "--search", "latency_hiding_scheduler")
    assert out.returncode == 0
    assert re.search(r"^xla_gpu_enable_latency_hiding_scheduler\s+bool\s+false\s+\[Stable\] Enable", out.stdout, re.M)
    data = json.loads(mxc("flags", "--search", "autotune_level", "--json").stdout)
    (flag,) = [f for f in data["flags"] if f["name"] == "xla_gpu_autotune_level"]
    assert flag["type"] == "int32" and isinstance(flag["default"], int) and data["jaxlib_version"] == "0.12.0.1"
    old = json.loads(mxc("flags", "--jaxlib", "0.6.2", "--json").stdout)
    assert old["jaxlib_version"] == "0.6.2" and "xla_gpu_enable_triton_hopper" in {f["name"] for f in old["flags"]}
    assert "0.6.2" in mxc("flags", "--versions").stdout
    none = mxc("flags", "--jaxlib", "9.9")
    assert none.returncode == 2 and "no XLA flag catalog for jaxlib 9.9" in none.stderr
    assert mxc("flags", "--search", "no-such-words-anywhere").returncode == 1


def test_help_has_examples_and_imports_no_jax(mxc: Mxc) -> None:
    out = mxc("check", "--help")
    assert out.returncode == 0 and "mxc check specs/70b.yaml --matrix" in out.stdout
    probe = mxc("check", "specs/tiny.yaml", env={"PYTHONWARNINGS": "ignore"})
    assert probe.returncode == 0
    import subprocess
    import sys

    code = ("import sys; from mxc.cli.main import main; main(['check', 'specs/']); "
            "print(sorted(m for m in ('jax', 'maxtext', 'ray') if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.stdout.strip().splitlines()[-1] == "[]"
