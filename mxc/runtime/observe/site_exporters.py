"""Exporters the site already runs on a node (node_exporter, NVIDIA's dcgm-exporter): found when
mxc's exporter starts, and scraped into the run's TSDB instead of being duplicated.

Why: clusters often run them already. Scraping them keeps every series they have (node_exporter's
hundreds of collectors, DCGM's profiling counters) in the run's TSDB next to training, and the
GPU plugin reads DCGM's page instead of running ``nvidia-smi`` a second time against the same
GPUs (``mxc.plugins.dcgm``). mxc's own host, network and GPU series stay (uniform names on every
node, for the skills and rules); node_exporter's are extra.

Found by asking each one's default port on loopback for its metrics page and checking it is
that exporter (a metric only it serves): another program on the port, mxc's own exporter of
another run on 9400 included, is not mistaken for it. Bounded: a short timeout, the first
4 MiB of the page.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from mxc.plugins.metrics_page import fetch
from mxc.runtime.observe.prometheus import write_targets

TIMEOUT = 0.5


@dataclass(frozen=True)
class SiteExporter:
    name: str
    port: int
    signature: bytes  # a metric name only this exporter serves

    def url(self, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}/metrics"


KNOWN = (
    SiteExporter("node_exporter", 9100, b"node_exporter_build_info"),
    SiteExporter("dcgm-exporter", 9400, b"DCGM_FI_DEV_"),
)


def detect(host: str = "127.0.0.1", known: tuple[SiteExporter, ...] = KNOWN) -> dict[str, int]:
    """name -> port of each known exporter serving on this node."""
    found = {}
    for exporter in known:
        page = fetch(host, exporter.port, TIMEOUT)
        if page is not None and exporter.signature in page:
            found[exporter.name] = exporter.port
    return found


def write_site_targets(targets_dir: Path, node: str, host: str, found: dict[str, int], labels: dict[str, str]) -> list[Path]:
    """One file_sd target per exporter found (``site-<node>-<name>.json``), at the host Prometheus
    reaches this node's mxc exporter by (loopback on one node, the node's address across nodes)."""
    paths = []
    for name, port in sorted(found.items()):
        with contextlib.suppress(TypeError, ValueError):
            paths.append(write_targets(targets_dir, f"site-{node}-{name}", [f"{host}:{int(port)}"],
                                       {**labels, "exporter": name}))
    return paths
