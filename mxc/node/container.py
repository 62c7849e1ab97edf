"""How a rank gets its training environment (the image stage) and the command prefix that starts
Python in it (the launcher), for each ``runtime.container``: native, podman, docker, apptainer.

* native: the image is the interpreter itself: the stage checks that it imports the pinned maxtext;
* podman, docker: the image by digest exists in the node's store or is pulled; the container sees
  only the GPUs Slurm allocated to the task (NVIDIA through CDI names, AMD through /dev/kfd and the
  DRM render nodes of the KFD topology);
* apptainer: a ``.sif`` path is verified against the pinned digest; a registry image is pulled
  once into the shared image cache (imagecache.py: a lock, a unique temporary file, a rename);
  ``--cleanenv``: the container starts from the image's environment, as under podman and docker.

In every container the first program is envmerge.py (mounted read-only from the bundle): it joins
the spec's variables with the image's own as run.json says (``env_merge``) and starts training.
No variable goes through the runtime's ``--env``, whose precedence differs between runtimes.
Mounts of ``runtime.optional_mounts`` whose host path is absent are skipped, and the launch says so.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from . import atomicfile, envboundary, envmerge, imagecache, layout, sysread
from .contract import Container, RunContract
from .imagecache import ImageError

# Variables a container gets besides the spec's own (env.sh): what training reads on the node.
# (PYTHONPATH: the code checkout is put before the spec's or the image's, container_env.)
PODMAN_PASSED = ("PYTHONFAULTHANDLER", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME",
                 "JAX_COORDINATOR_ADDRESS", "JAX_COORDINATOR_IP", "JAX_COORDINATOR_PORT", "NNODES", "NODE_RANK",
                 "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "MXC_RUN_DIR", "MXC_RANK", "MXC_ATTEMPT")
# Apptainer sees the host's GPUs; these say which of them the task has (podman and docker map the
# devices instead, and number them from 0 inside).
GPU_VISIBILITY = envboundary.GPU_VISIBILITY
OCI_RUNTIMES = ("podman", "docker")
MAXTEXT_CHECK = ("import sys, maxtext.version as v; "
                 "sys.exit(0 if v.__version__ == sys.argv[1] else "
                 "'maxtext ' + v.__version__ + ' is installed, the spec pins ' + sys.argv[1])")


@dataclass(frozen=True)
class Image:
    """What the image stage produced: the reference or file training runs, and how it got there."""

    ref: str
    action: str  # native | exists | pulled | cached | fetched | verified


def podman_ref(c: Container) -> str:
    return f"{c.image_ref}@{c.image_digest}"


def sif_path(c: Container, cache: Path) -> Path:
    if c.image_ref and c.image_ref.endswith(".sif"):
        return Path(c.image_ref)
    digest = (c.image_digest or "").split(":", 1)[-1]
    return cache / f"{digest}.sif"


def _run(argv: list[str], deadline: float) -> int:
    left = deadline - time.monotonic()
    if left <= 0:
        raise ImageError("the image stage's time is up")
    try:
        return subprocess.run(argv, stdin=subprocess.DEVNULL, timeout=left, check=False).returncode
    except subprocess.TimeoutExpired:
        raise ImageError(f"{' '.join(argv[:3])} ran past the image stage's time") from None
    except OSError as exc:
        raise ImageError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None


def prepare(c: Container, python: str, cache: Path, deadline: float) -> Image:
    """The image stage. Raises ImageError with the reason."""
    if c.kind == "native":
        argv = [python, "-c", MAXTEXT_CHECK, c.maxtext_version] if c.maxtext_version else [python, "-c", "import maxtext"]
        rc = _run(argv, deadline)
        if rc != 0:
            raise ImageError(f"{python} cannot run the training (maxtext check exit {rc})")
        return Image(python, "native")
    if c.kind in OCI_RUNTIMES:
        ref = podman_ref(c)
        exists = ["podman", "image", "exists", ref] if c.kind == "podman" else ["docker", "image", "inspect", ref]
        if _run(exists, deadline) == 0:
            return Image(ref, "exists")
        rc = _run([c.kind, "pull", ref], deadline)
        if rc != 0:
            raise ImageError(f"{c.kind} pull {ref} failed (exit {rc})")
        return Image(ref, "pulled")
    if c.kind == "apptainer":
        sif = sif_path(c, cache)
        if c.image_ref and c.image_ref.endswith(".sif"):
            _verify_sha256(sif, c.image_digest or "", deadline)
            return Image(str(sif), "verified")

        def fetch(tmp: Path, seconds_left: float) -> None:
            imagecache.run_fetch(["apptainer", "pull", str(tmp), f"docker://{c.image_ref}@{c.image_digest}"],
                                 seconds_left)

        ready = imagecache.ensure(sif.parent, sif.name, fetch, lambda tmp: None, deadline)
        return Image(str(ready.path), ready.action)
    raise ImageError(f"unknown runtime.container {c.kind!r}")


def _verify_sha256(path: Path, digest: str, deadline: float = float("inf")) -> None:
    """A SIF is 10-30 GB: hashed in chunks (never held in memory), the stage's deadline checked between them."""
    sha = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(8 << 20), b""):
                sha.update(chunk)
                if time.monotonic() >= deadline:
                    raise ImageError(f"image {path}: still hashing it when the image stage's time was up")
    except OSError as exc:
        raise ImageError(f"image {path}: {exc.strerror or exc}") from None
    actual = sha.hexdigest()
    if f"sha256:{actual}" != digest:
        raise ImageError(f"image {path} has digest sha256:{actual}, the spec pins {digest}")


def allocated_gpus(env: Mapping[str, str]) -> list[int] | None:
    """Slurm's global GPU indices for this task (the visible-device variables may be renumbered);
    None when nothing says which (a local run: every GPU of the machine is the run's)."""
    for name in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        value = env.get(name, "")
        if value:
            return [int(x) for x in value.split(",") if x.strip().isdigit()]
    return None


def kfd_render_minors(kfd_nodes: Path) -> list[int]:
    """DRM render minors of the GPU agents, in GPU index order (KFD topology; CPU agents have gpu_id 0)."""
    minors: list[int] = []
    n = 0
    while (kfd_nodes / str(n) / "properties").exists():
        node = kfd_nodes / str(n)
        n += 1
        # bounded, undecodable bytes replaced; a node whose files make no sense is skipped, never fatal
        text, gpu_id = sysread.read_text(node / "properties", 1 << 20), sysread.read_text(node / "gpu_id", 256)
        props = {}
        for line in (text or "").splitlines():
            words = line.split()
            if len(words) == 2:
                props[words[0]] = words[1]
        minor = props.get("drm_render_minor", "")
        if gpu_id not in (None, "", "0") and minor.isdigit():
            minors.append(int(minor))
    return minors


def podman_devices(vendor: str, gpus: list[int] | None, kfd_nodes: Path) -> list[str]:
    """The GPU devices a podman/docker container gets: the task's (``gpus``), or every one (None)."""
    if vendor == "nvidia":
        return ["--device=nvidia.com/gpu=all"] if gpus is None else [f"--device=nvidia.com/gpu={i}" for i in gpus]
    if vendor == "amd":
        minors = kfd_render_minors(kfd_nodes)
        if gpus is None:
            return ["--device=/dev/kfd"] + [f"--device=/dev/dri/renderD{minor}" for minor in minors]
        return ["--device=/dev/kfd"] + [
            f"--device=/dev/dri/renderD{minors[i] if i < len(minors) else 128 + i}" for i in gpus]
    return []


@dataclass(frozen=True)
class Launch:
    """How training starts: the command prefix (``<prefix> -m module args``), and for containers
    the variables envmerge.py gets (``request``) and the optional mounts left out."""

    prefix: list[str]
    request: list[tuple[str, str, str]]
    skipped_mounts: list[str]


def container_env(c: Container, env: Mapping[str, str], spec_env: list[tuple[str, str]], modes: Mapping[str, str],
                  code_path: str | None, passed: Sequence[str] = ()) -> list[tuple[str, str, str]]:
    """What a container's envmerge.py joins, in order, as (name, value, mode): the ``passed``
    variables (env.pass) of the node's environment ``env``, replacing the image's; the spec's values
    as written (the image's, or a passed one, join them there, as ``modes`` says); the node's facts
    from ``env`` (apptainer: and the GPUs Slurm gave the task); the code checkout first on PYTHONPATH.
    Nothing else of the node's environment enters the container (envboundary.py).

    The precedence is a native run's (rank.py): the node's per-rank facts (coordinator, rank,
    network interface, MXC_*) are set after the spec's values and win over them, or every
    container rank would say it is the spec's constant; the GPU visibility Slurm gives is only
    inherited, so a spec's own value wins there."""
    spec_names = {name for name, _ in spec_env}
    out = [(name, env[name], "replace") for name in passed if name in env]
    out += [(name, value, modes.get(name, "replace")) for name, value in spec_env]
    out += [(name, env[name], "replace") for name in PODMAN_PASSED if name in env]
    if c.kind == "apptainer":
        out += [(name, env[name], "replace") for name in GPU_VISIBILITY if name in env and name not in spec_names]
    if code_path:
        out.append(("PYTHONPATH", code_path, "prepend"))
    return out


def mounts(c: Container, exists: Callable[[str], bool] = os.path.exists) -> tuple[list[str], list[str]]:
    """(the mounts made, the optional ones skipped because their host path is absent on this node)."""
    skipped = [m for m in c.optional_mounts if not exists(m.split(":", 1)[0])]
    return [*c.mounts, *(m for m in c.optional_mounts if m not in skipped)], skipped


def launcher(c: Container, python: str, image: Image, env: Mapping[str, str], run_dir: Path, output_dir: Path,
             code_dir: str | None, spec_env: list[tuple[str, str]], modes: Mapping[str, str], code_path: str | None,
             node_dir: Path, request_file: Path, kfd_nodes: Path = Path("/sys/class/kfd/kfd/topology/nodes"),
             exists: Callable[[str], bool] = os.path.exists, workdir: str | None = None,
             passed: Sequence[str] = ()) -> Launch:
    """The command prefix that runs the training's Python (``<prefix> -m module args``). ``workdir``:
    where the image's own MaxText lives (code.from_image, no checkout), the container's working directory."""
    if c.kind == "native":
        return Launch([python], [], [])
    binds, skipped = mounts(c, exists)
    node = str(node_dir)
    shim = ["python3", f"{node}/envmerge.py", str(request_file), "--", "python3"]
    request = container_env(c, env, spec_env, modes, code_path, passed)
    if c.kind in OCI_RUNTIMES:
        argv = [c.kind, "run", "--rm", "--network=host", "--ipc=host", "--security-opt=label=disable"]
        argv += podman_devices(c.gpu_vendor, allocated_gpus(env), kfd_nodes)
        argv += c.options
        argv += ["--volume", f"{run_dir}:{run_dir}", "--volume", f"{output_dir}:{output_dir}",
                 "--volume", f"{node}:{node}:ro"]
        for mount in binds:
            argv += ["--volume", mount]
        if c.kind == "docker":  # docker runs as root unless told: files in the run directory stay the user's
            argv += [f"--user={os.getuid()}:{os.getgid()}"]
        if code_dir:
            argv += ["--volume", f"{code_dir}:{code_dir}:ro", "--workdir", code_dir]
        elif workdir:
            argv += ["--workdir", workdir]
        return Launch([*argv, image.ref, *shim], request, skipped)
    gpu = {"amd": ["--rocm"], "nvidia": ["--nv"]}.get(c.gpu_vendor, []) if c.gpu_libraries else []
    argv = ["apptainer", "exec", "--cleanenv", *gpu, *c.options, "--bind", str(run_dir), "--bind", str(output_dir),
            "--bind", f"{node}:{node}:ro"]
    for mount in binds:
        argv += ["--bind", mount]
    if code_dir:
        argv += ["--bind", f"{code_dir}:{code_dir}:ro", "--pwd", code_dir]
    elif workdir:
        argv += ["--pwd", workdir]
    return Launch([*argv, image.ref, *shim], request, skipped)


def write_launch(run: Path, rank: int, attempt: int, contract: RunContract, launch: Launch,
                 train_env: Mapping[str, str], crossed: Mapping[str, Any] | None = None) -> None:
    """The rank's launch files: launch.json (container, optional mounts skipped); for a container,
    envmerge.py's request; natively, the environment training starts with (in a container,
    envmerge.py writes that itself, once it has joined the image's), with the names ``crossed`` from
    the node's environment besides the base (envboundary.py)."""
    layout.rank_dir(run, rank).mkdir(parents=True, exist_ok=True)
    record = str(layout.environment(run, rank))
    if contract.container.kind == "native":
        envmerge.write_effective(record, train_env, crossed)
    else:
        envmerge.write_request(str(layout.env_request(run, rank, attempt)), launch.request, record, crossed)
    atomicfile.write_json(layout.launch(run, rank), {"attempt": attempt, "container": contract.container.kind,
                                                     "skipped_mounts": launch.skipped_mounts})
