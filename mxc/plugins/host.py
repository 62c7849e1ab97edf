"""Host metrics from procfs: CPU, memory, load, disks, network bytes, free space where the run
writes, the kernel's stall signals (PSI, OOM kills, D-state, dirty pages: ``stalls.py``) and GPU
driver errors in the kernel log (``kmsg.py``).

Read straight from ``/proc`` (a few small files per scrape, no psutil) so the exporter costs
nothing measurable next to training. Parsers take the file text, so tests feed them
recorded files; ``proc`` is a parameter so a test can point the plugin at a fixture tree.
Each part is read on its own: a file this kernel does not have (no PSI, no readable
/dev/kmsg) leaves out that part's series, logged once, never the rest.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from mxc.plugins import kmsg, stalls
from mxc.plugins.api import Parts, PluginContext

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
    received_packets: int = 0
    transmitted_packets: int = 0
    receive_errors: int = 0
    transmit_errors: int = 0
    receive_drops: int = 0  # the kernel's rx_dropped + rx_missed_errors (the NIC's ring overflowed)
    transmit_drops: int = 0


def parse_net_dev(text: str) -> list[NetIO]:
    """``/proc/net/dev``: the per-interface counters of /sys/class/net/*/statistics, all in one read."""
    out = []
    for line in text.splitlines()[2:]:
        name, sep, rest = line.partition(":")
        fields = [int(v) for v in rest.split()]
        if not sep or len(fields) < 12:
            continue
        out.append(NetIO(name.strip(), received_bytes=fields[0], transmitted_bytes=fields[8],
                         received_packets=fields[1], transmitted_packets=fields[9], receive_errors=fields[2],
                         transmit_errors=fields[10], receive_drops=fields[3], transmit_drops=fields[11]))
    return out


class HostPlugin:
    name = "host"

    def __init__(self, context: PluginContext, proc: Path = Path("/proc"), sys_block: Path = Path("/sys/block"),
                 kernel_log: Path | None = Path("/dev/kmsg")) -> None:
        self.proc = proc
        self.ticks = os.sysconf("SC_CLK_TCK")
        self.watch_path = context.run_dir
        self.log = context.log
        self._parts = Parts("host", self.log)
        try:
            self.whole_disks: set[str] | None = {p.name for p in sys_block.iterdir()}
        except OSError:
            self.whole_disks = None
        self.kernel_log: kmsg.KernelLog | None = None
        if kernel_log is not None:
            try:
                self.kernel_log = kmsg.KernelLog(kernel_log)
            except OSError as exc:
                self.log.info("host: kernel log %s not readable (%s): no GPU driver error counts", kernel_log,
                              exc.strerror or exc)

    def _read(self, name: str) -> str:
        return (self.proc / name).read_text()

    def collect(self) -> Iterable[Metric]:
        stat, meminfo = self._read("stat"), parse_meminfo(self._read("meminfo"))  # the basics: no host plugin without
        parts: list[tuple[str, Callable[[], Iterator[Metric]]]] = [
            ("cpu", lambda: self._cpu(stat)),
            ("memory", lambda: self._memory(meminfo)),
            ("stalls", lambda: stalls.families(stalls.read(self.proc, stat, meminfo))),
            ("disks", self._disks),
            ("network", self._network),
            ("filesystem", self._filesystem),
            ("kernel log", self._kernel_log),
        ]
        return self._parts.collect(parts)

    def _cpu(self, stat: str) -> Iterator[Metric]:
        cpu = CounterMetricFamily("mxc_host_cpu_seconds", "CPU time summed over all CPUs, by mode (/proc/stat)",
                                  labels=["mode"])
        for mode, seconds in parse_cpu_seconds(stat, self.ticks).items():
            cpu.add_metric([mode], seconds)
        yield cpu
        yield GaugeMetricFamily("mxc_host_cpus", "CPUs the kernel reports", value=count_cpus(stat))
        one, five, _ = parse_loadavg(self._read("loadavg"))
        yield GaugeMetricFamily("mxc_host_load1", "1-minute load average", value=one)
        yield GaugeMetricFamily("mxc_host_load5", "5-minute load average", value=five)

    def _memory(self, mem: dict[str, int]) -> Iterator[Metric]:
        yield GaugeMetricFamily("mxc_host_memory_total_bytes", "MemTotal", value=mem.get("MemTotal", 0))
        yield GaugeMetricFamily("mxc_host_memory_available_bytes", "MemAvailable: what can be allocated without swapping",
                                value=mem.get("MemAvailable", mem.get("MemFree", 0)))

    def _disks(self) -> Iterator[Metric]:
        read = CounterMetricFamily("mxc_host_disk_read_bytes", "bytes read per disk (/proc/diskstats)", labels=["device"])
        written = CounterMetricFamily("mxc_host_disk_written_bytes", "bytes written per disk", labels=["device"])
        busy = CounterMetricFamily("mxc_host_disk_io_seconds", "seconds the disk was busy", labels=["device"])
        for disk in parse_diskstats(self._read("diskstats"), self.whole_disks):
            read.add_metric([disk.device], disk.read_bytes)
            written.add_metric([disk.device], disk.written_bytes)
            busy.add_metric([disk.device], disk.io_seconds)
        yield from (read, written, busy)

    def _network(self) -> Iterator[Metric]:
        rx = CounterMetricFamily("mxc_host_network_received_bytes", "bytes received per interface (/proc/net/dev)",
                                 labels=["interface"])
        tx = CounterMetricFamily("mxc_host_network_transmitted_bytes", "bytes sent per interface", labels=["interface"])
        for nic in parse_net_dev(self._read("net/dev")):
            rx.add_metric([nic.interface], nic.received_bytes)
            tx.add_metric([nic.interface], nic.transmitted_bytes)
        yield from (rx, tx)

    def _filesystem(self) -> Iterator[Metric]:
        if self.watch_path is None or not self.watch_path.exists():
            return
        fs = os.statvfs(self.watch_path)
        labels = [str(self.watch_path)]
        free = GaugeMetricFamily("mxc_host_filesystem_free_bytes", "free bytes where the run writes (checkpoints)",
                                 labels=["path"])
        free.add_metric(labels, fs.f_bavail * fs.f_frsize)
        size = GaugeMetricFamily("mxc_host_filesystem_size_bytes", "size of that file system", labels=["path"])
        size.add_metric(labels, fs.f_blocks * fs.f_frsize)
        yield from (free, size)

    def _kernel_log(self) -> Iterator[Metric]:
        readable = self.kernel_log is not None
        yield GaugeMetricFamily("mxc_host_kernel_log_readable", "1 when the exporter can read the kernel log "
                                "(/dev/kmsg: root or CAP_SYSLOG), so GPU driver errors are counted", value=int(readable))
        if self.kernel_log is None:
            return
        counts = self.kernel_log.poll()
        errors = CounterMetricFamily("mxc_host_kernel_gpu_errors", "GPU driver errors logged by the kernel: NVIDIA Xid "
                                     "events, amdgpu lines at warning level or worse", labels=["driver"])
        for driver, count in sorted(counts.by_driver.items()):
            errors.add_metric([driver], count)
        yield errors
        xids = CounterMetricFamily("mxc_host_kernel_gpu_xid", "NVIDIA Xid events by Xid code (NVIDIA's Xid catalog "
                                   "says what each code means: 48 double-bit ECC, 79 fell off the bus, ...)", labels=["xid"])
        for code, count in sorted(counts.by_xid.items(), key=lambda item: int(item[0])):
            xids.add_metric([code], count)
        yield xids


def create(context: PluginContext) -> HostPlugin:
    return HostPlugin(context)
