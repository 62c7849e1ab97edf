"""mxc/node/netif.py: NCCL_SOCKET_IFNAME matching, the interface tiers over fake and real
/sys/class/net trees, and the RDMA ports of recorded /sys/class/infiniband trees."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from mxc.node import netif
from tests.conftest import REPO

FIXTURES = REPO / "tests" / "fixtures" / "sys"

# The former bash implementation (entrypoint.sh.j2), kept here as the reference the port must match.
BASH_NCCL_MATCH = r'''
nccl_match() {  # nccl_match IFACE SPEC
  local dev=$1 spec=$2 exclude=1 exact=0 item items
  if [[ "$spec" == ^* ]]; then exclude=0; spec=${spec#^}; fi
  if [[ "$spec" == =* ]]; then exact=1; spec=${spec#=}; fi
  IFS=, read -r -a items <<< "$spec"
  for item in "${items[@]}"; do
    if [ "$exact" -eq 1 ] && [ "$dev" = "$item" ]; then return $((1 - exclude)); fi
    if [ "$exact" -eq 0 ] && [[ "$dev" == "$item"* ]]; then return $((1 - exclude)); fi
  done
  return "$exclude"
}
'''
# (interface, NCCL_SOCKET_IFNAME, NCCL uses it), from NCCL's documentation of the variable
CASES = [
    ("eth0", "eth", True), ("eth1", "eth", True), ("ib0", "eth", False),
    ("ib0", "ib,eth", True), ("eno1", "ib,eth", False),
    ("docker0", "^docker,lo", False), ("lo", "^docker,lo", False), ("eth0", "^docker,lo", True),
    ("eth0", "=eth0", True), ("eth01", "=eth0", False), ("eth0", "=eth1,eth0", True),
    ("eth0", "^=eth0", False), ("eth01", "^=eth0", True),
    ("hsn0", "hsn", True), ("bond0", "=bond0", True),
]


@pytest.mark.parametrize(("dev", "spec", "expected"), CASES)
def test_nccl_match(dev: str, spec: str, expected: bool) -> None:
    assert netif.nccl_match(dev, spec) is expected


def test_nccl_match_agrees_with_the_former_bash() -> None:
    script = BASH_NCCL_MATCH + "".join(
        f"if nccl_match {dev} '{spec}'; then echo 1; else echo 0; fi\n" for dev, spec, _ in CASES)
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.split()
    assert [o == "1" for o in out] == [netif.nccl_match(dev, spec) for dev, spec, _ in CASES]


def test_nccl_match_follows_nccl_where_the_bash_did_not() -> None:
    """NCCL's parser skips empty items and ``:port`` suffixes, and an empty list matches everything."""
    assert netif.nccl_match("eth0", "ib,,eth") and netif.nccl_match("eth0", "eth0:1234")
    assert netif.nccl_match("eth0", "") and not netif.nccl_match("eth0", "^")


def make_net(root: Path, states: dict[str, str]) -> Path:
    for name, state in states.items():
        (root / name).mkdir(parents=True)
        (root / name / "operstate").write_text(state + "\n")
    return root


class Routes:
    """A stand-in for ``ip route get``: the interface for each host, and who asked."""

    def __init__(self, table: dict[str, str]) -> None:
        self.table = table
        self.asked: list[str] = []

    def __call__(self, host: str) -> str | None:
        self.asked.append(host)
        return self.table.get(host)


def choose(sys_net: Path, *, configured: str | None = None, spec: str | None = None, coordinator: str | None = None,
           routes: Routes | None = None) -> netif.InterfaceChoice:
    return netif.choose_interface(sys_net, configured=configured, nccl_spec=spec, coordinator=coordinator,
                                  route_to=routes or Routes({}))


def test_kinds_in_order_infiniband_first(tmp_path: Path) -> None:
    net = make_net(tmp_path, {"eno1": "up", "bond0": "up", "hsn0": "up", "ib0": "up", "lo": "unknown",
                              "docker0": "up", "ib1": "down"})
    choice = choose(net)
    assert (choice.name, choice.reason) == ("ib0", "first up InfiniBand interface (ib*)")
    assert choice.nccl_socket_ifname == "=ib0" and choice.warning is None
    assert choice.candidates == ["ib0", "hsn0", "bond0", "eno1", "docker0", "lo"]
    (net / "ib0" / "operstate").write_text("down\n")
    assert choose(net).name == "hsn0"
    (net / "hsn0" / "operstate").write_text("lowerlayerdown\n")
    assert choose(net).name == "bond0"


def test_names_sort_naturally(tmp_path: Path) -> None:
    net = make_net(tmp_path, {"ib10": "up", "ib2": "up", "ibp65s0": "up"})
    assert choose(net).name == "ib2"


def test_the_route_to_the_coordinator_comes_before_ethernet(tmp_path: Path) -> None:
    net = make_net(tmp_path, {"eno1": "up", "eth0": "up", "vlan200": "up", "br0": "down", "lo": "unknown"})
    routes = Routes({"10.1.2.3": "vlan200", "10.9.9.9": "br0"})
    choice = choose(net, coordinator="10.1.2.3:41234", routes=routes)
    assert (choice.name, choice.reason) == ("vlan200", "routes to the coordinator 10.1.2.3")
    assert routes.asked == ["10.1.2.3"]
    # a route through an interface that is down is no answer: Ethernet next
    assert choose(net, coordinator="10.9.9.9:1", routes=routes).name == "eno1"
    assert choose(net, coordinator="[fd00::1]:29500", routes=routes).name == "eno1" and routes.asked[-1] == "fd00::1"
    # no coordinator (one process): nobody asks for routes
    quiet = Routes({})
    assert choose(net, routes=quiet).name == "eno1" and quiet.asked == []


def test_loopback_last_with_a_warning(tmp_path: Path) -> None:
    net = make_net(tmp_path, {"lo": "unknown", "eth0": "down", "docker0": "up"})
    choice = choose(net)
    assert (choice.name, choice.nccl_socket_ifname) == ("lo", "=lo")
    assert choice.warning is not None and "runtime.network_interface" in choice.warning
    assert choice.candidates == ["docker0", "lo"]
    assert choose(tmp_path / "no-such-dir").name == "lo"


def test_configured_interface_is_taken_as_it_is(tmp_path: Path) -> None:
    net = make_net(tmp_path, {"ib0": "up", "ens1f0np0": "up", "ens2": "down"})
    routes = Routes({"10.0.0.1": "ib0"})
    choice = choose(net, configured="ens1f0np0", spec="ib", coordinator="10.0.0.1:1", routes=routes)
    assert (choice.name, choice.nccl_socket_ifname, choice.reason) == ("ens1f0np0", "=ens1f0np0",
                                                                        "runtime.network_interface")
    assert routes.asked == []
    down = choose(net, configured="ens2")
    assert down.name == "ens2" and down.reason == "runtime.network_interface (here it is down)"
    assert choose(net, configured="ens9").reason == "runtime.network_interface (here it is missing)"


def test_nccl_socket_ifname_is_kept_and_gloo_gets_the_first_match(tmp_path: Path) -> None:
    net = make_net(tmp_path, {"docker0": "up", "eth0": "up", "eth1": "up", "lo": "unknown"})
    choice = choose(net, spec="^docker,lo")
    assert (choice.name, choice.nccl_socket_ifname) == ("eth0", "^docker,lo")
    assert choice.reason == "first up interface that NCCL_SOCKET_IFNAME=^docker,lo matches: first up Ethernet interface (eth*)"
    env = netif.network_env(choice, {})
    assert env == {"NCCL_SOCKET_IFNAME": "^docker,lo", "GLOO_SOCKET_IFNAME": "eth0", "MXC_NET_IFACE": "eth0"}
    assert netif.network_env(choice, {"GLOO_SOCKET_IFNAME": "eth1"})["GLOO_SOCKET_IFNAME"] == "eth1"
    assert choose(net, spec="=eth1").name == "eth1"


def test_nccl_socket_ifname_naming_another_kind_of_interface(tmp_path: Path) -> None:
    """The bash looked at ib/hsn/bond/en/eth/lo only: a spec naming a bridge found nothing."""
    net = make_net(tmp_path, {"br0": "up", "eth0": "up", "lo": "unknown"})
    assert choose(net, spec="br").name == "br0"
    assert choose(net, spec="lo").name == "lo" and choose(net, spec="lo").warning is not None


def test_nccl_socket_ifname_matching_nothing_up(tmp_path: Path) -> None:
    net = make_net(tmp_path, {"eth0": "up", "ib0": "down", "lo": "unknown"})
    choice = choose(net, spec="ib")
    assert (choice.name, choice.nccl_socket_ifname, choice.gloo_interface) == ("", "ib", "lo")
    assert choice.reason == "no interface that is up matches NCCL_SOCKET_IFNAME=ib"
    assert netif.network_env(choice, {})["MXC_NET_IFACE"] == ""


def test_recorded_vm_tree() -> None:
    """This VM's /sys/class/net as recorded: eth0 up, lo unknown, a podman bridge and two ifb down."""
    choice = choose(FIXTURES / "net-vm")
    assert (choice.name, choice.candidates) == ("eth0", ["eth0", "lo"])


def default_route_dev() -> str | None:
    out = subprocess.run(["ip", "-o", "route", "show", "default"], capture_output=True, text=True, check=False).stdout
    fields = out.split()
    return fields[fields.index("dev") + 1] if "dev" in fields else None


def test_this_machine() -> None:
    """The real /sys/class/net and the real ``ip route get``."""
    sys_net = Path("/sys/class/net")
    choice = netif.choose_interface(sys_net, configured=None, nccl_spec=None, coordinator=None,
                                    route_to=netif.route_via_ip)
    assert choice.name in choice.candidates and netif.is_up(sys_net, choice.name)
    assert choice.candidates == [n for n in choice.candidates if netif.is_up(sys_net, n)]
    # an address outside this machine goes by the default route (TEST-NET-2: routed, never answered)
    assert netif.route_via_ip("198.51.100.7") == default_route_dev()
    assert netif.route_via_ip("127.0.0.1") == "lo" and netif.route_via_ip("localhost") == "lo"
    local = netif.choose_interface(sys_net, configured=None, nccl_spec=None, coordinator="localhost:1234",
                                   route_to=netif.route_via_ip)
    assert local.name in ("lo", *[n for n in local.candidates if n.startswith(("ib", "hsn", "bond"))])


def test_route_via_ip_passes_only_addresses() -> None:
    assert netif.route_via_ip("-6") is None and netif.route_via_ip("no-such-host.invalid") is None


@pytest.mark.parametrize(("coordinator", "host"), [("node1:29500", "node1"), ("10.0.0.1:1", "10.0.0.1"),
                                                   ("[fe80::1]:29500", "fe80::1"), ("node1", "node1"),
                                                   ("fe80::1", "fe80::1")])
def test_coordinator_host(coordinator: str, host: str) -> None:
    assert netif.coordinator_host(coordinator) == host


# ---- RDMA


def test_infiniband_ports_as_recorded_by_prometheus_procfs() -> None:
    ports = netif.rdma_devices(FIXTURES / "infiniband-procfs")
    assert [(p.device, p.port, p.state, p.phys_state, p.link_layer, p.rate) for p in ports] == [
        ("hfi1_0", 1, "ACTIVE", "LinkUp", "InfiniBand", "100 Gb/sec (4X EDR)"),
        ("mlx4_0", 1, "ACTIVE", "LinkUp", "InfiniBand", "40 Gb/sec (4X QDR)"),
        ("mlx4_0", 2, "ACTIVE", "LinkUp", "InfiniBand", "40 Gb/sec (4X QDR)"),
        ("mlx5_0", 1, "ACTIVE", "ACTIVE", "InfiniBand", "25 Gb/sec (1X EDR)"),
    ]
    assert all(p.active and p.gids == [] for p in ports)


def test_roce_gid_table() -> None:
    ports = netif.rdma_devices(FIXTURES / "infiniband-roce-nccl1131")
    assert [(p.device, p.port, p.link_layer) for p in ports] == [("mlx5_0", 1, "Ethernet"), ("mlx5_1", 1, "Ethernet")]
    gids = ports[0].gids
    assert [(g.index, g.type, g.netdev) for g in gids] == [
        (0, "IB/RoCE v1", "ens3np0"), (1, "RoCE v2", "ens3np0"), (2, "IB/RoCE v1", "ens3np0"), (3, "RoCE v2", "ens3np0")]
    assert gids[3].gid == "0000:0000:0000:0000:0000:ffff:0b00:0048"  # 11.0.0.72, the entry NCCL_IB_GID_INDEX=3 means


def test_roce_gid_table_with_unset_entries_first(tmp_path: Path) -> None:
    """A Kubernetes pod (NVIDIA/nccl#1573): entries 0-3 unset, their type files missing."""
    ports = netif.rdma_devices(FIXTURES / "infiniband-roce-k8s-nccl1573")
    assert [g.index for g in ports[0].gids] == [4, 5, 6, 7]
    assert [g.netdev for g in ports[1].gids] == ["net2"] * 4
    # a populated entry whose type cannot be read is listed with no type
    tree = shutil.copytree(FIXTURES / "infiniband-roce-k8s-nccl1573", tmp_path / "ib")
    (tree / "mlx5_0" / "ports" / "1" / "gid_attrs" / "types" / "7").unlink()
    assert netif.rdma_devices(tree)[0].gids[-1].type is None


def test_rdma_reader_tolerates_odd_trees(tmp_path: Path) -> None:
    assert netif.rdma_devices(tmp_path / "none") == []
    (tmp_path / "mlx5_9").mkdir()
    (tmp_path / "mlx5_9" / "ports").write_text("not a directory")
    (tmp_path / "bnxt_re0" / "ports" / "1" / "gids").mkdir(parents=True)
    (tmp_path / "bnxt_re0" / "ports" / "1" / "state").write_bytes(b"\xff\xfe\x00garbage")
    (tmp_path / "bnxt_re0" / "ports" / "1" / "gids" / "0").write_bytes(b"\x00" * 100000)
    [port] = netif.rdma_devices(tmp_path)
    assert port.device == "bnxt_re0" and not port.active and port.link_layer == "" and port.gids == []


def test_what_mxc_chooses_names_exactly_that_interface_for_nccl() -> None:
    """A bare name is a prefix to NCCL: ib0 would also take an IPoIB child ib0.8001, eth1 also eth10."""
    names = ["ib0", "ib0.8001", "ib01", "eth1", "eth10"]
    assert [n for n in names if netif.nccl_match(n, "ib0")] == ["ib0", "ib0.8001", "ib01"]
    assert [n for n in names if netif.nccl_match(n, netif.exact("ib0"))] == ["ib0"]
    assert [n for n in names if netif.nccl_match(n, netif.exact("eth1"))] == ["eth1"]
