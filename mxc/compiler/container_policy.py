"""Which container options give the host away, and the opt-in that allows them (``runtime.allow_dangerous``).

A container run is isolated only as far as its options allow. ``cap_add: [ALL]`` is nearly
``--privileged``; ``SYS_ADMIN`` mounts file systems, ``SYS_MODULE`` loads kernel modules,
``SYS_RAWIO`` and ``/dev/mem`` read and write the host's memory, a block device (``/dev/sda``) is the
host's disk below every file permission, a mount of ``/``, ``/etc``, ``/proc`` or the podman/docker
socket hands over the host (or another container runtime that starts privileged containers), a mount
of ``~/.ssh`` the user's keys, and ``group_add: [disk]`` or ``docker`` the same through a group. In a
reviewed spec these look like settings. So, as for environment variables (env_policy.py):

- **refused**, no opt-in: a device or mount path that is not canonical (``/dev/../etc/shadow``,
  ``//etc``, ``/data/``: what is judged must be what is bound), a device outside ``/dev``, and a
  capability Linux does not have;
- **dangerous**: the capabilities, devices, mounts and groups below; a spec may use one when it also
  lists it in ``runtime.allow_dangerous`` as ``field:value`` (``cap_add:SYS_ADMIN``, ``mounts:/:/host``,
  ``devices:/dev/sda``, ``group_add:docker``): the opt-in is part of the reviewed spec and of the
  bundle hash, ``mxc check`` reports it (rule ``container-dangerous``), ``mxc build`` and ``mxc show``
  print it;
- everything else (GPU, RDMA and accelerator devices; data and software mounts; the GPU groups; the
  capabilities podman and docker give by default and the few trainings ask for) needs nothing.

The lists are judged by name and path as written, on the build machine: what a path or group *is*
on a node (a symlink there, a site's gid numbering) is not known here (docs/security.md says so).
"""

from __future__ import annotations

import posixpath
import re

# Every Linux capability (capabilities(7), Linux 6.x), and ALL, which podman and docker accept.
CAPABILITIES = frozenset({
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP",
    "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "IPC_OWNER",
    "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT", "SYS_ADMIN", "SYS_BOOT", "SYS_NICE",
    "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP",
    "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF",
    "CHECKPOINT_RESTORE", "ALL",
})
# Those that need no opt-in: podman's and docker's default set (a container holds them already) and
# what trainings ask for: IPC_LOCK (pinned memory for RDMA), SYS_NICE, SYS_RESOURCE (limits),
# SYS_PTRACE (py-spy; mxc's containers do not share the host's pid namespace, so it reaches only the
# container's own processes). Every other capability reaches outside the container.
HARMLESS_CAPABILITIES = frozenset({
    "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP", "NET_BIND_SERVICE",
    "NET_RAW", "SYS_CHROOT", "MKNOD", "AUDIT_WRITE", "SETFCAP", "IPC_LOCK", "SYS_NICE", "SYS_RESOURCE",
    "SYS_PTRACE",
})

# Devices (and mounts under /dev) that need no opt-in: GPUs, RDMA, accelerators, and the harmless
# pseudo-devices. Anything else under /dev is judged dangerous: raw memory (/dev/mem, /dev/kmem,
# /dev/port), disks and partitions, CPU registers (/dev/cpu/*/msr), the kernel log, consoles, watchdogs.
HARMLESS_DEVICES = re.compile(
    r"^/dev/(infiniband(/.*)?|kfd|dri(/.*)?|nvidia[a-z0-9-]*(/.*)?|gdrdrv|accel(/.*)?|neuron[0-9]*|fuse"
    r"|null|zero|full|random|urandom|shm|hugepages(/.*)?)$")
_RAW_MEMORY = re.compile(r"^/dev/(mem|kmem|port|cpu(/.*)?)$")
_BLOCK = re.compile(r"^/dev/(sd[a-z]+[0-9]*|hd[a-z]+[0-9]*|vd[a-z]+[0-9]*|xvd[a-z]+[0-9]*|nvme[0-9]+(n[0-9]+(p[0-9]+)?)?"
                    r"|mmcblk[0-9]+(p[0-9]+)?|dm-[0-9]+|md[0-9]*|loop[0-9]*|sr[0-9]+|mapper(/.*)?|disk(/.*)?"
                    r"|root|zd[0-9]+|rbd[0-9]+|nbd[0-9]+|bcache[0-9]+)$")

# Host paths whose mount hands over the host: the whole file system, its configuration, the kernel's
# views, its boot files, root's home, runtime sockets (podman's, docker's, D-Bus, systemd) and the
# container runtimes' storage, the system's programs and libraries. A path under one counts too.
SYSTEM_PATHS = ("/etc", "/proc", "/sys", "/boot", "/root", "/run", "/var/run", "/var/lib/docker",
                "/var/lib/containers", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Where a user keeps credentials: a mount that holds one of these components gives them away.
CREDENTIAL_DIRS = frozenset({".ssh", ".gnupg", ".aws", ".azure", ".kube", ".docker", ".netrc", ".git-credentials",
                             ".password-store", ".pki", "gcloud"})

# Groups that own the host: by name, and by the numbers they have on Debian/Ubuntu (base-passwd) or
# Fedora/RHEL (setup) where those are fixed. Any other number is the site's: not judged here.
DANGEROUS_GROUPS = frozenset({"root", "wheel", "sudo", "admin", "adm", "disk", "kmem", "shadow", "docker", "lxd",
                              "libvirt", "systemd-journal", "tty", "staff"})
DANGEROUS_GIDS = {"0": "root", "4": "adm", "5": "tty", "6": "disk", "9": "kmem (Fedora)", "10": "wheel (Fedora)",
                  "15": "kmem (Debian)", "27": "sudo (Debian)", "42": "shadow (Debian)", "50": "staff (Debian)"}

FIELDS = ("cap_add", "devices", "group_add", "mounts", "optional_mounts")
OPT_IN = "runtime.allow_dangerous"


def canonical_problem(path: str) -> str | None:
    """Why ``path`` is not written the one way it is bound (``..``, ``.``, ``//``, a trailing ``/``), or None."""
    if not path.startswith("/"):
        return f"{path!r} is not an absolute path"
    if path != "/" and (path.endswith("/") or "//" in path or any(p in (".", "..") for p in path.split("/"))):
        normal = posixpath.normpath("/" + path.lstrip("/"))  # POSIX keeps a leading //; Linux does not
        return (f"{path!r} is not a canonical path ('.', '..', '//' or a trailing '/'): it means {normal!r}; "
                "write that (what is judged must be what is bound)")
    return None


def capability_danger(name: str) -> str | None:
    if name == "ALL":
        return "ALL is every capability: as good as --privileged"
    if name not in HARMLESS_CAPABILITIES:
        return f"CAP_{name} reaches outside the container (capabilities(7))"
    return None


def device_danger(path: str) -> str | None:
    """Why giving the container ``path`` (a canonical path under /dev) gives it the host, or None."""
    if path == "/dev":
        return "/dev is every host device, disks and memory included"
    if _RAW_MEMORY.match(path):
        return f"{path} reads and writes the host's memory, I/O ports or CPU registers"
    if _BLOCK.match(path):
        return f"{path} is a host disk (or partition): read and written below every file permission"
    if not HARMLESS_DEVICES.match(path):
        return (f"{path} is not a GPU, RDMA or accelerator device mxc knows (docs/security.md lists them); "
                "other devices can reach the host's hardware or kernel")
    return None


def host_path_danger(host: str) -> str | None:
    """Why binding the host's ``host`` (canonical, absolute) into a container gives the host away, or None."""
    if host == "/":
        return "/ is the host's whole file system"
    if host == "/dev" or host.startswith("/dev/"):
        return device_danger(host)
    for system in SYSTEM_PATHS:
        if host == system or host.startswith(system + "/"):
            return f"{host} is the host's own ({system}: configuration, kernel views, sockets or programs)"
    parts = host.split("/")
    if host == "/home" or (len(parts) == 3 and parts[1] == "home"):
        return f"{host} is a whole home directory (keys, tokens, shell start-up files)"
    secret = next((p for p in parts if p in CREDENTIAL_DIRS), None)
    if secret:
        return f"{host} holds credentials ({secret})"
    if parts[-1].endswith((".sock", ".socket")):
        return f"{host} is a socket: whoever can talk to it acts as the service behind it"
    return None


def group_danger(group: str) -> str | None:
    if group in DANGEROUS_GROUPS:
        return f"group {group} owns host resources (disks, sockets, logs, sudo)"
    if group in DANGEROUS_GIDS:
        return f"gid {group} is {DANGEROUS_GIDS[group]}"
    return None


def problems(cap_add: list[str], devices: list[str], group_add: list[str], mounts: list[str],
             optional_mounts: list[str], allowed: list[str]) -> list[tuple[str, str]]:
    """(field path under runtime, why it is refused) for a runtime's options given ``runtime.allow_dangerous``."""
    out: list[tuple[str, str]] = []
    used: set[str] = set()

    def dangerous(where: str, entry: str, why: str) -> None:
        used.add(entry)
        if entry not in allowed:
            out.append((where, f"{why}; to give it anyway, list '{entry}' in {OPT_IN} (reported on every check)"))

    for i, cap in enumerate(cap_add):
        why = capability_danger(cap) if cap in CAPABILITIES else None
        if cap not in CAPABILITIES:
            out.append((f"container_options.cap_add.{i}", f"{cap} is not a Linux capability (capabilities(7), "
                                                          "without CAP_)"))
        elif why:
            dangerous(f"container_options.cap_add.{i}", f"cap_add:{cap}", why)
    for i, device in enumerate(devices):
        where = f"container_options.devices.{i}"
        problem = canonical_problem(device)
        if problem:
            out.append((where, problem))
        elif not device.startswith("/dev/"):
            out.append((where, f"{device!r} is not a device under /dev"))
        elif why := device_danger(device):
            dangerous(where, f"devices:{device}", why)
    for i, group in enumerate(group_add):
        if why := group_danger(group):
            dangerous(f"container_options.group_add.{i}", f"group_add:{group}", why)
    for field, values in (("mounts", mounts), ("optional_mounts", optional_mounts)):
        for i, mount in enumerate(values):
            where = f"{field}.{i}"
            host, _, rest = mount.partition(":")
            problem = canonical_problem(host) or canonical_problem(rest.removesuffix(":ro"))
            if problem:
                out.append((where, problem))
            elif why := host_path_danger(host):
                dangerous(where, f"{field}:{mount}", why)
    for entry in allowed:
        field, sep, _ = entry.partition(":")
        if not sep or field not in FIELDS:
            out.append(("allow_dangerous", f"{entry!r}: expected field:value, field one of {', '.join(FIELDS)} "
                                           "(e.g. cap_add:SYS_ADMIN, mounts:/:/host)"))
        elif entry not in used:
            out.append(("allow_dangerous", f"{entry!r} names nothing dangerous this spec uses (remove it)"))
    return out


def opt_in_notice(entries: list[str]) -> str:
    """The line ``mxc build`` and ``mxc show`` print for a spec with a container opt-in."""
    return (f"{OPT_IN}: {', '.join(entries)} given to the container on purpose "
            "(reaches the host outside the container; review each)")
