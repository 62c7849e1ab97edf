"""NVIDIA GPUs read from a dcgm-exporter already running on the node, instead of from ``nvidia-smi``.

One HTTP GET of its page on loopback per scrape, parsed with prometheus-client's parser; the
series are the same ``mxc_gpu_*`` as from nvidia-smi, so rules, skills and reports do not care
which source a node had. Field names: NVIDIA's DCGM field identifiers (dcgm-exporter's
default counters). MIG instance series (``GPU_I_ID`` label) are left out: the GPU's own are kept.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from mxc.plugins.gpu_reading import MIB, GpuReading, normalize_bus
from mxc.plugins.metrics_page import fetch

# DCGM field -> (attribute, scale); clocks in MHz, frame buffer in MiB
SCALARS = {
    "DCGM_FI_DEV_GPU_UTIL": ("utilization", 0.01),
    "DCGM_FI_DEV_GPU_TEMP": ("temperature_celsius", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("power_watts", 1.0),
    "DCGM_FI_DEV_SM_CLOCK": ("clock_graphics_hertz", 1e6),
    "DCGM_FI_DEV_MEM_CLOCK": ("clock_memory_hertz", 1e6),
    "DCGM_FI_DEV_FB_USED": ("memory_used_bytes", MIB),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("pcie_replays", 1.0),
}
ECC = {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "correctable", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "uncorrectable"}
REMAPPED = {"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "correctable", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "uncorrectable"}
NVLINK = {
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "crc_flit", "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": "crc_data",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": "replay", "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": "recovery",
}
FB_PARTS = ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED")


def parse_page(text: str) -> list[GpuReading]:
    readings: dict[str, GpuReading] = {}
    frame_buffer: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            index = labels.get("gpu")
            if index is None or "GPU_I_ID" in labels:
                continue
            reading = readings.setdefault(index, GpuReading(
                index=index, vendor="nvidia", name=labels.get("modelName", ""), bus=normalize_bus(labels.get("pci_bus_id", ""))))
            name, number = sample.name, float(sample.value)
            if name in SCALARS:
                attribute, scale = SCALARS[name]
                setattr(reading, attribute, number * scale)
            elif name in ECC:
                reading.ecc[("total", ECC[name])] = number
            elif name in REMAPPED:
                reading.remapped_rows[REMAPPED[name]] = number
            elif name in NVLINK:
                reading.link_errors[("nvlink", "all", NVLINK[name])] = number
            if name in FB_PARTS:
                frame_buffer[index] = frame_buffer.get(index, 0.0) + number
    for index, mib in frame_buffer.items():
        readings[index].memory_total_bytes = mib * MIB
    return [readings[i] for i in sorted(readings, key=lambda i: (len(i), i))]


class DcgmExporter:
    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.host, self.port = host, port

    def read(self) -> list[GpuReading]:
        page = fetch(self.host, self.port, timeout=5.0)
        if page is None:
            raise RuntimeError(f"dcgm-exporter on {self.host}:{self.port} did not answer")
        return parse_page(page.decode("utf-8", "replace"))
