"""AMD GPUs: ``rocm-smi --json`` where installed, else the amdgpu driver's sysfs files; RAS error
counters per block from sysfs either way (no tool reports them in one cheap call).

sysfs (kernel Documentation/gpu/amdgpu): ``gpu_busy_percent``, ``mem_info_vram_{used,total}``,
``hwmon*/{temp*_input,power1_*,freq1_input,freq2_input}`` (millidegrees, microwatts, hertz),
``pp_dpm_{sclk,mclk}`` (clock levels, ``*`` marks the current one) and ``ras/<block>_err_count``
(``ue: N``/``ce: N`` lines; newer kernels also ``de:`` for deferred; ACA kernels name the files
``aca_<block>``). A block's uncorrectable count above 0 means the GPU needs service.
"""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

from mxc.plugins.gpu_reading import GpuReading, normalize_bus, number

VENDOR = "0x1002"
ROCM_COMMAND = ["rocm-smi", "--showuse", "--showmeminfo", "vram", "--showtemp", "--showpower", "--showproductname",
                "--showbus", "--showclocks", "--json"]
# rocm-smi renames keys between releases; the first key present wins.
ROCM_TEMPERATURE = ("Temperature (Sensor junction) (C)", "Temperature (Sensor edge) (C)", "Temperature (Sensor memory) (C)")
ROCM_POWER = ("Current Socket Graphics Package Power (W)", "Average Graphics Package Power (W)")
ROCM_NAME = ("Card Series", "Card series", "Device Name", "Card model", "Card Model")
RAS_SEVERITY = {"ue": "uncorrectable", "ce": "correctable", "de": "deferred"}
_CURRENT_LEVEL = re.compile(r"^\s*\d+:\s*(\d+(?:\.\d+)?)\s*Mhz\s*\*\s*$", re.IGNORECASE | re.MULTILINE)


def _first_number(card: dict[str, str], keys: tuple[str, ...]) -> float | None:
    for key in keys:
        value = number(card.get(key))
        if value is not None:
            return value
    return None


def _first_text(card: dict[str, str], keys: tuple[str, ...]) -> str:
    for key in keys:
        if card.get(key, "").strip():
            return card[key].strip()
    return ""


def _mhz(value: float | None) -> float | None:
    return None if value is None else value * 1e6


def parse_rocm_smi_json(text: str) -> list[GpuReading]:
    """``rocm-smi --json``: one object per ``cardN`` (the ``system`` entry is skipped)."""
    data = json.loads(text.strip() or "{}")
    out = []
    for key in sorted((k for k in data if re.fullmatch(r"card\d+", k)), key=lambda k: int(k[4:])):
        card: dict[str, str] = data[key]
        util = number(card.get("GPU use (%)"))
        out.append(GpuReading(
            index=key[4:], vendor="amd", name=_first_text(card, ROCM_NAME), bus=normalize_bus(card.get("PCI Bus", "")),
            utilization=None if util is None else util / 100,
            memory_used_bytes=number(card.get("VRAM Total Used Memory (B)")),
            memory_total_bytes=number(card.get("VRAM Total Memory (B)")),
            temperature_celsius=_first_number(card, ROCM_TEMPERATURE),
            power_watts=_first_number(card, ROCM_POWER),
            clock_graphics_hertz=_mhz(number(card.get("sclk clock speed:"))),
            clock_memory_hertz=_mhz(number(card.get("mclk clock speed:"))),
        ))
    return out


def _read_number(path: Path) -> float | None:
    try:
        return number(path.read_text())
    except OSError:
        return None


def current_level_mhz(text: str) -> float | None:
    """``pp_dpm_sclk``/``pp_dpm_mclk``: the MHz of the level marked ``*``."""
    match = _CURRENT_LEVEL.search(text)
    return float(match.group(1)) if match else None


def _current_level(path: Path) -> float | None:
    try:
        return current_level_mhz(path.read_text())
    except OSError:
        return None


def parse_ras_count(text: str) -> dict[str, float]:
    """``ue: 0\\nce: 3`` -> {uncorrectable: 0, correctable: 3} (and deferred where reported)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in RAS_SEVERITY and value.strip().isdigit():
            out[RAS_SEVERITY[key.strip()]] = float(value)
    return out


def read_ras(device: Path) -> dict[tuple[str, str], float]:
    """(block, severity) -> count for every RAS block the driver exposes (none on consumer GPUs)."""
    out: dict[tuple[str, str], float] = {}
    folder = device / "ras"
    try:
        names = sorted(p.name for p in folder.iterdir())
    except OSError:
        return out
    for name in names:
        if name.endswith("_err_count"):
            block = name[: -len("_err_count")]
        elif name.startswith("aca_"):
            block = name[len("aca_"):]
        else:
            continue  # features, gpu_vram_bad_pages, ...
        with contextlib.suppress(OSError):
            for severity, count in parse_ras_count((folder / name).read_text()).items():
                out[(block, severity)] = count
    if out:
        for severity in ("correctable", "uncorrectable"):
            out[("total", severity)] = sum(v for (b, s), v in out.items() if s == severity)
    return out


def amd_devices(drm: Path = Path("/sys/class/drm")) -> list[tuple[str, Path]]:
    """(card index, device directory) of every amdgpu card."""
    out = []
    cards = sorted((p for p in drm.glob("card*") if re.fullmatch(r"card\d+", p.name)), key=lambda p: int(p.name[4:]))
    for card in cards:
        device = card / "device"
        try:
            if device.joinpath("vendor").read_text().strip() == VENDOR:
                out.append((card.name[4:], device))
        except OSError:
            continue
    return out


def read_sysfs(drm: Path = Path("/sys/class/drm")) -> list[GpuReading]:
    """Every amdgpu card from sysfs alone."""
    out = []
    for index, device in amd_devices(drm):
        busy = _read_number(device / "gpu_busy_percent")
        temperature = power = sclk = mclk = None
        for hwmon in sorted(device.glob("hwmon/hwmon*")):
            millideg = _read_number(hwmon / "temp2_input") or _read_number(hwmon / "temp1_input")  # temp2 = junction
            micro_w = _read_number(hwmon / "power1_average") or _read_number(hwmon / "power1_input")
            temperature = None if millideg is None else millideg / 1000
            power = None if micro_w is None else micro_w / 1e6
            sclk, mclk = _read_number(hwmon / "freq1_input"), _read_number(hwmon / "freq2_input")  # hertz
            break
        if sclk is None:
            sclk = _mhz(_current_level(device / "pp_dpm_sclk"))
        if mclk is None:
            mclk = _mhz(_current_level(device / "pp_dpm_mclk"))
        name = ""
        with contextlib.suppress(OSError):
            name = device.joinpath("product_name").read_text().strip()
        out.append(GpuReading(
            index=index, vendor="amd", name=name, bus=normalize_bus(device.resolve().name) if device.exists() else "",
            utilization=None if busy is None else busy / 100,
            memory_used_bytes=_read_number(device / "mem_info_vram_used"),
            memory_total_bytes=_read_number(device / "mem_info_vram_total"),
            temperature_celsius=temperature, power_watts=power, clock_graphics_hertz=sclk, clock_memory_hertz=mclk,
        ))
    return out


def add_sysfs_errors(readings: list[GpuReading], drm: Path = Path("/sys/class/drm")) -> None:
    """RAS counters per block, XGMI link errors (the xgmi_wafl RAS block) and PCIe replays, by PCI address."""
    by_bus = {normalize_bus(device.resolve().name): device for _, device in amd_devices(drm)}
    for reading in readings:
        device = by_bus.get(reading.bus)
        if device is None:
            continue
        reading.ecc.update(read_ras(device))
        for (block, severity), count in reading.ecc.items():
            if block.startswith("xgmi"):
                reading.link_errors[("xgmi", "all", severity)] = count
        replays = _read_number(device / "pcie_replay_count")
        if replays is not None:
            reading.pcie_replays = replays
