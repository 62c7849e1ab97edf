"""`mxc run` with pinned code (code.repo + code.commit), and run failures, without real MaxText.

A throw-away git repository (made with gitpython) holds a tiny stand-in for MaxText at
src/maxtext/trainers/pre_train/train.py: it records which file and version it ran as,
writes a MaxText-style metrics file and log lines, and can fail on request. The bundle's
real entrypoint.sh runs it through the real supervisor.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import git

from tests.conftest import REPO, Mxc, store_snapshot

FAKE_TRAIN = '''\
"""Stand-in for maxtext.trainers.pre_train.train: same argv and files, no JAX."""
import json, os, sys

VERSION = "{version}"


def main():
    args = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
    run_dir = os.environ["MXC_RUN_DIR"]
    attempt = int(os.environ.get("MXC_ATTEMPT", "0"))
    with open(os.path.join(run_dir, "ran-%d.json" % attempt), "w") as fh:
        json.dump({{"version": VERSION, "file": os.path.abspath(__file__), "cwd": os.getcwd()}}, fh)
    if os.environ.get("FAKE_FAIL_AT_START"):
        print("ValueError: fake config error", file=sys.stderr)
        sys.exit(int(os.environ["FAKE_FAIL_AT_START"]))
    steps = int(args.get("steps", "3"))
    crash_after = int(os.environ.get("FAKE_CRASH_AFTER", "-1"))
    with open(args["metrics_file"], "w") as metrics:
        for step in range(steps):
            loss = 1.0 / (step + 1)
            metrics.write(json.dumps({{"learning/loss": loss, "step": float(step), "run_name": args["run_name"]}}) + "\\n")
            metrics.flush()
            print("completed step: %d, seconds: 0.001, total_weights: 64, loss: %.3f" % (step, loss), file=sys.stderr)
            if step == crash_after and os.environ.get("FAKE_CRASH_KILLED"):
                os.kill(os.getpid(), 9)  # killed from outside (the OOM killer, an operator)
            if step == crash_after:
                sys.exit(5)  # an application error


if __name__ == "__main__":
    main()
'''


CodeRepo = tuple[Path, str, str]  # checkout, pinned commit v1, HEAD v2


def _commit(repo: git.Repo, root: Path, version: str, message: str) -> str:
    import git

    train = root / "src/maxtext/trainers/pre_train/train.py"
    train.write_text(FAKE_TRAIN.format(version=version))
    repo.index.add([str(train.relative_to(root))])
    actor = git.Actor("mxc test", "test@example.invalid")
    return str(repo.index.commit(message, author=actor, committer=actor).hexsha)


@pytest.fixture(scope="module")
def code_repo(tmp_path_factory: pytest.TempPathFactory) -> CodeRepo:
    """A repo whose commit v1 is pinned, HEAD is v2, and whose working tree is dirty."""
    import git

    root = tmp_path_factory.mktemp("fake-maxtext")
    repo = git.Repo.init(root)
    for pkg in ("src/maxtext", "src/maxtext/trainers", "src/maxtext/trainers/pre_train"):
        (root / pkg).mkdir(parents=True, exist_ok=True)
        (root / pkg / "__init__.py").write_text("")
        repo.index.add([f"{pkg}/__init__.py"])
    v1 = _commit(repo, root, "v1", "v1")
    v2 = _commit(repo, root, "v2", "v2")
    (root / "src/maxtext/trainers/pre_train/train.py").write_text(FAKE_TRAIN.format(version="working-tree"))
    assert repo.is_dirty()
    return root, v1, v2


def _spec(tmp: Path, repo: Path, commit: str, name: str = "pinned", env: dict[str, str] | None = None,
          restarts: int = 0) -> Path:
    lines = [
        "schema: mxc/v1", f"name: {name}",
        "code:", f"  repo: {json.dumps(str(repo))}", f"  commit: {json.dumps(commit)}",
        "model:", "  model_name: default", "  overrides:", "    steps: 4",
        "runtime:", "  backend: local", "  container: native", "  preflight:", "    stale_processes: false",
        "    min_free_gb: 0",
        f"restart:\n  max: {restarts}",
    ]
    if env:
        lines += ["env:", "  vars:"] + [f"    {k}: {json.dumps(v)}" for k, v in env.items()]
    path = tmp / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _build(mxc: Mxc, spec: Path) -> str:
    out = mxc("build", str(spec), "-q")
    assert out.returncode == 0, out.stderr
    return str(out.stdout).strip()


def _only_run(home: Path) -> Path:
    runs = sorted((home / "runs").iterdir())
    assert len(runs) == 1, runs
    return runs[0]


def test_run_uses_the_pinned_commit_not_the_working_tree(mxc: Mxc, mxc_home: Path, tmp_path: Path, code_repo: CodeRepo) -> None:
    repo, v1, _ = code_repo
    bundle = _build(mxc, _spec(tmp_path, repo, v1))
    out = mxc("run", bundle, "-q")
    assert out.returncode == 0, out.stderr
    run = _only_run(mxc_home)
    assert out.stdout.strip() == run.name
    ran = json.loads((run / "ran-0.json").read_text())
    code_dir = mxc_home / "code" / v1
    assert ran["version"] == "v1"  # not v2 (HEAD) and not the dirty working tree
    assert ran["file"] == str(code_dir / "src/maxtext/trainers/pre_train/train.py")
    assert ran["cwd"] == str(code_dir)
    record = json.loads((run / "record.json").read_text())
    assert record["status"] == "succeeded" and record["final"] is True
    assert record["code"]["commit"] == v1 and record["code"]["repo"] == str(repo)
    assert record["environment"]["MXC_CODE_DIR"] == str(code_dir)
    assert record["steps"] == 4
    # The export is read-only and carries its own file list.
    assert not os.access(code_dir / "src/maxtext/trainers/pre_train/train.py", os.W_OK) or os.geteuid() == 0
    assert json.loads((code_dir / ".mxc-code.json").read_text())["commit"] == v1


def test_dirty_or_mismatching_checkout_is_refused(mxc: Mxc, mxc_home: Path, tmp_path: Path, code_repo: CodeRepo) -> None:
    repo, v1, v2 = code_repo
    bundle = _build(mxc, _spec(tmp_path, repo, v1))
    assert mxc("run", bundle, "-q").returncode == 0
    code_dir = mxc_home / "code" / v1
    train = code_dir / "src/maxtext/trainers/pre_train/train.py"

    train.chmod(0o644)
    original = train.read_text()
    train.write_text(original.replace('VERSION = "v1"', 'VERSION = "edited"'))
    before = store_snapshot(mxc_home)
    out = mxc("run", bundle, "-q")
    assert out.returncode == 2
    assert "is dirty: src/maxtext/trainers/pre_train/train.py changed" in out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert store_snapshot(mxc_home) == before  # no run directory was made

    train.write_text(original)
    manifest = code_dir / ".mxc-code.json"
    data = json.loads(manifest.read_text())
    manifest.chmod(0o644)
    manifest.write_text(json.dumps({**data, "commit": v2}))
    out = mxc("run", bundle, "-q")
    assert out.returncode == 2
    assert f"holds commit {v2[:12]}, not {v1[:12]}" in out.stderr
    assert store_snapshot(mxc_home) == before


def test_commit_missing_from_repo_is_refused(mxc: Mxc, mxc_home: Path, tmp_path: Path, code_repo: CodeRepo) -> None:
    repo, _, _ = code_repo
    bundle = _build(mxc, _spec(tmp_path, repo, "0" * 40))
    before = store_snapshot(mxc_home)
    out = mxc("run", bundle, "-q")
    assert out.returncode == 2
    assert f"commit 000000000000 is not in code.repo '{repo}'" in out.stderr
    assert store_snapshot(mxc_home) == before


def test_failure_before_the_first_step_is_recorded_and_not_restarted(mxc: Mxc, mxc_home: Path, tmp_path: Path,
                                                                     code_repo: CodeRepo) -> None:
    repo, v1, _ = code_repo
    bundle = _build(mxc, _spec(tmp_path, repo, v1, name="fails", env={"FAKE_FAIL_AT_START": "7"}, restarts=2))
    out = mxc("run", bundle, "-q")
    assert out.returncode == 7, out.stderr
    record = json.loads((_only_run(mxc_home) / "record.json").read_text())
    assert record["status"] == "failed" and record["final"] is True
    assert record["exit_code"] == 7 and record["restarts"] == 0 and len(record["attempts"]) == 1
    assert "ValueError: fake config error" in record["message"]


def test_restarts_stop_at_restart_max(mxc: Mxc, mxc_home: Path, tmp_path: Path, code_repo: CodeRepo) -> None:
    """A trainer killed from outside after a step is restarted (the restart policy, docs/restarts.md),
    at most restart.max times. (Before the one policy, any exit after a step was restarted locally;
    an application error no longer is: test_an_application_error_is_not_restarted.)"""
    repo, v1, _ = code_repo
    bundle = _build(mxc, _spec(tmp_path, repo, v1, name="crashes", env={"FAKE_CRASH_AFTER": "1", "FAKE_CRASH_KILLED": "1"},
                               restarts=2))
    out = mxc("run", bundle, "--json")
    assert out.returncode == 137, out.stderr
    record = json.loads(out.stdout)
    assert record["status"] == "failed" and record["restarts"] == 2
    assert [a["exit_code"] for a in record["attempts"]] == [137, 137, 137]
    assert [a["cause"] for a in record["attempts"]] == ["killed", "killed", "killed"]
    assert [a["number"] for a in record["attempts"]] == [0, 1, 2]
    assert "not restarted: restart.max (2) reached" in record["message"]
    run = Path(record["tensorboard"]).parents[3]
    assert sorted(p.name for p in (run / "metrics").iterdir()) == [
        "attempt-0.rank-0.jsonl", "attempt-1.rank-0.jsonl", "attempt-2.rank-0.jsonl"]
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0.0, 1.0]  # each attempt restarted at 0 and replaced the one before


def test_an_application_error_is_not_restarted(mxc: Mxc, mxc_home: Path, tmp_path: Path, code_repo: CodeRepo) -> None:
    repo, v1, _ = code_repo
    bundle = _build(mxc, _spec(tmp_path, repo, v1, name="errs", env={"FAKE_CRASH_AFTER": "1"}, restarts=2))
    out = mxc("run", bundle, "--json")
    assert out.returncode == 5, out.stderr
    record = json.loads(out.stdout)
    assert record["status"] == "failed" and record["restarts"] == 0
    assert [(a["exit_code"], a["cause"]) for a in record["attempts"]] == [(5, "application_error")]
    # The cause in triage's words (it found no known error in a silent exit 5), the policy's reason after it
    assert record["message"].startswith("training exited with 5: failed; no known error found  [unknown; blame: unknown]")
    assert record["message"].endswith("not restarted: an application error fails the same way again (see `mxc triage RUN`)")


def test_dry_run_prints_the_command_and_writes_nothing(mxc: Mxc, mxc_home: Path, tmp_path: Path, code_repo: CodeRepo) -> None:
    repo, v1, _ = code_repo
    bundle = _build(mxc, _spec(tmp_path, repo, v1))
    before = store_snapshot(mxc_home)
    out = mxc("run", "--dry-run", "--json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["command"] == ["bash", str(mxc_home / "bundles" / bundle / "entrypoint.sh")]
    assert plan["env"]["MXC_CODE_DIR"] == str(mxc_home / "code" / v1)
    assert plan["env"]["MXC_BUNDLE_DIR"] == str(mxc_home / "bundles" / bundle)
    assert plan["env"]["MXC_RUN_DIR"].startswith(str(mxc_home / "runs") + "/")
    assert store_snapshot(mxc_home) == before
    text = mxc("run", bundle, "--dry-run")
    assert "entrypoint.sh" in text.stdout and "MXC_RUN_DIR=" in text.stdout


def test_help_never_imports_heavy_modules() -> None:
    code = ("import sys; from mxc.cli.main import build_parser; build_parser(); import mxc.runtime.local.backend, "
            "mxc.runtime.local.supervisor, mxc.runtime.runs; "
            "bad = [m for m in ('jax', 'maxtext', 'ray', 'git') if m in sys.modules]; print(bad); sys.exit(bool(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stdout + out.stderr


def test_readonly_export_can_be_removed_by_its_hint(mxc: Mxc, mxc_home: Path, tmp_path: Path, code_repo: CodeRepo) -> None:
    """The hint in the dirty-checkout error (rm -rf DIR) works despite the read-only export."""
    repo, v1, _ = code_repo
    bundle = _build(mxc, _spec(tmp_path, repo, v1))
    assert mxc("run", bundle, "-q").returncode == 0
    code_dir = mxc_home / "code" / v1
    assert not (stat.S_IMODE(code_dir.stat().st_mode) & stat.S_IWUSR)
    subprocess.run(["rm", "-rf", str(code_dir)], check=True)
    assert not code_dir.exists()
    assert mxc("run", bundle, "-q").returncode == 0  # re-exported
    assert code_dir.is_dir()
