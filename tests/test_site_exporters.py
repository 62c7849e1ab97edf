"""Exporters a site already runs (node_exporter, dcgm-exporter): found on loopback by what they
serve, scraped as targets, and DCGM's page read by the GPU plugin instead of a second nvidia-smi.
Real HTTP servers on free loopback ports serve recorded pages."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from mxc.plugins import dcgm, gpu
from mxc.plugins.api import PluginContext
from mxc.runtime.observe import site_exporters
from mxc.runtime.observe.site_exporters import SiteExporter
from tests.plugin_samples import samples, value

DCGM_PAGE = (Path(__file__).parent / "fixtures/gpu/dcgm-exporter-a100-mig.prom").read_text()
MXC_PAGE = "# HELP mxc_gpu_power_watts x\n# TYPE mxc_gpu_power_watts gauge\nmxc_gpu_power_watts 1\n"


def serve(page: str, status: int = 200) -> tuple[ThreadingHTTPServer, int]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = page.encode()
            self.send_response(status if self.path == "/metrics" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


@pytest.fixture
def pages() -> Iterator[dict[str, int]]:
    node_page = 'node_exporter_build_info{version="1.8.2"} 1\n'
    servers = {name: serve(page) for name, page in (("dcgm", DCGM_PAGE), ("mxc", MXC_PAGE), ("node", node_page))}
    broken, broken_port = serve(DCGM_PAGE, status=500)
    yield {**{name: port for name, (_, port) in servers.items()}, "broken": broken_port}
    for server, _ in [*servers.values(), (broken, broken_port)]:
        server.shutdown()
        server.server_close()


def test_detect_by_what_the_page_serves(pages: dict[str, int]) -> None:
    known = (SiteExporter("dcgm-exporter", pages["dcgm"], b"DCGM_FI_DEV_"),
             SiteExporter("node_exporter", pages["node"], b"node_exporter_build_info"))
    assert site_exporters.detect(known=known) == {"dcgm-exporter": pages["dcgm"], "node_exporter": pages["node"]}
    impostors = (SiteExporter("dcgm-exporter", pages["mxc"], b"DCGM_FI_DEV_"),  # mxc's own exporter on DCGM's port
                 SiteExporter("dcgm-exporter", pages["broken"], b"DCGM_FI_DEV_"))  # answers, but not a 200
    assert site_exporters.detect(known=impostors) == {}


def test_nothing_listening_is_found_quickly() -> None:
    server, port = serve("")
    server.shutdown()
    server.server_close()  # the port is closed now: connection refused
    assert site_exporters.detect(known=(SiteExporter("node_exporter", port, b"x"),)) == {}


def test_targets_for_what_was_found(tmp_path: Path) -> None:
    paths = site_exporters.write_site_targets(tmp_path, "gpu12", "gpu12", {"dcgm-exporter": 9400, "node_exporter": 9100},
                                              {"run": "r1", "node": "gpu12"})
    assert [p.name for p in paths] == ["site-gpu12-dcgm-exporter.json", "site-gpu12-node_exporter.json"]
    [target] = json.loads(paths[0].read_text())
    assert target == {"targets": ["gpu12:9400"], "labels": {"run": "r1", "node": "gpu12", "exporter": "dcgm-exporter"}}


def test_dcgm_page_recorded_on_an_a100() -> None:
    """NVIDIA's own capture (cloud-native-docs): whole-GPU series kept, the MIG instance's left out."""
    [a100] = dcgm.parse_page(DCGM_PAGE)
    assert a100.index == "0" and a100.vendor == "nvidia"
    assert a100.clock_graphics_hertz == 1215e6 and a100.temperature_celsius == 61 and a100.power_watts == 409.692
    assert a100.memory_used_bytes == 4845 * 1024**2 and a100.memory_total_bytes == (4845 + 35690) * 1024**2
    assert a100.pcie_replays == 0 and a100.utilization is None  # GPU_UTIL not in this page: absent


def test_gpu_plugin_reads_dcgm_instead_of_nvidia_smi(pages: dict[str, int]) -> None:
    plugin = gpu.create(PluginContext(run_dir=None, site_exporters={"dcgm-exporter": pages["dcgm"]}))
    assert plugin.source == "dcgm-exporter" and plugin.nvidia is None
    found = samples(plugin)
    assert value(found, "mxc_gpu_power_watts", gpu="0", vendor="nvidia", name="") == pytest.approx(409.692)
    assert value(found, "mxc_gpu_clock_hertz", gpu="0", vendor="nvidia", name="", clock="memory") == 1215e6


def test_a_dcgm_exporter_that_went_away_fails_the_scrape(pages: dict[str, int]) -> None:
    plugin = gpu.GpuPlugin("dcgm-exporter", dcgm_port=pages["broken"])
    with pytest.raises(RuntimeError, match="did not answer"):
        plugin.read()


def test_the_run_points_prometheus_at_what_its_exporter_found(tmp_path: Path) -> None:
    """The observer reads the exporter's ready file: next to the exporter's own target, one per
    site exporter, at the host Prometheus reaches the exporter by."""
    from mxc.node.contract import Observability as Settings
    from mxc.runtime.observe.observer import Observability, prometheus_dir
    from mxc.runtime.rundir import RunDir

    run = RunDir(tmp_path / "20260101-000000-abcd-00000000")
    (run.path / "observability").mkdir(parents=True)
    ready = run.path / "observability" / "exporter-ready.json"
    ready.write_text(json.dumps({"pid": 1, "bind": "127.0.0.1", "port": 9401, "plugins": {},
                                 "site_exporters": {"dcgm-exporter": 9400}}))
    settings = Settings(enabled=True, bind="127.0.0.1", exporter_port=9400, prometheus_port=9190, tensorboard_port=6006,
                        scrape_interval=10, plugins=["host", "network", "gpu", "tensorboard"])
    observer = Observability(settings, "tiny")
    observer.node = "gpu7"
    observer.exporter = type("Running", (), {"poll": lambda self: None})()
    observer.info = {"exporter": {}}
    observer._exporter_target(run, ready)
    targets = prometheus_dir(run) / "targets"
    assert sorted(p.name for p in targets.iterdir()) == ["exporter-gpu7.json", "site-gpu7-dcgm-exporter.json"]
    [site] = json.loads((targets / "site-gpu7-dcgm-exporter.json").read_text())
    assert site == {"targets": ["127.0.0.1:9400"], "labels": {"run": run.run_id, "node": "gpu7", "exporter": "dcgm-exporter"}}
    assert observer.info["exporter"]["site_exporters"] == {"dcgm-exporter": 9400}
