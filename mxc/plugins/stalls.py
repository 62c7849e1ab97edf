"""The kernel's own signals that a node is stalling: pressure stall information (PSI) for CPU,
I/O and memory, OOM kills, runnable and D-state (uninterruptible, usually I/O) processes,
context switches, and dirty and writeback page cache.

Why these: a training that slows down or stops without an error is most often waiting on
something the host shows first. A checkpoint flushed to a shared file system fills the dirty
and writeback page cache and puts tasks in D state; PSI ``io full`` then says how much of the
time *every* runnable task was stalled on I/O; a host OOM kill ends a rank without a Python
traceback. All of it is a few lines of text in procfs, read at every scrape for almost nothing.

Parsers take text (tests feed recorded files); ``families`` turns a reading into metrics.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

PSI_RESOURCES = ("cpu", "io", "memory")


def parse_psi(text: str) -> dict[str, float]:
    """``/proc/pressure/<resource>``: seconds stalled per line (``some``, ``full``), from ``total=`` (µs).

    ``some``: at least one runnable task was stalled; ``full``: all of them were (on the CPU file
    of kernels before 5.13 there is no ``full`` line). The averages (avg10...) are left out: the
    rate of the total over any window says the same for exactly the window asked about.
    """
    out: dict[str, float] = {}
    for line in text.splitlines():
        kind, *pairs = line.split() or [""]
        values = dict(pair.split("=", 1) for pair in pairs if "=" in pair)
        if kind in ("some", "full") and values.get("total", "").isdigit():
            out[kind] = int(values["total"]) / 1e6
    return out


def parse_key_values(text: str) -> dict[str, int]:
    """``name value`` lines (``/proc/vmstat``, the counter lines of ``/proc/stat``)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


@dataclass
class StallReading:
    pressure: dict[str, dict[str, float]] = field(default_factory=dict)  # resource -> {some, full} seconds
    procs_running: int | None = None
    procs_blocked: int | None = None
    context_switches: int | None = None
    oom_kills: int | None = None
    dirty_bytes: int | None = None
    writeback_bytes: int | None = None


def read(proc: Path, stat_text: str, meminfo: Mapping[str, int]) -> StallReading:
    """What this module exports, from ``proc`` plus the /proc/stat and meminfo the host plugin read."""
    reading = StallReading()
    stat = parse_key_values(stat_text)
    reading.procs_running, reading.procs_blocked = stat.get("procs_running"), stat.get("procs_blocked")
    reading.context_switches = stat.get("ctxt")
    reading.dirty_bytes, reading.writeback_bytes = meminfo.get("Dirty"), meminfo.get("Writeback")
    with contextlib.suppress(OSError):
        reading.oom_kills = parse_key_values((proc / "vmstat").read_text()).get("oom_kill")  # Linux >= 4.13
    for resource in PSI_RESOURCES:
        try:
            reading.pressure[resource] = parse_psi((proc / "pressure" / resource).read_text())
        except OSError:  # no PSI (CONFIG_PSI off, or psi=0 on the kernel command line)
            continue
    return reading


def families(reading: StallReading) -> Iterator[Metric]:
    if reading.pressure:
        stalled = CounterMetricFamily(
            "mxc_host_pressure_stalled_seconds",
            "time tasks were stalled waiting for a resource (PSI, /proc/pressure): scope some = at least one "
            "task, full = all of them; rate() is the fraction of time stalled", labels=["resource", "scope"])
        for resource, scopes in sorted(reading.pressure.items()):
            for scope, seconds in sorted(scopes.items()):
                stalled.add_metric([resource, scope], seconds)
        yield stalled
    gauges = (
        ("mxc_host_procs_running", "runnable processes (/proc/stat procs_running)", reading.procs_running),
        ("mxc_host_procs_blocked", "processes in uninterruptible sleep, D state, mostly waiting on I/O "
                                   "(/proc/stat procs_blocked)", reading.procs_blocked),
        ("mxc_host_memory_dirty_bytes", "page cache waiting to be written back (/proc/meminfo Dirty)", reading.dirty_bytes),
        ("mxc_host_memory_writeback_bytes", "page cache being written back now (/proc/meminfo Writeback)",
         reading.writeback_bytes),
    )
    for name, doc, value in gauges:
        if value is not None:
            yield GaugeMetricFamily(name, doc, value=value)
    if reading.context_switches is not None:
        yield CounterMetricFamily("mxc_host_context_switches", "context switches (/proc/stat ctxt)",
                                  value=reading.context_switches)
    if reading.oom_kills is not None:
        yield CounterMetricFamily("mxc_host_oom_kills", "processes killed by the kernel's OOM killer, host or cgroup "
                                  "(/proc/vmstat oom_kill)", value=reading.oom_kills)
