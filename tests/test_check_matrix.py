"""Sweep files: expansion, structural errors, and findings that name the combination and line."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from mxc.compiler.check.findings import merge_matrix
from mxc.compiler.check.matrix import apply_changes, expand, parse_matrix
from mxc.compiler.check.runner import check_matrix
from mxc.compiler.errors import SpecErrors
from mxc.compiler.loader import load_yaml
from tests.check_support import GPU_SPEC
from tests.conftest import Mxc

SWEEP = """\
matrix: mxc/v1
axes:
  env.xla_flags.xla_gpu_enable_latency_hiding_scheduler: [true, false]
  model.overrides.per_device_batch_size: [1, 2, 3]
exclude:
  - {model.overrides.per_device_batch_size: 3, env.xla_flags.xla_gpu_enable_latency_hiding_scheduler: false}
include:
  - {env.vars.NCCL_DEBUG: null}
"""


def matrix(text: str = SWEEP, name: str = "sweep.yaml"):  # type: ignore[no-untyped-def]
    return parse_matrix(load_yaml(name, text), name)


def test_expansion_order_exclude_and_include() -> None:
    combos = expand(matrix())
    assert [c.number for c in combos] == [1, 2, 3, 4, 5, 6]
    labels = [c.label() for c in combos]
    assert labels[0] == "env.xla_flags.xla_gpu_enable_latency_hiding_scheduler=true, model.overrides.per_device_batch_size=1"
    assert labels[2].endswith("per_device_batch_size=3")
    assert labels[3] == "env.xla_flags.xla_gpu_enable_latency_hiding_scheduler=false, model.overrides.per_device_batch_size=1"
    assert labels[5] == "env.vars.NCCL_DEBUG=(removed)"
    assert all(("false" not in lab or "=3" not in lab) for lab in labels)
    assert combos[0].lines[("model", "overrides", "per_device_batch_size")] == ("sweep.yaml", 4)
    assert combos[5].lines[("env", "vars", "NCCL_DEBUG")] == ("sweep.yaml", 8)


def test_apply_changes_copies_only_what_changes() -> None:
    base = copy.deepcopy(GPU_SPEC)
    before = copy.deepcopy(base)
    out = apply_changes(base, ((("env", "vars", "NCCL_DEBUG"), None), (("model", "overrides", "steps"), 5)))
    assert base == before  # the base document is never mutated
    assert "NCCL_DEBUG" not in out["env"]["vars"] and out["model"]["overrides"]["steps"] == 5
    assert out["resources"] is base["resources"]  # untouched branches are shared


@pytest.mark.parametrize(("text", "line", "words"), [
    ("matrix: mxc/v1\naxes:\n  model.overrides.steps: 5\n", 3, "non-empty list"),
    ("matrix: mxc/v1\naxes:\n  model..steps: [1]\n", 3, "dotted key path"),
    ("matrix: mxc/v1\naxes:\n  model.overrides.steps: [[1]]\n", 3, "scalars"),
    ("matrix: mxc/v2\naxes:\n  a.b: [1]\n", 1, "matrix: mxc/v1"),
    ("matrix: mxc/v1\naxis:\n  a.b: [1]\n", 2, "unknown key"),
    ("matrix: mxc/v1\n", 1, "no combinations"),
])
def test_structural_errors_name_the_line(text: str, line: int, words: str) -> None:
    with pytest.raises(SpecErrors) as err:
        matrix(text)
    assert any(e.line == line and words in str(e) for e in err.value.errors), err.value.errors


def test_findings_name_the_matrix_line_and_combinations() -> None:
    spec_doc = load_yaml("spec.yaml", yaml.safe_dump(GPU_SPEC, sort_keys=False))
    sweep = matrix("matrix: mxc/v1\naxes:\n  env.vars.NCCL_DEBUG: [WARN, LOUD]\n"
                   "  model.overrides.per_device_batch_size: [1, 2]\n")
    results = check_matrix(spec_doc, "spec.yaml", sweep)
    assert len(results) == 4
    findings = merge_matrix([f for r in results for f in r.findings], len(results))
    (bad,) = [f for f in findings if f.rule == "env-var-value"]
    assert (bad.file, bad.line, bad.combinations) == ("sweep.yaml", 3, (3, 4))
    assert "[combinations #3, #4]" in str(bad)


def test_a_problem_in_every_combination_is_the_specs_own() -> None:
    broken = copy.deepcopy(GPU_SPEC)
    broken["env"]["vars"]["NCCL_DEBUG"] = "LOUD"
    spec_doc = load_yaml("spec.yaml", yaml.safe_dump(broken, sort_keys=False))
    results = check_matrix(spec_doc, "spec.yaml", matrix("matrix: mxc/v1\naxes:\n  model.overrides.steps: [1, 2, 3]\n"))
    (f,) = merge_matrix([f for r in results for f in r.findings], len(results))
    assert f.file == "spec.yaml" and f.combinations == ()


def test_schema_errors_inside_a_combination() -> None:
    spec_doc = load_yaml("spec.yaml", yaml.safe_dump(GPU_SPEC, sort_keys=False))
    sweep = matrix("matrix: mxc/v1\naxes:\n  resources.nodes: [2, 0]\n")
    results = check_matrix(spec_doc, "spec.yaml", sweep)
    assert results[0].spec is not None and results[1].spec is None
    (f,) = results[1].findings
    assert (f.rule, f.file, f.line, f.combinations) == ("schema", "sweep.yaml", 3, (2,))


def test_cli_matrix_exit_codes(mxc: Mxc, tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(GPU_SPEC, sort_keys=False))
    good = tmp_path / "good.yaml"
    good.write_text("matrix: mxc/v1\nspec: job.yaml\naxes:\n  model.overrides.per_device_batch_size: [1, 2, 4]\n")
    ok = mxc("check", "--matrix", str(good))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "3 combinations" in ok.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("matrix: mxc/v1\naxes:\n  env.xla_flags.xla_gpu_autotune_levl: [1, 2]\n")
    out = mxc("check", str(tmp_path / "job.yaml"), "--matrix", str(bad))
    assert out.returncode == 1
    assert f"{bad}:3: env.xla_flags.xla_gpu_autotune_levl: error[xla-flag-unknown]" in out.stdout
    broken = tmp_path / "broken.yaml"
    broken.write_text("matrix: mxc/v1\naxes: [1]\n")
    usage = mxc("check", str(tmp_path / "job.yaml"), "--matrix", str(broken))
    assert usage.returncode == 2 and f"{broken}:2: axes:" in usage.stderr and "Traceback" not in usage.stderr


def test_shipped_sweep_is_found_in_specs(mxc: Mxc) -> None:
    out = mxc("check", "specs/", "--json")
    assert out.returncode == 0, out.stdout[-3000:]
    import json

    report = json.loads(out.stdout)
    sweep = [t for t in report["targets"] if t["matrix"] == "specs/matrix/70b-sweep.yaml"]
    assert sweep and sweep[0]["file"] == "specs/70b.yaml" and sweep[0]["combinations"] == 33


def test_fast_path_equals_full_validation_and_full_rule_runs() -> None:
    """The matrix shortcut (re-validate only changed sections, reuse rules that read none of them)
    gives the same spec and the same findings as checking every combination from scratch."""
    from mxc.compiler.check.runner import Lock, _base, check_combination
    from mxc.compiler.schema import JobSpec

    # The shortcut relies on JobSpec's own validators being exactly these (see runner._FAST_SECTIONS).
    assert sorted(JobSpec.__pydantic_decorators__.model_validators) == ["_consistent", "_no_secrets"]
    assert not JobSpec.__pydantic_decorators__.field_validators
    doc = load_yaml("spec.yaml", yaml.safe_dump(GPU_SPEC, sort_keys=False))
    sweep = matrix(
        "matrix: mxc/v1\naxes:\n"
        "  env.xla_flags.xla_gpu_autotune_level: [1, abc]\n"
        "  env.vars.NCCL_DEBUG: [WARN, LOUD, 'https://hooks.slack.com/services/T000/B000/XXXX']\n"
        "  model.overrides.per_device_batch_size: [2, 0.3]\n"
        "  model.overrides.run_name: [null, myrun]\n"
        "  checkpoint.period: [100, 100000, -1]\n"
        "  restart.max: [0, 2]\n"
        "include:\n  - {resources.nodes: 4}\n  - {runtime.backend: local}\n  - {model.model_name: llama2-70b}\n"
    )
    base = _base(doc, "spec.yaml", Lock())
    combos = expand(sweep)
    assert len(combos) == 2 * 3 * 2 * 2 * 3 * 2 + 3
    for combo in combos:
        fast = check_combination(doc, "spec.yaml", combo, base=base)
        full = check_combination(doc, "spec.yaml", combo)
        assert (fast.spec is None) == (full.spec is None), combo.label()
        if fast.spec is not None and full.spec is not None:
            assert fast.spec.model_dump() == full.spec.model_dump(), combo.label()
        assert sorted(map(str, fast.findings)) == sorted(map(str, full.findings)), combo.label()
