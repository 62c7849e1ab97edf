"""Containers: environment precedence (the spec's values joined with the image's by one rule
everywhere), runtime options per container kind, docker, optional mounts, Slurm's own variables.

Command lines are computed from rendered bundles (their run.json) by the node program's own code;
podman's and docker's are executed here with a locally built image whose Containerfile sets XLA_FLAGS
(docker through Podman's Docker-compatible API: there is no Docker daemon here).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mxc.node import container, envmerge, layout
from mxc.node.contract import RunContract, parse
from mxc.node.imagecache import ImageError
from mxc.store import Store
from tests.conftest import Mxc
from tests.test_images import podman, podman_env

__all__ = ["podman_env"]  # the fixture, imported for the tests below

DIGEST = "sha256:" + "ab" * 32
COMMIT = "c" * 40
CONTAINER_SPEC = """\
schema: mxc/v1
name: ctr
image:
  ref: {ref}
  digest: {digest}
code:
  repo: https://github.com/AI-Hypercomputer/maxtext.git
  commit: {commit}
model:
  model_name: default
  overrides:
    steps: 5
env:
  vars:
    NCCL_DEBUG: WARN
    LD_LIBRARY_PATH: /spec/lib
  xla_flags:
    xla_gpu_enable_latency_hiding_scheduler: true
{env_extra}resources:
  gpus_per_node: 2
  gpu_vendor: amd
{resources_extra}runtime:
  container: {kind}
{runtime_extra}"""


def write_spec(directory: Path, kind: str, *, env_extra: str = "", runtime_extra: str = "",
               resources_extra: str = "", ref: str = "registry.example/maxtext:rocm", digest: str = DIGEST) -> Path:
    path = directory / f"{kind}.yaml"
    path.write_text(CONTAINER_SPEC.format(kind=kind, env_extra=env_extra, runtime_extra=runtime_extra,
                                          resources_extra=resources_extra, ref=ref, digest=digest, commit=COMMIT))
    return path


def build(mxc: Mxc, mxc_home: Path, spec: Path) -> Path:
    out = mxc("build", str(spec), "-q", cwd=spec.parent)
    assert out.returncode == 0, out.stderr
    return mxc_home / "bundles" / out.stdout.strip().splitlines()[-1]


def contract_of(bundle: Path) -> RunContract:
    return parse((bundle / "run.json").read_text())


def launch(contract: RunContract, bundle: Path, run: Path, env: dict[str, str] | None = None,
           present: tuple[str, ...] = (), image: str | None = None, code: str | None = None) -> container.Launch:
    """What the node program would start for rank 0 of ``contract`` (no training here)."""
    ref = image or container.podman_ref(contract.container)
    return container.launcher(contract.container, "python3", container.Image(ref, "exists"), env or {}, run,
                              run / "output", code, list(contract.env_of(0)), dict(contract.env_merge),
                              f"{code}/src" if code else None, bundle / "mxc_node", layout.env_request(run, 0, 0),
                              exists=lambda path: path in present)


# ---- the rule -------------------------------------------------------------------------------------


def test_compose_appends_prepends_and_replaces_with_the_right_separator(tmp_path: Path) -> None:
    base = {"XLA_FLAGS": "--xla_image=1", "LD_LIBRARY_PATH": "/image/lib", "NCCL_DEBUG": "INFO", "KEEP": "k"}
    values = [("XLA_FLAGS", "--xla_spec=2"), ("LD_LIBRARY_PATH", "/spec/lib"), ("NCCL_DEBUG", "WARN"), ("NEW", "n")]
    env = envmerge.compose(base, values, {"XLA_FLAGS": "append", "LD_LIBRARY_PATH": "prepend"})
    assert env == {"XLA_FLAGS": "--xla_image=1 --xla_spec=2", "LD_LIBRARY_PATH": "/spec/lib:/image/lib",
                   "NCCL_DEBUG": "WARN", "KEEP": "k", "NEW": "n"}
    # Nothing to join: no stray separator either way; an empty spec value keeps the image's.
    assert envmerge.compose({}, [("XLA_FLAGS", "--a")], {"XLA_FLAGS": "append"}) == {"XLA_FLAGS": "--a"}
    assert envmerge.compose({"PATH": "/bin"}, [("PATH", "")], {"PATH": "append"}) == {"PATH": "/bin"}
    assert envmerge.compose({"X": "a"}, [("X", "b")], {}) == {"X": "b"}
    # In order, each against the value so far: the code checkout goes before the spec's PYTHONPATH.
    assert envmerge.apply({"PYTHONPATH": "/image"}, [("PYTHONPATH", "/spec", "append"),
                                                     ("PYTHONPATH", "/code/src", "prepend")]) == \
        {"PYTHONPATH": "/code/src:/image:/spec"}
    # What is written of it leaves out names that may hold a secret, privately.
    envmerge.write_effective(str(tmp_path / "env.json"), {"HF_TOKEN": "x", "WANDB_API_KEY": "y", "NCCL_DEBUG": "WARN"})
    assert json.loads((tmp_path / "env.json").read_text()) == {"environment": {"NCCL_DEBUG": "WARN"}}
    assert (tmp_path / "env.json").stat().st_mode & 0o777 == 0o600
    with pytest.raises(ValueError, match="unknown merge mode"):
        envmerge.compose({}, [("X", "b")], {"X": "merge"})


def test_run_json_appends_xla_flags_by_default_and_env_merge_decides_per_variable(mxc: Mxc, mxc_home: Path,
                                                                                  tmp_path: Path) -> None:
    plain = contract_of(build(mxc, mxc_home, write_spec(tmp_path, "podman")))
    # the defaults: the spec's flags after the image's, its library directory before the driver's
    assert plain.env_merge == [("LD_LIBRARY_PATH", "prepend"), ("XLA_FLAGS", "append")]
    spec = write_spec(tmp_path, "podman", env_extra="  merge:\n    XLA_FLAGS: replace\n    LD_LIBRARY_PATH: append\n")
    merged = contract_of(build(mxc, mxc_home, spec))
    assert merged.env_merge == [("LD_LIBRARY_PATH", "append")]  # replace is the absence of a mode


# ---- command lines from rendered bundles -----------------------------------------------------------

OPTIONS = """\
  optional_mounts: [/dev/infiniband:/dev/infiniband, /opt/site-rdma:/opt/site-rdma:ro]
  mounts: [/data:/data:ro]
  container_options:
    devices: [/dev/infiniband]
    group_add: [{group}]
    ulimits: {{memlock: -1, nofile: "1048576", stack: "8192:-1"}}
    cap_add: [SYS_PTRACE]
"""


@pytest.mark.parametrize("kind", ["podman", "docker"])
def test_podman_and_docker_command_lines(kind: str, mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    group = "keep-groups" if kind == "podman" else "video"
    bundle = build(mxc, mxc_home, write_spec(tmp_path, kind, runtime_extra=OPTIONS.format(group=group)))
    contract, run, node = contract_of(bundle), tmp_path / "run", bundle / "mxc_node"
    started = launch(contract, bundle, run, {"SLURM_STEP_GPUS": "1", "NNODES": "2", "CUDA_VISIBLE_DEVICES": "1"},
                     present=("/dev/infiniband",))
    user = [f"--user={os.getuid()}:{os.getgid()}"] if kind == "docker" else []
    assert started.prefix == [
        kind, "run", "--rm", "--network=host", "--ipc=host", "--security-opt=label=disable",
        "--device=/dev/kfd", "--device=/dev/dri/renderD129",
        "--device=/dev/infiniband", f"--group-add={group}", "--ulimit=memlock=-1:-1", "--ulimit=nofile=1048576:1048576",
        "--ulimit=stack=8192:-1", "--cap-add=SYS_PTRACE",
        "--volume", f"{run}:{run}", "--volume", f"{run / 'output'}:{run / 'output'}", "--volume", f"{node}:{node}:ro",
        "--volume", "/data:/data:ro", "--volume", "/dev/infiniband:/dev/infiniband", *user,
        f"registry.example/maxtext:rocm@{DIGEST}",
        "python3", f"{node}/envmerge.py", str(run / "ranks/0/env-request.attempt-0.json"), "--", "python3"]
    assert started.skipped_mounts == ["/opt/site-rdma:/opt/site-rdma:ro"]
    # No variable on the command line: the spec's values and the node's facts go to envmerge.py.
    assert not any(arg.startswith("--env") for arg in started.prefix)
    request = {name: (value, mode) for name, value, mode in started.request}
    assert request["NCCL_DEBUG"] == ("WARN", "replace") and request["NNODES"] == ("2", "replace")
    assert request["XLA_FLAGS"] == ("--xla_gpu_enable_latency_hiding_scheduler=true", "append")
    assert "CUDA_VISIBLE_DEVICES" not in request  # the container numbers its mapped GPUs from 0


def test_apptainer_command_line_cleanenv_and_without_gpu_libraries(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    extra = "  container_options:\n    gpu_libraries: false\n    cap_add: [SYS_PTRACE, IPC_LOCK]\n" \
            "  optional_mounts: [/dev/infiniband:/dev/infiniband]\n"
    bundle = build(mxc, mxc_home, write_spec(tmp_path, "apptainer", runtime_extra=extra))
    contract, run, node = contract_of(bundle), tmp_path / "run", bundle / "mxc_node"
    started = launch(contract, bundle, run, {"ROCR_VISIBLE_DEVICES": "2,3", "NNODES": "2"}, image="/images/x.sif")
    assert started.prefix == [
        "apptainer", "exec", "--cleanenv", "--add-caps=CAP_SYS_PTRACE,CAP_IPC_LOCK",
        "--bind", str(run), "--bind", str(run / "output"), "--bind", f"{node}:{node}:ro", "/images/x.sif",
        "python3", f"{node}/envmerge.py", str(run / "ranks/0/env-request.attempt-0.json"), "--", "python3"]
    assert started.skipped_mounts == ["/dev/infiniband:/dev/infiniband"]
    # --cleanenv: the GPUs Slurm gave the task are passed on explicitly.
    assert ("ROCR_VISIBLE_DEVICES", "2,3", "replace") in started.request
    default = contract_of(build(mxc, mxc_home, write_spec(tmp_path, "apptainer")))
    assert launch(default, bundle, run, image="/x.sif").prefix[:4] == ["apptainer", "exec", "--cleanenv", "--rocm"]


@pytest.mark.parametrize(("kind", "options", "expected"), [
    ("apptainer", "    privileged: true\n", "runtime.container_options.privileged: apptainer has no --privileged"),
    ("docker", "    group_add: [keep-groups]\n", "runtime.container_options.group_add: keep-groups is podman's"),
    ("podman", "    gpu_libraries: false\n", "runtime.container_options.gpu_libraries: only apptainer binds"),
    ("apptainer", "    ulimits: {nofile: '1:2'}\n", "runtime.container_options.ulimits: apptainer runs with the limits"),
    ("podman", "    ulimits: {nofiles: '1'}\n", "runtime.container_options.ulimits.nofiles"),
    ("podman", "    ulimits: {nofile: -2}\n", "runtime.container_options.ulimits.nofile"),
    ("podman", "    devices: ['/dev/x y']\n", "runtime.container_options.devices.0"),
    # podman: "cannot set shmsize when running in the {host } IPC Namespace" (4.3.1, measured here)
    ("podman", "    shm_size: 64g\n", "runtime.container_options.shm_size: mxc runs podman with --ipc=host"),
    ("docker", "    shm_size: 64g\n", "runtime.container_options.shm_size: mxc runs docker with --ipc=host"),
    # podman: "ulimit soft limit must be less than or equal to hard limit"
    ("podman", "    ulimits: {nofile: '2048:1024'}\n", "runtime.container_options.ulimits.nofile: soft limit 2048"),
    ("docker", "    ulimits: {core: '-1:100'}\n", "runtime.container_options.ulimits.core: soft limit -1"),
])
def test_container_options_a_runtime_cannot_take_fail_at_build(kind: str, options: str, expected: str, mxc: Mxc,
                                                                tmp_path: Path) -> None:
    spec = write_spec(tmp_path, kind, runtime_extra="  container_options:\n" + options)
    out = mxc("build", str(spec), cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"{kind}.yaml:" in out.stderr and expected in out.stderr, out.stderr


def test_privileged_builds_only_when_asked_and_check_reports_it(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "podman", runtime_extra="  container_options:\n    privileged: true\n")
    built = mxc("build", str(spec), "-q", cwd=tmp_path)
    assert built.returncode == 0 and "the podman container runs --privileged" in built.stderr, built.stderr
    bundle = built.stdout.strip().splitlines()[-1]
    assert "--privileged" in json.loads((mxc_home / "bundles" / bundle / "run.json").read_text())["container"]["options"]
    shown = mxc("show", bundle[:12], cwd=tmp_path)
    assert "warning: runtime.container_options.privileged" in shown.stdout, shown.stdout + shown.stderr
    out = mxc("check", str(spec), cwd=tmp_path)
    assert "runtime.container_options.privileged: warning[container-privileged]" in out.stdout + out.stderr, \
        out.stdout + out.stderr


def test_env_merge_of_a_variable_the_spec_does_not_set_is_an_error(mxc: Mxc, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "podman", env_extra="  merge:\n    PATH: prepend\n")
    out = mxc("build", str(spec), cwd=tmp_path)
    assert out.returncode == 2 and "env.merge.PATH: the spec does not set PATH" in out.stderr, out.stderr


# ---- Slurm's own variables -----------------------------------------------------------------------


def test_slurm_env_is_exported_before_the_job_step_and_validated(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "podman", resources_extra="  slurm_env:\n    SLURM_TREE_WIDTH: 128\n"
                      "    PMIX_MCA_gds: \"hash\"\n", runtime_extra="  backend: slurm\n")
    script = (build(mxc, mxc_home, spec) / "job.sbatch").read_text()
    lines = script.splitlines()
    exports = [i for i, line in enumerate(lines) if line.startswith("export ")]
    start = next(i for i, line in enumerate(lines) if line.startswith("exec "))
    assert [lines[i] for i in exports if i < start] == ["export PMIX_MCA_gds='hash'", "export SLURM_TREE_WIDTH='128'"]
    for name, why in [("SLURM_PROCID", "Slurm sets it for the job itself"), ("SLURM_JOB_ID", "Slurm sets it"),
                      ("NCCL_DEBUG", "not a Slurm input variable")]:
        bad = write_spec(tmp_path, "podman", resources_extra=f"  slurm_env:\n    {name}: '1'\n")
        out = mxc("build", str(bad), cwd=tmp_path)
        assert out.returncode == 2 and "resources.slurm_env" in out.stderr and why in out.stderr, out.stderr
    # one line: a value that ends in a newline is refused too ("$" matches before a final newline)
    newline = write_spec(tmp_path, "podman", resources_extra='  slurm_env:\n    SLURM_TREE_WIDTH: "128\\n"\n')
    out = mxc("build", str(newline), cwd=tmp_path)
    assert out.returncode == 2 and "'SLURM_TREE_WIDTH': a value must be one line" in out.stderr, out.stderr


# ---- executed with podman: an image that sets XLA_FLAGS -------------------------------------------

CONTAINERFILE = """\
FROM scratch
ADD rootfs.tar /
ENV PATH=/usr/local/bin:/usr/bin LANG=C.UTF-8 XLA_FLAGS=--xla_image_flag=1 LD_LIBRARY_PATH=/image/lib
"""
SHOW_ENV = ("import json, os; print('ENV=' + json.dumps("
            "{k: os.environ.get(k) for k in ('XLA_FLAGS', 'LD_LIBRARY_PATH', 'NCCL_DEBUG', 'PYTHONPATH')}))")


@pytest.fixture(scope="module")
def xla_image(podman_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A local image (a CPython rootfs, FROM scratch) whose own environment sets XLA_FLAGS and
    LD_LIBRARY_PATH: (reference, digest)."""
    from mxc.images.rootfs import build_rootfs

    context = tmp_path_factory.mktemp("xla-image")
    build_rootfs(context / "rootfs.tar")
    (context / "Containerfile").write_text(CONTAINERFILE)
    tag = "localhost/mxc-test/xla-env:v1"
    built = podman(podman_env, "build", "--network=none", "-t", tag, "-f", str(context / "Containerfile"), str(context),
                   timeout=900)
    assert built.returncode == 0, built.stderr[-3000:]
    digest = podman(podman_env, "image", "inspect", "--format", "{{.Digest}}", tag).stdout.strip()
    assert digest.startswith("sha256:"), digest
    return "localhost/mxc-test/xla-env", digest


@pytest.fixture(scope="module")
def docker_env(podman_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The docker client against Podman's Docker-compatible API over the same image store (there is
    no Docker daemon here): the docker command line runs for real."""
    sock = tmp_path_factory.mktemp("docker") / "api.sock"
    service = subprocess.Popen(["podman", "system", "service", "--time=0", f"unix://{sock}"],
                               env={**os.environ, **podman_env}, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    env = {**podman_env, "DOCKER_HOST": f"unix://{sock}"}
    try:
        deadline = time.monotonic() + 60  # a safety net: the socket appearing is the event waited for
        while not sock.exists():
            assert service.poll() is None, "podman system service exited"
            assert time.monotonic() < deadline, "podman system service did not open its socket"
            time.sleep(0.05)
        yield env
    finally:
        service.terminate()
        service.wait(timeout=60)


@pytest.mark.parametrize("kind", ["podman", "docker"])
@pytest.mark.parametrize(("merge", "expected"), [
    ("", {"XLA_FLAGS": "--xla_image_flag=1 --xla_gpu_enable_latency_hiding_scheduler=true",
          "LD_LIBRARY_PATH": "/spec/lib:/image/lib"}),  # the image's driver path stays
    ("  merge:\n    XLA_FLAGS: replace\n    LD_LIBRARY_PATH: append\n",
     {"XLA_FLAGS": "--xla_gpu_enable_latency_hiding_scheduler=true", "LD_LIBRARY_PATH": "/image/lib:/spec/lib"}),
], ids=["default-append-prepend", "replace"])
def test_the_container_joins_the_images_xla_flags_as_the_spec_says(kind: str, merge: str, expected: dict[str, str],
                                                                   xla_image: tuple[str, str],
                                                                   request: pytest.FixtureRequest, mxc: Mxc,
                                                                   mxc_home: Path, tmp_path: Path) -> None:
    runtime_env: dict[str, str] = request.getfixturevalue("podman_env" if kind == "podman" else "docker_env")
    ref, digest = xla_image
    spec = write_spec(tmp_path, kind, env_extra=merge, ref=ref, digest=digest,
                      runtime_extra="  optional_mounts: [/nonexistent/rdma:/opt/rdma]\n")
    spec.write_text(spec.read_text().replace("gpus_per_node: 2\n  gpu_vendor: amd", "gpus_per_node: 0"))
    bundle = build(mxc, mxc_home, spec)
    contract, run = contract_of(bundle), tmp_path / "run"
    (run / "output").mkdir(parents=True)
    code = tmp_path / "code"
    (code / "src").mkdir(parents=True)
    started = launch(contract, bundle, run, {"NNODES": "1", "PYTHONPATH": "/host/only"}, code=str(code))
    container.write_launch(run, 0, 0, contract, started, {})
    done = subprocess.run([*started.prefix, "-c", SHOW_ENV], env={**os.environ, **runtime_env}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.split("ENV=", 1)[1])
    # The code checkout on PYTHONPATH (the image sets none); the host's own PYTHONPATH stays outside.
    assert seen == {**expected, "NCCL_DEBUG": "WARN", "PYTHONPATH": f"{code}/src"}
    # What the node program records is what training saw; and the skipped mount is kept.
    effective: dict[str, Any] = json.loads(layout.environment(run, 0).read_text())["environment"]
    assert {k: effective[k] for k in expected} == expected and effective["NNODES"] == "1"
    assert json.loads(layout.launch(run, 0).read_text())["skipped_mounts"] == ["/nonexistent/rdma:/opt/rdma"]


# ---- mxc compare: what training saw, run against run ---------------------------------------------


def test_compare_shows_where_the_training_environment_differed(tmp_path: Path) -> None:
    from mxc.runtime.record import RunRecord
    from mxc.runtime.triage.compare import compare_runs
    from tests.test_compare import _fake_run

    runs = []
    for stamp, image_flags, ib in [("20260101-000000-0000", "--xla_image=1", "mlx5_0"),
                                   ("20260101-000001-0000", "--xla_image=2", None)]:
        run = _fake_run(tmp_path, stamp, {"model": {"overrides": {"steps": 3}}}, [6.0, 5.0, 4.0], {})
        run_id = run.run_id
        record = RunRecord.load(run.record)
        env = {"MXC_RUN_DIR": str(run.path), "XLA_FLAGS": f"{image_flags} --xla_dump_to={run.path}/xla-dump",
               "JAX_COORDINATOR_ADDRESS": f"{run_id}:1234", "NCCL_DEBUG": "WARN", **({"NCCL_IB_HCA": ib} if ib else {})}
        record.final = False
        record.training = {"container": "podman", "environment": env}
        run.record.unlink()
        record.save(run.record)
        runs.append((run, record))
    result = compare_runs(Store(tmp_path), runs[0], runs[1])
    drift = {d.what: (d.recorded, d.now) for d in result.drift if d.what.startswith("training env")}
    # The run directories and per-run variables are no difference; the image's flag and a detected HCA are.
    assert drift == {"training env XLA_FLAGS": ("--xla_image=1 --xla_dump_to={run_dir}/xla-dump",
                                                "--xla_image=2 --xla_dump_to={run_dir}/xla-dump"),
                     "training env NCCL_IB_HCA": ("mlx5_0", "unset")}


def test_sourcing_env_sh_joins_like_envmerge(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    """env.sh (for people and tools that source it) follows the same rule as the node program."""
    spec = write_spec(tmp_path, "podman", env_extra="  merge:\n    LD_LIBRARY_PATH: prepend\n")
    bundle = build(mxc, mxc_home, spec)
    contract = contract_of(bundle)
    for base in ({"XLA_FLAGS": "--xla_image=1 'quoted'", "LD_LIBRARY_PATH": "/image/lib"}, {}):
        shown = subprocess.run(["bash", "-c", f'set -eu; source {bundle / "env.sh"}; env -0'],
                               env={"PATH": os.environ["PATH"], **base}, capture_output=True, text=True, check=True)
        sourced = dict(item.split("=", 1) for item in shown.stdout.split("\0") if "=" in item)
        expected = envmerge.compose(base, contract.env, dict(contract.env_merge))
        assert {k: sourced[k] for k in expected} == expected


def test_the_record_keeps_an_allow_listed_redacted_part_of_what_training_saw(tmp_path: Path) -> None:
    from mxc.runtime.provenance import training

    run = tmp_path / "run"
    assert training.rank0(run, {}) is None  # before rank 0 started training
    layout.rank_dir(run, 0).mkdir(parents=True)
    envmerge.write_effective(str(layout.environment(run, 0)), {
        "NCCL_DEBUG": "WARN", "SITE_VAR": "from the spec", "UNRELATED": "x", "HF_TOKEN": "hf_" + "aB3d" * 9,
        "XLA_FLAGS": "--xla_dump_to=/tmp/ghp_" + "a1B2" * 9})
    (layout.launch(run, 0)).write_text(json.dumps({"attempt": 1, "container": "podman", "skipped_mounts": ["/a:/b"]}))
    got = training.rank0(run, {"env": {"vars": {"SITE_VAR": "from the spec"}}})
    assert got == {"attempt": 1, "container": "podman", "skipped_mounts": ["/a:/b"],
                   "environment": {"NCCL_DEBUG": "WARN", "SITE_VAR": "from the spec", "XLA_FLAGS": "--xla_dump_to=/tmp/***"}}


# ---- review findings: precedence as natively, odd sysfs, big images ------------------------------


def test_the_nodes_per_rank_facts_win_over_the_spec_in_a_container_as_natively(mxc: Mxc, mxc_home: Path,
                                                                              tmp_path: Path) -> None:
    """Natively rank.py sets the coordinator, rank and network after composing the spec's values; in a
    container they must win the same way, or every rank says it is the spec's constant."""
    node = {"NODE_RANK": "1", "JAX_PROCESS_ID": "1", "NCCL_SOCKET_IFNAME": "ib0", "CUDA_VISIBLE_DEVICES": "3"}
    spec_env = [("NODE_RANK", "0"), ("JAX_PROCESS_ID", "0"), ("NCCL_SOCKET_IFNAME", "eth0"), ("CUDA_VISIBLE_DEVICES", "0")]
    for kind in ("podman", "apptainer"):
        c = contract_of(build(mxc, mxc_home, write_spec(tmp_path, kind))).container
        seen = envmerge.apply({}, container.container_env(c, node, spec_env, {}, None))
        assert (seen["NODE_RANK"], seen["JAX_PROCESS_ID"], seen["NCCL_SOCKET_IFNAME"]) == ("1", "1", "ib0"), kind
        # GPU visibility is only inherited (apptainer passes Slurm's): a spec's own value wins, as natively
        assert seen["CUDA_VISIBLE_DEVICES"] == "0", kind


def test_odd_kfd_topology_files_are_skipped_never_fatal(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes"
    for n, (props, gpu_id) in enumerate([(b"cpu_cores_count 64\n", b"0\n"),          # a CPU agent
                                         (b"drm_render_minor 128\n", b"1234\n"),      # a GPU
                                         (b"\xff\xfe drm_render_minor \n", b"77\n"),  # undecodable, no value
                                         (b"drm_render_minor x12\n", b"78\n"),        # not a number
                                         (b"drm_render_minor 131\n", b"79\n")]):
        (nodes / str(n)).mkdir(parents=True)
        (nodes / str(n) / "properties").write_bytes(props)
        (nodes / str(n) / "gpu_id").write_bytes(gpu_id)
    assert container.kfd_render_minors(nodes) == [128, 131]
    assert container.podman_devices("amd", [1], nodes) == ["--device=/dev/kfd", "--device=/dev/dri/renderD131"]


def test_a_sif_is_hashed_in_chunks_and_the_stage_deadline_stops_it(tmp_path: Path) -> None:
    import hashlib

    sif = tmp_path / "x.sif"
    with open(sif, "wb") as fh:  # 24 MiB, three chunks
        fh.truncate(24 << 20)
    digest = "sha256:" + hashlib.sha256(bytes(24 << 20)).hexdigest()
    container._verify_sha256(sif, digest)  # the right digest passes
    with pytest.raises(ImageError, match="the spec pins sha256:00"):
        container._verify_sha256(sif, "sha256:" + "0" * 64)
    with pytest.raises(ImageError, match="still hashing it when the image stage's time was up"):
        container._verify_sha256(sif, digest, deadline=time.monotonic() - 1)


def test_a_run_no_allocation_names_gets_every_gpu(tmp_path: Path) -> None:
    """A local podman run (no SLURM_*, no *_VISIBLE_DEVICES) must not start with no GPU at all."""
    nodes = tmp_path / "nodes"
    for n, minor in enumerate((128, 129)):
        (nodes / str(n)).mkdir(parents=True)
        (nodes / str(n) / "properties").write_text(f"drm_render_minor {minor}\n")
        (nodes / str(n) / "gpu_id").write_text(f"{100 + n}\n")
    assert container.allocated_gpus({}) is None and container.allocated_gpus({"SLURM_STEP_GPUS": "1"}) == [1]
    assert container.podman_devices("nvidia", None, nodes) == ["--device=nvidia.com/gpu=all"]
    assert container.podman_devices("amd", None, nodes) == [
        "--device=/dev/kfd", "--device=/dev/dri/renderD128", "--device=/dev/dri/renderD129"]
    assert container.podman_devices("none", None, nodes) == []
