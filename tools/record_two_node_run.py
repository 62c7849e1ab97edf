#!/usr/bin/env python3
"""Record the two-node observed run that docs/skills/ and the post-mortem query are tested on
(``tests/fixtures/runs/two-node/``, read by tests/test_skills.py).

What runs: the test Slurm cluster (tests/slurm_cluster.py: 2 emulated nodes on this machine), the
tiny MaxText model on 2 ranks with observability on (an exporter per node, Prometheus on node
rank 0, scrape every second), and two things a real cluster has that this machine has not:

* GPU series: a stand-in ``nvidia-smi`` on the nodes' PATH answers the GPU plugin's queries with
  the capture recorded on a real H100 under load (tests/fixtures/gpu/nvidia-smi-h100-load.csv,
  the columns asked for, by name); ``nvidia-smi nvlink`` fails as on a PCIe card. The training
  itself runs on CPU and never calls it.
* a slow step: both ranks are paused after step 10 (tests/gates.py) for ``--pause`` seconds,
  so step 11's step time is the outlier the playbook's query finds.

The run directory is copied without what tests do not read (checkpoints, Ray's session logs and
token files, the MaxText output tree); the TSDB of a two-minute run is its write-ahead log.

  python tools/record_two_node_run.py [--out tests/fixtures/runs/two-node] [--pause 12]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.gates import PauseGate  # noqa: E402
from tests.slurm_cluster import running_cluster  # noqa: E402

CAPTURE = REPO / "tests/fixtures/gpu/nvidia-smi-h100-load.csv"
STAND_IN = '''#!/usr/bin/env python3
"""Stand-in nvidia-smi (tools/record_two_node_run.py): the recorded H100 capture, by field name."""
import csv, sys
rows = list(csv.reader(open(%r), skipinitialspace=True))
header = [c.split(" [", 1)[0] for c in rows[0]]
cells = dict(zip(header, zip(rows[0], rows[1])))
args = sys.argv[1:]
query = next((a.split("=", 1)[1] for a in args if a.startswith("--query-gpu=")), None)
if query is None:
    sys.exit("nvidia-smi stand-in: NVLink is not supported on this GPU")
fields = query.split(",")
unknown = [f for f in fields if f not in cells]
if unknown:
    sys.exit('Field "%%s" is not a valid field to query.' %% unknown[0])
noheader = any("noheader" in a for a in args)
out = csv.writer(sys.stdout, lineterminator="\\n")
if not noheader:
    out.writerow([cells[f][0] for f in fields])
out.writerow([cells[f][1] for f in fields])
'''
KEEP = ("record.json", "metrics.jsonl", "train.log", "metrics", "ranks", "observability", "prometheus", "slurm")
DROP_UNDER_OBSERVABILITY = ("ray-cluster",)


def mxc(*args: str, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-m", "mxc", *args], env=env, cwd=REPO, capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise SystemExit(f"mxc {' '.join(args)}: exit {done.returncode}\n{done.stderr}")
    return done.stdout.strip()


def copy_run(run: Path, out: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for name in KEEP:
        source = run / name
        if source.is_dir():
            shutil.copytree(source, out / name, ignore=shutil.ignore_patterns("lock", "*.tmp", "queries.active"))
        elif source.exists():
            shutil.copy2(source, out / name)
    for path in (out / "observability").glob("*"):
        if path.name.startswith(DROP_UNDER_OBSERVABILITY):
            path.unlink()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "tests/fixtures/runs/two-node")
    parser.add_argument("--pause", type=float, default=12.0, help="seconds both ranks wait after step 10")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mxc-record-") as tmp, running_cluster(nodes=2, gpus=4) as cluster:
        work = Path(tmp)
        bin_dir = work / "bin"
        bin_dir.mkdir()
        stand_in = bin_dir / "nvidia-smi"
        stand_in.write_text(STAND_IN % str(CAPTURE))
        stand_in.chmod(0o755)
        gate = PauseGate(work / "gate", {0: 10})
        gate.directory.mkdir()
        env = {**os.environ, "MXC_HOME": str(work / "home"), "SLURM_CONF": str(cluster.conf),
               "MXC_JAX_CACHE": str(work / "jax-cache"), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
        env.update(gate.env(env))
        sets = {"runtime.backend": "slurm", "resources.partition": cluster.partition, "resources.nodes": 2,
                "runtime.preflight.stale_processes": "false", "observability.enabled": "true",
                "observability.scrape_interval": 1, "checkpoint.period": 0}
        bundle = mxc("build", "-q", "specs/tiny.yaml", *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")],
                     env=env)
        run_id = mxc("run", "-q", "-y", bundle, env=env)
        print(f"run {run_id}: waiting for both ranks to reach step 10", flush=True)
        gate.wait_paused(0, ranks=2)
        time.sleep(args.pause)  # the slow step: a tool, not a test, may wait on the clock
        gate.release(0)
        home_run = work / "home" / "runs" / run_id
        deadline = time.monotonic() + 600
        while True:
            mxc("watch", "--once", run_id, env=env)
            record = json.loads((home_run / "record.json").read_text())
            if record.get("final"):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"run {run_id} did not end")
            time.sleep(1)
        if record["status"] != "succeeded":
            raise SystemExit(f"run {run_id}: {record['status']}: {record.get('message')}")
        copy_run(home_run, args.out / run_id)
        size = sum(p.stat().st_size for p in (args.out / run_id).rglob("*") if p.is_file())
        print(f"recorded {run_id} into {args.out / run_id} ({size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
