"""GPU metrics: NVIDIA through ``nvidia-smi`` (``nvidia_smi.py``) or, where the site runs one, its
dcgm-exporter (``dcgm.py``); AMD through ``rocm-smi --json``
or, without rocm-smi, the amdgpu sysfs files (``amdgpu.py``); RAS counters per block for AMD and
PCIe AER counters for both from sysfs (``pci_errors.py``).

The command-line tools are what every node of a cluster has; their output is parsed by pure
functions tested against outputs recorded on real GPUs (tests/fixtures/gpu/).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from mxc.plugins import amdgpu, pci_errors
from mxc.plugins.api import PluginContext, PluginUnavailable
from mxc.plugins.dcgm import DcgmExporter
from mxc.plugins.gpu_reading import GpuReading
from mxc.plugins.nvidia_smi import FIELDS as NVIDIA_FIELDS
from mxc.plugins.nvidia_smi import NvidiaSmi
from mxc.plugins.nvidia_smi import parse_csv as parse_nvidia_smi_csv

parse_rocm_smi_json = amdgpu.parse_rocm_smi_json
read_amd_sysfs = amdgpu.read_sysfs
ROCM_COMMAND = amdgpu.ROCM_COMMAND
COMMAND_TIMEOUT = 10.0
__all__ = ["NVIDIA_FIELDS", "GpuPlugin", "GpuReading", "create", "detect", "families", "model_names",
           "parse_nvidia_smi_csv", "parse_rocm_smi_json", "read_amd_sysfs"]

LABELS = ["gpu", "vendor", "name"]
PER_GPU = (  # one value per GPU: gauges, and counters (named _total)
    ("mxc_gpu_utilization_ratio", "fraction of time a kernel ran (nvidia utilization.gpu, amd GPU use)", "utilization"),
    ("mxc_gpu_memory_used_bytes", "device memory in use", "memory_used_bytes"),
    ("mxc_gpu_memory_total_bytes", "device memory size", "memory_total_bytes"),
    ("mxc_gpu_temperature_celsius", "GPU temperature (AMD: junction when reported)", "temperature_celsius"),
    ("mxc_gpu_power_watts", "board/socket power draw", "power_watts"),
    ("mxc_gpu_pcie_replays_total", "PCIe link replays (AMD pcie_replay_count): the link resent packets", "pcie_replays"),
    ("mxc_gpu_row_remap_pending", "1 when a remapped memory row waits for a GPU reset to take effect (NVIDIA)",
     "row_remap_pending"),
)


def families(readings: list[GpuReading]) -> list[Metric]:
    out: list[Metric] = []
    for name, doc, attr in PER_GPU:
        family_type = CounterMetricFamily if name.endswith("_total") else GaugeMetricFamily
        family = family_type(name.removesuffix("_total"), doc, labels=LABELS)
        for r in readings:
            value = getattr(r, attr)
            if value is not None:
                family.add_metric([r.index, r.vendor, r.name], value)
        out.append(family)
    clocks = GaugeMetricFamily("mxc_gpu_clock_hertz", "current clock: graphics (AMD sclk, NVIDIA graphics) and memory "
                               "(AMD mclk, NVIDIA memory); a graphics clock below its usual value under load is throttling",
                               labels=[*LABELS, "clock"])
    ecc = CounterMetricFamily("mxc_gpu_ecc_errors", "ECC/RAS errors by block and severity since the driver loaded (NVIDIA "
                              "volatile counters; AMD ras/<block>_err_count). block=\"total\" is the GPU's total; do not "
                              "sum the blocks (NVIDIA's overlap)", labels=[*LABELS, "block", "severity"])
    aer = CounterMetricFamily("mxc_gpu_pcie_aer_errors", "PCIe AER errors of the GPU's PCI function (sysfs aer_dev_*)",
                              labels=[*LABELS, "severity"])
    throttled = CounterMetricFamily("mxc_gpu_throttled_seconds", "time clocks were held down, by reason (NVIDIA "
                                    "clocks_event_reasons_counters: hw_thermal_slowdown, sw_power_cap, ...)",
                                    labels=[*LABELS, "reason"])
    remapped = GaugeMetricFamily("mxc_gpu_remapped_rows", "memory rows remapped after ECC errors (NVIDIA), by the "
                                 "error that caused it", labels=[*LABELS, "kind"])
    links = CounterMetricFamily("mxc_gpu_link_errors", "GPU-to-GPU link errors: NVLink per link (replay, recovery, crc: "
                                "nvidia-smi nvlink -e) and AMD XGMI (the xgmi_wafl RAS block, link=\"all\")",
                                labels=[*LABELS, "interconnect", "link", "kind"])
    for r in readings:
        at = [r.index, r.vendor, r.name]
        for clock, value in (("graphics", r.clock_graphics_hertz), ("memory", r.clock_memory_hertz)):
            if value is not None:
                clocks.add_metric([*at, clock], value)
        for (block, severity), count in sorted(r.ecc.items()):
            ecc.add_metric([*at, block, severity], count)
        for severity, count in sorted(r.pcie_aer.items()):
            aer.add_metric([*at, severity], count)
        for reason, seconds in sorted(r.throttled_seconds.items()):
            throttled.add_metric([*at, reason], seconds)
        for kind, rows in sorted(r.remapped_rows.items()):
            remapped.add_metric([*at, kind], rows)
        for (interconnect, link, kind), count in sorted(r.link_errors.items()):
            links.add_metric([*at, interconnect, link, kind], count)
    out.extend((clocks, ecc, aer, throttled, remapped, links))
    return out


def run_tool(command: list[str]) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{command[0]} exited {done.returncode}: {(done.stderr or done.stdout).strip()[:200]}")
    return done.stdout


class GpuPlugin:
    name = "gpu"

    def __init__(self, source: str, run: Callable[[list[str]], str] = run_tool, drm: Path = Path("/sys/class/drm"),
                 pci_devices: Path = Path("/sys/bus/pci/devices"), dcgm_port: int = 9400) -> None:
        self.source, self.run, self.drm, self.pci_devices = source, run, drm, pci_devices
        self.nvidia = NvidiaSmi(run) if source == "nvidia-smi" else None
        self.dcgm = DcgmExporter(dcgm_port) if source == "dcgm-exporter" else None

    def read(self) -> list[GpuReading]:
        if self.dcgm is not None:
            readings = self.dcgm.read()
        elif self.nvidia is not None:
            readings = self.nvidia.read()
        elif self.source == "rocm-smi":
            readings = parse_rocm_smi_json(self.run(ROCM_COMMAND))
        else:
            readings = read_amd_sysfs(self.drm)
        if self.source in ("rocm-smi", "sysfs"):
            amdgpu.add_sysfs_errors(readings, self.drm)
        pci_errors.add_aer(readings, self.pci_devices)
        return readings

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


def model_names(source: str | None = None, run: Callable[[list[str]], str] = run_tool) -> list[str]:
    """The names of this node's GPUs ([] without one), asked once (MFU needs the model)."""
    source = source if source is not None else detect()
    try:
        if source == "nvidia-smi":
            return [line.strip() for line in run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]).splitlines()
                    if line.strip()]
        if source == "rocm-smi":
            return [r.name for r in parse_rocm_smi_json(run(["rocm-smi", "--showproductname", "--json"]))]
        if source == "sysfs":
            return [r.name for r in read_amd_sysfs()]
    except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired):
        return []
    return []


def create(context: PluginContext) -> GpuPlugin:
    dcgm_port = context.site_exporters.get("dcgm-exporter")
    if dcgm_port is not None:  # NVIDIA's exporter already polls these GPUs: read its page, do not poll them twice
        context.log.info("gpu: reading the dcgm-exporter on port %d", dcgm_port)
        return GpuPlugin("dcgm-exporter", dcgm_port=dcgm_port)
    source = detect()
    if source is None:
        raise PluginUnavailable("no GPU found (no nvidia-smi, no rocm-smi, no amdgpu in /sys/class/drm)")
    context.log.info("gpu: reading %s", source)
    return GpuPlugin(source)
