"""The job spec, ``mxc/v1``: what a training run depends on, and nothing else.

Models are frozen and forbid unknown keys: a typo must fail at review time, not be
ignored on the cluster. Field descriptions feed ``mxc schema`` and docs/spec-reference.md.
"""


import re
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from mxc.compiler import container_options, container_policy, determinism, env_policy, sbatch_extra, slurm_env
from mxc.compiler.catalog import maxtext_model_names
from mxc.compiler.errors import did_you_mean
from mxc.compiler.gitrepo import repo_problem
from mxc.node import envboundary, placeholders
from mxc.node.contract import EXIT_GRACE_S
from mxc.node.detect import DETECTORS
from mxc.node.notify_policy import secret_env_problem
from mxc.node.secretscan import find_secrets
from mxc.plugins import PLUGIN_NAME_PATTERN

SCHEMA_VERSION = "mxc/v1"

Digest = Annotated[str, StringConstraints(pattern=r"^sha256:[0-9a-f]{64}$")]
Commit = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{40}$")]
Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")]
EnvName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
Scalar = bool | int | float | str
MergeMode = Literal["replace", "append", "prepend"]
SlurmTime = Annotated[
    str, StringConstraints(pattern=r"^(\d{1,6}-)?\d{1,2}(:\d{2}){0,2}$|^\d{1,9}$|^\d{1,6}-\d{1,6}$")
]
Port = Annotated[int, Field(ge=1024, le=65535)]
# A path that becomes part of an Apptainer --bind or Podman --volume argument: those split on
# ',' (Apptainer: another mount, read-write) and ':' (source:destination:options), so neither
# may appear inside a path; nor whitespace or control characters.
CONTAINER_PATH = r"^/[^:,\s]*$"
MOUNT_PATTERN = r"^/[^:,\s]*:/[^:,\s]*(:ro)?$"
# model.config_file: relative (no leading '/', no '..' component), ending in .yml: MaxText takes its
# first argument as the config file only when it ends so.
CONFIG_FILE_PATTERN = r"^[A-Za-z0-9_.][A-Za-z0-9_./-]*\.yml$"
Interface = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.:-]{1,15}$")]
# A value that lands on an #SBATCH line: sbatch parses those itself, so no quoting can help;
# forbid whitespace and shell metacharacters instead.
SlurmToken = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.,:@%+=\[\]|&!*()/-]+$")]
RankKey = Annotated[str, StringConstraints(pattern=r"^(0|[1-9][0-9]{0,4})$")]


def check_placeholders(prefix: str, values: dict[str, Scalar]) -> None:
    """Every string value is a valid run-time template (mxc/node/placeholders.py): the node program
    fills them all in, so a lone brace or an unknown ``{name}`` fails here, at its key's line."""
    for key, value in values.items():
        if isinstance(value, str) and placeholders.has_braces(value):
            try:
                placeholders.names(value)
            except placeholders.PlaceholderError as exc:
                raise ValueError(f"{prefix}.{key}: {exc}") from None

# Keys that mxc itself passes to MaxText for every run (render.py maxtext_args, entrypoint.sh),
# after the spec's overrides: a spec value would be silently overridden (outputs in the wrong
# place, a second metrics file, checkpointing not as reviewed). Each names what controls it.
# `hardware` and `enable_autocheckpoint` are deliberately left to the spec: mxc passes its
# default for multi-node runs only when the spec does not set them.
RESERVED_OVERRIDES: dict[str, str] = {
    "model_name": "use model.model_name",
    "run_name": "mxc names each run: its run id",
    "base_output_directory": "use checkpoint.dir",
    "metrics_file": "mxc writes metrics into the run directory",
    "enable_checkpointing": "use checkpoint.period; 0 turns checkpointing off",
    "checkpoint_period": "use checkpoint.period",
    "jax_cache_dir": "mxc keeps the JAX compilation cache per run, or in $MXC_JAX_CACHE",
    "skip_jax_distributed_system": "mxc sets it from resources.nodes: JAX distributed when more than one process",
}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AddedFields(Strict):
    """A section that gained fields after bundles existed: each field named in ``added_fields`` stays
    out of spec.json while it holds its default, so the spec.json (and so every bundle hash) of a
    spec that does not use it stays what it was before the field existed."""

    added_fields: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _omit_added_at_default(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        fields = type(self).model_fields
        for name in self.added_fields:
            if getattr(self, name) == fields[name].get_default(call_default_factory=True):
                data.pop(name, None)
                data.pop(fields[name].alias or name, None)  # dumped by_alias (env.pass)
        return data


class Image(Strict):
    """The container image, pinned by content digest (a tag alone can move)."""

    # Not starting with '-': apptainer exec and podman run take it as an argument, where it would be an option.
    ref: str = Field(pattern=r"^[^\s-][^\s]*$",
                     description="Image reference or .sif path, e.g. docker.io/rocm/jax-training:maxtext-v25.9")
    digest: Digest = Field(
        description="sha256:<64 hex> of the image manifest (or of the .sif file); `mxc lock` resolves it from the tag"
    )


# The upstream MaxText layout (the default training entry) and a dotted Python module name.
UPSTREAM_MODULE = "maxtext.trainers.pre_train.train"
UPSTREAM_CONFIGS = "src/maxtext/configs"
MODULE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
# A path relative to the training's working directory: no leading '/', nothing a shell splits
# (a '..' component is refused by up_and_out).
RELATIVE_PATH = r"^[A-Za-z0-9_][A-Za-z0-9_./-]*$"


def up_and_out(path: str | None) -> bool:
    """A relative path with a '..' component: it could leave the directory it is relative to."""
    return path is not None and ".." in path.split("/")


class Entry(Strict):
    """How training starts: a Python module (``python -m``) or a script, then MaxText's config file.

    The default is upstream MaxText's layout; the MaxText inside ROCm's ``rocm/jax-training`` images
    is started as ``MaxText.train`` (or ``MaxText/train.py``) with its configs in ``MaxText/configs``."""

    module: str | None = Field(None, pattern=MODULE_PATTERN,
                               description=f"Python module run with -m (default {UPSTREAM_MODULE}; ROCm images: MaxText.train)")
    script: str | None = Field(None, pattern=RELATIVE_PATH,
                               description="instead of module: a .py script, relative to the working directory, "
                               "e.g. MaxText/train.py")
    configs: str = Field(UPSTREAM_CONFIGS, pattern=RELATIVE_PATH,
                         description="directory that model.config is relative to, from the working directory "
                         "(ROCm images: MaxText/configs); unused with model.config_file")
    workdir: str | None = Field(None, pattern=CONTAINER_PATH,
                                description="with code.from_image: the working directory inside the container, where "
                                "MaxText lives (ROCm images: /workspace/maxtext); default: the image's own")

    @model_validator(mode="after")
    def _one_entry(self) -> Self:
        for key in ("script", "configs"):
            if up_and_out(getattr(self, key)):
                raise ValueError(f"{key}: a path inside the working directory, without '..'")
        if self.module is not None and self.script is not None:
            raise ValueError("script: name either code.entry.module or code.entry.script, not both")
        if self.script is not None and not self.script.endswith(".py"):
            raise ValueError("script: a Python script ending in .py (or use code.entry.module)")
        return self

    @property
    def target(self) -> tuple[str, str]:
        """("module", name) or ("script", path): what the trainer's Python is given."""
        if self.script is not None:
            return "script", self.script
        return "module", self.module or UPSTREAM_MODULE


class Code(AddedFields):
    """The training code: a git commit, the MaxText inside the image, or for native runs the pinned maxtext release."""

    added_fields = ("from_image", "entry")

    repo: str | None = Field(None, description="git URL or path of the MaxText (or fork) repository")
    commit: Commit | None = Field(None, description="full 40-hex commit of `repo` (or leave it to the lockfile: `mxc lock`)")
    ref: str | None = Field(
        None, min_length=1, description="branch or tag that `mxc lock` resolves to `commit`; the commit is what runs"
    )
    from_image: bool = Field(
        False, description="the training code is the MaxText inside the image, pinned by image.digest (containers "
        "only; no code.repo): what MaxText-Slurm runs with rocm/jax-training images"
    )
    entry: Entry = Field(default_factory=Entry, description="how training starts (module or script, configs directory)")
    pythonpath: str = Field("src", description="directory inside the checkout to put on PYTHONPATH")
    maxtext_version: str | None = Field(
        None, pattern=r"^\d+(\.\d+)*([a-z0-9.+-]*)$", description="pinned maxtext package version (native runs)"
    )
    jaxlib_version: str | None = Field(
        None, pattern=r"^\d+(\.\d+)*([a-z0-9.+-]*)$",
        description="jaxlib the training runs with (e.g. the image's); `mxc check` judges XLA flags against this version",
    )
    maxtext_catalog: str | None = Field(
        None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,80}$",
        description="MaxText key catalog `mxc check` judges model.overrides against (a fork's or an image's MaxText, "
        "docs/check.md); default: the catalog of code.repo at code.commit, else of code.maxtext_version, else the newest",
    )

    @field_validator("repo")
    @classmethod
    def _safe_repo(cls, repo: str | None) -> str | None:
        if repo is not None and (problem := repo_problem(repo)):
            raise ValueError(f"{problem} (give a path or an https/ssh URL of a git repository)")
        return repo

    @model_validator(mode="after")
    def _pinned(self) -> Self:
        if self.from_image:
            for key in ("repo", "commit", "ref", "maxtext_version"):
                if getattr(self, key) is not None:
                    raise ValueError(f"{key}: code.from_image runs the image's MaxText (pinned by image.digest); "
                                     f"remove code.{key}, or code.from_image to run a pinned commit")
            return self
        if (self.repo is None) != (self.commit is None):
            raise ValueError("commit: code.repo and code.commit go together (a repository is pinned by a commit; "
                             "`mxc lock` + `mxc build --locked` fill it from code.ref)")
        if self.ref is not None and self.repo is None:
            raise ValueError("ref: code.ref names a branch or tag of code.repo; set code.repo")
        if self.repo is None and self.maxtext_version is None:
            raise ValueError("maxtext_version: pin the training code with code.repo + code.commit, code.maxtext_version, "
                             "or (containers) code.from_image: true")
        if self.entry.workdir is not None:
            raise ValueError("entry.workdir: only with code.from_image (a pinned checkout is the working directory)")
        return self


class Model(AddedFields):
    """The MaxText model: a config name plus ``key=value`` overrides passed through verbatim."""

    added_fields = ("config_file",)

    model_name: str = Field(description="MaxText model name (configs/models/<name>.yml), or 'default'")
    config: str = Field("base.yml", description="MaxText config file, relative to code.entry.configs")
    config_file: str | None = Field(
        None, pattern=CONFIG_FILE_PATTERN,
        description="a MaxText YAML (.yml) of your own, relative to the spec that names it and inside its repository "
        "(e.g. a MaxText-Slurm configs/<model>.gpu.yml): copied into the bundle and passed as MaxText's config; its "
        "base_config resolves against the configs of the MaxText that runs; model.overrides apply on top",
    )
    overrides: dict[str, Scalar] = Field(
        default_factory=dict, description="MaxText config keys passed as key=value (steps, per_device_batch_size, ...)"
    )

    @field_validator("model_name")
    @classmethod
    def _known_model(cls, value: str) -> str:
        known = maxtext_model_names()
        if value not in known:
            hint = did_you_mean(value, known)
            raise ValueError(f"'{value}' is not a MaxText model" + (f" ({hint})" if hint else ""))
        return value

    @field_validator("overrides")
    @classmethod
    def _not_reserved(cls, value: dict[str, Scalar]) -> dict[str, Scalar]:
        for key in value:
            if key in RESERVED_OVERRIDES:
                raise ValueError(f"'{key}' is set by mxc for every run; remove it from model.overrides "
                                 f"({RESERVED_OVERRIDES[key]})")
            if not re.fullmatch(r"[a-z_][a-z0-9_]*", key):
                raise ValueError(f"'{key}' is not a MaxText config key (lower_snake_case)")
        return value

    @field_validator("config")
    @classmethod
    def _inside_the_configs(cls, value: str) -> str:
        """model.config names a file of the MaxText that runs: a path that climbs out (or starts at /)
        makes the trainer read any file of the node as its config."""
        if value.startswith("/") or any(part == ".." for part in value.replace("\\", "/").split("/")):
            raise ValueError(f"'{value[:80]}' leaves code.entry.configs (absolute, or a '..' segment); name a file "
                             "inside it, or a file of your own with model.config_file")
        return value

    @model_validator(mode="after")
    def _one_config(self) -> Self:
        if self.config_file is not None and "config" in self.model_fields_set:
            raise ValueError("config_file: name either model.config (inside MaxText) or model.config_file "
                             "(a file beside the spec), not both")
        return self

    @model_validator(mode="after")
    def _templates(self) -> Self:
        check_placeholders("overrides", self.overrides)
        check_placeholders("model", {"config": self.config})  # an argument of the trainer too
        return self


class EnvValues(Strict):
    """Variables and XLA flags: for every rank (``env``) or for one (``env.ranks.<rank>``)."""

    xla_flags: dict[Annotated[str, StringConstraints(pattern=r"^xla_[a-z0-9_]+$")], Scalar] = Field(
        default_factory=dict, description="XLA flags without the leading --, rendered into XLA_FLAGS"
    )
    vars: dict[EnvName, Scalar] = Field(
        default_factory=dict, description="NCCL_*, RCCL_*, NVTE_*, HSA_*, JAX_* and other variables "
        "(not those bash or Slurm act on; loader, interpreter and container settings need env.allow_dangerous)"
    )

    @field_validator("vars")
    @classmethod
    def _no_reserved(cls, value: dict[str, Scalar]) -> dict[str, Scalar]:
        for key in value:
            if key.startswith("MXC_"):
                raise ValueError(f"'{key}': MXC_* variables belong to mxc itself")
        return value

    @model_validator(mode="after")
    def _templates(self) -> Self:
        check_placeholders("vars", self.vars)
        check_placeholders("xla_flags", self.xla_flags)
        return self


class RankEnv(EnvValues):
    """What one rank adds: its variables replace the shared ones, its XLA flags join them."""


class Env(EnvValues, AddedFields):
    """Environment of the training process. Values may hold run-time placeholders ({run_dir}, {rank}...)."""

    added_fields = ("allow_dangerous", "ranks", "detect", "merge", "pass_")
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    detect: list[str] = Field(
        default_factory=list, description="detectors the node program runs before training, each setting variables "
        "from what it finds on the node: " + ", ".join(DETECTORS) + " (docs/detectors.md); a value the spec or "
        "the node sets wins, except that the dmabuf guard lowers NCCL_DMABUF_ENABLE=1 to 0 where the kernel cannot"
    )
    allow_dangerous: list[EnvName] = Field(
        default_factory=list, description="variables of env.vars that load or run code (LD_PRELOAD, PATH, "
        "APPTAINER_*, ...) set on purpose; reported by mxc check, mxc build and mxc show"
    )
    ranks: dict[RankKey, RankEnv] = Field(
        default_factory=dict, description="per-rank additions by rank number, e.g. an XLA dump on rank 0 only: "
        "{'0': {xla_flags: {xla_dump_to: '{run_dir}/xla-dump'}}} (rank numbers quoted: keys are strings)"
    )
    pass_: list[EnvName] = Field(
        default_factory=list, alias="pass", description="variables of the caller's environment (natively the "
        "node's) that reach the training, e.g. [WANDB_API_KEY, HF_HOME]; nothing else of it does, beyond the base "
        "every process needs (PATH, HOME, USER, LANG, LC_*, TERM, TMPDIR, TZ), the scheduler's SLURM_*/PMI_* and "
        "the GPU visibility (docs/runs.md#what-reaches-the-training). Recorded by name; the spec's own value of "
        "the same name joins the passed one as env.merge says"
    )
    merge: dict[EnvName, MergeMode] = Field(
        default_factory=dict, description="how a spec value meets the value the image already has (native: the "
        "node's environment), per variable: replace, append (the image's value, then the spec's) or prepend; joined "
        "by ':' for *PATH variables, a space otherwise. Default: XLA_FLAGS append (the spec's flags come last, so "
        "they win), LD_LIBRARY_PATH prepend (the GPU driver's libraries stay), every other variable replace "
        "(docs/containers.md)"
    )

    @field_validator("detect")
    @classmethod
    def _known_detectors(cls, names: list[str]) -> list[str]:
        for name in names:
            if name not in DETECTORS:
                hint = did_you_mean(name, DETECTORS)
                raise ValueError(f"unknown detector '{name}' ({hint + ' ' if hint else ''}one of {', '.join(DETECTORS)})")
        if len(set(names)) != len(names):
            raise ValueError("a detector is named twice")
        return names

    @field_validator("pass_")
    @classmethod
    def _passable(cls, names: list[str]) -> list[str]:
        for name in names:
            if name.startswith(envboundary.OWN_PREFIX):
                raise ValueError(f"'{name}': MXC_* variables belong to mxc itself")
            if envboundary.crosses(name):
                raise ValueError(f"'{name}' reaches the training without being passed (the base: "
                                 "docs/runs.md#what-reaches-the-training); remove it")
        if len(set(names)) != len(names):
            raise ValueError("a variable is named twice")
        return names

    @model_validator(mode="after")
    def _not_instructions(self) -> Self:
        """Variables that bash, the loader or the container runtime obey (mxc/compiler/env_policy.py),
        shared or for one rank, set by the spec or passed from the caller's environment."""
        found_passed = env_policy.pass_problems(self.pass_, self.allow_dangerous)
        if found_passed:
            name, why = found_passed[0]
            raise ValueError(f"pass.{self.pass_.index(name)}: {why}")
        for where, values in [("vars", self.vars)] + [(f"ranks.{r}.vars", e.vars) for r, e in self.ranks.items()]:
            exported = {k: v if isinstance(v, str) else str(v) for k, v in values.items()}
            found = env_policy.problems(exported, self.allow_dangerous, self.pass_)
            if found:
                name, why = found[0]
                raise ValueError(f"{where}.{name}: {why}" if name in values else f"allow_dangerous: {why}")
        set_anywhere = {*self.vars, *(n for e in self.ranks.values() for n in e.vars)}
        if self.xla_flags or any(e.xla_flags for e in self.ranks.values()):
            set_anywhere.add("XLA_FLAGS")
        for name in self.merge:
            if name not in set_anywhere:
                raise ValueError(f"merge.{name}: the spec does not set {name} (env.vars or, for XLA_FLAGS, "
                                 "env.xla_flags); remove it from env.merge")
        return self


class Resources(AddedFields):
    """What to ask the scheduler for."""

    added_fields = ("slurm_env",)

    nodes: int = Field(1, ge=1, description="number of nodes (one task per node)")
    gpus_per_node: int = Field(0, ge=0, description="GPUs per node")
    gpu_vendor: Literal["amd", "nvidia", "none"] = Field("none", description="GPU kind: selects --rocm/--nv and device variables")
    cpus_per_task: int | None = Field(None, ge=1, description="CPUs for the one task on each node")
    mem: str | None = Field(None, pattern=r"^\d+[KMGT]?$", description="memory per node, Slurm syntax (e.g. 512G); 0 = all")
    partition: SlurmToken | None = Field(None, description="Slurm partition")
    account: SlurmToken | None = Field(None, description="Slurm account")
    qos: SlurmToken | None = Field(None, description="Slurm QOS")
    constraint: SlurmToken | None = Field(None, description="Slurm node features, e.g. mi300x")
    reservation: SlurmToken | None = Field(None, description="Slurm reservation")
    time: SlurmTime | None = Field(None, description="time limit, Slurm syntax: MM, HH:MM:SS or D-HH:MM:SS")
    exclusive: bool = Field(True, description="take whole nodes (--exclusive)")
    sbatch_extra: list[Annotated[str, StringConstraints(pattern=r"^--[a-z][a-z0-9-]*(=.+)?$")]] = Field(
        default_factory=list, description="extra sbatch options for site needs, e.g. --gpu-bind=closest"
    )
    slurm_env: dict[EnvName, Scalar] = Field(
        default_factory=dict, description="variables for Slurm's own commands (srun reads them), exported by "
        "job.sbatch before the job step starts, e.g. {SLURM_TREE_WIDTH: 128}: SLURM_*, SRUN_*, PMIX_* and PMI_* "
        "names, not those Slurm sets for the job (docs/containers.md)"
    )

    @model_validator(mode="after")
    def _extra_does_not_break_the_job(self) -> Self:
        """sbatch options that change what mxc's job relies on (mxc/compiler/sbatch_extra.py)."""
        for i, option in enumerate(self.sbatch_extra):
            why = sbatch_extra.problem(option)
            if why:
                raise ValueError(f"sbatch_extra.{i}: {why}")
        return self

    @field_validator("slurm_env")
    @classmethod
    def _slurm_inputs(cls, value: dict[str, Scalar]) -> dict[str, Scalar]:
        for name, val in value.items():
            problem = slurm_env.problem(name, val if isinstance(val, str) else str(val))
            if problem:
                raise ValueError(f"'{name}': {problem}")
        return value

    @model_validator(mode="after")
    def _gpus_have_vendor(self) -> Self:
        if self.gpus_per_node and self.gpu_vendor == "none":
            raise ValueError("gpu_vendor: gpus_per_node > 0 needs gpu_vendor amd or nvidia")
        return self


class Timeouts(Strict):
    """Seconds each stage may take on a node; a stage past its limit fails the job, naming the stage."""

    preflight: int = Field(900, ge=1, description="node checks before training")
    image: int = Field(900, ge=1, description="image pull and digest verification")
    train: int | None = Field(None, ge=1, description="training itself (default: the job's time limit)")


class Preflight(Strict):
    """Node checks before training; a failed check stops the job with its reason."""

    gpus: bool = Field(True, description="the node sees exactly resources.gpus_per_node GPUs")
    stale_processes: bool = Field(True, description="no training process of another job is left on the node")
    min_free_gb: float = Field(10.0, ge=0, description="free disk (GB) needed where checkpoints go")
    network: bool = Field(True, description="the chosen NCCL/RCCL network interface exists")


class CoreDumps(Strict):
    """What is kept when training dies by a fatal signal (SIGSEGV, SIGABRT, ...), for `mxc triage`."""

    max_mb: int = Field(1024, ge=0, description="core file size limit (ulimit -c) in MB; 0: no core, only the Python stack")
    keep: int = Field(2, ge=0, description="most core files kept in the run's cores/ directory (they are large)")
    backtrace: bool = Field(True, description="write each core's native backtrace (gdb, when installed) to stacks/")


class HangWatch(Strict):
    """Every rank's hang watch (always on): a rank without progress for too long is hung; its stacks
    are kept, training is killed on every rank and the job is restarted from its last checkpoint."""

    init_timeout: int = Field(
        1800, ge=1, description="seconds without any training output before the first step (start-up, "
        "jax.distributed and NCCL/RCCL initialisation, compilation, checkpoint restore)"
    )
    step_timeout: int = Field(900, ge=1, description="seconds without a new step, once the first step is done")


class ContainerOptions(Strict):
    """Extra options of the container runtime (podman, docker, apptainer), each validated and
    translated per runtime by mxc (mxc/compiler/container_options.py; docs/containers.md)."""

    devices: list[Annotated[str, StringConstraints(pattern=r"^/dev/[A-Za-z0-9_./-]+$")]] = Field(
        default_factory=list, description="host devices the container sees, e.g. /dev/infiniband (podman/docker "
        "--device; apptainer sees the host's /dev already)")
    group_add: list[Annotated[str, StringConstraints(pattern=r"^([a-z_][a-z0-9_-]{0,31}|[0-9]{1,10}|keep-groups)$")]] = Field(
        default_factory=list, description="supplementary groups, by name or number (podman/docker --group-add); "
        "keep-groups: rootless podman keeps the user's groups (access to /dev/kfd, /dev/dri, /dev/infiniband)")
    ulimits: dict[Annotated[str, StringConstraints(pattern=r"^(core|cpu|data|fsize|locks|memlock|msgqueue|nice|nofile|"
                                                                r"nproc|rss|rtprio|rttime|sigpending|stack)$")],
                  Annotated[int, Field(ge=-1)] | Annotated[str, StringConstraints(
                      pattern=r"^(-1|[0-9]{1,20})(:(-1|[0-9]{1,20}))?$")]] = Field(
        default_factory=dict, description="resource limits, soft[:hard], -1 unlimited (podman/docker --ulimit), "
        "e.g. {memlock: -1, nofile: '1048576:1048576'}")
    shm_size: Annotated[str, StringConstraints(pattern=r"^[1-9][0-9]{0,12}[kmgKMG]?$")] | None = Field(
        None, description="size of /dev/shm: refused by every runtime (podman and docker run with --ipc=host, "
        "apptainer shares the host's /dev/shm): the container's /dev/shm is the host's, size that one")
    cap_add: list[Annotated[str, StringConstraints(pattern=r"^[A-Z][A-Z_]{1,31}$")]] = Field(
        default_factory=list, description="Linux capabilities without CAP_, e.g. SYS_PTRACE (podman/docker --cap-add, "
        "apptainer --add-caps)")
    privileged: bool = Field(
        False, description="podman/docker --privileged: every device and capability; `mxc check` reports it "
        "(rule container-privileged)")
    gpu_libraries: bool = Field(
        True, description="apptainer: bind the host's GPU driver libraries (--rocm / --nv); false for images that "
        "bring their own ROCm or CUDA user space")


class Runtime(AddedFields):
    """Where and how the bundle runs."""

    added_fields = ("optional_mounts", "container_options", "exit_grace", "allow_dangerous")

    backend: Literal["local", "slurm"] = Field("local", description="local: this machine; slurm: sbatch")
    container: Literal["apptainer", "podman", "docker", "native"] = Field(
        "native", description="how the training process is isolated")
    timeouts: Timeouts = Field(default_factory=Timeouts)
    preflight: Preflight = Field(default_factory=Preflight)
    python: str = Field("python3", description="interpreter for native runs (on PATH or absolute)")
    modules: list[str] = Field(default_factory=list, description="environment modules loaded on each node (`module load`)")
    network_interface: Interface | None = Field(None, description="NCCL/RCCL socket interface; default: chosen on the node")
    signal_seconds: int = Field(300, ge=10, description="USR2 this many seconds before the time limit, to checkpoint")
    mounts: list[Annotated[str, StringConstraints(pattern=MOUNT_PATTERN)]] = Field(
        default_factory=list, description="container bind mounts, /host:/container[:ro]"
    )
    optional_mounts: list[Annotated[str, StringConstraints(pattern=MOUNT_PATTERN)]] = Field(
        default_factory=list, description="bind mounts made only where the host path exists on the node "
        "(e.g. /dev/infiniband, a site's RDMA libraries); a skipped one is logged and kept in the run record"
    )
    container_options: ContainerOptions = Field(
        default_factory=ContainerOptions, description="extra container runtime options: devices, groups, limits, "
        "/dev/shm size, capabilities (docs/containers.md)")
    cores: CoreDumps = Field(default_factory=CoreDumps)
    hang: HangWatch = Field(default_factory=HangWatch)
    exit_grace: int = Field(
        EXIT_GRACE_S, ge=1, le=86400, description="seconds a trainer may take to exit once every rank has logged the final "
        "step (and, with checkpointing, the final checkpoint is finished); after it mxc ends the trainer, and a stall "
        "or a non-zero exit then is noted, not a failure: the run succeeded (JAX/PjRt can take minutes to shut down)")
    allow_dangerous: list[Annotated[str, StringConstraints(max_length=4200)]] = Field(
        default_factory=list, description="container options that reach the host, given on purpose, each as "
        "field:value: cap_add:SYS_ADMIN, devices:/dev/sda, group_add:docker, mounts:/:/host, "
        "optional_mounts:/dev:/dev; reported by mxc check (container-dangerous), mxc build and mxc show "
        "(docs/security.md)")

    @model_validator(mode="after")
    def _host_stays_outside(self) -> Self:
        """Capabilities, devices, mounts and groups that give the container the host
        (mxc/compiler/container_policy.py)."""
        o = self.container_options
        found = container_policy.problems(o.cap_add, o.devices, o.group_add, self.mounts, self.optional_mounts,
                                          self.allow_dangerous)
        if found:
            where, why = found[0]
            raise ValueError(f"{where}: {why}")
        return self


class Alerts(Strict):
    """Prometheus alerting rules shipped in the bundle (alerts.rules.yml), evaluated by the run's Prometheus;
    a firing alert is kept in <run>/observability/alerts.jsonl and sent to the notify webhook (docs/alerts.md)."""

    enabled: bool = Field(True, description="ship the rules (with observability.enabled)")
    notify: bool = Field(True, description="send each firing alert (and its resolution) through the spec's notify "
                         "webhook, when the spec has one")
    stall_after: int = Field(600, ge=1, le=604800, description="MxcTrainingStalled: seconds without a new training "
                             "step, once steps were logged (keep it below runtime.hang.step_timeout to hear of a "
                             "stall before the hang watch ends it)")
    step_time_ratio: float = Field(1.5, gt=1, le=1000, description="MxcStepTimeRegression: step time above this many "
                                   "times the run's own median step time (last 6 h), for a minute")
    throttle_ratio: float = Field(0.1, gt=0, le=1, description="MxcGpuThermalThrottling: fraction of the last two "
                                  "minutes a GPU's clocks were held down for heat")
    rdma_retries_per_second: float = Field(1.0, gt=0, le=1e9, description="MxcRdmaRetryBurst: RDMA ACK timeouts, "
                                           "retransmitted packets and sequence-error NAKs per second on one port, "
                                           "for a minute")


class Observability(Strict):
    """Metrics and TensorBoard (hangs: runtime.hang). Dashboards bind to loopback unless told otherwise."""

    enabled: bool = Field(False, description="run the exporter and Prometheus (and the alerting rules) with training")
    ray: bool = Field(False, description="also a Ray cluster, each rank's training in a Ray actor (with enabled); off "
                      "by default: the training then waits for Ray's start (seconds)")
    ray_dashboard: bool = Field(False, description="the Ray head also serves Ray's dashboard (live stacks, actors), on "
                                "127.0.0.1 of node rank 0; needs ray")
    bind: str = Field("127.0.0.1", description="address the exporters listen on (behind the run's scrape token); "
                      "with a loopback bind, a job spanning nodes has its exporters listen on each node's cluster "
                      "address; the run's Prometheus always listens on 127.0.0.1 (docs/metrics.md)")
    exporter_port: Port = Field(9400, description="first port tried for the exporter (a free one is picked)")
    prometheus_port: Port = Field(9190, description="first port tried for Prometheus")
    tensorboard_port: Port = Field(6006, description="first port tried for TensorBoard")
    scrape_interval: int = Field(10, ge=1, le=3600, description="seconds between scrapes")
    plugins: list[Annotated[str, StringConstraints(pattern=PLUGIN_NAME_PATTERN)]] = Field(
        default_factory=lambda: ["host", "network", "gpu", "tensorboard"],
        description="exporter plugins, by name (a Python identifier: entry point or <plugins dir>/<name>.py)")
    peak_tflops: float | None = Field(
        None, gt=0, le=1e6, description="the GPU's dense BF16 peak TFLOP/s for MFU (mxc_train_mfu_ratio); default: "
        "looked up from the GPU model (MI300X, MI325X, MI355X, H100, H200, B200; docs/metrics.md)")
    alerts: Alerts = Field(default_factory=Alerts)


    @model_validator(mode="after")
    def _dashboard_needs_ray(self) -> Self:
        if self.ray_dashboard and not self.ray:
            raise ValueError("ray_dashboard: the Ray dashboard needs Ray (set observability.ray: true)")
        return self

class Reproducibility(Strict):
    """How far a run's numbers are pinned (docs/runs.md#deterministic-runs)."""

    deterministic: bool = Field(
        False, description="set the documented determinism settings for the GPU vendor and the pinned jaxlib: XLA's "
        "--xla_gpu_deterministic_ops, NCCL_ALGO=Ring (NCCL and RCCL), NVTE_ALLOW_NONDETERMINISTIC_ALGO=0; recorded "
        "in the bundle's environment; slower (deterministic kernels). CPU runs need none, so none are set"
    )


class Checkpoint(Strict):
    """MaxText checkpoints: what automatic restart and Slurm requeue resume from."""

    dir: str | None = Field(None, pattern=CONTAINER_PATH, description="where checkpoints go (default: inside the run "
                            "directory); an absolute path, bound into containers as is")
    period: int = Field(0, ge=0, description="steps between checkpoints; 0 disables checkpointing")


class Restart(Strict):
    """How often a failed or preempted run is restarted from its last checkpoint."""

    max: int = Field(0, ge=0, description="automatic restarts from the last checkpoint before giving up")


NotifyEvent = Literal["start", "finish", "failure", "hang", "restart"]
NOTIFY_EVENTS: tuple[NotifyEvent, ...] = ("start", "finish", "failure", "hang", "restart")


class Notify(Strict):
    """Alerts to a chat webhook on a run's start, finish, failure, hang and restart.

    The webhook URL (Slack, Mattermost) or bot token (Telegram) is a secret: the spec names
    the environment variable or file that holds it, never the value (docs/alerts.md).
    """

    format: Literal["slack", "mattermost", "telegram"] = Field(description="message format of the webhook")
    secret_env: EnvName | None = Field(
        None, description="environment variable holding the webhook URL or bot token; its name says so "
        "(contains HOOK, BOT, SLACK, MATTERMOST, TELEGRAM, CHAT, NOTIFY or ALERT)",
    )
    secret_file: str | None = Field(
        None, min_length=1, description="file holding the webhook URL or bot token (~ expands; a regular file of yours, mode 600)"
    )
    chat_id: str | None = Field(None, pattern=r"^(-?\d+|@[A-Za-z0-9_]{5,})$", description="Telegram chat id or @channel")
    api_url: str = Field(
        "https://api.telegram.org", pattern=r"^https?://[^\s/@]+(:\d+)?(/[^\s]*)?$",
        description="Telegram Bot API server: the official one, or one the operator allows in $MXC_NOTIFY_ALLOWED_URLS",
    )
    events: list[NotifyEvent] = Field(default_factory=lambda: list(NOTIFY_EVENTS), description="which events alert")
    timeout: float = Field(5.0, gt=0, le=60, description="seconds an alert may take; a failed alert never fails the run")

    @model_validator(mode="after")
    def _where_the_secret_is(self) -> Self:
        if (self.secret_env is None) == (self.secret_file is None):
            raise ValueError("secret_env: name exactly one of notify.secret_env or notify.secret_file (where the secret is)")
        if self.format == "telegram" and not self.chat_id:
            raise ValueError("chat_id: the telegram format needs notify.chat_id")
        problem = secret_env_problem(self.secret_env) if self.secret_env else None
        if problem:
            raise ValueError(f"secret_env: {problem} (docs/alerts.md)")
        return self


class Accepted(Strict):
    """One check warning the spec's reviewers have accepted, with their reason: `mxc check` shows it
    as a note (reason included) instead of failing, and warns when it no longer occurs."""

    rule: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,63}$",
                      description="the warning's rule, e.g. env-var-vendor (docs/check.md lists them)")
    key: str = Field(min_length=1, max_length=256, description="the finding's key, e.g. env.vars.CUDA_DEVICE_MAX_CONNECTIONS")
    why: str = Field(min_length=1, max_length=500, description="why it is accepted (printed by every check)")


class CheckSettings(Strict):
    """What `mxc check` is told by the spec itself (reviewed with it)."""

    accept: list[Accepted] = Field(default_factory=list,
                                   description="warnings accepted on review; errors cannot be accepted")


# Validation context: each section validated, the cross-section check (consistency_problems) left out.
SECTIONS_ONLY = "sections_only"


class JobSpec(AddedFields):
    """A reviewed, versioned description of one training job."""

    added_fields = ("check", "reproducibility")

    schema_: Literal["mxc/v1"] = Field(alias="schema", description="spec format version")
    name: Name = Field(description="job name (letters, digits, . _ -)")
    description: str = Field("", description="free text for humans")
    image: Image | None = Field(None, description="container image; none for runtime.container: native")
    code: Code
    model: Model
    env: Env = Field(default_factory=Env)
    resources: Resources = Field(default_factory=Resources)
    runtime: Runtime = Field(default_factory=Runtime)
    observability: Observability = Field(default_factory=Observability)
    checkpoint: Checkpoint = Field(default_factory=Checkpoint)
    restart: Restart = Field(default_factory=Restart)
    notify: Notify | None = Field(None, description="chat alerts (webhook); the secret itself stays outside the spec")
    check: CheckSettings | None = Field(None, description="check warnings accepted on review (docs/check.md)")
    reproducibility: Reproducibility = Field(default_factory=Reproducibility,
                                             description="determinism settings (docs/runs.md#deterministic-runs)")

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> Self:
        if info.context is not None and info.context.get(SECTIONS_ONLY):
            return self  # the checker judging what is left of a spec with errors (check/partial.py)
        problems = consistency_problems(self)
        if problems:  # one line each (validate.py splits them): every one is reported at once
            raise ValueError("\n".join(problems))
        return self

    @model_validator(mode="after")
    def _no_secrets(self) -> Self:
        """A spec is copied into every bundle and shown by `mxc show`: it must not hold a secret."""
        for path, what in find_secrets(self.model_dump(mode="json", by_alias=True)):
            parts = path.split(".")
            keyed = ".".join(p for p in _lower_prefix(parts))
            raise ValueError(f"{keyed or 'name'}: '{path}' looks like {what}; a spec must not hold secrets: keep it "
                             "in an environment variable or a file and name that (e.g. notify.secret_env)")
        return self


def consistency_problems(spec: JobSpec) -> list[str]:
    """What no single section can judge alone: the container against the image and the code, the backend
    against the node count, per-rank settings against the nodes. Each problem is ``key.path: message``;
    all are listed, not only the first (a spec fixed in rounds costs a review each)."""
    problems: list[str] = []
    if spec.runtime.container == "native":
        if spec.image is not None:
            problems.append("image: runtime.container is native, so remove 'image' (or pick apptainer/podman/docker)")
    elif spec.image is None:
        problems.append(f"image: required (ref + digest) because runtime.container is {spec.runtime.container}")
    if spec.runtime.container == "native" and spec.code.from_image:
        problems.append("code.from_image: runtime.container is native, so there is no image to take the code "
                        "from; pin code.maxtext_version (or code.repo + code.commit), or pick a container")
    if spec.runtime.container != "native" and spec.code.repo is None and not spec.code.from_image:
        problems.append("code.repo: container runs pin the training code by git commit (code.repo + code.commit) "
                        "or take the image's MaxText (code.from_image: true)")
    if spec.code.from_image and spec.runtime.container == "apptainer" and spec.code.entry.workdir is None:
        problems.append("code.entry.workdir: apptainer starts in the host's directory, not the image's; name "
                        "where the image's MaxText is (e.g. /workspace/maxtext)")
    problem = container_options.problem(spec.runtime.container, spec.runtime.container_options)
    if problem:
        problems.append(f"runtime.container_options.{problem}")
    if spec.runtime.optional_mounts and spec.runtime.container == "native":
        problems.append("runtime.optional_mounts: mounts are for containers; runtime.container is native")
    problem = determinism.problem(spec)
    if problem:
        problems.append(problem)
    if spec.runtime.backend == "local" and spec.resources.nodes > 1:
        problems.append("resources.nodes: runtime.backend local runs on one node; set nodes to 1 or backend: slurm")
    for rank in spec.env.ranks:
        if int(rank) >= spec.resources.nodes:
            problems.append(f"env.ranks.{rank}: no rank {rank}: resources.nodes is {spec.resources.nodes} "
                            f"(one rank per node: 0..{spec.resources.nodes - 1})")
    return problems


def _lower_prefix(parts: list[str]) -> list[str]:
    """The leading key path that validate.py can point at (lower-case keys; env names are not)."""
    out: list[str] = []
    for part in parts:
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", part):
            break
        out.append(part)
    return out
