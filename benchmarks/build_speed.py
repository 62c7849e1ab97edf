"""`mxc build` cold-process time against the bare import of its libraries.

Target (issue 1/7): within 2x of `python -c "import pydantic, jinja2, yaml"` and under 0.3 s.
Each figure is the median of N fresh processes (a cold process is what a user waits for).

    python benchmarks/build_speed.py [--runs 15] [--spec specs/70b.yaml]
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


def median_seconds(argv: list[str], runs: int, env: dict[str, str]) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--spec", default="specs/70b.yaml")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "MXC_HOME": home}
        baseline = median_seconds([sys.executable, "-c", "import pydantic, jinja2, yaml"], args.runs, env)
        build_new = median_seconds([sys.executable, "-m", "mxc", "build", args.spec], 1, env)
        build = median_seconds([sys.executable, "-m", "mxc", "build", args.spec], args.runs, env)
        helptime = median_seconds([sys.executable, "-m", "mxc", "--help"], args.runs, env)
    ratio = build / baseline
    print(f"import pydantic, jinja2, yaml : {baseline * 1000:7.1f} ms (median of {args.runs})")
    print(f"mxc --help                    : {helptime * 1000:7.1f} ms")
    print(f"mxc build {args.spec:<19} : {build * 1000:7.1f} ms (first build into an empty store: {build_new * 1000:.1f} ms)")
    print(f"ratio build / imports         : {ratio:7.2f}x  (target <= 2.0x, and build < 300 ms)")
    print("PASS" if ratio <= 2.0 and build < 0.3 else "MISS")


if __name__ == "__main__":
    main()
