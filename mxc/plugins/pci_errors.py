"""PCIe Advanced Error Reporting counters of a GPU's PCI function, any vendor:
``/sys/bus/pci/devices/<address>/aer_dev_{correctable,nonfatal,fatal}`` (kernel
Documentation/PCI/pcieaer-howto), each a list of ``Name count`` lines ending in a
``TOTAL_ERR_*`` line, which is what is exported.

Why: a link that retrains or drops TLPs slows every host-device copy and collective, and
correctable errors usually rise before the fatal one that takes the GPU off the bus.
The files exist only where the kernel has AER support and the platform grants it.
"""

from __future__ import annotations

from pathlib import Path

from mxc.plugins.gpu_reading import GpuReading

SEVERITIES = {"correctable": "aer_dev_correctable", "nonfatal": "aer_dev_nonfatal", "fatal": "aer_dev_fatal"}


def parse_aer_total(text: str) -> float | None:
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].startswith("TOTAL_ERR") and parts[1].isdigit():
            return float(parts[1])
    return None


def read_aer(device: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    for severity, name in SEVERITIES.items():
        try:
            total = parse_aer_total((device / name).read_text())
        except OSError:
            continue
        if total is not None:
            out[severity] = total
    return out


def add_aer(readings: list[GpuReading], pci_devices: Path = Path("/sys/bus/pci/devices")) -> None:
    for reading in readings:
        if reading.bus:
            reading.pcie_aer.update(read_aer(pci_devices / reading.bus))
