"""Run one Slurm rank's training as a subprocess of a Ray actor on its own node.

With observability on, the node observers of a Slurm job form one Ray cluster (the head on
node rank 0, every other node joins it; ``mxc.runtime.observe.node_observer``). ``entrypoint.sh``
then starts training through this wrapper::

    python -m mxc.runtime.observe.ray_node_launch --run-dir R --node N --rank K -- python -m maxtext... ARGS

It connects to the job's cluster, places a ``TrainingActor`` on this node (node affinity,
not soft), has it start the command with this process's environment, copies the training's
output to stdout (so srun labels it like any rank's output), forwards SIGTERM/SIGINT/SIGHUP
(timeouts, checkpoint-on-signal, scancel) and exits with the training's exit code (128+N for
a signal), exactly as if the command had run here. If this node's Ray is not up in time, the
command runs directly, with a warning: training matters more than where it is parented.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from mxc.runtime.observe.ray_launcher import HEAD_TIMEOUT, RayTrainingProcess, TrainingActor, cluster_environment

# observability/, one per job start (attempt): a requeued job never reads the last start's files.
CLUSTER_FILE = "ray-cluster.attempt-{attempt}.json"  # head address and the run's token (0600, removed at the end)
NODE_FILE = "ray-node-{node}.attempt-{attempt}.json"  # this node's raylet is up (address, node manager port)
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        raise SystemExit("usage: python -m mxc.runtime.observe.ray_node_launch --run-dir R --node N --rank K -- COMMAND...")
    cut = argv.index("--")
    p = argparse.ArgumentParser(prog="python -m mxc.runtime.observe.ray_node_launch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--node", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--attempt", type=int, default=0, help="the job's restart count (MXC_ATTEMPT)")
    p.add_argument("--wait", type=float, default=HEAD_TIMEOUT, help="seconds to wait for this node's Ray")
    return p.parse_args(argv[:cut]), argv[cut + 1:]


def wait_for_node(obs_dir: Path, node: str, attempt: int, seconds: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """The cluster's and this node's files, once this node's raylet is up; ``RuntimeError`` if it
    failed to start (the node observer says so in its file) or is not up in ``seconds``."""
    deadline = time.monotonic() + seconds
    cluster = obs_dir / CLUSTER_FILE.format(attempt=attempt)
    mine = obs_dir / NODE_FILE.format(node=node, attempt=attempt)
    while time.monotonic() < deadline:
        try:
            node_info = json.loads(mine.read_text())
            if "error" in node_info:
                raise RuntimeError(f"Ray on {node} did not start: {node_info['error']}")
            return json.loads(cluster.read_text()), node_info
        except (OSError, ValueError):
            time.sleep(0.1)
    raise RuntimeError(f"Ray on {node} is not up after {seconds:.0f}s")


def main(argv: Sequence[str] | None = None) -> int:
    args, command = parse_args(argv)
    try:
        cluster, mine = wait_for_node(args.run_dir / "observability", args.node, args.attempt, args.wait)
    except RuntimeError as exc:
        _without_ray(command, str(exc))
    env = {**os.environ, "PYTHONFAULTHANDLER": os.environ.get("PYTHONFAULTHANDLER", "1")}
    os.environ.update(cluster_environment(cluster["token"], multi_node=True))
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(address=cluster["address"], _node_ip_address=mine["bind"], logging_level=logging.ERROR,
             log_to_driver=False, namespace=f"mxc-{args.run_dir.name}")
    node_id = _node_id(ray, mine)
    if node_id is None:
        ray.shutdown()
        _without_ray(command, f"this node's raylet ({mine['address']}, port {mine['node_manager_port']}) is not in the cluster")
    # Any: Ray's stubs type an actor handle's methods as the plain methods (no ``.remote``).
    actor: Any = ray.remote(TrainingActor).options(
        num_cpus=0, max_concurrency=4, name=f"mxc-training-rank-{args.rank}",
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()
    output = args.run_dir / "ranks" / str(args.rank) / "train.out"
    start = output.stat().st_size if output.exists() else 0
    pid = ray.get(actor.start.remote(command, env, os.getcwd(), str(output)), timeout=60)
    process = RayTrainingProcess(ray, actor, int(pid))
    print(f"[mxc {args.node} rank {args.rank}] training pid {pid} in Ray actor on node {node_id[:12]}",
          file=sys.stderr, flush=True)

    pending: list[int] = []
    for signum in FORWARDED:
        signal.signal(signum, lambda s, _f: pending.append(s))
    offset = start
    code = None
    while code is None:
        while pending:
            process.send_signal(pending.pop(0))
        offset = _copy_new(output, offset)
        code = process.poll()
        time.sleep(0.1)
    _copy_new(output, offset, final=True)
    return 128 - code if code < 0 else code


def _node_id(ray: Any, mine: dict[str, Any], seconds: float = 30.0) -> str | None:
    """This node's Ray node id: the live raylet on this node's address and node manager port."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for n in ray.nodes():
            if n["Alive"] and n["NodeManagerAddress"] == mine["bind"] and n["NodeManagerPort"] == mine["node_manager_port"]:
                return str(n["NodeID"])
        time.sleep(0.5)
    return None


def _without_ray(command: list[str], why: str) -> NoReturn:
    print(f"mxc: warning: {why}; training runs without Ray", file=sys.stderr, flush=True)
    os.execvp(command[0], command)  # replaces this process: training matters more than its parent


def _copy_new(path: Path, offset: int, final: bool = False) -> int:
    """What the training appended since ``offset``, to stdout: whole lines, and the rest at the end."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except OSError:
        return offset
    end = len(data) if final else data.rfind(b"\n") + 1
    if end:
        sys.stdout.buffer.write(data[:end])
        sys.stdout.buffer.flush()
    return offset + end


if __name__ == "__main__":
    sys.exit(main())
