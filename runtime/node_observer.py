"""Observability on the nodes of a Slurm job: one exporter per node, the run's Prometheus on the first.

On the local backend the supervisor's ``Observability`` observer starts everything. A Slurm
job has no supervisor on the nodes, so ``entrypoint.sh`` starts this module in the background
on every node before training (``job.sbatch`` sets ``MXC_OBSERVE_NODES=1`` when the spec has
observability on) and sends it SIGTERM when training ends:

* every node serves its exporter (this rank's metrics file, host and GPU plugins) and writes
  its file_sd target into ``<run>/prometheus/targets/exporter-<node>.json``;
* node rank 0 also runs Prometheus on the run's TSDB (``<run>/prometheus/data``, a shared
  file system on a cluster), so ``mxc metrics`` / ``mxc report`` / ``mxc dashboard`` read a
  Slurm run exactly like a local one; a requeued job reopens the same TSDB;
* every node watches its rank for a hang: no new step in its metrics file for
  ``observability.hang_timeout`` seconds after the first one. It then writes the hang into the
  rank's log and events, dumps the trainer's Python stacks into ``<run>/stacks/`` and kills the
  trainer; ``srun --kill-on-bad-exit`` ends the step everywhere and ``job.sbatch`` requeues
  (bounded by ``restart.max``), resuming from the last checkpoint;
* on SIGTERM, rank 0 waits (bounded) for one scrape after the end of training, then all stop.

Each node writes ``<run>/observability/node-<node>.json`` (ports, URLs, errors), which the
submitting side folds into ``record.observability``. Like the local observer it never fails
the training: whatever cannot start is recorded and training goes on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mxc.runtime.hang import HangWatchdog, dump_pids
from mxc.runtime.observe import Observability, observability_dir
from mxc.runtime.rundir import RunDir
from mxc.runtime.slurm_events import NODE_STATUS

from mxc.fsutil import write_json_atomic

TRAINER = b"maxtext.trainers.pre_train.train"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m mxc.runtime.node_observer", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--bundle-dir", type=Path, required=True)
    p.add_argument("--node", required=True, help="this node's name (labels its series)")
    p.add_argument("--rank", type=int, required=True, help="the training rank on this node")
    p.add_argument("--attempt", type=int, default=0, help="the job's restart count (MXC_ATTEMPT)")
    p.add_argument("--prometheus", action="store_true", help="also run Prometheus on the run's TSDB (node rank 0)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    run = RunDir(args.run_dir)
    spec: dict[str, Any] = json.loads((args.bundle_dir / "spec.json").read_text())
    observer = Observability(spec, bundle_dir=args.bundle_dir)
    observer.node = args.node
    observer.exporter_args = ["--rank", str(args.rank)]
    obs_dir = observability_dir(run)
    obs_dir.mkdir(parents=True, exist_ok=True)
    status = obs_dir / NODE_STATUS.format(node=args.node)
    stop = _stop_requested()
    observer.info = {"node": args.node, "rank": args.rank, "scrape_interval": observer.settings["scrape_interval"],
                     "errors": observer.errors}
    observer.start_services(run, args.bundle_dir, f"exporter-{args.node}", with_prometheus=args.prometheus)
    metrics = run.metrics_parts / f"attempt-{args.attempt}.rank-{args.rank}.jsonl"
    watchdog = HangWatchdog(lambda: _size(metrics), observer.settings["hang_timeout"],
                            lambda idle: _hung(run, args, observer.settings["hang_timeout"], idle)).start()
    write_json_atomic(status, observer.info)
    while not stop():
        time.sleep(0.2)
    watchdog.stop()
    if args.prometheus and observer.prometheus is not None and observer.exporter is not None:
        observer.wait_for_scrape_after(time.time())
    observer.stop()
    write_json_atomic(status, {**observer.info, "ended": time.time()})
    return 0


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def trainer_pid(run: RunDir, rank: int) -> int | None:
    """MaxText's process of this rank: its environment names the run and the rank."""
    want = (f"MXC_RUN_DIR={run.path}".encode(), f"SLURM_PROCID={rank}".encode())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if all(w in environ for w in want) and TRAINER in cmdline and Path(cmdline[0].decode()).name.startswith("python"):
            return int(entry.name)
    return None


def _hung(run: RunDir, args: argparse.Namespace, timeout: float, idle: float) -> None:
    rank_dir = run.path / "ranks" / str(args.rank)
    line = (f"[mxc {args.node} rank {args.rank}] attempt {args.attempt}: no training step for {idle:.0f}s "
            f"(observability.hang_timeout {timeout:g}s): hung; dumping stacks, killing it")
    print(line, flush=True)
    with open(rank_dir / "hang.log", "a") as fh:
        fh.write(line + "\n")
    pid = trainer_pid(run, args.rank)
    dumps = []
    if pid is not None:
        with contextlib.suppress(Exception):
            dumps = dump_pids([pid], run.stacks, f"hang.rank-{args.rank}.attempt-{args.attempt}", run.log)
    event = {"event": "hang", "rank": args.rank, "node": args.node, "attempt": args.attempt,
             "job_id": os.environ.get("SLURM_JOB_ID", ""), "time": time.time(), "idle_seconds": round(idle, 1),
             "pid": pid, "stacks": [str(d.path) for d in dumps]}
    with open(rank_dir / "events.jsonl", "a") as fh:  # the entrypoint's format; job.sbatch greps for it
        fh.write(json.dumps(event) + "\n")
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _stop_requested() -> Any:
    """SIGTERM/SIGINT set a flag (the entrypoint's stop, or the kernel's pdeathsig)."""
    flag = {"stop": False}

    def handler(signum: int, frame: object) -> None:
        flag["stop"] = True

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return lambda: flag["stop"]


if __name__ == "__main__":
    sys.exit(main())
