"""``runtime.container_options`` -> the container runtime's own options, per runtime.

One place decides what each runtime is given (the node program only appends the list from
run.json to its command line). Podman and Docker take the same flags; Apptainer already shows
the host's /dev, the user's groups and limits, and a shared /dev/shm, so it is given only the
capabilities (``--add-caps``); the GPU libraries flag (``--rocm``/``--nv``) is the launcher's.
What a runtime cannot do is refused when the spec is validated (``problem``), never dropped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # schema.py imports this module: no import cycle at run time
    from mxc.compiler.schema import ContainerOptions

OCI_RUNTIMES = ("podman", "docker")


def problem(kind: str, opts: ContainerOptions) -> str | None:
    """Why ``opts`` cannot apply to runtime ``kind`` (``field: why``), or None."""
    if kind == "native":
        used = [name for name, value in opts if value and name != "gpu_libraries"]
        if used or not opts.gpu_libraries:
            return f"{(used or ['gpu_libraries'])[0]}: runtime.container is native; container options need a container"
        return None
    if kind in OCI_RUNTIMES and opts.shm_size is not None:
        return (f"shm_size: mxc runs {kind} with --ipc=host, so the container shares the host's /dev/shm "
                "(podman refuses --shm-size with it); remove it, or size the host's /dev/shm")
    for name, value in sorted(opts.ulimits.items()):
        soft, _, hard = _limit(value).partition(":")
        if hard != "-1" and (soft == "-1" or int(soft) > int(hard)):
            return f"ulimits.{name}: soft limit {soft} is above hard limit {hard} (-1 is unlimited); write soft:hard"
    if kind == "docker" and "keep-groups" in opts.group_add:
        return "group_add: keep-groups is podman's (rootless, crun); docker takes group names or numbers"
    if kind == "apptainer":
        if opts.privileged:
            return "privileged: apptainer has no --privileged (it runs as the user; use cap_add)"
        if opts.shm_size is not None:
            return "shm_size: apptainer shares the host's /dev/shm; remove it"
        if opts.ulimits:
            return "ulimits: apptainer runs with the limits of the job (set them with ulimit in the site's Slurm)"
        if "keep-groups" in opts.group_add:
            return "group_add: apptainer keeps the user's groups already; remove keep-groups"
        if opts.group_add:
            return "group_add: apptainer runs with the user's own groups; remove it"
    elif not opts.gpu_libraries:
        return "gpu_libraries: only apptainer binds the host's GPU libraries (--rocm/--nv); remove it"
    return None


def runtime_args(kind: str, opts: ContainerOptions) -> list[str]:
    """The runtime's options for ``opts`` (already accepted by ``problem``), one argv token each."""
    if kind in OCI_RUNTIMES:
        args = [f"--device={device}" for device in opts.devices]
        args += [f"--group-add={group}" for group in opts.group_add]
        args += [f"--ulimit={name}={_limit(value)}" for name, value in sorted(opts.ulimits.items())]
        if opts.shm_size is not None:
            args.append(f"--shm-size={opts.shm_size}")
        args += [f"--cap-add={cap}" for cap in opts.cap_add]
        if opts.privileged:
            args.append("--privileged")
        return args
    if kind == "apptainer" and opts.cap_add:
        return ["--add-caps=" + ",".join(f"CAP_{cap}" for cap in opts.cap_add)]
    return []


def _limit(value: int | str) -> str:
    """``soft[:hard]`` -> ``soft:hard`` (a lone value is both, as ulimit -n N sets both)."""
    text = str(value)
    return text if ":" in text else f"{text}:{text}"


def privileged_notice(kind: str) -> str:
    """The line ``mxc show`` prints for a privileged container (`mxc build` prints the container-privileged warning)."""
    return (f"runtime.container_options.privileged: the {kind} container runs --privileged "
            "(every host device and capability; `mxc check` reports it as container-privileged)")
