"""docs/metrics.md lists every series mxc's exporter can serve, with its unit and source: every
plugin is run on recorded inputs that make it export all its families, and each family name the
exporter renders must be in the doc's tables (and each documented mxc_* name must exist)."""

from __future__ import annotations

import itertools
import json
import re
import shutil
from pathlib import Path

from mxc.plugins import gpu, host, network, tensorboard
from mxc.plugins.api import PluginContext
from mxc.runtime.observe import run_events
from mxc.runtime.observe.plugin_host import PluginHost
from tests.plugin_samples import samples

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests/fixtures"
DOC = REPO / "docs/metrics.md"


def documented_names() -> set[str]:
    """Backticked metric names in the doc's table rows, brace alternatives expanded:
    `mxc_host_network_{received,transmitted}_packets_total{interface}` -> two names."""
    names: set[str] = set()
    for line in DOC.read_text().splitlines():
        if not line.startswith("| `mxc_"):
            continue
        for code in re.findall(r"`(mxc_[^`]+)`", line.split("|")[1]):
            name = re.sub(r"\{[^{}]*\}$", "", code)  # the labels at the end
            parts = re.split(r"(\{[^{}]*\})", name)
            choices = [p[1:-1].split(",") if p.startswith("{") else [p] for p in parts]
            names.update("".join(c) for c in itertools.product(*choices))
    return names


def exported_names(tmp_path: Path) -> set[str]:
    """Every family every shipped plugin renders, on inputs that reach all of them."""
    run = tmp_path / "run"
    (run / "metrics").mkdir(parents=True)
    line = {"step": 1.0, "learning/loss": 2.0, "learning/grad_norm": 1.0, "learning/current_learning_rate": 1e-4,
            "perf/step_time_seconds": 1.0, "perf/per_device_tokens_per_sec": 10.0, "perf/per_device_tflops_per_sec": 5.0,
            "learning/moe_lb_loss": 0.1}
    (run / "metrics/attempt-0.rank-0.jsonl").write_text(json.dumps(line) + "\n")
    (run / "observability").mkdir()
    events = run / "observability" / run_events.EVENTS
    run_events.append(events, "attempt_start", attempt=0)
    run_events.append(events, "attempt_end", attempt=0, exit_code=0)
    ionic = tmp_path / "ib"
    shutil.copytree(FIXTURES / "sys/infiniband-counters-procfs", ionic)
    port = ionic / "ionic_0/ports/1/hw_counters"
    port.mkdir(parents=True)
    for name in ("tx_rdma_retx_pkts", "req_tx_retry_excd_err", "rx_rdma_ecn_pkts", "tx_rdma_cnp_pkts", "rx_rdma_cnp_pkts"):
        (port / name).write_text("1\n")
    sys_net = tmp_path / "net"
    (sys_net / "eth0").mkdir(parents=True)
    (sys_net / "eth0/operstate").write_text("up\n")
    (sys_net / "eth0/carrier_changes").write_text("1\n")
    drm = tmp_path / "sys"
    shutil.copytree(FIXTURES / "sys/drm-vega10-procfs", drm, symlinks=True)
    (drm / "devices/0000:09:00.0/ras").mkdir()
    (drm / "devices/0000:09:00.0/ras/umc_err_count").write_text("ue: 0\nce: 0\n")
    load = (FIXTURES / "gpu/nvidia-smi-h100-load.csv").read_text()
    nvlink = (FIXTURES / "gpu/nvidia-smi-nvlink-e-gb300.txt").read_text()
    context = PluginContext(run_dir=run, config={"peak_tflops": 100.0})
    collectors: list[object] = [
        host.HostPlugin(context, proc=FIXTURES / "procfs", sys_block=FIXTURES / "procfs/sys_block",
                        kernel_log=FIXTURES / "kmsg/gpu-errors.kmsg"),
        network.NetworkPlugin(context, proc=FIXTURES / "procfs", sys_net=sys_net, infiniband=ionic),
        gpu.GpuPlugin("nvidia-smi", run=lambda c: nvlink if "nvlink" in c else load, pci_devices=drm / "devices"),
        gpu.GpuPlugin("sysfs", drm=drm / "drm", pci_devices=drm / "devices"),
        tensorboard.create(context),
        run_events.RunEventsCollector(events),
        PluginHost(context, ["no_such_plugin"]),  # its health series
    ]
    names: set[str] = set()
    for collector in collectors:
        names.update(name for name, _ in samples(collector))
    return {re.sub(r"_(created)$", "", n) for n in names}


def test_every_exported_series_is_documented(tmp_path: Path) -> None:
    exported = exported_names(tmp_path)
    assert len(exported) > 80  # the families above really were exported
    missing = sorted(exported - documented_names())
    assert not missing, f"series missing from docs/metrics.md: {missing}"


def test_every_documented_series_exists(tmp_path: Path) -> None:
    stale = sorted(documented_names() - exported_names(tmp_path))
    assert not stale, f"docs/metrics.md lists series no plugin exports: {stale}"


def test_every_documented_row_has_a_unit_and_a_source() -> None:
    for line in DOC.read_text().splitlines():
        if line.startswith("| `mxc_"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            assert len(cells) == 4 and all(cells), f"a row needs metric, type, unit, meaning/source: {line}"
