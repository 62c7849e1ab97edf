"""TCP's own counters of trouble, from ``/proc/net/snmp`` (``Tcp:``) and ``/proc/net/netstat``
(``TcpExt:``): retransmitted segments, resets, listen-queue overflows and drops, connections
aborted after their retransmissions timed out.

Why: the JAX coordination service, Ray, NFS and NCCL's bootstrap all run over TCP. A rising
retransmit rate during slow steps points at the network; listen drops on the coordinator's node
mean its gRPC server could not accept connections (heartbeat timeouts follow); an
abort-on-timeout is a peer that stopped answering. Counters are per network namespace: the
exporter sees the host's when it runs in the host's namespace (the default for mxc, Slurm and
Apptainer; a Podman run with its own network would only show its own).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric

# (section, field) -> (metric name without _total, help)
COUNTERS: dict[tuple[str, str], tuple[str, str]] = {
    ("Tcp", "OutSegs"): ("mxc_host_tcp_segments_sent", "TCP segments sent, retransmissions excluded (Tcp OutSegs)"),
    ("Tcp", "RetransSegs"): ("mxc_host_tcp_retransmitted_segments", "TCP segments retransmitted (Tcp RetransSegs); "
                             "rate() of it over rate() of segments_sent is the retransmit ratio"),
    ("Tcp", "EstabResets"): ("mxc_host_tcp_established_resets", "established connections reset, by either side "
                             "(Tcp EstabResets)"),
    ("Tcp", "OutRsts"): ("mxc_host_tcp_resets_sent", "TCP resets sent (Tcp OutRsts)"),
    ("TcpExt", "ListenOverflows"): ("mxc_host_tcp_listen_overflows", "connections a listening socket's accept queue "
                                    "had no room for (TcpExt ListenOverflows)"),
    ("TcpExt", "ListenDrops"): ("mxc_host_tcp_listen_drops", "incoming connections dropped by listening sockets, any "
                                "reason (TcpExt ListenDrops)"),
    ("TcpExt", "TCPAbortOnTimeout"): ("mxc_host_tcp_aborted_on_timeout", "connections given up after their "
                                      "retransmissions timed out: the peer stopped answering (TcpExt TCPAbortOnTimeout)"),
    ("TcpExt", "TCPTimeouts"): ("mxc_host_tcp_retransmit_timeouts", "retransmission timer expiries (TcpExt TCPTimeouts)"),
}


def parse_snmp(text: str) -> dict[tuple[str, str], int]:
    """``/proc/net/snmp`` or ``/proc/net/netstat``: pairs of ``Section: names`` / ``Section: values`` lines."""
    out: dict[tuple[str, str], int] = {}
    header: dict[str, list[str]] = {}
    for line in text.splitlines():
        section, sep, rest = line.partition(":")
        if not sep:
            continue
        fields = rest.split()
        if section not in header:
            header[section] = fields
            continue
        names = header.pop(section)  # the next line of this section is a new header
        for name, value in zip(names, fields, strict=False):
            if value.lstrip("-").isdigit():
                out[(section, name)] = int(value)
    return out


def families(snmp: dict[tuple[str, str], int]) -> Iterator[Metric]:
    for key, (name, doc) in COUNTERS.items():
        if key in snmp:
            yield CounterMetricFamily(name, doc, value=snmp[key])
