"""GPU metrics: NVIDIA through ``nvidia-smi --query-gpu`` CSV, AMD through ``rocm-smi --json``
or, without rocm-smi, the amdgpu sysfs files.

The command-line tools are what every node of a cluster has; their output is parsed by
pure functions tested against outputs recorded on real GPUs (tests/fixtures/gpu/). Columns
are found by name (the CSV header), not position, so a driver that adds fields does not
shift values; ``[N/A]`` and ``[Not Supported]`` become missing values, not zeros.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import re
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily, Metric

from mxc.plugins.api import PluginContext, PluginUnavailable

NVIDIA_FIELDS = ("index", "name", "uuid", "pci.bus_id", "utilization.gpu", "memory.used", "memory.total",
                 "temperature.gpu", "power.draw")
NVIDIA_COMMAND = ["nvidia-smi", f"--query-gpu={','.join(NVIDIA_FIELDS)}", "--format=csv"]
ROCM_COMMAND = ["rocm-smi", "--showuse", "--showmeminfo", "vram", "--showtemp", "--showpower", "--showproductname",
                "--showbus", "--json"]
COMMAND_TIMEOUT = 10.0
MIB = 1024 * 1024
AMD_VENDOR = "0x1002"


@dataclass(frozen=True)
class GpuReading:
    index: str
    vendor: str
    name: str
    bus: str = ""
    utilization: float | None = None  # 0..1
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    temperature_celsius: float | None = None
    power_watts: float | None = None


def _number(text: str | None) -> float | None:
    """'69.85 W', '100 %', '81559 MiB', '41' -> float; '[N/A]', 'N/A', '' -> None."""
    if text is None:
        return None
    match = re.match(r"^\s*(-?\d+(?:\.\d+)?)", text)
    return float(match.group(1)) if match else None


def _header_name(column: str) -> str:
    """'memory.used [MiB]' -> 'memory.used' (the header carries units unless nounits)."""
    return column.split("[", 1)[0].strip()


def parse_nvidia_smi_csv(text: str, fields: tuple[str, ...] = NVIDIA_FIELDS) -> list[GpuReading]:
    """Rows of ``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]``.

    With a header, columns are matched by name (any field order, extra fields ignored);
    without one, ``fields`` gives the order. Memory is reported in MiB.
    """
    rows = [row for row in csv.reader(io.StringIO(text), skipinitialspace=True) if row and any(c.strip() for c in row)]
    if not rows:
        return []
    first = [_header_name(c) for c in rows[0]]
    if "index" in first or "name" in first or "utilization.gpu" in first:
        names, data = first, rows[1:]
    else:
        names, data = list(fields), rows
    out: list[GpuReading] = []
    for row in data:
        cell = dict(zip(names, (c.strip() for c in row), strict=False))
        used, total = _number(cell.get("memory.used")), _number(cell.get("memory.total"))
        util = _number(cell.get("utilization.gpu"))
        out.append(GpuReading(
            index=cell.get("index", str(len(out))), vendor="nvidia", name=cell.get("name", ""),
            bus=cell.get("pci.bus_id", ""),
            utilization=None if util is None else util / 100,
            memory_used_bytes=None if used is None else used * MIB,
            memory_total_bytes=None if total is None else total * MIB,
            temperature_celsius=_number(cell.get("temperature.gpu")),
            power_watts=_number(cell.get("power.draw")),
        ))
    return out


# rocm-smi renames keys between releases; the first key present wins.
ROCM_TEMPERATURE = ("Temperature (Sensor junction) (C)", "Temperature (Sensor edge) (C)", "Temperature (Sensor memory) (C)")
ROCM_POWER = ("Current Socket Graphics Package Power (W)", "Average Graphics Package Power (W)")
ROCM_NAME = ("Card Series", "Card series", "Device Name", "Card model", "Card Model")


def _first_number(card: dict[str, str], keys: tuple[str, ...]) -> float | None:
    for key in keys:
        value = _number(card.get(key))
        if value is not None:
            return value
    return None


def _first_text(card: dict[str, str], keys: tuple[str, ...]) -> str:
    for key in keys:
        if card.get(key, "").strip():
            return card[key].strip()
    return ""


def parse_rocm_smi_json(text: str) -> list[GpuReading]:
    """``rocm-smi --json``: one object per ``cardN`` (the ``system`` entry is skipped)."""
    data = json.loads(text.strip() or "{}")
    out = []
    for key in sorted((k for k in data if re.fullmatch(r"card\d+", k)), key=lambda k: int(k[4:])):
        card: dict[str, str] = data[key]
        util = _number(card.get("GPU use (%)"))
        out.append(GpuReading(
            index=key[4:], vendor="amd", name=_first_text(card, ROCM_NAME), bus=card.get("PCI Bus", ""),
            utilization=None if util is None else util / 100,
            memory_used_bytes=_number(card.get("VRAM Total Used Memory (B)")),
            memory_total_bytes=_number(card.get("VRAM Total Memory (B)")),
            temperature_celsius=_first_number(card, ROCM_TEMPERATURE),
            power_watts=_first_number(card, ROCM_POWER),
        ))
    return out


def _read_number(path: Path) -> float | None:
    try:
        return _number(path.read_text())
    except OSError:
        return None


def read_amd_sysfs(drm: Path = Path("/sys/class/drm")) -> list[GpuReading]:
    """amdgpu's sysfs files (kernel docs: gpu_busy_percent, mem_info_vram_*, hwmon temp/power)."""
    out = []
    cards = sorted((p for p in drm.glob("card*") if re.fullmatch(r"card\d+", p.name)), key=lambda p: int(p.name[4:]))
    for card in cards:
        device = card / "device"
        try:
            if device.joinpath("vendor").read_text().strip() != AMD_VENDOR:
                continue
        except OSError:
            continue
        busy = _read_number(device / "gpu_busy_percent")
        temperature = power = None
        for hwmon in sorted(device.glob("hwmon/hwmon*")):
            millideg = _read_number(hwmon / "temp2_input") or _read_number(hwmon / "temp1_input")  # temp2 = junction
            micro_w = _read_number(hwmon / "power1_average") or _read_number(hwmon / "power1_input")
            temperature = None if millideg is None else millideg / 1000
            power = None if micro_w is None else micro_w / 1e6
            break
        bus = device.resolve().name if device.exists() else ""
        name = ""
        with contextlib.suppress(OSError):
            name = device.joinpath("product_name").read_text().strip()
        out.append(GpuReading(
            index=card.name[4:], vendor="amd", name=name, bus=bus,
            utilization=None if busy is None else busy / 100,
            memory_used_bytes=_read_number(device / "mem_info_vram_used"),
            memory_total_bytes=_read_number(device / "mem_info_vram_total"),
            temperature_celsius=temperature, power_watts=power,
        ))
    return out


def families(readings: list[GpuReading]) -> list[Metric]:
    labels = ["gpu", "vendor", "name"]
    specs = [
        ("mxc_gpu_utilization_ratio", "fraction of time a kernel ran (nvidia utilization.gpu, amd GPU use)", "utilization"),
        ("mxc_gpu_memory_used_bytes", "device memory in use", "memory_used_bytes"),
        ("mxc_gpu_memory_total_bytes", "device memory size", "memory_total_bytes"),
        ("mxc_gpu_temperature_celsius", "GPU temperature (AMD: junction when reported)", "temperature_celsius"),
        ("mxc_gpu_power_watts", "board/socket power draw", "power_watts"),
    ]
    out: list[Metric] = []
    for name, doc, attr in specs:
        family = GaugeMetricFamily(name, doc, labels=labels)
        for r in readings:
            value = getattr(r, attr)
            if value is not None:
                family.add_metric([r.index, r.vendor, r.name], value)
        out.append(family)
    return out


def _run(command: list[str]) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{command[0]} exited {done.returncode}: {(done.stderr or done.stdout).strip()[:200]}")
    return done.stdout


class GpuPlugin:
    name = "gpu"

    def __init__(self, source: str) -> None:
        self.source = source

    def read(self) -> list[GpuReading]:
        if self.source == "nvidia-smi":
            return parse_nvidia_smi_csv(_run(NVIDIA_COMMAND))
        if self.source == "rocm-smi":
            return parse_rocm_smi_json(_run(ROCM_COMMAND))
        return read_amd_sysfs()

    def collect(self) -> Iterable[Metric]:
        return families(self.read())


def detect() -> str | None:
    if shutil.which("nvidia-smi"):
        return "nvidia-smi"
    if shutil.which("rocm-smi"):
        return "rocm-smi"
    if read_amd_sysfs():
        return "sysfs"
    return None


def create(context: PluginContext) -> GpuPlugin:
    source = detect()
    if source is None:
        raise PluginUnavailable("no GPU found (no nvidia-smi, no rocm-smi, no amdgpu in /sys/class/drm)")
    context.log.info("gpu: reading %s", source)
    return GpuPlugin(source)
