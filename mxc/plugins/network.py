"""Network health: TCP's retransmits and resets (``tcp.py``), per-interface packets, errors,
drops and link flaps, and RDMA port counters (``rdma.py``).

A plugin of its own, apart from ``host``: RDMA counters may cost firmware queries, and its
``mxc_exporter_plugin_collect_seconds{plugin="network"}`` shows that cost on its own. Each part
is read on its own; a missing source (no RDMA device, a kernel without a file) leaves out that
part, never the others.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from mxc.plugins import rdma, tcp
from mxc.plugins.api import Parts, PluginContext
from mxc.plugins.host import parse_net_dev

SKIP_INTERFACES = ("veth",)  # one per container on a busy host: hundreds of series that say nothing about the job


class NetworkPlugin:
    name = "network"

    def __init__(self, context: PluginContext, proc: Path = Path("/proc"), sys_net: Path = Path("/sys/class/net"),
                 infiniband: Path = Path("/sys/class/infiniband")) -> None:
        self.proc, self.sys_net, self.infiniband = proc, sys_net, infiniband
        self.log = context.log
        self._parts = Parts("network", self.log)

    def collect(self) -> Iterable[Metric]:
        parts: list[tuple[str, Callable[[], Iterator[Metric]]]] = [
            ("tcp", self._tcp), ("interfaces", self._interfaces), ("rdma", lambda: rdma.families(rdma.read_all(self.infiniband))),
        ]
        return self._parts.collect(parts)

    def _tcp(self) -> Iterator[Metric]:
        counters = tcp.parse_snmp((self.proc / "net/snmp").read_text())
        with contextlib.suppress(OSError):  # TcpExt: absent in some containers' procfs
            counters.update(tcp.parse_snmp((self.proc / "net/netstat").read_text()))
        yield from tcp.families(counters)

    def _interfaces(self) -> Iterator[Metric]:
        labels = ["interface"]
        specs = (
            ("received_packets", "mxc_host_network_received_packets", "packets received"),
            ("transmitted_packets", "mxc_host_network_transmitted_packets", "packets sent"),
            ("receive_errors", "mxc_host_network_receive_errors", "receive errors: CRC, frame, length, FIFO overruns"),
            ("transmit_errors", "mxc_host_network_transmit_errors", "transmit errors: carrier, aborted, FIFO"),
            ("receive_drops", "mxc_host_network_receive_drops", "received packets dropped: no buffer, or the NIC's "
                                                                "ring overflowed (rx_dropped + rx_missed_errors)"),
            ("transmit_drops", "mxc_host_network_transmit_drops", "packets dropped on the way out"),
        )
        found = {key: CounterMetricFamily(name, f"{doc}, per interface (/proc/net/dev)", labels=labels)
                 for key, name, doc in specs}
        up = GaugeMetricFamily("mxc_host_network_up", "1 when the interface's operstate is up (/sys/class/net/*/operstate)",
                               labels=labels)
        flaps = CounterMetricFamily("mxc_host_network_carrier_changes", "times the link went down or up "
                                    "(/sys/class/net/*/carrier_changes): a flapping cable or switch port", labels=labels)
        for nic in parse_net_dev((self.proc / "net/dev").read_text()):
            if nic.interface.startswith(SKIP_INTERFACES):
                continue
            for key, family in found.items():
                family.add_metric([nic.interface], getattr(nic, key))
            folder = self.sys_net / nic.interface
            with contextlib.suppress(OSError):
                up.add_metric([nic.interface], int((folder / "operstate").read_text().strip() == "up"))
            with contextlib.suppress(OSError, ValueError):
                flaps.add_metric([nic.interface], int((folder / "carrier_changes").read_text()))
        yield from found.values()
        yield up
        yield flaps


def create(context: PluginContext) -> NetworkPlugin:
    return NetworkPlugin(context)
