"""Exporter plugins without processes: GPU and procfs parsers on recorded outputs, the
incremental readers, the training-metrics plugin and the plugin host's failure isolation."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
from prometheus_client.core import Metric

from mxc.plugins import gpu, host, tensorboard
from mxc.plugins.api import PluginContext, PluginUnavailable
from mxc.plugins.tail import EventFileTail, JsonlTail
from mxc.runtime.observe.plugin_host import PluginHost
from tests.plugin_samples import samples, value

FIXTURES = Path(__file__).parent / "fixtures"
GIB = 1024**3


# ---- GPU parsers on outputs recorded on real GPUs


def test_nvidia_smi_csv_h100_under_load() -> None:
    [h100] = gpu.parse_nvidia_smi_csv((FIXTURES / "gpu/nvidia-smi-h100-load.csv").read_text())
    assert h100.index == "0" and h100.name == "NVIDIA H100 80GB HBM3" and h100.vendor == "nvidia"
    assert h100.bus == "0000:00:09.0"  # as sysfs spells it (nvidia-smi: 00000000:00:09.0)
    assert h100.utilization == 1.0
    assert h100.memory_used_bytes == 19818 * 1024**2 and h100.memory_total_bytes == 81559 * 1024**2
    assert h100.temperature_celsius == 59
    assert h100.power_watts == pytest.approx(631.95)


def test_nvidia_smi_csv_h100_idle_and_missing_values() -> None:
    [idle] = gpu.parse_nvidia_smi_csv((FIXTURES / "gpu/nvidia-smi-h100-idle.csv").read_text())
    assert idle.utilization == 0.0 and idle.memory_used_bytes == 0.0  # zeros stay zeros
    assert idle.power_watts == pytest.approx(69.85) and idle.temperature_celsius == 41
    # The plugin's own query, noheader/nounits, with [N/A] where a field is not supported.
    text = "0, NVIDIA H100 80GB HBM3, GPU-1, 00000000:00:09.0, 100, 19818, 81559, 59, [N/A]\n"
    [row] = gpu.parse_nvidia_smi_csv(text)
    assert row.power_watts is None and row.utilization == 1.0 and row.memory_total_bytes == 81559 * 1024**2


def test_rocm_smi_json_mi100() -> None:
    cards = gpu.parse_rocm_smi_json((FIXTURES / "gpu/rocm-smi-mi100-rocm602.json").read_text())
    assert [c.index for c in cards] == ["0", "1", "2", "3"]  # the "system" entry is not a GPU
    first = cards[0]
    assert first.vendor == "amd" and first.name == "Arcturus GL-XL [Instinct MI100]" and first.bus == "0000:83:00.0"
    assert first.temperature_celsius == 55.0  # junction, not edge (53.0)
    assert first.power_watts == 36.0 and first.utilization == 0.0
    assert first.memory_used_bytes == 6750208 and first.memory_total_bytes == 34342961152
    assert [c.power_watts for c in cards] == [36.0, 44.0, 43.0, 39.0]


def test_rocm_smi_json_newer_key_spelling() -> None:
    [card] = gpu.parse_rocm_smi_json((FIXTURES / "gpu/rocm-smi-rx6700xt-rocm612.json").read_text())
    assert card.name == "Navi 22 [Radeon RX 6700/6700 XT / 6800M]"  # "Card Series", capital S
    assert card.memory_used_bytes == 1572745216 and card.temperature_celsius == 47.0


def test_amd_sysfs_reader(tmp_path: Path) -> None:
    """The amdgpu sysfs layout (kernel docs), values of the MI100 capture; non-AMD cards skipped."""
    device = tmp_path / "0000:83:00.0"
    (device / "hwmon/hwmon3").mkdir(parents=True)
    files = {"vendor": "0x1002\n", "gpu_busy_percent": "37\n", "mem_info_vram_used": "6750208\n",
             "mem_info_vram_total": "34342961152\n", "hwmon/hwmon3/temp1_input": "53000\n",
             "hwmon/hwmon3/temp2_input": "55000\n", "hwmon/hwmon3/power1_average": "36000000\n"}
    for name, text in files.items():
        (device / name).write_text(text)
    (tmp_path / "drm/card0").mkdir(parents=True)
    (tmp_path / "drm/card0/device").symlink_to(device)
    other = tmp_path / "pci0000:01:00.0"
    other.mkdir()
    (other / "vendor").write_text("0x10de\n")
    (tmp_path / "drm/card1").mkdir()
    (tmp_path / "drm/card1/device").symlink_to(other)
    (tmp_path / "drm/card0-DP-1").mkdir()  # connectors are not cards
    [card] = gpu.read_amd_sysfs(tmp_path / "drm")
    assert card.index == "0" and card.utilization == 0.37 and card.bus == "0000:83:00.0"
    assert card.temperature_celsius == 55.0 and card.power_watts == 36.0
    assert card.memory_used_bytes == 6750208


def test_gpu_families_skip_missing_values() -> None:
    readings = gpu.parse_nvidia_smi_csv("0, H100, GPU-1, 0:9.0, 50, 1, 2, 40, [N/A]\n")
    plugin = type("P", (), {"collect": lambda self: gpu.families(readings)})()
    found = samples(plugin)
    assert value(found, "mxc_gpu_utilization_ratio", gpu="0", vendor="nvidia", name="H100") == 0.5
    assert not any(name == "mxc_gpu_power_watts" for name, _ in found)


def test_gpu_plugin_is_unavailable_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu, "detect", lambda: None)
    with pytest.raises(PluginUnavailable, match="no GPU found"):
        gpu.create(PluginContext(run_dir=None))


# ---- procfs (recorded on this machine)


def test_procfs_parsers_on_recorded_files() -> None:
    proc = FIXTURES / "procfs"
    cpu = host.parse_cpu_seconds((proc / "stat").read_text(), 100)
    assert cpu["user"] == 3955.15 and cpu["idle"] == 12531.72 and set(cpu) == set(host.CPU_MODES)
    assert host.count_cpus((proc / "stat").read_text()) == 2
    mem = host.parse_meminfo((proc / "meminfo").read_text())
    assert mem["MemTotal"] == 24684096 * 1024 and mem["MemAvailable"] == 24127904 * 1024
    assert host.parse_loadavg((proc / "loadavg").read_text()) == (1.57, 3.63, 3.59)
    disks = host.parse_diskstats((proc / "diskstats").read_text())
    assert [d.device for d in disks] == ["vda"]  # loop*, zram* left out
    assert disks[0].read_bytes == 9949610 * 512 and disks[0].written_bytes == 49223312 * 512
    nets = {n.interface: n for n in host.parse_net_dev((proc / "net/dev").read_text())}
    assert nets["eth0"].received_bytes == 5649936918 and nets["eth0"].transmitted_bytes == 6232985
    assert nets["cni-podman0"].received_bytes == 2888  # a long name without a space after the colon


def test_host_plugin_series(tmp_path: Path) -> None:
    plugin = host.HostPlugin(PluginContext(run_dir=tmp_path), proc=FIXTURES / "procfs",
                             sys_block=FIXTURES / "procfs/sys_block")
    found = samples(plugin)
    assert value(found, "mxc_host_cpu_seconds_total", mode="system") == pytest.approx(645.82)
    assert value(found, "mxc_host_memory_available_bytes") == 24127904 * 1024
    assert value(found, "mxc_host_disk_written_bytes_total", device="vda") == 49223312 * 512
    assert value(found, "mxc_host_network_received_bytes_total", interface="lo") == 912171621
    assert value(found, "mxc_host_filesystem_free_bytes", path=str(tmp_path)) > 0


# ---- incremental readers


def test_jsonl_tail_reads_only_new_complete_lines(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    tail = JsonlTail(path)
    assert tail.read_new() == []  # not there yet
    first = json.dumps({"step": 0.0, "learning/loss": 6.1}) + "\n"
    path.write_text(first)
    assert tail.read_new() == [{"step": 0.0, "learning/loss": 6.1}]
    assert tail.bytes_read == len(first)
    half = json.dumps({"step": 1.0, "learning/loss": 6.0})
    with open(path, "a") as fh:
        fh.write(half[:10])  # the writer is mid-line
    assert tail.read_new() == []
    with open(path, "a") as fh:
        fh.write(half[10:] + "\nnot json\n")
    assert tail.read_new() == [{"step": 1.0, "learning/loss": 6.0}]
    assert tail.invalid_lines == 1
    assert tail.bytes_read == path.stat().st_size  # every byte read exactly once
    assert tail.read_new() == [] and tail.bytes_read == path.stat().st_size
    path.write_text(first)  # rewritten shorter: read again from the start
    assert tail.read_new() == [{"step": 0.0, "learning/loss": 6.1}]


def test_jsonl_tail_cost_is_the_new_data_not_the_file(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    line = json.dumps({"step": 1.0, "learning/loss": 5.5, "perf/step_time_seconds": 0.01}) + "\n"
    path.write_text(line * 200_000)
    tail = JsonlTail(path)
    assert len(tail.read_new()) == 200_000
    before = tail.bytes_read
    with open(path, "a") as fh:
        fh.write(line * 3)
    assert len(tail.read_new()) == 3
    assert tail.bytes_read - before == 3 * len(line)


def write_events(logdir: Path, steps: range, offset: float = 0.0) -> Path:
    """Real TensorBoard event files, written by tensorboardX like MaxText does."""
    from tensorboardX import SummaryWriter  # type: ignore[import-untyped]

    writer = SummaryWriter(str(logdir))
    for step in steps:
        writer.add_scalar("learning/loss", 6.0 - step / 10 + offset, step)
        writer.add_scalar("perf/step_time_seconds", 0.01, step)
        writer.add_scalar("learning/current_learning_rate", 1e-4, step)
    writer.flush()
    writer.close()
    [path] = sorted(logdir.glob("events.out.tfevents.*"))[-1:]
    return path


def test_event_file_tail_is_incremental(tmp_path: Path) -> None:
    source = write_events(tmp_path / "src", range(5))
    data = source.read_bytes()
    copy = tmp_path / "events.out.tfevents.copy"
    tail = EventFileTail(copy)
    cut = len(data) // 2
    copy.write_bytes(data[:cut])  # a record cut in the middle, as while TensorBoard writes
    early = tail.read_new()
    copy.write_bytes(data)
    late = tail.read_new()
    events = early + late
    losses = {e.step: e.value for e in events if e.tag == "learning/loss"}
    assert losses == {s: pytest.approx(6.0 - s / 10) for s in range(5)}
    assert len(events) == 15  # each scalar exactly once across both reads
    assert tail.bytes_read == len(data) and tail.read_new() == []


# ---- the training-metrics plugin


def metric_line(step: int, loss: float, **extra: float) -> str:
    return json.dumps({"step": float(step), "learning/loss": loss, "perf/step_time_seconds": 0.01,
                       "perf/per_device_tokens_per_sec": 1000.0 + step, "learning/current_learning_rate": 1e-4,
                       **extra}) + "\n"


def test_training_plugin_continues_across_restarts(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    (metrics / "attempt-0.rank-0.jsonl").write_text("".join(metric_line(s, 6 - s / 100) for s in range(8)))
    plugin = tensorboard.create(PluginContext(run_dir=tmp_path))
    found = samples(plugin)
    assert value(found, "mxc_train_last_step", rank="0") == 7
    assert value(found, "mxc_train_step_total", rank="0") == 8
    # attempt 1 resumed from the checkpoint at step 5: steps 6-7 are recomputed
    (metrics / "attempt-1.rank-0.jsonl").write_text(
        "".join(metric_line(s, 6 - s / 100) for s in range(6, 10))
        + json.dumps({"step": 9.0, "eval/avg_loss": 1.0}) + "\n")  # an eval line is not a step
    found = samples(plugin)
    assert value(found, "mxc_train_last_step", rank="0") == 9
    assert value(found, "mxc_train_attempt", rank="0") == 1
    assert value(found, "mxc_train_step_total", rank="0") == 12  # work done: 8 + 4
    assert value(found, "mxc_train_loss", rank="0") == 6 - 9 / 100  # exact: the float from the file
    assert value(found, "mxc_train_tokens_per_second_per_device", rank="0") == 1009.0
    names = {name for name, _ in found}
    assert not any("attempt" in dict(labels) for _, labels in found), "no attempt label: one series per run"
    assert "mxc_train_learning_rate" in names and "mxc_train_step_time_seconds" in names


def test_training_plugin_falls_back_to_tensorboard_events(tmp_path: Path) -> None:
    logdir = tmp_path / "output" / tmp_path.name / "tensorboard" / tmp_path.name
    write_events(logdir, range(4))
    plugin = tensorboard.create(PluginContext(run_dir=tmp_path))
    found = samples(plugin)
    assert plugin.source == "tensorboard"
    assert value(found, "mxc_train_last_step", rank="0") == 3
    assert value(found, "mxc_train_loss", rank="0") == pytest.approx(5.7)
    assert value(found, "mxc_train_step_total", rank="0") == 4


# ---- plugin host: a failing plugin is disabled, the others keep serving


class Good:
    name = "good"

    def __init__(self) -> None:
        self.calls = 0

    def collect(self) -> list[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        self.calls += 1
        return [GaugeMetricFamily("good_calls", "calls", value=self.calls)]


class Flaky:
    name = "flaky"

    def __init__(self) -> None:
        self.calls = 0

    def collect(self) -> list[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        self.calls += 1
        if self.calls >= 2:
            raise RuntimeError("sensor went away")
        return [GaugeMetricFamily("flaky_value", "x", value=1)]


def test_plugin_host_disables_a_raising_plugin(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    flaky, good = Flaky(), Good()
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "broken_start.py").write_text("def create(context):\n    raise ValueError('no config')\n")
    (plugins / "not_a_metric.py").write_text(
        "class P:\n    name = 'not_a_metric'\n    def collect(self):\n        return [42]\n"
        "def create(context):\n    return P()\n")
    context = PluginContext(run_dir=tmp_path, log=logging.getLogger("mxc.exporter"))
    with caplog.at_level(logging.INFO, logger="mxc.exporter"):
        hub = PluginHost(context, ["missing"], [plugins], extra=[("flaky", flaky), ("good", good)])
        first = samples(hub)
        second = samples(hub)
        third = samples(hub)
    assert value(first, "flaky_value") == 1
    assert ("flaky_value", ()) not in second  # disabled on its first exception ...
    assert value(third, "good_calls") == 3  # ... while the others keep serving
    assert value(third, "mxc_exporter_plugin_up", plugin="flaky") == 0
    assert value(third, "mxc_exporter_plugin_up", plugin="good") == 1
    assert value(third, "mxc_exporter_plugin_errors_total", plugin="flaky") == 1
    assert flaky.calls == 2  # never called again once disabled
    status = hub.status()
    assert status["flaky"]["status"] == "failed" and "sensor went away" in status["flaky"]["reason"]
    assert status["broken_start"]["status"] == "failed" and "no config" in status["broken_start"]["reason"]
    assert status["not_a_metric"]["status"] == "failed" and "not a prometheus_client Metric" in status["not_a_metric"]["reason"]
    assert status["missing"]["status"] == "not found"
    assert value(third, "mxc_exporter_plugin_info", plugin="flaky", status="failed",
                 reason="RuntimeError: sensor went away") == 1
    logged = caplog.text
    assert "plugin flaky: disabled, collect() raised RuntimeError: sensor went away" in logged
    assert "plugin broken_start: disabled, it failed to start" in logged


def test_builtin_plugins_are_found_by_entry_point() -> None:
    from importlib.metadata import entry_points

    from mxc.plugins.api import ENTRY_POINT_GROUP
    from mxc.runtime.observe.plugin_host import discover

    found = discover(["host", "gpu", "tensorboard"], [])
    assert {"host", "gpu", "tensorboard"} <= set(found)
    registered = {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
    if registered:  # an up-to-date install registers them (pyproject.toml); a stale one falls back
        assert {"host", "gpu", "tensorboard"} <= registered
        assert found["host"][0].startswith("entry point")


def test_events_collector_annotations(tmp_path: Path) -> None:
    from mxc.runtime.observe import run_events

    path = tmp_path / run_events.EVENTS
    run_events.append(path, "attempt_start", attempt=0)
    time.sleep(0.01)
    run_events.append(path, "hang", attempt=0, idle_seconds=12.0)
    run_events.append(path, "attempt_end", attempt=0, exit_code=-9)
    run_events.append(path, "attempt_start", attempt=1)
    found = samples(run_events.RunEventsCollector(path))
    assert value(found, "mxc_run_attempt") == 1 and value(found, "mxc_run_restarts_total") == 1
    assert value(found, "mxc_run_hangs_total") == 1 and value(found, "mxc_run_training") == 1
    assert value(found, "mxc_run_attempt_exit_code", attempt="0") == -9
    assert value(found, "mxc_run_attempt_start_timestamp_seconds", attempt="1") > value(
        found, "mxc_run_attempt_start_timestamp_seconds", attempt="0")
