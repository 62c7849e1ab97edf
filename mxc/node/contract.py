"""The run contract (``run.json`` in every bundle): every value the compiler decided about how the
bundle runs, as one typed, versioned document.

The compiler (mxc/compiler/contract_build.py) computes each value in Python from the validated spec
and writes ``run.json`` as canonical JSON, hashed like every bundle file. The node program reads it
with ``load`` (stdlib, checked by ``typed.from_dict``); mxc reads the same dataclasses through
pydantic (``mxc.runtime.contract``), so there is one definition of the format and two strict readers.
Templates only lay out strings taken from here; nothing re-reads ``spec.json`` with defaults.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .typed import from_dict

FORMAT = "mxc-contract/v1"
EXIT_GRACE_S = 120  # runtime.exit_grace's default (seconds)
FILE = "run.json"
# pydantic (mxc's reader) forbids unknown keys and coercion, like typed.from_dict does.
STRICT: Any = {"extra": "forbid", "strict": True}


@dataclass(frozen=True)
class Slurm:
    """What ``job.sbatch`` lays out, and the numbers its batch side needs."""

    directives: list[str]  # each written as "#SBATCH <directive>", in order
    modules: list[str]  # `module load` on the batch node before the node program starts
    partition: str | None  # resources.partition (the record shows it before the job starts)
    time_limit_s: int  # resources.time in seconds; 0: none
    signal_seconds: int  # USR2 this long before the time limit (--signal=B:USR2@N)
    env: list[tuple[str, str]] = field(default_factory=list)  # resources.slurm_env: exported before srun
    __pydantic_config__ = STRICT


@dataclass(frozen=True)
class Stage:
    """One stage of a rank: preflight -> image -> barrier -> train."""

    name: str
    timeout_s: int  # 0: none
    grace_s: int  # after SIGTERM at the limit (or a stop request), SIGKILL this much later
    __pydantic_config__ = STRICT


@dataclass(frozen=True)
class Restart:
    """The numbers the restart policy (policy.py) decides with."""

    max: int  # restart.max: restarts (requeues, resubmissions, local restarts) allowed
    final_step: int | None  # the last step's number (steps - 1) when the spec fixes steps
    checkpointing: bool  # checkpoint.period > 0
    __pydantic_config__ = STRICT


@dataclass(frozen=True)
class Hang:
    """The hang watch of every rank (always on)."""

    init_timeout_s: int  # no output at all for this long before the first step: hung
    step_timeout_s: int  # no new step for this long after the first: hung
    step_pattern: str  # regex of the trainer's completed-step line (mxc.runtime.logs.trainlog.STEP_PREFIX)
    # runtime.exit_grace: once every rank logged the final step (restart.final_step) and, with checkpointing, its
    # checkpoint is finished, the trainer gets this long to exit; then it is ended and the attempt completed
    exit_grace_s: int = EXIT_GRACE_S
    __pydantic_config__ = STRICT


@dataclass(frozen=True)
class Checkpoint:
    dir: str | None  # checkpoint.dir; None: <run>/output
    period: int
    __pydantic_config__ = STRICT


@dataclass(frozen=True)
class RuntimeArg:
    """A ``key=value`` argument whose value is only known on the node (``value`` names which)."""

    key: str
    value: str  # run_name | output_dir | metrics_file | jax_cache
    __pydantic_config__ = STRICT


@dataclass(frozen=True)
class Train:
    """The trainer's command: ``<python> -m <module> <args> <runtime args> <distributed or single args>``."""

    module: str
    steps: int | None  # model.overrides.steps when the spec fixes it
    args: list[str]  # fixed by the spec: config, model, overrides, checkpointing
    runtime_args: list[RuntimeArg]
    distributed_args: list[str]  # with several processes (jax.distributed through MaxText's GPU path)
    single_args: list[str]  # with one process
    pythonpath: str  # code.pythonpath, inside the pinned checkout (MXC_CODE_DIR)
    # code.entry.script: run this script (relative to the working directory) instead of ``-m module``
    script: str | None = None
    # model.config_file: this bundle file is MaxText's config (its first argument), copied into the
    # run directory first (a container sees the run directory, not the bundle store)
    config_file: str | None = None
    # code.entry.workdir: the container's working directory (the image's MaxText; code.from_image)
    workdir: str | None = None
    __pydantic_config__ = STRICT


@dataclass(frozen=True)
class Container:
    kind: str  # native | podman | docker | apptainer
    image_ref: str | None
    image_digest: str | None
    gpu_vendor: str  # amd | nvidia | none
    mounts: list[str]  # /host:/container[:ro]
    python: str  # native: runtime.python (MXC_PYTHON wins); containers: the image's python3
    maxtext_version: str | None  # native: the pinned maxtext the image stage checks
    optional_mounts: list[str] = field(default_factory=list)  # made only where the host path exists
    options: list[str] = field(default_factory=list)  # the runtime's extra options (compiler/container_options.py)
    gpu_libraries: bool = True  # apptainer: --rocm / --nv
    __pydantic_config__ = STRICT


@dataclass(frozen=True)
class Preflight:
    gpus: bool  # check the GPU count (only when the spec asks for GPUs)
    expected_gpus: int
    stale_processes: bool
    min_free_gb: float
    network: bool
    exclusive: bool
    __pydantic_config__ = STRICT


@dataclass(frozen=True)
class Cores:
    max_mb: int
    keep: int
    backtrace: bool
    __pydantic_config__ = STRICT


@dataclass(frozen=True)
class Network:
    interface: str | None  # runtime.network_interface; None: chosen on the node (netif.py)
    __pydantic_config__ = STRICT


@dataclass(frozen=True)
class Observability:
    enabled: bool  # Slurm: each rank starts mxc's node observer (MXC_AGENT_PYTHON) next to training
    bind: str
    exporter_port: int
    prometheus_port: int
    tensorboard_port: int
    scrape_interval: int
    plugins: list[str]
    ray: bool = True  # a Ray cluster, each rank training in a Ray actor; True for a run.json from before the field
    ray_dashboard: bool = False  # the Ray head also serves its dashboard, on 127.0.0.1
    alerts: bool = False  # the bundle has alerts.rules.yml: whoever runs Prometheus also runs the alert receiver
    __pydantic_config__ = STRICT


@dataclass(frozen=True)
class Code:
    """The pinned training code (mxc exports the commit before the run; the node gets MXC_CODE_DIR)."""

    repo: str | None
    commit: str | None
    maxtext_version: str | None
    from_image: bool = False  # code.from_image: the image's MaxText, pinned by the image digest
    __pydantic_config__ = STRICT


@dataclass(frozen=True)
class InfraPattern:
    """A trainer output line that means the infrastructure failed (requeue), from the triage catalog."""

    cause: str  # the catalog's cause id, e.g. nccl_error
    blame: str  # node | network | scheduler
    regex: str  # Python re, searched in each line
    __pydantic_config__ = STRICT


@dataclass(frozen=True)
class RankEnvironment:
    """The whole environment of one rank that the spec gives more (env.ranks): it replaces ``env`` there."""

    rank: int
    env: list[tuple[str, str]]
    __pydantic_config__ = STRICT


@dataclass(frozen=True)
class Notify:
    """Chat alerts (the spec's ``notify``): the batch side of a Slurm job posts its own (jobreport.py).
    Where the secret is (a variable's name, a file's path), never the secret."""

    format: str  # slack | mattermost | telegram
    secret_env: str | None
    secret_file: str | None
    chat_id: str | None
    api_url: str
    events: list[str]  # start | finish | failure | hang | restart
    timeout_s: float
    __pydantic_config__ = STRICT


@dataclass(frozen=True)
class RunContract:
    format: str
    name: str
    backend: str  # local | slurm
    nodes: int
    code: Code
    slurm: Slurm
    stages: list[Stage]
    restart: Restart
    hang: Hang
    checkpoint: Checkpoint
    train: Train
    env: list[tuple[str, str]]  # the training's variables, in order (env.sh shows the same)
    container: Container
    preflight: Preflight
    cores: Cores
    network: Network
    observability: Observability
    infrastructure: list[InfraPattern]
    rank_env: list[RankEnvironment] = field(default_factory=list)
    detect: list[str] = field(default_factory=list)  # env.detect: detectors the node program runs (detect.py)
    notify: Notify | None = None
    # (variable, append | prepend) where the spec's value joins the image's (native: the node's) instead of
    # replacing it (envmerge.py); a variable not listed replaces
    env_merge: list[tuple[str, str]] = field(default_factory=list)
    # env.pass: the variables of the node's environment that reach the training besides the base
    # (envboundary.py); None when the spec passes none (run.json then stays as it was before the field)
    env_pass: list[str] | None = None
    __pydantic_config__ = STRICT

    def stage(self, name: str) -> Stage:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(name)

    def env_of(self, rank: int) -> list[tuple[str, str]]:
        """The training's variables on ``rank``: its own list where env.ranks names it, else the shared one."""
        for entry in self.rank_env:
            if entry.rank == rank:
                return entry.env
        return self.env



class ContractError(ValueError):
    """run.json is missing, unreadable, of another format version, or does not match the contract."""


def parse(text: str) -> RunContract:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ContractError(f"{FILE}: not JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else None
        raise ContractError(f"{FILE}: format {found!r}, this node program reads {FORMAT}")
    try:
        return from_dict(RunContract, data)
    except ValueError as exc:
        raise ContractError(f"{FILE}: {exc}") from None


def load(bundle_dir: Path) -> RunContract:
    try:
        text = (bundle_dir / FILE).read_text("utf-8")
    except OSError as exc:
        raise ContractError(f"{bundle_dir / FILE}: cannot read ({exc.strerror or exc})") from None
    return parse(text)
