"""Network plugin: TCP counters (/proc/net/snmp, netstat), per-interface errors and link flaps,
RDMA port counters, on files recorded on this machine and on public recordings of RDMA
hosts (prometheus/procfs fixtures), then live on this machine's /proc."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

from mxc.plugins import network, rdma, tcp
from mxc.plugins.api import PluginContext
from mxc.plugins.host import parse_net_dev
from tests.plugin_samples import names, samples, value

FIXTURES = Path(__file__).parent / "fixtures"
PROC = FIXTURES / "procfs"
INFINIBAND = FIXTURES / "sys/infiniband-counters-procfs"


def test_tcp_counters_from_snmp_and_netstat() -> None:
    snmp = tcp.parse_snmp((PROC / "net/snmp").read_text())
    assert snmp[("Tcp", "RetransSegs")] == 361 and snmp[("Tcp", "OutSegs")] == 1253336
    assert snmp[("Tcp", "EstabResets")] == 352 and snmp[("Tcp", "MaxConn")] == -1
    ext = tcp.parse_snmp((PROC / "net/netstat").read_text())
    assert {("TcpExt", "ListenOverflows"), ("TcpExt", "ListenDrops"), ("TcpExt", "TCPAbortOnTimeout")} <= set(ext)
    assert ("IpExt", "InOctets") in ext  # every section, not only TCP's
    # a section whose header and values disagree in length keeps what pairs up
    assert tcp.parse_snmp("Tcp: A B C\nTcp: 1 2\n") == {("Tcp", "A"): 1, ("Tcp", "B"): 2}


def test_interface_counters_from_proc_net_dev() -> None:
    nets = {n.interface: n for n in parse_net_dev((PROC / "net/dev").read_text())}
    eth0 = nets["eth0"]
    assert eth0.received_packets > 0 and eth0.receive_errors == 0 and eth0.transmit_drops == 0
    line = "  eth1: 10 2 3 4 0 0 0 0 20 5 6 7 0 0 0 0\n"
    [nic] = parse_net_dev("header\nheader\n" + line)
    assert (nic.received_bytes, nic.received_packets, nic.receive_errors, nic.receive_drops) == (10, 2, 3, 4)
    assert (nic.transmitted_bytes, nic.transmitted_packets, nic.transmit_errors, nic.transmit_drops) == (20, 5, 6, 7)


def test_rdma_ports_recorded_on_real_hosts() -> None:
    """prometheus/procfs's recordings: an Omni-Path HFI, a dual-port ConnectX-3, a ConnectX-4 with hw_counters."""
    ports = {(p.device, p.port): p for p in rdma.read_all(INFINIBAND)}
    assert set(ports) == {("hfi1_0", "1"), ("mlx4_0", "1"), ("mlx4_0", "2"), ("mlx5_0", "1")}
    mlx5 = ports[("mlx5_0", "1")]
    assert mlx5.active
    data_words = int((INFINIBAND / "mlx5_0/ports/1/counters/port_rcv_data").read_text())
    assert mlx5.traffic["received_bytes"] == data_words * 4  # the IB counter counts 4-byte words
    assert mlx5.signals == {"ack_timeouts": 131, "sequence_errors": 1, "requester_cqe_errors": 3481,
                            "responder_cqe_errors": 8109}
    assert mlx5.errors["link_downed"] == 0 and "symbol_error" in mlx5.errors
    assert ports[("hfi1_0", "1")].signals == {}  # no hw_counters: no signal series, not zeros


def test_rdma_ionic_names_and_a_port_without_standard_counters(tmp_path: Path) -> None:
    """AMD's ionic AI NIC exposes traffic and retransmits only in hw_counters/ (names as AMD's
    tools read them); a port that is down says 0."""
    port = tmp_path / "ionic_0/ports/1"
    (port / "hw_counters").mkdir(parents=True)
    (port / "state").write_text("1: DOWN\n")
    files = {"rx_rdma_ucast_bytes": 1000, "tx_rdma_ucast_bytes": 2000, "tx_rdma_retx_pkts": 7, "tx_rdma_ack_timeout": 3,
             "req_tx_retry_excd_err": 1, "rx_rdma_ecn_pkts": 40, "tx_rdma_cnp_pkts": 5, "rx_rdma_cnp_pkts": 6,
             "req_rx_cqe_err": 2, "req_rx_pkt_seq_err": 9}
    for name, count in files.items():
        (port / "hw_counters" / name).write_text(f"{count}\n")
    [reading] = rdma.read_all(tmp_path)
    assert not reading.active
    assert reading.traffic == {"received_bytes": 1000, "transmitted_bytes": 2000}
    assert reading.signals == {"ack_timeouts": 3, "retransmitted_packets": 7, "retry_exceeded": 1, "sequence_errors": 9,
                               "ecn_marked_packets": 40, "cnp_sent": 5, "cnp_received": 6, "requester_cqe_errors": 2}
    found = samples(type("P", (), {"collect": lambda self: list(rdma.families([reading]))})())
    assert value(found, "mxc_rdma_port_active", device="ionic_0", port="1") == 0
    assert value(found, "mxc_rdma_retransmitted_packets_total", device="ionic_0", port="1") == 7


def test_network_plugin_series_on_recorded_trees(tmp_path: Path) -> None:
    sys_net = tmp_path / "net"
    for name, state, flaps in (("eth0", "up", "2"), ("lo", "unknown", "0")):
        (sys_net / name).mkdir(parents=True)
        (sys_net / name / "operstate").write_text(state + "\n")
        (sys_net / name / "carrier_changes").write_text(flaps + "\n")
    proc = tmp_path / "proc"
    shutil.copytree(PROC, proc)
    with open(proc / "net/dev", "a") as fh:
        fh.write("vethab12: 1 1 0 0 0 0 0 0 1 1 0 0 0 0 0 0\n")
    plugin = network.NetworkPlugin(PluginContext(run_dir=None), proc=proc, sys_net=sys_net, infiniband=INFINIBAND)
    found = samples(plugin)
    assert value(found, "mxc_host_tcp_retransmitted_segments_total") == 361
    assert value(found, "mxc_host_tcp_listen_drops_total") >= 0
    assert value(found, "mxc_host_network_carrier_changes_total", interface="eth0") == 2
    assert value(found, "mxc_host_network_up", interface="eth0") == 1
    assert value(found, "mxc_host_network_up", interface="lo") == 0
    assert value(found, "mxc_host_network_receive_drops_total", interface="eth0") == 0
    assert not any(dict(labels).get("interface", "").startswith("veth") for _, labels in found)
    assert value(found, "mxc_rdma_ack_timeouts_total", device="mlx5_0", port="1") == 131
    assert value(found, "mxc_rdma_port_errors_total", device="mlx4_0", port="2", counter="symbol_error") == 0
    (proc / "net/snmp").unlink()  # TCP left out, interfaces and RDMA still there
    found = samples(plugin)
    assert not any(n.startswith("mxc_host_tcp") for n in names(found))
    assert "mxc_rdma_port_active" in names(found) and "mxc_host_network_up" in names(found)


def test_live_tcp_retransmit_counter_is_this_machines() -> None:
    """The live counters move: a connection to a closed port sends a reset, counted as sent."""
    plugin = network.create(PluginContext(run_dir=None))
    before = value(samples(plugin), "mxc_host_tcp_resets_sent_total")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
    with socket.socket() as client:  # nobody listens there any more: the kernel answers with a RST
        assert client.connect_ex(("127.0.0.1", port)) != 0
    after = samples(plugin)
    assert value(after, "mxc_host_tcp_resets_sent_total") > before
    assert value(after, "mxc_host_network_up", interface="lo") in (0, 1)
