"""Which variables a spec may export for Slurm's own commands (``resources.slurm_env``).

job.sbatch exports them before the batch side starts the job step with srun, which reads its
input variables (``SLURM_TREE_WIDTH``, ``SLURM_CPU_BIND``, ``SLURM_MPI_TYPE``, PMIx settings...).
Only Slurm's, srun's and PMI's prefixes are accepted, and not the variables Slurm sets *for* the
job: those tell the node program which rank, job and nodes it has, and a spec value would lie.
"""

from __future__ import annotations

import re

PREFIXES = ("SLURM_", "SRUN_", "PMIX_", "PMI_")
# Slurm's output variables (sbatch(1), srun(1) OUTPUT ENVIRONMENT VARIABLES): set for each job, step and task.
OUTPUT_PREFIXES = ("SLURM_JOB_", "SLURM_STEP_", "SLURM_ARRAY_", "SLURM_SUBMIT_", "SLURM_TOPOLOGY_ADDR",
                   "SLURM_HET_")
OUTPUT_NAMES = frozenset({
    "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NNODES",
    "SLURM_NODELIST", "SLURM_TASKS_PER_NODE", "SLURM_RESTART_COUNT", "SLURM_CLUSTER_NAME", "SLURM_CPUS_ON_NODE",
    "SLURM_GTIDS", "SLURM_TASK_PID", "SLURM_LAUNCH_NODE_IPADDR", "SLURM_SRUN_COMM_HOST", "SLURM_SRUN_COMM_PORT",
    "SLURM_PRIO_PROCESS", "SLURM_CONF", "SLURM_UMASK", "SLURM_GPUS_ON_NODE", "SLURM_SHARDS_ON_NODE",
    "SLURM_MEM_PER_NODE", "SLURM_MEM_PER_CPU", "SLURM_MEM_PER_GPU", "SLURM_NODE_ALIASES", "SLURM_PTY_PORT",
})
# sbatch --export values and #SBATCH lines cannot hold these; a value stays on one line.
_VALUE = re.compile(r"[^\n\r\x00]*")  # used with fullmatch: "$" would let a final newline through


def problem(name: str, value: str) -> str | None:
    """Why ``name=value`` cannot be a Slurm input variable of the spec, or None."""
    if not name.startswith(PREFIXES):
        return f"not a Slurm input variable (names start with {', '.join(PREFIXES)}); training variables go in env.vars"
    if name in OUTPUT_NAMES or name.startswith(OUTPUT_PREFIXES):
        return "Slurm sets it for the job itself (the node program reads it); a spec must not"
    if not _VALUE.fullmatch(value):
        return "a value must be one line"
    return None
