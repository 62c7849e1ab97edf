"""``--cluster`` end to end: a laptop submits to the test Slurm through a real sshd on 127.0.0.1
(tests/remote_support.py), follows, waits, lists, cancels, triages and reports, all through the
login node's mxc (this repository's, its home and runs root elsewhere, as on another machine).

The laptop has no Slurm (its SLURM_CONF names nothing: any Slurm call it made would fail); the
login node's environment is what a site's module gives (Slurm's config, PATH). Training is the
stand-in trainer (tests/standins/trainer.py) as the native ``python``, so a run takes seconds.
The profile's home and runs root hold spaces, ``$(...)``, backticks, ``;`` and ``&&``: data there.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mxc.runtime.rundir import RunDir
from tests.conftest import REPO
from tests.remote_support import LOGIN, Laptop, Sshd, login_node
from tests.slurm_cluster import SlurmCluster
from tests.slurm_jobs import slurm_sets, wait_for

pytestmark = [pytest.mark.slurm]
STANDIN = REPO / "tests" / "standins" / "trainer.py"


@dataclass(frozen=True)
class Remote:
    laptop: Laptop
    root: Path  # the test's directory: the login node's mxc is login/mxc there
    runs: Path  # the login node's runs root (the test peeks there to wait on events)
    canary: Path  # made by any hostile value that reached a shell unquoted
    cluster: SlurmCluster
    sshd: Sshd


@pytest.fixture(scope="module")
def remote(slurm_cluster: SlurmCluster, sshd: Sshd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Remote]:
    root = tmp_path_factory.mktemp("remote")
    bin_dir = root / "login" / "bin"
    bin_dir.mkdir(parents=True)
    python = bin_dir / "python"  # the native interpreter of the bundle: -m ... runs the stand-in trainer
    python.write_text(f'#!/bin/bash\nif [ "$1" = -m ]; then exec {sys.executable} {STANDIN} "$@"; fi\nexit 0\n')
    python.chmod(0o755)
    mxc = login_node(root / "login", {"SLURM_CONF": str(slurm_cluster.conf), "MXC_PYTHON": str(python),
                                      "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}"})
    canary = root / "pwned"
    # No quotes: Slurm's --export refuses them (tests/test_remote.py, which also sends quotes through ssh).
    home = f"{root}/login home $(touch {canary}) `touch {canary}` && touch {canary}"
    runs = f"{root}/runs $(touch {canary}) `touch {canary}`; touch {canary}"
    laptop = Laptop(root, sshd, SLURM_CONF=str(root / "no-slurm-on-the-laptop.conf"))
    out = laptop("cluster", "add", "hpc", LOGIN, "--mxc", str(mxc), "--home", home, "--runs-dir", runs)
    assert out.returncode == 0, out.stderr
    yield Remote(laptop, root, Path(runs), canary, slurm_cluster, sshd)
    assert not canary.exists(), "a value reached the login shell unquoted"


def _remote_commands(*words: str) -> list[int]:
    """Pids of the login node's mxc commands (``remote-agent ... run WORDS``) that are still running."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if "remote-agent" in argv and all(w in argv for w in words) and state != "Z":
            found.append(int(entry.name))
    return found


def _submitted(remote: Remote, *args: str) -> tuple[str, str]:
    out = remote.laptop("run", "--cluster", "hpc", *args, "-y")
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1], out.stderr


def test_a_run_from_the_laptop_is_followed_waited_listed_triaged_and_reported(remote: Remote, tmp_path: Path) -> None:
    laptop = remote.laptop
    bundle = laptop.build(*slurm_sets(remote.cluster, nodes=1))
    run_id, said = _submitted(remote, bundle, "--label", "first")
    assert f"bundle {bundle[:12]} copied (" in said and "verified there" in said
    follow = laptop.start("logs", "--cluster", "hpc", run_id, "-f")  # from the start of the run to its end
    logged, errors = follow.communicate(timeout=300)
    assert follow.returncode == 0, errors
    assert [line for line in logged.splitlines() if "completed step: " in line], logged[-3000:]
    assert "completed step: 2," in logged
    waited = laptop("wait", "--cluster", "hpc", run_id)
    assert waited.returncode == 0 and f"run {run_id} succeeded" in waited.stderr
    [listed] = json.loads(laptop("runs", "--cluster", "hpc", "--json").stdout)
    assert (listed["run_id"], listed["bundle"], listed["status"], listed["labels"]) == (run_id, bundle, "succeeded",
                                                                                        ["first"])
    assert listed["path"] == str(remote.runs / run_id), "runs live in the profile's runs root, named literally"
    assert run_id in laptop("runs", "--cluster", "hpc").stdout

    # The same bundle again: nothing is copied (the transfer says so), the remote run is a new one, and
    # it takes one command over the shared connection (the store's answer and the run in one call).
    sessions = remote.sshd.log.read_text().count("Starting session: command")
    started = time.perf_counter()
    again, said = _submitted(remote, bundle)
    resubmit_s = time.perf_counter() - started
    assert "is in its store already (nothing copied)" in said and again != run_id
    assert remote.sshd.log.read_text().count("Starting session: command") - sessions == 1
    push = json.loads(laptop("cluster", "push", "hpc", bundle, "--json").stdout)
    assert push["copied"] is False and push["bytes"] == 0
    print(f"no-op re-submit over the shared connection: {resubmit_s:.2f}s")

    triage = laptop("triage", "--cluster", "hpc", run_id, "--json")
    assert triage.returncode == 0, triage.stderr
    verdict = json.loads(triage.stdout)
    assert (verdict["run_id"], verdict["status"]) == (run_id, "succeeded")
    report = laptop("report", "--cluster", "hpc", run_id, "-o", str(tmp_path / "report.html"), "--json")
    assert report.returncode == 0, report.stderr
    page = (tmp_path / "report.html").read_text()
    assert run_id in page and "<html" in page.lower()
    assert json.loads(report.stdout)["output"] == str(tmp_path / "report.html")
    metrics = laptop("metrics", "--cluster", "hpc", run_id)  # observability was off: the remote's exit 2 and line
    assert metrics.returncode == 2 and "observability off" in metrics.stderr, metrics.stderr
    # A hostile --grep is a pattern there, never shell code; exit codes of the remote command come back.
    grep = laptop("logs", "--cluster", "hpc", run_id, "--grep", f"$(touch {remote.canary})|`id`|'\"; exit 7")
    assert grep.returncode == 0 and grep.stdout == ""
    missing = laptop("logs", "--cluster", "hpc", "20990101-000000-nope")
    assert missing.returncode == 2 and "no run" in missing.stderr
    assert not remote.canary.exists()


def test_a_run_is_cancelled_from_the_laptop(remote: Remote) -> None:
    laptop = remote.laptop
    bundle = laptop.build(*slurm_sets(remote.cluster, nodes=1, **{"env.pass": "[]",
                                                                    "env.vars.MXCTEST_TRAINER": '"*=silent"'}))
    run_id, _ = _submitted(remote, bundle)
    log = RunDir(remote.runs / run_id).log
    follow = laptop.start("logs", "--cluster", "hpc", run_id, "-f")
    assert follow.stdout is not None
    for line in follow.stdout:  # the remote log, streamed, up to the start of training
        if "stage train: start" in line:
            break
    assert log.exists() and "stage train: start" in log.read_text(errors="replace")
    # Ctrl-C on the laptop: it says so, and the command on the login node ends too (it would
    # otherwise follow the log until the run ends, for nobody).
    assert _remote_commands("logs", run_id), "the remote logs -f is not found"
    follow.send_signal(signal.SIGINT)
    assert follow.wait(60) == 130
    wait_for(lambda: not _remote_commands("logs", run_id), 60, "the remote logs -f to end")
    cancel = laptop("cancel", "--cluster", "hpc", run_id)
    assert cancel.returncode == 0 and f"run {run_id}: cancelled" in cancel.stderr, cancel.stderr
    waited = laptop("wait", "--cluster", "hpc", run_id, "--json")
    assert waited.returncode != 0
    assert json.loads(waited.stdout)["status"] == "cancelled"
    assert remote.cluster.job(json.loads(waited.stdout)["slurm"]["job_id"])["JobState"] == "CANCELLED"

