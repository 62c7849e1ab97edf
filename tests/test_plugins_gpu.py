"""GPU plugin's clocks, ECC/RAS per block, PCIe AER, throttling and link errors, on outputs
recorded on real GPUs (tests/fixtures/gpu/README.md names each one's GPU and source)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mxc.plugins import amdgpu, gpu, nvidia_smi, pci_errors, peak_flops
from mxc.plugins.gpu_reading import GpuReading, normalize_bus
from tests.plugin_samples import samples, value

FIXTURES = Path(__file__).parent / "fixtures"
GPU = FIXTURES / "gpu"
VEGA = FIXTURES / "sys/drm-vega10-procfs"


def test_nvidia_h100_under_load_clocks_ecc_and_throttling() -> None:
    [h100] = nvidia_smi.parse_csv((GPU / "nvidia-smi-h100-load.csv").read_text())
    assert h100.bus == "0000:00:09.0"  # nvidia-smi's 00000000:00:09.0, spelled as sysfs does
    assert h100.clock_graphics_hertz == 1980e6 and h100.clock_memory_hertz == 2619e6
    assert h100.ecc[("total", "uncorrectable")] == 0 and h100.ecc[("dram", "correctable")] == 0
    assert ("l1_cache", "correctable") not in h100.ecc  # [N/A] on H100: absent, not 0
    assert h100.remapped_rows == {"correctable": 0, "uncorrectable": 0} and h100.row_remap_pending == 0
    assert h100.throttled_seconds["hw_thermal_slowdown"] == 0 and len(h100.throttled_seconds) == 5


def test_nvidia_field_negotiation_drops_what_an_old_driver_refuses() -> None:
    asked: list[str] = []

    def run(command: list[str]) -> str:
        fields = command[1].removeprefix("--query-gpu=").split(",")
        asked.append(command[1])
        for refused in ("clocks_event_reasons_counters.sw_power_cap", "remapped_rows.pending"):
            if refused in fields:
                raise RuntimeError(f'nvidia-smi exited 2: Field "{refused}" is not a valid field to query.')
        return "index, name\n0, NVIDIA A100-SXM4-40GB\n"

    fields = nvidia_smi.negotiate_fields(run)
    assert "remapped_rows.pending" not in fields and "clocks_event_reasons_counters.sw_power_cap" not in fields
    assert "clocks.current.graphics" in fields and len(asked) == 3
    with pytest.raises(RuntimeError, match="not a valid field"):  # a base field refused: the plugin cannot work
        nvidia_smi.negotiate_fields(lambda c: (_ for _ in ()).throw(RuntimeError('Field "index" is not a valid field')))


def test_nvlink_errors_gb300_and_read_once_a_minute() -> None:
    """`nvidia-smi nvlink -e` as recorded on a GB300 (NVIDIA/srt-slurm PR 307)."""
    errors = nvidia_smi.parse_nvlink_errors((GPU / "nvidia-smi-nvlink-e-gb300.txt").read_text())
    assert errors == {"0": {("0", "replay"): 0.0, ("0", "recovery"): 0.0, ("0", "crc"): 0.0}}
    now = [0.0]
    calls: list[list[str]] = []
    load = (GPU / "nvidia-smi-h100-load.csv").read_text()

    def run(command: list[str]) -> str:
        calls.append(command)
        return (GPU / "nvidia-smi-nvlink-e-gb300.txt").read_text() if "nvlink" in command else load

    smi = nvidia_smi.NvidiaSmi(run, clock=lambda: now[0])
    [reading] = smi.read()
    assert reading.link_errors == {("nvlink", "0", "replay"): 0.0, ("nvlink", "0", "recovery"): 0.0,
                                   ("nvlink", "0", "crc"): 0.0}
    smi.read()
    now[0] = 61.0
    smi.read()
    assert sum("nvlink" in c for c in calls) == 2  # scrapes at 0 s and 61 s, not the one between


def test_rocm_smi_clocks_mi100() -> None:
    cards = amdgpu.parse_rocm_smi_json((GPU / "rocm-smi-mi100-rocm602.json").read_text())
    assert cards[0].clock_graphics_hertz == 300e6 and cards[0].clock_memory_hertz == 1200e6


def test_amd_sysfs_vega10_clocks_aer_and_replays() -> None:
    """An RX Vega 10 (1002:687f) as recorded in prometheus/procfs: the current DPM level gives the clock."""
    [card] = amdgpu.read_sysfs(VEGA / "drm")
    assert card.bus == "0000:09:00.0" and card.utilization == 0.04
    assert card.clock_graphics_hertz == 852e6 and card.clock_memory_hertz == 167e6
    assert card.memory_total_bytes == 8573157376
    pci_errors.add_aer([card], VEGA / "devices")
    assert card.pcie_aer == {"correctable": 0, "nonfatal": 0, "fatal": 0}
    amdgpu.add_sysfs_errors([card], VEGA / "drm")
    assert card.pcie_replays == 0 and card.ecc == {}  # a consumer GPU has no RAS blocks


def test_amd_ras_blocks_xgmi_and_totals(tmp_path: Path) -> None:
    """RAS files as the amdgpu driver writes them (amdgpu_ras.c: "ue: %lu\\nce: %lu\\n", newer
    kernels add "de:"; ACA kernels name them aca_<block>), on the recorded Vega tree."""
    tree = tmp_path / "sys"
    shutil.copytree(VEGA, tree, symlinks=True)
    ras = tree / "devices/0000:09:00.0/ras"
    ras.mkdir()
    (ras / "umc_err_count").write_text("ue: 0\nce: 3\n")
    (ras / "gfx_err_count").write_text("ue: 1\nce: 0\nde: 2\n")
    (ras / "aca_xgmi_wafl").write_text("ue: 0\nce: 5\n")
    (ras / "features").write_text("feature mask: 0x3fff\n")
    (tree / "devices/0000:09:00.0/aer_dev_correctable").write_text("RxErr 4\nBadTLP 1\nTOTAL_ERR_COR 5\n")
    plugin = gpu.GpuPlugin("sysfs", drm=tree / "drm", pci_devices=tree / "devices")
    [card] = plugin.read()
    assert card.ecc[("umc", "correctable")] == 3 and card.ecc[("gfx", "deferred")] == 2
    assert card.ecc[("total", "correctable")] == 8 and card.ecc[("total", "uncorrectable")] == 1
    assert card.link_errors == {("xgmi", "all", "correctable"): 5, ("xgmi", "all", "uncorrectable"): 0}
    found = samples(plugin)
    at = {"gpu": "0", "vendor": "amd", "name": ""}
    assert value(found, "mxc_gpu_ecc_errors_total", **at, block="umc", severity="correctable") == 3
    assert value(found, "mxc_gpu_pcie_aer_errors_total", **at, severity="correctable") == 5
    assert value(found, "mxc_gpu_clock_hertz", **at, clock="graphics") == 852e6
    assert value(found, "mxc_gpu_link_errors_total", **at, interconnect="xgmi", link="all", kind="correctable") == 5


def test_nvidia_plugin_series_with_a_fake_nvidia_smi(tmp_path: Path) -> None:
    load = (GPU / "nvidia-smi-h100-load.csv").read_text()
    nvlink = (GPU / "nvidia-smi-nvlink-e-gb300.txt").read_text()
    (tmp_path / "0000:00:09.0").mkdir()
    (tmp_path / "0000:00:09.0/aer_dev_fatal").write_text("DLP 0\nTOTAL_ERR_FATAL 0\n")
    plugin = gpu.GpuPlugin("nvidia-smi", run=lambda c: nvlink if "nvlink" in c else load, pci_devices=tmp_path)
    found = samples(plugin)
    at = {"gpu": "0", "vendor": "nvidia", "name": "NVIDIA H100 80GB HBM3"}
    assert value(found, "mxc_gpu_power_watts", **at) == pytest.approx(631.95)
    assert value(found, "mxc_gpu_throttled_seconds_total", **at, reason="sw_power_cap") == 0
    assert value(found, "mxc_gpu_pcie_aer_errors_total", **at, severity="fatal") == 0
    assert value(found, "mxc_gpu_remapped_rows", **at, kind="uncorrectable") == 0
    assert value(found, "mxc_gpu_link_errors_total", **at, interconnect="nvlink", link="0", kind="crc") == 0


def test_bus_addresses_are_one_spelling() -> None:
    assert normalize_bus("00000000:3B:00.0") == "0000:3b:00.0" == normalize_bus("0000:3b:00.0")
    assert normalize_bus("") == "" and normalize_bus("not a bus") == "not a bus"


@pytest.mark.parametrize(("name", "model", "tflops"), [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.4),
    ("NVIDIA H100 PCIe", "H100 PCIe", 756.5),
    ("NVIDIA H100 NVL", "H100 NVL", 835.5),
    ("NVIDIA H200", "H200 SXM", 989.4),
    ("NVIDIA H200 NVL", "H200 NVL", 835.5),
    ("NVIDIA B200", "B200", 2250.0),
    ("AMD Instinct MI300X", "MI300X", 1307.4),
    ("AMD Instinct MI325X OAM", "MI325X", 1307.4),
    ("AMD Instinct MI355X", "MI355X", 2516.6),
])
def test_peak_table(name: str, model: str, tflops: float) -> None:
    assert peak_flops.peak_for(name) == peak_flops.Peak(model, tflops)


def test_unknown_gpus_have_no_peak() -> None:
    assert peak_flops.peak_for("AMD Instinct MI300A") is None
    assert peak_flops.peak_for("Arcturus GL-XL [Instinct MI100]") is None
    h100 = "NVIDIA H100 80GB HBM3"
    assert peak_flops.node_peak([h100, h100, "Tesla T4"]) == peak_flops.Peak("H100 SXM", 989.4)
    assert peak_flops.node_peak([]) is None


def test_model_names_of_each_source() -> None:
    assert gpu.model_names("nvidia-smi", run=lambda c: "NVIDIA H100 80GB HBM3\nNVIDIA H100 80GB HBM3\n") == [
        "NVIDIA H100 80GB HBM3"] * 2
    mi100 = (GPU / "rocm-smi-mi100-rocm602.json").read_text()
    assert gpu.model_names("rocm-smi", run=lambda c: mi100)[0] == "Arcturus GL-XL [Instinct MI100]"
    assert gpu.model_names(None) == [] or gpu.detect() is not None  # no GPU here: nothing, no error

    def broken(command: list[str]) -> str:
        raise RuntimeError("nvidia-smi exited 9: NVIDIA-SMI has failed")

    assert gpu.model_names("nvidia-smi", run=broken) == []


def test_empty_reading_exports_no_values() -> None:
    found = samples(type("P", (), {"collect": lambda self: gpu.families([GpuReading("0", "amd", "x")])})())
    assert found == {}
