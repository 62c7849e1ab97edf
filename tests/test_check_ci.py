"""The CI examples in docs/ci/ run: the GitLab job's script on a real git repository (a merge
request that changes a spec, and one that breaks a base spec), the GitHub steps through bash -n
and shellcheck."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

VENV_BIN = str(Path(sys.executable).parent)


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@x"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True).stdout


def merge_request(tmp_path: Path, edit: dict[str, tuple[str, str]]) -> Path:
    """origin (main: the shipped specs) and a clone on a branch with ``edit`` committed."""
    origin = tmp_path / "origin"
    (origin / "specs").mkdir(parents=True)
    shutil.copytree(REPO / "specs", origin / "specs", dirs_exist_ok=True)
    git(origin, "init", "-q", "-b", "main")
    git(origin, "add", ".")
    git(origin, "commit", "-q", "-m", "specs")
    work = tmp_path / "mr"
    git(tmp_path, "clone", "-q", str(origin), str(work))
    git(work, "checkout", "-q", "-b", "change")
    for rel, (old, new) in edit.items():
        path = work / rel
        text = path.read_text()
        assert old in text
        path.write_text(text.replace(old, new))
    git(work, "commit", "-q", "-am", "change")
    return work


def gitlab_script(base_dir: Path) -> str:
    job = yaml.safe_load((REPO / "docs" / "ci" / "gitlab-ci.yml").read_text())["mxc-specs"]
    assert any("mxc check" in line for line in job["script"]) and job["artifacts"]["reports"]["junit"] == "mxc-check.xml"
    return "set -eo pipefail\n" + "\n".join(job["script"]).replace("/tmp/base", str(base_dir)) + "\n"


def run_job(work: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}", "CI_MERGE_REQUEST_TARGET_BRANCH_NAME": "main",
           "MXC_HOME": str(tmp_path / "home")}
    env.pop("MXC_BOT_TOKEN", None)
    return subprocess.run(["bash", "-c", gitlab_script(tmp_path / "base")], cwd=work, env=env, capture_output=True,
                          text=True, timeout=600)


def test_gitlab_job_checks_builds_and_diffs_a_changed_spec(tmp_path: Path) -> None:
    work = merge_request(tmp_path, {"specs/tiny.yaml": ("    steps: 30\n", "    steps: 20\n")})
    job = run_job(work, tmp_path)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    diff = (work / "mxc-diff.md").read_text()
    assert "#### `specs/tiny.yaml` -> bundle `" in diff and "~ model.overrides.steps: 30 -> 20" in diff
    assert "MXC_BOT_TOKEN not set" in job.stdout
    suites = ET.parse(work / "mxc-check.xml").getroot()
    assert suites.get("failures") == "0" and [s.get("name") for s in suites.iter("testsuite")] == ["specs/tiny.yaml"]


def test_gitlab_job_fails_when_a_base_spec_breaks(tmp_path: Path) -> None:
    work = merge_request(tmp_path, {"specs/base/cuda.yaml": ("xla_gpu_enable_triton_gemm: false",
                                                             "xla_gpu_enable_triton_gem: false")})
    job = run_job(work, tmp_path)
    assert job.returncode == 1, job.stdout[-3000:] + job.stderr[-3000:]
    assert re.search(r"specs/base/cuda\.yaml:\d+: env\.xla_flags\.xla_gpu_enable_triton_gem: error\[xla-flag-unknown\]",
                     job.stdout)
    report = ET.parse(work / "mxc-check.xml").getroot()  # written before the gate failed
    assert report.get("failures") == "1"
    assert not (work / "mxc-diff.md").exists()  # nothing built from a failing spec


def github_steps() -> list[str]:
    flow = yaml.safe_load((REPO / "docs" / "ci" / "github-actions.yml").read_text())
    steps = flow["jobs"]["check"]["steps"]
    scripts = [s["run"] for s in steps if "run" in s]
    text = "\n".join(scripts)
    assert "mxc check --probe --format github" in text and "mxc build" in text and "mxc diff" in text
    return [re.sub(r"\$\{\{[^}]*\}\}", "X", s) for s in scripts]


@pytest.mark.parametrize("index", range(len(github_steps())))
def test_github_steps_are_valid_bash(index: int, tmp_path: Path) -> None:
    script = tmp_path / "step.sh"
    script.write_text("#!/usr/bin/env bash\nset -eo pipefail\n" + github_steps()[index])
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True).returncode == 0
    lint = subprocess.run(["shellcheck", "-S", "warning", str(script)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout
