"""RDMA (InfiniBand, RoCE) port counters from ``/sys/class/infiniband/<device>/ports/<port>/``.

Why: collectives between nodes run over RDMA, and a degraded fabric rarely fails a job; it slows
every step. Retransmissions, ACK timeouts, NAK sequence errors (lost packets), congestion
marks (ECN) and congestion notification packets (CNP) say which port and when.

Two sources per port:

* ``counters/``: the InfiniBand standard port counters every driver has (data in units of 4
  bytes, per the IBA spec; converted to bytes here), and the standard error counters;
* ``hw_counters/``: driver-specific names. Each signal below is read from the first of its
  known file names that exists (mlx5 and bnxt_re share names since Linux 6.x; AMD's ionic AI NIC
  and older bnxt_re use their own). Only those files are read: each read of an mlx5 or ionic
  hw_counter may query the NIC firmware, so the plugin reads a dozen files per port, not all.

A signal the port's driver has no counter for is left out (absent, not 0).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

IB_DATA_WORD = 4  # port_rcv_data/port_xmit_data count 4-byte words (IBA spec, "octets divided by 4")
STANDARD_ERRORS = (
    "symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors", "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors", "port_xmit_discards", "port_xmit_constraint_errors", "port_rcv_constraint_errors",
    "local_link_integrity_errors", "excessive_buffer_overrun_errors", "VL15_dropped",
)
# signal -> hw_counters file names that count it, first found wins
# (mlx5: drivers/infiniband/hw/mlx5/counters.c; bnxt_re: drivers/infiniband/hw/bnxt_re/hw_counters.c;
#  ionic: AMD Pensando/Pollara AI NIC driver names)
SIGNALS: dict[str, tuple[str, ...]] = {
    "ack_timeouts": ("local_ack_timeout_err", "to_retransmits", "tx_rdma_ack_timeout"),
    "retransmitted_packets": ("tx_rdma_retx_pkts",),
    "retry_exceeded": ("req_tx_retry_excd_err", "max_retry_exceeded"),
    "sequence_errors": ("packet_seq_err", "seq_err_naks_rcvd", "req_rx_pkt_seq_err"),
    "ecn_marked_packets": ("np_ecn_marked_roce_packets", "rx_rdma_ecn_pkts"),
    "cnp_sent": ("np_cnp_sent", "tx_rdma_cnp_pkts"),
    "cnp_received": ("rp_cnp_handled", "rx_rdma_cnp_pkts"),
    "requester_cqe_errors": ("req_cqe_error", "req_rx_cqe_err"),
    "responder_cqe_errors": ("resp_cqe_error", "resp_rx_cqe_err"),
}
# traffic from hw_counters, for drivers without counters/ (ionic: bytes; bnxt_re: bytes)
HW_TRAFFIC: dict[str, tuple[str, ...]] = {
    "received_bytes": ("rx_rdma_ucast_bytes", "rx_bytes"),
    "transmitted_bytes": ("tx_rdma_ucast_bytes", "tx_bytes"),
    "received_packets": ("rx_rdma_ucast_pkts", "rx_pkts"),
    "transmitted_packets": ("tx_rdma_ucast_pkts", "tx_pkts"),
}
SIGNAL_HELP = {
    "ack_timeouts": "transport ACK timeouts: a request not acknowledged in time was retried (mlx5/bnxt_re "
                    "local_ack_timeout_err, ionic tx_rdma_ack_timeout)",
    "retransmitted_packets": "packets retransmitted (ionic tx_rdma_retx_pkts; mlx5 and bnxt_re have no such counter)",
    "retry_exceeded": "requests that failed after exhausting their retries: the QP is in error, the collective fails "
                      "(ionic req_tx_retry_excd_err, bnxt_re max_retry_exceeded)",
    "sequence_errors": "NAK sequence errors received: the peer saw a gap, a packet was lost (mlx5 packet_seq_err, "
                       "ionic req_rx_pkt_seq_err)",
    "ecn_marked_packets": "packets received with an ECN congestion mark (mlx5 np_ecn_marked_roce_packets, "
                          "ionic rx_rdma_ecn_pkts)",
    "cnp_sent": "congestion notification packets sent to senders (mlx5 np_cnp_sent, ionic tx_rdma_cnp_pkts)",
    "cnp_received": "congestion notification packets received and acted on by slowing down (mlx5 rp_cnp_handled, "
                    "ionic rx_rdma_cnp_pkts)",
    "requester_cqe_errors": "work completions with an error on the requester side (mlx5 req_cqe_error, ionic "
                            "req_rx_cqe_err)",
    "responder_cqe_errors": "work completions with an error on the responder side (mlx5 resp_cqe_error, ionic "
                            "resp_rx_cqe_err)",
}


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _first(folder: Path, names: tuple[str, ...]) -> int | None:
    for name in names:
        value = _read_int(folder / name)
        if value is not None:
            return value
    return None


@dataclass
class PortReading:
    device: str
    port: str
    active: bool
    traffic: dict[str, int] = field(default_factory=dict)  # received/transmitted bytes/packets
    errors: dict[str, int] = field(default_factory=dict)  # standard counters/ error name -> count
    signals: dict[str, int] = field(default_factory=dict)  # SIGNALS key -> count


def read_port(device: str, port_dir: Path) -> PortReading:
    state = ""
    with contextlib.suppress(OSError):
        state = (port_dir / "state").read_text()
    reading = PortReading(device, port_dir.name, "ACTIVE" in state.upper())  # "4: ACTIVE"
    standard, hw = port_dir / "counters", port_dir / "hw_counters"
    if standard.is_dir():
        for key, name, scale in (("received_bytes", "port_rcv_data", IB_DATA_WORD),
                                 ("transmitted_bytes", "port_xmit_data", IB_DATA_WORD),
                                 ("received_packets", "port_rcv_packets", 1),
                                 ("transmitted_packets", "port_xmit_packets", 1)):
            value = _read_int(standard / name)
            if value is not None:
                reading.traffic[key] = value * scale
        for name in STANDARD_ERRORS:
            value = _read_int(standard / name)
            if value is not None:
                reading.errors[name] = value
    if hw.is_dir():
        if not reading.traffic:
            for key, names in HW_TRAFFIC.items():
                value = _first(hw, names)
                if value is not None:
                    reading.traffic[key] = value
        for signal, names in SIGNALS.items():
            value = _first(hw, names)
            if value is not None:
                reading.signals[signal] = value
    return reading


def read_all(root: Path = Path("/sys/class/infiniband")) -> list[PortReading]:
    """Every port of every RDMA device; [] where there is none."""
    try:
        devices = sorted(root.iterdir())
    except OSError:
        return []
    out: list[PortReading] = []
    for device in devices:
        try:
            ports = sorted((device / "ports").iterdir(), key=lambda p: (len(p.name), p.name))
        except OSError:
            continue
        out.extend(read_port(device.name, port) for port in ports)
    return out


def families(ports: list[PortReading]) -> Iterator[Metric]:
    labels = ["device", "port"]
    active = GaugeMetricFamily("mxc_rdma_port_active", "1 when the RDMA port's state is ACTIVE (ports/N/state)", labels=labels)
    traffic = {key: CounterMetricFamily(f"mxc_rdma_{key}", f"{key.replace('_', ' ')} on the port (counters/, else hw_counters/)",
                                        labels=labels) for key in HW_TRAFFIC}
    errors = CounterMetricFamily("mxc_rdma_port_errors", "InfiniBand standard port error counters (counters/<counter>): "
                                 "symbol errors, link downs, receive errors, transmit discards, ...", labels=[*labels, "counter"])
    signals = {key: CounterMetricFamily(f"mxc_rdma_{key}", SIGNAL_HELP[key], labels=labels) for key in SIGNALS}
    for port in ports:
        at = [port.device, port.port]
        active.add_metric(at, int(port.active))
        for key, value in port.traffic.items():
            traffic[key].add_metric(at, value)
        for name, value in port.errors.items():
            errors.add_metric([*at, name], value)
        for key, value in port.signals.items():
            signals[key].add_metric(at, value)
    yield active
    yield from traffic.values()
    yield errors
    yield from signals.values()
