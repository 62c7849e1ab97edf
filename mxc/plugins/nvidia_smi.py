"""NVIDIA GPUs through ``nvidia-smi``: one ``--query-gpu`` CSV per scrape, and NVLink error
counters (``nvidia-smi nvlink -e``) at most once a minute.

Columns are found by name (the CSV header), not position, so a driver that adds fields does not
shift values; ``[N/A]`` and ``[Not Supported]`` become missing values, not zeros. A driver older
than a field refuses the whole query (``Field "x" is not a valid field to query``):
``negotiate_fields`` drops such fields once at start, so an old driver costs series, not the plugin.
"""

from __future__ import annotations

import csv
import io
import re
import subprocess
import time
from collections.abc import Callable

from mxc.plugins.gpu_reading import MIB, GpuReading, normalize_bus, number

BASE_FIELDS = ("index", "name", "uuid", "pci.bus_id", "utilization.gpu", "memory.used", "memory.total",
               "temperature.gpu", "power.draw")
ECC_BLOCKS = ("device_memory", "dram", "sram", "l1_cache", "l2_cache", "register_file", "texture_memory", "cbu", "total")
THROTTLE_REASONS = ("sw_power_cap", "sync_boost", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
FIELDS = (
    *BASE_FIELDS,
    "clocks.current.graphics", "clocks.current.memory",
    *(f"ecc.errors.{kind}.volatile.{block}" for kind in ("corrected", "uncorrected") for block in ECC_BLOCKS),
    "remapped_rows.correctable", "remapped_rows.uncorrectable", "remapped_rows.pending",
    *(f"clocks_event_reasons_counters.{reason}" for reason in THROTTLE_REASONS),
)
COMMAND_TIMEOUT = 10.0
NVLINK_INTERVAL = 60.0  # seconds between `nvidia-smi nvlink -e` runs: error counters move slowly, a process start does not
_UNKNOWN_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query')
_NVLINK_GPU = re.compile(r"^GPU (\d+):")
_NVLINK_COUNTER = re.compile(r"^\s*Link (\d+): ([A-Za-z ]+?) Errors?: (\d+)\s*$")

Runner = Callable[[list[str]], str]


def query_command(fields: tuple[str, ...]) -> list[str]:
    return ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv"]


def header_name(column: str) -> str:
    """'memory.used [MiB]' -> 'memory.used' (the header carries units unless nounits)."""
    return column.split("[", 1)[0].strip()


def _yes(text: str | None) -> float | None:
    if text is None:
        return None
    lowered = text.strip().lower()
    return 1.0 if lowered == "yes" else 0.0 if lowered == "no" else None


def parse_csv(text: str, fields: tuple[str, ...] = FIELDS) -> list[GpuReading]:
    """Rows of ``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]``.

    With a header, columns are matched by name (any field order, extra fields ignored);
    without one, ``fields`` gives the order. Memory is reported in MiB, clocks in MHz,
    throttle counters in microseconds.
    """
    rows = [row for row in csv.reader(io.StringIO(text), skipinitialspace=True) if row and any(c.strip() for c in row)]
    if not rows:
        return []
    first = [header_name(c) for c in rows[0]]
    if "index" in first or "name" in first or "utilization.gpu" in first:
        names, data = first, rows[1:]
    else:
        names, data = list(fields), rows
    out: list[GpuReading] = []
    for row in data:
        cell = dict(zip(names, (c.strip() for c in row), strict=False))
        used, total = number(cell.get("memory.used")), number(cell.get("memory.total"))
        util = number(cell.get("utilization.gpu"))
        graphics, memory = number(cell.get("clocks.current.graphics")), number(cell.get("clocks.current.memory"))
        reading = GpuReading(
            index=cell.get("index", str(len(out))), vendor="nvidia", name=cell.get("name", ""),
            bus=normalize_bus(cell.get("pci.bus_id", "")),
            utilization=None if util is None else util / 100,
            memory_used_bytes=None if used is None else used * MIB,
            memory_total_bytes=None if total is None else total * MIB,
            temperature_celsius=number(cell.get("temperature.gpu")),
            power_watts=number(cell.get("power.draw")),
            clock_graphics_hertz=None if graphics is None else graphics * 1e6,
            clock_memory_hertz=None if memory is None else memory * 1e6,
            row_remap_pending=_yes(cell.get("remapped_rows.pending")),
        )
        for kind, severity in (("corrected", "correctable"), ("uncorrected", "uncorrectable")):
            for block in ECC_BLOCKS:
                count = number(cell.get(f"ecc.errors.{kind}.volatile.{block}"))
                if count is not None:
                    reading.ecc[(block, severity)] = count
        for kind in ("correctable", "uncorrectable"):
            rows_remapped = number(cell.get(f"remapped_rows.{kind}"))
            if rows_remapped is not None:
                reading.remapped_rows[kind] = rows_remapped
        for reason in THROTTLE_REASONS:
            micros = number(cell.get(f"clocks_event_reasons_counters.{reason}"))
            if micros is not None:
                reading.throttled_seconds[reason] = micros / 1e6
        out.append(reading)
    return out


def parse_nvlink_errors(text: str) -> dict[str, dict[tuple[str, str], float]]:
    """``nvidia-smi nvlink -e``: GPU index -> {(link, kind): count}; kind is replay, recovery, crc, ..."""
    out: dict[str, dict[tuple[str, str], float]] = {}
    gpu: str | None = None
    for line in text.splitlines():
        header = _NVLINK_GPU.match(line)
        if header:
            gpu = header.group(1)
            out.setdefault(gpu, {})
            continue
        counter = _NVLINK_COUNTER.match(line)
        if counter and gpu is not None:
            link, kind, value = counter.groups()
            out[gpu][(link, "_".join(kind.lower().split()))] = float(value)
    return out


def negotiate_fields(run: Runner, fields: tuple[str, ...] = FIELDS) -> tuple[str, ...]:
    """The fields this driver answers: ask, drop each one it names as invalid, ask again."""
    wanted = list(fields)
    for _ in range(len(fields) + 1):
        try:
            run(query_command(tuple(wanted)))
            return tuple(wanted)
        except RuntimeError as exc:
            unknown = _UNKNOWN_FIELD.search(str(exc))
            if not unknown or unknown.group(1) not in wanted or unknown.group(1) in BASE_FIELDS:
                raise
            wanted.remove(unknown.group(1))
    return tuple(wanted)


class NvidiaSmi:
    """What the GPU plugin asks of nvidia-smi at each scrape."""

    def __init__(self, run: Runner, clock: Callable[[], float] = time.monotonic) -> None:
        self.run = run
        self.clock = clock
        self.fields = negotiate_fields(run)
        self._nvlink: dict[str, dict[tuple[str, str], float]] = {}
        self._nvlink_at: float | None = None
        self._nvlink_works = True

    def read(self) -> list[GpuReading]:
        readings = parse_csv(self.run(query_command(self.fields)), self.fields)
        for reading in readings:
            for (link, kind), count in self._nvlink_errors().get(reading.index, {}).items():
                reading.link_errors[("nvlink", link, kind)] = count
        return readings

    def _nvlink_errors(self) -> dict[str, dict[tuple[str, str], float]]:
        now = self.clock()
        if self._nvlink_works and (self._nvlink_at is None or now - self._nvlink_at >= NVLINK_INTERVAL):
            self._nvlink_at = now
            try:
                self._nvlink = parse_nvlink_errors(self.run(["nvidia-smi", "nvlink", "-e"]))
            except (RuntimeError, OSError, subprocess.TimeoutExpired):
                self._nvlink_works = False  # no NVLink (PCIe cards) or an old driver: stop asking
        return self._nvlink
