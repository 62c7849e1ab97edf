#!/usr/bin/env python3
"""What `mxc runs` costs with many live Slurm runs: wall time and Slurm calls for 1, 10 and 200.

Starts a throw-away test cluster (tests/slurm_cluster.py), submits held jobs (``sbatch --hold``:
pending, never run) and writes one run directory per job whose record says it is queued
(tests/slurm_poll.py): no model is trained. Each `mxc runs --json` goes through wrappers named
squeue and sacct first on PATH that count the calls. One warm-up look first (it learns which
sacct answers on the cluster), then the median of N looks.

Target (issue 14): Slurm calls the same for every number of runs (one squeue, at most one sacct),
and under 1 s at 200 live runs. Prints figures; no assertion.

  python benchmarks/slurm_poll.py [--looks 3] [--counts 1,10,200]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.slurm_cluster import running_cluster  # noqa: E402
from tests.slurm_poll import calls, counting_path, make_run, submit  # noqa: E402

TARGET_S = 1.0


def look(env: dict[str, str]) -> float:
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "mxc", "runs", "--json"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=600)
    elapsed = time.perf_counter() - started
    if out.returncode != 0:
        raise SystemExit(f"mxc runs failed: {out.stderr.strip()}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--looks", type=int, default=3)
    parser.add_argument("--counts", default="1,10,200")
    args = parser.parse_args()
    counts = sorted(int(c) for c in args.counts.split(","))
    with tempfile.TemporaryDirectory(prefix="mxc-slurm-poll-") as scratch, \
            running_cluster(nodes=1, gpus=0) as cluster:
        root = Path(scratch)
        log = root / "calls.log"
        path = counting_path(root / "bin", log)
        home = root / "home"
        jobs: list[str] = []
        try:
            print(f"{'live runs':>9}  {'mxc runs (median)':>17}  squeue  sacct")
            for count in counts:
                while len(jobs) < count:
                    jobs.append(submit(cluster))
                    make_run(home, len(jobs) - 1, jobs[-1])
                env = cluster.environ({"MXC_HOME": str(home), "PATH": path})
                look(env)
                calls(log)
                times = [look(env) for _ in range(args.looks)]
                counted = calls(log)
                squeue, sacct = counted["squeue"] / args.looks, counted["sacct"] / args.looks
                print(f"{count:>9}  {statistics.median(times):>15.3f} s  {squeue:>6g}  {sacct:>5g}")
        finally:
            if jobs:
                cluster.run("scancel", *jobs, check=False)
    print(f"target: Slurm calls the same for every count (1 squeue, at most 1 sacct); under {TARGET_S:g} s at 200")
    return 0


if __name__ == "__main__":
    sys.exit(main())
