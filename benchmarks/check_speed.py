"""How fast `mxc check` is: static checking of flag combinations, and --probe on a matrix.

Targets (issue 8): static checking (catalogs + rules, no probe) >= 5,000 combinations per
second on one core; --probe on a 100-combination matrix in under 30 s.

    python benchmarks/check_speed.py            # both figures
    python benchmarks/check_speed.py --static   # only the static figure
    python benchmarks/check_speed.py --worst    # also --probe with 100 *distinct* override sets

The static figure runs the checker in this process (one core: pinned with sched_setaffinity
where allowed) over a 6,000-combination sweep of a 2-node x 8 H100 spec; every combination
is validated against the spec schema and run through every rule. The probe figure runs the
real CLI (`mxc check --matrix --probe`) in a subprocess, as CI would.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from mxc.compiler.check.matrix import parse_matrix
from mxc.compiler.check.runner import check_matrix
from mxc.compiler.loader import load_yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.check_support import CPU_SPEC, GPU_SPEC  # noqa: E402

STATIC_SWEEP = """\
matrix: mxc/v1
axes:
  env.xla_flags.xla_gpu_all_gather_combine_threshold_bytes: [134217728, 268435456, 536870912, 1073741824, 2147483648,
                                                             4294967296, 8589934592, 17179869184, 34359738368, 68719476736]
  env.xla_flags.xla_gpu_enable_latency_hiding_scheduler: [true, false]
  env.xla_flags.xla_gpu_pipeline_all_gather: ["on", "off", "default"]
  env.vars.XLA_FLAGS: ["--xla_gpu_autotune_level=4", "--xla_gpu_autotune_level=0 --xla_gpu_enable_triton_gemm=false",
                       "--xla_gpu_enable_command_buffer=", "--xla_gpu_autotune_levle=4", null]
  env.vars.NCCL_ALGO: [Ring, Tree, "^NVLS", null]
  model.overrides.per_device_batch_size: [1, 2, 0.5, 1.5, 4]
"""

PROBE_SWEEP = """\
matrix: mxc/v1
spec: job.yaml
axes:
  env.xla_flags.xla_gpu_all_gather_combine_threshold_bytes: [134217728, 1073741824, 8589934592, 17179869184, 34359738368]
  env.xla_flags.xla_gpu_pipeline_all_gather: ["on", "off", "default", "explicit", "sometimes"]
  model.overrides.per_device_batch_size: [1, 2]
  model.overrides.remat_policy: [full, minimal]
"""

# The worst case for --probe: every combination a different MaxText override set.
WORST_SWEEP = """\
matrix: mxc/v1
spec: job.yaml
axes:
  model.overrides.learning_rate_schedule_steps: [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24,
                                                 25, 26, 27, 28, 29, 30, 31, 32, 33, 34]
  model.overrides.steps: [10, 11, 12, 13]
"""


def one_core() -> str:
    try:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        return "pinned to one core"
    except (AttributeError, OSError):
        return "not pinned"


def static_figure() -> float:
    pinned = one_core()
    doc = load_yaml("gpu.yaml", yaml.safe_dump(GPU_SPEC, sort_keys=False))
    sweep = parse_matrix(load_yaml("sweep.yaml", STATIC_SWEEP), "sweep.yaml")
    check_matrix(doc, "gpu.yaml", parse_matrix(load_yaml("w.yaml", "matrix: mxc/v1\naxes:\n  a.b: [1]\n"), "w.yaml"))
    t0, c0 = time.perf_counter(), time.process_time()
    results = check_matrix(doc, "gpu.yaml", sweep)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    findings = sum(len(r.findings) for r in results)
    rate = len(results) / cpu
    # CPU time is the honest "one core" figure on a shared machine; wall time is shown too.
    print(f"static: {len(results)} combinations in {cpu:.2f} CPU-s = {rate:,.0f} combinations/s on one core "
          f"(wall {wall:.2f} s = {len(results) / wall:,.0f}/s, {pinned}; {findings} findings; "
          f"target >= 5,000/s: {'PASS' if rate >= 5000 else 'FAIL'})")
    return rate


def probe_figure(spec: dict[str, object], sweep: str, label: str) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "job.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
        Path(tmp, "sweep.yaml").write_text(sweep)
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "mxc", "check", "--matrix", str(Path(tmp, "sweep.yaml")), "--probe",
                               "--json"], capture_output=True, text=True, cwd=REPO)
        seconds = time.perf_counter() - t0
    report = json.loads(proc.stdout)
    probe = report["probe"]
    print(f"probe ({label}): {report['summary']['combinations']} combinations in {seconds:.1f} s end to end "
          f"({probe['tokens']} distinct XLA flags, {probe['maxtext_sets']} distinct MaxText override sets, "
          f"{len(probe['rejected_tokens'])} rejected by jaxlib; exit {proc.returncode}; "
          f"target < 30 s: {'PASS' if seconds < 30 else 'FAIL'})")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--static", action="store_true", help="only the static figure")
    parser.add_argument("--worst", action="store_true", help="also probe 100 distinct MaxText override sets")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} CPUs visible")
    if not args.static:
        job = dict(CPU_SPEC)
        probe_figure(job, PROBE_SWEEP, "25 flag sets x 4 override sets")
        if args.worst:
            probe_figure(job, WORST_SWEEP, "100 distinct override sets")
    static_figure()


if __name__ == "__main__":
    main()
