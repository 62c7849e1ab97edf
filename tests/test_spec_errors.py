"""Every class of bad spec fails with exit 2, file:line: key: message, no traceback, store untouched."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import REPO, Mxc, store_snapshot

GOOD = """\
schema: mxc/v1
name: t
code:
  maxtext_version: "0.2.5"
model:
  model_name: default
"""

CASES: dict[str, tuple[bytes, list[str]]] = {
    "unknown key with did-you-mean": (
        GOOD.replace("  model_name: default", "  model_name: default\n  overides: {steps: 3}").encode(),
        [r"spec\.yaml:7: model\.overides: unknown key \(did you mean 'overrides'\?\)"],
    ),
    "unknown top-level key": (
        (GOOD + "resorces:\n  nodes: 2\n").encode(),
        [r"spec\.yaml:7: resorces: unknown key \(did you mean 'resources'\?\)"],
    ),
    "wrong type": (
        (GOOD + "resources:\n  nodes: two\n").encode(),
        [r"spec\.yaml:8: resources\.nodes: .*valid integer.*got 'two'"],
    ),
    "bad digest": (
        GOOD.replace("code:\n  maxtext_version: \"0.2.5\"",
                     "code:\n  repo: r\n  commit: " + "a" * 40) .encode()
        + b"image:\n  ref: x\n  digest: sha256:abc\nruntime:\n  container: podman\n",
        [r"spec\.yaml:10: image\.digest: expected sha256:<64 lowercase hex digits>, got 'sha256:abc'"],
    ),
    "bad commit": (
        GOOD.replace("code:\n  maxtext_version: \"0.2.5\"", "code:\n  repo: r\n  commit: 1234abc").encode(),
        [r"spec\.yaml:5: code\.commit: expected a full 40-hex git commit"],
    ),
    "duplicate key": (
        (GOOD + "name: u\n").encode(),
        [r"spec\.yaml:7: name: duplicate key \(first defined on line 2\)"],
    ),
    "non-UTF-8": (
        GOOD.encode() + b"description: caf\xe9\n",
        [r"spec\.yaml:7: not valid UTF-8"],
    ),
    "alias bomb": (
        (GOOD + 'a: &a ["x", "x"]\nb: &b [*a, *a, *a]\nc: [*b, *b, *b]\n').encode(),
        [r"spec\.yaml:8:\d+: YAML: YAML aliases \(\*name\) are not allowed"],
    ),
    "invalid YAML": (
        (GOOD + "resources: [\n").encode(),
        [r"spec\.yaml:\d+:\d+: YAML: "],
    ),
    "unknown model": (
        GOOD.replace("model_name: default", "model_name: lama2-70b").encode(),
        [r"spec\.yaml:6: model\.model_name: 'lama2-70b' is not a MaxText model \(did you mean 'llama2-70b'\?\)"],
    ),
    "bad enum": (
        (GOOD + "runtime:\n  backend: slrum\n").encode(),
        [r"spec\.yaml:8: runtime\.backend: expected one of 'local' or 'slurm', got 'slrum' \(did you mean 'slurm'\?\)"],
    ),
    "image with native": (
        (GOOD + "image:\n  ref: x\n  digest: sha256:" + "0" * 64 + "\n").encode(),
        [r"spec\.yaml:7: image: runtime\.container is native"],
    ),
    "reserved override": (
        GOOD.replace("  model_name: default", "  model_name: default\n  overrides:\n    run_name: x").encode(),
        [r"spec\.yaml:7: model\.overrides: 'run_name' is set by mxc"],
    ),
    "MaxText override key typo": (
        GOOD.replace("  model_name: default", "  model_name: default\n  overrides:\n    stepz: 30").encode(),
        [r"spec\.yaml:8: model\.overrides\.stepz: 'stepz' is not a MaxText 0\.2\.5 config key \(did you mean 'steps'\?\)"],
    ),
    "MaxText override value type": (
        GOOD.replace("  model_name: default", "  model_name: default\n  overrides:\n    steps: thirty").encode(),
        [r"spec\.yaml:8: model\.overrides\.steps: expected an integer, got 'thirty' \(default: "],
    ),
    "one line per union error": (
        (GOOD + "env:\n  vars:\n    FOO: [1, 2]\n    BAR:\n").encode(),
        [r"spec\.yaml:9: env\.vars\.FOO: expected true or false, an integer, a number or a string, got \[1, 2\] "
         r"\(one value only; to pass a list or mapping as text, quote it: '\[1, 2\]'\)$",
         r"spec\.yaml:10: env\.vars\.BAR: expected true or false, an integer, a number or a string, got null "
         r"\(an empty value is null"],
    ),
    "YAML error at its line and column": (
        GOOD.replace("  model_name: default", "  model_name: default\n  overrides: {steps: 3").encode(),
        [r"spec\.yaml:7:14: YAML: a '\{' mapping that is never closed \(.*at line 8, column 1\) \(close it with '\}'"],
    ),
    "YAML tab indentation": (
        (GOOD + "resources:\n\tnodes: 2\n").encode(),
        [r"spec\.yaml:8:1: YAML: .*\(indent with spaces, not tabs\)"],
    ),
    "several problems at once": (
        (GOOD + "resources:\n  nodes: 0\n  gpus_per_node: -1\n").encode(),
        [r"spec\.yaml:8: resources\.nodes: ", r"spec\.yaml:9: resources\.gpus_per_node: "],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_spec_exit_2_with_location_and_store_unchanged(case: str, mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    # A populated store first: a failed build must leave it exactly as it was.
    assert mxc("build", "specs/tiny.yaml").returncode == 0
    before = store_snapshot(mxc_home)
    text, patterns = CASES[case]
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(text)
    result = mxc("build", str(spec), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    for pattern in patterns:
        assert any(re.search(pattern, line) for line in lines), (pattern, result.stderr)
    assert lines[-1].endswith("nothing was written")
    assert result.stdout == ""
    assert store_snapshot(mxc_home) == before
    # Nothing made up: no error names a union member as if it were a key (env.vars.FOO.bool).
    assert not re.search(r"\.(bool|int|float|str)(:| )", result.stderr), result.stderr


def test_extends_cycle_and_missing_parent(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("extends: sub/b.yaml\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.yaml").write_text("schema: mxc/v1\nextends: ../a.yaml\n")
    result = mxc("build", "a.yaml", cwd=tmp_path)
    assert result.returncode == 2
    assert "sub/b.yaml:2: extends: extends cycle: a.yaml -> sub/b.yaml -> a.yaml" in result.stderr

    (tmp_path / "c.yaml").write_text(GOOD + "extends: [sub/missing.yaml]\n")
    result = mxc("build", "c.yaml", cwd=tmp_path)
    assert result.returncode == 2
    assert "c.yaml:7: extends: file not found: sub/missing.yaml" in result.stderr
    assert store_snapshot(mxc_home) == []


def test_missing_spec_file(mxc: Mxc, mxc_home: Path) -> None:
    """A missing spec is said to be missing (it was "1 problem in the spec"), with how to write one."""
    result = mxc("build", "specs/nope.yaml")
    assert result.returncode == 2
    assert result.stderr == "mxc: error: no spec file specs/nope.yaml (write one with: mxc init -o specs/nope.yaml)\n"
    result = mxc("build", "specs")
    assert result.returncode == 2 and result.stderr.startswith("mxc: error: specs is a directory, not a spec file")
    assert store_snapshot(mxc_home) == []


def test_bad_set_override(mxc: Mxc, mxc_home: Path) -> None:
    result = mxc("build", "specs/tiny.yaml", "--set", "runtime.backend=slrum", "--set", "resources.nodes=0")
    assert result.returncode == 2
    assert "--set: runtime.backend: expected one of 'local' or 'slurm', got 'slrum' (did you mean 'slurm'?)" in result.stderr
    assert "--set: resources.nodes: input should be greater than or equal to 1, got 0" in result.stderr
    result = mxc("build", "specs/tiny.yaml", "--set", "nodes")
    assert result.returncode == 2
    assert "--set: nodes: expected KEY.PATH=VALUE" in result.stderr
    assert store_snapshot(mxc_home) == []


def test_shipped_specs_are_clean_yaml() -> None:
    """The specs we ship must themselves obey the loader (no aliases, no duplicates)."""
    from mxc.compiler.loader import load_yaml

    for path in (REPO / "specs").rglob("*.yaml"):
        load_yaml(str(path), path.read_text("utf-8"))


def test_union_errors_are_one_line_each_in_check_too(mxc: Mxc, tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(GOOD + "env:\n  vars:\n    FOO: {a: 1}\n")
    result = mxc("check", str(spec), cwd=tmp_path)
    assert result.returncode == 1  # check: 1 for findings, 2 for usage
    hits = [line for line in result.stdout.splitlines() if "env.vars.FOO: error[" in line]
    assert len(hits) == 1, result.stdout
    assert "expected true or false, an integer, a number or a string, got {\"a\": 1}" in hits[0]


def test_build_refuses_an_override_maxtext_refuses_but_builds_the_valid_ones(mxc: Mxc, mxc_home: Path,
                                                                             tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(GOOD.replace("  model_name: default",
                                 "  model_name: default\n  overrides:\n    steps: 30\n    learning_rate: 1.0e-4"))
    assert mxc("build", str(spec), cwd=tmp_path).returncode == 0
    result = mxc("build", str(spec), "--set", "model.overrides.stepz=3", cwd=tmp_path)
    assert result.returncode == 2
    assert "--set: model.overrides.stepz: 'stepz' is not a MaxText 0.2.5 config key (did you mean 'steps'?)" \
        in result.stderr, result.stderr
