"""Container options judged like environment variables (issue 25): capabilities, devices, mounts and
groups that give the container the host are refused unless the spec lists each in
``runtime.allow_dangerous``, which `mxc check`, `mxc build` and `mxc show` report; paths must be
canonical (``/dev/../etc/shadow`` is judged as what it means, never as what it looks like).

On c388a5b every option below built and `mxc check` said ok (only ``privileged`` was reported).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import Mxc
from tests.test_attacks_input import compile_files, errors_of
from tests.test_containers import COMMIT, CONTAINER_SPEC, DIGEST


def spec(runtime: str, kind: str = "podman") -> dict[str, str | bytes]:
    """test_containers.py's container spec with ``runtime`` added to its runtime section."""
    return {"spec.yaml": CONTAINER_SPEC.format(kind=kind, env_extra="", runtime_extra=runtime, resources_extra="",
                                               ref="registry.example/maxtext:rocm", digest=DIGEST, commit=COMMIT)}


def options(**fields: str) -> str:
    return "  container_options:\n" + "".join(f"    {k}: {v}\n" for k, v in fields.items())


DANGEROUS = [
    # (runtime section, the opt-in entry, the key reported, why)
    (options(cap_add="[ALL]"), "cap_add:ALL", "container_options.cap_add.0", "as good as --privileged"),
    (options(cap_add="[SYS_PTRACE, SYS_ADMIN]"), "cap_add:SYS_ADMIN", "container_options.cap_add.1",
     "CAP_SYS_ADMIN reaches outside"),
    (options(cap_add="[SYS_MODULE]"), "cap_add:SYS_MODULE", "container_options.cap_add.0", "CAP_SYS_MODULE"),
    (options(cap_add="[SYS_RAWIO]"), "cap_add:SYS_RAWIO", "container_options.cap_add.0", "CAP_SYS_RAWIO"),
    (options(cap_add="[DAC_READ_SEARCH]"), "cap_add:DAC_READ_SEARCH", "container_options.cap_add.0",
     "CAP_DAC_READ_SEARCH"),
    (options(cap_add="[NET_ADMIN]"), "cap_add:NET_ADMIN", "container_options.cap_add.0", "CAP_NET_ADMIN"),
    (options(cap_add="[BPF]"), "cap_add:BPF", "container_options.cap_add.0", "CAP_BPF"),
    ("  mounts: ['/:/host']\n", "mounts:/:/host", "mounts.0", "the host's whole file system"),
    ("  mounts: ['/etc:/etc']\n", "mounts:/etc:/etc", "mounts.0", "/etc is the host's own"),
    ("  mounts: ['/data:/data', '/etc/ssl:/etc/ssl:ro']\n", "mounts:/etc/ssl:/etc/ssl:ro", "mounts.1", "/etc/ssl"),
    ("  mounts: ['/run/podman/podman.sock:/run/podman/podman.sock']\n",
     "mounts:/run/podman/podman.sock:/run/podman/podman.sock", "mounts.0", "the host's own"),
    ("  mounts: ['/var/run/docker.sock:/var/run/docker.sock']\n", "mounts:/var/run/docker.sock:/var/run/docker.sock",
     "mounts.0", "the host's own"),
    ("  mounts: ['/srv/api.sock:/api.sock']\n", "mounts:/srv/api.sock:/api.sock", "mounts.0", "is a socket"),
    ("  mounts: ['/home/alice/.ssh:/keys:ro']\n", "mounts:/home/alice/.ssh:/keys:ro", "mounts.0",
     r"holds credentials \(\.ssh\)"),
    ("  mounts: ['/home/alice:/home/alice']\n", "mounts:/home/alice:/home/alice", "mounts.0", "a whole home directory"),
    ("  mounts: ['/proc/1/root:/hostroot']\n", "mounts:/proc/1/root:/hostroot", "mounts.0", "/proc/1/root is the host"),
    ("  mounts: ['/root:/root']\n", "mounts:/root:/root", "mounts.0", "the host's own"),
    ("  optional_mounts: ['/dev:/dev']\n", "optional_mounts:/dev:/dev", "optional_mounts.0", "every host device"),
    ("  optional_mounts: ['/dev/sda1:/dev/sda1']\n", "optional_mounts:/dev/sda1:/dev/sda1", "optional_mounts.0",
     "a host disk"),
    (options(devices="[/dev/mem]"), "devices:/dev/mem", "container_options.devices.0", "the host's memory"),
    (options(devices="[/dev/kmem]"), "devices:/dev/kmem", "container_options.devices.0", "the host's memory"),
    (options(devices="[/dev/port]"), "devices:/dev/port", "container_options.devices.0", "I/O ports"),
    (options(devices="[/dev/cpu/0/msr]"), "devices:/dev/cpu/0/msr", "container_options.devices.0", "CPU registers"),
    (options(devices="[/dev/infiniband, /dev/sda]"), "devices:/dev/sda", "container_options.devices.1", "a host disk"),
    (options(devices="[/dev/nvme0n1]"), "devices:/dev/nvme0n1", "container_options.devices.0", "a host disk"),
    (options(devices="[/dev/mapper/root]"), "devices:/dev/mapper/root", "container_options.devices.0", "a host disk"),
    (options(devices="[/dev/watchdog]"), "devices:/dev/watchdog", "container_options.devices.0",
     "not a GPU, RDMA or accelerator device"),
    (options(group_add='["0"]'), "group_add:0", "container_options.group_add.0", "gid 0 is root"),
    (options(group_add="[root]"), "group_add:root", "container_options.group_add.0", "group root owns"),
    (options(group_add="[video, disk]"), "group_add:disk", "container_options.group_add.1", "group disk owns"),
    (options(group_add="[docker]"), "group_add:docker", "container_options.group_add.0", "group docker owns"),
    (options(group_add="[shadow]"), "group_add:shadow", "container_options.group_add.0", "group shadow owns"),
    (options(group_add='["6"]'), "group_add:6", "container_options.group_add.0", "gid 6 is disk"),
]


@pytest.mark.parametrize("runtime, entry, key, why", DANGEROUS, ids=[d[1] for d in DANGEROUS])
def test_options_that_give_the_host_away_need_the_opt_in(runtime: str, entry: str, key: str, why: str) -> None:
    errors = errors_of(spec(runtime))
    assert len(errors) == 1, errors
    assert re.match(rf"^spec\.yaml:\d+: runtime\.{re.escape(key)}: .*{why}.*; to give it anyway, list "
                    rf"'{re.escape(entry)}' in runtime\.allow_dangerous", errors[0]), errors
    # listed, it builds, and the opt-in is in the spec (so in the bundle's hash)
    bundle = compile_files(spec(runtime + f"  allow_dangerous: ['{entry}']\n"))
    assert bundle.spec.runtime.allow_dangerous == [entry]  # type: ignore[attr-defined]


def test_apptainer_add_caps_are_judged_the_same() -> None:
    errors = errors_of(spec(options(cap_add="[SYS_ADMIN]"), kind="apptainer"))
    assert errors and "runtime.container_options.cap_add.0: CAP_SYS_ADMIN reaches outside" in errors[0]
    compile_files(spec(options(cap_add="[SYS_ADMIN]") + "  allow_dangerous: ['cap_add:SYS_ADMIN']\n",
                       kind="apptainer"))


@pytest.mark.parametrize("runtime, key, meant", [
    (options(devices="[/dev/../etc/shadow]"), "container_options.devices.0", "/etc/shadow"),
    (options(devices="[/dev/dri/../sda]"), "container_options.devices.0", "/dev/sda"),
    (options(devices="[/dev/./mem]"), "container_options.devices.0", "/dev/mem"),
    (options(devices="['/dev//mem']"), "container_options.devices.0", "/dev/mem"),
    (options(devices="[/dev/infiniband/]"), "container_options.devices.0", "/dev/infiniband"),
    ("  mounts: ['/data/../etc:/etc']\n", "mounts.0", "/etc"),
    ("  mounts: ['//:/host']\n", "mounts.0", "/"),
    ("  mounts: ['/data:/data/../../etc']\n", "mounts.0", "/etc"),
    ("  optional_mounts: ['/opt/rdma/../../dev:/dev']\n", "optional_mounts.0", "/dev"),
])
def test_paths_must_be_canonical_whatever_the_opt_in(runtime: str, key: str, meant: str) -> None:
    entry = next(line.split("'")[1] if "'" in line else line.split("[")[1].rstrip("]")
                 for line in runtime.splitlines() if "[" in line)
    field = key.split(".")[-2]
    for extra in ("", f"  allow_dangerous: ['{field}:{entry}']\n"):
        errors = errors_of(spec(runtime + extra))
        assert any(re.search(rf"runtime\.{re.escape(key)}: .* is not a canonical path .*: it means "
                             rf"'{re.escape(meant)}'", e) for e in errors), errors


def test_unknown_capabilities_and_stale_opt_ins_are_errors() -> None:
    assert "runtime.container_options.cap_add.0: SYS_OWN is not a Linux capability" in \
        errors_of(spec(options(cap_add="[SYS_OWN]")))[0]
    stale = errors_of(spec("  allow_dangerous: ['mounts:/:/host']\n"))
    assert stale and "runtime.allow_dangerous: 'mounts:/:/host' names nothing dangerous this spec uses" in stale[0]
    assert "runtime.allow_dangerous: 'ALL': expected field:value" in errors_of(spec("  allow_dangerous: [ALL]\n"))[0]


def test_what_training_needs_builds_without_an_opt_in() -> None:
    compile_files(spec(
        "  mounts: [/data:/data:ro, /models:/models, /home/alice/datasets:/datasets, /opt/rocm:/opt/rocm:ro,"
        " /dev/shm:/dev/shm]\n"
        "  optional_mounts: [/dev/infiniband:/dev/infiniband, /opt/site-rdma:/opt/site-rdma:ro]\n"
        + options(devices="[/dev/infiniband, /dev/kfd, /dev/dri/renderD128, /dev/infiniband/uverbs0, /dev/fuse]",
                  group_add="[keep-groups, video, render, '1234']",
                  cap_add="[SYS_PTRACE, IPC_LOCK, SYS_NICE, SYS_RESOURCE]")))
    compile_files(spec(options(devices="[/dev/nvidia0, /dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-caps/nvidia-cap1]"),
                       kind="docker"))


def test_check_shows_the_refusal_as_an_error_and_the_opt_in_as_a_note(mxc: Mxc, mxc_home: Path,
                                                                      tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(str(spec(options(cap_add="[SYS_ADMIN]") + "  mounts: ['/:/host']\n")["spec.yaml"]))
    checked = mxc("check", str(path), cwd=tmp_path)
    assert checked.returncode == 1, checked.stdout
    assert re.search(r"spec\.yaml:\d+: runtime\.container_options\.cap_add\.0: error\[schema\]: CAP_SYS_ADMIN",
                     checked.stdout), checked.stdout
    built = mxc("build", str(path), cwd=tmp_path)
    assert built.returncode == 2 and "CAP_SYS_ADMIN reaches outside" in built.stderr
    assert not (mxc_home / "bundles").exists() or not any((mxc_home / "bundles").iterdir())

    path.write_text(str(spec(options(cap_add="[SYS_ADMIN]") + "  mounts: ['/:/host']\n"
                             "  allow_dangerous: ['cap_add:SYS_ADMIN', 'mounts:/:/host']\n")["spec.yaml"]))
    built = mxc("build", str(path), cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    notice = "runtime.allow_dangerous: cap_add:SYS_ADMIN, mounts:/:/host given to the container on purpose"
    assert f"mxc: warning: {notice}" in built.stderr
    shown = mxc("show", built.stdout.strip()[:12])
    assert f"warning: {notice}" in shown.stdout
    checked = mxc("check", str(path), cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout
    notes = re.findall(r"runtime\.allow_dangerous\.(\d): note\[container-dangerous\]: (\S+) is given to the podman "
                       r"container on purpose", checked.stdout)
    assert notes == [("0", "cap_add:SYS_ADMIN"), ("1", "mounts:/:/host")], checked.stdout
