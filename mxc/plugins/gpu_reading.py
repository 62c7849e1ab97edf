"""One GPU's reading, whatever tool or file it came from, and the value helpers every GPU source shares."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MIB = 1024 * 1024
_BUS = re.compile(r"(?P<domain>[0-9a-fA-F]{4,8}):(?P<bus>[0-9a-fA-F]{2}):(?P<device>[0-9a-fA-F]{2})\.(?P<function>[0-7])")


@dataclass
class GpuReading:
    index: str
    vendor: str
    name: str
    bus: str = ""  # PCI address as sysfs spells it, 0000:83:00.0 (normalize_bus)
    utilization: float | None = None  # 0..1
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    temperature_celsius: float | None = None
    power_watts: float | None = None
    clock_graphics_hertz: float | None = None  # AMD sclk, NVIDIA graphics clock
    clock_memory_hertz: float | None = None  # AMD mclk, NVIDIA memory clock
    ecc: dict[tuple[str, str], float] = field(default_factory=dict)  # (block, correctable|uncorrectable) -> count
    pcie_aer: dict[str, float] = field(default_factory=dict)  # correctable|nonfatal|fatal -> count
    pcie_replays: float | None = None
    throttled_seconds: dict[str, float] = field(default_factory=dict)  # reason -> seconds (NVIDIA)
    remapped_rows: dict[str, float] = field(default_factory=dict)  # correctable|uncorrectable -> rows (NVIDIA)
    row_remap_pending: float | None = None
    link_errors: dict[tuple[str, str, str], float] = field(default_factory=dict)  # (nvlink|xgmi, link, kind) -> count


def number(text: str | None) -> float | None:
    """'69.85 W', '100 %', '81559 MiB', '41', '(1402Mhz)' -> float; '[N/A]', 'N/A', '' -> None."""
    if text is None:
        return None
    match = re.match(r"^\s*\(?(-?\d+(?:\.\d+)?)", text)
    return float(match.group(1)) if match else None


def normalize_bus(text: str) -> str:
    """nvidia-smi's 00000000:00:09.0 and sysfs's 0000:00:09.0 are the same device: the sysfs spelling."""
    match = _BUS.search(text or "")
    if not match:
        return text or ""
    return f"{match['domain'][-4:]}:{match['bus']}:{match['device']}.{match['function']}".lower()
