#!/usr/bin/env python3
"""What `mxc run --cluster` costs from a laptop: the first submit (bundle copied), a no-op re-submit
(the bundle is there: nothing copied) over the shared SSH connection and without it, and the same
`mxc run HASH -y` typed on the login node itself, the floor. Also `mxc runs --cluster` against `mxc runs`
there.

Starts a throw-away Slurm (tests/slurm_cluster.py, 1 node) behind a throw-away sshd on 127.0.0.1
(tests/remote_support.py), so "laptop" and "login node" are one machine: the figures are mxc's and
ssh's own costs, not a network's. Jobs run the stand-in trainer (tests/standins/trainer.py); they
are not waited for. "Without sharing" passes `-o ControlPath=none` first (ssh keeps the first value
of an option), so every command logs in again; the sshd log's logins are counted to prove it.

Target (this benchmark's, not the issue's): a no-op re-submit within 1 s of the login node's own `mxc run` with the shared
connection. Prints figures; no assertion.

  python benchmarks/remote_resubmit.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.remote_support import LOGIN, Laptop, login_node, running_sshd  # noqa: E402
from tests.slurm_cluster import running_cluster  # noqa: E402
from tests.slurm_jobs import slurm_sets  # noqa: E402

STANDIN = REPO / "tests" / "standins" / "trainer.py"
TARGET_S = 1.0


def timed(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    out = subprocess.run(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    elapsed = time.perf_counter() - started
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:6])}... failed: {out.stderr.strip()[-2000:]}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mxc-remote-bench-") as scratch, \
            running_cluster(nodes=1, gpus=0) as cluster, running_sshd() as sshd:
        root = Path(scratch)
        bin_dir = root / "bin"
        bin_dir.mkdir()
        python = bin_dir / "python"
        python.write_text(f'#!/bin/bash\nif [ "$1" = -m ]; then exec {sys.executable} {STANDIN} "$@"; fi\nexit 0\n')
        python.chmod(0o755)
        remote_env = {"SLURM_CONF": str(cluster.conf), "MXC_PYTHON": str(python),
                      "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}"}
        mxc = login_node(root / "login", remote_env)
        remote_home = root / "remote-home"
        laptop = Laptop(root, sshd)
        assert laptop("cluster", "add", "bench", LOGIN, "--mxc", str(mxc), "--home", str(remote_home)).returncode == 0
        bundle = laptop.build(*slurm_sets(cluster, nodes=1))
        submit = [sys.executable, "-m", "mxc", "run", "--cluster", "bench", bundle, "-y", "-q"]
        first = timed(submit, laptop.env)
        shared = [timed(submit, laptop.env) for _ in range(args.runs)]
        logins = sshd.log.read_text().count("Accepted publickey")
        unshared_env = {**laptop.env, "MXC_SSH_COMMAND": f"{sshd.ssh_command} -o ControlPath=none"}
        unshared = [timed(submit, unshared_env) for _ in range(args.runs)]
        logins_unshared = sshd.log.read_text().count("Accepted publickey") - logins
        there = {**os.environ, **remote_env, "MXC_HOME": str(remote_home)}
        floor = [timed([str(mxc), "run", bundle, "-y", "-q"], there) for _ in range(args.runs)]
        runs_remote = [timed([sys.executable, "-m", "mxc", "runs", "--cluster", "bench"], laptop.env)
                       for _ in range(args.runs)]
        runs_there = [timed([str(mxc), "runs"], there) for _ in range(args.runs)]
        subprocess.run(["scancel", "--user", str(os.getuid())], env={**os.environ, **cluster.env}, check=False)
    med = statistics.median
    print(f"first submit, bundle copied:                 {first:.2f} s")
    print(f"no-op re-submit, shared connection:          {med(shared):.2f} s (median of {args.runs})")
    print(f"no-op re-submit, no sharing (-o ControlPath=none): {med(unshared):.2f} s ({logins_unshared} logins for "
          f"{args.runs} submits)")
    print(f"mxc run HASH -y on the login node itself:    {med(floor):.2f} s")
    print(f"overhead of --cluster (shared):              {med(shared) - med(floor):.2f} s (target < {TARGET_S:.1f} s)")
    print(f"mxc runs --cluster / mxc runs there:          {med(runs_remote):.2f} s / {med(runs_there):.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
