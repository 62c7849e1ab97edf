"""The node program's commands: ``batch`` (job.sbatch), ``rank`` (entrypoint.sh), ``preflight RESULT``
(the rank's preflight stage, in a child process), ``stacks RUN_DIR OUT_DIR`` (``mxc stacks`` through
``srun --overlap`` on every node of a live job: this node's trainers' stacks, read with py-spy)."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

USAGE = "usage: mxc_node/__main__.py batch | rank | preflight RESULT.json | stacks RUN_DIR OUT_DIR"


def main(argv: list[str]) -> int:
    if argv[:1] == ["batch"] and len(argv) == 1:
        from . import batch

        return batch.main()
    if argv[:1] == ["rank"] and len(argv) == 1:
        from . import rank

        return rank.main()
    if argv[:1] == ["preflight"] and len(argv) == 2:
        return preflight(Path(argv[1]))
    if argv[:1] == ["stacks"] and len(argv) == 3:
        return stacks(Path(argv[1]), Path(argv[2]))
    print(USAGE, file=sys.stderr)
    return 2


def preflight(result_path: Path) -> int:
    """The node checks of run.json's ``preflight``; exit 3 naming each failed check."""
    from . import contract, layout
    from . import preflight as checks

    env = os.environ
    run = Path(env["MXC_RUN_DIR"])
    c = contract.load(Path(env["MXC_BUNDLE_DIR"]))
    config = checks.PreflightConfig(
        run_dir=str(run), disk_path=layout.output(run, c.checkpoint.dir), min_free_gb=c.preflight.min_free_gb,
        gpus=c.preflight.expected_gpus if c.preflight.gpus else None, gpu_vendor=c.container.gpu_vendor,
        stale_processes=c.preflight.stale_processes, exclusive=c.preflight.exclusive, network=c.preflight.network)
    result = checks.run_checks(config, node=env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0],
                               rank=int(env.get("SLURM_PROCID") or 0), attempt=int(env.get("MXC_ATTEMPT") or 0),
                               env=env, interface=env.get("MXC_NET_IFACE") or None)
    result.write(result_path)
    for failure in result.failures():
        print(f"preflight failed: {failure}", file=sys.stderr, flush=True)
    return 0 if result.passed else 3


def stacks(run: Path, out_dir: Path) -> int:
    """This node's live trainers' stacks into ``out_dir`` (and ``out_dir/node-<node>.json``); never disturbs them."""
    from . import livestacks

    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]  # as the rank names its node
    entries = livestacks.dump_node(run, out_dir, node)
    print(f"mxc_node stacks: node {node}: {len(entries)} process(es) of "
          f"{len({e['rank'] for e in entries})} rank(s)", flush=True)  # stdout: srun's stderr is for errors
    return 0
