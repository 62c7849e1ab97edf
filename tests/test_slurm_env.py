"""The environment boundary on the test Slurm (issue 23): ``sbatch --export=ALL`` and ``srun`` hand
the job the submitting shell's environment, and the node program lets only the declared base, the
spec's ``env.pass`` and what the spec's ``runtime.modules`` set reach the training
(mxc/node/envboundary.py). Real daemons (tests/slurm_cluster.py); the first test trains MaxText,
the second uses the stand-in trainer (tests/standins/trainer.py) and an exported ``module`` shell
function standing in for Lmod (no module system is installed here)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, Mxc
from tests.slurm_cluster import SlurmCluster
from tests.slurm_jobs import build, run_dir, slurm_sets, submit, wait_final

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_env")]

FAST_MATH = "--xla_cpu_enable_fast_math=true"
STANDIN = REPO / "tests" / "standins" / "trainer.py"


def _losses(run: Path) -> list[str]:
    lines = (run / "metrics" / "attempt-0.rank-0.jsonl").read_text().splitlines()
    return [f'{json.loads(line)["step"]}:{json.loads(line)["learning/loss"]!r}' for line in lines]


@pytest.mark.training
def test_a_submitting_shells_xla_flags_reaches_no_slurm_training(mxc: Mxc, mxc_home: Path,
                                                                 slurm_cluster: SlurmCluster) -> None:
    """The run submitted from a shell with fast math on trains exactly as its rerun from a shell
    without it: ``rerun --verify`` (following a Slurm job) finds every step's loss equal."""
    bundle = build(mxc, *slurm_sets(slurm_cluster, nodes=1, **{"checkpoint.period": 0}))
    run_id = submit(mxc, bundle, env={"XLA_FLAGS": FAST_MATH})
    final = wait_final(mxc_home, run_id, timeout=600)
    assert final.status == "succeeded", final.message
    run = run_dir(mxc_home, run_id).path
    trained = json.loads((run / "ranks" / "0" / "environment.json").read_text())
    assert "XLA_FLAGS" not in trained["environment"] and trained["environment"]["SLURM_JOB_ID"]
    assert "XLA_FLAGS" not in json.loads((run / "record.json").read_text())["environment"]
    out = mxc("rerun", run_id, "--verify", "-y", timeout=900)
    assert out.returncode == 0, out.stderr
    rerun = run_dir(mxc_home, out.stdout.strip()).path
    assert f"all 30 steps of run {rerun.name} match run {run_id} bit for bit" in out.stderr, out.stderr
    assert _losses(rerun) == _losses(run) and len(_losses(run)) == 30


def test_what_the_specs_module_loads_set_reaches_the_training(mxc: Mxc, mxc_home: Path, slurm_cluster: SlurmCluster,
                                                             tmp_path: Path) -> None:
    """``runtime.modules: [cuda]`` with a ``module`` function that sets CUDA_HOME and prepends to
    PATH: both reach the stand-in trainer, recorded as the modules'; the submitting shell's
    XLA_FLAGS and a stray MXC_MODULE_VARS naming it do not; the before-file is gone."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python"
    python.write_text(f'#!/bin/bash\nif [ "$1" = -m ]; then exec {sys.executable} {STANDIN} "$@"; fi\nexit 0\n')
    python.chmod(0o755)
    module = "() { export CUDA_HOME=/opt/fake-cuda; export PATH=/opt/fake-cuda/bin:$PATH; }"
    bundle = build(mxc, *slurm_sets(slurm_cluster, nodes=1, **{"runtime.modules": "[cuda]"}))
    tmp = tmp_path / "tmp"  # where job.sbatch's mktemp puts the environment before the module loads
    tmp.mkdir()
    run_id = submit(mxc, bundle, env={"PATH": f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin", "TMPDIR": str(tmp),
                                      "MXC_PYTHON": str(python), "MXCTEST_ENV_DUMP": "1", "XLA_FLAGS": FAST_MATH,
                                      "MXC_MODULE_VARS": "XLA_FLAGS", "BASH_FUNC_module%%": module})
    final = wait_final(mxc_home, run_id, timeout=240)
    assert final.status == "succeeded", final.message
    run = run_dir(mxc_home, run_id).path
    seen = json.loads((run / "environment.attempt-0.rank-0.json").read_text())  # the trainer's whole environment
    assert seen["CUDA_HOME"] == "/opt/fake-cuda" and seen["PATH"].startswith("/opt/fake-cuda/bin:")
    assert "XLA_FLAGS" not in seen and not any(k.startswith("MXC_MODULE") or k.startswith("MXC_ENV") for k in seen)
    assert not any(k.startswith("BASH_FUNC") for k in seen)
    training = final.training or {}
    assert training["modules"] == ["CUDA_HOME", "PATH"], training
    assert not list(tmp.glob("tmp.*")), "the environment before the module loads was left behind"
    assert "environment before the module loads" not in (run / "train.log").read_text()  # read, then removed
