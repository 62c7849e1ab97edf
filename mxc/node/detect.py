"""Node-computed settings: named detectors that read this node and propose environment values.

RDMA settings differ per node and per boot (which HCA ports are up, where the kernel placed the
routable RoCE v2 GID, the AI NIC's QoS map), so a spec cannot write them down once. A spec names
the detectors it wants (``env.detect: [ib_hca, gid_index, ...]``); the node program runs them
before training and records, per rank, what each read, what it found and what it did, in
``ranks/<rank>/detected.json`` (the run record carries it, ``mxc compare`` shows a rerun that
detected something else).

Each detector is a function of a :class:`Node` (a filesystem root and a command runner, both
injectable: tests give a recorded ``/sys`` tree and recorded command outputs) returning a
:class:`Detection`. A detector that finds nothing returns no value, with the reason; the variable
then stays unset. What reaches training is decided by :func:`decide`, in one place:

- a value already in the rank's environment (the spec's ``env``, or the node's own) wins;
- the one exception is the DMABUF guard, which lowers ``NCCL_DMABUF_ENABLE=1`` to ``0`` where
  the kernel cannot do it (a crash otherwise); it never raises a ``0``.

Learnt from MaxText-Slurm's ``utils/detect_nccl_env.sh``, ``choose_nccl_socket_ifname.sh`` and
``detect_ainic_nccl_ib_tc.sh`` (what they check), written anew. Stdlib only: ships in every bundle.
"""

from __future__ import annotations

import gzip
import ipaddress
import json
import re
import shutil
import subprocess
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from . import netif, sysread
from .atomicfile import write_text

FORMAT = "mxc-detected/v1"
COMMAND_TIMEOUT_S = 10.0
OUTPUT_LIMIT = 64 * 1024  # bytes of a command's output kept (and recorded)
DMABUF_MIN_KERNEL = (5, 12)  # RDMA dma-buf memory registration (ib_umem_dmabuf) arrived in Linux 5.12
DMABUF_OPTIONS = ("CONFIG_DMABUF_MOVE_NOTIFY", "CONFIG_PCI_P2PDMA")  # what perftest/RCCL look for in the config
# Interfaces never chosen for sockets: loopback, container and VM bridges, veth pairs.
VIRTUAL_PREFIXES = ("lo", "docker", "cni", "virbr", "veth", "br-", "podman")
ADDRESS_TIERS = ((ipaddress.ip_network("10.0.0.0/8"), "10.0.0.0/8"),
                 (ipaddress.ip_network("172.16.0.0/12"), "172.16.0.0/12"),
                 (ipaddress.ip_network("192.168.0.0/16"), "192.168.0.0/16"))


@dataclass(frozen=True)
class Output:
    """What a command printed (stdout and stderr together, bounded) and its exit status."""

    rc: int
    text: str


Runner = Callable[[Sequence[str]], Optional[Output]]  # None: the command is not installed here


def run_command(argv: Sequence[str]) -> Output | None:
    """Run a fixed command from PATH, bounded in time and output; None when it is not installed."""
    exe = shutil.which(argv[0])
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, *argv[1:]], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=COMMAND_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return Output(124, f"timed out after {COMMAND_TIMEOUT_S:.0f}s")
    except OSError as exc:
        return Output(126, str(exc))
    return Output(done.returncode, done.stdout[:OUTPUT_LIMIT].decode("utf-8", "replace"))


@dataclass(frozen=True)
class Node:
    """What detectors read: a filesystem root (``/`` on a node) and a command runner."""

    root: Path = Path("/")
    run: Runner = run_command

    @property
    def sys_ib(self) -> Path:
        return self.root / "sys/class/infiniband"

    @property
    def sys_net(self) -> Path:
        return self.root / "sys/class/net"


@dataclass(frozen=True)
class Detection:
    """One detector's result on one node."""

    detector: str
    values: dict[str, str]  # variable -> detected value; a variable it may set but did not find is absent
    reason: str  # why these values, or why none
    inputs: dict[str, Any] = field(default_factory=dict)  # what it read (JSON), for the record


@dataclass(frozen=True)
class Detector:
    name: str
    variables: tuple[str, ...]  # what it may set
    detect: Callable[[Node], Detection]
    guard: bool = False  # may lower a value already set (DMABUF only)


# ---- InfiniBand / RoCE: /sys/class/infiniband


def _port_inputs(ports: list[netif.RdmaPort]) -> dict[str, Any]:
    return {f"{p.device}:{p.port}": {"state": p.state or "unreadable", "link_layer": p.link_layer or "unreadable"}
            for p in ports}


def detect_ib_hca(node: Node) -> Detection:
    """``NCCL_IB_HCA``: every ACTIVE port, as NCCL's exact list ``=dev:port,...`` (``mlx5_1`` alone
    would also match ``mlx5_10``, and a down port would be tried)."""
    ports = netif.rdma_devices(node.sys_ib)
    inputs = {"sys_class_infiniband": str(node.sys_ib), "ports": _port_inputs(ports)}
    if not ports:
        return Detection("ib_hca", {}, f"no RDMA device under {node.sys_ib}", inputs)
    active = [p for p in ports if p.active]
    if not active:
        return Detection("ib_hca", {}, f"none of {len(ports)} RDMA port(s) is ACTIVE", inputs)
    value = "=" + ",".join(f"{p.device}:{p.port}" for p in active)
    return Detection("ib_hca", {"NCCL_IB_HCA": value},
                     f"{len(active)} ACTIVE of {len(ports)} RDMA port(s)", inputs)


def _routable(gid: netif.Gid) -> bool:
    """Not link-local (fe80::/10): the routed or IPv4-mapped GID RoCE traffic between nodes uses."""
    return not re.match(r"^fe[89ab]", gid.gid)


def _port_gid_index(port: netif.RdmaPort) -> tuple[int, str] | None:
    """The lowest routable RoCE v2 GID index of a port, else (old drivers give no type) the lowest
    routable v1 or untyped one; with the kind found."""
    routable = [g for g in port.gids if _routable(g)]
    for gid in routable:
        if gid.type and "v2" in gid.type:
            return gid.index, "RoCE v2"
    for gid in routable:
        if not gid.type or "v1" in gid.type or "IB" in gid.type:
            return gid.index, gid.type or "type unknown"
    return None


def detect_gid_index(node: Node) -> Detection:
    """``NCCL_IB_GID_INDEX``: the routable RoCE v2 GID's index, the same on every ACTIVE RoCE port.

    The kernel does not always put it at the same slot (an address added after a link-local one
    moves it), so a cluster-wide constant breaks some nodes ("ibv_query_gid failed"). Ports that
    disagree leave it unset: no single value would be right.
    """
    ports = [p for p in netif.rdma_devices(node.sys_ib) if p.active and p.link_layer == "Ethernet"]
    found = {f"{p.device}:{p.port}": _port_gid_index(p) for p in ports}
    inputs = {"sys_class_infiniband": str(node.sys_ib),
              "ports": {f"{p.device}:{p.port}": [{"index": g.index, "gid": g.gid, "type": g.type} for g in p.gids]
                        for p in ports}}
    if not ports:
        return Detection("gid_index", {}, "no ACTIVE RoCE (Ethernet link layer) port", inputs)
    indices = {name: hit for name, hit in found.items() if hit is not None}
    if not indices:
        return Detection("gid_index", {}, "no routable GID on the ACTIVE RoCE ports", inputs)
    distinct = sorted({index for index, _ in indices.values()})
    if len(distinct) > 1:
        each = ", ".join(f"{name} {index}" for name, (index, _) in indices.items())
        return Detection("gid_index", {}, f"ACTIVE RoCE ports disagree ({each}); set NCCL_IB_GID_INDEX in the spec",
                         inputs)
    kinds = sorted({kind for _, kind in indices.values()})
    return Detection("gid_index", {"NCCL_IB_GID_INDEX": str(distinct[0])},
                     f"routable {'/'.join(kinds)} GID at index {distinct[0]} on {len(indices)} ACTIVE RoCE port(s)",
                     inputs)


# ---- AMD AI NIC (Pensando) QoS: `nicctl show qos`

NICCTL = ("nicctl", "show", "qos")
_DSCP_LINE = re.compile(r"^\s*DSCP\s*:\s*(\d+)\s*==>\s*priority\s*:\s*(\d+)\s*$")
_NO_DROP = re.compile(r"PFC no-drop priorities\s*:\s*([0-9,\s]*)$")
_SCHEDULE = re.compile(r"^\s*(\d+)\s+(\S+)\s")


@dataclass(frozen=True)
class QosBlock:
    """One NIC's QoS as ``nicctl show qos`` prints it: single-DSCP mappings, no-drop and strict priorities."""

    dscp_of: dict[int, int]  # priority -> the first single DSCP value mapped to it
    no_drop: list[int]
    strict: list[int]


def parse_nicctl_qos(text: str) -> list[QosBlock]:
    """Each ``NIC :`` block of ``nicctl show qos``; DSCP ranges and bitmaps are ignored (a
    traffic class names one DSCP)."""
    blocks: list[list[str]] = []
    for line in text.splitlines():
        if re.match(r"^NIC\s*:", line) or not blocks:
            blocks.append([])
        blocks[-1].append(line)
    out = []
    for lines in blocks:
        dscp_of: dict[int, int] = {}
        no_drop: list[int] = []
        strict: list[int] = []
        seen = False  # a QoS line at all (ranges and an empty no-drop list included)
        for line in lines:
            seen = seen or "==> priority" in line or "PFC" in line
            if (m := _DSCP_LINE.match(line)) is not None:
                dscp_of.setdefault(int(m.group(2)), int(m.group(1)))
            elif (m := _NO_DROP.search(line.rstrip())) is not None:
                no_drop = [int(p) for p in m.group(1).replace(" ", "").split(",") if p.isdigit()]
            elif (m := _SCHEDULE.match(line)) is not None and m.group(2).lower() == "strict":
                strict.append(int(m.group(1)))
        if seen:
            out.append(QosBlock(dscp_of, no_drop, strict))
    return out


def _traffic_classes(block: QosBlock) -> tuple[dict[str, str], str]:
    if not block.no_drop:
        return {}, "no PFC no-drop priority configured"
    priority = block.no_drop[0]
    if priority not in block.dscp_of:
        return {}, f"no single DSCP maps to the no-drop priority {priority}"
    values = {"NCCL_IB_TC": str(block.dscp_of[priority] * 4)}  # a traffic class is the DSCP shifted by 2 (the ECN bits)
    why = f"no-drop priority {priority} <- DSCP {block.dscp_of[priority]}"
    fifo = next((p for p in block.strict if p in block.dscp_of), None)
    if fifo is not None:
        values["NCCL_IB_FIFO_TC"] = str(block.dscp_of[fifo] * 4)
        why += f"; strict priority {fifo} <- DSCP {block.dscp_of[fifo]}"
    else:
        why += "; no strict priority with a single DSCP: NCCL_IB_FIFO_TC unset"
    return values, why


def _command(node: Node, name: str, argv: tuple[str, ...], missing: str) -> tuple[Output, dict[str, Any], Detection | None]:
    """Run a detector's command: its output and the inputs to record, or the Detection that says
    why there is nothing to read (the command is absent or failed)."""
    out = node.run(argv)
    inputs: dict[str, Any] = {"command": " ".join(argv)}
    if out is None:
        return Output(127, ""), inputs, Detection(name, {}, missing, inputs)
    inputs.update(rc=out.rc, output=out.text)
    if out.rc != 0:
        return out, inputs, Detection(name, {}, f"`{' '.join(argv)}` failed (exit {out.rc})", inputs)
    return out, inputs, None


def detect_ainic_tc(node: Node) -> Detection:
    """``NCCL_IB_TC`` (and ``NCCL_IB_FIFO_TC``) from an AMD AI NIC's QoS map where ``nicctl`` exists:
    the DSCP of the PFC no-drop priority (data) and of the strict priority (control), times 4."""
    out, inputs, failed = _command(node, "ainic_tc", NICCTL, "nicctl is not installed here (no AMD AI NIC tools)")
    if failed is not None:
        return failed
    blocks = parse_nicctl_qos(out.text)
    if not blocks:
        return Detection("ainic_tc", {}, f"`{' '.join(NICCTL)}` printed no QoS map", inputs)
    results = [_traffic_classes(block) for block in blocks]
    distinct = {json.dumps(values, sort_keys=True) for values, _ in results}
    if len(distinct) > 1:
        return Detection("ainic_tc", {}, f"the {len(blocks)} NICs' QoS maps give different traffic classes", inputs)
    values, why = results[0]
    return Detection("ainic_tc", values, why + (f" (same on {len(blocks)} NICs)" if len(blocks) > 1 else ""), inputs)


# ---- socket interface by address range: `ip -o -4 addr show scope global`

IP_ADDR = ("ip", "-o", "-4", "addr", "show", "scope", "global")


def parse_ip_addr(text: str) -> list[tuple[str, ipaddress.IPv4Address]]:
    """(interface, address) of each line of ``ip -o -4 addr show``."""
    out = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "inet":
            name = fields[1].split("@", 1)[0].rstrip(":")
            try:
                out.append((name, ipaddress.IPv4Interface(fields[3]).ip))
            except ValueError:
                continue
    return out


def detect_socket_ifname(node: Node) -> Detection:
    """``NCCL_SOCKET_IFNAME``: the interface with a global IPv4 address, by range: 10/8, then
    172.16/12, then 192.168/16, then any other; the lowest address within a range. Every node of a
    cluster numbered alike picks the same name; virtual and down interfaces are skipped."""
    out, inputs, failed = _command(node, "socket_ifname", IP_ADDR, "`ip` is not installed here")
    if failed is not None:
        return failed
    states = {}
    candidates = []
    for name, address in parse_ip_addr(out.text):
        state = netif.operstate(node.sys_net, name)
        states[name] = state
        if name.startswith(VIRTUAL_PREFIXES) or state not in (*netif.UP_STATES, "missing"):
            continue
        tier = next((i for i, (net, _) in enumerate(ADDRESS_TIERS) if address in net), len(ADDRESS_TIERS))
        candidates.append((tier, address, netif.natural_key(name), name))
    inputs["operstate"] = states
    if not candidates:
        return Detection("socket_ifname", {}, "no interface that is up has a global IPv4 address "
                         f"(skipped: {', '.join(sorted(states)) or 'none listed'})", inputs)
    tier, address, _, name = min(candidates)
    where = ADDRESS_TIERS[tier][1] if tier < len(ADDRESS_TIERS) else "no private range"
    return Detection("socket_ifname", {"NCCL_SOCKET_IFNAME": netif.exact(name)}, f"{name} has {address} ({where})",
                     inputs)


# ---- DMABUF guard: kernel version and build options


def _kernel_config(node: Node, release: str) -> tuple[str | None, str]:
    """The kernel's build configuration text and where it came from (``/boot/config-<release>``,
    else ``/proc/config.gz``); None when neither is readable."""
    boot = node.root / "boot" / f"config-{release}"
    text = sysread.read_text(boot, 16 << 20)
    if text is not None:
        return text, str(boot)
    packed = sysread.read_bytes(node.root / "proc/config.gz", 16 << 20)
    if packed is not None:
        try:
            return gzip.decompress(packed).decode("utf-8", "replace"), str(node.root / "proc/config.gz")
        except (OSError, EOFError, zlib.error):  # corrupt: as unreadable (the guard then says 0)
            pass
    return None, f"{boot} and {node.root / 'proc/config.gz'}"


def detect_dmabuf(node: Node) -> Detection:
    """``NCCL_DMABUF_ENABLE``: 1 where the kernel can register GPU memory for RDMA through dma-buf
    (Linux 5.12 or later, built with the options below), else 0. Without a readable kernel config
    the answer is 0: RCCL and perftest read ``/boot/config-$(uname -r)`` to decide, and MaxText-Slurm
    saw crashes where it was missing (a container without /boot)."""
    release = sysread.read_text(node.root / "proc/sys/kernel/osrelease", 256) or ""
    inputs: dict[str, Any] = {"kernel": release}
    version = re.match(r"^(\d+)\.(\d+)", release)
    if version is None:
        return Detection("dmabuf", {}, "kernel release unreadable", inputs)
    if (int(version.group(1)), int(version.group(2))) < DMABUF_MIN_KERNEL:
        return Detection("dmabuf", {"NCCL_DMABUF_ENABLE": "0"},
                         f"kernel {release} is older than {'.'.join(map(str, DMABUF_MIN_KERNEL))}", inputs)
    config, source = _kernel_config(node, release)
    inputs["config"] = source
    if config is None:
        return Detection("dmabuf", {"NCCL_DMABUF_ENABLE": "0"},
                         f"kernel config unreadable ({source}): mount /boot to keep DMABUF", inputs)
    settings = {name: ("y" if re.search(rf"^{name}=y$", config, re.M) else "not set") for name in DMABUF_OPTIONS}
    inputs["options"] = settings
    missing = [name for name, value in settings.items() if value != "y"]
    if missing:
        return Detection("dmabuf", {"NCCL_DMABUF_ENABLE": "0"}, f"kernel {release} built without {', '.join(missing)}",
                         inputs)
    return Detection("dmabuf", {"NCCL_DMABUF_ENABLE": "1"}, f"kernel {release} with {' and '.join(DMABUF_OPTIONS)}",
                     inputs)


DETECTORS: dict[str, Detector] = {d.name: d for d in (
    Detector("ib_hca", ("NCCL_IB_HCA",), detect_ib_hca),
    Detector("gid_index", ("NCCL_IB_GID_INDEX",), detect_gid_index),
    Detector("ainic_tc", ("NCCL_IB_TC", "NCCL_IB_FIFO_TC"), detect_ainic_tc),
    Detector("socket_ifname", ("NCCL_SOCKET_IFNAME",), detect_socket_ifname),
    Detector("dmabuf", ("NCCL_DMABUF_ENABLE",), detect_dmabuf, guard=True),
)}
# Variables a guard may lower: its "0" overrides a value set anywhere, the image's included.
GUARDED = frozenset(name for d in DETECTORS.values() if d.guard for name in d.variables)


def container_modes(updates: Mapping[str, str]) -> dict[str, str]:
    """How each value detection set joins a container image's environment (envmerge modes): only
    where the image leaves the variable unset ("default": an image's deliberate setting is kept,
    as a node's is natively), except a guard's "0", which lowers whatever the image says."""
    return {name: "replace" if name in GUARDED and value == "0" else "default" for name, value in updates.items()}


# ---- what reaches training


@dataclass(frozen=True)
class Outcome:
    """What happened to one variable: its value for training (None: not set by detection) and why."""

    variable: str
    value: str | None
    how: str  # detected | kept | guard | unset


def decide(detector: Detector, detection: Detection, env: Mapping[str, str]) -> list[Outcome]:
    """The module docstring's precedence, for each variable the detector may set."""
    out = []
    for name in detector.variables:
        found, current = detection.values.get(name), env.get(name)
        if detector.guard and found == "0" and current is not None and current != "0":
            out.append(Outcome(name, "0", "guard"))
        elif current is not None:
            out.append(Outcome(name, None, "kept"))
        elif found is None:
            out.append(Outcome(name, None, "unset"))
        else:
            out.append(Outcome(name, found, "detected"))
    return out


def run_detectors(names: Sequence[str], env: Mapping[str, str], node: Node) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """Run the named detectors in order: (variables to set for training, the report for the record).

    A detector that raises is reported as such and sets nothing: detection never stops a run.
    """
    updates: dict[str, str] = {}
    report = []
    for name in names:
        detector = DETECTORS.get(name)
        if detector is None:  # the compiler refuses unknown names; a hand-edited run.json is not trusted
            report.append({"detector": name, "found": {}, "reason": "no such detector in this node program",
                           "inputs": {}, "variables": {}})
            continue
        try:
            detection = detector.detect(node)
        except Exception as exc:  # a bug here must not cost the run; the record says what
            detection = Detection(name, {}, f"detector failed: {type(exc).__name__}: {exc}")
        outcomes = decide(detector, detection, {**env, **updates})
        report.append({
            "detector": name, "found": detection.values, "reason": detection.reason, "inputs": detection.inputs,
            "variables": {o.variable: {"value": o.value, "how": o.how, "was": env.get(o.variable)} for o in outcomes},
        })
        updates.update((o.variable, o.value) for o in outcomes if o.value is not None)
    return updates, report


def summary(entry: Mapping[str, Any]) -> str:
    """One log line for a detector's report entry."""
    parts = []
    for name, result in entry["variables"].items():
        how = result["how"]
        if how == "detected":
            parts.append(f"{name}={result['value']}")
        elif how == "guard":
            parts.append(f"{name}=0 (was {result['was']}: lowered by the guard)")
        elif how == "kept":
            parts.append(f"{name} kept as set ({result['was']})")
        else:
            parts.append(f"{name} unset")
    text = ", ".join(parts)
    return f"detect {entry['detector']}: {text + ' ' if text else ''}({entry['reason']})"


def write_report(path: Path, *, rank: int, node: str, attempt: int, entries: list[dict[str, Any]]) -> None:
    """``ranks/<rank>/detected.json``: the latest attempt's detections on this rank."""
    data = {"format": FORMAT, "rank": rank, "node": node, "attempt": attempt, "detectors": entries}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
