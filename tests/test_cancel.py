"""``mxc cancel`` of a local run: SIGTERM to its supervisor, which records `cancelled` (the Slurm
side is in test_slurm_run.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO, Mxc
from tests.gates import PASS_SET, PauseGate


def test_cancel_a_local_run(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    assert mxc("build", "-q", str(REPO / "specs" / "tiny.yaml"), "--set", PASS_SET).returncode == 0
    gate = PauseGate(tmp_path, {0: 0})  # the trainer waits after its first step: the run is surely live
    env = {**os.environ, "MXC_HOME": str(mxc_home), **gate.env()}
    proc = subprocess.Popen([sys.executable, "-m", "mxc", "run", "-q"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        gate.wait_paused(0, alive=lambda: proc.poll() is None)
        [run_id] = [p.parent.name for p in (mxc_home / "runs").glob("*/record.json")]
        out = mxc("cancel", run_id[:15], "--json")
        assert out.returncode == 0, out.stderr
        rec = json.loads(out.stdout)
        assert rec["status"] == "cancelled" and rec["final"] is True and rec["cancelled_by"] == "mxc cancel"
        assert rec["message"] == "cancelled with mxc cancel"  # who stopped it, not only the signal it sent
        assert proc.wait(timeout=60) == 143
        again = mxc("cancel", run_id)
        assert again.returncode == 2 and again.stderr == f"mxc: error: run {run_id} already ended (cancelled)\n"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    unknown = mxc("cancel", "19990101")
    assert unknown.returncode == 2 and unknown.stderr.startswith("mxc: error: no run matches '19990101'")
