"""Host metrics from procfs: CPU, memory, load, disks, network, free space where the run writes.

Read straight from ``/proc`` (a few small files per scrape, no psutil) so the exporter costs
nothing measurable next to training. Parsers take the file text, so tests feed them
recorded files; ``proc`` is a parameter so a test can point the plugin at a fixture tree.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from mxc.plugins.api import PluginContext

CPU_MODES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
SECTOR_BYTES = 512  # /proc/diskstats counts 512-byte sectors whatever the device's sector size
SKIP_DISKS = ("loop", "ram", "zram", "dm-", "md", "sr", "fd")


def parse_cpu_seconds(stat_text: str, ticks_per_second: int) -> dict[str, float]:
    """Seconds spent per mode, summed over CPUs (the ``cpu`` line of /proc/stat)."""
    for line in stat_text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            values = [int(v) for v in fields[1 : 1 + len(CPU_MODES)]]
            return {mode: value / ticks_per_second for mode, value in zip(CPU_MODES, values, strict=False)}
    raise ValueError("no 'cpu' line in /proc/stat")


def count_cpus(stat_text: str) -> int:
    return sum(1 for line in stat_text.splitlines() if line.startswith("cpu") and line[3:4].isdigit())


def parse_meminfo(text: str) -> dict[str, int]:
    """Bytes for every ``Name: N kB`` line."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[name.strip()] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    return out


def parse_loadavg(text: str) -> tuple[float, float, float]:
    one, five, fifteen = (float(v) for v in text.split()[:3])
    return one, five, fifteen


@dataclass(frozen=True)
class DiskIO:
    device: str
    read_bytes: int
    written_bytes: int
    io_seconds: float


def parse_diskstats(text: str, whole_disks: set[str] | None = None) -> list[DiskIO]:
    """Per-device totals; partitions and virtual devices are left out (they double count)."""
    out = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 14:
            continue
        name = fields[2]
        if name.startswith(SKIP_DISKS) or (whole_disks is not None and name not in whole_disks):
            continue
        out.append(DiskIO(name, int(fields[5]) * SECTOR_BYTES, int(fields[9]) * SECTOR_BYTES, int(fields[12]) / 1000))
    return out


@dataclass(frozen=True)
class NetIO:
    interface: str
    received_bytes: int
    transmitted_bytes: int


def parse_net_dev(text: str) -> list[NetIO]:
    out = []
    for line in text.splitlines()[2:]:
        name, sep, rest = line.partition(":")
        fields = rest.split()
        if not sep or len(fields) < 9:
            continue
        out.append(NetIO(name.strip(), int(fields[0]), int(fields[8])))
    return out


class HostPlugin:
    name = "host"

    def __init__(self, context: PluginContext, proc: Path = Path("/proc"), sys_block: Path = Path("/sys/block")) -> None:
        self.proc = proc
        self.ticks = os.sysconf("SC_CLK_TCK")
        self.watch_path = context.run_dir
        try:
            self.whole_disks: set[str] | None = {p.name for p in sys_block.iterdir()}
        except OSError:
            self.whole_disks = None

    def _read(self, name: str) -> str:
        return (self.proc / name).read_text()

    def collect(self) -> Iterable[Metric]:
        return list(self._families())

    def _families(self) -> Iterator[Metric]:
        stat = self._read("stat")
        cpu = CounterMetricFamily("mxc_host_cpu_seconds", "CPU time summed over all CPUs, by mode (/proc/stat)",
                                  labels=["mode"])
        for mode, seconds in parse_cpu_seconds(stat, self.ticks).items():
            cpu.add_metric([mode], seconds)
        yield cpu
        yield GaugeMetricFamily("mxc_host_cpus", "CPUs the kernel reports", value=count_cpus(stat))
        one, five, _ = parse_loadavg(self._read("loadavg"))
        yield GaugeMetricFamily("mxc_host_load1", "1-minute load average", value=one)
        yield GaugeMetricFamily("mxc_host_load5", "5-minute load average", value=five)

        mem = parse_meminfo(self._read("meminfo"))
        yield GaugeMetricFamily("mxc_host_memory_total_bytes", "MemTotal", value=mem.get("MemTotal", 0))
        yield GaugeMetricFamily("mxc_host_memory_available_bytes", "MemAvailable: what can be allocated without swapping",
                                value=mem.get("MemAvailable", mem.get("MemFree", 0)))

        read = CounterMetricFamily("mxc_host_disk_read_bytes", "bytes read per disk (/proc/diskstats)", labels=["device"])
        written = CounterMetricFamily("mxc_host_disk_written_bytes", "bytes written per disk", labels=["device"])
        busy = CounterMetricFamily("mxc_host_disk_io_seconds", "seconds the disk was busy", labels=["device"])
        for disk in parse_diskstats(self._read("diskstats"), self.whole_disks):
            read.add_metric([disk.device], disk.read_bytes)
            written.add_metric([disk.device], disk.written_bytes)
            busy.add_metric([disk.device], disk.io_seconds)
        yield from (read, written, busy)

        rx = CounterMetricFamily("mxc_host_network_received_bytes", "bytes received per interface (/proc/net/dev)",
                                 labels=["interface"])
        tx = CounterMetricFamily("mxc_host_network_transmitted_bytes", "bytes sent per interface", labels=["interface"])
        for nic in parse_net_dev(self._read("net/dev")):
            rx.add_metric([nic.interface], nic.received_bytes)
            tx.add_metric([nic.interface], nic.transmitted_bytes)
        yield from (rx, tx)

        if self.watch_path is not None and self.watch_path.exists():
            fs = os.statvfs(self.watch_path)
            labels = [str(self.watch_path)]
            free = GaugeMetricFamily("mxc_host_filesystem_free_bytes", "free bytes where the run writes (checkpoints)",
                                     labels=["path"])
            free.add_metric(labels, fs.f_bavail * fs.f_frsize)
            size = GaugeMetricFamily("mxc_host_filesystem_size_bytes", "size of that file system", labels=["path"])
            size.add_metric(labels, fs.f_blocks * fs.f_frsize)
            yield from (free, size)


def create(context: PluginContext) -> HostPlugin:
    return HostPlugin(context)
