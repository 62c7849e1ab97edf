"""The network interface NCCL/RCCL sockets and Gloo use on this node, and the node's RDMA ports.

A wrong choice is the classic multi-node failure: NCCL's bootstrap picks a docker bridge or a
management network that the other nodes cannot reach, and the job hangs in initialisation. So
the interface is chosen here, in tiers, and logged with the reason:

1. ``runtime.network_interface`` of the spec (``configured``): that exact name, nothing guessed;
2. ``NCCL_SOCKET_IFNAME`` from the environment (the spec's ``env`` or the site's): kept as it is
   for NCCL/RCCL (its own syntax, :func:`nccl_match`); Gloo, which takes one name, gets the first
   interface that is up and matches it;
3. otherwise the first interface that is up, by kind: InfiniBand (``ib*``), Slingshot (``hsn*``),
   bonds, the interface that routes to the JAX coordinator, Ethernet (``en*``, then ``eth*``);
4. loopback, which only works when every process runs on this machine (a warning says so).

Port of ``pick_iface``/``nccl_match``/``iface_up`` of the former entrypoint.sh, with two fixes:
names sort naturally (``ib2`` before ``ib10``), and with ``NCCL_SOCKET_IFNAME`` set, an up
interface of another kind that it names (``br0``, ``team0``) is found before loopback.

``rdma_devices`` reads the RDMA side (``/sys/class/infiniband``): ports, their state and link
layer, and GID tables with the type of each entry (RoCE v1/v2), for the RDMA checks to come.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from . import sysread

UP_STATES = ("up", "unknown")  # operstate of a usable interface; loopback and some drivers say "unknown"
ROUTE = "route"  # the tier "interface that routes to the coordinator"
# (prefix or ROUTE, what it is), in the order they are tried
KINDS = (("ib", "InfiniBand"), ("hsn", "Slingshot"), ("bond", "bond"), (ROUTE, "route to the coordinator"),
         ("en", "Ethernet"), ("eth", "Ethernet"))
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
GID_FORMAT = re.compile(r"^[0-9a-f]{4}(:[0-9a-f]{4}){7}$")  # how sysfs prints a GID (%pI6)
LOOPBACK_WARNING = ("only loopback is usable; fine when all processes share this machine, "
                    "else set runtime.network_interface")


def exact(name: str) -> str:
    """NCCL_SOCKET_IFNAME for exactly ``name``: a bare name is a prefix to NCCL/RCCL (``ib0`` also
    takes ``ib0.8001`` and ``ib01``, ``eth1`` also ``eth10``), ``=name`` is that interface only."""
    return "=" + name


@dataclass(frozen=True)
class InterfaceChoice:
    """The interface chosen, why, and what NCCL/RCCL are told.

    ``name`` is empty when ``NCCL_SOCKET_IFNAME`` matches no interface that is up here (the
    network preflight check then fails naming it; Gloo falls back to loopback).
    """

    name: str
    reason: str
    candidates: list[str]  # the interfaces that are up, in the order the tiers looked at them
    nccl_socket_ifname: str  # the environment's spec as it is, else ``=name`` (exact(): that one interface)
    warning: str | None = None  # worth logging when processes span machines

    @property
    def gloo_interface(self) -> str:
        return self.name or "lo"


def nccl_match(dev: str, spec: str) -> bool:
    """Whether NCCL would use interface ``dev`` under ``NCCL_SOCKET_IFNAME=spec``.

    NCCL's syntax (src/misc/utils.cc, ``parseStringList``/``matchIfList``): a comma-separated list
    of name prefixes; a leading ``^`` excludes what the list matches, a leading ``=`` (after any
    ``^``) asks for exact names; ``name:port`` items compare the name only; empty items are
    skipped, and an empty list matches every interface.
    """
    exclude = spec.startswith("^")
    if exclude:
        spec = spec[1:]
    exact = spec.startswith("=")
    if exact:
        spec = spec[1:]
    items = [item.split(":", 1)[0] for item in spec.split(",")]
    items = [item for item in items if item]
    matched = not items or any(dev == item if exact else dev.startswith(item) for item in items)
    return matched != exclude


def natural_key(name: str) -> tuple[object, ...]:
    """Sort key that orders ``ib2`` before ``ib10``."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


def operstate(sys_net: Path, name: str) -> str:
    """``up``, ``down``, ``unknown``...; ``missing`` when there is no such interface."""
    if not name or "/" in name or name in (".", ".."):
        return "missing"
    state = sysread.read_text(sys_net / name / "operstate", 64)
    return state if state is not None else "missing"


def is_up(sys_net: Path, name: str) -> bool:
    return operstate(sys_net, name) in UP_STATES


def coordinator_host(coordinator: str) -> str:
    """The host part of ``host:port``, ``[v6]:port`` or a bare host."""
    if coordinator.startswith("["):
        return coordinator[1:].partition("]")[0]
    if coordinator.count(":") == 1:
        return coordinator.partition(":")[0]
    return coordinator


def resolve_ipv4(host: str) -> str | None:
    """The first IPv4 address of ``host`` (what ``getent ahostsv4`` prints first)."""
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return None
    for info in infos:
        return str(info[4][0])
    return None


def route_via_ip(host: str, timeout: float = 10.0) -> str | None:
    """The interface the kernel routes ``host`` through (``ip -o route get``); None when unknown.

    Only an address reaches ``ip``: a host name is resolved first, and anything that is not an
    address afterwards is refused, so no value can pass as an option.
    """
    address = resolve_ipv4(host) or host
    try:
        address = str(ipaddress.ip_address(address))
    except ValueError:
        return None
    try:
        done = subprocess.run(["ip", "-o", "route", "get", address], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    match = re.search(r"\sdev\s+(\S+)", done.stdout.decode("utf-8", "replace"))
    return match.group(1) if match else None


def choose_interface(sys_net: Path, *, configured: str | None, nccl_spec: str | None, coordinator: str | None,
                     route_to: Callable[[str], str | None]) -> InterfaceChoice:
    """The interface for NCCL/RCCL and Gloo, by the tiers of this module's docstring.

    ``sys_net`` is ``/sys/class/net`` (injected for tests); ``route_to(host)`` names the interface
    that routes to a host (:func:`route_via_ip` on a node), asked only when a coordinator is given.
    """
    names = sorted(sysread.list_dir(sys_net), key=natural_key)
    up = [name for name in names if is_up(sys_net, name)]
    if configured:
        state = operstate(sys_net, configured)
        reason = "runtime.network_interface"
        if state not in UP_STATES:
            reason += f" (here it is {state})"
        return InterfaceChoice(configured, reason, _in_tier_order(up, None), exact(configured))

    host = coordinator_host(coordinator) if coordinator else ""
    routed = route_to(host) if host else None
    candidates = _in_tier_order(up, routed)

    spec = nccl_spec or None
    tiers = _tiers(up, routed, host)
    if spec is None:
        if tiers:
            name, why = tiers[0]
            return InterfaceChoice(name, why, candidates, exact(name))
        return InterfaceChoice("lo", "loopback: no other interface is up", candidates, exact("lo"), LOOPBACK_WARNING)
    matches = f"first up interface that NCCL_SOCKET_IFNAME={spec} matches"
    for name, why in tiers:
        if nccl_match(name, spec):
            return InterfaceChoice(name, f"{matches}: {why}", candidates, spec)
    tried = {name for name, _ in tiers}
    for name in up:  # an interface of another kind that it names (a bridge, a team), loopback last
        if name not in tried and name != "lo" and nccl_match(name, spec):
            return InterfaceChoice(name, matches, candidates, spec)
    if "lo" in up and nccl_match("lo", spec):
        return InterfaceChoice("lo", f"{matches}: loopback", candidates, spec, LOOPBACK_WARNING)
    none = f"no interface that is up matches NCCL_SOCKET_IFNAME={spec}"
    return InterfaceChoice("", none, candidates, spec, none + "; Gloo uses loopback")


def _tiers(up: list[str], routed: str | None, host: str) -> list[tuple[str, str]]:
    """(interface, why) in the order tier 3 tries them: by kind, the route to the coordinator in its place."""
    out = []
    for prefix, kind in KINDS:
        if prefix == ROUTE:
            if routed and routed in up:
                out.append((routed, f"routes to the coordinator {host}"))
            continue
        out.extend((name, f"first up {kind} interface ({prefix}*)") for name in up if name.startswith(prefix))
    return out


def _in_tier_order(up: list[str], routed: str | None) -> list[str]:
    """Every up interface once: those of the tiers first, in their order, then the others, loopback last."""
    ordered: list[str] = []
    for name, _ in _tiers(up, routed, ""):
        if name not in ordered:
            ordered.append(name)
    ordered += [name for name in up if name not in ordered and name != "lo"]
    if "lo" in up and "lo" not in ordered:
        ordered.append("lo")
    return ordered


def network_env(choice: InterfaceChoice, env: Mapping[str, str]) -> dict[str, str]:
    """The variables training gets: NCCL/RCCL's spec, Gloo's one name (a site's own GLOO_SOCKET_IFNAME wins)."""
    return {"NCCL_SOCKET_IFNAME": choice.nccl_socket_ifname,
            "GLOO_SOCKET_IFNAME": env.get("GLOO_SOCKET_IFNAME") or choice.gloo_interface,
            "MXC_NET_IFACE": choice.name}


# ---- RDMA: /sys/class/infiniband (InfiniBand, RoCE, Omni-Path...)


@dataclass(frozen=True)
class Gid:
    """One populated entry of a port's GID table."""

    index: int
    gid: str  # as sysfs prints it, eight groups of four hex digits
    type: str | None  # "IB/RoCE v1" or "RoCE v2" (the kernel's words); None when the kernel gives none
    netdev: str | None  # the Ethernet device of a RoCE GID; None on InfiniBand


@dataclass(frozen=True)
class RdmaPort:
    device: str  # mlx5_0, hfi1_0...
    port: int
    state: str  # ACTIVE, DOWN, INIT, ARMED ("4: ACTIVE" in sysfs)
    phys_state: str  # LinkUp, Disabled, Polling... ("5: LinkUp")
    link_layer: str  # InfiniBand or Ethernet (RoCE)
    rate: str  # "100 Gb/sec (4X EDR)"
    gids: list[Gid]

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"


def _after_colon(text: str | None) -> str:
    """``4: ACTIVE`` -> ``ACTIVE``; empty when unreadable."""
    if text is None:
        return ""
    return text.partition(":")[2].strip() if ":" in text else text


def _gids(port_dir: Path) -> list[Gid]:
    """Populated GID entries; unset ones read as the zero GID, and their type file fails to read."""
    out = []
    indices = sorted(int(name) for name in sysread.list_dir(port_dir / "gids") if name.isdigit())
    for index in indices:
        gid = sysread.read_text(port_dir / "gids" / str(index), 128)
        if not gid or gid == ZERO_GID or not GID_FORMAT.match(gid):
            continue
        out.append(Gid(index, gid, sysread.read_text(port_dir / "gid_attrs" / "types" / str(index), 128) or None,
                       sysread.read_text(port_dir / "gid_attrs" / "ndevs" / str(index), 128) or None))
    return out


def rdma_devices(sys_ib: Path) -> list[RdmaPort]:
    """Every port of every RDMA device under ``sys_ib`` (``/sys/class/infiniband``); empty without RDMA."""
    ports = []
    for device in sorted(sysread.list_dir(sys_ib), key=natural_key):
        for name in sorted(sysread.list_dir(sys_ib / device / "ports"), key=natural_key):
            if not name.isdigit():
                continue
            port_dir = sys_ib / device / "ports" / name
            ports.append(RdmaPort(
                device=device, port=int(name),
                state=_after_colon(sysread.read_text(port_dir / "state", 128)),
                phys_state=_after_colon(sysread.read_text(port_dir / "phys_state", 128)),
                link_layer=sysread.read_text(port_dir / "link_layer", 128) or "",
                rate=sysread.read_text(port_dir / "rate", 128) or "",
                gids=_gids(port_dir)))
    return ports
