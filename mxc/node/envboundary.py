"""What of a node's environment crosses into the training: one declared base, nothing else.

The node program runs with whatever started it: ``mxc run`` hands a local rank the caller's
shell, ``sbatch --export=ALL`` and ``srun`` hand a Slurm rank the submitting shell's. None of that
may decide what the training computes (an ``XLA_FLAGS=--xla_cpu_enable_fast_math=true`` left in a
shell changes every loss), and none of it is in the bundle hash. So the training starts from:

* the **base** every process needs (``CALLER_NAMES``, ``LC_*``): where programs are, whose home,
  the locale, the terminal, where temporary files go, the time zone of log lines;
* what the **scheduler** gives the task (``SCHEDULER_PREFIXES``: ``SLURM_*``, ``SLURMD_*``,
  ``PMI_*``, ``PMIX_*``) and the **GPU visibility** the allocation sets (``GPU_VISIBILITY``);
* the variables the spec names in ``env.pass`` (``WANDB_API_KEY``, ``HF_HOME``...), taken from the
  node's environment when set there;
* on Slurm, what the spec's ``runtime.modules`` loads set (``module_vars``: the batch side compares
  the environment before and after them and names the variables in ``MODULE_VARS``);

and then the bundle's own variables (env.sh, joined by envmerge.py) and the node's facts that
mxc sets itself (rank, coordinator, network interface, ``MXC_RUN_DIR``...). mxc's own variables
(``MXC_*``) reach the node program, never the training, except those rank.py sets on purpose.
A container starts from its image's environment instead of the node's: only the GPU visibility
(apptainer) and the ``env.pass`` variables go in from the node (container.py).

One function owns this (:func:`training_base`); every backend and runtime goes through it
(rank.py builds the native environment and the container request from it), and mxc's rerun
check compares with :func:`from_caller`. Stdlib only (the node program).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# From the caller's shell: what any process needs. TZ: the time of every log line; LOGNAME: the
# user name getpass reads first.
CALLER_NAMES = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TERM", "TMPDIR", "TZ")
CALLER_PREFIXES = ("LC_",)
# From the scheduler: the task's place in the job (JAX and MaxText read SLURM_* to find their rank).
SCHEDULER_PREFIXES = ("SLURM_", "SLURMD_", "PMI_", "PMIX_")
# The GPUs the allocation gives the task.
GPU_VISIBILITY = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL")
# Names of the variables the spec's `module load`s set on the batch node (space-separated), exported by
# the batch side to every rank; and the file of the environment before them (job.sbatch writes it).
MODULE_VARS = "MXC_MODULE_VARS"
BEFORE_MODULES = "MXC_ENV_BEFORE_MODULES"
OWN_PREFIX = "MXC_"
# What bash changes by itself between the two looks (``_``: the last command; SHLVL: one less after exec).
SHELL_STATE = ("_", "SHLVL", "PWD", "OLDPWD")


def in_caller_base(name: str) -> bool:
    return name in CALLER_NAMES or name.startswith(CALLER_PREFIXES)


def in_scheduler_base(name: str) -> bool:
    return name.startswith(SCHEDULER_PREFIXES) or name in GPU_VISIBILITY


def crosses(name: str, passed: Iterable[str] = ()) -> bool:
    """Whether the node's value of ``name`` reaches the training (natively)."""
    if name.startswith(OWN_PREFIX):
        return False
    return in_caller_base(name) or in_scheduler_base(name) or name in set(passed)


def training_base(env: Mapping[str, str], passed: Sequence[str] = ()) -> dict[str, str]:
    """The part of the node's environment ``env`` a native training starts from: the base, the
    scheduler's and GPU visibility variables, ``passed`` (env.pass) and what the spec's modules set
    (``MODULE_VARS`` in ``env``). Everything else of ``env`` stays with the node program."""
    allowed = set(passed) | set(env.get(MODULE_VARS, "").split())
    return {name: value for name, value in env.items() if crosses(name, allowed)}


def from_caller(env: Mapping[str, str], passed: Sequence[str] = ()) -> dict[str, str]:
    """What of the caller's shell ``env`` reaches the training: the caller's base and ``passed``
    (not the scheduler's per-job variables). ``mxc rerun`` compares this with the original run's."""
    wanted = set(passed)
    return {name: value for name, value in env.items()
            if not name.startswith(OWN_PREFIX) and (in_caller_base(name) or name in wanted)}


def crossed(env: Mapping[str, str], passed: Sequence[str]) -> dict[str, Any]:
    """What the training's environment file records of what crossed from the node's environment
    ``env``: ``passed`` (the env.pass names set in ``env``) and ``modules`` (what the spec's module
    loads set), by name only, as their values may be secrets; ``caller``, the values that came from
    the caller's shell (:func:`from_caller`), which ``mxc rerun`` compares with its own (envmerge.py
    leaves out the secret-named ones)."""
    modules = [name for name in env.get(MODULE_VARS, "").split() if name in env and crosses(name, [name])]
    return {"passed": [name for name in passed if name in env], "modules": sorted(modules),
            "caller": from_caller(env, passed)}


def module_vars(before: Mapping[str, str], after: Mapping[str, str]) -> list[str]:
    """The variables ``module load``s set or changed: in ``after`` with another value than in ``before``
    (mxc's own variables left out, and bash's own bookkeeping, ``SHELL_STATE``)."""
    return sorted(name for name, value in after.items()
                  if before.get(name) != value and not name.startswith(OWN_PREFIX) and name not in SHELL_STATE)


def parse_env0(data: bytes) -> dict[str, str]:
    """``env -0`` output: NAME=VALUE entries separated by NUL (a value may hold newlines)."""
    out: dict[str, str] = {}
    for entry in data.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep and name:
            out[name.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
    return out
