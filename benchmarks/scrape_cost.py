#!/usr/bin/env python3
"""What one scrape costs, per plugin, on this machine: the exporter serves every few seconds
next to training, so each plugin must stay cheap.

1. In process: each shipped plugin's ``collect()`` (what the exporter runs per scrape), median
   and 95th percentile of N scrapes after one warm-up (the kernel-log reader's backlog and a
   training file's backlog are read then). The training plugin reads a metrics file of
   MaxText lines of a MoE model (14 scalars a step), 10 new steps appended before each scrape.
2. A real exporter process (host, network, gpu, tensorboard), scraped over HTTP like
   Prometheus does: time per scrape, page size, series count.

Target: a whole scrape under 50 ms of one core on a node without GPU tools (the GPU plugin's
cost is nvidia-smi's or rocm-smi's, measured where they exist). Prints figures; no assertion.

  python benchmarks/scrape_cost.py [--scrapes 50]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from mxc.plugins import gpu, host, network, tensorboard  # noqa: E402
from mxc.plugins.api import ExporterPlugin, PluginContext, PluginUnavailable  # noqa: E402

TARGET_MS = 50.0


def moe_line(step: int) -> str:
    return json.dumps({
        "step": float(step), "learning/loss": 5.5 - step * 1e-4, "learning/moe_lb_loss": 0.01, "learning/mtp_loss": 6.0,
        "learning/param_norm": 250.0, "learning/raw_grad_norm": 3.0, "learning/grad_norm": 1.0,
        "learning/total_weights": 8192.0, "perf/step_time_seconds": 2.0, "perf/per_device_tflops_per_sec": 494.7,
        "perf/per_device_tokens_per_sec": 4096.0, "learning/current_learning_rate": 3e-4,
        "perf/per_device_tflops": 989.4, "perf/per_device_tokens": 8192.0,
    }) + "\n"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def in_process(scrapes: int, run_dir: Path) -> dict[str, list[float]]:
    context = PluginContext(run_dir=run_dir, config={"peak_tflops": 989.4})
    plugins: dict[str, ExporterPlugin] = {"host": host.create(context), "network": network.create(context),
                                          "tensorboard": tensorboard.create(context)}
    try:
        plugins["gpu"] = gpu.create(context)
    except PluginUnavailable as exc:
        print(f"gpu: not measured here ({exc})")
    metrics = run_dir / "metrics" / "attempt-0.rank-0.jsonl"
    step = 1000
    times: dict[str, list[float]] = {name: [] for name in plugins}
    for plugin in plugins.values():
        list(plugin.collect())  # warm-up: backlogs
    for _ in range(scrapes):
        with open(metrics, "a") as fh:
            fh.write("".join(moe_line(step + i) for i in range(10)))
        step += 10
        for name, plugin in plugins.items():
            started = time.perf_counter()
            list(plugin.collect())
            times[name].append((time.perf_counter() - started) * 1000)
    return times


def over_http(scrapes: int, run_dir: Path) -> tuple[list[float], int, int]:
    config = run_dir / "exporter.json"
    config.write_text(json.dumps({"bind": "127.0.0.1", "port": 19400, "plugins": ["host", "network", "gpu", "tensorboard"],
                                  "peak_tflops": 989.4}))
    ready = run_dir / "ready.json"
    process = subprocess.Popen([sys.executable, "-m", "mxc.runtime.observe.exporter", "--config", str(config), "--run-dir",
                                str(run_dir), "--ready-file", str(ready)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               cwd=HERE.parent)
    try:
        while not ready.exists():
            if process.poll() is not None:
                raise SystemExit("exporter exited")
            time.sleep(0.05)
        url = f"http://127.0.0.1:{json.loads(ready.read_text())['port']}/metrics"
        urllib.request.urlopen(url, timeout=10).read()
        times, page = [], b""
        for _ in range(scrapes):
            started = time.perf_counter()
            page = urllib.request.urlopen(url, timeout=10).read()
            times.append((time.perf_counter() - started) * 1000)
        series = sum(1 for line in page.decode().splitlines() if line and not line.startswith("#"))
        return times, len(page), series
    finally:
        process.terminate()
        process.wait(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scrapes", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mxc-scrape-") as tmp:
        run_dir = Path(tmp)
        (run_dir / "metrics").mkdir()
        (run_dir / "metrics" / "attempt-0.rank-0.jsonl").write_text("".join(moe_line(s) for s in range(1000)))
        times = in_process(args.scrapes, run_dir)
        print(f"collect() per plugin, {args.scrapes} scrapes (ms): median / p95")
        for name, values in times.items():
            print(f"  {name:12s} {statistics.median(values):7.2f} / {percentile(values, 0.95):7.2f}")
        total = [sum(v[i] for v in times.values()) for i in range(args.scrapes)]
        print(f"  {'all':12s} {statistics.median(total):7.2f} / {percentile(total, 0.95):7.2f}   (target < {TARGET_MS:g} ms)")
        http_times, size, series = over_http(args.scrapes, run_dir)
        print(f"HTTP scrape of a real exporter: median {statistics.median(http_times):.2f} ms, "
              f"p95 {percentile(http_times, 0.95):.2f} ms, page {size / 1024:.1f} KiB, {series} samples")
    return 0


if __name__ == "__main__":
    sys.exit(main())
