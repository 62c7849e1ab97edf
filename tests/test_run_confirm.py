"""`mxc run` of a cluster bundle asks first: a one-screen summary and y/N on a terminal (a real
pty here), `-y` to skip it, and a refusal when nobody can answer (stdin not a terminal)."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, Mxc
from tests.processes import stand_ins

SBATCH = """#!/bin/bash
printf '%s\\n' "$@" > "${0%/*}/sbatch.$$.argv"
echo 4242
"""


@pytest.fixture
def sbatch_bin(tmp_path: Path) -> Path:
    """An ``sbatch`` stand-in that records each call (what was submitted is all these tests look at)."""
    return stand_ins(tmp_path, {"sbatch": SBATCH})


def sbatch_calls(bin_dir: Path) -> list[Path]:
    return sorted(bin_dir.glob("sbatch.*.argv"))


def slurm_bundle(mxc: Mxc) -> str:
    sets = {"runtime.backend": "slurm", "resources.nodes": 2, "resources.gpus_per_node": 8,
            "resources.gpu_vendor": "nvidia", "resources.partition": "gpu-a", "resources.time": "01:30:00",
            "env.vars.JAX_PLATFORMS": "cuda"}  # tiny's cpu on GPUs: `mxc build` refuses it (jax-platforms)
    out = mxc("build", "-q", str(REPO / "specs" / "tiny.yaml"), *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")])
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def run_on_a_terminal(home: Path, bin_dir: Path, answer: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``mxc run ARGS`` with a pty as stdin; ``answer`` is typed before it asks (the terminal keeps it)."""
    controller, terminal = pty.openpty()
    try:
        os.write(controller, answer.encode())
        env = {**os.environ, "MXC_HOME": str(home), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
        proc = subprocess.run([sys.executable, "-m", "mxc", "run", *args], cwd=REPO, env=env, stdin=terminal,
                              capture_output=True, text=True, timeout=300)
    finally:
        os.close(terminal)
        os.close(controller)
    return proc


def runs_of(home: Path) -> list[Path]:
    root = home / "runs"
    return sorted(root.iterdir()) if root.is_dir() else []


def test_a_terminal_answer_of_no_submits_nothing(mxc: Mxc, mxc_home: Path, sbatch_bin: Path) -> None:
    digest = slurm_bundle(mxc)
    out = run_on_a_terminal(mxc_home, sbatch_bin, "n\n", digest[:10])
    assert out.returncode == 1, out.stderr
    assert sbatch_calls(sbatch_bin) == [] and runs_of(mxc_home) == []
    err = out.stderr
    assert "mxc: about to submit to slurm:" in err and "Submit? [y/N]" in err
    for shown in (f"bundle      {digest[:12]} (tiny)", "nodes       2 node(s) x 8 GPU(s) = 16 GPUs",
                  "partition   gpu-a", "time limit  01:30:00", "image       native", "restarts    up to"):
        assert shown in err, (shown, err)
    assert "the last built bundle" not in err  # it was named
    assert err.rstrip().endswith("mxc: not submitted")


def test_a_terminal_answer_of_yes_submits_once(mxc: Mxc, mxc_home: Path, sbatch_bin: Path) -> None:
    slurm_bundle(mxc)
    out = run_on_a_terminal(mxc_home, sbatch_bin, "y\n")  # no bundle named: the last built, said so
    assert out.returncode == 0, out.stderr
    assert "(the last built bundle: no bundle was named)" in out.stderr
    assert len(sbatch_calls(sbatch_bin)) == 1
    (run,) = runs_of(mxc_home)
    assert out.stdout.strip() == run.name
    record = json.loads((run / "record.json").read_text())
    assert record["status"] == "queued" and record["slurm"]["job_id"] == "4242"


def test_without_a_terminal_it_refuses_unless_told_yes(mxc: Mxc, mxc_home: Path, sbatch_bin: Path) -> None:
    digest = slurm_bundle(mxc)
    env = {"PATH": f"{sbatch_bin}{os.pathsep}{os.environ['PATH']}"}
    piped = mxc("run", digest[:10], input="y\n", env=env)  # a "y" on a pipe is not a person answering
    assert piped.returncode == 2
    assert piped.stderr == (f"mxc: error: refusing to submit {digest[:12]} (tiny) to slurm without confirmation: "
                            "stdin is not a terminal (pass -y (--yes) to submit without asking)\n")
    # the last built bundle, unnamed, from a script: refused even with -y
    unnamed = mxc("run", "-y", input="", env=env)
    assert unnamed.returncode == 2 and len(unnamed.stderr.splitlines()) == 1
    assert unnamed.stderr.startswith(f"mxc: error: refusing to submit the last built bundle ({digest[:12]}, tiny, "
                                     "2 node(s)) without a terminal to confirm on")
    assert f"mxc run {digest[:12]} -y" in unnamed.stderr
    assert sbatch_calls(sbatch_bin) == [] and runs_of(mxc_home) == []
    dry = mxc("run", "--dry-run", input="", env=env)  # submits nothing: never asked
    assert dry.returncode == 0 and "sbatch" in dry.stdout
    named = mxc("run", digest[:10], "-y", "-q", input="", env=env)
    assert named.returncode == 0, named.stderr
    assert len(sbatch_calls(sbatch_bin)) == 1 and [r.name for r in runs_of(mxc_home)] == [named.stdout.strip()]
