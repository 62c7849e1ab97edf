"""The validated spec -> the run contract (``run.json``): every decision about how the bundle runs,
taken here, in Python, once.

The node program and mxc's runtime read the result typed (mxc/node/contract.py); templates only
place its strings. Values that are only known on the node (run directory, rank, coordinator) stay
names: ``RuntimeArg`` and the run-directory layout (mxc/node/layout.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mxc.compiler import config_file, container_options, determinism
from mxc.compiler.schema import JobSpec, Scalar
from mxc.compiler.slurm import time_seconds
from mxc.node.contract import (
    FORMAT,
    Checkpoint,
    Code,
    Container,
    Cores,
    Hang,
    InfraPattern,
    Network,
    Notify,
    Observability,
    Preflight,
    RankEnvironment,
    Restart,
    RunContract,
    RuntimeArg,
    Slurm,
    Stage,
    Train,
)

# Log lines of these blames are the infrastructure failing, not the job: a requeue can succeed.
INFRASTRUCTURE_BLAMES = ("node", "network", "scheduler")
PREFLIGHT_GRACE_S = 10
IMAGE_GRACE_S = 30


def scalar_text(value: bool | int | float | str) -> str:
    """How MaxText and XLA read a value: booleans lower-case, the rest as written."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# Values MaxText's command line (OmegaConf.from_cli, a YAML reader) takes as null, not as the text:
# `profiler=` would be None, which MaxText refuses where it wants "". Quoted, they stay strings.
_READ_AS_NULL = frozenset({"", "~", "null", "Null", "NULL"})


def override_text(value: bool | int | float | str) -> str:
    """A model override as MaxText must read it: an empty string stays an empty string."""
    if isinstance(value, str) and value in _READ_AS_NULL:
        return f"'{value}'"
    return scalar_text(value)


def xla_flags(spec: JobSpec) -> str:
    return _flags_text(spec.env.xla_flags)


def _flags_text(flags: Mapping[str, Scalar]) -> str:
    return " ".join(f"--{k}={scalar_text(v)}" for k, v in sorted(flags.items()))


def environment(spec: JobSpec) -> list[tuple[str, str]]:
    """The training's variables, sorted: the spec's vars, XLA_FLAGS, and mxc's own facts."""
    return _environment(spec, spec.env.vars, spec.env.xla_flags)


def rank_environments(spec: JobSpec) -> list[RankEnvironment]:
    """Each rank env.ranks names, with its whole environment: its variables over the shared ones,
    its XLA flags over the shared flags (one XLA_FLAGS, so a rank can add --xla_dump_to)."""
    return [RankEnvironment(int(rank), _environment(spec, {**spec.env.vars, **extra.vars},
                                                    {**spec.env.xla_flags, **extra.xla_flags}))
            for rank, extra in sorted(spec.env.ranks.items(), key=lambda item: int(item[0]))]


def _environment(spec: JobSpec, variables: Mapping[str, Scalar], flags: Mapping[str, Scalar]) -> list[tuple[str, str]]:
    chosen = determinism.settings(spec)  # reproducibility.deterministic: values the spec cannot contradict
    flags = {**{s.name: s.value for s in chosen if s.xla_flag}, **flags}
    variables = {**{s.name: s.value for s in chosen if not s.xla_flag}, **variables}
    env = {k: scalar_text(v) for k, v in variables.items()}
    text = _flags_text(flags)
    if text:
        raw = env.get("XLA_FLAGS")
        env["XLA_FLAGS"] = f"{text} {raw}" if raw else text
    env["MXC_JOB_NAME"] = spec.name
    return sorted(env.items())


# XLA_FLAGS: appended (MaxText-Slurm's practice: the image's flags stay, the spec's come last and win).
# LD_LIBRARY_PATH: prepended, never replaced: Apptainer's --nv/--rocm bind the host's driver libraries
# into /.singularity.d/libs and put that on the image's LD_LIBRARY_PATH, and a site module's CUDA/ROCm
# libraries are on the node's; replacing either loses the GPU driver.
DEFAULT_MERGE = {"XLA_FLAGS": "append", "LD_LIBRARY_PATH": "prepend"}


def env_merge(spec: JobSpec) -> list[tuple[str, str]]:
    """(variable, mode) for every variable the spec sets whose value joins the image's: env.merge, over
    the defaults ``DEFAULT_MERGE``."""
    names = {name for name, _ in environment(spec)} | {n for r in rank_environments(spec) for n, _ in r.env}
    modes = {name: mode for name, mode in DEFAULT_MERGE.items() if name in names}
    modes.update(spec.env.merge)
    return sorted((name, mode) for name, mode in modes.items() if mode != "replace")


def maxtext_args(spec: JobSpec) -> list[str]:
    """MaxText's argv after the module: config file, model, overrides, checkpointing. With
    model.config_file the config is the bundle's copy, which the node program puts first (Train.config_file)."""
    config = [] if spec.model.config_file else [f"{spec.code.entry.configs}/{spec.model.config}"]
    args = [*config, f"model_name={spec.model.model_name}"]
    args += [f"{k}={override_text(v)}" for k, v in sorted(spec.model.overrides.items())]
    if spec.checkpoint.period:
        args += ["enable_checkpointing=true", f"checkpoint_period={spec.checkpoint.period}"]
    else:
        args += ["enable_checkpointing=false"]
    return args


def steps(spec: JobSpec, config_keys: Mapping[str, Any] | None = None) -> int | None:
    """The steps MaxText will train: model.overrides.steps, else the config file's (the overrides win there too)."""
    value = spec.model.overrides.get("steps", (config_keys or {}).get("steps"))
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def sbatch_directives(spec: JobSpec) -> list[str]:
    """Every ``#SBATCH`` option, in order. Values are validated tokens (schema.SlurmToken)."""
    r = spec.resources
    out = [f"--job-name={spec.name}", f"--nodes={r.nodes}", "--ntasks-per-node=1"]
    if r.gpus_per_node:
        out.append(f"--gpus-per-node={r.gpus_per_node}")
    if r.cpus_per_task:
        out.append(f"--cpus-per-task={r.cpus_per_task}")
    if r.mem:
        out.append(f"--mem={r.mem}")
    for key in ("partition", "account", "qos", "constraint", "reservation", "time"):
        value = getattr(r, key)
        if value:
            out.append(f"--{key}={value}")
    if r.exclusive:
        out.append("--exclusive")
    # --requeue: Slurm may restart the job (node failure, preemption, `scontrol requeue`);
    # --open-mode=append: one train.log across restarts; USR2 (not USR1: NCCL may catch it).
    out += ["--requeue", "--open-mode=append", f"--signal=B:USR2@{spec.runtime.signal_seconds}"]
    return out + list(r.sbatch_extra)


def distributed_args(spec: JobSpec, config_keys: Mapping[str, Any] | None = None) -> list[str]:
    """MaxText's GPU path runs jax.distributed.initialize from JAX_COORDINATOR_*/NNODES/NODE_RANK
    (it works on CPU too); with jax.distributed up, MaxText answers SIGTERM with a checkpoint. What the
    spec sets, in model.overrides or its config file, stays as set."""
    given = set(spec.model.overrides) | set(config_keys or {})
    args = ["skip_jax_distributed_system=false"]
    if "hardware" not in given:
        args.append("hardware=gpu")
    if spec.checkpoint.period and "enable_autocheckpoint" not in given:
        args.append("enable_autocheckpoint=true")
    return args


def infrastructure_patterns() -> list[InfraPattern]:
    """The triage catalog's log patterns whose blame is the node, the network or the scheduler, and
    that name a cause (not a consequence of another rank's failure): seen in a rank's output, they
    make its failure an infrastructure failure, which the restart policy requeues."""
    from mxc.runtime.triage import catalog

    return [InfraPattern(cause=cause, blame=blame, regex=regex)
            for cause, blame, regex in catalog.raw_patterns(INFRASTRUCTURE_BLAMES)]


def build_contract(spec: JobSpec, config_keys: Mapping[str, Any] | None = None) -> RunContract:
    """``config_keys``: the keys of model.config_file, where the spec has one."""
    from mxc.runtime.logs.trainlog import STEP_PREFIX

    rt = spec.runtime
    total = steps(spec, config_keys)
    image = spec.image
    entry = spec.code.entry.target
    return RunContract(
        format=FORMAT,
        name=spec.name,
        backend=rt.backend,
        nodes=spec.resources.nodes,
        code=Code(repo=spec.code.repo, commit=spec.code.commit, maxtext_version=spec.code.maxtext_version,
                  from_image=spec.code.from_image),
        slurm=Slurm(directives=sbatch_directives(spec), modules=list(rt.modules), partition=spec.resources.partition,
                    time_limit_s=time_seconds(spec.resources.time), signal_seconds=rt.signal_seconds,
                    env=sorted((k, scalar_text(v)) for k, v in spec.resources.slurm_env.items())),
        stages=[
            Stage("preflight", rt.timeouts.preflight, PREFLIGHT_GRACE_S),
            Stage("image", rt.timeouts.image, IMAGE_GRACE_S),
            # Every rank waits for all to have passed preflight and image, within the image limit.
            Stage("barrier", rt.timeouts.image, 0),
            # A stopping training gets runtime.signal_seconds to write its checkpoint.
            Stage("train", rt.timeouts.train or 0, rt.signal_seconds),
        ],
        restart=Restart(max=spec.restart.max, final_step=total - 1 if total else None,
                        checkpointing=spec.checkpoint.period > 0),
        hang=Hang(init_timeout_s=rt.hang.init_timeout, step_timeout_s=rt.hang.step_timeout,
                  step_pattern=STEP_PREFIX.pattern, exit_grace_s=rt.exit_grace),
        checkpoint=Checkpoint(dir=spec.checkpoint.dir, period=spec.checkpoint.period),
        train=Train(
            module=entry[1] if entry[0] == "module" else "", steps=total, args=maxtext_args(spec),
            runtime_args=[RuntimeArg("run_name", "run_name"), RuntimeArg("base_output_directory", "output_dir"),
                          RuntimeArg("metrics_file", "metrics_file"), RuntimeArg("jax_cache_dir", "jax_cache")],
            distributed_args=distributed_args(spec, config_keys), single_args=["skip_jax_distributed_system=true"],
            pythonpath=spec.code.pythonpath,
            script=entry[1] if entry[0] == "script" else None,
            config_file=config_file.bundle_name(spec.model.config_file) if spec.model.config_file else None,
            workdir=spec.code.entry.workdir,
        ),
        env=environment(spec),
        rank_env=rank_environments(spec),
        detect=list(spec.env.detect),
        env_merge=env_merge(spec),
        env_pass=list(spec.env.pass_) or None,
        container=Container(
            kind=rt.container, image_ref=image.ref if image else None, image_digest=image.digest if image else None,
            gpu_vendor=spec.resources.gpu_vendor, mounts=list(rt.mounts),
            python=rt.python if rt.container == "native" else "python3",
            maxtext_version=spec.code.maxtext_version, optional_mounts=list(rt.optional_mounts),
            options=container_options.runtime_args(rt.container, rt.container_options),
            gpu_libraries=rt.container_options.gpu_libraries,
        ),
        preflight=Preflight(
            gpus=rt.preflight.gpus and spec.resources.gpus_per_node > 0, expected_gpus=spec.resources.gpus_per_node,
            stale_processes=rt.preflight.stale_processes, min_free_gb=rt.preflight.min_free_gb,
            network=rt.preflight.network, exclusive=spec.resources.exclusive,
        ),
        cores=Cores(max_mb=rt.cores.max_mb, keep=rt.cores.keep, backtrace=rt.cores.backtrace),
        network=Network(interface=rt.network_interface),
        observability=Observability(
            enabled=spec.observability.enabled, bind=spec.observability.bind,
            exporter_port=spec.observability.exporter_port, prometheus_port=spec.observability.prometheus_port,
            tensorboard_port=spec.observability.tensorboard_port, scrape_interval=spec.observability.scrape_interval,
            plugins=list(spec.observability.plugins), ray=spec.observability.ray,
            ray_dashboard=spec.observability.ray_dashboard,
            alerts=spec.observability.enabled and spec.observability.alerts.enabled,
        ),
        infrastructure=infrastructure_patterns(),
        notify=notify_settings(spec),
    )


def notify_settings(spec: JobSpec) -> Notify | None:
    """The spec's ``notify`` for the batch side, which posts a Slurm job's alerts itself."""
    n = spec.notify
    if n is None:
        return None
    return Notify(format=n.format, secret_env=n.secret_env, secret_file=n.secret_file, chat_id=n.chat_id,
                  api_url=n.api_url.rstrip("/"), events=list(n.events), timeout_s=float(n.timeout))
